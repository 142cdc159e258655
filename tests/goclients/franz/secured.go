package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"kl.tests/goclients/drive"
)

// secured is the options of a request's Security: TLS with its CA (and its client
// certificate, for mTLS), SASL with its mechanism and user.
func secured(r *drive.Request) ([]kgo.Opt, error) {
	s := r.Security
	if s == nil {
		return nil, nil
	}
	var options []kgo.Opt
	if s.Protocol == "SSL" || s.Protocol == "SASL_SSL" {
		pem, err := os.ReadFile(s.CA)
		if err != nil {
			return nil, err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("no certificate in %s", s.CA)
		}
		config := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
		if s.Cert != "" {
			pair, err := tls.LoadX509KeyPair(s.Cert, s.Key)
			if err != nil {
				return nil, err
			}
			config.Certificates = []tls.Certificate{pair}
		}
		options = append(options, kgo.DialTLSConfig(config))
	}
	switch s.Mechanism {
	case "":
	case "PLAIN":
		options = append(options, kgo.SASL(plain.Auth{User: s.User, Pass: s.Password}.AsMechanism()))
	case "SCRAM-SHA-256":
		options = append(options, kgo.SASL(scram.Auth{User: s.User, Pass: s.Password}.AsSha256Mechanism()))
	case "SCRAM-SHA-512":
		options = append(options, kgo.SASL(scram.Auth{User: s.User, Pass: s.Password}.AsSha512Mechanism()))
	default:
		return nil, fmt.Errorf("no SASL mechanism %q", s.Mechanism)
	}
	return options, nil
}
