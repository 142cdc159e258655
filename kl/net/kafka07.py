"""Kafka 0.7's front end of ``kl serve``: its requests and kl's own (``kl.net.wire``).

A Kafka 0.7 client gets Kafka 0.7's answers (an unknown topic is an empty fetch, errors
are bare codes); a kl client (one that said HELLO) gets kl's (errors carry a JSON line
naming the problem).  Fetches are segment bytes as they are on disk, sent with sendfile:
a Kafka 0.7 client gets topics of format ``0.7`` only.  Specified in ``man/kl-protocol.5``.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Iterable
from typing import Any, NamedTuple

from kl.errors import InvalidTopicName, KlError, TopicNotFound
from kl.log.config import TopicConfig
from kl.log.log import append_all
from kl.log.validate import Checked, validate
from kl.net import wire
from kl.net.sasl import Authenticator
from kl.net.server import FILES_PER_CONNECTION, Connection, Drop, FrontEnd, Server, Span, Wait, WrongDoor
from kl.net.wire import Fetch, ProtocolError, Reader
from kl.topic import validate_name

log = logging.getLogger("kl.serve")

KL_FORMAT = "kl"
KAFKA_API_VERSIONS = 18
"""The API key of today's Kafka protocol's ApiVersions, the first request its clients send."""
MAX_FETCHES = 1000
"""The most fetches one MULTIFETCH may hold."""
MAX_PAYLOAD = (1 << 31) - 1 - 2
"""A response's size field is an int32 and counts the error code: longer fetches are cut short."""


class Kafka07(FrontEnd):
    """Answers Kafka 0.7's requests and kl's own; with ``ServeConfig.port_sasl``, only
    from clients that authenticated (AUTHENTICATE, ``kl.net.sasl``'s rules)."""

    def __init__(self, server: Server):
        super().__init__(server)
        self.sasl = Authenticator(server, lambda conn: server.config.port_sasl)
        self._meters: dict[int, _Meter] = {}
        """Request type -> its metrics' children."""
        self._answered = threading.local()
        """``codes``: the error codes the request a worker answers has answered so far, counted."""

    def listening(self, address: str, port: int) -> None:
        log.info("serving %s on %s:%d", self.server.root.path, address, port)

    def listener_name(self, security: str) -> str:
        return "KAFKA07" if security == "PLAINTEXT" else f"KAFKA07_{security}"

    def handle(self, conn: Connection, request: memoryview) -> None:
        reader = Reader(request)
        kind = reader.int16()
        handler = HANDLERS.get(kind)
        if handler is None:
            raise self._unknown(kind, request)
        meter = self._meters.get(kind) or self._meter(kind)
        codes: dict[int, int] = {}
        self._answered.codes = codes
        try:
            if kind >= wire.HELLO:
                conn.kl = True
            exchange = self.sasl.pending(conn)  # (the first request starts the time the exchange has)
            if exchange is not None and kind not in (wire.HELLO, wire.AUTHENTICATE):
                if not conn.kl:
                    raise Drop(f"{wire.NAMES[kind]} before SASL authentication (kl serve --sasl)")
                conn.hang_up = True
                needed = wire.AuthenticationFailed(
                    f"this server requires SASL authentication ({', '.join(self.sasl.mechanisms)})"
                )
                self._reply_error(conn, wire.KL_ERROR, needed)
                return
            handler(self, conn, reader)
        finally:
            meter.requests.inc()
            if conn.wait is None:  # (a parked failed login is answered later)
                meter.time.observe((time.monotonic() - conn.last_active) * 1000)  # (the request's last byte came then)
            for code, count in codes.items():
                self.server.metrics.kafka07_errors.labels(meter.name, wire.CODE_NAMES.get(code, str(code))).inc(count)

    def _meter(self, kind: int) -> _Meter:
        metrics, name = self.server.metrics, wire.NAMES[kind]
        meter = self._meters[kind] = _Meter(name, metrics.kafka07_requests.labels(name), metrics.kafka07_total_time.labels(name))
        return meter

    def _answered_with(self, code: int) -> None:
        codes = self._answered.codes
        codes[code] = codes.get(code, 0) + 1

    def _unknown(self, kind: int, request: memoryview) -> Drop:
        """Why a request of an unknown type closes its connection: a Kafka client's first
        request (ApiVersions, which today's clients all send first) is told where today's
        Kafka protocol is served."""
        if kind != KAFKA_API_VERSIONS or len(request) < 10:
            return Drop(f"unknown request type {kind}")
        doors = [door for door in self.server.doors(FrontEnd) if door not in self.server.doors(Kafka07)]
        instead = f"it is served on {', '.join(doors)}" if doors else "this daemon does not serve it (kl serve --kafka PORT)"
        version = wire.INT16.unpack_from(request, 2)[0]
        return WrongDoor(f"a Kafka client (ApiVersions v{version}) connected to Kafka 0.7's port; today's protocol: {instead}")

    def resume(self, conn: Connection, wait: Wait) -> None:
        """A failed authentication's answer, once its delay is over (nothing else waits)."""
        exchange = self.sasl.pending(conn)
        assert exchange is not None
        self.server.queue(conn, self.sasl.answer_failure(conn, exchange))

    def closed(self, conn: Connection) -> None:
        self.sasl.forget(conn)

    def _authenticate(self, conn: Connection, reader: Reader) -> None:
        mechanism = reader.string()
        token = bytes(reader.take(reader.int32()))
        reader.done()
        exchange = self.sasl.pending(conn)
        if exchange is None:
            done = "already authenticated" if self.server.config.port_sasl else "SASL is off on this port (kl serve --sasl)"
            self._reply_error(conn, wire.KL_ERROR, KlError(done))
            return
        if exchange.mechanism not in ("", mechanism):
            raise Drop(f"AUTHENTICATE with {mechanism} inside a {exchange.mechanism} exchange")
        if mechanism not in self.sasl.mechanisms:
            log.warning("%s: SASL mechanism %r is not enabled here (%s)", conn.peer, mechanism, ", ".join(self.sasl.mechanisms))
            conn.hang_up = True
            refused = f"SASL mechanism {mechanism} is not one this server takes ({', '.join(self.sasl.mechanisms)})"
            self._reply_error(conn, wire.KL_ERROR, wire.AuthenticationFailed(refused))
            return
        exchange.mechanism = mechanism
        answer = self.sasl.evaluate(conn, exchange, token)
        if answer is None:
            failed = wire.AuthenticationFailed(f"SASL {mechanism} authentication failed: unknown user or wrong password")
            _, payload = wire.error_payload(failed)
            refusal = self.sasl.fail(conn, exchange, memoryview(wire.HEAD.pack(2 + len(payload), wire.KL_ERROR) + payload))
            if refusal is not None:
                self.server.queue(conn, refusal)
            return
        self._reply(conn, wire.NO_ERROR, wire.INT32.pack(len(answer)) + answer)

    def _fetch(self, conn: Connection, reader: Reader) -> None:
        fetch = reader.fetch()
        reader.done()
        self._respond(conn, [self._part(conn, fetch)], None)

    def _multifetch(self, conn: Connection, reader: Reader) -> None:
        count = reader.int16()
        if not 0 <= count <= MAX_FETCHES:
            raise ProtocolError(f"MULTIFETCH of {count} fetches (at most {MAX_FETCHES})")
        fetches = [reader.fetch() for _ in range(count)]
        reader.done()
        parts: list[_Part] = []
        held = 0
        try:
            for fetch in fetches:
                part = self._part(conn, fetch)
                parts.append(part)
                if isinstance(part, Span):
                    if held < FILES_PER_CONNECTION:
                        held += 1
                    else:
                        part.close()  # opened again when its turn comes
        except BaseException:
            for part in parts:
                if isinstance(part, Span):
                    part.close()
            raise
        self._respond(conn, parts, wire.NO_ERROR)

    def _part(self, conn: Connection, fetch: Fetch) -> _Part:
        """One fetch's answer: an error code and bytes, or a span of a segment file."""
        if fetch.max_bytes < 0:
            return self._error(conn, wire.INVALID_FETCH_SIZE, KlError(f"fetch size {fetch.max_bytes} is negative"))
        try:
            config = self._topic(conn, fetch.topic, fetch.partition, "READ")
            if config is None:
                return (wire.NO_ERROR, b"")  # Kafka 0.7: an unknown topic is an empty set
            if not conn.kl and getattr(config, "format", KL_FORMAT) == KL_FORMAT:
                return self._error(conn, wire.FORMAT_NOT_UNDERSTOOD, KlError(f"topic {fetch.topic} is in kl's format"))
            span = self.server.root.log(fetch.topic, fetch.partition).span(fetch.offset, fetch.max_bytes)
        except (_Refused, KlError) as e:
            return self._error(conn, *_coded(e))
        if span is None:
            return (wire.NO_ERROR, b"")
        self.server.metrics.topic(fetch.topic).bytes_out.inc(span[2])
        return Span(*span)

    def _offsets(self, conn: Connection, reader: Reader) -> None:
        topic = reader.string()
        partition, time_ms, max_offsets = reader.unpack(wire.PARTITION_TIME_COUNT)
        reader.done()
        try:
            if self._topic(conn, topic, partition, "DESCRIBE") is None:
                offsets = [0] if time_ms in (-1, -2) else []  # Kafka 0.7's getEmptyOffsets
            else:
                offsets = self.server.root.log(topic, partition).offsets_before(time_ms, max(0, max_offsets))
        except (_Refused, KlError) as e:
            self._reply_error(conn, *_coded(e), b"\0\0\0\0")
            return
        body = wire.INT32.pack(len(offsets)) + b"".join(wire.INT64.pack(o) for o in offsets)
        self._reply(conn, wire.NO_ERROR, body)

    def _produce(self, conn: Connection, reader: Reader) -> None:
        produce = reader.produce()
        reader.done()
        self._append_all(conn, [produce])

    def _multiproduce(self, conn: Connection, reader: Reader) -> None:
        count = reader.int16()
        if count < 0:
            raise ProtocolError(f"MULTIPRODUCE of {count} sets")
        produces = [reader.produce() for _ in range(count)]
        reader.done()
        self._append_all(conn, produces)

    def _append_all(self, conn: Connection, produces: Iterable[wire.Produce]) -> None:
        """Kafka 0.7's produce has no answer: a refused set closes the connection, logged.
        Every set is checked before any is appended, so a request is refused whole."""
        checked = []
        for p in produces:
            try:
                checked.append((p, *self._checked(conn, p.topic, p.partition, p.data, None)))
            except (_Refused, KlError) as e:
                self._answered_with(_coded(e)[0])  # (no answer: the connection is closed)
                raise Drop(f"produce to {p.topic}/{p.partition} refused: {_coded(e)[1]}") from None
        for p, partition, batch in checked:
            self.server.root.log(p.topic, partition).append(batch)
            self._appended(p.topic, batch)

    def _checked(self, conn: Connection, topic: str, partition: int, data: bytes, count: int | None) -> tuple[int, Checked]:
        """The partition a set goes to (Kafka 0.7's -1: a random one) and the set checked,
        once produce is allowed there; ``count``: what the client says it holds."""
        if not self.server.config.allow_produce:
            raise _Refused(wire.NOT_ALLOWED, KlError("produce is off on this server (kl serve --allow-produce)"))
        if partition == -1:
            config = self._topic(conn, topic, 0, "WRITE", strict=True)
            assert config is not None
            partition = random.randrange(config.partitions)
        config = self._topic(conn, topic, partition, "WRITE", strict=True)
        assert config is not None
        batch = validate(data, getattr(config, "format", KL_FORMAT), config.max_message_bytes, headers=config.holds_headers)
        if count is not None and count != batch.count:
            raise _Refused(wire.INVALID_MESSAGE, KlError(f"the set holds {batch.count} messages, not {count}"))
        return partition, batch

    def _hello(self, conn: Connection, reader: Reader) -> None:
        reader.int16()
        reader.string()
        self._reply(conn, wire.NO_ERROR, wire.INT16.pack(wire.VERSION) + wire.string("kl"))

    def _topics(self, conn: Connection, reader: Reader) -> None:
        reader.done()
        parts = []
        try:
            names = [
                n
                for n in self.server.root.topics()
                if self.server.served(n) and self.server.allows(conn, "DESCRIBE", "TOPIC", n, logged=False)
            ]
        except KlError as e:
            self._reply_error(conn, *_coded(e))
            return
        for name in names:
            try:
                config = self.server.topic_config(name)  # a topic created again: the new creation's id
            except KlError:
                continue
            parts.append(wire.string(name) + wire.string(config.to_json().decode()))
        self._reply(conn, wire.NO_ERROR, wire.INT32.pack(len(parts)) + b"".join(parts))

    def _describe(self, conn: Connection, reader: Reader) -> None:
        topic = reader.string()
        reader.done()
        try:
            self._topic(conn, topic, 0, "DESCRIBE", strict=True)
            info = self.server.root.describe(topic)
        except (_Refused, KlError) as e:
            self._reply_error(conn, *_coded(e))
            return
        parts = [
            wire.PARTITION_INFO.pack(p.segments, p.log_start_offset, p.log_end_offset, p.size_in_bytes) for p in info.partitions
        ]
        body = wire.string(info.config.to_json().decode()) + wire.INT32.pack(len(parts)) + b"".join(parts)
        self._reply(conn, wire.NO_ERROR, body)

    def _offset_for_time(self, conn: Connection, reader: Reader) -> None:
        self._lookup(conn, reader, lambda log, value: log.offset_for_time(value))

    def _offset_back(self, conn: Connection, reader: Reader) -> None:
        self._lookup(conn, reader, lambda log, value: wire.OFFSET_SKIP.pack(*log.position_back(value)))

    def _check_offset(self, conn: Connection, reader: Reader) -> None:
        self._lookup(conn, reader, lambda log, value: log.check_offset(value))

    def _kafka_offset(self, conn: Connection, reader: Reader) -> None:
        self._lookup(conn, reader, lambda log, value: log.kafka_offset(value))

    def _lookup(self, conn: Connection, reader: Reader, call) -> None:  # type: ignore[no-untyped-def]
        topic = reader.string()
        partition, value = reader.unpack(wire.PARTITION_INT64)
        reader.done()
        try:
            self._topic(conn, topic, partition, "DESCRIBE", strict=True)
            result = call(self.server.root.log(topic, partition), value)
        except (_Refused, KlError) as e:
            self._reply_error(conn, *_coded(e))
            return
        if isinstance(result, int):
            result = wire.INT64.pack(result)
        self._reply(conn, wire.NO_ERROR, b"" if result is None else result)

    def _append_request(self, conn: Connection, reader: Reader) -> None:
        topic = reader.string()
        partition, fsync, count, size = reader.unpack(wire.APPEND_HEAD)
        data = bytes(reader.take(size))
        reader.done()
        try:
            partition, batch = self._checked(conn, topic, partition, data, count)
            offset = self.server.root.log(topic, partition).append(batch, fsync=bool(fsync))
        except (_Refused, KlError) as e:
            self._reply_error(conn, *_coded(e))
            return
        self._appended(topic, batch)
        self._reply(conn, wire.NO_ERROR, wire.INT64.pack(offset))

    def _append_all_request(self, conn: Connection, reader: Reader) -> None:
        fsync, count = reader.unpack(wire.FSYNC_COUNT)
        if not 0 <= count <= MAX_FETCHES:
            raise ProtocolError(f"APPEND_ALL of {count} sets (at most {MAX_FETCHES})")
        sets = []
        for _ in range(count):
            topic = reader.string()
            partition, messages, size = reader.unpack(wire.PARTITION_COUNT_SIZE)
            sets.append((topic, partition, bytes(reader.take(size)), messages))
        reader.done()
        try:
            appends = []
            for topic, partition, data, messages in sets:
                partition, batch = self._checked(conn, topic, partition, data, messages)
                appends.append((self.server.root.log(topic, partition), batch))
            if len({id(target) for target, _ in appends}) < len(appends):
                raise _Refused(wire.KL_ERROR, KlError("APPEND_ALL names a partition twice"))
            offsets = append_all(appends, fsync=bool(fsync))
        except (_Refused, KlError) as e:
            self._reply_error(conn, *_coded(e))
            return
        for (topic, _, _, _), (_, batch) in zip(sets, appends, strict=True):
            self._appended(topic, batch)
        self._reply(conn, wire.NO_ERROR, wire.INT32.pack(len(offsets)) + b"".join(map(wire.INT64.pack, offsets)))

    # ----------------------------------------------------------------- helpers

    def _topic(self, conn: Connection, topic: str, partition: int, operation: str, *, strict: bool = False) -> TopicConfig | None:
        """The topic's config after the checks every request gets, ``operation`` (Kafka's
        ACL operation) allowed on it; None for an unknown topic asked by a Kafka 0.7
        client, which gets Kafka 0.7's answer to it."""
        try:
            validate_name(topic)
        except InvalidTopicName as e:
            raise _Refused(wire.UNKNOWN if not conn.kl else wire.KL_ERROR, e) from None
        if not self.server.served(topic):
            raise _Refused(wire.NOT_ALLOWED, KlError(f"topic {topic} is not served here (kl serve --topics)"))
        if not self.server.allows(conn, operation, "TOPIC", topic):
            raise _Refused(wire.NOT_ALLOWED, KlError(f"{conn.principal} may not {operation.lower()} topic {topic} (kl acls)"))
        try:
            config = self.server.topic_config(topic)
        except TopicNotFound as e:
            if conn.kl or strict:
                raise _Refused(wire.TOPIC_NOT_FOUND, e) from None
            return None
        if not 0 <= partition < config.partitions:
            error = TopicNotFound(f"topic {topic!r} has partitions 0 to {config.partitions - 1}, not {partition}")
            raise _Refused(wire.WRONG_PARTITION if not conn.kl else wire.TOPIC_NOT_FOUND, error)
        return config

    @staticmethod
    def _code(conn: Connection, code: int) -> int:
        """kl's catch-all code is Kafka 0.7's unknown error on a Kafka 0.7 connection."""
        return wire.UNKNOWN if code == wire.KL_ERROR and not conn.kl else code

    def _error(self, conn: Connection, code: int, error: BaseException) -> _Part:
        return (self._code(conn, code), wire.error_payload(error)[1] if conn.kl else b"")

    def _appended(self, topic: str, batch: Checked) -> None:
        self.server.metrics.topic(topic).appended(len(batch.data), batch.count)

    def _reply(self, conn: Connection, code: int, body: bytes) -> None:
        self._answered_with(code)
        self.server.queue(conn, memoryview(wire.HEAD.pack(2 + len(body), code) + body))

    def _reply_error(self, conn: Connection, code: int, error: BaseException, plain: bytes = b"") -> None:
        """An error answer: the JSON on a kl connection, Kafka 0.7's ``plain`` bytes on another."""
        self._reply(conn, self._code(conn, code), wire.error_payload(error)[1] if conn.kl else plain)

    def _respond(self, conn: Connection, parts: list[_Part], outer: int | None) -> None:
        """Answer with parts as ``size error payload`` each (under one more header when
        ``outer`` is a code: MULTIFETCH); segment spans go by ``os.sendfile``.  Spans are
        cut short where the response would pass an int32's size."""
        room = MAX_PAYLOAD
        pieces: list[memoryview | Span] = []
        for part in parts:
            self._answered_with(wire.NO_ERROR if isinstance(part, Span) else part[0])
            room -= 0 if outer is None else wire.HEAD.size
            if isinstance(part, Span):
                part.count = max(0, min(part.count, room))
                pieces.append(memoryview(wire.HEAD.pack(2 + part.count, wire.NO_ERROR)))
                if part.count:
                    pieces.append(part)
                else:
                    part.close()
                room -= part.count
            else:
                pieces.append(memoryview(wire.HEAD.pack(2 + len(part[1]), part[0]) + part[1]))
                room -= len(part[1])
        if outer is not None:
            pieces.insert(0, memoryview(wire.HEAD.pack(2 + MAX_PAYLOAD - room, outer)))
        self.server.queue(conn, *pieces)


_Part = tuple[int, bytes] | Span


class _Meter(NamedTuple):
    """A request type's name and its metrics' children."""

    name: str
    requests: Any
    time: Any


class _Refused(Exception):
    def __init__(self, code: int, error: BaseException):
        self.code = code
        self.error = error


def _coded(error: KlError | _Refused) -> tuple[int, BaseException]:
    """The code and error to answer with: a refusal's own, or the one ``wire`` gives a ``KlError``."""
    return (error.code, error.error) if isinstance(error, _Refused) else (wire.error_payload(error)[0], error)


HANDLERS = {
    wire.PRODUCE: Kafka07._produce,
    wire.FETCH: Kafka07._fetch,
    wire.MULTIFETCH: Kafka07._multifetch,
    wire.MULTIPRODUCE: Kafka07._multiproduce,
    wire.OFFSETS: Kafka07._offsets,
    wire.HELLO: Kafka07._hello,
    wire.TOPICS: Kafka07._topics,
    wire.OFFSET_FOR_TIME: Kafka07._offset_for_time,
    wire.APPEND: Kafka07._append_request,
    wire.OFFSET_BACK: Kafka07._offset_back,
    wire.CHECK_OFFSET: Kafka07._check_offset,
    wire.DESCRIBE: Kafka07._describe,
    wire.APPEND_ALL: Kafka07._append_all_request,
    wire.KAFKA_OFFSET: Kafka07._kafka_offset,
    wire.AUTHENTICATE: Kafka07._authenticate,
}
