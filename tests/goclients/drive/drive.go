// Package drive is what the Go clients' programs share: the JSON requests they read on
// stdin, one a line, and the JSON observations they print on stdout, one a line, in the
// style of tests/kafka_driver.py (keys, values and header values as base64, null for a
// null one).  A program serves requests until stdin ends, so that one process per client
// serves a whole test session.  A request that fails is answered {"error": "..."}; the
// process goes on.
package drive

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"time"
)

// Record is a record as sent (Offset unset) and as read.
type Record struct {
	Offset    *int64      `json:"offset,omitempty"`
	Key       *string     `json:"key"`
	Value     *string     `json:"value"`
	Headers   [][2]string `json:"headers"`
	Timestamp int64       `json:"timestamp"`
}

// Request names the operation (Op) and its arguments:
//
//   - produce: Records to Topic/Partition in one flush (Compression, Idempotent; the
//     client's own producer, or kafka-go's Conn with Conn true); answers {"offsets",
//     "errors"}, each record's offset and error as its delivery report gives them.
//   - consume: assign Topic/Partition at Start ("earliest", "latest" or {"offset": N})
//     and read until Count records have come and Quiet seconds more passed, or Timeout;
//     answers {"records"}.
//   - group: join Group subscribed to Topic, read Count records (from the earliest where
//     nothing is committed), commit the offset after the last (record offset + 1) and
//     leave; answers {"records", "committed"}.
//   - versioned (kafka-go only): one request of API ("produce" or "fetch") at Version,
//     encoded by kafka-go's protocol package (Produce below 3 carries a message set of
//     magic 1, as kafka-go's Conn sends to brokers that serve no newer), on a connection
//     of its own; answers {"partitions": [[partition, error code, offset], ...]} (the
//     base offset or the high watermark), or {"failed": "closed"} where the broker
//     closed the connection instead of answering.
//   - offsets: the earliest and latest offsets of Topic/Partition and, with Timestamp,
//     the first at or after it; answers {"earliest", "latest", "timestamp"}.
//   - watch: read Topic/Partition from the earliest offset, with assign (How "assign") or
//     as a member of Group subscribed to Topic (How "group", nothing committed), until
//     Count records have come and Quiet seconds more passed, or Seconds, or a file named
//     Progress + ".stop" is there, appending a line to the file Progress as each record
//     comes (so that the tests can change the topic meanwhile); answers {"records", "errors"}, the errors the client gave its reader
//     (by name where it has names), each once, in the order they first came.
//
// Security, where given, is how produce and consume connect (franz-go).
type Request struct {
	Op          string          `json:"op"`
	Bootstrap   string          `json:"bootstrap"`
	Topic       string          `json:"topic"`
	Partition   int32           `json:"partition"`
	Records     []Record        `json:"records"`
	Compression string          `json:"compression"`
	Idempotent  bool            `json:"idempotent"`
	Conn        bool            `json:"conn"`
	Start       json.RawMessage `json:"start"`
	Count       int             `json:"count"`
	Group       string          `json:"group"`
	Timestamp   *int64          `json:"timestamp"`
	API         string          `json:"api"`
	Version     int16           `json:"version"`
	Timeout     float64         `json:"timeout"`
	Quiet       float64         `json:"quiet"`
	How         string          `json:"how"`
	Seconds     float64         `json:"seconds"`
	Progress    string          `json:"progress"`
	Security    *Security       `json:"security"`
}

// Security is how a client connects: Kafka's security protocol (SSL, SASL_PLAINTEXT,
// SASL_SSL), the CA that signs the server's certificate, a client certificate and its
// key (mTLS), the SASL mechanism, user and password.
type Security struct {
	Protocol  string `json:"protocol"`
	CA        string `json:"ca"`
	Cert      string `json:"cert"`
	Key       string `json:"key"`
	Mechanism string `json:"mechanism"`
	User      string `json:"user"`
	Password  string `json:"password"`
}

// Start is where a consume begins: Earliest, Latest, else Offset.
type Start struct {
	Earliest, Latest bool
	Offset           int64
}

// Where decodes the request's start.
func (r *Request) Where() (Start, error) {
	var name string
	if json.Unmarshal(r.Start, &name) == nil {
		switch name {
		case "earliest":
			return Start{Earliest: true}, nil
		case "latest":
			return Start{Latest: true}, nil
		}
		return Start{}, fmt.Errorf("no start %q", name)
	}
	var at struct {
		Offset *int64 `json:"offset"`
	}
	if err := json.Unmarshal(r.Start, &at); err != nil || at.Offset == nil {
		return Start{}, fmt.Errorf("a start is \"earliest\", \"latest\" or {\"offset\": N}, not %s", r.Start)
	}
	return Start{Offset: *at.Offset}, nil
}

// Seconds as a duration.
func Seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// Raw is the bytes of a base64 text (nil for null).
func Raw(text *string) []byte {
	if text == nil {
		return nil
	}
	data, err := base64.StdEncoding.DecodeString(*text)
	if err != nil {
		panic(err)
	}
	return data
}

// B64 is the base64 text of bytes (nil, null, for nil).
func B64(data []byte) *string {
	if data == nil {
		return nil
	}
	text := base64.StdEncoding.EncodeToString(data)
	return &text
}

// Read is a record as read.
func Read(offset int64, key, value []byte, headers [][2][]byte, timestamp time.Time) Record {
	r := Record{Offset: &offset, Key: B64(key), Value: B64(value), Headers: [][2]string{}, Timestamp: timestamp.UnixMilli()}
	for _, h := range headers {
		v := ""
		if h[1] != nil {
			v = *B64(h[1])
		}
		r.Headers = append(r.Headers, [2]string{string(h[0]), v})
	}
	return r
}

// Collect calls next (which waits for records at most until the time it is given) until
// count records have come and quiet more passed, or the deadline: what came, up to count + 1
// (a record too many shows).
func Collect(ctx context.Context, count int, quiet time.Duration, next func(until time.Time) ([]Record, error)) ([]Record, error) {
	got := []Record{}
	end, _ := ctx.Deadline()
	for len(got) <= count && time.Now().Before(end) {
		if len(got) >= count {
			if e := time.Now().Add(quiet); e.Before(end) {
				end = e
			}
		}
		more, err := next(end)
		if err != nil {
			return got, err
		}
		got = append(got, more...)
		if len(got) >= count && quiet == 0 {
			break
		}
	}
	return got, nil
}

var errStopped = fmt.Errorf("the stop file is there")

// Watch is the watch op's reading (Collect, within Seconds, polls of 0.1 s at most, until
// the stop file is there) of what next gives: each record a line of the Progress file as it
// comes, each error's name (by name) kept once.
func Watch(ctx context.Context, r *Request, next func(until time.Time) ([]Record, error), name func(error) string) (any, error) {
	progress, err := os.OpenFile(r.Progress, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	defer progress.Close()
	ctx, cancel := context.WithTimeout(ctx, Seconds(r.Seconds))
	defer cancel()
	errors := []string{}
	got, err := Collect(ctx, r.Count, Seconds(r.Quiet), func(until time.Time) ([]Record, error) {
		if _, err := os.Stat(r.Progress + ".stop"); err == nil {
			return nil, errStopped
		}
		if soon := time.Now().Add(100 * time.Millisecond); soon.Before(until) {
			until = soon
		}
		more, err := next(until)
		if err != nil {
			if n := name(err); !slices.Contains(errors, n) {
				errors = append(errors, n)
			}
			time.Sleep(50 * time.Millisecond) // a client that fails at once fails again
		}
		for range more {
			if _, err := progress.WriteString("\n"); err != nil {
				return nil, err
			}
		}
		return more, nil
	})
	if err != nil && err != errStopped {
		return nil, err
	}
	return map[string]any{"records": got, "errors": errors}, nil
}

// Op is one operation: its answer to a request, within the request's deadline (ctx).
type Op func(ctx context.Context, r *Request) (any, error)

// Serve answers each request on stdin with what its operation returns, or {"error": ...}.
func Serve(ops map[string]Op) {
	lines := bufio.NewScanner(os.Stdin)
	lines.Buffer(make([]byte, 1<<20), 64<<20)
	out := json.NewEncoder(os.Stdout)
	for lines.Scan() {
		answer, err := serve(ops, lines.Bytes())
		if err != nil {
			answer = map[string]string{"error": err.Error()}
		}
		if err := out.Encode(answer); err != nil {
			panic(err)
		}
	}
}

func serve(ops map[string]Op, line []byte) (any, error) {
	var r Request
	if err := json.Unmarshal(line, &r); err != nil {
		return nil, err
	}
	op, ok := ops[r.Op]
	if !ok {
		return nil, fmt.Errorf("no op %q", r.Op)
	}
	ctx, cancel := context.WithTimeout(context.Background(), Seconds(r.Timeout))
	defer cancel()
	return op(ctx, &r)
}

// Error is an error's text, nil for none.
func Error(err error) *string {
	if err == nil {
		return nil
	}
	text := err.Error()
	return &text
}
