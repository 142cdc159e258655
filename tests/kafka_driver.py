"""Drives one of today's Python Kafka clients, unmodified, for one operation; JSON lines on stdout.

    python tests/kafka_driver.py CLIENT SPEC_FILE

CLIENT is ``confluent`` (confluent-kafka, librdkafka), ``kafka-python`` or ``aiokafka``.
SPEC_FILE holds a JSON object that names the operation (``op``) and its arguments; keys, values and header values
travel as base64 (``null`` for a null one) so that every byte survives.  Operations:

- ``produce``: send ``records`` to ``topic``/``partition`` in one flush (``compression``,
  ``idempotent``, ``acks``); prints ``{"offsets": [...]}``, each record's offset as the
  client reports it.  With ``"each": true`` every record is sent and acknowledged in turn,
  ``{"acked": i, "offset": o}`` printed as it is (a test kills the process mid-way).
- ``consume``: ``assign()`` the partition, start at ``start`` (``earliest``, ``latest``,
  ``{"offset": N}`` or ``{"timestamp": MS}``), print ``{"position": N}`` once there, then
  ``{"records": [...]}`` once ``count`` records have come; ``reset`` is where an offset out
  of range sends the client (``earliest`` or ``latest``, the clients' auto.offset.reset).
- ``consumers``: ``n`` consumers at once, each reading the partition from the start until
  ``count`` records; prints ``{"records": [[...] per consumer]}``.
- ``watch``: print the topics the client sees (``{"topics": [...]}``), wait for a line on
  stdin, then look ``topic`` up through Metadata until it appears: ``{"partitions": N}``.
- ``group``: join ``group`` subscribed to ``topics`` (a list) or ``pattern`` (a regex) with
  the client's ``assignor`` (``range``, ``roundrobin``, ``cooperative-sticky``: those it
  has), reading from the earliest offset where nothing is committed; print
  ``{"assignment": [[topic, partition], ...], "why": "assign" | "revoke" | "lost"}`` as the
  group changes it, ``{"topic", "partition", "offset", "value"}`` for each message (values
  as text), and commit as ``commit`` says: ``auto`` (the client's auto-commit, every 100 ms),
  ``each`` (synchronously after each message: ``{"committed": [[topic, partition,
  offset]]}`` or ``{"commit_error": "..."}``) or ``end`` (all consumed, before closing).
  Leaves the group (close) after ``count`` messages, or once ``close`` (or the end) comes on
  stdin: ``{"closed": N}``, N the messages read.  ``session_timeout`` in seconds.

Each operation gives up after ``timeout`` seconds, saying what it had (exit 1); a client
stuck beyond that is stopped with every thread's stack on stderr.
"""

from __future__ import annotations

import asyncio
import base64
import faulthandler
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

Record = dict[str, Any]


def out(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def raw(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


def b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def record(offset: int, timestamp: int, key: bytes | None, value: bytes | None, headers: Any) -> Record:
    return {
        "offset": offset,
        "timestamp": timestamp,
        "key": b64(key),
        "value": b64(value),
        "headers": [[k, b64(v)] for k, v in headers or ()],
    }


def outgoing(r: Record) -> tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int | None]:
    """A spec record's key, value, headers and timestamp, as bytes."""
    return raw(r.get("key")), raw(r.get("value")), [(k, raw(v)) for k, v in r.get("headers", [])], r.get("timestamp")


class Timeout(Exception):
    """The operation did not finish in time."""


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self, what: str) -> float:
        left = self.end - time.monotonic()
        if left <= 0:
            raise Timeout(what)
        return left


# ----------------------------------------------------------------- confluent-kafka


def confluent(spec: dict[str, Any]) -> None:
    import confluent_kafka as ck

    deadline = Deadline(spec["timeout"])
    common = {"bootstrap.servers": spec["bootstrap"], "log_level": 3, "socket.timeout.ms": 5000}
    op = spec["op"]
    if op == "group":
        confluent_group(spec, common, deadline)
        return
    if op == "produce":
        producer = ck.Producer(
            {
                **common,
                "compression.type": spec.get("compression") or "none",
                "enable.idempotence": bool(spec.get("idempotent")),
                "acks": spec.get("acks", -1),
                "linger.ms": 5,
                "message.timeout.ms": int(spec["timeout"] * 1000),
                "partitioner": spec.get("partitioner", "consistent_random"),
            }
        )
        offsets: list[int | None] = [None] * len(spec["records"])
        errors: list[str] = []

        def delivered(i: int) -> Any:
            def report(err: Any, msg: Any) -> None:
                if err is not None:
                    errors.append(f"record {i}: {err}")
                else:
                    offsets[i] = msg.offset()
                    if spec.get("each"):
                        out(acked=i, offset=msg.offset())

            return report

        partition = -1 if spec["partition"] is None else spec["partition"]  # -1: the partitioner's choice
        for i, r in enumerate(spec["records"]):
            key, value, headers, timestamp = outgoing(r)
            producer.produce(
                spec["topic"], value, key, partition=partition, headers=headers or None,
                timestamp=timestamp or 0, on_delivery=delivered(i),
            )  # fmt: skip
            if spec.get("each"):
                producer.flush(deadline.left(f"record {i} unacknowledged"))
        if producer.flush(deadline.left("flush")) > 0:
            raise Timeout(f"unacknowledged after flush; delivered {offsets}")
        if errors:
            raise SystemExit("delivery failed: " + "; ".join(errors))
        out(offsets=offsets)
        return
    consumer_config = {
        **common,
        "group.id": "kl-tests",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": spec.get("reset", "latest"),
    }
    if op == "consume":
        got: list[Record] = []
        position: list[int] = []

        def stats(text: str) -> None:
            part = json.loads(text).get("topics", {}).get(spec["topic"], {}).get("partitions", {}).get(str(spec["partition"]))
            # Positioned once a fetch has come back (hi_offset known): "active" alone may be
            # reported before next_offset is set.
            if part and part.get("fetch_state") == "active" and part.get("hi_offset", -1) >= 0 and not position:
                position.append(part["next_offset"])

        consumer = ck.Consumer({**consumer_config, "statistics.interval.ms": 50, "stats_cb": stats, "fetch.wait.max.ms": 100})
        start = spec["start"]
        tp = ck.TopicPartition(spec["topic"], spec["partition"])
        if start == "earliest":
            tp.offset = ck.OFFSET_BEGINNING
        elif start == "latest":
            tp.offset = ck.OFFSET_END
        elif "offset" in start:
            tp.offset = start["offset"]
        else:
            tp.offset = start["timestamp"]
            (tp,) = consumer.offsets_for_times([tp], timeout=deadline.left("offsets_for_times"))
        consumer.assign([tp])
        told = False
        while not told or len(got) < spec["count"]:
            msg = consumer.poll(min(0.05, deadline.left(f"position {position}, records {got}")))
            if position and not told:
                out(position=position[0])
                told = True
            if msg is None:
                continue
            if msg.error():
                if msg.error().fatal():
                    raise SystemExit(f"consumer error: {msg.error()}")
                continue
            got.append(record(msg.offset(), msg.timestamp()[1], msg.key(), msg.value(), msg.headers()))
        consumer.close()
        out(records=got)
    elif op == "consumers":
        consumers = [ck.Consumer(consumer_config) for _ in range(spec["n"])]
        results: list[list[Record]] = [[] for _ in consumers]
        for c in consumers:
            c.assign([ck.TopicPartition(spec["topic"], spec["partition"], ck.OFFSET_BEGINNING)])

        def read(c: Any, into: list[Record]) -> None:
            while len(into) < spec["count"] and time.monotonic() < deadline.end:
                msg = c.poll(0.1)
                if msg is not None and not msg.error():
                    into.append(record(msg.offset(), msg.timestamp()[1], msg.key(), msg.value(), msg.headers()))

        threads = [threading.Thread(target=read, args=pair) for pair in zip(consumers, results, strict=True)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for c in consumers:
            c.close()
        short = [i for i, r in enumerate(results) if len(r) < spec["count"]]
        if short:
            raise Timeout(f"consumers {short} got {[len(results[i]) for i in short]} records")
        out(records=results)
    elif op == "watch":
        admin = ck.Producer(common)
        out(topics=sorted(admin.list_topics(timeout=deadline.left("list_topics")).topics))
        sys.stdin.readline()
        while True:
            found = admin.list_topics(spec["topic"], timeout=deadline.left("list_topics")).topics.get(spec["topic"])
            if found is not None and found.error is None:
                out(partitions=len(found.partitions))
                return
            time.sleep(0.05)
    else:
        raise SystemExit(f"unknown op {op}")


# ----------------------------------------------------------------- kafka-python


def kafka_python(spec: dict[str, Any]) -> None:
    import kafka

    deadline = Deadline(spec["timeout"])
    common = {"bootstrap_servers": spec["bootstrap"], "request_timeout_ms": int(spec["timeout"] * 1000)}
    op = spec["op"]
    if op == "group":
        kafka_python_group(spec, common, deadline)
        return
    if op == "produce":
        idempotent = spec.get("idempotent")
        producer = kafka.KafkaProducer(
            **common,
            compression_type=spec.get("compression"),
            acks={-1: "all"}.get(spec.get("acks", -1), spec.get("acks", -1)),
            **({} if idempotent is None else {"enable_idempotence": idempotent}),  # default: the client's (on)
            linger_ms=5,
        )
        futures = []
        for i, r in enumerate(spec["records"]):
            key, value, headers, timestamp = outgoing(r)
            futures.append(producer.send(spec["topic"], value, key, headers or None, spec["partition"], timestamp))
            if spec.get("each"):
                out(acked=i, offset=futures[-1].get(deadline.left(f"record {i} unacknowledged")).offset)
        producer.flush(deadline.left("flush"))
        out(offsets=[f.get(deadline.left("futures")).offset for f in futures])
        producer.close(deadline.left("close"))
        return
    tp = kafka.TopicPartition(spec["topic"], spec.get("partition", 0))
    if op == "consume":
        reset = spec.get("reset", "latest")
        consumer = kafka.KafkaConsumer(**common, group_id=None, enable_auto_commit=False, auto_offset_reset=reset)
        consumer.assign([tp])
        start = spec["start"]
        if start == "earliest":
            consumer.seek_to_beginning(tp)
        elif start == "latest":
            consumer.seek_to_end(tp)
        elif "offset" in start:
            consumer.seek(tp, start["offset"])
        else:
            found = consumer.offsets_for_times({tp: start["timestamp"]})[tp]
            consumer.seek(tp, found.offset)
        out(position=consumer.position(tp, timeout_ms=deadline.left("position") * 1000))
        got = read_kafka_python(consumer, spec["count"], deadline)
        consumer.close()
        out(records=got)
    elif op == "consumers":
        consumers = [kafka.KafkaConsumer(**common, group_id=None, enable_auto_commit=False) for _ in range(spec["n"])]
        results: list[list[Record]] = []
        for c in consumers:
            c.assign([tp])
            c.seek_to_beginning(tp)

        def read_all(c: Any) -> None:
            results.append(read_kafka_python(c, spec["count"], deadline))

        threads = [threading.Thread(target=read_all, args=(c,)) for c in consumers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        out(records=results)
    elif op == "watch":
        consumer = kafka.KafkaConsumer(**common, group_id=None)
        out(topics=sorted(consumer.topics()))
        sys.stdin.readline()
        while not (partitions := consumer.partitions_for_topic(spec["topic"])):
            deadline.left("partitions_for_topic")
            time.sleep(0.05)
        out(partitions=len(partitions))
    else:
        raise SystemExit(f"unknown op {op}")


def read_kafka_python(consumer: Any, count: int, deadline: Deadline) -> list[Record]:
    got: list[Record] = []
    while len(got) < count:
        left = deadline.left(f"records {got}")
        for batch in consumer.poll(timeout_ms=min(left, 0.2) * 1000).values():
            got.extend(record(m.offset, m.timestamp, m.key, m.value, m.headers) for m in batch)
    return got


# ----------------------------------------------------------------- aiokafka


async def aiokafka_(spec: dict[str, Any]) -> None:
    import aiokafka
    from aiokafka.admin import AIOKafkaAdminClient

    deadline = Deadline(spec["timeout"])
    op = spec["op"]
    if op == "group":
        await aiokafka_group(spec, deadline)
        return
    if op == "produce":
        producer = aiokafka.AIOKafkaProducer(
            bootstrap_servers=spec["bootstrap"],
            compression_type=spec.get("compression"),
            enable_idempotence=bool(spec.get("idempotent")),
            acks={-1: "all"}.get(spec.get("acks", -1), spec.get("acks", -1)),
            linger_ms=5,
            request_timeout_ms=int(spec["timeout"] * 1000),
        )
        await asyncio.wait_for(producer.start(), deadline.left("start"))
        try:
            futures = []
            for i, r in enumerate(spec["records"]):
                key, value, headers, timestamp = outgoing(r)
                futures.append(await producer.send(spec["topic"], value, key, spec["partition"], timestamp, headers or None))
                if spec.get("each"):
                    out(acked=i, offset=(await asyncio.wait_for(futures[-1], deadline.left(f"record {i}"))).offset)
            done = await asyncio.wait_for(asyncio.gather(*futures), deadline.left("acknowledgements"))
            out(offsets=[None if m is None else m.offset for m in done])  # None: acks=0
        finally:
            await producer.stop()
        return
    if op == "watch":
        admin = AIOKafkaAdminClient(bootstrap_servers=spec["bootstrap"])
        await asyncio.wait_for(admin.start(), deadline.left("start"))
        out(topics=sorted(await asyncio.wait_for(admin.list_topics(), deadline.left("list_topics"))))
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        while True:
            (found,) = await asyncio.wait_for(admin.describe_topics([spec["topic"]]), deadline.left("describe_topics"))
            if found["error_code"] == 0:
                out(partitions=len(found["partitions"]))
                break
            await asyncio.sleep(0.05)
        await admin.close()
        return
    tp = aiokafka.TopicPartition(spec["topic"], spec["partition"])
    # An assigned partition is reset at once with auto_offset_reset, racing a seek_to_*(): the
    # reset is the same as the seek that follows.
    reset = spec.get("reset", "latest" if spec.get("start") == "latest" else "earliest")
    config = {"group_id": None, "enable_auto_commit": False, "fetch_max_wait_ms": 100, "auto_offset_reset": reset}
    consumers = [aiokafka.AIOKafkaConsumer(bootstrap_servers=spec["bootstrap"], **config) for _ in range(spec.get("n", 1))]
    await asyncio.wait_for(asyncio.gather(*(c.start() for c in consumers)), deadline.left("start"))
    for c in consumers:
        c.assign([tp])
    try:
        if op == "consume":
            (consumer,) = consumers
            start = spec["start"]
            if start == "earliest":
                await consumer.seek_to_beginning(tp)
            elif start == "latest":
                await consumer.seek_to_end(tp)
            elif "offset" in start:
                consumer.seek(tp, start["offset"])
            else:
                found = await consumer.offsets_for_times({tp: start["timestamp"]})
                consumer.seek(tp, found[tp].offset)
            out(position=await asyncio.wait_for(consumer.position(tp), deadline.left("position")))
            out(records=await read_aiokafka(consumer, spec["count"], deadline))
        elif op == "consumers":
            for c in consumers:
                await c.seek_to_beginning(tp)
            out(records=list(await asyncio.gather(*(read_aiokafka(c, spec["count"], deadline) for c in consumers))))
        else:
            raise SystemExit(f"unknown op {op}")
    finally:
        await asyncio.gather(*(c.stop() for c in consumers))


async def read_aiokafka(consumer: Any, count: int, deadline: Deadline) -> list[Record]:
    got: list[Record] = []
    while len(got) < count:
        left = deadline.left(f"records {got}")
        for batch in (await consumer.getmany(timeout_ms=min(left, 0.2) * 1000)).values():
            got.extend(record(m.offset, m.timestamp, m.key, m.value, m.headers) for m in batch)
    return got


# ----------------------------------------------------------------- groups


class Stdin:
    """``close`` (or the end) on stdin, seen by a thread: the member is to leave."""

    def __init__(self) -> None:
        self.closing = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in sys.stdin:
            if line.strip() == "close":
                break
        self.closing.set()


class Member:
    """What a group member prints: its assignment as it changes, its messages, its commits."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.assignment: set[tuple[str, int]] = set()
        self.read = 0
        self.stdin = Stdin()

    def reading(self, deadline: Deadline) -> bool:
        """Whether to go on reading: not told to close, not at ``count``, not past the deadline."""
        deadline.left(f"{self.read} messages read, assignment {sorted(self.assignment)}")
        return not self.stdin.closing.is_set() and self.read < self.spec.get("count", float("inf"))

    def assigned(self, why: str, partitions: list[tuple[str, int]], incremental: bool = False) -> None:
        """The group gave (``assign``) or took (``revoke``, ``lost``) ``partitions``: the
        whole assignment, or (``incremental``, or a revoke) a change to it."""
        if why == "assign":
            self.assignment = set(partitions) | (self.assignment if incremental else set())
        else:
            self.assignment -= set(partitions)
        out(assignment=sorted(self.assignment), why=why)

    def message(self, topic: str, partition: int, offset: int, value: bytes | None) -> None:
        self.read += 1
        out(topic=topic, partition=partition, offset=offset, value=None if value is None else value.decode())


def confluent_group(spec: dict[str, Any], common: dict[str, Any], deadline: Deadline) -> None:
    import confluent_kafka as ck

    member = Member(spec)
    commit = spec.get("commit", "auto")
    consumer = ck.Consumer(
        {
            **common,
            "group.id": spec["group"],
            "auto.offset.reset": "earliest",
            "enable.auto.commit": commit == "auto",
            "auto.commit.interval.ms": 100,
            "partition.assignment.strategy": spec.get("assignor", "range"),
            "session.timeout.ms": int(spec.get("session_timeout", 10) * 1000),
            "heartbeat.interval.ms": 1000,
            "topic.metadata.refresh.interval.ms": 1000,
        }
    )
    incremental = spec.get("assignor") == "cooperative-sticky"

    def on(why: str) -> Any:
        return lambda _, partitions: member.assigned(why, [(p.topic, p.partition) for p in partitions], incremental)

    def committed(done: list[Any]) -> None:
        errors = [str(p.error) for p in done if p.error is not None]
        if errors:
            out(commit_error="; ".join(errors))
        else:
            out(committed=[[p.topic, p.partition, p.offset] for p in done])

    topics = [spec["pattern"]] if "pattern" in spec else spec["topics"]  # librdkafka: a name starting ^ is a regex
    consumer.subscribe(topics, on_assign=on("assign"), on_revoke=on("revoke"), on_lost=on("lost"))
    while member.reading(deadline):
        msg = consumer.poll(0.1)
        if msg is None:
            continue
        if msg.error():
            out(error=str(msg.error()))
            continue
        member.message(msg.topic(), msg.partition(), msg.offset(), msg.value())
        if commit == "each":
            try:
                committed(consumer.commit(message=msg, asynchronous=False))
            except ck.KafkaException as e:
                out(commit_error=str(e))
    if commit == "end" and member.assignment:
        try:
            committed(consumer.commit(asynchronous=False))
        except ck.KafkaException as e:
            out(commit_error=str(e))
    consumer.close()
    out(closed=member.read)


KAFKA_PYTHON_ASSIGNORS = {"range": "RangePartitionAssignor", "roundrobin": "RoundRobinPartitionAssignor"}


def kafka_python_group(spec: dict[str, Any], common: dict[str, Any], deadline: Deadline) -> None:
    import kafka
    import kafka.coordinator.assignors.range
    import kafka.coordinator.assignors.roundrobin

    member = Member(spec)
    commit = spec.get("commit", "auto")
    assignor = spec.get("assignor", "range")
    module = getattr(kafka.coordinator.assignors, assignor)
    consumer = kafka.KafkaConsumer(
        **common,
        group_id=spec["group"],
        auto_offset_reset="earliest",
        enable_auto_commit=commit == "auto",
        auto_commit_interval_ms=100,
        partition_assignment_strategy=[getattr(module, KAFKA_PYTHON_ASSIGNORS[assignor])],
        session_timeout_ms=int(spec.get("session_timeout", 10) * 1000),
        heartbeat_interval_ms=1000,
        metadata_max_age_ms=1000,
    )

    class Listener(kafka.ConsumerRebalanceListener):
        def on_partitions_revoked(self, revoked: Any) -> None:
            member.assigned("revoke", [(p.topic, p.partition) for p in revoked])

        def on_partitions_assigned(self, assigned: Any) -> None:
            member.assigned("assign", [(p.topic, p.partition) for p in assigned])

    consumer.subscribe(topics=spec.get("topics"), pattern=spec.get("pattern"), listener=Listener())
    while member.reading(deadline):
        for batch in consumer.poll(timeout_ms=100, max_records=1).values():
            for m in batch:
                member.message(m.topic, m.partition, m.offset, m.value)
                if commit == "each":
                    try:
                        consumer.commit()
                        out(committed=[[m.topic, m.partition, m.offset + 1]])
                    except kafka.errors.KafkaError as e:
                        out(commit_error=str(e))
    if commit == "end" and member.assignment:
        consumer.commit()
        out(committed=[[tp.topic, tp.partition, consumer.position(tp)] for tp in sorted(consumer.assignment())])
    consumer.close()
    out(closed=member.read)


async def aiokafka_group(spec: dict[str, Any], deadline: Deadline) -> None:
    import aiokafka
    from aiokafka.coordinator.assignors.range import RangePartitionAssignor
    from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor

    member = Member(spec)
    commit = spec.get("commit", "auto")
    assignor = {"range": RangePartitionAssignor, "roundrobin": RoundRobinPartitionAssignor}[spec.get("assignor", "range")]
    consumer = aiokafka.AIOKafkaConsumer(
        bootstrap_servers=spec["bootstrap"],
        group_id=spec["group"],
        auto_offset_reset="earliest",
        enable_auto_commit=commit == "auto",
        auto_commit_interval_ms=100,
        partition_assignment_strategy=(assignor,),
        session_timeout_ms=int(spec.get("session_timeout", 10) * 1000),
        heartbeat_interval_ms=1000,
        metadata_max_age_ms=1000,
        fetch_max_wait_ms=100,
    )

    class Listener(aiokafka.ConsumerRebalanceListener):
        async def on_partitions_revoked(self, revoked: Any) -> None:
            member.assigned("revoke", [(p.topic, p.partition) for p in revoked])

        async def on_partitions_assigned(self, assigned: Any) -> None:
            member.assigned("assign", [(p.topic, p.partition) for p in assigned])

    await asyncio.wait_for(consumer.start(), deadline.left("start"))
    consumer.subscribe(topics=spec.get("topics", ()), pattern=spec.get("pattern"), listener=Listener())
    try:
        while member.reading(deadline):
            for batch in (await consumer.getmany(timeout_ms=100, max_records=1)).values():
                for m in batch:
                    member.message(m.topic, m.partition, m.offset, m.value)
                    if commit == "each":
                        try:
                            await consumer.commit()
                            out(committed=[[m.topic, m.partition, m.offset + 1]])
                        except aiokafka.errors.KafkaError as e:
                            out(commit_error=str(e))
        if commit == "end" and member.assignment:
            await consumer.commit()
            out(committed=[[tp.topic, tp.partition, await consumer.position(tp)] for tp in sorted(consumer.assignment())])
    finally:
        await consumer.stop()
    out(closed=member.read)


def main() -> None:
    client, spec = sys.argv[1], json.loads(Path(sys.argv[2]).read_text())
    # A client stuck where no deadline of ours reaches (a constructor, a close): every
    # thread's stack on stderr, then exit 1.
    faulthandler.dump_traceback_later(spec["timeout"] + 2, exit=True)
    try:
        if client == "confluent":
            confluent(spec)
        elif client == "kafka-python":
            kafka_python(spec)
        elif client == "aiokafka":
            asyncio.run(aiokafka_(spec))
        else:
            raise SystemExit(f"unknown client {client}")
    except (Timeout, asyncio.TimeoutError) as e:
        raise SystemExit(f"{client} {spec['op']}: timed out after {spec['timeout']} s: {e}") from None


if __name__ == "__main__":
    main()
