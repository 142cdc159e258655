// franz-go (github.com/twmb/franz-go/pkg/kgo and kadm), unmodified, driven by the JSON
// requests of package drive.
package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"kl.tests/goclients/drive"
)

func main() {
	drive.Serve(map[string]drive.Op{"produce": produce, "consume": consume, "group": group, "offsets": offsets, "watch": watch, "admin": admin})
}

var codecs = map[string]kgo.CompressionCodec{
	"": kgo.NoCompression(), "none": kgo.NoCompression(), "gzip": kgo.GzipCompression(),
	"snappy": kgo.SnappyCompression(), "lz4": kgo.Lz4Compression(), "zstd": kgo.ZstdCompression(),
}

func produce(ctx context.Context, r *drive.Request) (any, error) {
	options := []kgo.Opt{
		kgo.SeedBrokers(r.Bootstrap), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProducerBatchCompression(codecs[r.Compression]), kgo.ProducerLinger(50 * time.Millisecond),
	} // no RecordDeliveryTimeout: kgo counts it from a record's timestamp (the tests' are of 2023); the request's deadline bounds it
	if !r.Idempotent {
		options = append(options, kgo.DisableIdempotentWrite())
	}
	security, err := secured(r)
	if err != nil {
		return nil, err
	}
	client, err := kgo.NewClient(append(options, security...)...)
	if err != nil {
		return nil, err
	}
	defer client.Close()
	records := make([]*kgo.Record, len(r.Records))
	for i, sent := range r.Records {
		record := &kgo.Record{Topic: r.Topic, Partition: r.Partition, Key: drive.Raw(sent.Key), Value: drive.Raw(sent.Value),
			Timestamp: time.UnixMilli(sent.Timestamp)}
		for _, h := range sent.Headers {
			record.Headers = append(record.Headers, kgo.RecordHeader{Key: h[0], Value: drive.Raw(&h[1])})
		}
		records[i] = record
	}
	offsets, errors := []*int64{}, []*string{}
	for _, result := range client.ProduceSync(ctx, records...) {
		if result.Err != nil {
			offsets, errors = append(offsets, nil), append(errors, drive.Error(result.Err))
		} else {
			offset := result.Record.Offset
			offsets, errors = append(offsets, &offset), append(errors, nil)
		}
	}
	return map[string]any{"offsets": offsets, "errors": errors}, nil
}

// records are the fetches' records, the last kept in last.
func records(fetches kgo.Fetches, last **kgo.Record) []drive.Record {
	more := []drive.Record{}
	fetches.EachRecord(func(m *kgo.Record) {
		headers := [][2][]byte{}
		for _, h := range m.Headers {
			headers = append(headers, [2][]byte{[]byte(h.Key), h.Value})
		}
		more = append(more, drive.Read(m.Offset, m.Key, m.Value, headers, m.Timestamp))
		*last = m
	})
	return more
}

func read(ctx context.Context, client *kgo.Client, r *drive.Request, most int) ([]drive.Record, *kgo.Record, error) {
	var last *kgo.Record
	got, err := drive.Collect(ctx, r.Count, drive.Seconds(r.Quiet), func(until time.Time) ([]drive.Record, error) {
		poll, cancel := context.WithDeadline(ctx, until)
		defer cancel()
		fetches := client.PollRecords(poll, most)
		for _, e := range fetches.Errors() {
			if e.Err != context.DeadlineExceeded && e.Err != context.Canceled {
				return nil, e.Err
			}
		}
		return records(fetches, &last), nil
	})
	return got, last, err
}

func consume(ctx context.Context, r *drive.Request) (any, error) {
	start, err := r.Where()
	if err != nil {
		return nil, err
	}
	at := kgo.NewOffset().At(start.Offset)
	if start.Earliest {
		at = kgo.NewOffset().AtStart()
	} else if start.Latest {
		at = kgo.NewOffset().AtEnd()
	}
	security, err := secured(r)
	if err != nil {
		return nil, err
	}
	client, err := kgo.NewClient(append(security, kgo.SeedBrokers(r.Bootstrap), kgo.FetchMaxWait(100*time.Millisecond),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{r.Topic: {r.Partition: at}}))...)
	if err != nil {
		return nil, err
	}
	defer client.Close()
	got, _, err := read(ctx, client, r, 0)
	if err != nil {
		return nil, err
	}
	return map[string]any{"records": got}, nil
}

func group(ctx context.Context, r *drive.Request) (any, error) {
	client, err := kgo.NewClient(kgo.SeedBrokers(r.Bootstrap), kgo.ConsumerGroup(r.Group), kgo.ConsumeTopics(r.Topic),
		kgo.DisableAutoCommit(), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond),
		kgo.SessionTimeout(10*time.Second), kgo.HeartbeatInterval(time.Second))
	if err != nil {
		return nil, err
	}
	defer client.Close() // leaves the group
	quiet := *r
	quiet.Quiet = 0                                // a member reads what it was asked, no more
	got, last, err := read(ctx, client, &quiet, 1) // one at a time: no more than asked
	if err != nil {
		return nil, err
	}
	var committed *int64
	if last != nil {
		commit, cancel := context.WithTimeout(context.Background(), 10*time.Second) // also when ctx ended the read
		defer cancel()
		if err := client.CommitRecords(commit, last); err != nil { // last.Offset + 1
			return nil, fmt.Errorf("commit after %d records: %w", len(got), err)
		}
		offset := last.Offset + 1
		committed = &offset
	}
	return map[string]any{"records": got, "committed": committed}, nil
}

func offsets(ctx context.Context, r *drive.Request) (any, error) {
	client, err := kgo.NewClient(kgo.SeedBrokers(r.Bootstrap))
	if err != nil {
		return nil, err
	}
	defer client.Close()
	admin := kadm.NewClient(client)
	answer := map[string]any{}
	one := func(name string, listed kadm.ListedOffsets, err error) error {
		if err == nil {
			err = listed.Error()
		}
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		found, _ := listed.Lookup(r.Topic, r.Partition)
		answer[name] = found.Offset
		return nil
	}
	listed, err := admin.ListStartOffsets(ctx, r.Topic)
	if err := one("earliest", listed, err); err != nil {
		return nil, err
	}
	listed, err = admin.ListEndOffsets(ctx, r.Topic)
	if err := one("latest", listed, err); err != nil {
		return nil, err
	}
	if r.Timestamp != nil {
		listed, err = admin.ListOffsetsAfterMilli(ctx, *r.Timestamp, r.Topic)
		if err := one("timestamp", listed, err); err != nil {
			return nil, err
		}
	}
	return answer, nil
}

// watch: with ConsumePartitions at the start (assign), or as a member of a group; each
// error of a poll's fetches kept, by kerr's name where it is a Kafka error code.
func watch(ctx context.Context, r *drive.Request) (any, error) {
	// Metadata at most 0.1 s old when a fetch's error asks for it: the topic's loss is
	// seen within the tests' NOTICE.
	options := []kgo.Opt{kgo.SeedBrokers(r.Bootstrap), kgo.FetchMaxWait(100 * time.Millisecond), kgo.MetadataMinAge(100 * time.Millisecond)}
	if r.How == "group" {
		options = append(options, kgo.ConsumerGroup(r.Group), kgo.ConsumeTopics(r.Topic), kgo.DisableAutoCommit(),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.SessionTimeout(10*time.Second), kgo.HeartbeatInterval(time.Second))
	} else {
		options = append(options, kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{r.Topic: {r.Partition: kgo.NewOffset().AtStart()}}))
	}
	client, err := kgo.NewClient(options...)
	if err != nil {
		return nil, err
	}
	defer client.Close()
	var failed []error
	next := func(until time.Time) ([]drive.Record, error) {
		if len(failed) > 0 {
			err := failed[0]
			failed = failed[1:]
			return nil, err
		}
		poll, cancel := context.WithDeadline(ctx, until)
		defer cancel()
		fetches := client.PollFetches(poll)
		for _, e := range fetches.Errors() {
			if e.Err != context.DeadlineExceeded && e.Err != context.Canceled {
				failed = append(failed, e.Err)
			}
		}
		var last *kgo.Record
		return records(fetches, &last), nil
	}
	return drive.Watch(ctx, r, next, func(err error) string {
		var code *kerr.Error
		if errors.As(err, &code) {
			return code.Message
		}
		return err.Error()
	})
}
