package main

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"kl.tests/goclients/drive"
)

// admin: a topic's life through kadm, step by step, as tests/kafka-java/src/AdminOps.java
// takes it through the Java Admin client; each step observed on its own within Seconds (a
// step that fails is {"error": Kafka's name of the error code, or the error's text}, and
// the steps after it still run). The steps: create (2 partitions, replication 1,
// retention.ms=3600000), again, listed, described ([partition, replicas, ISR] each),
// grown (to 3), configs ([value, source] of retention.ms, max.message.bytes,
// cleanup.policy), altered (SET retention.ms=7200000, DELETE max.message.bytes), records
// (6 produced to partition 0, deleted before offset 2: the low watermark, then the start
// offset), log dirs (the topic's partitions found), groups (offset 4 of partition 0
// committed for the group; listed, its offsets, DeleteOffsets, the offsets left,
// DeleteGroup), deleted (then whether ListTopics names it).
func admin(ctx context.Context, r *drive.Request) (any, error) {
	// Metadata at most 0.1 s old: kgo answers a Metadata request from its cache younger
	// than that, and the grown partitions must show once Kafka's broker has them.
	client, err := kgo.NewClient(kgo.SeedBrokers(r.Bootstrap), kgo.MetadataMinAge(100*time.Millisecond))
	if err != nil {
		return nil, err
	}
	defer client.Close()
	adm := kadm.NewClient(client)
	topic, group := r.Topic, r.Topic+"-group"
	seen := map[string]any{}
	step := func(name string, fn func(context.Context) (any, error)) {
		c, cancel := context.WithTimeout(ctx, drive.Seconds(r.Seconds))
		defer cancel()
		got, err := fn(c)
		if err != nil {
			seen[name] = map[string]string{"error": named(err)}
			return
		}
		seen[name] = got
	}
	created := func(c context.Context) (any, error) {
		_, err := adm.CreateTopic(c, 2, 1, map[string]*string{"retention.ms": kadm.StringPtr("3600000")}, topic)
		return "ok", err
	}
	step("create", created)
	step("again", created)
	step("listed", func(c context.Context) (any, error) {
		topics, err := adm.ListTopics(c)
		return topics.Has(topic), err
	})
	partitions := func(c context.Context) ([][3]int, error) {
		topics, err := adm.ListTopics(c, topic)
		if err == nil {
			err = topics.Error()
		}
		var out [][3]int
		for _, p := range topics[topic].Partitions.Sorted() {
			out = append(out, [3]int{int(p.Partition), len(p.Replicas), len(p.ISR)})
		}
		return out, err
	}
	step("described", func(c context.Context) (any, error) { return partitions(c) })
	step("grown", func(c context.Context) (any, error) {
		grown, err := adm.UpdatePartitions(c, 3, topic)
		if err == nil {
			err = grown.Error()
		}
		if err != nil {
			return nil, err
		}
		for { // Kafka's broker has them once its metadata does
			found, err := partitions(c)
			if err != nil || len(found) >= 3 || c.Err() != nil {
				return len(found), err
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
	configs := func(c context.Context, names ...string) (any, error) {
		described, err := adm.DescribeTopicConfigs(c, topic)
		if err != nil {
			return nil, err
		}
		config, err := described.On(topic, nil)
		if err != nil {
			return nil, err
		}
		out := map[string]any{}
		for _, name := range names {
			out[name] = nil
			for _, e := range config.Configs {
				if e.Key == name {
					out[name] = []any{e.MaybeValue(), e.Source.String()}
				}
			}
		}
		return out, nil
	}
	step("configs", func(c context.Context) (any, error) {
		return configs(c, "retention.ms", "max.message.bytes", "cleanup.policy")
	})
	step("altered", func(c context.Context) (any, error) {
		altered, err := adm.AlterTopicConfigs(c, []kadm.AlterConfig{
			{Op: kadm.SetConfig, Name: "retention.ms", Value: kadm.StringPtr("7200000")},
			{Op: kadm.DeleteConfig, Name: "max.message.bytes"},
		}, topic)
		if err == nil {
			_, err = altered.On(topic, nil)
		}
		if err != nil {
			return nil, err
		}
		for { // Kafka's broker answers with the new value once its metadata has it
			found, err := configs(c, "retention.ms", "max.message.bytes")
			retention, _ := found.(map[string]any)["retention.ms"].([]any)
			if err != nil || c.Err() != nil || len(retention) > 0 && retention[0] == "7200000" {
				return found, err
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
	step("records", func(c context.Context) (any, error) {
		producer, err := kgo.NewClient(kgo.SeedBrokers(r.Bootstrap), kgo.RecordPartitioner(kgo.ManualPartitioner()))
		if err != nil {
			return nil, err
		}
		defer producer.Close()
		for i := 0; i < 6; i++ {
			if err := producer.ProduceSync(c, &kgo.Record{Topic: topic, Partition: 0, Value: []byte{'v', byte('0' + i)}}).FirstErr(); err != nil {
				return nil, err
			}
		}
		deleted, err := adm.DeleteRecords(c, kadm.Offsets{topic: {0: {Topic: topic, Partition: 0, At: 2}}})
		if err != nil {
			return nil, err
		}
		low, _ := deleted.Lookup(topic, 0)
		if low.Err != nil {
			return nil, low.Err
		}
		starts, err := adm.ListStartOffsets(c, topic)
		if err == nil {
			err = starts.Error()
		}
		start, _ := starts.Lookup(topic, 0)
		return []int64{low.LowWatermark, start.Offset}, err
	})
	step("log dirs", func(c context.Context) (any, error) {
		dirs, err := adm.DescribeAllLogDirs(c, nil)
		if err != nil {
			return nil, err
		}
		found := map[int32]bool{}
		for _, broker := range dirs {
			broker.EachPartition(func(p kadm.DescribedLogDirPartition) {
				if p.Topic == topic {
					found[p.Partition] = true
				}
			})
		}
		out := []int{}
		for p := range found {
			out = append(out, int(p))
		}
		sort.Ints(out)
		return out, nil
	})
	step("groups", func(c context.Context) (any, error) {
		committed, err := adm.CommitOffsets(c, group, kadm.Offsets{topic: {0: {Topic: topic, Partition: 0, At: 4, LeaderEpoch: -1}}})
		if err == nil {
			err = committed.Error()
		}
		if err != nil {
			return nil, err
		}
		out := map[string]any{}
		listed, err := adm.ListGroups(c)
		if err != nil {
			return nil, err
		}
		_, out["listed"] = listed[group]
		fetched := func() (map[string]int64, error) {
			offsets, err := adm.FetchOffsets(c, group)
			if err == nil {
				err = offsets.Error()
			}
			got := map[string]int64{}
			offsets.Each(func(o kadm.OffsetResponse) { got[fmt.Sprintf("%s-%d", o.Topic, o.Partition)] = o.At })
			return got, err
		}
		if out["offsets"], err = fetched(); err != nil {
			return nil, err
		}
		gone, err := adm.DeleteOffsets(c, group, kadm.TopicsSet{topic: {0: {}}})
		if err == nil {
			err = gone.Error()
		}
		if err != nil {
			return nil, err
		}
		if out["after delete-offsets"], err = fetched(); err != nil {
			return nil, err
		}
		_, err = adm.DeleteGroup(c, group)
		return out, err
	})
	step("deleted", func(c context.Context) (any, error) {
		deleted, err := adm.DeleteTopics(c, topic)
		if err == nil {
			err = deleted.Error()
		}
		if err != nil {
			return nil, err
		}
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) { // Kafka's metadata catches up
			topics, err := adm.ListTopics(c)
			if err != nil || !topics.Has(topic) || time.Now().After(deadline) {
				return topics.Has(topic), err
			}
		}
	})
	return seen, nil
}

// named is Kafka's name of an error code (kerr's), or the error's text.
func named(err error) string {
	var code *kerr.Error
	if errors.As(err, &code) {
		return code.Message
	}
	return err.Error()
}
