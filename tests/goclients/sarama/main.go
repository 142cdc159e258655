// IBM/sarama, unmodified, driven by the JSON requests of package drive.
package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/IBM/sarama"

	"kl.tests/goclients/drive"
)

func main() {
	drive.Serve(map[string]drive.Op{"produce": produce, "consume": consume, "group": group, "offsets": offsets, "watch": watch})
}

var codecs = map[string]sarama.CompressionCodec{
	"": sarama.CompressionNone, "none": sarama.CompressionNone, "gzip": sarama.CompressionGZIP,
	"snappy": sarama.CompressionSnappy, "lz4": sarama.CompressionLZ4, "zstd": sarama.CompressionZSTD,
}

func config(r *drive.Request) *sarama.Config {
	c := sarama.NewConfig()
	c.Version = sarama.V2_1_0_0 // the oldest Kafka 4 serves
	c.Net.DialTimeout, c.Net.ReadTimeout, c.Net.WriteTimeout = 10*time.Second, 10*time.Second, 10*time.Second
	c.Metadata.Retry.Backoff = 50 * time.Millisecond
	c.Consumer.MaxWaitTime = 100 * time.Millisecond
	return c
}

func produce(_ context.Context, r *drive.Request) (any, error) {
	c := config(r)
	c.Producer.Return.Successes = true
	c.Producer.Partitioner = sarama.NewManualPartitioner
	c.Producer.RequiredAcks = sarama.WaitForAll
	c.Producer.Compression = codecs[r.Compression]
	c.Producer.Timeout = drive.Seconds(r.Timeout)
	if r.Idempotent {
		c.Producer.Idempotent = true
		c.Net.MaxOpenRequests = 1
	}
	producer, err := sarama.NewSyncProducer([]string{r.Bootstrap}, c)
	if err != nil {
		return nil, err
	}
	defer producer.Close()
	messages := make([]*sarama.ProducerMessage, len(r.Records))
	for i, sent := range r.Records {
		m := &sarama.ProducerMessage{Topic: r.Topic, Partition: r.Partition, Timestamp: time.UnixMilli(sent.Timestamp)}
		if key := drive.Raw(sent.Key); key != nil {
			m.Key = sarama.ByteEncoder(key)
		}
		if value := drive.Raw(sent.Value); value != nil {
			m.Value = sarama.ByteEncoder(value)
		}
		for _, h := range sent.Headers {
			m.Headers = append(m.Headers, sarama.RecordHeader{Key: []byte(h[0]), Value: drive.Raw(&h[1])})
		}
		messages[i] = m
	}
	failed := map[*sarama.ProducerMessage]error{}
	if err := producer.SendMessages(messages); err != nil {
		errs, ok := err.(sarama.ProducerErrors)
		if !ok {
			return nil, err
		}
		for _, e := range errs {
			failed[e.Msg] = e.Err
		}
	}
	offsets, errors := []*int64{}, []*string{}
	for _, m := range messages {
		if e, bad := failed[m]; bad {
			offsets, errors = append(offsets, nil), append(errors, drive.Error(e))
		} else {
			offset := m.Offset
			offsets, errors = append(offsets, &offset), append(errors, nil)
		}
	}
	return map[string]any{"offsets": offsets, "errors": errors}, nil
}

func record(m *sarama.ConsumerMessage) drive.Record {
	headers := [][2][]byte{}
	for _, h := range m.Headers {
		headers = append(headers, [2][]byte{h.Key, h.Value})
	}
	return drive.Read(m.Offset, m.Key, m.Value, headers, m.Timestamp)
}

func consume(ctx context.Context, r *drive.Request) (any, error) {
	start, err := r.Where()
	if err != nil {
		return nil, err
	}
	at := start.Offset
	if start.Earliest {
		at = sarama.OffsetOldest
	} else if start.Latest {
		at = sarama.OffsetNewest
	}
	consumer, err := sarama.NewConsumer([]string{r.Bootstrap}, config(r))
	if err != nil {
		return nil, err
	}
	defer consumer.Close()
	partition, err := consumer.ConsumePartition(r.Topic, r.Partition, at)
	if err != nil {
		return nil, err
	}
	defer partition.AsyncClose()
	got, err := drive.Collect(ctx, r.Count, drive.Seconds(r.Quiet), func(until time.Time) ([]drive.Record, error) {
		select {
		case m := <-partition.Messages():
			return []drive.Record{record(m)}, nil
		case e := <-partition.Errors():
			return nil, e
		case <-time.After(time.Until(until)):
			return nil, nil
		}
	})
	if err != nil {
		return nil, err
	}
	return map[string]any{"records": got}, nil
}

// member reads count messages of its claims, marks the last (its offset + 1) and
// commits it, then ends its session.
type member struct {
	count     int
	mu        sync.Mutex
	got       []drive.Record
	committed *int64
	done      chan struct{}
	once      sync.Once
}

func (m *member) Setup(sarama.ConsumerGroupSession) error   { return nil }
func (m *member) Cleanup(sarama.ConsumerGroupSession) error { return nil }

func (m *member) ConsumeClaim(session sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	for {
		select {
		case msg, ok := <-claim.Messages():
			if !ok {
				return nil
			}
			m.mu.Lock()
			if len(m.got) >= m.count {
				m.mu.Unlock()
				return nil
			}
			m.got = append(m.got, record(msg))
			enough := len(m.got) >= m.count
			if enough {
				session.MarkMessage(msg, "")
				session.Commit()
				next := msg.Offset + 1
				m.committed = &next
			}
			m.mu.Unlock()
			if enough {
				m.once.Do(func() { close(m.done) })
				return nil
			}
		case <-session.Context().Done():
			return nil
		}
	}
}

// grouped is c for a group's member: from the oldest offset where nothing is committed,
// committing only when told to.
func grouped(c *sarama.Config) *sarama.Config {
	c.Consumer.Offsets.Initial = sarama.OffsetOldest
	c.Consumer.Offsets.AutoCommit.Enable = false
	c.Consumer.Group.Session.Timeout = 10 * time.Second
	c.Consumer.Group.Heartbeat.Interval = time.Second
	return c
}

func group(ctx context.Context, r *drive.Request) (any, error) {
	c := config(r)
	g, err := sarama.NewConsumerGroup([]string{r.Bootstrap}, r.Group, grouped(c))
	if err != nil {
		return nil, err
	}
	m := &member{count: r.Count, done: make(chan struct{})}
	session, stop := context.WithCancel(ctx)
	failed := make(chan error, 1)
	go func() {
		for session.Err() == nil {
			if err := g.Consume(session, []string{r.Topic}, m); err != nil {
				failed <- err
				return
			}
		}
		failed <- nil
	}()
	select {
	case <-m.done:
	case <-ctx.Done():
	}
	stop()
	err = <-failed
	if e := g.Close(); err == nil { // leaves the group
		err = e
	}
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return map[string]any{"records": m.got, "committed": m.committed}, nil
}

func offsets(_ context.Context, r *drive.Request) (any, error) {
	client, err := sarama.NewClient([]string{r.Bootstrap}, config(r))
	if err != nil {
		return nil, err
	}
	defer client.Close()
	answer := map[string]any{}
	times := map[string]int64{"earliest": sarama.OffsetOldest, "latest": sarama.OffsetNewest}
	if r.Timestamp != nil {
		times["timestamp"] = *r.Timestamp
	}
	for name, at := range times {
		offset, err := client.GetOffset(r.Topic, r.Partition, at)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		answer[name] = offset
	}
	return answer, nil
}

// watcher hands the messages of its claims to the watch op's reader, marking none.
type watcher chan *sarama.ConsumerMessage

func (w watcher) Setup(sarama.ConsumerGroupSession) error   { return nil }
func (w watcher) Cleanup(sarama.ConsumerGroupSession) error { return nil }
func (w watcher) ConsumeClaim(session sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	for {
		select {
		case msg, ok := <-claim.Messages():
			if !ok {
				return nil
			}
			select {
			case w <- msg:
			case <-session.Context().Done():
				return nil
			}
		case <-session.Context().Done():
			return nil
		}
	}
}

// watch: ConsumePartition at the oldest offset (assign), or a ConsumerGroup's Consume,
// called again while the watch lasts; the errors its consumer returns (Return.Errors),
// by their Kafka error's text where they have one.
func watch(ctx context.Context, r *drive.Request) (any, error) {
	c := config(r)
	c.Consumer.Return.Errors = true
	c.Consumer.Offsets.Initial = sarama.OffsetOldest
	c.Consumer.Retry.Backoff = 100 * time.Millisecond // a partition lost finds its topic again within the tests' NOTICE
	var messages <-chan *sarama.ConsumerMessage
	var failures <-chan error
	if r.How == "group" {
		g, err := sarama.NewConsumerGroup([]string{r.Bootstrap}, r.Group, grouped(c))
		if err != nil {
			return nil, err
		}
		w := make(watcher)
		consumed := make(chan error, 1)
		failed := make(chan error, 16)
		session, stop := context.WithCancel(ctx)
		go func() {
			for session.Err() == nil {
				if err := g.Consume(session, []string{r.Topic}, w); err != nil && session.Err() == nil {
					select {
					case failed <- err:
					default:
					}
					time.Sleep(100 * time.Millisecond)
				}
			}
			consumed <- nil
		}()
		go func() {
			for err := range g.Errors() {
				select {
				case failed <- err:
				default:
				}
			}
		}()
		defer func() {
			stop()
			<-consumed
			g.Close() // leaves the group
		}()
		messages, failures = w, failed
	} else {
		consumer, err := sarama.NewConsumer([]string{r.Bootstrap}, c)
		if err != nil {
			return nil, err
		}
		defer consumer.Close()
		partition, err := consumer.ConsumePartition(r.Topic, r.Partition, sarama.OffsetOldest)
		if err != nil {
			return nil, err
		}
		defer partition.AsyncClose()
		failed := make(chan error, 16)
		go func() {
			for e := range partition.Errors() {
				select {
				case failed <- e:
				default:
				}
			}
		}()
		messages, failures = partition.Messages(), failed
	}
	next := func(until time.Time) ([]drive.Record, error) {
		select {
		case m, ok := <-messages:
			if !ok { // the partition consumer shut down: nothing more comes
				messages = nil
				return nil, nil
			}
			return []drive.Record{record(m)}, nil
		case e := <-failures:
			return nil, e
		case <-time.After(time.Until(until)):
			return nil, nil
		}
	}
	return drive.Watch(ctx, r, next, func(err error) string {
		var code sarama.KError
		if errors.As(err, &code) {
			return code.Error()
		}
		return err.Error()
	})
}
