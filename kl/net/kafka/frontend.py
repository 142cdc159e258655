"""Today's Kafka protocol, the front end of ``kl serve --kafka``: each request decoded,
handed to its family's handler (one module per family, each declaring the versions it
serves: ``produce``, ``fetch``, ``list_offsets``, ``metadata``, ``groups``, ``topics``,
``configs``, ``sasl``, ``users``, ...) and the answer encoded.  On a SASL listener a
connection authenticates first (``sasl``).

Requests and responses are encoded by kafka-python's protocol classes, generated from
Kafka's own message schemas (``kafka.protocol``); the records inside them by
``kl.net.kafka.records`` and the core.  Why kafka-python's: it covers every version of every
request from the schemas (no hand-written structs), compiles an encoder and a decoder per
version, is pure Python with no dependencies and runs on Python 3.10 (``kio``, the other
schema-generated codec, needs 3.11).  Measured here: decoding a 1 MiB Produce request
takes 0.2 ms and encoding a 1 MiB Fetch answer about as long, against 1.5 ms to convert
its records; the records fields are opaque bytes to it, so the per-message work is kl's.

Offsets are Kafka offsets, one per message since the partition began (the log's counts
and offset indexes, ``Log.kafka_position``), and idempotent producers' batches are
appended once by the partition's producer journal (``kl.log.producers``).  Specified in
``man/kl-protocol.5`` and ``man/kl-serve.1`` (the versions advertised, and why).
"""

from __future__ import annotations

import functools
import importlib
import logging
import pkgutil
import struct
import time
from typing import Any, NamedTuple

import kafka.errors
from kafka.protocol.api_message import ApiMessage
from kafka.protocol.metadata.api_versions import ApiVersionsRequest, ApiVersionsResponse
from kafka.protocol.schemas.fields.codecs.types import UnsignedVarInt32

from kl.net import wire
from kl.net.kafka import (
    acls,
    cluster,
    configs,
    delete_records,
    errors,
    fetch,
    groups,
    list_offsets,
    metadata,
    produce,
    sasl,
    topics,
    transactions,
    users,
)
from kl.net.kafka.api import Api, Spliced
from kl.net.kafka.broker import Broker
from kl.net.kafka.errors import NONE, UNSUPPORTED_VERSION
from kl.net.kafka07 import Kafka07
from kl.net.metrics import Metrics
from kl.net.server import Connection, Drop, FrontEnd, Server, Wait

log = logging.getLogger("kl.serve")

HEADER = struct.Struct(">hhi")
"""api_key, api_version, correlation_id: the start of every request."""


class Kafka(FrontEnd):
    """Answers today's Kafka clients (``kl serve --kafka``)."""

    def __init__(self, server: Server, broker: Broker | None = None):
        super().__init__(server)
        self.owner = broker is None
        """Whether the broker is this front end's (else another listener's, which it shares)."""
        self.broker = broker or Broker(server)
        self._meters: dict[tuple[int, int], _Meter] = {}
        """(API key, version) -> its metrics' children (``_meter``)."""

    def listening(self, address: str, port: int) -> None:
        self.broker.listening(address, port, self)
        security = self.server.security.get(self, "PLAINTEXT")
        log.info("serving %s to Kafka clients on %s:%d (%s)", self.server.root.path, address, port, security)

    def stopping(self) -> None:
        if self.owner:
            self.broker.groups.resign()

    def close(self) -> None:
        if self.owner:
            self.broker.groups.close()

    def closed(self, conn: Connection) -> None:
        self.broker.groups.hung_up(conn)
        self.broker.sasl.forget(conn)

    # ----------------------------------------------------------------- requests

    def handle(self, conn: Connection, request: memoryview) -> None:
        if self.broker.sasl.bare(conn):  # a SASL token after SaslHandshake v0
            self._answer(conn, sasl.BARE, 0, 0, bytes(request), None)
            return
        if _kl_hello(request):
            self._kl_client(conn)
            return
        if len(request) < HEADER.size + 2:
            raise Drop(f"a request of {len(request)} bytes is shorter than its header")
        key, version, correlation = HEADER.unpack_from(request)
        api = APIS.get(key)
        self.broker.sasl.admit(conn, key, version, api)
        if key == API_VERSIONS and not api.low <= version <= api.high:  # type: ignore[union-attr]
            self.server.metrics.errors.labels("ApiVersions", "UNSUPPORTED_VERSION").inc()
            self._send(conn, correlation, ApiVersionsResponse(error_code=UNSUPPORTED_VERSION, api_keys=_api_keys()), 0, False)
            return
        if api is None:
            self._unsupported(conn, key, version, correlation)
            return
        if not api.low <= version <= api.high:
            # Kafka's brokers close the connection on a version they do not serve (Kafka 4
            # on OffsetCommit v0-1, ...): an answer without an error code to carry
            # UNSUPPORTED_VERSION would be empty, which a client reads as nothing refused
            # (kafka-go's Conn, on Produce v2: "reading a response left 4 unread bytes").
            raise Drop(f"{api.request.name} v{version} is not served here (versions {api.low}-{api.high})")
        flexible = api.request.flexible_version_q(version)
        pos, conn.client = _header(request, flexible)
        try:
            body = api.request.decode(request[pos:], version=version)
        except Exception as e:  # kafka-python's decoders raise what the bytes make them raise
            raise Drop(f"malformed {api.request.name} v{version}: {type(e).__name__}: {e}") from None
        if (null := _null_array(api.request._struct, body, version)) is not None:
            raise Drop(f"malformed {api.request.name} v{version}: its {null} array is null")
        self._answer(conn, api, version, correlation, body, None)

    def _kl_client(self, conn: Connection) -> None:
        """A kl client's HELLO: answered in kl's protocol with where kl's clients are served
        (Kafka 0.7's port), and the connection closed."""
        host, port = conn.sock.getsockname()[:2]
        doors = self.server.doors(Kafka07)
        instead = f"kl's clients connect to {', '.join(doors)}" if doors else "no port here serves them (kl serve --port)"
        refusal = wire.NetworkError(f"{host}:{port} serves today's Kafka protocol (kl serve --kafka), not kl's: {instead}")
        log.warning("closed %s: a kl client connected to a Kafka protocol port (%s)", conn.peer, instead)
        code, payload = wire.error_payload(refusal)
        self.server.queue(conn, memoryview(wire.HEAD.pack(2 + len(payload), code) + payload))
        conn.hang_up = True

    def resume(self, conn: Connection, wait: Wait) -> None:
        api, version, correlation, body = wait.request  # type: ignore[misc]
        self._answer(conn, api, version, correlation, body, wait)  # type: ignore[has-type]

    def _answer(self, conn: Connection, api: Api, version: int, correlation: int, body: Any, wait: Wait | None) -> None:
        response = api.handler(self.broker, conn, version, body, wait)
        if conn.wait is not None:  # parked: answered by resume
            conn.wait.request = (api, version, correlation, body)
            return
        meter = self._meters.get((api.key, version)) or self._meter(api, version)
        meter.requests.inc()
        meter.time.observe((time.monotonic() - conn.last_active) * 1000)  # (the request's last byte came then)
        if response is None:
            return  # produce with acks 0: no answer
        codes: dict[int, int] = {}
        _error_codes(meter.errors, response.message if isinstance(response, Spliced) else response, codes)
        for code, count in codes.items():
            counter = meter.by_code.get(code)
            if counter is None:
                counter = meter.by_code[code] = self.server.metrics.errors.labels(meter.name, _error_name(code))
            counter.inc(count)
        flexible = api.response.flexible_version_q(version) and api.request is not ApiVersionsRequest
        self._send(conn, correlation, response, version, flexible)

    def _meter(self, api: Api, version: int) -> _Meter:
        metrics: Metrics = self.server.metrics
        name = api.request.name.removesuffix("Request")  # Kafka's name of the request (its ApiKeys)
        meter = _Meter(
            name,
            metrics.requests.labels(name, str(version)),
            metrics.total_time.labels(name),
            _errors_in(api.response._struct, version),
            {},
        )
        self._meters[(api.key, version)] = meter
        return meter

    def _unsupported(self, conn: Connection, key: int, version: int, correlation: int) -> None:
        """Answer a request of a type kl does not serve (nor advertise) with UNSUPPORTED_VERSION
        where its response has an error code for the whole request (its other fields
        empty); else close the connection, as Kafka's brokers do: an answer of empty lists
        would read as nothing refused."""
        response = _responses().get(key)
        if response is None or not 0 <= version <= response.max_version:
            raise Drop(f"request type {key} version {version} is not one kl or kafka-python knows")
        answer = response()
        if not hasattr(answer, "error_code"):
            raise Drop(f"{response.name} v{version} is not served here (nor advertised)")
        log.warning("%s: %s v%d is not served here: answered UNSUPPORTED_VERSION", conn.peer, response.name, version)
        answer.error_code = UNSUPPORTED_VERSION
        self.server.metrics.errors.labels(response.name.removesuffix("Response"), "UNSUPPORTED_VERSION").inc()
        self._send(conn, correlation, answer, version, response.flexible_version_q(version))

    def _send(self, conn: Connection, correlation: int, response: ApiMessage | Spliced, version: int, flexible: bool) -> None:
        if not isinstance(response, Spliced):
            response = Spliced(response)
        try:
            pieces = _spliced(response, response.message.encode(version=version), flexible)
            size = 4 + int(flexible) + sum(piece.nbytes for piece in pieces)
            head = struct.pack(">ii", size, correlation) + (b"\0" if flexible else b"")
            self.server.queue(conn, memoryview(head), *pieces)  # TCP_CORK makes one stream
        finally:
            self.server.unreserve(response.reserved)


class _Meter(NamedTuple):
    """A request type and version's metrics: its name, its counter and latency children,
    where its answer's error codes are (``_errors_in``)."""

    name: str
    requests: Any
    time: Any
    errors: tuple[tuple[str, Any, bool], ...]
    by_code: dict[int, Any]
    """Error code -> its counter's child, as met."""


def _errors_in(struct: Any, version: int) -> tuple[tuple[str, Any, bool], ...]:
    """Where a message of the schema ``struct`` holds error codes in ``version``: for each
    field that is one or holds some, (its name, what is inside: None for the code itself,
    whether it is an array).  Found once per request type and version (``_meter``)."""
    found: list[tuple[str, Any, bool]] = []
    for field in struct.fields.values():
        if not field.for_version_q(version):
            continue
        if field.name == "error_code":
            found.append((field.name, None, False))
        elif field.is_struct_array() or field.is_struct():
            many = field.is_struct_array()
            inner = _errors_in(field.array_of if many else field, version)
            if inner:
                found.append((field.name, inner, many))
    return tuple(found)


def _error_codes(where: tuple[tuple[str, Any, bool], ...], data: Any, codes: dict[int, int]) -> None:
    """Count into ``codes`` the error codes of ``data`` found where ``_errors_in`` says."""
    for name, inner, many in where:
        value = getattr(data, name, None)
        if inner is None:
            if value is not None:
                codes[value] = codes.get(value, 0) + 1
        elif value is not None:
            for item in value if many else (value,):
                _error_codes(inner, item, codes)


@functools.cache
def _error_name(code: int) -> str:
    """Kafka's name of an error code (its Errors enum): NONE, UNKNOWN_TOPIC_OR_PARTITION, ..."""
    ours = next((name for name, value in vars(errors).items() if name.isupper() and value == code), None)
    if ours is not None:  # the codes kl answers with, by Kafka's names
        return ours
    known = kafka.errors.kafka_errors.get(code)
    return str(known.message) if known is not None else str(code)


def _spliced(answer: Spliced, data: bytes | bytearray, flexible: bool) -> list[memoryview]:
    """The encoded message with each mark (a bytes field of 16 bytes: its length before
    it) replaced by the length and the bytes it stands for."""
    view = memoryview(data)
    marked = struct.pack(">i", 16) if not flexible else UnsignedVarInt32.encode(17)  # (compact: length + 1)
    pieces, done = [], 0
    for at, mark in sorted((data.find(mark), mark) for mark in answer.parts):
        start = at - len(marked)
        if at < 0 or view[start:at] != marked:
            raise RuntimeError(f"a spliced field's mark is not where its encoding puts it ({at})")
        part = answer.parts[mark]
        length = struct.pack(">i", len(part)) if not flexible else UnsignedVarInt32.encode(len(part) + 1)
        pieces += [view[done:start], memoryview(length), memoryview(part)]
        done = at + len(mark)
    pieces.append(view[done:])
    return pieces


def api_versions(broker: Broker, conn: Connection, version: int, request: Any, wait: Wait | None) -> Any:
    return ApiVersionsResponse(error_code=NONE, api_keys=_api_keys(), throttle_time_ms=0)


def _kl_hello(request: memoryview) -> bool:
    """Whether a request is kl's HELLO (``kl.net.wire``: type, version, a string, no more),
    which no Kafka request can be (no API key is 100)."""
    if len(request) < 6 or wire.INT16.unpack_from(request)[0] != wire.HELLO:
        return False
    return len(request) == 6 + wire.INT16.unpack_from(request, 4)[0]


def _header(request: memoryview, flexible: bool) -> tuple[int, str | None]:
    """Where the body starts (after the client id and, in flexible versions, the tagged
    fields), and the client id."""
    pos = HEADER.size
    (length,) = struct.unpack_from(">h", request, pos)
    client = None if length < 0 else bytes(request[pos + 2 : pos + 2 + length]).decode("utf-8", "replace")
    pos += 2 + max(0, length)
    if flexible:
        count, pos = _uvarint(request, pos)
        for _ in range(count):
            _, pos = _uvarint(request, pos)
            size, pos = _uvarint(request, pos)
            pos += size
    if pos > len(request):
        raise Drop("a request's header runs past its end")
    return pos, client


def _null_array(struct: Any, data: Any, version: int) -> str | None:
    """The name of an array in ``data`` that is null where its schema says it never is
    (kafka-python decodes a length of -1 as null whatever the schema says), else None."""
    for field in struct.fields.values():
        if not field.is_array() or not field.for_version_q(version) or field.tagged_field_q(version):
            continue
        items = getattr(data, field.name)
        if items is None:
            if not field.nullable_for_version_q(version):
                return str(field.name)
        elif field.is_struct_array():
            for item in items:
                if (found := _null_array(field.array_of, item, version)) is not None:
                    return found
    return None


def _uvarint(buf: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf) or shift > 28:
            raise Drop("a request's header holds a bad varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


@functools.cache
def _responses() -> dict[int, Any]:
    """Every response class kafka-python has, by API key."""
    for group in ("admin", "consumer", "metadata", "producer"):
        package = importlib.import_module(f"kafka.protocol.{group}")
        for module in pkgutil.iter_modules(package.__path__):
            importlib.import_module(f"{package.__name__}.{module.name}")
    found = {}
    pending = [ApiMessage]
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if cls is not ApiMessage and getattr(cls, "_class_version", None) is None and cls.type == "response":
            found[cls.API_KEY] = cls
    return found


def _api_keys() -> list[Any]:
    key = ApiVersionsResponse.ApiVersion
    return [key(api_key=k, min_version=a.low, max_version=a.high) for k, a in sorted(APIS.items())]


API_VERSIONS = ApiVersionsRequest.API_KEY
APIS = {
    api.key: api
    for api in [
        Api(ApiVersionsRequest, ApiVersionsResponse, 0, 3, api_versions),
        *produce.APIS,
        *fetch.APIS,
        *list_offsets.APIS,
        *metadata.APIS,
        *groups.APIS,
        *topics.APIS,
        *configs.APIS,
        *delete_records.APIS,
        *cluster.APIS,
        *transactions.APIS,
        *acls.APIS,
        *sasl.APIS,
        *users.APIS,
    ]
}
"""What kl answers, by API key, and the versions it advertises (see kl-serve(1))."""
