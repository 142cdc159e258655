// segmentio/kafka-go, unmodified, driven by the JSON requests of package drive: its Writer
// and Reader, and its Conn (the older, lower API: Produce and Fetch of the versions it
// negotiates, ListOffsets v1).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"syscall"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/compress"
	"github.com/segmentio/kafka-go/protocol"
	fetchapi "github.com/segmentio/kafka-go/protocol/fetch"
	produceapi "github.com/segmentio/kafka-go/protocol/produce"

	"kl.tests/goclients/drive"
)

func main() {
	drive.Serve(map[string]drive.Op{"produce": produce, "consume": consume, "group": group, "offsets": offsets, "versioned": versioned, "watch": watch})
}

var codecs = map[string]compress.Compression{
	"": 0, "none": 0, "gzip": compress.Gzip, "snappy": compress.Snappy, "lz4": compress.Lz4, "zstd": compress.Zstd,
}

func messages(r *drive.Request) []kafka.Message {
	out := make([]kafka.Message, len(r.Records))
	for i, sent := range r.Records {
		m := kafka.Message{Key: drive.Raw(sent.Key), Value: drive.Raw(sent.Value), Time: time.UnixMilli(sent.Timestamp)}
		for _, h := range sent.Headers {
			m.Headers = append(m.Headers, kafka.Header{Key: h[0], Value: drive.Raw(&h[1])})
		}
		out[i] = m
	}
	return out
}

// partitioner puts every message in the request's partition.
type partitioner int

func (p partitioner) Balance(kafka.Message, ...int) int { return int(p) }

func produce(ctx context.Context, r *drive.Request) (any, error) {
	if r.Conn {
		return connProduce(ctx, r)
	}
	// A Transport of its own: the default one, shared, caches metadata for 6 s, and a
	// Writer that finds no partitions for a topic created meanwhile writes nothing and
	// says nothing.
	transport := &kafka.Transport{}
	defer transport.CloseIdleConnections()
	w := &kafka.Writer{
		Addr: kafka.TCP(r.Bootstrap), Topic: r.Topic, Balancer: partitioner(r.Partition), Transport: transport,
		RequiredAcks: kafka.RequireAll, Compression: codecs[r.Compression], BatchTimeout: 50 * time.Millisecond,
		BatchSize: len(r.Records), WriteTimeout: drive.Seconds(r.Timeout), MaxAttempts: 3,
	}
	defer w.Close()
	ms := messages(r)
	offsets, errors := make([]*int64, len(ms)), make([]*string, len(ms)) // the Writer reports no offsets
	err := w.WriteMessages(ctx, ms...)
	for i := range ms {
		switch e := err.(type) {
		case nil:
		case kafka.WriteErrors:
			errors[i] = drive.Error(e[i])
		default:
			errors[i] = drive.Error(err)
		}
	}
	return map[string]any{"offsets": offsets, "errors": errors}, nil
}

// leader is a Conn to the leader of the request's partition, with the request's deadline.
func leader(ctx context.Context, r *drive.Request) (*kafka.Conn, error) {
	conn, err := kafka.DialLeader(ctx, "tcp", r.Bootstrap, r.Topic, int(r.Partition))
	if err != nil {
		return nil, err
	}
	deadline, _ := ctx.Deadline()
	return conn, conn.SetDeadline(deadline)
}

// connProduce writes the records through a Conn to the partition's leader in one request
// (Conn.WriteCompressedMessagesAt), answering the base offset the broker gave.
func connProduce(ctx context.Context, r *drive.Request) (any, error) {
	conn, err := leader(ctx, r)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	var codec compress.Codec
	if c := codecs[r.Compression]; c != 0 {
		codec = c.Codec()
	}
	_, _, base, _, err := conn.WriteCompressedMessagesAt(codec, messages(r)...)
	if err != nil {
		return map[string]any{"offsets": nil, "errors": []*string{drive.Error(err)}}, nil
	}
	return map[string]any{"offsets": []int64{base}, "errors": []*string{nil}}, nil
}

func record(m kafka.Message) drive.Record {
	headers := [][2][]byte{}
	for _, h := range m.Headers {
		headers = append(headers, [2][]byte{[]byte(h.Key), h.Value})
	}
	return drive.Read(m.Offset, m.Key, m.Value, headers, m.Time)
}

// readerWait is the Readers' MaxWait: kafka-go reads a fetch's answer within it (and asks
// the broker for a quarter less), so a short one times out on a busy machine, and the
// Reader reconnects and backs off again and again.
const readerWait = time.Second

// next reads a message until the time it is given (none then), kept in last.
func next(ctx context.Context, reader *kafka.Reader, last *kafka.Message) func(until time.Time) ([]drive.Record, error) {
	return func(until time.Time) ([]drive.Record, error) {
		wait, cancel := context.WithDeadline(ctx, until)
		defer cancel()
		m, err := reader.FetchMessage(wait)
		if err != nil {
			if wait.Err() != nil {
				return nil, nil
			}
			return nil, err
		}
		*last = m
		return []drive.Record{record(m)}, nil
	}
}

func consume(ctx context.Context, r *drive.Request) (any, error) {
	start, err := r.Where()
	if err != nil {
		return nil, err
	}
	reader := kafka.NewReader(kafka.ReaderConfig{Brokers: []string{r.Bootstrap}, Topic: r.Topic, Partition: int(r.Partition),
		MaxWait: readerWait, MinBytes: 1, MaxBytes: 10 << 20})
	defer reader.Close()
	at := start.Offset
	if start.Earliest {
		at = kafka.FirstOffset
	} else if start.Latest {
		at = kafka.LastOffset
	}
	if err := reader.SetOffset(at); err != nil {
		return nil, err
	}
	got, err := drive.Collect(ctx, r.Count, drive.Seconds(r.Quiet), next(ctx, reader, &kafka.Message{}))
	if err != nil {
		return nil, err
	}
	return map[string]any{"records": got}, nil
}

func group(ctx context.Context, r *drive.Request) (any, error) {
	reader := kafka.NewReader(kafka.ReaderConfig{Brokers: []string{r.Bootstrap}, Topic: r.Topic, GroupID: r.Group,
		MaxWait: readerWait, MinBytes: 1, MaxBytes: 10 << 20, StartOffset: kafka.FirstOffset,
		SessionTimeout: 10 * time.Second, HeartbeatInterval: time.Second, CommitInterval: 0,
		RebalanceTimeout: 10 * time.Second, JoinGroupBackoff: 200 * time.Millisecond,
		ErrorLogger: kafka.LoggerFunc(log.Printf), Logger: kafka.LoggerFunc(log.Printf)}) // on stderr, shown when a test fails
	defer reader.Close() // leaves the group
	var last kafka.Message
	got, err := drive.Collect(ctx, r.Count, 0, next(ctx, reader, &last))
	if err != nil {
		return nil, err
	}
	var committed *int64
	if len(got) > 0 {
		commit, cancel := context.WithTimeout(context.Background(), 10*time.Second) // also when ctx ended the read
		defer cancel()
		if err := reader.CommitMessages(commit, last); err != nil { // commits last.Offset + 1
			return nil, fmt.Errorf("commit after %d records: %w", len(got), err)
		}
		offset := last.Offset + 1
		committed = &offset
	}
	return map[string]any{"records": got, "committed": committed}, nil
}

func offsets(ctx context.Context, r *drive.Request) (any, error) {
	conn, err := leader(ctx, r)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	first, last, err := conn.ReadOffsets()
	if err != nil {
		return nil, err
	}
	answer := map[string]any{"earliest": first, "latest": last}
	if r.Timestamp != nil {
		at, err := conn.ReadOffset(time.UnixMilli(*r.Timestamp))
		if err != nil {
			return nil, fmt.Errorf("timestamp: %w", err)
		}
		answer["timestamp"] = at
	}
	return answer, nil
}

// versioned sends one request of the version asked for with kafka-go's protocol package.
func versioned(ctx context.Context, r *drive.Request) (any, error) {
	var request protocol.Message
	switch r.API {
	case "produce":
		records := make([]protocol.Record, len(r.Records))
		for i, sent := range r.Records {
			records[i] = protocol.Record{Time: time.UnixMilli(sent.Timestamp),
				Key: protocol.NewBytes(drive.Raw(sent.Key)), Value: protocol.NewBytes(drive.Raw(sent.Value))}
		}
		request = &produceapi.Request{Acks: -1, Timeout: 5000, Topics: []produceapi.RequestTopic{{Topic: r.Topic,
			Partitions: []produceapi.RequestPartition{{Partition: r.Partition,
				RecordSet: protocol.RecordSet{Records: protocol.NewRecordReader(records...)}}}}}}
	case "fetch":
		request = &fetchapi.Request{ReplicaID: -1, MaxWaitTime: 100, MinBytes: 1, MaxBytes: 1 << 20, Topics: []fetchapi.RequestTopic{{
			Topic: r.Topic, Partitions: []fetchapi.RequestPartition{{Partition: r.Partition, PartitionMaxBytes: 1 << 20}}}}}
	default:
		return nil, fmt.Errorf("no api %q", r.API)
	}
	if prepared, ok := request.(protocol.PreparedMessage); ok {
		prepared.Prepare(r.Version)
	}
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", r.Bootstrap)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	deadline, _ := ctx.Deadline()
	conn.SetDeadline(deadline)
	answer, err := protocol.RoundTrip(conn, r.Version, 1, "kl-tests", request)
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) {
		return map[string]any{"failed": "closed"}, nil
	}
	if err != nil {
		return nil, err
	}
	partitions := [][3]int64{}
	switch a := answer.(type) {
	case *produceapi.Response:
		for _, t := range a.Topics {
			for _, p := range t.Partitions {
				partitions = append(partitions, [3]int64{int64(p.Partition), int64(p.ErrorCode), p.BaseOffset})
			}
		}
	case *fetchapi.Response:
		for _, t := range a.Topics {
			for _, p := range t.Partitions {
				partitions = append(partitions, [3]int64{int64(p.Partition), int64(p.ErrorCode), p.HighWatermark})
			}
		}
	}
	return map[string]any{"partitions": partitions}, nil
}

// watch: a Reader of the partition from FirstOffset (assign), or of a group (StartOffset
// FirstOffset, nothing committed); the errors FetchMessage returns, by kafka.Error's
// title where they are Kafka error codes.
func watch(ctx context.Context, r *drive.Request) (any, error) {
	config := kafka.ReaderConfig{Brokers: []string{r.Bootstrap}, Topic: r.Topic, MaxWait: readerWait, MinBytes: 1,
		MaxBytes: 10 << 20, ErrorLogger: kafka.LoggerFunc(log.Printf)}
	if r.How == "group" {
		config.GroupID, config.StartOffset, config.CommitInterval = r.Group, kafka.FirstOffset, 0
		config.SessionTimeout, config.HeartbeatInterval = 10*time.Second, time.Second
		config.RebalanceTimeout, config.JoinGroupBackoff = 10*time.Second, 200*time.Millisecond
	} else {
		config.Partition = int(r.Partition)
	}
	reader := kafka.NewReader(config)
	defer reader.Close()
	if r.How != "group" {
		if err := reader.SetOffset(kafka.FirstOffset); err != nil {
			return nil, err
		}
	}
	return drive.Watch(ctx, r, next(ctx, reader, &kafka.Message{}), func(err error) string {
		var code kafka.Error
		if errors.As(err, &code) {
			return code.Title()
		}
		return err.Error()
	})
}
