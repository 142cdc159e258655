"""Spark's own Kafka source (spark-sql-kafka-0-10, installed by tests/kafka_programs.py's
``spark_kafka_jars`` and put on the ``spark`` session's classpath by conftest) reading
``kl serve --kafka``, in batch and as a stream: its rows (value, key, topic, partition,
timestamp, headers) are those ``spark.read.format("kl")`` reads from the same root.

The records are produced through the daemon by confluent-kafka (librdkafka), headers on
some, a null key on some, into two partitions; the same scenarios run against Apache
Kafka (tests/kafka_oracle.py's broker, one for the module), the same records produced
into it, whose rows are kl's rows too; so are the offsets (one per record) and what
``maxOffsetsPerTrigger`` and ``minPartitions`` make of them.
"""

from __future__ import annotations

import pytest
from installs import Unavailable

import kl

from conftest import SPARK_KAFKA_MISSING
from kafka_clients import module_fixtures

root, daemon, _kafkajs, _no_client_left = module_fixtures("spark-kafka")

TOPIC = "events"
PARTITIONS = 2
COUNT = 12
T0 = 1_700_000_000_000
COLUMNS = ("value", "key", "topic", "partition", "timestamp", "headers")


@pytest.fixture(scope="module")
def kafka_spark(spark):
    """The session, once Spark's Kafka source is on its classpath."""
    for e in SPARK_KAFKA_MISSING:
        if isinstance(e, Unavailable):
            pytest.skip(f"Spark's Kafka source: {e}")
        pytest.fail(f"Spark's Kafka source could not be installed: {e}")
    return spark


class Server:
    """Where Spark's Kafka source reads: ``name`` "kl" (the daemon over ``root``) or
    "kafka" (Apache Kafka, the oracle of tests/test_kafka_oracle.py)."""

    def __init__(self, name: str, bootstrap: str) -> None:
        self.name, self.bootstrap = name, bootstrap


@pytest.fixture(scope="module")
def on_kl(root: kl.Root, daemon) -> Server:
    """The daemon, the topic created in its root and the records of ``sent`` produced
    through it."""
    root.create_topic(TOPIC, kl.TopicConfig(partitions=PARTITIONS))
    return produced(Server("kl", daemon.bootstrap))


@pytest.fixture(scope="module", params=["kl", "kafka"])
def server(request, tmp_path_factory):
    """kl's daemon (``on_kl``) or Kafka's broker, the topic created in it (PARTITIONS) and
    the records of ``sent`` produced through it by confluent-kafka.  Kafka's broker takes
    about 5 s to start here, the module's own."""
    if request.param == "kl":
        yield request.getfixturevalue("on_kl")
        return
    from confluent_kafka.admin import AdminClient, NewTopic
    from kafka_oracle import Broker, install

    try:
        lib = install()
    except Unavailable as e:
        pytest.skip(f"Apache Kafka: {e}")
    broker = Broker(lib, tmp_path_factory.mktemp("kafka"))
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        for future in admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)]).values():
            future.result(30)
        yield produced(Server("kafka", broker.bootstrap))
    finally:
        broker.stop()


def sent() -> list[tuple]:
    """COUNT records as (value, key, partition, timestamp, headers): a null key on some,
    headers (one empty) on some, a binary value each."""
    out = []
    for i in range(COUNT):
        key = None if i % 4 == 0 else b"key-%d" % i
        headers = [("h", b"v%d" % i), ("empty", b"")] if i % 3 == 0 else None
        out.append((b"value \x00\xff #%d" % i, key, i % PARTITIONS, T0 + 1000 * i, headers))
    return out


def produced(server: Server) -> Server:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": server.bootstrap, "linger.ms": 0})
    failed: list = []
    for value, key, partition, timestamp, headers in sent():
        producer.produce(
            TOPIC, value, key, partition=partition, timestamp=timestamp, headers=headers,
            on_delivery=lambda err, _m: err and failed.append(err),
        )  # fmt: skip
    assert producer.flush(30) == 0 and not failed, failed
    return server


def rows(df) -> list[tuple]:
    """The rows' COLUMNS, headers as lists of (key, value) tuples, sorted."""
    out = []
    for r in df.select(*COLUMNS).collect():
        headers = None if r.headers is None else [(h.key, bytes(h.value)) for h in r.headers]
        key = None if r.key is None else bytes(r.key)
        out.append((bytes(r.value), key, r.topic, r.partition, r.timestamp, headers))
    return sorted(out, key=lambda t: (t[3], t[4]))


def kafka(spark, server: Server, *, stream: bool = False, **options: str):
    """Spark's Kafka source over the topic, headers included: a batch read, or with ``stream`` a stream."""
    reader = (spark.readStream if stream else spark.read).format("kafka")
    reader = reader.option("kafka.bootstrap.servers", server.bootstrap).option("subscribe", TOPIC)
    for name, value in {"includeHeaders": "true", **options}.items():
        reader = reader.option(name, value)
    return reader.load()


@pytest.fixture(scope="module")
def kl_rows(kafka_spark, root: kl.Root, on_kl) -> list[tuple]:
    """What kl's source reads of the records produced through the daemon."""
    df = (
        kafka_spark.read.format("kl")
        .option("root", str(root.path))
        .option("topics", TOPIC)
        .option("includeHeaders", "true")
        .load()
    )
    got = rows(df)
    assert len(got) == COUNT
    return got


def test_the_rows_are_those_produced(kl_rows):
    """The comparison's base: kl's source reads what confluent-kafka produced."""
    expected = sorted(
        ((v, k, TOPIC, p, t, h) for v, k, p, t, h in sent()), key=lambda r: (r[3], r[4])
    )  # fmt: skip
    assert [(v, k, tp, p, int(ts.timestamp() * 1000), h) for v, k, tp, p, ts, h in kl_rows] == expected


def test_batch_read_earliest_to_latest_gives_kls_rows(kafka_spark, server, kl_rows):
    df = kafka(kafka_spark, server, startingOffsets="earliest", endingOffsets="latest")
    assert rows(df) == kl_rows


def test_batch_read_by_default_reads_everything(kafka_spark, server, kl_rows):
    """A batch query's default range is earliest to latest, as Spark's documentation says."""
    assert rows(kafka(kafka_spark, server)) == kl_rows


def test_stream_available_now_into_memory_gives_kls_rows(kafka_spark, server, kl_rows, tmp_path):
    stream = kafka(kafka_spark, server, stream=True, startingOffsets="earliest", maxOffsetsPerTrigger="1000000")
    query = (
        stream.writeStream.format("memory")
        .queryName("kl_kafka_available_now")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(120), "the availableNow query did not end within 120 s"
    assert query.exception() is None
    assert rows(kafka_spark.table("kl_kafka_available_now")) == kl_rows


def test_stream_process_all_available_gives_kls_rows(kafka_spark, server, kl_rows, tmp_path):
    """A stream left running, processAllAvailable into a memory sink (a foreachBatch of a
    Python function hangs here, in py4j's callback, when another test module's session
    left its gateway behind)."""
    stream = kafka(kafka_spark, server, stream=True, startingOffsets="earliest")
    name = f"kl_kafka_all_available_{server.name}"
    query = stream.writeStream.format("memory").queryName(name).option("checkpointLocation", str(tmp_path / "cp")).start()
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert rows(kafka_spark.table(name)) == kl_rows


def test_the_offsets_column_counts_records(kafka_spark, server):
    """One offset per record from 0, in each partition."""
    df = kafka(kafka_spark, server, startingOffsets="earliest", endingOffsets="latest")
    by_partition: dict[int, list[int]] = {}
    for r in df.select("partition", "offset").orderBy("partition", "offset").collect():
        by_partition.setdefault(r.partition, []).append(r.offset)
    assert by_partition == {p: list(range(COUNT // PARTITIONS)) for p in range(PARTITIONS)}


def test_max_offsets_per_trigger_caps_each_batch_in_records(kafka_spark, server, kl_rows, tmp_path):
    """maxOffsetsPerTrigger=4 over 12 records: batches of 4 records, 3 of them (each
    batch's input rows as the query's progress reports them)."""
    stream = kafka(kafka_spark, server, stream=True, startingOffsets="earliest", maxOffsetsPerTrigger="4")
    name = f"kl_kafka_per_trigger_{server.name}"
    query = (
        stream.writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(120), "the availableNow query did not end within 120 s"
    assert query.exception() is None
    assert [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]] == [4, 4, 4]
    assert rows(kafka_spark.table(name)) == kl_rows


def test_min_partitions_splits_the_read_and_gives_kls_rows(kafka_spark, server, kl_rows):
    """minPartitions=4 over 2 partitions: Spark splits each partition's offset range in two."""
    df = kafka(kafka_spark, server, startingOffsets="earliest", endingOffsets="latest", minPartitions="4")
    assert df.rdd.getNumPartitions() == 4
    assert rows(df) == kl_rows
