"""Kafka 0.7's wire protocol, with kl's additions: request and response codecs and a client connection.

Specified in ``man/kl-protocol.5``.  Every request is ``size:int32`` then ``type:int16``
and a body; every response is ``size:int32 error:int16`` and a payload.  Integers are
big-endian; a string is ``length:int16`` and UTF-8 bytes.  Types 0-4 are Kafka 0.7's;
kl's own start at 100.  A connection that has sent ``HELLO`` is a kl connection: an
error on it carries a JSON object naming the exception (kl's client raises the same
class as a local call would); a Kafka 0.7 client gets Kafka 0.7's answer.
"""

from __future__ import annotations

import json
import socket
import ssl
import struct
from collections.abc import Sequence
from typing import Any, NamedTuple

from kl import errors
from kl.errors import KlError
from kl.net.frames import ProtocolError

PRODUCE = 0
FETCH = 1
MULTIFETCH = 2
MULTIPRODUCE = 3
OFFSETS = 4
HELLO = 100
"""kl: ``version:int16 client:string`` -> ``version:int16 server:string``; marks a kl connection."""
TOPICS = 101
"""kl: no body -> ``count:int32`` then per topic ``name:string config:string`` (topic.json's JSON)."""
OFFSET_FOR_TIME = 102
"""kl: ``topic partition:int32 time:int64`` -> ``offset:int64``, from message timestamps."""
APPEND = 103
"""kl: ``topic partition:int32 fsync:int8 count:int32 size:int32 set`` -> ``offset:int64`` where it starts;
``count`` is the number of messages, a compressed batch counting its inner ones."""
OFFSET_BACK = 104
"""kl: ``topic partition:int32 count:int64`` -> ``offset:int64 skip:int32``: the last count messages are read
from offset after its first skip messages (inner ones of a compressed batch; an older server sends no skip)."""
CHECK_OFFSET = 105
"""kl: ``topic partition:int32 offset:int64`` -> empty; an error unless a message starts there."""
DESCRIBE = 106
"""kl: ``topic`` -> ``config:string count:int32`` then per partition ``segments:int32 log_start:int64
log_end:int64 size:int64`` (what ``kl topics describe`` shows)."""
APPEND_ALL = 107
"""kl: ``fsync:int8 count:int16`` then per set ``topic partition:int32 count:int32 size:int32 set`` ->
``count:int32`` then ``offset:int64`` per set: sets for distinct partitions, appended all at once or none
(``kl.log.log.append_all``).  Servers of version 2 on."""
KAFKA_OFFSET = 108
"""kl: ``topic partition:int32 offset:int64`` -> ``kafka_offset:int64``: the Kafka offset of the message at
``offset`` (a message start, or the log end: the next message's; unchecked, as ``Log.kafka_offset``: one
inside a message names the next).  Servers of version 3 on."""
AUTHENTICATE = 109
"""kl: ``mechanism:string size:int32 token`` -> ``size:int32 token``: one step of a SASL exchange (PLAIN,
SCRAM-SHA-256, SCRAM-SHA-512), on a port that requires it (``kl serve --sasl``) before any request but HELLO.
A failure is ``AuthenticationFailed``, the same for an unknown user as for a wrong password, and closes the
connection.  Servers of version 4 on."""
NAMES = {
    PRODUCE: "PRODUCE",
    FETCH: "FETCH",
    MULTIFETCH: "MULTIFETCH",
    MULTIPRODUCE: "MULTIPRODUCE",
    OFFSETS: "OFFSETS",
    HELLO: "HELLO",
    TOPICS: "TOPICS",
    OFFSET_FOR_TIME: "OFFSET_FOR_TIME",
    APPEND: "APPEND",
    OFFSET_BACK: "OFFSET_BACK",
    CHECK_OFFSET: "CHECK_OFFSET",
    DESCRIBE: "DESCRIBE",
    APPEND_ALL: "APPEND_ALL",
    KAFKA_OFFSET: "KAFKA_OFFSET",
    AUTHENTICATE: "AUTHENTICATE",
}
VERSION = 4
"""kl's protocol version, sent in HELLO: 2 has APPEND_ALL, 3 KAFKA_OFFSET, 4 AUTHENTICATE."""

# Error codes: Kafka 0.7's (kafka.common.ErrorMapping), then kl's.
NO_ERROR = 0
UNKNOWN = -1
OFFSET_OUT_OF_RANGE = 1
INVALID_MESSAGE = 2
WRONG_PARTITION = 3
INVALID_FETCH_SIZE = 4
TOPIC_NOT_FOUND = 100
INVALID_OFFSET = 101
FORMAT_NOT_UNDERSTOOD = 102
"""A Kafka 0.7 client (no ``HELLO``) asked for a topic in kl's format, which it would misparse."""
NOT_ALLOWED = 103
"""Produce is off, or the topic is not served (``kl serve --allow-produce``, ``--topics``)."""
KL_ERROR = 104
"""Any other kl error; the JSON names it."""
CODE_NAMES = {
    NO_ERROR: "NO_ERROR",
    UNKNOWN: "UNKNOWN",
    OFFSET_OUT_OF_RANGE: "OFFSET_OUT_OF_RANGE",
    INVALID_MESSAGE: "INVALID_MESSAGE",
    WRONG_PARTITION: "WRONG_PARTITION",
    INVALID_FETCH_SIZE: "INVALID_FETCH_SIZE",
    TOPIC_NOT_FOUND: "TOPIC_NOT_FOUND",
    INVALID_OFFSET: "INVALID_OFFSET",
    FORMAT_NOT_UNDERSTOOD: "FORMAT_NOT_UNDERSTOOD",
    NOT_ALLOWED: "NOT_ALLOWED",
    KL_ERROR: "KL_ERROR",
}
"""Each error code's name (the daemon's metrics label answers by them)."""

_CODES: dict[type[KlError], int] = {
    errors.OffsetOutOfRange: OFFSET_OUT_OF_RANGE,
    errors.CorruptMessage: INVALID_MESSAGE,
    errors.InvalidMessageSet: INVALID_MESSAGE,
    errors.MessageTooLarge: INVALID_MESSAGE,
    errors.TopicNotFound: TOPIC_NOT_FOUND,
    errors.InvalidOffset: INVALID_OFFSET,
}

HEAD = struct.Struct(">ih")
"""A request's size and type, or a response's size and error code."""
INT16 = struct.Struct(">h")
INT32 = struct.Struct(">i")
INT64 = struct.Struct(">q")
PARTITION_OFFSET_SIZE = struct.Struct(">iqi")
PARTITION_TIME_COUNT = struct.Struct(">iqi")
PARTITION_INT64 = struct.Struct(">iq")
OFFSET_SKIP = struct.Struct(">qi")
"""OFFSET_BACK's answer."""
PARTITION_INFO = struct.Struct(">iqqq")
"""DESCRIBE's answer per partition: segments, log start, log end, bytes."""
APPEND_HEAD = struct.Struct(">ibii")
"""partition, fsync, count, size of an APPEND."""
FSYNC_COUNT = struct.Struct(">bh")
"""fsync and the number of sets of an APPEND_ALL."""
PARTITION_COUNT_SIZE = struct.Struct(">iii")
"""partition, count, size of one set of an APPEND_ALL."""
MAX_RESPONSE = 1 << 31
"""Kafka 0.7's sizes are int32."""


CLOSED = "closed the connection"


class ServerError(KlError):
    """The server answered a request with an error this client has no class for."""


class NetworkError(KlError):
    """The server cannot be reached, or the connection broke or timed out."""


class AuthenticationFailed(KlError):
    """The server refused the client's credentials, or requires some it was not given."""


class Fetch(NamedTuple):
    topic: str
    partition: int
    offset: int
    max_bytes: int


class Produce(NamedTuple):
    topic: str
    partition: int
    data: bytes


# ------------------------------------------------------------------ encoding


def string(text: str) -> bytes:
    raw = text.encode()
    if len(raw) > 0x7FFF:
        raise ProtocolError(f"string of {len(raw)} bytes does not fit a Kafka 0.7 string")
    return INT16.pack(len(raw)) + raw


def request(kind: int, body: bytes) -> bytes:
    """A whole request: size, type, body."""
    return HEAD.pack(2 + len(body), kind) + body


def fetch_body(fetch: Fetch) -> bytes:
    return string(fetch.topic) + PARTITION_OFFSET_SIZE.pack(fetch.partition, fetch.offset, fetch.max_bytes)


def multifetch_body(fetches: list[Fetch]) -> bytes:
    return INT16.pack(len(fetches)) + b"".join(fetch_body(f) for f in fetches)


def produce_body(produce: Produce) -> bytes:
    return string(produce.topic) + INT32.pack(produce.partition) + INT32.pack(len(produce.data)) + produce.data


def offsets_body(topic: str, partition: int, time_ms: int, max_offsets: int) -> bytes:
    return string(topic) + PARTITION_TIME_COUNT.pack(partition, time_ms, max_offsets)


def partition_int64_body(topic: str, partition: int, value: int) -> bytes:
    """The body of OFFSET_FOR_TIME, OFFSET_BACK and CHECK_OFFSET."""
    return string(topic) + PARTITION_INT64.pack(partition, value)


def append_body(topic: str, partition: int, data: bytes, count: int, fsync: bool) -> bytes:
    return string(topic) + APPEND_HEAD.pack(partition, fsync, count, len(data)) + data


def append_all_body(sets: Sequence[tuple[str, int, bytes, int]], fsync: bool) -> bytes:
    """APPEND_ALL of (topic, partition, set, count) each."""
    parts = [FSYNC_COUNT.pack(fsync, len(sets))]
    for topic, partition, data, count in sets:
        parts += (string(topic), PARTITION_COUNT_SIZE.pack(partition, count, len(data)), data)
    return b"".join(parts)


def error_payload(error: BaseException) -> tuple[int, bytes]:
    """The code and JSON a kl connection gets for ``error``."""
    code = next((c for cls, c in _CODES.items() if isinstance(error, cls)), KL_ERROR)
    detail: dict[str, object] = {"type": type(error).__name__, "message": str(error)}
    if isinstance(error, errors.OffsetOutOfRange):
        detail.update(offset=error.offset, log_start_offset=error.log_start_offset, log_end_offset=error.log_end_offset)
    return code, json.dumps(detail).encode()


# ------------------------------------------------------------------ decoding


class Reader:
    """Fields read one after the other from a request or response body; running past its end is a ``ProtocolError``."""

    __slots__ = ("data", "pos")

    def __init__(self, data: bytes | memoryview, pos: int = 0):
        self.data = data
        self.pos = pos

    def take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.data):
            raise ProtocolError(f"a field of {n} bytes runs past the end of a {len(self.data)}-byte message")
        view = memoryview(self.data)[self.pos : self.pos + n]
        self.pos += n
        return view

    def unpack(self, shape: struct.Struct) -> tuple[int, ...]:
        return shape.unpack(self.take(shape.size))

    def int16(self) -> int:
        return self.unpack(INT16)[0]

    def int32(self) -> int:
        return self.unpack(INT32)[0]

    def int64(self) -> int:
        return self.unpack(INT64)[0]

    def string(self) -> str:
        n = self.int16()
        try:
            return bytes(self.take(n)).decode()
        except UnicodeDecodeError:
            raise ProtocolError("a string is not UTF-8") from None

    def fetch(self) -> Fetch:
        topic = self.string()
        return Fetch(topic, *self.unpack(PARTITION_OFFSET_SIZE))

    def produce(self) -> Produce:
        topic = self.string()
        partition, size = self.int32(), self.int32()
        return Produce(topic, partition, bytes(self.take(size)))

    def rest(self) -> memoryview:
        return self.take(len(self.data) - self.pos)

    def done(self) -> None:
        if self.pos != len(self.data):
            raise ProtocolError(f"{len(self.data) - self.pos} bytes left over after a request")


def raise_error(code: int, payload: bytes | memoryview) -> None:
    """Raise what a kl server's error response means: the same class a local call raises."""
    try:
        detail = json.loads(bytes(payload))
        name, message = detail.pop("type"), detail.pop("message")
    except (ValueError, KeyError, TypeError, AttributeError):
        raise ServerError(f"server error {code}: {bytes(payload)[:200]!r}") from None
    cls = getattr(errors, name, None)
    if not (isinstance(cls, type) and issubclass(cls, KlError)):
        known: dict[str, type[KlError]] = {c.__name__: c for c in (ProtocolError, NetworkError, AuthenticationFailed)}
        cls = known.get(name, ServerError)
    error = cls.__new__(cls)
    Exception.__init__(error, message)
    for key, value in detail.items():
        setattr(error, key, value)
    raise error


# ------------------------------------------------------------------ client
class Login(NamedTuple):
    """What a kl client authenticates with: a SASL mechanism, a user and its password."""

    mechanism: str
    user: str
    password: str

    def __repr__(self) -> str:
        return f"Login({self.mechanism!r}, {self.user!r}, password=...)"


def client_tokens(login: Login) -> Any:
    """The client's side of an exchange, as a generator: it yields each token to send and
    is sent the server's answer to it; a server whose last answer does not prove it knows
    the credential raises ``ValueError``."""
    if login.mechanism == "PLAIN":
        yield f"\0{login.user}\0{login.password}".encode()
        return
    import scramp  # here: a command that does not log in does not load it

    client = scramp.ScramClient([login.mechanism], login.user, login.password)
    answer = yield client.get_client_first().encode()
    client.set_server_first(bytes(answer).decode())
    answer = yield client.get_client_final().encode()
    try:
        client.set_server_final(bytes(answer).decode())
    except (scramp.ScramException, UnicodeDecodeError) as e:
        raise ValueError(f"the server's SCRAM answer does not prove it knows the credential: {e}") from None


def parse_address(address: str, default_port: int = 9092) -> tuple[str, int]:
    """``HOST:PORT`` (or ``HOST``, a bare IPv6 address, or ``[IPv6]:PORT``) as a (host, port) pair."""
    host, sep, port = address.rpartition(":")
    if not sep or "]" in port or (address.count(":") > 1 and not address.startswith("[")):
        host, port = address, str(default_port)
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise errors.InvalidConfig(f"server address {address!r} is not HOST:PORT")
    return host, int(port)


class Connection:
    """One client connection to ``kl serve`` (or a Kafka 0.7 broker, with ``hello=False``).

    Requests are answered in the order they were sent.  Not thread-safe: one
    connection per thread.
    """

    def __init__(
        self,
        address: str | tuple[str, int],
        *,
        timeout: float | None = 30.0,
        hello: bool = True,
        tls: ssl.SSLContext | None = None,
        sasl: Login | tuple[str, str, str] | None = None,
    ):
        """``tls``: over TLS (``kl serve --tls``), the server's certificate checked by that context;
        ``sasl``: authenticated after HELLO with that (mechanism, user, password) (``kl serve --sasl``)."""
        self.address = parse_address(address) if isinstance(address, str) else address
        try:
            self.sock = socket.create_connection(self.address, timeout=timeout)
        except OSError as e:
            raise NetworkError(f"cannot connect to {self.name}: {e.strerror or e}") from None
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if tls is not None:
            try:
                self.sock = tls.wrap_socket(self.sock, server_hostname=self.address[0])
            except OSError as e:
                self.sock.close()
                if isinstance(e, (ssl.SSLEOFError, ConnectionResetError)):
                    reason = "it closed the connection in the handshake (a plaintext port? leave out --tls)"
                else:
                    reason = e.reason if isinstance(e, ssl.SSLError) and e.reason else e.strerror or str(e)
                raise NetworkError(f"no TLS connection to {self.name}: {reason}") from None
        self._hung_up = False
        """The server closed the connection (or reset it)."""
        self.server: str | None = None
        self.version = 0
        """The server's protocol version (HELLO's answer)."""
        if hello:
            try:
                reply = Reader(self.call(HELLO, INT16.pack(VERSION) + string("kl")))
            except (ProtocolError, NetworkError) as e:
                if not self._hung_up:
                    raise
                if tls is None:
                    hint = "not kl serve's port for kl's clients (--port), or one that takes TLS (then --tls)?"
                else:  # (TLS 1.3: a refused certificate's alert is lost when the close resets the connection)
                    hint = (
                        "does it take TLS connections with a client certificate only (--tls-cert, --tls-key), "
                        "or is it not kl serve's port for kl's clients (--port)?"
                    )
                raise type(e)(f"{self.name} {CLOSED} at HELLO: {hint} kl serve --list shows the daemons' addresses") from None
            self.version = reply.int16()
            self.server = reply.string()
            if sasl is not None:
                self._authenticate(Login(*sasl))

    def _authenticate(self, login: Login) -> None:
        """Run the SASL exchange; a refusal closes the connection and raises ``AuthenticationFailed``."""
        tokens = client_tokens(login)
        try:
            token = next(tokens)
            while True:
                answer = Reader(self.call(AUTHENTICATE, string(login.mechanism) + INT32.pack(len(token)) + token))
                token = tokens.send(answer.take(answer.int32()))
        except StopIteration:
            return
        except ValueError as e:
            self.close()
            raise AuthenticationFailed(f"{self.name}: {e}") from None
        except (KlError, ProtocolError):
            self.close()
            raise

    @property
    def name(self) -> str:
        return f"{self.address[0]}:{self.address[1]}"

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, kind: int, body: bytes) -> None:
        """Send a request without waiting for its answer (PRODUCE and MULTIPRODUCE have none)."""
        try:
            self.sock.sendall(request(kind, body))
        except OSError as e:
            raise self._lost(e) from None

    def receive(self) -> tuple[int, memoryview]:
        """The next response: its error code and payload."""
        size, code = HEAD.unpack(self._exactly(HEAD.size))
        if size < 2:
            raise ProtocolError(f"{self.name} sent a response of size {size}")
        return code, memoryview(self._exactly(size - 2))

    def call(self, kind: int, body: bytes) -> memoryview:
        """Send a request and return its payload; an error response raises what it names."""
        self.send(kind, body)
        code, payload = self.receive()
        if code != NO_ERROR:
            raise_error(code, payload)
        return payload

    def _exactly(self, n: int) -> bytearray:
        buf = bytearray(n)
        view, got = memoryview(buf), 0
        try:
            while got < n:
                k = self.sock.recv_into(view[got:], n - got)
                if not k:
                    self._hung_up = True
                    raise ProtocolError(f"{self.name} {CLOSED}")
                got += k
        except OSError as e:
            raise self._lost(e) from None
        return buf

    def _lost(self, error: OSError) -> NetworkError:
        self._hung_up = isinstance(error, (ConnectionResetError, BrokenPipeError, ssl.SSLEOFError))
        if isinstance(error, TimeoutError):
            return NetworkError(f"{self.name} did not answer in time")
        if isinstance(error, ssl.SSLError) and error.reason:
            if "CERTIFICATE_REQUIRED" in error.reason:
                return NetworkError(f"{self.name} takes TLS connections with a client certificate only ({error.reason})")
            return NetworkError(f"the TLS connection to {self.name} failed: {error.reason}")
        return NetworkError(f"connection to {self.name} failed: {error.strerror or error}")
