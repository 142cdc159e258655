"""Idempotence held by the log: an idempotent kafka-python producer whose daemon is
killed and started again, and an idempotent librdkafka producer (confluent-kafka)
bootstrapped with two daemons over one root of which one stops (SIGSTOP) and wakes with
requests queued, store each record once and in order; and both daemons name the same
leader."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from kafka import KafkaProducer

import kl

from kafka_clients import Daemon

RECORDS = 3000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stored(root: kl.Root, topic: str) -> list[bytes]:
    log = kl.Root(root.path).log(topic, 0)
    return [msg.value for msg in log.messages(log.log_start_offset, log.log_end_offset)]


def produce(bootstrap: str, topic: str, during) -> list[str]:
    """Send ``RECORDS`` numbered records idempotently, calling ``during`` from a thread once
    a third are acknowledged; the delivery errors."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "linger.ms": 2,
            "batch.num.messages": 50,
            "message.timeout.ms": 120_000,
            "reconnect.backoff.max.ms": 500,
            "topic.metadata.refresh.interval.ms": 1000,
        }
    )
    errors: list[str] = []
    acked = [0]
    started: list[threading.Thread] = []

    def delivered(err, msg) -> None:
        if err is not None:
            errors.append(str(err))
        acked[0] += 1
        if acked[0] == RECORDS // 3 and not started:
            started.append(threading.Thread(target=during))
            started[0].start()

    for i in range(RECORDS):
        producer.produce(topic, b"r%05d" % i, partition=0, on_delivery=delivered)
        producer.poll(0)
        if i % 100 == 0:
            time.sleep(0.01)  # spread over the disturbance
    assert producer.flush(150) == 0
    for t in started:
        t.join(60)
    return errors


@pytest.fixture
def root(tmp_path: Path) -> kl.Root:
    r = kl.Root(tmp_path / "root")
    yield r
    r.close()


def produce_kafka_python(bootstrap: str, topic: str, during) -> list[str]:
    """``produce`` with kafka-python's idempotent producer (its default)."""
    producer = KafkaProducer(
        bootstrap_servers=bootstrap, enable_idempotence=True, linger_ms=2, batch_size=700, delivery_timeout_ms=120_000,
        reconnect_backoff_max_ms=500, request_timeout_ms=10_000,
    )  # fmt: skip
    futures = [producer.send(topic, b"r%05d" % i, partition=0) for i in range(RECORDS // 3)]
    futures[-1].get(60)
    disturbance = threading.Thread(target=during)
    disturbance.start()
    for i in range(RECORDS // 3, RECORDS):
        futures.append(producer.send(topic, b"r%05d" % i, partition=0))
        if i % 100 == 0:
            time.sleep(0.01)
    producer.flush(150)
    disturbance.join(60)
    errors = [str(f.exception) for f in futures if f.failed()]
    producer.close(10)
    return errors


def test_a_daemon_killed_and_started_again_mid_stream_stores_each_record_once(root, tmp_path) -> None:
    root.create_topic("t")
    port = free_port()
    daemons = [Daemon(root.path, tmp_path / "serve-0", address=f"127.0.0.1:{port}")]

    def kill_and_restart() -> None:
        for k in range(3):  # each kill may cut off an appended batch's answer
            os.kill(daemons[-1].proc.pid, signal.SIGKILL)
            daemons[-1].proc.wait()
            time.sleep(0.3)
            daemons.append(Daemon(root.path, tmp_path / f"serve-{k + 1}", address=f"127.0.0.1:{port}"))
            time.sleep(0.5)

    try:
        errors = produce_kafka_python(f"127.0.0.1:{port}", "t", kill_and_restart)
    finally:
        for d in daemons:
            d.stop()
    assert errors == []
    assert len(daemons) == 4
    assert stored(root, "t") == [b"r%05d" % i for i in range(RECORDS)]


def test_two_daemons_one_stopped_with_requests_queued_store_each_record_once_and_in_order(root, tmp_path) -> None:
    root.create_topic("t")
    daemons = [Daemon(root.path, tmp_path / f"serve-{n}") for n in range(2)]
    try:
        metadata = [AdminClient({"bootstrap.servers": d.bootstrap}).list_topics("t", timeout=20) for d in daemons]
        leaders = [m.topics["t"].partitions[0].leader for m in metadata]
        assert leaders[0] == leaders[1]  # both name the same leader
        port = metadata[0].brokers[leaders[0]].port
        (leader,) = [d for d in daemons if d.bootstrap == f"127.0.0.1:{port}"]

        def pause_the_leader() -> None:
            os.kill(leader.proc.pid, signal.SIGSTOP)
            time.sleep(8)
            os.kill(leader.proc.pid, signal.SIGCONT)

        errors = produce(",".join(d.bootstrap for d in daemons), "t", pause_the_leader)
    finally:
        for d in daemons:
            os.kill(d.proc.pid, signal.SIGCONT)
            d.stop()
    assert errors == []
    assert stored(root, "t") == [b"r%05d" % i for i in range(RECORDS)]
