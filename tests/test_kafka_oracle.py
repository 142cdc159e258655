"""kl serve --kafka held to Apache Kafka itself: the same scenario, the same unmodified
client, against both; what the client observes must be the same.

The oracle is Kafka 4.4.0's broker (tests/kafka_oracle.py): ``scripts/test`` copies it
from Maven Central with mvn into the gitignored ``.cache/kafka-oracle`` beside its other
installs, and one KRaft node on loopback serves this whole module (about 5 s to format
and start here; its tests are in this one file so that xdist's ``--dist loadfile`` keeps
them on one worker).  Where java, mvn or Maven Central is missing the tests skip, saying so; a Kafka
that was installed and then fails to start fails them.  The other endpoint is one ``kl
serve --kafka`` over a fresh root for the module.

A scenario is a plain function ``scenario(endpoint, **args)`` that creates its topics
through the endpoint (``Endpoint.create_topic``: Kafka's admin client, kl's library),
drives a client (confluent-kafka or kafka-python in this process, every call with a
deadline; one of Kafka's own tools in a JVM: ``kafka_oracle.tool``; or the Java client or a
Go client, franz-go, IBM/sarama or segmentio/kafka-go, through a small program of
tests/kafka_programs.py that answers JSON requests, one process per client and endpoint for
the module, built on first use into gitignored caches and skipped, saying why, where go,
java, mvn or their registries are missing) and returns what the client observed, as plain
data.  ``same(scenario, ...)``
runs it against both and fails with both observations when they differ (``Differs``); a
scenario that raises, misses its deadline (a client stuck) or outlives its endpoint (a
broker killed: what a client saw of a dead server is no observation) fails at once with
the end of that endpoint's log.  Adding a case is a function and a one-line test.

What is compared is what kl claims to match: values, keys, headers, timestamps and their
order, compressed or not, partitions, error codes, and offsets: one per record, as Kafka's
(delivery reports, positions, watermarks, offsets by time, committed offsets and lag, in
every client and in Kafka's own tools).
"""

from __future__ import annotations

import base64
import json
import os
import pprint
import re
import shutil
import socket
import struct
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import kafka
import kafka.errors
import kafkafuzz as fz
import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.admin.configs import AlterConfigsRequest, DescribeConfigsRequest, IncrementalAlterConfigsRequest
from kafka.protocol.admin.topics import CreateTopicsRequest
from kafka.protocol.consumer.fetch import FetchRequest
from kafka.protocol.consumer.group import OffsetCommitRequest, OffsetFetchRequest
from kafka.protocol.consumer.offsets import ListOffsetsRequest
from kafka.protocol.metadata.find_coordinator import FindCoordinatorRequest
from kafka.protocol.metadata.metadata import MetadataRequest
from kafka.protocol.producer.produce import ProduceRequest
from kafka.protocol.producer.transaction import InitProducerIdRequest
from kafka_oracle import MECHANISMS, PRINCIPAL_RULES, SECURE, SUPER_USERS, Broker, Security, Unavailable, install, tool, version
from kafka_programs import Program, go_programs, java_command

import kl
from kl.log import message as m
from kl.log import messageset
from kl.log.validate import Checked
from kl.net.acls import Acl, Acls
from kl.net.credentials import Credentials
from kl.net.kafka.errors import (
    INVALID_CONFIG,
    INVALID_REQUEST,
    INVALID_TOPIC_EXCEPTION,
    OFFSET_OUT_OF_RANGE,
    UNKNOWN_LEADER_EPOCH,
    UNKNOWN_TOPIC_ID,
    UNKNOWN_TOPIC_OR_PARTITION,
)
from kl.net.kafka.frontend import _responses

from kafka_clients import KAFKAJS, NODE, Daemon, kafkajs_modules, kcat_librdkafka

CLIENTS = ("confluent", "kafka-python")
SCENARIO_TIMEOUT = 90.0
"""Seconds one scenario may take against one endpoint (a group's join is the slowest step)."""
CALL_TIMEOUT = 15.0
"""Seconds one client call may take (a flush, a poll loop, a metadata request)."""
QUIET = 1.0
"""Seconds a reader that has the records it expected waits for one more (which would be
one too many)."""
T0 = 1_700_000_000_000
OFFSET_TAIL_BASE = -2000
"""librdkafka's RD_KAFKA_OFFSET_TAIL(n) is this minus n: n records before the high watermark."""


class Differs(AssertionError):
    """kl's observation is not Kafka's (the message shows both)."""


# ----------------------------------------------------------------- endpoints


@dataclass
class Endpoint:
    """One side of the comparison: Kafka or kl serve --kafka."""

    name: str
    bootstrap: str
    create: Callable[[str, int, int | None], None]
    """create(topic, partitions, max_message_bytes): made by the endpoint's own means."""
    report: Callable[[str], str]
    """report(why): ``why`` and the end of the endpoint's log."""
    alive: Callable[[], bool]
    """Whether its process still runs."""
    lib: Path
    """Kafka's jars: its tools (``kafka_oracle.tool``) are clients of either endpoint too."""
    delete: Callable[[str], None]
    """delete(topic), by the endpoint's own means (kl has no DeleteTopics), once clients
    no longer find it."""
    compressed: Callable[[str, list[Record]], None]
    """compressed(topic, records): one zstd batch of them in partition 0 (kl keeps a client's
    batch as plain messages: its own producer writes one of kl's compressed batches)."""
    listeners: dict[str, str]
    """Each listener's HOST:PORT by its security protocol (PLAINTEXT, SSL, SASL_PLAINTEXT,
    SASL_SSL), the same certificates and users behind both endpoints' (``Pki``, ``USERS``)."""

    def create_topic(self, topic: str, partitions: int = 1, max_message_bytes: int | None = None) -> str:
        self.create(topic, partitions, max_message_bytes)
        return topic


def kafka_endpoint(broker: Broker, lib: Path) -> Endpoint:
    # Setup only, its failures raised: quiet about the broker it outlives at the end.
    admin = AdminClient({"bootstrap.servers": broker.bootstrap, "socket.timeout.ms": 10_000, "log_level": 2})

    def create(topic: str, partitions: int, max_message_bytes: int | None) -> None:
        config = {} if max_message_bytes is None else {"max.message.bytes": str(max_message_bytes)}
        (future,) = admin.create_topics([NewTopic(topic, partitions, 1, config=config)], request_timeout=CALL_TIMEOUT).values()
        future.result(CALL_TIMEOUT)
        # Created in the controller; the broker answers for it once its metadata has it.
        deadline = time.monotonic() + CALL_TIMEOUT
        while len(admin.list_topics(topic, timeout=CALL_TIMEOUT).topics[topic].partitions) < partitions:
            assert time.monotonic() < deadline, broker.report(f"topic {topic} not in Kafka's metadata")
            time.sleep(0.05)

    def delete(topic: str) -> None:
        (future,) = admin.delete_topics([topic], request_timeout=CALL_TIMEOUT).values()
        future.result(CALL_TIMEOUT)
        deadline = time.monotonic() + CALL_TIMEOUT
        while admin.list_topics(topic, timeout=CALL_TIMEOUT).topics[topic].error is None:
            assert time.monotonic() < deadline, broker.report(f"topic {topic} still in Kafka's metadata")
            time.sleep(0.05)

    def compressed(topic: str, records: list[Record]) -> None:
        confluent_produce(endpoint, topic, records, **{"compression.type": "zstd", "linger.ms": 1000})

    endpoint = Endpoint("kafka", broker.bootstrap, create, broker.report, broker.alive, lib, delete, compressed, broker.listeners)
    return endpoint


def kl_endpoint(root: kl.Root, daemon: Daemon, lib: Path, listeners: dict[str, str]) -> Endpoint:
    def create(topic: str, partitions: int, max_message_bytes: int | None) -> None:
        sizes = {} if max_message_bytes is None else {"max_message_bytes": max_message_bytes}
        root.create_topic(topic, kl.TopicConfig(partitions=partitions, **sizes))

    def report(why: str) -> str:
        lines = daemon.text().splitlines()[-30:]
        return f"{why}\nkl serve --kafka's log, its last 30 lines:\n" + "\n".join(lines)

    def compressed(topic: str, records: list[Record]) -> None:
        inner = b"".join(m.encode(v, k, t, m.CODEC_NONE, h) for k, v, h, t in records)
        wrapped = messageset.wrap(inner, m.CODEC_ZSTD, max(t for *_, t in records))
        root.log(topic, 0).append(Checked.framed(wrapped, len(records)))

    return Endpoint("kl", daemon.bootstrap, create, report, lambda: daemon.proc.poll() is None, lib, root.delete_topic,
                    compressed, listeners)  # fmt: skip


def installed() -> Path:
    """Kafka's jars, or a skip saying why they cannot be had here."""
    try:
        return install()
    except Unavailable as e:
        pytest.skip(f"Apache Kafka: {e}")


@dataclass
class Pki:
    """Test certificates (trustme's): the CA, the server's for 127.0.0.1 and a client's
    (CN=alice), each as a certificate file and a key file, and, for Java, the key (PKCS#8)
    and the chain in one file."""

    ca: Path
    cert: Path
    key: Path
    keystore: Path
    client_cert: Path
    client_key: Path
    client_keystore: Path


USERS = {"alice": "alice-secret", "bob": "bob-secret"}
"""The SASL users of both endpoints (PLAIN and both SCRAM mechanisms): alice may do
anything to any topic, group or transactional id (``ACL_KINDS``), bob nothing but what
a test gives him."""
ACL_KINDS = ("TOPIC", "GROUP", "TRANSACTIONAL_ID")


ALICE = "User:alice"
"""alice's principal: her SASL user's, and her client certificate's (``PRINCIPAL_RULES``)."""


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    import trustme
    from cryptography.hazmat.primitives import serialization

    directory = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    made: dict[str, Path] = {"ca": directory / "ca.pem"}
    ca.cert_pem.write_to_path(str(made["ca"]))
    for name, cert in (
        ("", ca.issue_cert("127.0.0.1", "localhost")),
        ("client_", ca.issue_cert("alice@example.com", common_name="alice")),
    ):
        key = serialization.load_pem_private_key(cert.private_key_pem.bytes(), None)
        pkcs8 = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        chain = b"".join(c.bytes() for c in cert.cert_chain_pems)
        for part, data in (("cert", chain), ("key", pkcs8), ("keystore", pkcs8 + chain)):
            made[name + part] = directory / f"{name}{part}.pem"
            made[name + part].write_bytes(data)
    return Pki(**made)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[Broker]:
    """Kafka's one broker for the module, with every security protocol's listener; a skip
    where it cannot be installed, a failure where it was and does not start."""
    lib = installed()
    b = Broker(lib, tmp_path_factory.mktemp("kafka"), Security(pki.keystore, pki.ca, USERS))
    try:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        admin.list_topics(timeout=CALL_TIMEOUT)
        from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType

        grants = [AclBinding(getattr(ResourceType, kind), "*", ResourcePatternType.LITERAL, who, "*", AclOperation.ALL,
                            AclPermissionType.ALLOW) for kind in ACL_KINDS for who in (ALICE,)]  # fmt: skip
        for future in admin.create_acls(grants, request_timeout=CALL_TIMEOUT).values():
            future.result(CALL_TIMEOUT)
    except ck.KafkaException as e:
        b.stop()
        raise AssertionError(b.report(f"Kafka {version(lib)} started but does not answer: {e}")) from None
    yield b
    b.stop()


@pytest.fixture(scope="module")
def endpoints(broker: Broker, pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Endpoint, Endpoint]]:
    """(Kafka, kl serve --kafka over a fresh root), each with a listener of every security
    protocol: the same certificates, the same users."""
    path = tmp_path_factory.mktemp("oracle-kl") / "root"
    path.mkdir()
    root = kl.Root(path)
    users = Credentials(root.path)
    for name, password in USERS.items():
        for mechanism in MECHANISMS[1:]:
            users.add(name, password, mechanism)
    secure = [arg for p in SECURE for arg in ("--listener", f"{p}://127.0.0.1:0")]
    secure += [
        "--acls",
        "--tls-principal-rules",
        PRINCIPAL_RULES,
        *(arg for user in SUPER_USERS for arg in ("--super-user", user)),
    ]
    Acls(root.path).add([Acl(kind, "*", "LITERAL", who, "*", "ALL", "ALLOW") for kind in ACL_KINDS for who in (ALICE,)])
    tls = ["--tls-cert", str(pki.cert), "--tls-key", str(pki.key), "--tls-ca", str(pki.ca), "--tls-client-auth", "requested"]
    # Failed logins answered at once, as the oracle answers them (100 ms): the wrong passwords'
    # tests fail many from this one host, which kl would answer later and later.
    daemon = Daemon(root.path, path.parent / "serve.log", "--allow-admin", *secure, *tls, "--failed-authentication-delay", "0")
    deadline = time.monotonic() + 30
    while len(found := re.findall(r"to Kafka clients on (127\.0\.0\.1:\d+) \((\w+)\)", daemon.text())) < 1 + len(SECURE):
        assert time.monotonic() < deadline, daemon.text()
        time.sleep(0.05)
    lib = installed()
    yield kafka_endpoint(broker, lib), kl_endpoint(root, daemon, lib, {p: address for address, p in found})
    code = daemon.stop()
    root.close()
    assert code == 0, f"kl serve --kafka did not stop cleanly on SIGTERM ({code}): {daemon.text()}"


ENDPOINTS = ("kafka", "kl")
Programs = dict[str, Program]
"""One process of a client's program per endpoint, by the endpoint's name: a client's
state (kafka-go's, seen) never carries from one endpoint's scenario into the other's."""


@pytest.fixture(scope="module")
def go() -> Iterator[dict[str, Programs]]:
    """The Go clients' programs (franz-go, IBM/sarama, segmentio/kafka-go) for the module,
    or a skip saying why they cannot be built here."""
    try:
        paths = go_programs()
    except Unavailable as e:
        pytest.skip(f"Go clients: {e}")
    started = {name: {e: Program([str(path)]) for e in ENDPOINTS} for name, path in paths.items()}
    yield started
    for programs in started.values():
        for p in programs.values():
            p.close()


@pytest.fixture(scope="module")
def java() -> Iterator[Programs]:
    """The Java reference client's driver for the module (a JVM per endpoint), or a skip
    saying why it cannot be built here."""
    try:
        command = java_command()
    except Unavailable as e:
        pytest.skip(f"the Java client: {e}")
    started = {e: Program(command) for e in ENDPOINTS}
    yield started
    for p in started.values():
        p.close()


def programs(name: str, go: dict[str, Programs] | None, java: Programs | None) -> Programs:
    return java if name == "java" else go[name]  # type: ignore[index,return-value]


# ----------------------------------------------------------------- running a scenario on both


def observe(scenario: Callable[..., Any], endpoint: Endpoint, timeout: float = SCENARIO_TIMEOUT, **args: Any) -> Any:
    """What ``scenario`` observes against ``endpoint``, run in a thread of its own so that a
    client stuck past ``timeout`` fails the test (with the endpoint's log) instead of
    hanging it; whatever the scenario raised is raised here, with the log too.  An endpoint
    that died meanwhile (or before) fails it too: what a client saw of a dead server is
    no observation of the protocol."""
    what = f"{scenario.__name__}({', '.join(f'{k}={v!r}' for k, v in args.items())}) against {endpoint.name}"
    if not endpoint.alive():
        raise AssertionError(endpoint.report(f"{what}: {endpoint.name} is not running"))
    done: list[Any] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            done.append(scenario(endpoint, **args))
        except BaseException as e:  # noqa: BLE001 -- raised again in the test's thread
            failed.append(e)

    thread = threading.Thread(target=run, name=f"{scenario.__name__}@{endpoint.name}", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while thread.is_alive() and time.monotonic() < deadline:
        thread.join(0.1)
        if not endpoint.alive():  # at once, not when the client's deadlines end
            raise AssertionError(endpoint.report(f"{what}: {endpoint.name} died meanwhile"))
    if thread.is_alive():
        raise AssertionError(endpoint.report(f"{what} did not finish within {timeout:g} s"))
    if failed:
        raise AssertionError(endpoint.report(f"{what} failed: {failed[0]!r}")) from failed[0]
    return done[0]


def same(scenario: Callable[..., Any], endpoints: tuple[Endpoint, Endpoint], **args: Any) -> Any:
    """``scenario`` against Kafka, then against kl: the observations must be equal; Kafka's."""
    oracle, kl_serve = endpoints
    expected = observe(scenario, oracle, **args)
    got = observe(scenario, kl_serve, **args)
    if got != expected:
        raise Differs(f"{scenario.__name__}: kl observed\n{shown(got)}\nKafka observed\n{shown(expected)}")
    return expected


def shown(observation: Any) -> str:
    return pprint.pformat(observation, width=120)


# ----------------------------------------------------------------- clients


Record = tuple[bytes | None, bytes | None, list[tuple[str, bytes]], int]
"""(key, value, headers, timestamp): a record as sent and as read."""


def sample(count: int = 8, at: int = T0) -> list[Record]:
    """Keyless and keyed records, binary and empty values, a null value, headers (a repeated
    name, an empty value) on some, timestamps a second apart."""
    values: list[bytes | None] = [b"plain", bytes(range(256)), b"", "ünïcode ✓".encode(), None, b"x" * 3000]
    records = []
    for i in range(count):
        key = None if i % 3 == 0 else b"key-%d" % i
        headers = [("trace", b"t-%d" % i), ("trace", b"again"), ("empty", b"")] if i % 2 else []
        value = values[i % len(values)]
        records.append((key, None if value is None else value + b"#%d" % i, headers, at + 1000 * i))
    return records


def confluent_config(endpoint: Endpoint, **more: Any) -> dict[str, Any]:
    return {"bootstrap.servers": endpoint.bootstrap, "socket.timeout.ms": 10_000, "log_level": 3, **more}


def confluent_produce(endpoint: Endpoint, topic: str, records: list[Record], partition: int = 0, **config: Any) -> list[Any]:
    """Each record's delivery report through one flush: (offset, None) or (None, error name)."""
    producer = ck.Producer(confluent_config(endpoint, **{"linger.ms": 50, "message.timeout.ms": 10_000, **config}))
    reports: list[Any] = [None] * len(records)

    def delivered(i: int) -> Callable[[Any, Any], None]:
        def report(err: Any, msg: Any) -> None:
            reports[i] = (None, err.name()) if err is not None else (msg.offset(), None)

        return report

    for i, (key, value, headers, timestamp) in enumerate(records):
        producer.produce(topic, value, key, partition=partition, headers=headers or None, timestamp=timestamp,
                         on_delivery=delivered(i))  # fmt: skip
    left = producer.flush(CALL_TIMEOUT)
    assert left == 0, f"{left} records unacknowledged after {CALL_TIMEOUT:g} s"
    return reports


def read(poll: Callable[[], list[Record]], expected: int, most: int | None = None) -> list[Record]:
    """The ``expected`` records, each call of ``poll`` giving those that came meanwhile:
    waiting up to CALL_TIMEOUT for them, then QUIET seconds after the last for more, up to
    ``most`` (by default one more: a record too many shows)."""
    most = expected + 1 if most is None else most
    got: list[Record] = []
    deadline = time.monotonic() + CALL_TIMEOUT
    quiet = deadline
    while len(got) < most and time.monotonic() < min(deadline, quiet):
        got += poll()
        if len(got) >= expected:
            quiet = min(quiet, time.monotonic() + QUIET)
    return got


def confluent_poll(consumer: Any, last: list[Any] | None = None) -> Callable[[], list[Record]]:
    """A confluent-kafka consumer's next record, if one came within 0.1 s (the message kept
    in ``last``); an error raises."""

    def poll() -> list[Record]:
        msg = consumer.poll(0.1)
        if msg is None:
            return []
        if msg.error():
            raise ck.KafkaException(msg.error())
        if last is not None:
            last[:] = [msg]
        return [(msg.key(), msg.value(), list(msg.headers() or []), msg.timestamp()[1])]

    return poll


def confluent_consume(endpoint: Endpoint, topic: str, offset: int, count: int, partition: int = 0, **config: Any) -> list[Record]:
    """The ``count`` records from ``offset`` (or OFFSET_BEGINNING, ...) with assign(), as
    ``read`` gets them."""
    consumer = ck.Consumer(
        confluent_config(endpoint, **{"group.id": "oracle", "enable.auto.commit": False, "fetch.wait.max.ms": 100, **config})
    )
    try:
        consumer.assign([ck.TopicPartition(topic, partition, offset)])
        return read(confluent_poll(consumer), count)
    finally:
        consumer.close()


def kafka_python_config(endpoint: Endpoint, **more: Any) -> dict[str, Any]:
    return {"bootstrap_servers": endpoint.bootstrap, "request_timeout_ms": 10_000, **more}


def kafka_python_produce(endpoint: Endpoint, topic: str, records: list[Record], partition: int = 0, **config: Any) -> list[Any]:
    """Each record's answer: (offset, None) or (None, the exception's class name), raised by
    send (no metadata for the topic in time) or by its future."""
    producer = kafka.KafkaProducer(**kafka_python_config(endpoint, **{"linger_ms": 50, "max_block_ms": 10_000, **config}))
    try:
        futures: list[Any] = []
        for key, value, headers, timestamp in records:
            try:
                futures.append(producer.send(topic, value, key, headers or None, partition, timestamp))
            except kafka.errors.KafkaError as e:
                futures.append(e)
        producer.flush(CALL_TIMEOUT)
        reports: list[Any] = []
        for future in futures:
            try:
                if isinstance(future, Exception):
                    raise future
                reports.append((future.get(CALL_TIMEOUT).offset, None))
            except kafka.errors.KafkaError as e:
                reports.append((None, type(e).__name__))
        return reports
    finally:
        producer.close(CALL_TIMEOUT)


def kafka_python_poll(consumer: Any, max_records: int = 500) -> Callable[[], list[Record]]:
    """A kafka-python consumer's next records, those that came within 0.1 s."""

    def poll() -> list[Record]:
        batches = consumer.poll(timeout_ms=100, max_records=max_records).values()
        return [(m.key, m.value, list(m.headers or []), m.timestamp) for batch in batches for m in batch]

    return poll


def kafka_python_consume(endpoint: Endpoint, topic: str, offset: int | None, count: int, partition: int = 0,
                         **config: Any) -> list[Record]:  # fmt: skip
    """The ``count`` records from ``offset`` (None: the beginning) with assign(), as ``read``
    gets them."""
    consumer = kafka.KafkaConsumer(**kafka_python_config(endpoint, group_id=None, enable_auto_commit=False, **config))
    try:
        tp = kafka.TopicPartition(topic, partition)
        consumer.assign([tp])
        if offset is None:
            consumer.seek_to_beginning(tp)
        else:
            consumer.seek(tp, offset)
        return read(kafka_python_poll(consumer), count)
    finally:
        consumer.close()


def produce(client: str, endpoint: Endpoint, topic: str, records: list[Record], **config: Any) -> list[Any]:
    return (confluent_produce if client == "confluent" else kafka_python_produce)(endpoint, topic, records, **config)


def consume_all(client: str, endpoint: Endpoint, topic: str, count: int, partition: int = 0) -> list[Record]:
    if client == "confluent":
        return confluent_consume(endpoint, topic, ck.OFFSET_BEGINNING, count, partition)
    return kafka_python_consume(endpoint, topic, None, count, partition)


def errors_of(reports: list[Any]) -> list[str | None]:
    return [error for _, error in reports]


# ----------------------------------------------------------------- scenarios: what kl matches


def round_trip(endpoint: Endpoint, client: str, topic: str, compression: str = "none") -> Any:
    """Records of every kind, produced (in one batch, compressed or not) and read back from
    the beginning."""
    endpoint.create_topic(topic)
    records = sample()
    if client == "confluent":
        codec = {"compression.type": compression}
    else:
        codec = {"compression_type": None if compression == "none" else compression}
    reports = produce(client, endpoint, topic, records, **codec)
    return {"errors": errors_of(reports), "read": consume_all(client, endpoint, topic, len(records))}


def partitions_and_unknown_topic(endpoint: Endpoint, client: str, topic: str) -> Any:
    """A topic's partitions in Metadata, a record to each, and what an unknown topic answers."""
    endpoint.create_topic(topic, partitions=3)
    seen: dict[str, Any] = {}
    if client == "confluent":
        admin = AdminClient(confluent_config(endpoint))
        metadata = admin.list_topics(timeout=CALL_TIMEOUT)
        (broker,) = metadata.brokers.values()
        found = metadata.topics[topic]
        seen["partitions"] = sorted(found.partitions)
        seen["leaders"] = [p.leader == broker.id for p in found.partitions.values()]
        seen["replicas"] = [len(p.replicas) for p in found.partitions.values()]
        unknown = admin.list_topics("no-such-topic", timeout=CALL_TIMEOUT).topics["no-such-topic"]
        seen["unknown"] = None if unknown.error is None else unknown.error.name()
    else:
        consumer = kafka.KafkaConsumer(**kafka_python_config(endpoint, group_id=None))
        try:
            seen["partitions"] = sorted(consumer.partitions_for_topic(topic) or ())
            seen["listed"] = topic in consumer.topics()
            seen["unknown"] = sorted(consumer.partitions_for_topic("no-such-topic") or ())
        finally:
            consumer.close()
    for partition in range(3):
        record = (None, b"to %d" % partition, [], T0)
        seen[f"partition {partition}"] = errors_of(produce(client, endpoint, topic, [record], partition=partition))
        seen[f"read {partition}"] = consume_all(client, endpoint, topic, 1, partition)
    return seen


def produce_to_an_unknown_topic(endpoint: Endpoint, client: str) -> Any:
    """A record for a topic that does not exist (none is created: auto-creation is off)."""
    record = (None, b"lost", [], T0)
    if client == "confluent":
        return errors_of(confluent_produce(endpoint, "no-such-topic", [record], **{"topic.metadata.propagation.max.ms": 1000}))
    return errors_of(kafka_python_produce(endpoint, "no-such-topic", [record], max_block_ms=2_000))


def too_large(endpoint: Endpoint, client: str, topic: str) -> Any:
    """A record over the topic's limit is refused, those around it kept (Kafka's limit is on
    a batch, kl's on a message: a record of 20,000 bytes is over 10,000 in both)."""
    endpoint.create_topic(topic, max_message_bytes=10_000)
    small, big = (None, b"small", [], T0), (None, b"x" * 20_000, [], T0 + 1)
    seen = {
        "small": errors_of(produce(client, endpoint, topic, [small])),
        "big": errors_of(produce(client, endpoint, topic, [big])),
        "after": errors_of(produce(client, endpoint, topic, [small])),
    }
    seen["read"] = consume_all(client, endpoint, topic, 2)
    return seen


def fetch_out_of_range(endpoint: Endpoint, client: str, topic: str) -> Any:
    """A fetch past the end: the error without a reset policy; from the start with one."""
    endpoint.create_topic(topic)
    records = sample(3)
    produce(client, endpoint, topic, records)
    past = 1_000_000
    seen: dict[str, Any] = {}
    if client == "confluent":
        try:
            seen["no reset"] = confluent_consume(endpoint, topic, past, 1, **{"auto.offset.reset": "error"})
        except ck.KafkaException as e:
            seen["no reset"] = [e.args[0].name(), "Offset out of range" in e.args[0].str()]
        seen["earliest"] = confluent_consume(endpoint, topic, past, 3, **{"auto.offset.reset": "earliest"})
    else:
        try:
            seen["no reset"] = kafka_python_consume(endpoint, topic, past, 1, auto_offset_reset="none")
        except kafka.errors.KafkaError as e:
            seen["no reset"] = type(e).__name__
        seen["earliest"] = kafka_python_consume(endpoint, topic, past, 3, auto_offset_reset="earliest")
    return seen


def resume_in_group(
    endpoint: Endpoint, topic: str, send: Callable[[list[Record]], object], read_group: Callable[[str, int], list[Record]]
) -> Any:
    """A member reads three of five records and commits (``read_group(group, count)``);
    after it left, two more come (``send``), and the next member of the group reads from
    where the first stopped."""
    endpoint.create_topic(topic)
    records = sample(7)
    send(records[:5])
    group = f"group-{topic}"
    first = read_group(group, 3)
    send(records[5:])
    return {"first": first, "second": read_group(group, 4)}


def group_commit_and_resume(endpoint: Endpoint, client: str, topic: str) -> Any:
    """``resume_in_group`` with confluent-kafka or kafka-python."""
    return resume_in_group(
        endpoint,
        topic,
        lambda records: produce(client, endpoint, topic, records),
        lambda group, count: group_read(endpoint, client, topic, group, count),
    )


def commit_metadata(endpoint: Endpoint, client: str, topic: str) -> Any:
    """A commit from outside any member (assign()) with metadata, read back; then one whose
    metadata is longer than the broker keeps (Kafka's offset.metadata.max.bytes, 4096)."""
    endpoint.create_topic(topic)
    produce(client, endpoint, topic, sample(1))
    group, metadata = f"metadata-{topic}", "m1 ✓\n{json}"
    if client == "confluent":
        consumer = ck.Consumer(confluent_config(endpoint, **{"group.id": group, "enable.auto.commit": False}))
        try:
            consumer.commit(offsets=[ck.TopicPartition(topic, 0, 0, metadata=metadata)], asynchronous=False)
            (kept,) = consumer.committed([ck.TopicPartition(topic, 0)], timeout=CALL_TIMEOUT)
            try:
                consumer.commit(offsets=[ck.TopicPartition(topic, 0, 0, metadata="x" * 4097)], asynchronous=False)
                refused = None
            except ck.KafkaException as e:
                refused = e.args[0].name()
            (after,) = consumer.committed([ck.TopicPartition(topic, 0)], timeout=CALL_TIMEOUT)
        finally:
            consumer.close()
        return {"kept": kept.metadata, "too long": refused, "after": after.metadata}
    consumer = kafka.KafkaConsumer(**kafka_python_config(endpoint, group_id=group, enable_auto_commit=False))
    tp = kafka.TopicPartition(topic, 0)
    try:
        consumer.commit({tp: kafka.OffsetAndMetadata(0, metadata, -1)})
        kept = consumer.committed(tp, metadata=True)
        try:
            consumer.commit({tp: kafka.OffsetAndMetadata(0, "x" * 4097, -1)})
            refused = None
        except kafka.errors.KafkaError as e:
            refused = type(e).__name__
        after = consumer.committed(tp, metadata=True)
    finally:
        consumer.close()
    return {"kept": kept.metadata, "too long": refused, "after": after.metadata}


def group_read(endpoint: Endpoint, client: str, topic: str, group: str, count: int) -> list[Record]:
    """A member of ``group`` on ``topic`` reads ``count`` records (fewer if no more come
    within CALL_TIMEOUT of its start, which includes its join), commits after the last
    (synchronously), and leaves."""
    if client == "confluent":
        config = {"group.id": group, "enable.auto.commit": False, "auto.offset.reset": "earliest", "session.timeout.ms": 10_000,
                  "heartbeat.interval.ms": 1000, "fetch.wait.max.ms": 100}  # fmt: skip
        consumer = ck.Consumer(confluent_config(endpoint, **config))
        try:
            consumer.subscribe([topic])
            last: list[Any] = []
            got = read(confluent_poll(consumer, last), count, most=count)
            if last:
                consumer.commit(message=last[0], asynchronous=False)
            return got
        finally:
            consumer.close()
    consumer = kafka.KafkaConsumer(
        **kafka_python_config(
            endpoint,
            group_id=group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=10_000,
            heartbeat_interval_ms=1000,
        )  # fmt: skip
    )
    try:
        # The topic's metadata first: a member that joins without it assigns the topic no
        # partitions ("No partition metadata"), and against Kafka too it then read nothing in time.
        assert consumer.partitions_for_topic(topic)
        consumer.subscribe([topic])
        got = read(kafka_python_poll(consumer, max_records=1), count, most=count)
        if got:
            consumer.commit()  # the position: after the last record poll returned
        return got
    finally:
        consumer.close()


GET_OFFSETS = "org.apache.kafka.tools.GetOffsetShell"
"""kafka-get-offsets.sh."""
CONSUMER_GROUPS = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"
"""kafka-consumer-groups.sh."""


def kafka_tools(endpoint: Endpoint, topic: str) -> Any:
    """Kafka's own tools, run against the endpoint after a member of a group read and
    committed two of three records: kafka-get-offsets' earliest offset, kafka-consumer-groups'
    list and the columns of its description that are not offsets."""
    endpoint.create_topic(topic)
    confluent_produce(endpoint, topic, sample(3))
    group = f"group-{topic}"
    group_read(endpoint, "confluent", topic, group, 2)
    bootstrap = ("--bootstrap-server", endpoint.bootstrap)
    described = described_group(endpoint, group)
    return {
        "earliest": tool(endpoint.lib, GET_OFFSETS, *bootstrap, "--topic", topic, "--time", "-2"),
        "listed": group in tool(endpoint.lib, CONSUMER_GROUPS, *bootstrap, "--list").split(),
        "described": [{k: row[k] for k in ("GROUP", "TOPIC", "PARTITION", "CONSUMER-ID")} for row in described],
    }


def described_group(endpoint: Endpoint, group: str) -> list[dict[str, str]]:
    """kafka-consumer-groups --describe's table, a dict a row."""
    out = tool(endpoint.lib, CONSUMER_GROUPS, "--bootstrap-server", endpoint.bootstrap, "--describe", "--group", group)
    lines = [line.split() for line in out.splitlines() if line.strip()]
    header = next(line for line in lines if line[:1] == ["GROUP"])
    return [dict(zip(header, line, strict=True)) for line in lines if line[:1] == [group]]


# ----------------------------------------------------------------- scenarios: offsets


def delivery_offsets(endpoint: Endpoint, topic: str) -> Any:
    """Delivery reports of two batches of three: Kafka says 0 to 5."""
    endpoint.create_topic(topic)
    records = sample(6)
    return confluent_produce(endpoint, topic, records[:3]) + confluent_produce(endpoint, topic, records[3:])


def read_from_a_delivered_offset(endpoint: Endpoint, topic: str) -> Any:
    """A consumer assigned at the offset a delivery report gave the third record of a batch
    reads that record first."""
    endpoint.create_topic(topic)
    records = sample(4)
    ((offset, _), *_) = confluent_produce(endpoint, topic, records)[2:]
    return confluent_consume(endpoint, topic, offset, 2)


def last_message(endpoint: Endpoint, topic: str) -> Any:
    """``kcat -o -1 -e``: the last record, from the offset one before the high watermark."""
    endpoint.create_topic(topic)
    confluent_produce(endpoint, topic, sample(3))
    return confluent_consume(endpoint, topic, OFFSET_TAIL_BASE - 1, 1)


def watermarks_count_records(endpoint: Endpoint, topic: str) -> Any:
    """The high watermark minus the low one is the number of records."""
    endpoint.create_topic(topic)
    confluent_produce(endpoint, topic, sample(3))
    consumer = ck.Consumer(confluent_config(endpoint, **{"group.id": "oracle"}))
    try:
        low, high = consumer.get_watermark_offsets(ck.TopicPartition(topic, 0), timeout=CALL_TIMEOUT)
    finally:
        consumer.close()
    return {"low": low, "high": high}


def committed_offset_and_lag(endpoint: Endpoint, topic: str) -> Any:
    """After a member read and committed three of five records: the committed offset is 3,
    the lag (high watermark minus committed) 2."""
    endpoint.create_topic(topic)
    confluent_produce(endpoint, topic, sample(5))
    group = f"group-{topic}"
    group_read(endpoint, "confluent", topic, group, 3)
    consumer = ck.Consumer(confluent_config(endpoint, **{"group.id": group}))
    try:
        (tp,) = consumer.committed([ck.TopicPartition(topic, 0)], timeout=CALL_TIMEOUT)
        _, high = consumer.get_watermark_offsets(tp, timeout=CALL_TIMEOUT)
    finally:
        consumer.close()
    return {"committed": tp.offset, "lag": high - tp.offset}


def kafka_tools_offsets(endpoint: Endpoint, topic: str) -> Any:
    """kafka-get-offsets' latest offset and kafka-consumer-groups' offsets and lag after a
    member read and committed two of three records: 3; 2, 3 and 1."""
    endpoint.create_topic(topic)
    confluent_produce(endpoint, topic, sample(3))
    group = f"group-{topic}"
    group_read(endpoint, "confluent", topic, group, 2)
    (row,) = described_group(endpoint, group)
    latest = tool(endpoint.lib, GET_OFFSETS, "--bootstrap-server", endpoint.bootstrap, "--topic", topic)
    return {"latest": latest, **{k: row[k] for k in ("CURRENT-OFFSET", "LOG-END-OFFSET", "LAG")}}


# ----------------------------------------------------------------- scenarios: Kafka's console tools and offset resets


CONSOLE_PRODUCER = "org.apache.kafka.tools.ConsoleProducer"
"""kafka-console-producer.sh."""
CONSOLE_CONSUMER = "org.apache.kafka.tools.consumer.ConsoleConsumer"
"""kafka-console-consumer.sh."""


def texts(count: int, at: int = T0) -> list[Record]:
    """Records of text only (what the console tools print), keyed but every third, a
    second apart."""
    return [(None if i % 3 == 0 else b"k%d" % i, b"text %d" % i, [], at + 1000 * i) for i in range(count)]


def console_tools(endpoint: Endpoint, topic: str) -> Any:
    """Three records stamped a second apart, then five keyed lines from
    kafka-console-producer (one gzip batch): what kafka-console-consumer prints of them
    from the beginning and from an offset (with offsets and keys), and kafka-get-offsets'
    latest, earliest and by-time offsets."""
    endpoint.create_topic(topic)
    confluent_produce(endpoint, topic, texts(3))
    bootstrap = ("--bootstrap-server", endpoint.bootstrap, "--topic", topic)
    lines = "".join(f"key {i}\tline {i}\n" for i in range(5))
    tool(endpoint.lib, CONSOLE_PRODUCER, *bootstrap, "--reader-property", "parse.key=true", "--compression-codec", "gzip",
         stdin=lines)  # fmt: skip
    consume = (CONSOLE_CONSUMER, *bootstrap, "--timeout-ms", "10000")
    printed = ("--formatter-property", "print.offset=true", "--formatter-property", "print.key=true")
    offsets = (GET_OFFSETS, *bootstrap, "--time")
    return {
        "from the beginning": tool(endpoint.lib, *consume, "--from-beginning", "--max-messages", "8"),
        "from offset 2": tool(endpoint.lib, *consume, "--partition", "0", "--offset", "2", "--max-messages", "4", *printed),
        "latest": tool(endpoint.lib, *offsets, "-1"),
        "earliest": tool(endpoint.lib, *offsets, "-2"),
        "after the second": tool(endpoint.lib, *offsets, str(T0 + 1001)),
    }


TOPICS = "org.apache.kafka.tools.TopicCommand"
"""kafka-topics.sh."""


def refusal(lib: Path, main: str, *args: str) -> str:
    """The error line one of Kafka's tools prints when it exits non-zero ("" when it exits 0)."""
    try:
        tool(lib, main, *args)
    except AssertionError as e:
        return next((line for line in str(e).splitlines() if line.startswith("Error")), str(e))
    return ""


def topics_tool(endpoint: Endpoint, topic: str) -> Any:
    """kafka-topics creating a topic (and again: refused, or nothing with --if-not-exists),
    growing it (and shrinking it: refused), listing it and deleting it."""
    bootstrap = ("--bootstrap-server", endpoint.bootstrap)
    lib = endpoint.lib

    def listed() -> bool:
        return topic in tool(lib, TOPICS, *bootstrap, "--list").split()

    seen = {
        "created": tool(lib, TOPICS, *bootstrap, "--create", "--topic", topic, "--partitions", "2", "--replication-factor", "1"),
        "again": refusal(lib, TOPICS, *bootstrap, "--create", "--topic", topic, "--partitions", "2"),
        "if not exists": tool(lib, TOPICS, *bootstrap, "--create", "--if-not-exists", "--topic", topic, "--partitions", "2"),
        "grown": tool(lib, TOPICS, *bootstrap, "--alter", "--topic", topic, "--partitions", "3"),
        "shrunk": refusal(lib, TOPICS, *bootstrap, "--alter", "--topic", topic, "--partitions", "2"),
        "listed": listed(),
        "deleted": tool(lib, TOPICS, *bootstrap, "--delete", "--topic", topic),
    }
    deadline = time.monotonic() + CALL_TIMEOUT
    while listed():  # Kafka deletes a topic once its controller's change reached the broker
        assert time.monotonic() < deadline, endpoint.report(f"{topic} still listed after its deletion")
        time.sleep(0.2)
    return seen


def reset_and_resume(endpoint: Endpoint, topic: str) -> Any:
    """Ten records, the middle four in one compressed batch; a member of a group reads six
    and commits: kafka-consumer-groups' description; then each reset (the tool's table) and
    the records the group's next member reads from there."""
    endpoint.create_topic(topic)
    records = texts(11)
    confluent_produce(endpoint, topic, records[:3])
    endpoint.compressed(topic, records[3:7])
    confluent_produce(endpoint, topic, records[7:10])
    group = f"group-{topic}"
    seen: dict[str, Any] = {"read": group_read(endpoint, "confluent", topic, group, 6)}
    (row,) = described_group(endpoint, group)
    seen["described"] = {k: row[k] for k in ("CURRENT-OFFSET", "LOG-END-OFFSET", "LAG")}
    reset = (CONSUMER_GROUPS, "--bootstrap-server", endpoint.bootstrap, "--group", group, "--topic", topic, "--reset-offsets",
             "--execute")  # fmt: skip
    at = time.strftime("%Y-%m-%dT%H:%M:%S.000", time.gmtime((T0 + 4000) // 1000))
    for how, count in ((("--shift-by", "-3"), 2), (("--to-datetime", at + "Z"), 2), (("--to-earliest",), 1),
                       (("--to-offset", "5"), 3), (("--to-latest",), 1)):  # fmt: skip
        header, row = (line.split() for line in tool(endpoint.lib, *reset, *how).splitlines() if line.strip())
        table = {k: v for k, v in zip(header, row, strict=True) if k == "NEW-OFFSET"}
        assert row[:3] == [group, topic, "0"], row
        if how == ("--to-latest",):
            confluent_produce(endpoint, topic, records[10:])
        seen[" ".join(how)] = {"reset": table, "read": group_read(endpoint, "confluent", topic, group, count)}
    return seen


# ----------------------------------------------------------------- scenarios: a topic created again


def ask(endpoint: Endpoint, request: Any, version: int, **fields: Any) -> Any:
    """One request (kafka-python's class of it) of ``version`` on a connection of its own, and
    the answer as kafka-python decodes it."""
    host, _, port = endpoint.bootstrap.rpartition(":")
    message = request[version](**fields)
    message.with_header(correlation_id=1, client_id="oracle")
    response = _responses()[request.API_KEY]
    with socket.create_connection((host, int(port)), timeout=CALL_TIMEOUT) as sock:
        sock.sendall(message.encode(header=True, framed=True))
        with sock.makefile("rb") as answer:
            (size,) = struct.unpack(">i", answer.read(4))
            data = answer.read(size)
    return response.decode(data[5 if response.flexible_version_q(version) else 4 :], version=version)


def idempotent_batches(endpoint: Endpoint, topic: str) -> Any:
    """One idempotent producer's batches on the wire: a retry, a sequence that skips, a
    new epoch, the old epoch again, a sequence that goes back: (error name, base offset)
    of each answer, and the records stored."""
    endpoint.create_topic(topic)
    for _ in range(100):  # a broker just started may still be loading its coordinator (COORDINATOR_LOAD_IN_PROGRESS)
        init = ask(endpoint, InitProducerIdRequest, 4, transactional_id=None, transaction_timeout_ms=-1, producer_id=-1,
                   producer_epoch=-1)  # fmt: skip
        if init.error_code != 14:
            break
        time.sleep(0.2)
    assert init.error_code == 0 and init.producer_id >= 0

    def send(epoch: int, sequence: int, values: list[bytes]) -> tuple[str, int]:
        batch = fz.batch(fz.plain(values), len(values), producer=(init.producer_id, epoch, sequence))
        parts = [ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=batch)]
        answer = ask(endpoint, ProduceRequest, 9, transactional_id=None, acks=-1, timeout_ms=10_000,
                     topic_data=[ProduceRequest.TopicProduceData(name=topic, partition_data=parts)])  # fmt: skip
        p = answer.responses[0].partition_responses[0]
        return kafka.errors.for_code(p.error_code).__name__, p.base_offset if p.error_code == 0 else -1

    steps = {
        "first": send(0, 0, [b"a", b"b"]),
        "retried": send(0, 0, [b"a", b"b"]),
        "next": send(0, 2, [b"c"]),
        "skips ahead": send(0, 9, [b"x"]),
        "goes back": send(0, 1, [b"x"]),
        "new epoch at 0": send(1, 0, [b"d"]),
        "old epoch": send(0, 3, [b"x"]),
        "new epoch not at 0": send(2, 4, [b"x"]),
    }
    return steps, [r[1] for r in confluent_consume(endpoint, topic, 0, 4)]


def fetch_answer(endpoint: Endpoint, version: int, topic: str, topic_id: Any, offset: int, epoch: int = -1) -> Any:
    """A Fetch's answer for partition 0 from ``offset``, by name or (from version 13) by id,
    with ``epoch`` as the client's current leader epoch (-1: none)."""
    part = FetchRequest.FetchTopic.FetchPartition
    parts = [part(partition=0, fetch_offset=offset, partition_max_bytes=1 << 20, log_start_offset=-1,
                  current_leader_epoch=epoch, last_fetched_epoch=-1)]  # fmt: skip
    topics = [FetchRequest.FetchTopic(topic=topic, topic_id=topic_id, partitions=parts)]
    answer = ask(endpoint, FetchRequest, version, replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20, isolation_level=0,
                 session_id=0, session_epoch=-1, forgotten_topics_data=[], rack_id="", topics=topics)  # fmt: skip
    (found,) = answer.responses
    (p,) = found.partitions
    return {"error": p.error_code, "high": p.high_watermark, "records": bool(p.records), "id": found.topic_id == topic_id}


def list_answer(endpoint: Endpoint, topic: str, epoch: int = -1) -> Any:
    """ListOffsets v6's (error, latest offset, leader epoch) for partition 0."""
    part = ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition
    topics = [ListOffsetsRequest.ListOffsetsTopic(name=topic, partitions=[part(partition_index=0, current_leader_epoch=epoch,
                                                                               timestamp=-1)])]  # fmt: skip
    (found,) = ask(endpoint, ListOffsetsRequest, 6, replica_id=-1, isolation_level=0, topics=topics).topics[0].partitions
    return found.error_code, found.offset, found.leader_epoch


def commit_answer(endpoint: Endpoint, group: str, topic: str, offset: int) -> int:
    """The error code of an OffsetCommit v9 of ``offset`` for partition 0 from outside the group."""
    part = OffsetCommitRequest.OffsetCommitRequestTopic.OffsetCommitRequestPartition
    parts = [part(partition_index=0, committed_offset=offset, committed_leader_epoch=-1, committed_metadata="")]
    topics = [OffsetCommitRequest.OffsetCommitRequestTopic(name=topic, partitions=parts)]
    answer = ask(endpoint, OffsetCommitRequest, 9, group_id=group, generation_id_or_member_epoch=-1, member_id="",
                 group_instance_id=None, retention_time_ms=-1, topics=topics)  # fmt: skip
    return answer.topics[0].partitions[0].error_code


def offset_fetch_answer(endpoint: Endpoint, group: str, topic: str) -> Any:
    """OffsetFetch v8's (error, [(topic, [(error, committed offset)])]) for partition 0."""
    group_class = OffsetFetchRequest.OffsetFetchRequestGroup
    asked = [group_class(group_id=group, topics=[group_class.OffsetFetchRequestTopics(name=topic, partition_indexes=[0])])]
    (found,) = ask(endpoint, OffsetFetchRequest, 8, require_stable=False, groups=asked).groups
    return found.error_code, [(t.name, [(p.error_code, p.committed_offset) for p in t.partitions]) for t in found.topics]


def metadata_answer(endpoint: Endpoint, topic: str) -> Any:
    """Metadata v12's answer for ``topic``."""
    (found,) = ask(endpoint, MetadataRequest, 12, topics=[MetadataRequest.MetadataRequestTopic(name=topic)],
                   allow_auto_topic_creation=False, include_topic_authorized_operations=False).topics  # fmt: skip
    return found


def answers_about_a_topic_created_again(endpoint: Endpoint, topic: str) -> Any:
    """What Metadata, Fetch (by name and by id, with leader epochs), ListOffsets,
    OffsetCommit and OffsetFetch answer about a topic of three records, once deleted, then
    once created again with one."""
    endpoint.create_topic(topic)
    confluent_produce(endpoint, topic, texts(3))
    group = f"group-{topic}"
    deadline = time.monotonic() + CALL_TIMEOUT
    while ask(endpoint, FindCoordinatorRequest, 3, key=group, key_type=0).error_code:  # Kafka: once its offsets topic is up
        assert time.monotonic() < deadline, f"no coordinator for {group}"
        time.sleep(0.1)
    old_id = metadata_answer(endpoint, topic).topic_id

    def seen() -> dict[str, Any]:
        found = metadata_answer(endpoint, topic)
        return {
            "metadata": (found.error_code, found.topic_id == old_id, [p.leader_epoch for p in found.partitions]),
            "fetch v12": fetch_answer(endpoint, 12, topic, None, 2),
            "fetch v16 old id": fetch_answer(endpoint, 16, "", old_id, 2),
            "fetch v13 old id": fetch_answer(endpoint, 13, "", old_id, 2),
            "fetch v16 id": fetch_answer(endpoint, 16, "", found.topic_id, 0),
            "list offsets": list_answer(endpoint, topic),
            "offset fetch": offset_fetch_answer(endpoint, group, topic),
            "commit": commit_answer(endpoint, group, topic, 2),
        }

    before = {
        "fetch epoch 0": fetch_answer(endpoint, 16, "", old_id, 0, epoch=0),
        "fetch epoch 5": fetch_answer(endpoint, 16, "", old_id, 0, epoch=5),
        "list offsets epoch 0": list_answer(endpoint, topic, 0),
        "list offsets epoch 5": list_answer(endpoint, topic, 5),
        "commit": commit_answer(endpoint, group, topic, 2),
    }
    endpoint.delete(topic)
    deleted = seen()
    # Kafka deletes a group's offsets of a deleted topic a moment after its metadata no
    # longer has the topic: what OffsetFetch answers meanwhile is a race.
    del deleted["offset fetch"]
    endpoint.create_topic(topic)
    confluent_produce(endpoint, topic, texts(1))
    return {"before": before, "deleted": deleted, "created again": seen()}


NOTICE = 1.0
"""Seconds a consumer polls once its topic is deleted, and again once it is created again,
before records come into it: time to find out from its fetches and metadata.  (A client
that first fetches from the new topic after records came resumes at its old offset in it,
against Kafka too: librdkafka's rd_kafka_topic_metadata_update has a FIXME for it.)"""


def recreated(endpoint: Endpoint, client: str, how: str, topic: str) -> Any:
    """A consumer (``how``: with assign() from the beginning, or subscribed as a member of a
    group; kafka-python's with assign()) reads a topic's ten records; the topic is deleted
    and created again while it polls, and 100 records come into the new one: what it reads
    of them (and the errors it is told, by name).

    kafka-python 3.0.12 subscribed is not observed: a rebalance whose SyncGroup answer
    comes as its poll() times out is never completed by the next poll (``need_rejoin`` is
    False by then), so the member takes no assignment and stops its heartbeats until its
    session times out.  The topic created again makes it rebalance twice; under the suite's
    load it lost the race in 4 of 12 runs against Kafka 4 and 9 of 47 against kl."""
    endpoint.create_topic(topic)
    old, new = texts(10), [(None, b"new %d" % i, [], T0 + i) for i in range(100)]
    confluent_produce(endpoint, topic, old)
    errors: list[str] = []
    if client == "confluent":
        config = {"group.id": f"group-{topic}", "enable.auto.commit": False, "auto.offset.reset": "earliest",
                  "fetch.wait.max.ms": 100, "session.timeout.ms": 10_000, "heartbeat.interval.ms": 1000}  # fmt: skip
        consumer = ck.Consumer(confluent_config(endpoint, **config))

        def poll() -> list[Record]:
            msg = consumer.poll(0.1)
            if msg is None:
                return []
            if msg.error():
                errors.append(msg.error().name())
                return []
            return [(msg.key(), msg.value(), list(msg.headers() or []), msg.timestamp()[1])]

        if how == "assign":
            consumer.assign([ck.TopicPartition(topic, 0, ck.OFFSET_BEGINNING)])
        else:
            consumer.subscribe([topic])
        close = consumer.close
    else:
        kconsumer = kafka.KafkaConsumer(**kafka_python_config(endpoint, group_id=None, auto_offset_reset="earliest"))
        kconsumer.assign([kafka.TopicPartition(topic, 0)])

        def poll() -> list[Record]:
            try:
                return kafka_python_poll(kconsumer)()
            except kafka.errors.KafkaError as e:
                errors.append(type(e).__name__)
                return []

        close = kconsumer.close
    try:

        def polled() -> list[Record]:
            got: list[Record] = []
            deadline = time.monotonic() + NOTICE
            while time.monotonic() < deadline:
                got += poll()
            return got

        seen: dict[str, Any] = {"old": read(poll, 10, most=10)}
        endpoint.delete(topic)
        seen["deleted"] = polled()
        endpoint.create_topic(topic)
        seen["created"] = polled()
        confluent_produce(endpoint, topic, new)
        seen["new"] = read(poll, 100)
        seen["errors"] = errors
        return seen
    finally:
        close()


# ----------------------------------------------------------------- scenarios: the Go and Java clients
# Each drives one of the programs of tests/kafka_programs.py (a Go client's or the Java
# client's driver, one process per endpoint for the module) through requests of JSON.


def b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


def as_json(records: list[Record]) -> list[dict[str, Any]]:
    return [{"key": b64(k), "value": b64(v), "headers": [[n, b64(h)] for n, h in hs], "timestamp": t} for k, v, hs, t in records]


def as_records(read: list[dict[str, Any]]) -> list[Record]:
    """A program's records as ``sample`` makes them (offsets left out)."""
    return [(unb64(r["key"]), unb64(r["value"]), [(n, unb64(h)) for n, h in r["headers"]], r["timestamp"]) for r in read]


def offsets_of(read: list[dict[str, Any]]) -> list[int]:
    return [r["offset"] for r in read]


def program_produce(endpoint: Endpoint, client: Program, topic: str, records: list[Record], **more: Any) -> Any:
    """{"offsets", "errors"}: each record's delivery report, all sent in one flush."""
    request = {"op": "produce", "bootstrap": endpoint.bootstrap, "topic": topic, "records": as_json(records), **more}
    return client.ask({"timeout": CALL_TIMEOUT, **request})


def program_consume(endpoint: Endpoint, client: Program, topic: str, start: Any, count: int, quiet: float = QUIET) -> Any:
    """The records read with assign() from ``start`` ("earliest", {"offset": N}, {"timestamp":
    T}): ``count`` of them, then up to one more within ``quiet`` seconds."""
    request = {"op": "consume", "bootstrap": endpoint.bootstrap, "topic": topic, "start": start, "count": count, "quiet": quiet}
    return client.ask({"timeout": CALL_TIMEOUT, **request})["records"]


def program_group(endpoint: Endpoint, client: Program, topic: str, group: str, count: int) -> Any:
    """{"records", "committed"}: a member of ``group`` read ``count`` records (one poll at a
    time where the client has such a setting), committed the last one's offset + 1 and left."""
    request = {"op": "group", "bootstrap": endpoint.bootstrap, "topic": topic, "group": group, "count": count}
    return client.ask({"timeout": CALL_TIMEOUT, **request})


def client_round_trip(endpoint: Endpoint, clients: Programs, topic: str, compression: str) -> Any:
    """Records of every kind produced by the client in one batch (compressed as asked) and
    read back with assign() from the earliest offset."""
    client = clients[endpoint.name]
    endpoint.create_topic(topic)
    records = sample()
    produced = program_produce(endpoint, client, topic, records, compression=compression)
    return {"errors": produced["errors"], "read": as_records(program_consume(endpoint, client, topic, "earliest", len(records)))}


def client_group_resume(endpoint: Endpoint, clients: Programs, topic: str) -> Any:
    """``resume_in_group`` with a Go or Java client, whose member commits the third
    record's offset + 1."""
    client = clients[endpoint.name]
    return resume_in_group(
        endpoint,
        topic,
        lambda records: program_produce(endpoint, client, topic, records),
        lambda group, count: as_records(program_group(endpoint, client, topic, group, count)["records"]),
    )


def client_seek_and_time(endpoint: Endpoint, clients: Programs, topic: str) -> Any:
    """A consumer seeks to the offset another read the fifth record at, and one starts at the
    offset offsetsForTimes gives for the sixth record's timestamp (and one between the
    fifth's and the sixth's): each reads from that record on."""
    client = clients[endpoint.name]
    endpoint.create_topic(topic)
    records = sample(8)
    program_produce(endpoint, client, topic, records)
    offset = offsets_of(program_consume(endpoint, client, topic, "earliest", 8, quiet=0))[4]
    at = sample(8)[5][3]
    return {
        "seek": as_records(program_consume(endpoint, client, topic, {"offset": offset}, 4)),
        "time": as_records(program_consume(endpoint, client, topic, {"timestamp": at}, 3)),
        "between": as_records(program_consume(endpoint, client, topic, {"timestamp": at - 500}, 3)),
    }


def old_versions(endpoint: Endpoint, clients: Programs, topic: str) -> Any:
    """Requests of versions Kafka 4 no longer serves (Produce v0-2 with message sets of magic
    0 and 1, Fetch v0-3), one connection each, as kafka-go's protocol package encodes them;
    then Produce v3 on the new topic; then kafka-go's Conn, which negotiates its Produce
    version from ApiVersions, and a read of what it wrote."""
    client = clients[endpoint.name]
    endpoint.create_topic(topic)
    records = sample(2)
    seen: dict[str, Any] = {}
    for api, v in (("produce", 0), ("produce", 2), ("fetch", 0), ("fetch", 3), ("produce", 3)):
        request = {"op": "versioned", "api": api, "version": v, "bootstrap": endpoint.bootstrap, "topic": topic,
                   "records": as_json(records[:1]), "timeout": CALL_TIMEOUT}  # fmt: skip
        seen[f"{api} v{v}"] = client.ask(request)
    seen["conn"] = program_produce(endpoint, client, topic, records, conn=True)["errors"]
    seen["read"] = as_records(program_consume(endpoint, client, topic, "earliest", 3))
    return seen


def client_offsets(endpoint: Endpoint, clients: Programs, topic: str) -> Any:
    """The offsets a client reports: four records' delivery reports (one batch), the offsets
    they are read at, the earliest and latest offsets and the one for the third record's
    timestamp, and what a member that read two of them committed (offset + 1).  Kafka says
    0 to 3, 0 to 3, 0, 4 and 2, and 2."""
    client = clients[endpoint.name]
    endpoint.create_topic(topic)
    records = sample(4)
    delivered = program_produce(endpoint, client, topic, records)["offsets"]
    read = offsets_of(program_consume(endpoint, client, topic, "earliest", 4, quiet=0))
    request = {"op": "offsets", "bootstrap": endpoint.bootstrap, "topic": topic, "timestamp": records[2][3]}
    listed = client.ask({**request, "timeout": CALL_TIMEOUT})
    committed = program_group(endpoint, client, topic, f"group-{topic}", 2)["committed"]
    return {"delivered": delivered, "read": read, "listed": listed, "committed": committed}


def client_recreated(endpoint: Endpoint, clients: Programs, how: str, topic: str, progress: Path) -> Any:
    """``recreated`` with a Go or Java client (``how``: "assign" from the earliest offset, or
    "group", a member subscribed): the program's watch op reads while this thread, once the
    ten old records are read (the lines of a file in ``progress``, a directory), deletes the topic, polls NOTICE,
    creates it again, polls NOTICE and produces the 100 new records, and ends the watch once
    nothing came for 2 NOTICE; what it read is split where each step began.  What each client
    does is its own, against Kafka too, and made the same every time: sarama's retries of a
    lost partition are 0.1 s apart (its 2 s default would fetch from the new topic before or
    after its records came, by chance), so it always fetches offset 10 while the new topic is
    empty and shuts the partition down (a member joins again and reads from the start);
    kafka-go waits at offset 10 whenever it first fetches; kgo, its metadata at most 0.1 s
    old, keeps the old topic's id and reads nothing more."""
    client = clients[endpoint.name]
    endpoint.create_topic(topic)
    old, new = texts(10), [(None, b"new %d" % i, [], T0 + i) for i in range(100)]
    confluent_produce(endpoint, topic, old)
    progress = progress / endpoint.name
    progress.write_text("")
    stop = progress.with_name(progress.name + ".stop")
    stop.unlink(missing_ok=True)
    request = {"op": "watch", "bootstrap": endpoint.bootstrap, "topic": topic, "how": how, "group": f"group-{topic}",
               "count": 110, "quiet": QUIET, "seconds": 2 * CALL_TIMEOUT, "progress": str(progress),
               "timeout": 3 * CALL_TIMEOUT}  # fmt: skip
    answers: list[Any] = []

    def watch() -> None:
        try:
            answers.append(client.ask(request))
        except AssertionError as e:  # raised again in the scenario's thread
            answers.append(e)

    watching = threading.Thread(target=watch, daemon=True)
    watching.start()

    def lines() -> int:
        return progress.read_bytes().count(b"\n")

    deadline = time.monotonic() + CALL_TIMEOUT
    while lines() < 10 and watching.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    steps = [lines()]
    endpoint.delete(topic)
    time.sleep(NOTICE)
    steps.append(lines())
    endpoint.create_topic(topic)
    time.sleep(NOTICE)
    steps.append(lines())
    confluent_produce(endpoint, topic, new)
    deadline, last, since = time.monotonic() + CALL_TIMEOUT, lines(), time.monotonic()
    while watching.is_alive() and time.monotonic() < min(deadline, since + 2 * NOTICE):
        time.sleep(0.05)
        if lines() != last:
            last, since = lines(), time.monotonic()
    stop.touch()  # nothing came for 2 NOTICE: the watch ends
    watching.join(CALL_TIMEOUT + 15)
    assert answers, f"the watch of {topic} did not answer"
    if isinstance(answers[0], AssertionError):
        raise answers[0]
    read = as_records(answers[0]["records"])
    (a, b, c) = steps
    return {"old": read[:a], "deleted": read[a:b], "created": read[b:c], "new": read[c:], "errors": answers[0]["errors"]}


# ----------------------------------------------------------------- scenarios: topics' configs

CONFIGS = "org.apache.kafka.tools.ConfigCommand"
"""kafka-configs.sh."""
BROKER_DEFAULTS = ("min.insync.replicas=1", "flush.messages=9223372036854775807")
"""What Kafka's ``kafka-topics --describe`` lists of the oracle's broker settings beside a
topic's own (a cluster default and a static setting of kafka_oracle.SETTINGS): no setting
of the topic's, absent from kl's, which has no such broker settings."""


def _own_synonyms(printed: str) -> str:
    """kafka-configs' description with each config's synonyms cut to the topic's own
    (DYNAMIC_TOPIC_CONFIG): the broker's defaults behind them are the oracle's settings
    and names (log.retention.ms=-1, log.retention.hours=168), kl's its own defaults."""

    def own(found: re.Match[str]) -> str:
        kept = [s for s in found.group(1).split(", ") if s.startswith("DYNAMIC_TOPIC_CONFIG:")]
        return "synonyms={" + ", ".join(kept) + "}"

    return re.sub(r"synonyms=\{([^}]*)\}", own, printed)


def _described_topic(printed: str) -> dict[str, Any]:
    """kafka-topics --describe's first line as fields, its configs sorted, without the
    broker's (``BROKER_DEFAULTS``) and the topic id (another each creation)."""
    fields = dict(field.split(": ", 1) for field in printed.splitlines()[0].split("\t") if ": " in field)
    configs = sorted(c for c in fields.pop("Configs", "").split(",") if c and c not in BROKER_DEFAULTS)
    fields.pop("TopicId")
    return {**fields, "Configs": configs}


def configs_tool(endpoint: Endpoint, topic: str) -> Any:
    """kafka-topics creating a topic with configs (and again with --if-not-exists:
    nothing), describing it; kafka-configs describing its configs, adding two, deleting
    one, describing them after each, refusing a value out of range; and describing the
    broker's dynamic configs."""
    bootstrap = ("--bootstrap-server", endpoint.bootstrap)
    lib = endpoint.lib
    entity = (*bootstrap, "--entity-type", "topics", "--entity-name", topic)

    def configs() -> str:
        return _own_synonyms(tool(lib, CONFIGS, *entity, "--describe"))

    create = (TOPICS, *bootstrap, "--create", "--if-not-exists", "--topic", topic, "--partitions", "2",
              "--config", "retention.ms=3600000", "--config", "segment.bytes=2000000")  # fmt: skip
    seen: dict[str, Any] = {"created": tool(lib, *create), "again": tool(lib, *create)}
    seen["described"] = _described_topic(tool(lib, TOPICS, *bootstrap, "--describe", "--topic", topic))
    seen["configs"] = configs()
    seen["added"] = tool(lib, CONFIGS, *entity, "--alter", "--add-config", "retention.ms=7200000,max.message.bytes=2000000")
    seen["configs after adding"] = configs()
    seen["deleted"] = tool(lib, CONFIGS, *entity, "--alter", "--delete-config", "retention.ms")
    seen["configs after deleting"] = configs()
    try:
        tool(lib, CONFIGS, *entity, "--alter", "--add-config", "retention.ms=-5")
    except AssertionError as e:  # the cause, without the arguments (its bootstrap address) the error line repeats
        seen["out of range"] = next(line for line in str(e).splitlines() if line.startswith("Caused by: "))
    admin = AdminClient({"bootstrap.servers": endpoint.bootstrap, "socket.timeout.ms": 10_000})
    (node,) = admin.list_topics(timeout=CALL_TIMEOUT).brokers
    broker = tool(lib, CONFIGS, *bootstrap, "--describe", "--entity-type", "brokers", "--entity-name", str(node))
    seen["broker"] = broker.replace(f"broker {node} ", "broker N ")  # Kafka's is 1, kl's from its address
    return seen


def compacted(endpoint: Endpoint, topic: str) -> str:
    """kafka-configs setting cleanup.policy=compact: the cause it prints ("" when taken)."""
    endpoint.create_topic(topic)
    entity = ("--bootstrap-server", endpoint.bootstrap, "--entity-type", "topics", "--entity-name", topic)
    try:
        tool(endpoint.lib, CONFIGS, *entity, "--alter", "--add-config", "cleanup.policy=compact")
    except AssertionError as e:
        return next(line for line in str(e).splitlines() if line.startswith("Caused by: "))
    return ""


def configs_refused(endpoint: Endpoint, topic: str) -> Any:
    """DescribeConfigs and IncrementalAlterConfigs (validate-only) on the wire: the error
    codes of what both refuse, how many configs no keys and two keys (one unknown) give,
    and Kafka's words for an APPEND to a number."""
    endpoint.create_topic(topic)
    asked = DescribeConfigsRequest.DescribeConfigsResource

    def described(kind: int, name: str, keys: list[str] | None) -> tuple[int, int]:
        (result,) = ask(endpoint, DescribeConfigsRequest, 4, resources=[asked(resource_type=kind, resource_name=name,
                        configuration_keys=keys)], include_synonyms=False, include_documentation=False).results  # fmt: skip
        return result.error_code, len(result.configs)

    resource = IncrementalAlterConfigsRequest.AlterConfigsResource

    def altered(*changes: tuple[str, int, str | None]) -> tuple[int, str | None]:
        configs = [resource.AlterableConfig(name=k, config_operation=op, value=v) for k, op, v in changes]
        (answer,) = ask(endpoint, IncrementalAlterConfigsRequest, 1, validate_only=True,
                        resources=[resource(resource_type=2, resource_name=topic, configs=configs)]).responses  # fmt: skip
        return answer.error_code, answer.error_message

    everything = described(2, topic, None)
    (node,) = ask(endpoint, MetadataRequest, 12, topics=[], allow_auto_topic_creation=False,
                  include_topic_authorized_operations=False).brokers  # fmt: skip
    return {
        "no keys is all": described(2, topic, []) == everything and everything[1] > 1,
        "two keys": described(2, topic, ["retention.ms", "no.such.config"]),
        "no topic": described(2, f"{topic}-nope", None)[0],
        "bad name": described(2, "bad name!", None)[0],
        "another broker": described(4, str(node.node_id + 1), None)[0],
        "append to a number": altered(("retention.ms", 2, "5")),
        "unknown": altered(("no.such.config", 0, "5"))[0],
        "twice": altered(("retention.ms", 0, "1"), ("retention.ms", 0, "2"))[0],
        "null": altered(("retention.ms", 0, None)),
        "taken": altered(("retention.ms", 0, "7200000")),
    }


def created_with_configs(endpoint: Endpoint, topic: str) -> Any:
    """CreateTopics v7 (validate-only) with configs: each answer's error code and message
    (the code alone for an unknown config: kl names the ones it takes) and, where it is
    taken, retention.ms as the answer gives it."""
    asked = CreateTopicsRequest.CreatableTopic
    cases = {
        "twice": [("retention.ms", "1"), ("retention.ms", "2")],
        "null": [("retention.ms", None)],
        "unknown": [("no.such.config", "1")],
        "out of range": [("retention.ms", "-5")],
        "unlimited": [("retention.ms", "-1")],
    }
    seen: dict[str, Any] = {}
    for case, configs in cases.items():
        wanted = asked(name=topic, num_partitions=1, replication_factor=1, assignments=[],
                       configs=[asked.CreatableTopicConfig(name=k, value=v) for k, v in configs])  # fmt: skip
        (answer,) = ask(endpoint, CreateTopicsRequest, 7, topics=[wanted], timeout_ms=5000, validate_only=True).topics
        retention = [(c.value, c.config_source) for c in answer.configs or [] if c.name == "retention.ms"]
        message = None if case == "unknown" else answer.error_message
        seen[case] = (answer.error_code, message, retention)
    return seen


def replaced_configs(endpoint: Endpoint, topic: str) -> Any:
    """AlterConfigs (not incremental) of a topic created with retention.ms: what it leaves
    of the configs it does not name, and its answers to a key twice and a null value."""
    asked = CreateTopicsRequest.CreatableTopic
    wanted = asked(name=topic, num_partitions=1, replication_factor=1, assignments=[],
                   configs=[asked.CreatableTopicConfig(name="retention.ms", value="3600000")])  # fmt: skip
    (created,) = ask(endpoint, CreateTopicsRequest, 7, topics=[wanted], timeout_ms=5000, validate_only=False).topics
    assert created.error_code == 0, created.error_message
    resource = AlterConfigsRequest.AlterConfigsResource

    def replaced(*configs: tuple[str, str | None], validate_only: bool = False) -> int:
        changes = [resource.AlterableConfig(name=k, value=v) for k, v in configs]
        (answer,) = ask(endpoint, AlterConfigsRequest, 2, validate_only=validate_only,
                        resources=[resource(resource_type=2, resource_name=topic, configs=changes)]).responses  # fmt: skip
        return answer.error_code

    def own() -> dict[str, str]:
        """The configs set on the topic (DYNAMIC_TOPIC_CONFIG)."""
        described = DescribeConfigsRequest.DescribeConfigsResource(resource_type=2, resource_name=topic, configuration_keys=None)
        (result,) = ask(endpoint, DescribeConfigsRequest, 4, resources=[described], include_synonyms=False,
                        include_documentation=False).results  # fmt: skip
        return {c.name: c.value for c in result.configs if c.config_source == 1}

    seen: dict[str, Any] = {"created": own()}
    deadline = time.monotonic() + CALL_TIMEOUT
    while not seen["created"] and time.monotonic() < deadline:  # Kafka's broker has the topic's configs once its metadata does
        time.sleep(0.1)
        seen["created"] = own()
    seen["validated"] = (replaced(("segment.bytes", "2000000"), validate_only=True), own())
    seen["replaced"] = (replaced(("segment.bytes", "2000000")), own())
    seen["twice"] = replaced(("retention.ms", "1"), ("retention.ms", "2"))
    seen["null"] = replaced(("retention.ms", None))
    return seen


# ----------------------------------------------------------------- scenarios: kafka-delete-records and kafka-log-dirs


DELETE_RECORDS = "org.apache.kafka.tools.DeleteRecordsCommand"
"""kafka-delete-records.sh."""
LOG_DIRS = "org.apache.kafka.tools.LogDirsCommand"
"""kafka-log-dirs.sh."""


def delete_records(endpoint: Endpoint, topic: str, offsets: dict[int, int]) -> list[str]:
    """The lines kafka-delete-records prints deleting records of ``topic`` before
    ``offsets`` (partition -> offset), from its offsets file."""
    asked = {"version": 1, "partitions": [{"topic": topic, "partition": p, "offset": o} for p, o in offsets.items()]}
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(asked, f)
        f.flush()
        printed = tool(endpoint.lib, DELETE_RECORDS, "--bootstrap-server", endpoint.bootstrap, "--offset-json-file", f.name)
    return sorted(line for line in printed.splitlines() if line.startswith("partition:"))


def delete_records_tool(endpoint: Endpoint, topic: str) -> Any:
    """Six records in partition 0 of two: what kafka-delete-records prints deleting those
    before offset 4 (and none of the empty partition 1), the earliest offsets
    kafka-get-offsets gives then and the first record a consumer from the beginning
    reads; past the high watermark (refused), then up to it."""
    endpoint.create_topic(topic, partitions=2)
    confluent_produce(endpoint, topic, sample(6))
    earliest = (GET_OFFSETS, "--bootstrap-server", endpoint.bootstrap, "--topic", topic, "--time", "-2")
    seen: dict[str, Any] = {"deleted": delete_records(endpoint, topic, {0: 4, 1: -1})}
    seen["earliest"] = tool(endpoint.lib, *earliest)
    seen["first read"] = confluent_consume(endpoint, topic, ck.OFFSET_BEGINNING, 1)[0]
    seen["past the end"] = delete_records(endpoint, topic, {0: 7})
    seen["to the end"] = delete_records(endpoint, topic, {0: -1})
    return seen


def log_dirs_tool(endpoint: Endpoint, topic: str) -> Any:
    """kafka-log-dirs describing a topic of two partitions, three records in the first:
    what it prints, the broker's id, its log directory and the sizes (Kafka's record
    batches are not kl's messages) normalized to whether there are bytes."""
    endpoint.create_topic(topic, partitions=2)
    confluent_produce(endpoint, topic, sample(3))
    printed = tool(endpoint.lib, LOG_DIRS, "--bootstrap-server", endpoint.bootstrap, "--describe", "--topic-list", topic)
    *said, described = [line for line in printed.splitlines() if line.strip()]
    found = json.loads(described)
    [broker] = found["brokers"]
    [log_dir] = broker["logDirs"]
    partitions = sorted(log_dir["partitions"], key=lambda p: p["partition"])
    return {
        "said": [line.replace(str(broker["broker"]), "BROKER") for line in said],
        "version": found["version"],
        "error": log_dir["error"],
        "absolute": log_dir["logDir"].startswith("/"),
        "partitions": [{**p, "size": "bytes" if p["size"] > 0 else 0} for p in partitions],
    }


LEADER_ELECTION = "org.apache.kafka.tools.LeaderElectionCommand"
"""kafka-leader-election.sh."""
REASSIGN = "org.apache.kafka.tools.reassign.ReassignPartitionsCommand"
"""kafka-reassign-partitions.sh."""


def elections_and_reassignments(endpoint: Endpoint, topic: str) -> Any:
    """kafka-leader-election for a partition and for all of them, and
    kafka-reassign-partitions listing the reassignments under way, on a cluster of one
    replica per partition."""
    endpoint.create_topic(topic, partitions=2)
    bootstrap = ("--bootstrap-server", endpoint.bootstrap)
    election = (LEADER_ELECTION, *bootstrap, "--election-type", "PREFERRED")
    seen = {
        "one": tool(endpoint.lib, *election, "--topic", topic, "--partition", "0"),
        "all": tool(endpoint.lib, *election, "--all-topic-partitions"),
        "reassignments": tool(endpoint.lib, REASSIGN, *bootstrap, "--list"),
    }
    admin = AdminClient({"bootstrap.servers": endpoint.bootstrap})
    leader = admin.list_topics(topic, timeout=CALL_TIMEOUT).topics[topic].partitions[0].leader
    plan = {"version": 1, "partitions": [{"topic": topic, "partition": 0, "replicas": [leader]}]}
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(plan, f)
        f.flush()
        said = tool(endpoint.lib, REASSIGN, *bootstrap, "--execute", "--reassignment-json-file", f.name)
        seen["verified"] = tool(endpoint.lib, REASSIGN, *bootstrap, "--verify", "--reassignment-json-file", f.name)
    lines = said.splitlines()
    current = json.loads(next(line for line in lines if line.startswith("{")))
    for p in current["partitions"]:  # the broker's id and log directory
        p["replicas"] = ["LEADER" if r == leader else r for r in p["replicas"]]
        p["log_dirs"] = ["absolute" if d.startswith("/") else d for d in p["log_dirs"]]
    seen["to its leader"] = {"current": current, "said": [line for line in lines if not line.startswith("{")]}
    seen["verified"] = seen["verified"].replace(f"broker {leader}\n", "broker LEADER\n")
    return seen


PRODUCER_PERFORMANCE = "org.apache.kafka.tools.ProducerPerformance"
"""kafka-producer-perf-test.sh: with --transactional-id, a transactional Java producer."""


def transactional_java_producer(endpoint: Endpoint, topic: str) -> Any:
    """kafka-producer-perf-test sending one record in a transaction: how long it took and
    the exception it failed with (None: it sent it)."""
    endpoint.create_topic(topic)
    began = time.monotonic()
    said = refusal(endpoint.lib, PRODUCER_PERFORMANCE, "--topic", topic, "--num-records", "1", "--record-size", "10",
                   "--throughput", "-1", "--producer-props", f"bootstrap.servers={endpoint.bootstrap}",
                   "--transactional-id", f"tx-{topic}")  # fmt: skip
    thrown = next((line.split(":")[0].split()[-1] for line in said.splitlines() if line.startswith("Exception")), None)
    return {"seconds": time.monotonic() - began, "thrown": thrown if said else None}


# ----------------------------------------------------------------- tests


@pytest.mark.parametrize(
    ("client", "compression"),
    [("confluent", "none"), ("confluent", "gzip"), ("confluent", "zstd"), ("kafka-python", "none"), ("kafka-python", "lz4")],
)
def test_round_trip_of_values_keys_headers_and_timestamps(endpoints, client, compression) -> None:
    seen = same(round_trip, endpoints, client=client, topic=f"round-trip-{client}-{compression}", compression=compression)
    assert seen == {"errors": [None] * 8, "read": sample()}


@pytest.mark.parametrize("client", CLIENTS)
def test_partitions_in_metadata_and_an_unknown_topic(endpoints, client) -> None:
    seen = same(partitions_and_unknown_topic, endpoints, client=client, topic=f"partitions-{client}")
    assert seen["partitions"] == [0, 1, 2]
    assert seen["unknown"] == ("UNKNOWN_TOPIC_OR_PART" if client == "confluent" else [])
    assert [seen[f"read {p}"] for p in range(3)] == [[(None, b"to %d" % p, [], T0)] for p in range(3)]


@pytest.mark.parametrize("client", CLIENTS)
def test_produce_to_an_unknown_topic(endpoints, client) -> None:
    seen = same(produce_to_an_unknown_topic, endpoints, client=client)
    assert seen == ["UNKNOWN_TOPIC_OR_PART" if client == "confluent" else "KafkaTimeoutError"]


@pytest.mark.parametrize("client", CLIENTS)
def test_a_record_too_large_for_the_topic(endpoints, client) -> None:
    seen = same(too_large, endpoints, client=client, topic=f"too-large-{client}")
    assert seen["big"] == ["MSG_SIZE_TOO_LARGE" if client == "confluent" else "MessageSizeTooLargeError"]
    assert [value for _, value, _, _ in seen["read"]] == [b"small", b"small"]


@pytest.mark.parametrize("client", CLIENTS)
def test_a_fetch_out_of_range(endpoints, client) -> None:
    seen = same(fetch_out_of_range, endpoints, client=client, topic=f"out-of-range-{client}")
    assert seen == {
        "no reset": ["_AUTO_OFFSET_RESET", True] if client == "confluent" else "OffsetOutOfRangeError",
        "earliest": sample(3),
    }


@pytest.mark.parametrize("client", CLIENTS)
def test_a_group_commits_and_the_next_member_resumes(endpoints, client) -> None:
    seen = same(group_commit_and_resume, endpoints, client=client, topic=f"group-{client}")
    assert seen == {"first": sample(7)[:3], "second": sample(7)[3:]}


@pytest.mark.parametrize("client", CLIENTS)
def test_commit_metadata_is_kept_and_too_long_a_one_refused(endpoints, client) -> None:
    seen = same(commit_metadata, endpoints, client=client, topic=f"metadata-{client}")
    refused = "OFFSET_METADATA_TOO_LARGE" if client == "confluent" else "OffsetMetadataTooLargeError"
    assert seen == {"kept": "m1 ✓\n{json}", "too long": refused, "after": "m1 ✓\n{json}"}


def test_kafkas_own_tools(endpoints) -> None:
    seen = same(kafka_tools, endpoints, topic="tools")
    assert seen == {
        "earliest": "tools:0:0\n",
        "listed": True,
        "described": [{"GROUP": "group-tools", "TOPIC": "tools", "PARTITION": "0", "CONSUMER-ID": "-"}],
    }


def test_kafkas_own_tools_count_records(endpoints) -> None:
    seen = same(kafka_tools_offsets, endpoints, topic="tools-offsets")
    assert seen == {"latest": "tools-offsets:0:3\n", "CURRENT-OFFSET": "2", "LOG-END-OFFSET": "3", "LAG": "1"}


def test_delivery_reports_count_records(endpoints) -> None:
    seen = same(delivery_offsets, endpoints, topic="delivery-offsets")
    assert seen == [(i, None) for i in range(6)]


def test_a_consumer_at_a_delivered_offset_reads_that_record(endpoints) -> None:
    seen = same(read_from_a_delivered_offset, endpoints, topic="delivered-offset")
    assert [value for _, value, _, _ in seen] == [r[1] for r in sample(4)[2:]]


def test_the_last_message_is_one_before_the_high_watermark(endpoints) -> None:
    seen = same(last_message, endpoints, topic="last-message")
    assert len(seen) == 1


def test_watermarks_count_records(endpoints) -> None:
    assert same(watermarks_count_records, endpoints, topic="watermarks") == {"low": 0, "high": 3}


def test_the_committed_offset_and_the_lag_count_records(endpoints) -> None:
    assert same(committed_offset_and_lag, endpoints, topic="committed") == {"committed": 3, "lag": 2}


def test_kafkas_console_tools(endpoints) -> None:
    seen = same(console_tools, endpoints, topic="console")
    assert seen == {
        "from the beginning": "".join(f"text {i}\n" for i in range(3)) + "".join(f"line {i}\n" for i in range(5)),
        "from offset 2": "Offset:2\tk2\ttext 2\n" + "".join(f"Offset:{3 + i}\tkey {i}\tline {i}\n" for i in range(3)),
        "latest": "console:0:8\n",
        "earliest": "console:0:0\n",
        "after the second": "console:0:2\n",
    }


def test_kafka_topics_creates_grows_lists_and_deletes_a_topic(endpoints) -> None:
    seen = same(topics_tool, endpoints, topic="tool-made")
    assert seen["created"] == "Created topic tool-made.\n" and seen["listed"]
    assert "already exists" in seen["again"] and seen["if not exists"] == ""
    assert "currently has 3 partition(s); 2 would not be an increase" in seen["shrunk"]


def test_kafka_consumer_groups_resets_and_the_group_resumes_there(endpoints) -> None:
    seen = same(reset_and_resume, endpoints, topic="resets")
    records = texts(11)
    assert seen.pop("read") == records[:6]
    assert seen.pop("described") == {"CURRENT-OFFSET": "6", "LOG-END-OFFSET": "10", "LAG": "4"}
    at = {"--shift-by -3": (3, 2), "--to-datetime 2023-11-14T22:13:24.000Z": (4, 2), "--to-earliest": (0, 1),
          "--to-offset 5": (5, 3), "--to-latest": (10, 1)}  # fmt: skip
    assert seen == {how: {"reset": {"NEW-OFFSET": str(n)}, "read": records[n : n + count]} for how, (n, count) in at.items()}


@pytest.mark.parametrize(("client", "how"), [("confluent", "assign"), ("confluent", "subscribe"), ("kafka-python", "assign")])
def test_a_consumer_reads_a_topic_created_again_from_its_start(endpoints, client, how) -> None:
    seen = same(recreated, endpoints, client=client, how=how, topic=f"recreated-{client}-{how}")
    new = [(None, b"new %d" % i, [], T0 + i) for i in range(100)]
    assert seen == {"old": texts(10), "deleted": [], "created": [], "new": new, "errors": []}


def test_what_a_topic_created_again_answers(endpoints) -> None:
    seen = same(answers_about_a_topic_created_again, endpoints, topic="answers-recreated")
    fetched = {"error": 0, "high": 3, "id": True, "records": True}
    refused = {"error": UNKNOWN_LEADER_EPOCH, "high": -1, "id": True, "records": False}
    assert seen["before"] == {"fetch epoch 0": fetched, "fetch epoch 5": refused, "list offsets epoch 0": (0, 3, 0),
                              "list offsets epoch 5": (UNKNOWN_LEADER_EPOCH, -1, -1), "commit": 0}  # fmt: skip
    unknown_id = {"error": UNKNOWN_TOPIC_ID, "high": -1, "id": True, "records": False}
    assert seen["deleted"] == {
        "metadata": (UNKNOWN_TOPIC_OR_PARTITION, False, []),
        "fetch v12": {**unknown_id, "error": UNKNOWN_TOPIC_OR_PARTITION},
        "fetch v16 old id": unknown_id,
        "fetch v13 old id": unknown_id,
        "fetch v16 id": unknown_id,  # the zero id Metadata gives a topic it does not know
        "list offsets": (UNKNOWN_TOPIC_OR_PARTITION, -1, -1),
        "commit": UNKNOWN_TOPIC_OR_PARTITION,
    }
    assert seen["created again"] == {
        "metadata": (0, False, [0]),
        "fetch v12": {**unknown_id, "error": OFFSET_OUT_OF_RANGE},  # offset 2 of a topic of one record
        "fetch v16 old id": unknown_id,
        "fetch v13 old id": unknown_id,
        "fetch v16 id": {"error": 0, "high": 1, "id": True, "records": True},
        "list offsets": (0, 1, 0),
        "offset fetch": (0, [("answers-recreated", [(0, -1)])]),  # the old topic's commit is gone
        "commit": 0,
    }


GO_AND_JAVA = ("franz", "sarama", "kafkago", "java")
"""The programs of tests/kafka_programs.py: franz-go, IBM/sarama, segmentio/kafka-go, kafka-clients."""


@pytest.mark.parametrize(
    ("client", "compression"), [("franz", "none"), ("franz", "zstd"), ("sarama", "snappy"), ("kafkago", "lz4"), ("java", "gzip")]
)
def test_go_and_java_clients_round_trip_values_keys_headers_and_timestamps(endpoints, go, java, client, compression) -> None:
    seen = same(client_round_trip, endpoints, clients=programs(client, go, java), topic=f"rt-{client}-{compression}",
                compression=compression)  # fmt: skip
    assert seen == {"errors": [None] * 8, "read": sample()}


@pytest.mark.parametrize("client", GO_AND_JAVA)
def test_go_and_java_clients_resume_a_group_after_commit(endpoints, go, java, client) -> None:
    seen = same(client_group_resume, endpoints, clients=programs(client, go, java), topic=f"group-{client}-resume")
    assert seen == {"first": sample(7)[:3], "second": sample(7)[3:]}


def test_the_java_client_seeks_to_a_read_offset_and_to_offsets_for_times(endpoints, java) -> None:
    seen = same(client_seek_and_time, endpoints, clients=java, topic="java-seek")
    assert seen == {"seek": sample(8)[4:], "time": sample(8)[5:], "between": sample(8)[5:]}


def test_versions_kafka_4_no_longer_serves_close_its_connection_and_kl_serves_them(endpoints, go) -> None:
    """A stated difference (kl-serve(1)): Kafka 4 closes the connection on Produce v0-2 and
    Fetch v0-3 (KIP-896); kl answers them, each record at the next Kafka offset (produce
    v0, v2 and v3 one record each at 0, 1 and 2, Fetch's high watermark 2 between), and
    the magic 1 messages kafka-go sends in v0 and v2 read back as sent."""
    oracle, kl_serve = endpoints
    clients = go["kafkago"]
    closed = {"failed": "closed"}
    first = sample(1)
    assert observe(old_versions, oracle, clients=clients, topic="old-versions") == {
        "produce v0": closed, "produce v2": closed, "fetch v0": closed, "fetch v3": closed,
        "produce v3": {"partitions": [[0, 0, 0]]}, "conn": [None], "read": first + sample(2)}  # fmt: skip
    assert observe(old_versions, kl_serve, clients=clients, topic="old-versions") == {
        "produce v0": {"partitions": [[0, 0, 0]]}, "produce v2": {"partitions": [[0, 0, 1]]},
        "fetch v0": {"partitions": [[0, 0, 2]]}, "fetch v3": {"partitions": [[0, 0, 2]]},
        "produce v3": {"partitions": [[0, 0, 2]]}, "conn": [None], "read": first * 4}  # fmt: skip


@pytest.mark.parametrize("client", GO_AND_JAVA)
def test_go_and_java_clients_offsets_count_records(endpoints, go, java, client) -> None:
    seen = same(client_offsets, endpoints, clients=programs(client, go, java), topic=f"offsets-{client}")
    delivered = [None] * 4 if client == "kafkago" else [0, 1, 2, 3]  # kafka-go's Writer reports no offsets
    assert seen == {"delivered": delivered, "read": [0, 1, 2, 3], "listed": {"earliest": 0, "latest": 4, "timestamp": 2},
                    "committed": 2}  # fmt: skip


@pytest.mark.parametrize(
    ("client", "how"),
    [("franz", "assign"), ("franz", "group"), ("sarama", "assign"), ("sarama", "group"), ("kafkago", "assign"),
     ("kafkago", "group"), ("java", "assign"), ("java", "group")],
)  # fmt: skip
def test_go_and_java_clients_read_a_topic_created_again_from_its_start(endpoints, go, java, client, how, tmp_path) -> None:
    seen = same(client_recreated, endpoints, clients=programs(client, go, java), how=how, topic=f"recreated-{client}-{how}",
                progress=tmp_path)  # fmt: skip
    new = [(None, b"new %d" % i, [], T0 + i) for i in range(100)]
    unknown = "kafka server: Request was for a topic or partition that does not exist on this broker"
    out_of_range = (
        "kafka server: The requested offset is outside the range of offsets maintained by the server for the given "
        "topic/partition"
    )
    read, errors = {
        "java": (new, []),
        "franz": ([], []),  # kgo keeps fetching the old topic's id, and says nothing
        "sarama": (new if how == "group" else [], [unknown, out_of_range]),  # shut down at 10; a member joins again
        "kafkago": (new[10:], []),  # waits at offset 10 of the new topic for it to be there
    }[client]
    assert seen == {"old": texts(10), "deleted": [], "created": [], "new": read, "errors": errors}


# ----------------------------------------------------------------- the harness itself


def which_endpoint(endpoint: Endpoint) -> str:
    return endpoint.name


def test_an_idempotent_producers_retries_and_bad_sequences_and_epochs(endpoints) -> None:
    steps, stored = same(idempotent_batches, endpoints, topic="idempotent-wire")
    assert steps["retried"] == steps["first"] == ("NoError", 0)
    assert steps["skips ahead"][0] == steps["goes back"][0] == "OutOfOrderSequenceNumberError"
    assert steps["old epoch"][0] == "InvalidProducerEpochError"
    assert stored == [b"a", b"b", b"c", b"d"]


def test_a_difference_is_reported_with_both_observations(endpoints) -> None:
    with pytest.raises(Differs, match="^which_endpoint: kl observed\n'kl'\nKafka observed\n'kafka'$"):
        same(which_endpoint, endpoints)


# ----------------------------------------------------------------- admin clients


def admin_steps(endpoint: Endpoint, clients: Programs, topic: str) -> Any:
    """A topic's life through a program's admin op, step by step (the Java Admin client's
    in tests/kafka-java/src/AdminOps.java, franz-go's kadm in tests/goclients/franz/admin.go)."""
    request = {"op": "admin", "bootstrap": endpoint.bootstrap, "topic": topic, "seconds": CALL_TIMEOUT / 3}
    return defaults_shown(clients[endpoint.name].ask({**request, "timeout": SCENARIO_TIMEOUT - 10}))


def defaults_shown(seen: dict[str, Any]) -> dict[str, Any]:
    """An admin op's steps with max.message.bytes at its default shown as "default": kl's
    is 1 MiB of messages (its header counted), Kafka's 1 MiB batches and their overhead
    (1048588) -- a stated difference."""
    for name in ("configs", "altered"):
        found = seen[name].get("max.message.bytes") if isinstance(seen[name], dict) else None
        if isinstance(found, list) and found[1] in ("DEFAULT_CONFIG", True):  # (KafkaJS: isDefault)
            found[0] = "default"
    return seen


def kafkajs_admin(endpoint: Endpoint, modules: Path, topic: str) -> Any:
    """The same steps through KafkaJS's admin client (tests/kafkajs/driver.js, op admin)."""
    spec = {"op": "admin", "bootstrap": endpoint.bootstrap, "topic": topic, "timeout": SCENARIO_TIMEOUT - 10}
    done = kafkajs_run(modules, spec, SCENARIO_TIMEOUT - 5)
    assert done.returncode == 0, done.stderr
    return defaults_shown(json.loads(done.stdout))


def kafkajs_run(modules: Path, spec: dict[str, Any], timeout: float) -> subprocess.CompletedProcess[str]:
    """tests/kafkajs/driver.js run once on ``spec``, within ``timeout`` seconds."""
    with tempfile.NamedTemporaryFile("w", suffix=".json") as file:
        json.dump(spec, file)
        file.flush()
        env = {**os.environ, "NODE_PATH": str(modules), "NODE_NO_WARNINGS": "1"}
        return subprocess.run([str(NODE), str(KAFKAJS / "driver.js"), file.name], env=env, capture_output=True, text=True,
                              timeout=timeout)  # fmt: skip


@pytest.fixture(scope="module")
def kafkajs() -> Path:
    return kafkajs_modules()


@pytest.mark.parametrize("client", ["java", "franz"])
def test_admin_clients_manage_a_topic_as_on_kafka(endpoints, go, java, client) -> None:
    seen = same(admin_steps, endpoints, clients=programs(client, go, java), topic=f"admin-{client}")
    exists = "TopicExistsException" if client == "java" else "TOPIC_ALREADY_EXISTS"
    assert (seen.pop("create"), seen.pop("again")) == ("ok", {"error": exists})
    assert seen.pop("described") == [[0, 1, 1], [1, 1, 1]] and seen.pop("grown") == 3  # one replica, in sync
    configs, altered = seen.pop("configs"), seen.pop("altered")
    assert [configs[n][:2] for n in ("retention.ms", "max.message.bytes", "cleanup.policy")] == [
        ["3600000", "DYNAMIC_TOPIC_CONFIG"], ["default", "DEFAULT_CONFIG"], ["delete", "DEFAULT_CONFIG"]]  # fmt: skip
    assert [altered[n][:2] for n in ("retention.ms", "max.message.bytes")] == [
        ["7200000", "DYNAMIC_TOPIC_CONFIG"], ["default", "DEFAULT_CONFIG"]]  # fmt: skip
    assert seen.pop("records") == [2, 2]  # DeleteRecords' low watermark, then the log start clients see
    assert seen.pop("log dirs") == [0, 1, 2]
    assert seen.pop("groups") == {"listed": True, "offsets": {f"admin-{client}-0": 4}, "after delete-offsets": {}}
    assert seen == {"listed": True, **({"cluster": [1, True]} if client == "java" else {}), "deleted": False}


def confluent_admin(endpoint: Endpoint, topic: str) -> Any:
    """The same steps through confluent-kafka's AdminClient (librdkafka's admin API), each
    observed on its own (a step that fails: its error's name)."""
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicCollection, TopicPartition
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, NewPartitions, ResourceType

    admin = AdminClient({"bootstrap.servers": endpoint.bootstrap, "socket.timeout.ms": 10_000})
    resource = ConfigResource(ResourceType.TOPIC, topic)
    group = f"{topic}-group"
    seen: dict[str, Any] = {}

    def step(name: str, run: Callable[[], Any]) -> None:
        try:
            seen[name] = run()
        except ck.KafkaException as e:
            seen[name] = {"error": e.args[0].name()}

    def one(futures: Any) -> Any:
        (future,) = futures.values()
        return future.result(CALL_TIMEOUT)

    def configs(*names: str) -> dict[str, Any]:
        found = one(admin.describe_configs([resource]))
        return {n: [found[n].value, found[n].source == ck.admin.ConfigSource.DEFAULT_CONFIG.value] for n in names}

    def partitions() -> list[list[int]]:
        described = one(admin.describe_topics(TopicCollection([topic])))
        return [[p.id, len(p.replicas), len(p.isr)] for p in described.partitions]

    created = NewTopic(topic, 2, 1, config={"retention.ms": "3600000"})
    step("create", lambda: one(admin.create_topics([created], request_timeout=CALL_TIMEOUT)))
    step("again", lambda: one(admin.create_topics([created], request_timeout=CALL_TIMEOUT)))
    step("described", partitions)

    def grown() -> int:
        one(admin.create_partitions([NewPartitions(topic, 3)]))
        deadline = time.monotonic() + CALL_TIMEOUT  # Kafka's broker has them once its metadata does
        while len(found := partitions()) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        return len(found)

    step("grown", grown)
    step("configs", lambda: configs("retention.ms", "max.message.bytes", "cleanup.policy"))
    changes = [ConfigEntry("retention.ms", "7200000", incremental_operation=AlterConfigOpType.SET),
               ConfigEntry("max.message.bytes", "", incremental_operation=AlterConfigOpType.DELETE)]  # fmt: skip
    altered = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=changes)
    step("altered", lambda: (one(admin.incremental_alter_configs([altered])), configs("retention.ms", "max.message.bytes"))[1])
    confluent_produce(endpoint, topic, sample(6))
    step("records", lambda: one(admin.delete_records([TopicPartition(topic, 0, 2)])).low_watermark)
    step("cluster", lambda: len(admin.describe_cluster().result(CALL_TIMEOUT).nodes))
    at = [ConsumerGroupTopicPartitions(group, [TopicPartition(topic, 0, 4)])]
    step("groups", lambda: [(p.partition, p.offset) for p in one(admin.alter_consumer_group_offsets(at)).topic_partitions])
    listed = [ConsumerGroupTopicPartitions(group)]
    step("offsets", lambda: [(p.partition, p.offset) for p in one(admin.list_consumer_group_offsets(listed)).topic_partitions])
    step("deleted", lambda: one(admin.delete_topics([topic])))
    for name in ("configs", "altered"):  # max.message.bytes's default: a stated difference (defaults_shown)
        if isinstance(seen[name], dict) and seen[name].get("max.message.bytes", [None, False])[1]:
            seen[name]["max.message.bytes"][0] = "default"
    return seen


def test_confluent_kafkas_admin_client_manages_a_topic_as_on_kafka(endpoints) -> None:
    seen = same(confluent_admin, endpoints, topic="admin-confluent")
    assert seen == {
        "create": None,
        "again": {"error": "TOPIC_ALREADY_EXISTS"},
        "described": [[0, 1, 1], [1, 1, 1]],
        "grown": 3,
        "configs": {
            "retention.ms": ["3600000", False],
            "max.message.bytes": ["default", True],
            "cleanup.policy": ["delete", True],
        },
        "altered": {"retention.ms": ["7200000", False], "max.message.bytes": ["default", True]},
        "records": 2,
        "cluster": 1,
        "groups": [(0, 4)],
        "offsets": [(0, 4)],
        "deleted": None,
    }


def test_kafkajs_admin_manages_a_topic_as_on_kafka(endpoints, kafkajs) -> None:
    seen = same(kafkajs_admin, endpoints, modules=kafkajs, topic="admin-kafkajs")
    assert seen == {
        "create": True,
        "again": False,  # KafkaJS's answer for a topic that exists
        "listed": True,
        "described": [[0, 1, 1], [1, 1, 1]],
        "grown": 3,
        "configs": {"retention.ms": ["3600000", False, False], "max.message.bytes": ["default", True, False],
                    "cleanup.policy": ["delete", True, False]},
        "altered": {"retention.ms": ["7200000", False, False], "max.message.bytes": ["default", True, False]},
        "records": 2,
        "groups": {"listed": True, "offsets": [[0, 4], [1, -1], [2, -1]]},
        "deleted": False,
    }  # fmt: skip


TRANSACTIONS = "org.apache.kafka.tools.TransactionsCommand"
"""kafka-transactions.sh."""


def transactions_tool(endpoint: Endpoint, topic: str) -> Any:
    """kafka-transactions describing a partition's producers after an idempotent producer
    wrote to it (the producer id and timestamp shown as such), and listing transactions."""
    endpoint.create_topic(topic)
    confluent_produce(endpoint, topic, sample(3), **{"enable.idempotence": True})
    bootstrap = ("--bootstrap-server", endpoint.bootstrap)
    described = tool(endpoint.lib, TRANSACTIONS, *bootstrap, "describe-producers", "--topic", topic, "--partition", "0")
    head, *rows = [line.split() for line in described.splitlines() if line.strip()]
    producers = [dict(zip(head, row, strict=True)) for row in rows]
    for p in producers:
        p["ProducerId"] = "id" if int(p["ProducerId"]) >= 0 else p["ProducerId"]
        p["LastTimestamp"] = "stamped" if int(p["LastTimestamp"]) > 0 else p["LastTimestamp"]
    return {"producers": producers, "listed": tool(endpoint.lib, TRANSACTIONS, *bootstrap, "list").split()}


ACLS = "org.apache.kafka.tools.AclCommand"
"""kafka-acls.sh."""


def acls_tool(endpoint: Endpoint, topic: str) -> Any:
    """kafka-acls adding, listing and removing an ACL (as the plaintext listener's super
    user), and listing again: what it prints each time."""
    endpoint.create_topic(topic)
    bootstrap = ("--bootstrap-server", endpoint.bootstrap)
    acl = ("--allow-principal", "User:reader", "--operation", "Read", "--operation", "Describe", "--topic", topic)
    return {
        "added": tool(endpoint.lib, ACLS, *bootstrap, "--add", *acl),
        "listed": tool(endpoint.lib, ACLS, *bootstrap, "--list", "--topic", topic),
        "removed": tool(endpoint.lib, ACLS, *bootstrap, "--remove", "--force", *acl),
        "left": tool(endpoint.lib, ACLS, *bootstrap, "--list", "--topic", topic),
    }


def test_kafka_transactions_describes_a_partitions_producers_as_on_kafka(endpoints) -> None:
    seen = same(transactions_tool, endpoints, topic="producers")
    producer = {"ProducerId": "id", "ProducerEpoch": "0", "LatestCoordinatorEpoch": "-1", "LastSequence": "2",
                "LastTimestamp": "stamped", "CurrentTransactionStartOffset": "None"}  # fmt: skip
    assert seen == {"producers": [producer], "listed": ["TransactionalId", "Coordinator", "ProducerId", "TransactionState"]}


def test_kafka_acls_adds_lists_and_removes_as_on_kafka(endpoints) -> None:
    """(Without an authorizer, kl answers the ACL requests SECURITY_DISABLED, as Kafka
    does: tests/test_acls.py.)"""
    seen = same(acls_tool, endpoints, topic="acls")
    assert "(principal=User:reader, host=*, operation=READ, permissionType=ALLOW)" in seen["listed"]
    assert "operation=DESCRIBE" in seen["listed"] and "User:reader" not in seen["left"]


# ----------------------------------------------------------------- group ids and OffsetDelete (issue 36)


SPACED_GROUP = "app:v1 blue"
"""A group id Kafka takes that earlier kl versions refused: a colon and a space."""


def group_tool(endpoint: Endpoint, group: str, *args: str) -> str:
    """kafka-consumer-groups on ``group``: what it prints, or its error line when it fails."""
    try:
        return tool(endpoint.lib, CONSUMER_GROUPS, "--bootstrap-server", endpoint.bootstrap, "--group", group, *args)
    except AssertionError as e:
        return next((line for line in str(e).splitlines() if line.startswith("Error")), str(e))


def delete_offsets_tool(endpoint: Endpoint, topic: str) -> Any:
    """A group whose id has a colon and a space: kafka-console-consumer reads (and commits)
    ``topic`` in it, a confluent-kafka member ``topic``-b; kafka-consumer-groups lists and
    describes it, deletes its offsets of ``topic`` (partition 0, then all), is refused
    those of ``topic``-b while a member subscribed to it lives, and for a group unknown;
    a member of ``topic`` then reads from the earliest again."""
    other = f"{topic}-b"
    endpoint.create_topic(topic, partitions=2)
    endpoint.create_topic(other)
    confluent_produce(endpoint, topic, texts(3))
    confluent_produce(endpoint, topic, texts(2), partition=1)
    confluent_produce(endpoint, other, texts(2))
    bootstrap = ("--bootstrap-server", endpoint.bootstrap)
    console = (CONSOLE_CONSUMER, *bootstrap, "--topic", topic, "--group", SPACED_GROUP, "--from-beginning")
    seen: dict[str, Any] = {
        "console consumer": sorted(tool(endpoint.lib, *console, "--max-messages", "5", "--timeout-ms", "20000").splitlines()),
        "member": group_read(endpoint, "confluent", other, SPACED_GROUP, 2),
        "listed": SPACED_GROUP in tool(endpoint.lib, CONSUMER_GROUPS, *bootstrap, "--list").splitlines(),
        "described": group_tool(endpoint, SPACED_GROUP, "--describe"),
        "delete partition 0": group_tool(endpoint, SPACED_GROUP, "--delete-offsets", "--topic", f"{topic}:0"),
        "delete the topic": group_tool(endpoint, SPACED_GROUP, "--delete-offsets", "--topic", topic),
        "unknown group": group_tool(endpoint, "no such group", "--delete-offsets", "--topic", topic),
    }
    config = {"group.id": SPACED_GROUP, "auto.offset.reset": "earliest", "session.timeout.ms": 10_000,
              "heartbeat.interval.ms": 1000, "fetch.wait.max.ms": 100}  # fmt: skip
    consumer = ck.Consumer(confluent_config(endpoint, **config))
    try:
        consumer.subscribe([other])
        write_to = texts(1, at=T0 + 10_000)
        confluent_produce(endpoint, other, write_to)
        seen["live member reads"] = read(confluent_poll(consumer), 1, most=1)
        seen["subscribed topic"] = group_tool(endpoint, SPACED_GROUP, "--delete-offsets", "--topic", other)
    finally:
        consumer.close()
    seen["described after"] = group_tool(endpoint, SPACED_GROUP, "--describe")
    seen["read again"] = sorted(group_read(endpoint, "confluent", topic, SPACED_GROUP, 5), key=lambda r: (r[1], r[3]))
    return seen


def test_kafka_consumer_groups_deletes_offsets_of_a_group_whose_id_has_a_colon_and_a_space(endpoints) -> None:
    seen = same(delete_offsets_tool, endpoints, topic="deleted-offsets")
    assert seen["console consumer"] == sorted(["text 0", "text 1", "text 2", "text 0", "text 1"])
    assert seen["listed"] and len(seen["read again"]) == 5
    rows = [line.split()[-6:-3] for line in seen["described"].splitlines()[2:]]  # current offset, log end, lag
    assert rows == [["3", "3", "0"], ["2", "2", "0"], ["2", "2", "0"]]
    assert seen["delete partition 0"].startswith(f"Request succeeded for deleting offsets from group {SPACED_GROUP}.")
    assert seen["delete the topic"].splitlines()[-2:] == ["deleted-offsets 0          Successful     ",
                                                           "deleted-offsets 1          Successful     "]  # fmt: skip
    assert "GroupSubscribedToTopicException" in seen["subscribed topic"]
    assert seen["unknown group"].splitlines()[1] == "Error: The group id does not exist."
    assert [line.split()[-6:-3] for line in seen["described after"].splitlines()[2:]] == [["3", "3", "0"]]


def test_kafka_configs_and_kafka_topics_create_describe_alter_and_delete_configs(endpoints) -> None:
    """Stated differences, normalized in the scenario: the synonyms behind a topic's
    config (the broker's defaults: the oracle's settings, kl's defaults) and the broker
    settings kafka-topics lists beside a topic's own (``BROKER_DEFAULTS``)."""
    seen = same(configs_tool, endpoints, topic="configured")
    own = "sensitive=false synonyms={{DYNAMIC_TOPIC_CONFIG:{0}}}"
    assert seen == {
        "created": "Created topic configured.\n",
        "again": "",
        "described": {"Topic": "configured", "PartitionCount": "2", "ReplicationFactor": "1",
                      "Configs": ["retention.ms=3600000", "segment.bytes=2000000"]},
        "configs": "Dynamic configs for topic configured are:\n"
                   f"  retention.ms=3600000 {own.format('retention.ms=3600000')}\n"
                   f"  segment.bytes=2000000 {own.format('segment.bytes=2000000')}\n",
        "added": "Completed updating config for topic configured.\n",
        "configs after adding": "Dynamic configs for topic configured are:\n"
                                f"  max.message.bytes=2000000 {own.format('max.message.bytes=2000000')}\n"
                                f"  retention.ms=7200000 {own.format('retention.ms=7200000')}\n"
                                f"  segment.bytes=2000000 {own.format('segment.bytes=2000000')}\n",
        "deleted": "Completed updating config for topic configured.\n",
        "configs after deleting": "Dynamic configs for topic configured are:\n"
                                  f"  max.message.bytes=2000000 {own.format('max.message.bytes=2000000')}\n"
                                  f"  segment.bytes=2000000 {own.format('segment.bytes=2000000')}\n",
        "out of range": "Caused by: org.apache.kafka.common.errors.InvalidConfigurationException: Invalid value -5 for "
                        "configuration retention.ms: Value must be at least -1",
        "broker": "Dynamic configs for broker N are:\n",  # none: kl's are its options, Kafka's oracle's static
    }  # fmt: skip


def test_kafka_configs_setting_compaction_is_refused_by_kl_which_does_not_compact(endpoints) -> None:
    """A stated difference (kl-topics(1)): Kafka takes cleanup.policy=compact, kl refuses it."""
    oracle, kl_serve = endpoints
    assert observe(compacted, oracle, topic="compacted") == ""
    assert observe(compacted, kl_serve, topic="compacted") == (
        "Caused by: org.apache.kafka.common.errors.InvalidConfigurationException: Invalid value compact for configuration "
        "cleanup.policy: kl does not compact; only delete is taken"
    )


def test_describe_and_alter_configs_refuse_what_kafka_refuses_with_its_codes(endpoints) -> None:
    seen = same(configs_refused, endpoints, topic="configs-refused")
    assert seen == {
        "no keys is all": True,
        "two keys": (0, 1),
        "no topic": UNKNOWN_TOPIC_OR_PARTITION,
        "bad name": INVALID_TOPIC_EXCEPTION,
        "another broker": INVALID_REQUEST,
        "append to a number": (INVALID_CONFIG, "Can't APPEND to key retention.ms because its type is not LIST."),
        "unknown": INVALID_CONFIG,
        "twice": INVALID_REQUEST,
        "null": (INVALID_REQUEST, "Null value not supported for : retention.ms"),
        "taken": (0, None),
    }


def test_create_topics_takes_configs_and_refuses_them_as_kafka_does(endpoints) -> None:
    seen = same(created_with_configs, endpoints, topic="created-configured")
    assert seen == {
        "twice": (0, None, [("2", 1)]),  # the last value
        "null": (INVALID_CONFIG, "Null value not supported for topic configs: retention.ms", []),
        "unknown": (INVALID_CONFIG, None, []),
        "out of range": (INVALID_CONFIG, "Invalid value -5 for configuration retention.ms: Value must be at least -1", []),
        "unlimited": (0, None, [("-1", 1)]),
    }


def test_alter_configs_replaces_a_topics_whole_config_as_kafka_does(endpoints) -> None:
    seen = same(replaced_configs, endpoints, topic="replaced-configs")
    assert seen["created"] == {"retention.ms": "3600000"}
    assert seen["validated"] == (0, {"retention.ms": "3600000"})
    assert seen["replaced"] == (0, {"segment.bytes": "2000000"})  # retention.ms, not named, back to its default
    assert (seen["twice"], seen["null"]) == (INVALID_REQUEST, INVALID_REQUEST)


def test_kafka_delete_records_moves_the_log_start(endpoints) -> None:
    seen = same(delete_records_tool, endpoints, topic="deleted-records")
    assert seen["deleted"] == [
        "partition: deleted-records-0\tlow_watermark: 4",
        "partition: deleted-records-1\tlow_watermark: 0",
    ]
    assert seen["earliest"] == "deleted-records:0:4\ndeleted-records:1:0\n" and seen["first read"] == sample(6)[4]
    assert "OffsetOutOfRangeException" in seen["past the end"][0]
    assert seen["to the end"] == ["partition: deleted-records-0\tlow_watermark: 6"]


def test_kafka_log_dirs_describes_each_partition(endpoints) -> None:
    seen = same(log_dirs_tool, endpoints, topic="log-dirs")
    assert seen["partitions"] == [
        {"partition": "log-dirs-0", "size": "bytes", "offsetLag": 0, "isFuture": False},
        {"partition": "log-dirs-1", "size": 0, "offsetLag": 0, "isFuture": False},
    ]


def test_a_transactional_java_producer_fails_at_once_on_kl(endpoints) -> None:
    """A stated difference: kl has no transactions, and Kafka's Java client fails
    initTransactions() at once on kl's TRANSACTIONAL_ID_AUTHORIZATION_FAILED (no
    time-out: its max.block.ms is 60 s)."""
    oracle, kl_serve = endpoints
    assert observe(transactional_java_producer, oracle, topic="transactional")["thrown"] is None
    refused = observe(transactional_java_producer, kl_serve, topic="transactional")
    assert refused["thrown"] == "org.apache.kafka.common.errors.TransactionalIdAuthorizationException"
    assert refused["seconds"] < 30  # a JVM's start included


def test_kafka_leader_election_and_reassignments_find_nothing_to_do(endpoints) -> None:
    seen = same(elections_and_reassignments, endpoints, topic="elected")
    assert seen == {
        "one": "Valid replica already elected for partitions elected-0\n",
        "all": "",
        "reassignments": "No partition reassignments found.\n",
        "to its leader": seen["to its leader"],
        "verified": seen["verified"],
    }
    assert "Reassignment of partition elected-0 is completed." in seen["verified"]  # and its throttles cleared
    assert seen["to its leader"]["said"][-1] == "Successfully started partition reassignment for elected-0"


# ----------------------------------------------------------------- security: every client, every mechanism


SETTINGS = {
    "SSL": ("SSL", None, False),
    "mTLS": ("SSL", None, True),
    **{f"{p}-{m}": (p, m, False) for p in ("SASL_PLAINTEXT", "SASL_SSL") for m in MECHANISMS},
}
"""The security settings every client is taken through: (security protocol, SASL
mechanism, whether the client shows a certificate)."""
SECURED = ("confluent", "kafka-python", "aiokafka", "kcat", "kafkajs", "java", "franz")
WRONG = "not-the-password"
KCAT = shutil.which("kcat") or shutil.which("kafkacat")
KCAT_LIBRDKAFKA = kcat_librdkafka(KCAT)


@dataclass
class Secured:
    """One client's security settings against one endpoint's listener."""

    bootstrap: str
    protocol: str
    mechanism: str | None
    mtls: bool
    pki: Pki
    password: str = USERS["alice"]

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    def librdkafka(self) -> dict[str, str]:
        config = {"bootstrap.servers": self.bootstrap, "security.protocol": self.protocol}
        if self.tls:
            config["ssl.ca.location"] = str(self.pki.ca)
        if self.mtls:
            config |= {"ssl.certificate.location": str(self.pki.client_cert), "ssl.key.location": str(self.pki.client_key)}
        if self.mechanism:
            config |= {"sasl.mechanisms": self.mechanism, "sasl.username": "alice", "sasl.password": self.password}
        return config

    def kafka_python(self) -> dict[str, Any]:
        config: dict[str, Any] = {"bootstrap_servers": self.bootstrap, "security_protocol": self.protocol}
        if self.tls:
            config["ssl_cafile"] = str(self.pki.ca)
        if self.mtls:
            config |= {"ssl_certfile": str(self.pki.client_cert), "ssl_keyfile": str(self.pki.client_key)}
        if self.mechanism:
            config |= {"sasl_mechanism": self.mechanism, "sasl_plain_username": "alice", "sasl_plain_password": self.password}
        return config

    def program(self) -> dict[str, Any]:
        """The ``security`` of a request to the Java, Go and KafkaJS drivers."""
        files = {"ca": str(self.pki.ca)} if self.tls else {}
        if self.mtls:
            files |= {
                "cert": str(self.pki.client_cert),
                "key": str(self.pki.client_key),
                "keystore": str(self.pki.client_keystore),
            }
        sasl = {"mechanism": self.mechanism, "user": "alice", "password": self.password} if self.mechanism else {}
        return {"protocol": self.protocol, **files, **sasl}


def secured(endpoint: Endpoint, pki: Pki, setting: str, password: str = USERS["alice"]) -> Secured:
    protocol, mechanism, mtls = SETTINGS[setting]
    return Secured(endpoint.listeners[protocol], protocol, mechanism, mtls, pki, password)


SECURE_VALUES = [b"first", b"second", b"third"]


def secure_round_trip(endpoint: Endpoint, client: str, setting: str, pki: Pki, programs: Programs | None, modules: Path | None,
                      topic: str) -> Any:  # fmt: skip
    """Three records produced and read back from the earliest offset by ``client`` under
    ``setting``: its delivery offsets and the values read."""
    endpoint.create_topic(topic)
    return through(client, secured(endpoint, pki, setting), endpoint, programs, modules, topic)


def wrong_password(endpoint: Endpoint, client: str, setting: str, pki: Pki, programs: Programs | None, modules: Path | None,
                   topic: str) -> Any:  # fmt: skip
    """The client's produce with a wrong password: what it reports (its error's kind and
    Kafka's words, the addresses left out), nothing appended."""
    endpoint.create_topic(topic)
    return through(client, secured(endpoint, pki, setting, WRONG), endpoint, programs, modules, topic, refused=True)


def through(client: str, s: Secured, endpoint: Endpoint, programs: Programs | None, modules: Path | None, topic: str,
            refused: bool = False) -> Any:  # fmt: skip
    records = [(None, v, [], T0 + i) for i, v in enumerate(SECURE_VALUES)]
    if client == "confluent":
        return confluent_secured(endpoint, s, topic, records, refused)
    if client == "kafka-python":
        return kafka_python_secured(endpoint, s, topic, records, refused)
    if client == "aiokafka":
        return aiokafka_secured(s, topic, refused)
    if client == "kcat":
        return kcat_secured(s, topic, refused)
    if client == "kafkajs":
        return kafkajs_secured(s, topic, modules, refused)  # type: ignore[arg-type]
    assert programs is not None
    return program_secured(s, programs[endpoint.name], topic, records, refused)


def _words(text: str) -> str:
    """An error's text without what differs between two servers (addresses, ports, timings)."""
    text = re.sub(r"\d+\.\d+\.\d+\.\d+:\d+(/[\w.-]+)?|localhost:\d+|\('127\.0\.0\.1', \d+, [^)]*\)", "HOST", text)
    return re.sub(r"\(after \d+ms in state \w+\)|\d+ms", "", text).strip()


def confluent_secured(endpoint: Endpoint, s: Secured, topic: str, records: list[Record], refused: bool) -> Any:
    if refused:
        errors: list[str] = []
        config = {
            "error_cb": lambda e: errors.append(f"{e.name()}: {_words(e.str())}"),
            "message.timeout.ms": 5000,
            "log_level": 0,
        }
        producer = ck.Producer(s.librdkafka() | config)
        producer.produce(topic, b"refused")
        deadline = time.monotonic() + 10
        while not any("_AUTHENTICATION" in e for e in errors) and time.monotonic() < deadline:
            producer.flush(0.2)
        producer.flush(1)
        return sorted({e for e in errors if "_AUTHENTICATION" in e})  # (what librdkafka adds about its brokers varies)
    produced = confluent_produce(endpoint, topic, records, **s.librdkafka())
    read_back = confluent_consume(endpoint, topic, ck.OFFSET_BEGINNING, len(records), **s.librdkafka())
    return {"produced": produced, "read": [v for _, v, _, _ in read_back]}


def kafka_python_secured(endpoint: Endpoint, s: Secured, topic: str, records: list[Record], refused: bool) -> Any:
    if refused:
        try:
            kafka.KafkaProducer(**s.kafka_python(), max_block_ms=3_000, bootstrap_timeout_ms=3_000).send(topic, b"refused").get(5)
        except kafka.errors.KafkaError as e:
            return f"{type(e).__name__}: {_words(str(e))}"
        return "no error"
    produced = kafka_python_produce(endpoint, topic, records, **s.kafka_python())
    read_back = kafka_python_consume(endpoint, topic, None, len(records), **s.kafka_python())
    return {"produced": produced, "read": [v for _, v, _, _ in read_back]}


def aiokafka_secured(s: Secured, topic: str, refused: bool) -> Any:
    import asyncio

    import aiokafka
    import aiokafka.errors
    from aiokafka.helpers import create_ssl_context

    config: dict[str, Any] = {"bootstrap_servers": s.bootstrap, "security_protocol": s.protocol, "request_timeout_ms": 10_000}
    if s.tls:
        files = {"certfile": str(s.pki.client_cert), "keyfile": str(s.pki.client_key)} if s.mtls else {}
        config["ssl_context"] = create_ssl_context(cafile=str(s.pki.ca), **files)
    if s.mechanism:
        config |= {"sasl_mechanism": s.mechanism, "sasl_plain_username": "alice", "sasl_plain_password": s.password}

    async def run() -> Any:
        producer = aiokafka.AIOKafkaProducer(**config)
        try:
            await producer.start()
        except aiokafka.errors.KafkaError as e:
            await producer.stop()
            return f"{type(e).__name__}: {_words(str(e))}"
        try:
            produced = [(await producer.send_and_wait(topic, v, partition=0, timestamp_ms=T0)).offset for v in SECURE_VALUES]
        finally:
            await producer.stop()
        consumer = aiokafka.AIOKafkaConsumer(**config, enable_auto_commit=False, auto_offset_reset="earliest")
        await consumer.start()
        try:
            tp = aiokafka.TopicPartition(topic, 0)
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            got: list[bytes] = []
            deadline = time.monotonic() + CALL_TIMEOUT
            while len(got) < len(SECURE_VALUES) and time.monotonic() < deadline:
                for batch in (await consumer.getmany(timeout_ms=200)).values():
                    got += [m.value for m in batch]
            return {"produced": produced, "read": got}
        finally:
            await consumer.stop()

    outcome = asyncio.run(asyncio.wait_for(run(), CALL_TIMEOUT * 2))
    return outcome if not refused else outcome if isinstance(outcome, str) else "no error"


def kcat_secured(s: Secured, topic: str, refused: bool) -> Any:
    """The offsets and values kcat reads back, or, where its produce fails, its exit status
    and what it said of authentication."""
    if KCAT is None:
        pytest.skip("kcat is not installed (scripts/test installs it with apt)")
    options = [arg for k, v in s.librdkafka().items() if k != "bootstrap.servers" for arg in ("-X", f"{k}={v}")]
    base = [KCAT, "-b", s.bootstrap, *options, "-t", topic, "-p", "0"]
    lines = "".join(v.decode() + "\n" for v in SECURE_VALUES)
    produced = subprocess.run(
        [*base, "-P", "-X", "message.timeout.ms=5000"], input=lines, capture_output=True, text=True, timeout=30
    )
    if produced.returncode != 0 or refused:
        said = sorted({_words(line.split(": ", 1)[-1]) for line in produced.stderr.splitlines() if "uthentication" in line})
        return {"exit": produced.returncode, "said": said}
    consumed = subprocess.run(
        [*base, "-C", "-o", "beginning", "-e", "-f", "%o %s\\n"], capture_output=True, text=True, timeout=30
    )
    assert consumed.returncode == 0, consumed.stderr
    return consumed.stdout.splitlines()


def kafkajs_secured(s: Secured, topic: str, modules: Path, refused: bool) -> Any:
    """KafkaJS's produce (its offsets), then the values a group's member of it reads."""
    records = [{"key": None, "value": b64(v), "headers": [], "timestamp": T0} for v in SECURE_VALUES]
    spec = {"bootstrap": s.bootstrap, "topic": topic, "partition": 0, "timeout": 30, "security": s.program()}
    done = kafkajs_run(modules, spec | {"op": "produce", "records": records}, 45)
    if done.returncode != 0:
        return {"failed": sorted({_words(m) for m in re.findall(r"(KafkaJS\w+Error: [^\n]*)", done.stderr)})}
    produced = [json.loads(line) for line in done.stdout.splitlines()]
    env = {**os.environ, "NODE_PATH": str(modules), "NODE_NO_WARNINGS": "1"}
    with tempfile.NamedTemporaryFile("w", suffix=".json") as file:
        json.dump(spec | {"op": "group", "group": f"{topic}-group", "topics": [topic]}, file)
        file.flush()
        member = subprocess.Popen([str(NODE), str(KAFKAJS / "driver.js"), file.name], env=env, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)  # fmt: skip
        values = []
        try:
            while len(values) < len(SECURE_VALUES) and (line := member.stdout.readline()):  # type: ignore[union-attr]
                if "value" in (seen := json.loads(line)):
                    values.append(seen["value"])
        finally:
            member.communicate("close\n", timeout=30)
    return {"produced": produced, "read": values}


def program_secured(s: Secured, client: Program, topic: str, records: list[Record], refused: bool) -> Any:
    request = {"bootstrap": s.bootstrap, "topic": topic, "security": s.program(), "timeout": 3 if refused else CALL_TIMEOUT}
    produced = client.ask(request | {"op": "produce", "records": as_json(records)})
    if refused:
        return {k: _words(v) if isinstance(v, str) else v for k, v in produced.items()}
    read_back = client.ask(request | {"op": "consume", "start": "earliest", "count": len(records), "quiet": QUIET})
    return {"produced": produced, "read": [r["value"] for r in read_back["records"]]}


@pytest.fixture(scope="module")
def secured_programs() -> Iterator[dict[str, Programs]]:
    """The Java and franz-go drivers, started on first use (a skip where they cannot be built)."""
    started: dict[str, Programs] = {}
    yield started
    for programs in started.values():
        for p in programs.values():
            p.close()


def secured_client(client: str, started: dict[str, Programs]) -> tuple[Programs | None, Path | None]:
    if client == "kafkajs":
        return None, kafkajs_modules()
    if client not in ("java", "franz"):
        return None, None
    if client not in started:
        try:
            command = java_command() if client == "java" else [str(go_programs()["franz"])]
        except Unavailable as e:
            pytest.skip(f"{client}: {e}")
        started[client] = {e: Program(command) for e in ENDPOINTS}
    return started[client], None


ESSENTIAL = ("SSL", "mTLS", "SASL_PLAINTEXT-PLAIN", "SASL_PLAINTEXT-SCRAM-SHA-256", "SASL_SSL-SCRAM-SHA-512")
"""Every security protocol and every mechanism once: what each client is taken through
(confluent-kafka and the Java client, every setting)."""


@pytest.mark.parametrize(
    ("client", "setting"),
    [(client, setting) for client in SECURED for setting in SETTINGS if setting in ESSENTIAL or client in ("confluent", "java")],
)
def test_every_client_reads_and_writes_under_every_security_setting_as_on_kafka(endpoints, pki, secured_programs, client,
                                                                                 setting) -> None:  # fmt: skip
    programs, modules = secured_client(client, secured_programs)
    topic = f"secured-{client}-{setting}".lower()
    seen = same(secure_round_trip, endpoints, client=client, setting=setting, pki=pki, programs=programs, modules=modules,
                topic=topic)  # fmt: skip
    if client == "kcat" and SETTINGS[setting][1] not in (None, "PLAIN") and KCAT_LIBRDKAFKA < (2, 6, 1):
        # librdkafka before 2.6.1 sends SCRAM's client nonce twice over: Kafka 4 refuses it, and so does kl.
        assert "invalid credentials" in str(seen), seen
        return
    assert "first" in str(seen) or "Zmlyc3Q" in str(seen), seen  # the records came back ("first", or its base64)


@pytest.mark.parametrize("setting", ["SASL_PLAINTEXT-PLAIN", "SASL_SSL-SCRAM-SHA-512"])
@pytest.mark.parametrize("client", SECURED)
def test_a_wrong_password_is_refused_as_kafka_refuses_it(endpoints, pki, secured_programs, client, setting) -> None:
    programs, modules = secured_client(client, secured_programs)
    topic = f"refused-{client}-{setting}".lower()
    seen = same(
        wrong_password, endpoints, client=client, setting=setting, pki=pki, programs=programs, modules=modules, topic=topic
    )
    assert seen and "no error" not in str(seen) and "first" not in str(seen), seen  # refused, by its own account


# ----------------------------------------------------------------- ACLs: every request type, as Kafka decides


def error_codes(found: Any) -> list[int]:
    """Every error code an answer holds (``to_dict``'s), in its order."""
    if isinstance(found, dict):
        return [c for key, value in found.items() for c in ([value] if key == "error_code" else error_codes(value))]
    if isinstance(found, list):
        return [c for item in found for c in error_codes(item)]
    return []


def acl_walk(endpoint: Endpoint) -> Any:
    """bob, allowed to read and write one topic and to read one group (ACLs made through
    the endpoint's CreateAcls by a super user), sends every request type kl serves naming
    another topic, group and transactional id: each answer's error codes (or "closed"),
    and the topics his Metadata of all lists."""
    from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType
    from kafkaserver import Raw
    from kafkawalk import walk

    for topic in ("walk-open", "walk-secret"):
        endpoint.create_topic(topic)
    admin = AdminClient({"bootstrap.servers": endpoint.bootstrap, "socket.timeout.ms": 10_000})
    allow = AclPermissionType.ALLOW
    grants = [AclBinding(ResourceType.TOPIC, "walk-open", ResourcePatternType.LITERAL, "User:bob", "*", op, allow)
              for op in (AclOperation.READ, AclOperation.WRITE)]  # fmt: skip
    grants.append(
        AclBinding(ResourceType.GROUP, "walk-group", ResourcePatternType.LITERAL, "User:bob", "*", AclOperation.READ, allow)
    )
    for future in admin.create_acls(grants, request_timeout=CALL_TIMEOUT).values():
        future.result(CALL_TIMEOUT)
    time.sleep(1)  # (Kafka's broker has them once its metadata does)
    confluent_produce(endpoint, "walk-secret", sample(2))
    topic_id = uuid_of(endpoint, "walk-secret")
    host, _, port = endpoint.listeners["SASL_PLAINTEXT"].rpartition(":")
    seen: dict[str, Any] = {}
    bob = Raw((host, int(port))).login("bob", USERS["bob"])
    try:
        for request, case in walk(topic_id, topic="walk-secret", group="walk-secret-group", tx="walk-tx").items():
            if case is None:
                continue
            version, response, fields, _ = case
            try:
                seen[request.__name__] = error_codes(bob.call(request, version, response, **fields).to_dict())
            except (ConnectionError, TimeoutError) as e:
                seen[request.__name__] = type(e).__name__
                bob.close()
                bob = Raw((host, int(port))).login("bob", USERS["bob"])
        everything = dict(topics=None, allow_auto_topic_creation=False, include_cluster_authorized_operations=False,
                          include_topic_authorized_operations=True)  # fmt: skip
        listed = bob.call(MetadataRequest, 12, _responses()[MetadataRequest.API_KEY], **everything)
        seen["listed"] = [(t.name, sorted(t.authorized_operations or ())) for t in listed.topics]
    finally:
        bob.close()
    return seen


def uuid_of(endpoint: Endpoint, topic: str) -> Any:
    """The topic's id, as its Metadata v12 gives it."""
    answer = ask(endpoint, MetadataRequest, 12, topics=[MetadataRequest.MetadataRequestTopic(name=topic)],
                 allow_auto_topic_creation=False, include_cluster_authorized_operations=False,
                 include_topic_authorized_operations=False)  # fmt: skip
    return answer.topics[0].topic_id


def test_every_request_type_is_authorized_as_kafka_authorizes_it(endpoints) -> None:
    seen = same(acl_walk, endpoints)
    assert seen["listed"] == [("walk-open", [3, 4, 8])]  # READ, WRITE and the DESCRIBE they imply
    assert seen["FetchRequest"] == [0, 29]


HOSTILE_TOPICS = [
    "..", ".", "../x", "a/../../etc", "/abs", "a/b", "x\x00y", "", "%2e%2e", "\u202eevil", "line\nbreak",
    "a" * 250, "b" * 10_000,
]  # fmt: skip
"""tests/test_hostile_names.py's topic names that Kafka refuses (CON, a legal name there, is left out)."""


def hostile_topics(endpoint: Endpoint, topic: str) -> Any:
    """Each hostile name in CreateTopics v7 (validate-only), Metadata v12 (no auto-creation)
    and DescribeConfigs v4: the error codes."""
    asked = CreateTopicsRequest.CreatableTopic
    seen: dict[str, Any] = {}
    for name in HOSTILE_TOPICS:
        wanted = asked(name=name, num_partitions=1, replication_factor=1, assignments=[], configs=[])
        (created,) = ask(endpoint, CreateTopicsRequest, 7, topics=[wanted], timeout_ms=5000, validate_only=True).topics
        (listed,) = ask(endpoint, MetadataRequest, 12, topics=[MetadataRequest.MetadataRequestTopic(name=name)],
                        allow_auto_topic_creation=False, include_topic_authorized_operations=False).topics  # fmt: skip
        resource = DescribeConfigsRequest.DescribeConfigsResource(resource_type=2, resource_name=name, configuration_keys=None)
        (described,) = ask(endpoint, DescribeConfigsRequest, 4, resources=[resource], include_synonyms=False,
                           include_documentation=False).results  # fmt: skip
        seen[name[:40]] = (created.error_code, listed.error_code, described.error_code)
    return seen


def test_hostile_topic_names_get_kafkas_error_codes(endpoints) -> None:
    seen = same(hostile_topics, endpoints, topic="unused")
    assert all(code != 0 for codes in seen.values() for code in codes), seen
