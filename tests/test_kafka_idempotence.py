"""Idempotence held by the log: idempotent librdkafka (confluent-kafka) and kafka-python
producers whose daemon is killed and started again, and an idempotent librdkafka producer
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

import kafkafuzz as fz
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from kafka import KafkaProducer

import kl
from kl.net.kafka import errors as kafka_errors

from kafka_clients import Daemon

RECORDS = 3000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stored(root: kl.Root, topic: str) -> list[bytes]:
    log = kl.Root(root.path).log(topic, 0)
    return [msg.value for msg in log.messages(log.log_start_offset, log.log_end_offset)]


class Disturbance(threading.Thread):
    """``during`` in a thread that lives until the producer is done: the daemons it starts
    die with the thread that started them (``--pdeathsig``)."""

    def __init__(self, during) -> None:
        super().__init__(daemon=True)
        self.during, self.done = during, threading.Event()

    def run(self) -> None:
        self.during()
        self.done.wait(300)

    def finish(self) -> None:
        self.done.set()
        self.join(60)


def produce(bootstrap: str, topic: str, during) -> list[str]:
    """Send ``RECORDS`` numbered records with librdkafka's idempotent producer, calling
    ``during`` from a thread once a third are acknowledged; the delivery errors."""
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
    disturbance = Disturbance(during)

    def delivered(err, msg) -> None:
        if err is not None:
            errors.append(str(err))
        acked[0] += 1
        if acked[0] == RECORDS // 3:
            disturbance.start()

    for i in range(RECORDS):
        producer.produce(topic, b"r%05d" % i, partition=0, on_delivery=delivered)
        producer.poll(0)
        if i % 100 == 0:
            time.sleep(0.01)  # spread over the disturbance
    assert producer.flush(150) == 0
    disturbance.finish()
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
    disturbance = Disturbance(during)
    disturbance.start()
    for i in range(RECORDS // 3, RECORDS):
        futures.append(producer.send(topic, b"r%05d" % i, partition=0))
        if i % 100 == 0:
            time.sleep(0.01)
    producer.flush(150)
    disturbance.finish()
    errors = [str(f.exception) for f in futures if f.failed()]
    producer.close(10)
    return errors


@pytest.mark.parametrize("send", [produce, produce_kafka_python], ids=["librdkafka", "kafka-python"])
def test_a_daemon_killed_and_started_again_mid_stream_stores_each_record_once(root, tmp_path, send) -> None:
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
        errors = send(f"127.0.0.1:{port}", "t", kill_and_restart)
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


def produced(address: tuple[str, int], pid: int, epoch: int, seq: int, values: list[bytes]) -> tuple[int, int]:
    """(error code, base offset) of an idempotent batch of ``values`` sent as producer
    ``pid`` with ``epoch`` and first sequence ``seq``."""
    request = fz.produce("w", [fz.batch(fz.plain(values), len(values), producer=(pid, epoch, seq))], acks=-1)
    answer = fz.call(address, request).responses[0].partition_responses[0]
    return answer.error_code, answer.base_offset


def address_of(d: Daemon) -> tuple[str, int]:
    host, port = d.bootstrap.rsplit(":", 1)
    return host, int(port)


def test_retries_across_restarts_kills_and_daemons_and_a_woken_daemon_are_appended_once(root, tmp_path) -> None:
    """Step by step on the wire, each step a retry the daemon's memory could not answer."""
    root.create_topic("w")
    port = free_port()
    first = Daemon(root.path, tmp_path / "serve-0", address=f"127.0.0.1:{port}")
    other = Daemon(root.path, tmp_path / "serve-1")
    try:
        a, b = address_of(first), address_of(other)
        assert produced(a, 11, 0, 0, [b"r0", b"r1"]) == (kafka_errors.NONE, 0)
        os.kill(first.proc.pid, signal.SIGKILL)  # the answer may have been lost: the client retries
        first.proc.wait()
        first = Daemon(root.path, tmp_path / "serve-2", address=f"127.0.0.1:{port}")
        assert produced(a, 11, 0, 0, [b"r0", b"r1"]) == (kafka_errors.NONE, 0)  # after the restart
        assert produced(a, 11, 0, 2, [b"r2"]) == (kafka_errors.NONE, 2)
        assert produced(b, 11, 0, 2, [b"r2"]) == (kafka_errors.NONE, 2)  # moved to another daemon
        os.kill(first.proc.pid, signal.SIGSTOP)  # a request queued at a stopped daemon ...
        queued: list[tuple[int, int]] = []
        sender = threading.Thread(target=lambda: queued.append(produced(a, 11, 0, 3, [b"r3"])))
        sender.start()
        time.sleep(0.5)
        assert produced(b, 11, 0, 3, [b"r3"]) == (kafka_errors.NONE, 3)  # ... retried at the other one
        os.kill(first.proc.pid, signal.SIGCONT)
        sender.join(30)
        assert queued == [(kafka_errors.NONE, 3)]  # the woken daemon finds it appended
        assert produced(b, 11, 0, 5, [b"x"])[0] == kafka_errors.OUT_OF_ORDER_SEQUENCE_NUMBER
        assert produced(a, 11, 1, 0, [b"r4"]) == (kafka_errors.NONE, 4)  # a new epoch
        assert produced(b, 11, 0, 4, [b"x"])[0] == kafka_errors.INVALID_PRODUCER_EPOCH  # the old one, fenced
    finally:
        for d in (first, other):
            os.kill(d.proc.pid, signal.SIGCONT)
            d.stop()
    assert stored(root, "w") == [b"r0", b"r1", b"r2", b"r3", b"r4"]
