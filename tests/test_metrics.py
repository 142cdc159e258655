"""``kl serve --metrics``: a real daemon under real clients (confluent-kafka's producer,
consumer and group member, kl's remote client on Kafka 0.7's port, raw connections),
scraped over HTTP while they run, its counters checked against what the clients did."""

from __future__ import annotations

import re
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from kafka.protocol.consumer.fetch import FetchRequest, FetchResponse
from kafkafuzz import fetch_fields
from kafkaserver import InThread, Raw, plain
from prometheus_client.parser import text_string_to_metric_families
from test_cli import KL

import kl
from kl.net.remote import RemoteRoot

TOPIC = "metered"
TOPIC07 = "metered-07"
"""Written and read on Kafka 0.7's port (each test counts on its own topic)."""
TOPIC_IDEMPOTENT = "metered-idempotent"
TOPIC_LAG = "metered-lag"
RECORDS = 1200
BATCHES = 4
"""The producer flushes after each of these, so each is at least one Produce request."""
VALUE = b"v" * 100
QUIET = {"log_level": 0}
"""librdkafka logs nothing (the daemon's refusals are what is tested)."""


class Daemon:
    """``kl serve`` on Kafka 0.7's port, a Kafka port, a SASL listener and the metrics
    port, all on free ports of 127.0.0.1 (only 127.0.0.1 is allowed in)."""

    def __init__(self, root: Path, log: Path):
        self.log = log
        with open(log, "wb") as err:
            self.process = subprocess.Popen(
                [
                    *KL, "--root", str(root), "serve", "--port", "0", "--kafka", "127.0.0.1:0",
                    "--listener", "SASL_PLAINTEXT://127.0.0.1:0", "--metrics", "127.0.0.1:0",
                    "--allow", "127.0.0.1/32", "--allow-produce", "--failed-authentication-delay", "0",
                ],
                stderr=err,
            )  # fmt: skip
        self.port = self._port(rb"serving \S+ on 127\.0\.0\.1:(\d+)")
        self.kafka = self._port(rb"to Kafka clients on 127\.0\.0\.1:(\d+) \(PLAINTEXT\)")
        self.sasl = self._port(rb"to Kafka clients on 127\.0\.0\.1:(\d+) \(SASL_PLAINTEXT\)")
        self.metrics = self._port(rb"serving metrics on http://127\.0\.0\.1:(\d+)/metrics")
        self.bootstrap = f"127.0.0.1:{self.kafka}"

    def _port(self, pattern: bytes) -> int:
        deadline = time.monotonic() + 30
        while not (found := re.search(pattern, self.log.read_bytes())):
            assert self.process.poll() is None and time.monotonic() < deadline, self.log.read_text()
            time.sleep(0.05)
        return int(found.group(1))

    def scrape(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Every sample, by (name, sorted labels)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics}/metrics", timeout=20) as answer:
            assert answer.status == 200
            text = answer.read().decode()
        return {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }

    def value(self, name: str, **labels: str) -> float:
        """The sum of the samples of ``name`` that have these labels (whatever their others)."""
        return total(self.scrape(), name, **labels)

    def stop(self) -> None:
        self.process.terminate()
        assert self.process.wait(30) == 0, self.log.read_text()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    work = tmp_path_factory.mktemp("metrics")
    root = kl.Root(work / "root")
    root.create_topic(TOPIC, kl.TopicConfig(partitions=2))
    root.create_topic(TOPIC07)
    root.create_topic(TOPIC_IDEMPOTENT)
    root.create_topic(TOPIC_LAG)
    root.close()
    running = Daemon(work / "root", work / "log")
    yield running
    running.stop()
    with pytest.raises(ConnectionRefusedError):  # the metrics port went with the daemon
        socket.create_connection(("127.0.0.1", running.metrics), timeout=20)


def total(scraped: dict, name: str, **labels: str) -> float:
    wanted = set(labels.items())
    return sum(value for (found, their), value in scraped.items() if found == name and wanted <= set(their))


def until(done: Callable[[], bool], what: str) -> None:
    """Wait for the daemon to catch up with what a client did (it counts when it sees it)."""
    deadline = time.monotonic() + 20
    while not done():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def from_127_0_0_2(port: int) -> socket.socket:
    """A connection from 127.0.0.2, outside the daemon's --allow."""
    sock = socket.socket()
    sock.bind(("127.0.0.2", 0))
    sock.connect(("127.0.0.1", port))
    return sock


def test_counters_match_what_the_clients_did(daemon):
    scrapes: list[dict] = []
    stop = threading.Event()

    def scrape_under_load() -> None:
        while not stop.is_set():
            scrapes.append(daemon.scrape())

    scraper = threading.Thread(target=scrape_under_load)
    scraper.start()
    try:
        producer = Producer({"bootstrap.servers": daemon.bootstrap, "linger.ms": 1, **QUIET})
        for _ in range(BATCHES):
            for n in range(RECORDS // BATCHES):
                producer.produce(TOPIC, VALUE, partition=n % 2)
            assert producer.flush(30) == 0
        consumer = Consumer({"bootstrap.servers": daemon.bootstrap, "group.id": "reader", "enable.auto.commit": False, **QUIET})
        consumer.assign([TopicPartition(TOPIC, p, 0) for p in (0, 1)])
        read = 0
        deadline = time.monotonic() + 30
        while read < RECORDS and time.monotonic() < deadline:
            read += sum(1 for m in consumer.consume(1000, timeout=1) if m.error() is None)
        consumer.close()
        assert read == RECORDS
    finally:
        stop.set()
        scraper.join()
    assert len(scrapes) >= 2
    produced = ("kafka_server_brokertopicmetrics_messagesin_total", (("topic", TOPIC),))
    assert [s.get(produced, 0) for s in scrapes] == sorted(s.get(produced, 0) for s in scrapes)  # counters only grow
    after = daemon.scrape()
    assert after[produced] == RECORDS
    assert after[("kafka_server_brokertopicmetrics_bytesin_total", (("topic", TOPIC),))] >= RECORDS * len(VALUE)
    assert after[("kafka_server_brokertopicmetrics_bytesout_total", (("topic", TOPIC),))] >= RECORDS * len(VALUE)
    produce_requests = total(after, "kafka_network_requestmetrics_requests_total", request="Produce")
    assert produce_requests >= BATCHES
    assert total(after, "kafka_network_requestmetrics_errors_total", error="NONE", request="Produce") >= BATCHES
    timed = total(after, "kafka_network_requestmetrics_totaltimems_count", request="Produce")
    assert (
        timed == produce_requests == total(after, "kafka_network_requestmetrics_totaltimems_bucket", le="+Inf", request="Produce")
    )
    incoming = total(after, "kafka_server_socket_server_metrics_incoming_byte_total", listener="PLAINTEXT")
    outgoing = total(after, "kafka_server_socket_server_metrics_outgoing_byte_total", listener="PLAINTEXT")
    assert incoming >= RECORDS * len(VALUE) and outgoing >= RECORDS * len(VALUE)


def test_a_fetch_of_an_unknown_topic_counts_its_error_by_name(daemon):
    before = daemon.value("kafka_network_requestmetrics_errors_total", request="Fetch", error="UNKNOWN_TOPIC_OR_PARTITION")
    client = Raw(("127.0.0.1", daemon.kafka))
    (answer,) = client.call(FetchRequest, 12, FetchResponse, **fetch_fields("nowhere", 0)).responses[0].partitions
    client.close()
    assert answer.error_code == 3
    after = daemon.scrape()
    assert (
        total(after, "kafka_network_requestmetrics_errors_total", error="UNKNOWN_TOPIC_OR_PARTITION", request="Fetch")
        == before + 1
    )
    assert total(after, "kafka_network_requestmetrics_requests_total", request="Fetch", version="12") >= 1


def test_a_group_member_shows_its_group_stable_and_its_rebalance(daemon):
    member = Consumer({"bootstrap.servers": daemon.bootstrap, "group.id": "metered-group", **QUIET})
    assigned = threading.Event()
    member.subscribe([TOPIC], on_assign=lambda consumer, partitions: assigned.set())
    try:
        deadline = time.monotonic() + 30
        while not assigned.is_set() and time.monotonic() < deadline:
            member.poll(0.2)
        assert assigned.is_set()
        until(lambda: daemon.value("kafka_server_group_coordinator_metrics_classic_group_count", state="stable") == 1, "stable")
        assert daemon.value("kafka_server_group_coordinator_metrics_classic_group_rebalance_total") >= 1
        assert daemon.value("kafka_network_requestmetrics_requests_total", request="SyncGroup") >= 1
    finally:
        member.close()
    until(lambda: daemon.value("kafka_server_group_coordinator_metrics_classic_group_count", state="stable") == 0, "left")


def test_an_idempotent_producer_is_a_producer_id_tracked(daemon):
    before = daemon.value("kafka_server_replicamanager_produceridcount")
    producer = Producer({"bootstrap.servers": daemon.bootstrap, "enable.idempotence": True, **QUIET})
    for _ in range(10):
        producer.produce(TOPIC_IDEMPOTENT, VALUE, partition=0)
    assert producer.flush(30) == 0
    assert daemon.value("kafka_server_replicamanager_produceridcount") == before + 1
    assert daemon.value("kafka_server_brokertopicmetrics_messagesin_total", topic=TOPIC_IDEMPOTENT) == 10
    assert daemon.value("kafka_network_requestmetrics_requests_total", request="InitProducerId") >= 1


def test_kafka07_port_counts_kl_clients_requests_and_its_connections(daemon):
    before = daemon.value("kl_kafka07_requests_total", request="HELLO")
    remote = RemoteRoot(f"127.0.0.1:{daemon.port}")
    assert remote.topics() == sorted([TOPIC, TOPIC07, TOPIC_IDEMPOTENT, TOPIC_LAG])
    producer = kl.RemoteProducer(remote)  # (on remote's connection)
    producer.send_batch(TOPIC07, [VALUE] * 10, partition=0)
    producer.flush()
    consumer = kl.RemoteConsumer(RemoteRoot(f"127.0.0.1:{daemon.port}"))
    assert len(list(consumer.fetch(TOPIC07, 0, 0, 1 << 20))) == 10
    with pytest.raises(kl.TopicNotFound):
        remote.describe("nowhere")
    until(lambda: daemon.value("kafka_server_socket_server_metrics_connection_count", listener="KAFKA07") == 2, "two open")
    after = daemon.scrape()
    assert total(after, "kl_kafka07_requests_total", request="HELLO") == before + 2
    assert total(after, "kl_kafka07_requests_total", request="TOPICS") >= 1
    assert total(after, "kl_kafka07_errors_total", error="TOPIC_NOT_FOUND", request="DESCRIBE") == 1
    assert total(after, "kl_kafka07_totaltimems_count", request="TOPICS") >= 1
    assert total(after, "kafka_server_brokertopicmetrics_messagesin_total", topic=TOPIC07) == 10
    assert total(after, "kafka_server_brokertopicmetrics_bytesin_total", topic=TOPIC07) >= 10 * len(VALUE)
    assert total(after, "kafka_server_brokertopicmetrics_bytesout_total", topic=TOPIC07) >= 10 * len(VALUE)
    assert total(after, "kafka_server_socket_server_metrics_incoming_byte_total", listener="KAFKA07") > 10 * len(VALUE)
    assert total(after, "kafka_server_socket_server_metrics_outgoing_byte_total", listener="KAFKA07") > 10 * len(VALUE)
    producer.close()
    remote.close()
    consumer.close()
    until(lambda: daemon.value("kafka_server_socket_server_metrics_connection_count", listener="KAFKA07") == 0, "closed")
    after = daemon.scrape()
    created = total(after, "kafka_server_socket_server_metrics_connection_creation_total", listener="KAFKA07")
    assert created == total(after, "kafka_server_socket_server_metrics_connection_close_total", listener="KAFKA07") >= 2


def test_refused_connections_are_counted_by_reason(daemon):
    before = daemon.value("kl_connections_refused_total", listener="PLAINTEXT", reason="allow_list")
    sock = from_127_0_0_2(daemon.kafka)
    assert sock.recv(1) == b""  # closed unanswered
    sock.close()
    sock = from_127_0_0_2(daemon.metrics)
    sock.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
    assert sock.recv(1) == b""
    sock.close()
    refused = {"listener": "PLAINTEXT", "reason": "allow_list"}
    until(lambda: daemon.value("kl_connections_refused_total", **refused) == before + 1, "counted")
    assert daemon.value("kl_connections_refused_total", listener="METRICS", reason="allow_list") == 1


def test_a_failed_sasl_login_is_counted_by_listener_and_mechanism(daemon):
    client = Raw(("127.0.0.1", daemon.sasl))
    assert client.handshake("PLAIN").error_code == 0
    assert client.authenticate(plain("nobody", "wrong")).error_code == 58  # SASL_AUTHENTICATION_FAILED
    assert client.closed()
    client.close()
    labels = {"listener": "SASL_PLAINTEXT", "mechanism": "PLAIN"}
    assert daemon.value("kafka_server_socket_server_metrics_failed_authentication_total", **labels) == 1
    assert daemon.value("kafka_server_socket_server_metrics_successful_authentication_total", **labels) == 0


def test_garbage_on_the_metrics_port_hurts_nothing(daemon):
    before = daemon.value("kafka_server_socket_server_metrics_connection_creation_total", listener="PLAINTEXT")
    for garbage in (b"\x16\x03\x01\x00\xff" + bytes(range(256)), b"NOT HTTP AT ALL\r\n\r\n", b"GET /metrics HTTP/1.1\r\nHost"):
        sock = socket.create_connection(("127.0.0.1", daemon.metrics), timeout=20)
        sock.sendall(garbage)
        sock.shutdown(socket.SHUT_WR)
        while sock.recv(4096):
            pass
        sock.close()
    assert daemon.process.poll() is None
    assert daemon.value("kafka_server_socket_server_metrics_connection_creation_total", listener="PLAINTEXT") == before
    client = Raw(("127.0.0.1", daemon.kafka))
    assert client.call(FetchRequest, 12, FetchResponse, **fetch_fields(TOPIC, 0)).responses[0].partitions[0].error_code == 0
    client.close()


def test_a_metrics_port_elsewhere_than_loopback_needs_allow(tmp_path):
    root = kl.Root(tmp_path / "root")
    root.close()
    done = subprocess.run(
        [*KL, "--root", str(tmp_path / "root"), "serve", "--kafka", "127.0.0.1:0", "--metrics", "0.0.0.0:0"],
        capture_output=True,
        timeout=30,
    )
    assert done.returncode == 1
    assert done.stderr.decode().splitlines() == ["Error: binding to 0.0.0.0 needs --allow CIDR naming who may connect"]


def test_a_metrics_address_that_is_not_one_is_a_usage_error(tmp_path):
    done = subprocess.run([*KL, "--root", str(tmp_path), "serve", "--metrics", "localhost"], capture_output=True, timeout=30)
    assert done.returncode == 2 and b"is not [HOST:]PORT" in done.stderr


def test_acl_denials_are_counted_by_operation_and_resource_type(root, topic):
    served = InThread(root, acls=True)  # no ACLs: User:ANONYMOUS may do nothing
    try:
        client = Raw(served.address)
        (answer,) = client.call(FetchRequest, 12, FetchResponse, **fetch_fields(topic, 0)).responses[0].partitions
        client.close()
        assert answer.error_code == 29  # TOPIC_AUTHORIZATION_FAILED
        registry = served.server.metrics.registry
        assert registry.get_sample_value("kl_authorization_denied_total", {"operation": "READ", "resource_type": "TOPIC"}) == 1
        errors = {"request": "Fetch", "error": "TOPIC_AUTHORIZATION_FAILED"}
        assert registry.get_sample_value("kafka_network_requestmetrics_errors_total", errors) == 1
    finally:
        served.stop()


def test_a_scrape_gives_the_log_ends_and_a_kafka_groups_lag(daemon):
    topic = TOPIC_LAG
    delivered = []
    producer = Producer({"bootstrap.servers": daemon.bootstrap, **QUIET})
    for _ in range(10):
        producer.produce(topic, VALUE, partition=0, on_delivery=lambda err, msg: delivered.append(err))
    assert producer.flush(30) == 0
    assert delivered == [None] * 10
    consumer = Consumer({"bootstrap.servers": daemon.bootstrap, "group.id": "lagging", **QUIET})
    consumer.commit(offsets=[TopicPartition(topic, 0, 4)], asynchronous=False)
    consumer.close()
    at = (("partition", "0"), ("topic", topic))
    group_at = (("consumergroup", "lagging"), *at)
    scraped = daemon.scrape()
    assert scraped[("kafka_topic_partition_current_offset", at)] == 10
    assert scraped[("kafka_topic_partition_oldest_offset", at)] == 0
    end = scraped[("kl_topic_partition_log_end_offset_bytes", at)]
    assert end == scraped[("kl_topic_partition_size_bytes", at)] > 10 * len(VALUE)
    assert scraped[("kafka_consumergroup_current_offset", group_at)] == 4
    assert scraped[("kafka_consumergroup_lag", group_at)] == 6
    assert scraped[("kafka_consumergroup_lag_sum", (("consumergroup", "lagging"), ("topic", topic)))] == 6
    assert scraped[("kl_stats_partitions_skipped", (("reason", "unreadable"),))] == 0


def test_kl_serve_1_lists_every_metric_a_scrape_gives(daemon):
    with urllib.request.urlopen(f"http://127.0.0.1:{daemon.metrics}/metrics", timeout=20) as answer:
        families = list(text_string_to_metric_families(answer.read().decode()))
    scraped = {f.name + ("_total" if f.type == "counter" else "") for f in families}
    page = (Path(__file__).parent.parent / "man" / "kl-serve.1").read_text()
    listed = page.split("Every metric: its name")[1].split("\n.SS ")[0]
    assert scraped == set(re.findall(r"^\.B (k\w+)$", listed, re.M))
