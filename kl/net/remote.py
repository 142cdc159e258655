"""kl's network client: ``RemoteConsumer`` and ``RemoteProducer`` read and write through ``kl serve``.

They are ``Consumer`` and ``Producer`` over a ``RemoteRoot``: the part of ``Root`` and
``Log`` those use (topic configs, offsets, reads, appends), answered by a server over
Kafka 0.7's wire protocol with kl's additions (``kl.net.wire``).  So they have the same API,
the same reading and sending logic, and raise the same exception classes with the same
messages (the server's, re-raised), with these differences:

- A fetch is Kafka 0.7's: bytes that may end inside a message.  ``RemoteLog.read``
  makes a ``MessageSet`` of them exactly as ``Log.read`` does locally (complete messages
  only, a first message larger than ``max_bytes`` fetched whole, an offset inside a
  message ``InvalidOffset``); damage is ``CorruptMessage`` with the same offset and
  reason, but the path names the server and partition (``HOST:PORT/TOPIC/PARTITION``)
  and the position is the offset, as the client does not know the segment files.
- Following (``consume(follow=True)``, ``stream``) polls every ``poll_interval``.
- ``flush`` cannot fsync on the server: durability is the topic's flush policy there,
  or ``fsync=True``, which makes every append durable before it is acknowledged.
- Produce needs ``kl serve --allow-produce``.

A fetch that comes back full sends the next fetch of that partition at once (read
ahead), so the server sends it while the caller parses; a read continuing where the
last one stopped (inside a message included) takes those bytes.  So reading through a
server is about as fast as reading the root (``scripts/bench-remote``).  Topic configs
are cached (looked up again when a topic is unknown, or through ``forget``).

Each thread has its own connection, so both are as thread-safe as their local forms; a
read whose connection broke is sent once more on a new one (an append is not: it may
have been done).  ``close`` closes every connection.  A forked child opens its own.
"""

from __future__ import annotations

import contextlib
import os
import ssl
import tempfile
import threading
import time
import weakref
from collections.abc import Iterable, Sequence
from typing import cast

from kl.consumer import DEFAULT_MAX_BYTES, Consumer
from kl.errors import InvalidConfig, KlError, TopicNotFound
from kl.follow import Watch
from kl.log.config import TopicConfig
from kl.log.log import EARLIEST, LATEST, Position
from kl.log.message import LENGTH_SIZE, MIN_LENGTH, PREFIX
from kl.log.messageset import INCOMPLETE, MessageSet
from kl.log.segment import Segment
from kl.log.validate import Checked
from kl.net import wire
from kl.producer import DEFAULT_BATCH_BYTES, DEFAULT_BATCH_SIZE, DEFAULT_QUEUE_SIZE, Partitioner, Producer
from kl.serde import Deserializer, Serializer
from kl.topic import CONFIG_RECHECK_SECONDS, PartitionInfo, Root, TopicInfo

DEFAULT_TIMEOUT = 30.0
"""Seconds to wait for a connection or an answer."""
MAX_WINDOWS = 16
"""Partitions per thread whose next bytes are read ahead (each up to twice the fetch size)."""
WINDOW_SECONDS = 1.0
"""Bytes read ahead longer ago are not used (the topic may have been deleted and created again)."""
MAX_APPEND_BYTES = (8 << 20) - (64 << 10)
"""The largest append sent: ``kl serve`` takes requests of up to 8 MiB by default."""
SKIP_CHUNK = 8 << 20
"""Bytes fetched at a time when stepping over damage."""

__all__ = ["DEFAULT_TIMEOUT", "RemoteConsumer", "RemoteLog", "RemoteProducer", "RemoteRoot"]


class _Connection(wire.Connection):
    """A ``wire.Connection`` that reads fetch answers into a buffer it keeps."""

    def __init__(self, address: tuple[str, int], timeout: float | None, tls: ssl.SSLContext | None, sasl: wire.Login | None):
        super().__init__(address, timeout=timeout, tls=tls, sasl=sasl)
        self._buffer = bytearray(1 << 16)

    def fetched(self, into: bytearray | None = None, at: int = 0) -> memoryview:
        """The payload of the next answer, read into ``into`` from ``at`` on (grown to fit),
        or into a buffer the connection keeps (valid until the next call); an error answer
        raises what it names."""
        size, code = wire.HEAD.unpack(self._exactly(wire.HEAD.size))
        if size < 2:
            raise wire.ProtocolError(f"{self.name} sent a response of size {size}")
        n = size - 2
        if into is None or code != wire.NO_ERROR:
            into, at = self._buffer, 0
            if len(into) < n:
                into = self._buffer = bytearray(n)
        elif len(into) < at + n:
            into.extend(bytes(at + n - len(into)))
        view = memoryview(into)[at : at + n]
        got = 0
        try:
            while got < n:
                k = self.sock.recv_into(view[got:], n - got)
                if not k:
                    raise wire.ProtocolError(f"{self.name} {wire.CLOSED}")
                got += k
        except OSError as e:
            raise self._lost(e) from None
        if code != wire.NO_ERROR:
            wire.raise_error(code, view)
        return view


class _Window:
    """One partition's bytes read ahead on a thread's connection: ``size`` bytes of
    ``buffer`` from ``start``; then a FETCH of ``ahead`` bytes at their end may be in
    flight.  ``short`` once a fetch came back short (a segment's or the log's end):
    nothing more is read ahead then.  The answer is received into ``buffer`` and each
    read copied out of it once."""

    __slots__ = ("log", "start", "buffer", "size", "ahead", "short", "read_at", "born")

    def __init__(self, log: RemoteLog, start: int, data: bytes):
        self.log = log
        self.start = start
        self.buffer = bytearray(data)
        self.size = len(data)
        self.ahead = 0
        self.short = False
        self.read_at = start
        self.born = time.monotonic()

    @property
    def end(self) -> int:
        return self.start + self.size

    def serves(self, offset: int) -> bool:
        """Whether a read at ``offset`` continues this window (fresh, and not past its end)."""
        fresh = time.monotonic() - self.born < WINDOW_SECONDS
        return fresh and self.read_at <= offset and (offset < self.end or offset == self.end and self.ahead > 0)

    def covers(self, offset: int, size: int) -> bool:
        """Whether a fetch of ``size`` at ``offset`` gets all it would from the server here."""
        return self.serves(offset) and (self.short or offset + size <= self.end)

    def take(self, offset: int, size: int) -> bytes:
        self.read_at = offset
        skip = offset - self.start
        with memoryview(self.buffer) as view:
            return bytes(view[skip : min(skip + size, self.size)])

    def receive(self, conn: _Connection) -> None:
        """Receive the answer to the read ahead after the bytes from the last read on
        (those before it are dropped)."""
        keep = self.end - self.read_at
        skip = self.read_at - self.start
        if skip:
            self.buffer[:keep] = self.buffer[skip : skip + keep]
        self.start, self.size = self.read_at, keep
        got = len(conn.fetched(self.buffer, keep))
        self.size += got
        self.short = got < self.ahead
        self.ahead = 0
        self.born = time.monotonic()


class _Thread(threading.local):
    """A thread's connection, its read-ahead windows, and the one whose fetch is in flight."""

    def __init__(self) -> None:
        self.conn: _Connection | None = None
        self.windows: dict[RemoteLog, _Window] = {}
        self.pending: _Window | None = None


class RemoteRoot:
    """The topics a ``kl serve`` at ``address`` (``HOST:PORT``) serves, as a ``Root`` gives
    them to consumers and producers: ``config``, ``log``, ``forget``, ``topics``; over
    TLS with ``tls`` (``kl serve --tls``), which checks the server's certificate (and may
    hold the client's); authenticated with ``sasl``, (mechanism, user, password) or a
    ``wire.Login`` (``kl serve --sasl``): refused, ``wire.AuthenticationFailed``."""

    def __init__(
        self,
        address: str | tuple[str, int],
        *,
        timeout: float | None = DEFAULT_TIMEOUT,
        tls: ssl.SSLContext | None = None,
        sasl: wire.Login | tuple[str, str, str] | None = None,
    ):
        self.tls = tls
        self.sasl = None if sasl is None else wire.Login(*sasl)
        self.address = wire.parse_address(address) if isinstance(address, str) else address
        self.path = f"{self.address[0]}:{self.address[1]}"
        """The server, for messages (where a ``Root`` has its directory)."""
        self.timeout = timeout
        self._local = _Thread()
        self._connections: list[_Connection] = []
        self._configs: dict[str, TopicConfig | InvalidConfig] = {}
        self._recheck_at = 0.0  # when the cached configs are asked of the server again
        self._logs: dict[tuple[str, int], RemoteLog] = {}
        self._guard = threading.Lock()
        _roots.add(self)

    def __repr__(self) -> str:
        return f"RemoteRoot({self.path!r})"

    # ----------------------------------------------------------------- requests

    def _connection(self) -> _Connection:
        local = self._local
        if local.conn is None:
            local.conn = _Connection(self.address, self.timeout, self.tls, self.sasl)
            with self._guard:
                self._connections.append(local.conn)
        return local.conn

    def _drop(self, conn: _Connection) -> None:
        """Close a broken connection, with what was read ahead on it."""
        conn.close()
        local = self._local
        local.conn = local.pending = None
        local.windows.clear()
        with self._guard:
            if conn in self._connections:
                self._connections.remove(conn)

    def call(self, kind: int, body: bytes, *, retry: bool = True) -> memoryview:
        """Send a request and return the answer's payload (valid until this thread's next
        request); an error answer raises what it names.  A broken connection is replaced,
        and with ``retry`` the request sent once more."""
        request = wire.request(kind, body)
        for attempt in (1, 2):
            self._settle()
            conn = self._connection()
            try:
                conn.sock.sendall(request)
            except OSError as e:
                self._drop(conn)
                if attempt == 2 or not retry:
                    raise conn._lost(e) from None
                continue
            try:
                return conn.fetched()
            except (wire.NetworkError, wire.ProtocolError):
                self._drop(conn)
                if attempt == 2 or not retry:
                    raise
        raise AssertionError("unreachable")

    def append_all(self, appends: Sequence[tuple[RemoteLog, Checked]], *, fsync: bool = False) -> list[int]:
        """``Root.append_all`` (APPEND_ALL): all or none.  A server older than version 2
        gets the appends one after the other.  Not sent again on a broken connection."""
        if self._connection().version < 2:
            return [target.append(batch, fsync=fsync) for target, batch in appends]
        body = wire.append_all_body([(t.topic, t.partition, *batch) for t, batch in appends], fsync)
        answer = wire.Reader(self.call(wire.APPEND_ALL, body, retry=False))
        offsets = [answer.int64() for _ in range(answer.int32())]
        if len(offsets) != len(appends):
            raise wire.ProtocolError(f"{self.path} answered {len(offsets)} offsets for {len(appends)} sets")
        return offsets

    def read(self, log: RemoteLog, offset: int, size: int) -> bytes:
        """A fetch of ``size`` bytes at ``offset``, served from what was read ahead when it
        continues the previous read of ``log``; a full fetch reads the next bytes ahead,
        so the server sends them while the caller parses these."""
        local = self._local
        window = local.windows.get(log)
        if window is not None and window.ahead and window.serves(offset) and window.end < offset + size:
            window.read_at = offset  # the bytes before it are not kept
            self._settle()
        if window is not None and not (local.windows.get(log) is window and window.covers(offset, size)):
            local.windows.pop(log, None)
            window = None
        if window is None:
            data = bytes(self.call(wire.FETCH, wire.fetch_body(wire.Fetch(log.topic, log.partition, offset, size))))
            if len(data) < size:  # the end of a segment or of the log
                return data
            window = local.windows[log] = _Window(log, offset, data)
            if len(local.windows) > MAX_WINDOWS:
                del local.windows[next(iter(local.windows))]
        data = window.take(offset, size)
        if not window.short and not window.ahead:
            self._read_ahead(window, size)
        return data

    def _read_ahead(self, window: _Window, size: int) -> None:
        self._settle()
        conn = self._connection()
        try:
            conn.sock.sendall(
                wire.request(wire.FETCH, wire.fetch_body(wire.Fetch(window.log.topic, window.log.partition, window.end, size)))
            )
        except OSError:
            self._drop(conn)
            return
        window.ahead = size
        self._local.pending = window

    def _settle(self) -> None:
        """Take the answer to the read ahead in flight (if any) into its window."""
        local = self._local
        window = local.pending
        if window is None:
            return
        local.pending = None
        assert local.conn is not None
        try:
            window.receive(local.conn)
        except (wire.NetworkError, wire.ProtocolError):
            self._drop(local.conn)
        except KlError:  # the read that needs it gets the error itself
            local.windows.pop(window.log, None)

    def close(self) -> None:
        """Close every thread's connection (a thread that goes on opens a new one).  This
        thread's read ahead is taken first: a socket closed with data unread resets the
        connection, which the server logs."""
        with contextlib.suppress(KlError):
            self._settle()
        with self._guard:
            conns, self._connections = self._connections, []
        for conn in conns:
            conn.close()
        self._local = _Thread()

    # ----------------------------------------------------------------- topics

    def topics(self) -> list[str]:
        """The topics the server serves (and their configs, cached)."""
        reader = wire.Reader(self.call(wire.TOPICS, b""))
        configs: dict[str, TopicConfig | InvalidConfig] = {}
        for _ in range(reader.int32()):
            name, text = reader.string(), reader.string()
            try:
                configs[name] = TopicConfig.from_json(text.encode(), f"{self.path}/{name}")
            except InvalidConfig as e:  # only that topic is unusable (a newer server's settings)
                configs[name] = e
        with self._guard:
            self._configs = configs
            self._recheck_at = time.monotonic() + CONFIG_RECHECK_SECONDS
        return sorted(configs)

    def describe(self, name: str) -> TopicInfo:
        """``Root.describe`` (DESCRIBE): the topic's config and, per partition, its
        segments, offsets and bytes.  Raises ``TopicNotFound``, and ``KlError`` for a topic
        the server does not serve."""
        try:
            reader = wire.Reader(self.call(wire.DESCRIBE, wire.string(name)))
        except wire.ProtocolError as e:
            raise wire.ProtocolError(f"{e} (a kl serve of an earlier kl does so on DESCRIBE: update it)") from None
        config = TopicConfig.from_json(reader.string().encode(), f"{self.path}/{name}")
        partitions = [PartitionInfo(p, *reader.unpack(wire.PARTITION_INFO)) for p in range(reader.int32())]
        return TopicInfo(name, config, partitions)

    def config(self, name: str) -> TopicConfig:
        """The topic's config, asked of the server again at most every
        ``CONFIG_RECHECK_SECONDS`` (as ``Root.config`` reads ``topic.json``: a follower
        sees partitions ``kl topics alter`` added).  Raises ``TopicNotFound`` (the
        server's error for the name) and ``InvalidConfig`` when this client cannot read it."""
        if time.monotonic() >= self._recheck_at:
            self.topics()
        config = self._configs.get(name)
        if config is None:
            if name not in self.topics():
                self.call(wire.CHECK_OFFSET, wire.partition_int64_body(name, 0, 0))  # raises the server's own error
                if name not in self.topics():
                    raise TopicNotFound(f"topic {name!r} does not exist on {self.path}")
            config = self._configs[name]
        if isinstance(config, InvalidConfig):
            raise config
        return config

    def refresh_config(self, name: str) -> TopicConfig:
        """:meth:`config`, asked of the server now (after ``kl topics alter``, say)."""
        self.topics()
        return self.config(name)

    def log(self, name: str, partition: int) -> RemoteLog:
        """The partition.  Raises ``TopicNotFound`` for an unknown topic or partition."""
        found = self._logs.get((name, partition))
        if found is not None:
            return found
        config = self.config(name)
        if not isinstance(partition, int) or not 0 <= partition < config.partitions:
            raise TopicNotFound(f"topic {name!r} has partitions 0 to {config.partitions - 1}, not {partition!r}")
        with self._guard:
            return self._logs.setdefault((name, partition), RemoteLog(self, name, partition, config))

    def forget(self, name: str) -> None:
        """Drop what is cached of ``name`` (after it was deleted or created again)."""
        with self._guard:
            self._configs.pop(name, None)
            for key in [k for k in self._logs if k[0] == name]:
                del self._logs[key]


_roots: weakref.WeakSet[RemoteRoot] = weakref.WeakSet()


def _forked() -> None:
    """In a forked child: every remote root opens connections of its own (the parent's
    stay the parent's)."""
    for root in list(_roots):
        root._local = _Thread()
        root._connections = []
        root._guard = threading.Lock()


os.register_at_fork(after_in_child=_forked)


class RemoteLog:
    """One served partition, with the verbs of ``Log`` that consumers and producers use."""

    def __init__(self, root: RemoteRoot, topic: str, partition: int, config: TopicConfig):
        self.root = root
        self.topic = topic
        self.partition = partition
        self.config = config
        self.path = f"{root.path}/{topic}/{partition}"

    def __repr__(self) -> str:
        return f"RemoteLog({self.path!r})"

    @property
    def log_start_offset(self) -> int:
        return self.offsets_before(EARLIEST, 1)[0]

    @property
    def log_end_offset(self) -> int:
        return self.offsets_before(LATEST, 1)[0]

    def offsets_before(self, time_ms: int, max_offsets: int) -> list[int]:
        """``Log.offsets_before`` (OFFSETS)."""
        reader = wire.Reader(self.root.call(wire.OFFSETS, wire.offsets_body(self.topic, self.partition, time_ms, max_offsets)))
        return [reader.int64() for _ in range(reader.int32())]

    def offset_for_time(self, time_ms: int) -> int:
        """``Log.offset_for_time`` (OFFSET_FOR_TIME)."""
        return self._lookup(wire.OFFSET_FOR_TIME, time_ms)

    def offset_back(self, count: int) -> int:
        """``Log.offset_back`` (OFFSET_BACK)."""
        return self.position_back(count).offset

    def position_back(self, count: int) -> Position:
        """``Log.position_back`` (OFFSET_BACK; a server older than the skip gives none)."""
        reader = wire.Reader(self.root.call(wire.OFFSET_BACK, wire.partition_int64_body(self.topic, self.partition, count)))
        offset = reader.int64()
        return Position(offset, reader.int32() if len(reader.data) > reader.pos else 0)

    def check_offset(self, offset: int) -> None:
        """``Log.check_offset`` (CHECK_OFFSET): ``InvalidOffset`` unless a message starts at ``offset``."""
        self.root.call(wire.CHECK_OFFSET, wire.partition_int64_body(self.topic, self.partition, offset))

    def _lookup(self, kind: int, value: int) -> int:
        payload = self.root.call(kind, wire.partition_int64_body(self.topic, self.partition, value))
        return wire.Reader(payload).int64()

    def read_ahead(self, offset: int, max_bytes: int) -> bytes:
        """``fetch``, from bytes read ahead when it continues the previous read."""
        return self.root.read(self, offset, max_bytes)

    def fetch(self, offset: int, max_bytes: int) -> bytes:
        """Kafka 0.7's fetch: up to ``max_bytes`` from ``offset``, ending at the segment's end
        or inside a message."""
        body = wire.fetch_body(wire.Fetch(self.topic, self.partition, offset, max_bytes))
        return bytes(self.root.call(wire.FETCH, body))

    def read(self, offset: int, max_bytes: int) -> MessageSet:
        """``Log.read``: the complete messages in ``[offset, offset + max_bytes)``, a first
        message larger than ``max_bytes`` whole.  Raises ``OffsetOutOfRange`` and ``InvalidOffset``."""
        return self.message_set(offset, max_bytes, self.read_ahead(offset, max_bytes))

    def message_set(self, offset: int, max_bytes: int, data: bytes) -> MessageSet:
        """The fetched ``data`` (asked with ``max_bytes``) as ``Log.read`` gives it."""
        limit = self.config.max_message_bytes
        if len(data) == max_bytes and data:  # cut at max_bytes: maybe inside a first message larger than it
            head = data if len(data) >= PREFIX.size else self.fetch(offset, PREFIX.size)
            if len(head) >= PREFIX.size:
                length, magic = PREFIX.unpack_from(head)
                if magic < len(MIN_LENGTH) and max_bytes < LENGTH_SIZE + length <= limit:
                    max_bytes = LENGTH_SIZE + length
                    data = self.fetch(offset, max_bytes)
        messages = MessageSet(
            data,
            offset,
            max_message_bytes=limit,
            stable_offset=offset + len(data),
            path=self.path,
            position=offset,
            ends_at_eof=len(data) < max_bytes,
        )
        first = next(messages.entries(), None)
        if first is not None and first.problem is not None:
            if not (first.problem.kind is INCOMPLETE and len(data) == max_bytes):
                self.check_offset(offset)
        return messages

    def skip_corrupt(self, offset: int) -> int:
        """``Log.skip_corrupt``: the offset after the damaged message at ``offset`` where
        valid messages start again that run on to the end of its segment (fetched to
        a temporary file and searched as ``Log.skip_corrupt`` searches the segment)."""
        with tempfile.TemporaryFile(prefix="kl-skip-") as f:
            size = 0
            while True:
                data = self.fetch(offset + size, SKIP_CHUNK)
                f.write(data)
                size += len(data)
                if len(data) < SKIP_CHUNK:  # a fetch stops at its segment's end
                    break
            f.flush()
            segment = Segment(self.path, offset, self.config.max_message_bytes, os.dup(f.fileno()))
            with segment:
                bad = segment.first_problem(0, size)
                if bad is None:
                    return offset
                found = segment.resync(bad, size)
        return offset + size if found is None else offset + found

    def append(self, batch: Checked, *, fsync: bool = False) -> int:
        """``Log.append`` (APPEND): the offset where the set starts.  The server checks the
        set again and refuses it if its count is not ``batch.count``.  Not sent again on a
        broken connection: it may have been appended."""
        body = wire.append_body(self.topic, self.partition, batch.data, batch.count, fsync)
        return wire.Reader(self.root.call(wire.APPEND, body, retry=False)).int64()

    def flush(self) -> None:
        """Nothing: the server's flush policy makes appends durable (or ``fsync=True``)."""

    def close_idle(self) -> bool:
        """Nothing: no file is open here (the connection is the root's)."""
        return True


class RemoteConsumer(Consumer):
    """``Consumer`` reading from a ``kl serve`` at ``address`` (``HOST:PORT``, or a ``RemoteRoot``).

    ``timeout`` bounds the wait for a connection and for each answer (``NetworkError`` after it);
    ``tls`` and ``sasl`` are ``RemoteRoot``'s.
    """

    def __init__(
        self,
        address: str | RemoteRoot,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        timeout: float | None = DEFAULT_TIMEOUT,
        tls: ssl.SSLContext | None = None,
        sasl: wire.Login | tuple[str, str, str] | None = None,
        key_deserializer: Deserializer | None = None,
        value_deserializer: Deserializer | None = None,
    ):
        remote = address if isinstance(address, RemoteRoot) else RemoteRoot(address, timeout=timeout, tls=tls, sasl=sasl)
        super().__init__(  # RemoteRoot has the part of Root's API used
            cast(Root, remote), max_bytes=max_bytes, key_deserializer=key_deserializer, value_deserializer=value_deserializer
        )
        self.remote = remote

    def multifetch(self, requests: Iterable[tuple[str, int, int, int | None]]) -> list[MessageSet]:
        """``fetch`` for each (topic, partition, offset, max_bytes), in order, in one MULTIFETCH request."""
        wanted = [(self.remote.log(t, p), o, b or self.max_bytes) for t, p, o, b in requests]
        body = wire.multifetch_body([wire.Fetch(log.topic, log.partition, o, b) for log, o, b in wanted])
        reader = wire.Reader(self.remote.call(wire.MULTIFETCH, body))
        parts = []
        for _ in wanted:
            size = reader.int32()
            code = reader.int16()
            payload = reader.take(size - 2)
            if code != wire.NO_ERROR:
                wire.raise_error(code, payload)
            parts.append(bytes(payload))
        return [log.message_set(o, b, data) for (log, o, b), data in zip(wanted, parts, strict=True)]

    def _watch(self, watch: Watch, topic: str, partition: int) -> None:
        """Nothing to watch: following polls every ``poll_interval``."""

    def topics(self) -> list[str]:
        """The topics the server serves."""
        return self.remote.topics()

    def close(self) -> None:
        """Close the connections to the daemon."""
        self.remote.close()

    def __enter__(self) -> RemoteConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RemoteProducer(Producer):
    """``Producer`` appending through a ``kl serve --allow-produce`` at ``address``
    (``HOST:PORT``, or a ``RemoteRoot``); every append is acknowledged with its offset.

    The options are ``Producer``'s (sync and async mode alike), with ``batch_bytes`` at
    most ``MAX_APPEND_BYTES``; ``flush`` waits for the queue but cannot fsync on the
    server: use ``fsync=True`` for durable appends.  ``tls`` and ``sasl`` are ``RemoteRoot``'s.
    """

    def __init__(
        self,
        address: str | RemoteRoot,
        *,
        timeout: float | None = DEFAULT_TIMEOUT,
        tls: ssl.SSLContext | None = None,
        sasl: wire.Login | tuple[str, str, str] | None = None,
        compression: str | None = None,
        fsync: bool = False,
        partitioner: Partitioner | None = None,
        batch_bytes: int = DEFAULT_BATCH_BYTES,
        linger_ms: float | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
        queue_size: int = DEFAULT_QUEUE_SIZE,
        queue_timeout: float | None = None,
        key_serializer: Serializer | None = None,
        value_serializer: Serializer | None = None,
    ):
        remote = address if isinstance(address, RemoteRoot) else RemoteRoot(address, timeout=timeout, tls=tls, sasl=sasl)
        self.remote = remote
        super().__init__(
            cast(Root, remote),  # RemoteRoot has the part of Root's API used
            compression=compression,
            fsync=fsync,
            partitioner=partitioner,
            batch_bytes=min(batch_bytes, MAX_APPEND_BYTES),
            linger_ms=linger_ms,
            batch_size=batch_size,
            queue_size=queue_size,
            queue_timeout=queue_timeout,
            key_serializer=key_serializer,
            value_serializer=value_serializer,
        )

    def close(self) -> None:
        """``Producer.close``, then close the connections (a synchronous producer opens
        a new one when used again)."""
        try:
            super().close()
        finally:
            self.remote.close()
