"""``kl serve``: a root's topics over Kafka 0.7's wire protocol, fetches sent with sendfile.

The seed's broker: one thread accepts connections and reads requests (a selector
over non-blocking sockets), N worker threads answer them.  A connection has at most
one request with a worker, so its responses come in request order; the loop reads its
next request once the worker hands the connection back.  A fetch response is a
6-byte header written by Python and the segment's bytes copied by the kernel
(``os.sendfile``), never past the published end.  Specified in ``man/kl-protocol.5``.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import os
import queue
import random
import re
import select
import selectors
import socket
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from kl import wire
from kl.config import TopicConfig
from kl.errors import InvalidTopicName, KlError, TopicNotFound
from kl.messageset import validate_set
from kl.segment import Segment
from kl.topic import Root, validate_name
from kl.wire import Fetch, ProtocolError, Reader

log = logging.getLogger("kl.serve")

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
LOOPBACK: tuple[Network, ...] = (ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128"))
SMALL_REQUEST = 64 << 10
"""The largest request when produce is off: fetches, offsets and kl's lookups are tiny."""
RECV_CHUNK = 256 << 10
KL_FORMAT = "kl"


class ServerError(KlError):
    """``kl serve`` cannot start as asked (bad bind address, port in use, unsafe settings)."""


@dataclass
class ServeConfig:
    """What ``kl serve`` serves, to whom, and within which bounds."""

    bind: str = "127.0.0.1"
    port: int = 9092
    allow: tuple[Network, ...] = ()
    """Networks connections may come from besides loopback (needed to bind elsewhere)."""
    allow_produce: bool = False
    topics: re.Pattern[str] | None = None
    """Serve only topics whose whole name matches."""
    workers: int = 8
    max_connections: int = 1024
    max_request_bytes: int = 8 << 20
    """The largest request accepted when produce is on (a message set and its header)."""
    idle_timeout: float = 600.0
    """Close a connection that sent no request for this long."""
    request_timeout: float = 30.0
    """Close a connection that takes longer to send one request, or to take one response."""
    networks: tuple[Network, ...] = field(init=False, default=())

    def __post_init__(self) -> None:
        self.networks = LOOPBACK + tuple(self.allow)
        try:
            address = ipaddress.ip_address(self.bind)
        except ValueError:
            raise ServerError(f"--bind needs an IP address, not {self.bind!r}") from None
        if not address.is_loopback and not self.allow:
            raise ServerError(f"binding to {self.bind} needs --allow CIDR naming who may connect")
        for name in ("workers", "max_connections", "max_request_bytes"):
            if getattr(self, name) < 1:
                raise ServerError(f"{name} must be at least 1, not {getattr(self, name)}")

    @property
    def request_limit(self) -> int:
        return self.max_request_bytes if self.allow_produce else SMALL_REQUEST


class Connection:
    """A client's socket and what has been read of its next request."""

    __slots__ = ("sock", "peer", "kl", "buffer", "last_active", "started")

    def __init__(self, sock: socket.socket, peer: str):
        self.sock = sock
        self.peer = peer
        self.kl = False
        self.buffer = bytearray()
        self.last_active = time.monotonic()
        self.started: float | None = None
        """When the request being received began (None between requests)."""


class Drop(Exception):
    """Close this connection, logging the reason (bad request, a peer gone)."""


class Server:
    """Serves ``root`` as configured; ``serve_forever`` until ``stop``."""

    def __init__(self, root: Root | str | os.PathLike[str], config: ServeConfig | None = None):
        self.root = root if isinstance(root, Root) else Root(root)
        self.config = config or ServeConfig()
        self.listener = self._listen()
        self.port: int = self.listener.getsockname()[1]
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._work: queue.SimpleQueue[tuple[Connection, bytes] | None] = queue.SimpleQueue()
        self._returned: queue.SimpleQueue[tuple[Connection, bool]] = queue.SimpleQueue()
        self._connections: set[Connection] = set()
        self._busy = 0
        self._stopping = threading.Event()

    def _listen(self) -> socket.socket:
        c = self.config
        family = socket.AF_INET6 if ":" in c.bind else socket.AF_INET
        try:
            sock = socket.create_server((c.bind, c.port), family=family, backlog=1024, reuse_port=False)
        except OSError as e:
            raise ServerError(f"cannot listen on {c.bind}:{c.port}: {e.strerror or e}") from None
        sock.setblocking(False)
        return sock

    # ----------------------------------------------------------------- the loop

    def serve_forever(self) -> None:
        """Accept and answer until ``stop``; then finish the responses under way and close."""
        sel = self._selector
        sel.register(self.listener, selectors.EVENT_READ, "accept")
        sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        workers = [threading.Thread(target=self._worker, name=f"kl-serve-{i}", daemon=True) for i in range(self.config.workers)]
        for w in workers:
            w.start()
        log.info("serving %s on %s:%d", self.root.path, self.config.bind, self.port)
        try:
            while not self._stopping.is_set():
                for key, _ in sel.select(timeout=0.5):
                    if key.data == "accept":
                        self._accept()
                    elif key.data == "wake":
                        self._drain_wake()
                    else:
                        self._readable(key.data)
                self._take_back()
                self._sweep()
            self._shutdown(workers)
        finally:
            sel.close()
            self.listener.close()
            os.close(self._wake_r)
            os.close(self._wake_w)

    def stop(self) -> None:
        """Stop accepting and reading; responses under way are finished.  Safe from a signal handler."""
        self._stopping.set()
        self._wake()

    def _shutdown(self, workers: list[threading.Thread]) -> None:
        self._selector.unregister(self.listener)
        self.listener.close()
        deadline = time.monotonic() + self.config.request_timeout
        while self._busy and time.monotonic() < deadline:
            try:
                conn, keep = self._returned.get(timeout=0.1)
            except queue.Empty:
                continue
            self._busy -= 1
            self._close(conn, None)
        for _ in workers:
            self._work.put(None)
        for conn in list(self._connections):
            self._close(conn, None)
        log.info("stopped")

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except BlockingIOError:
            pass

    def _drain_wake(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass

    def _accept(self) -> None:
        for _ in range(64):
            try:
                sock, address = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # out of file descriptors, and the like: keep serving
                log.warning("accept failed: %s", e.strerror or e)
                return
            peer = f"{address[0]}:{address[1]}"
            if not any(ipaddress.ip_address(address[0]) in net for net in self.config.networks):
                log.warning("refused %s: not in --allow", peer)
                sock.close()
                continue
            if len(self._connections) >= self.config.max_connections:
                log.warning("refused %s: %d connections open (--max-connections)", peer, len(self._connections))
                sock.close()
                continue
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = Connection(sock, peer)
            self._connections.add(conn)
            self._selector.register(sock, selectors.EVENT_READ, conn)

    def _readable(self, conn: Connection) -> None:
        try:
            need = self._needed(conn)
            data = conn.sock.recv(min(need, RECV_CHUNK))
        except (BlockingIOError, InterruptedError):
            return
        except Drop as e:
            self._close(conn, str(e))
            return
        except OSError as e:
            self._close(conn, f"read failed: {e.strerror or e}")
            return
        if not data:
            self._close(conn, None if not conn.buffer else "closed in the middle of a request")
            return
        conn.last_active = time.monotonic()
        if conn.started is None:
            conn.started = conn.last_active
        conn.buffer += data
        self._dispatch(conn)

    def _needed(self, conn: Connection) -> int:
        """Bytes still missing from the request being received (its size checked first)."""
        if len(conn.buffer) < wire.SIZE.size:
            return wire.SIZE.size - len(conn.buffer)
        (size,) = wire.SIZE.unpack_from(conn.buffer)
        if not 2 <= size <= self.config.request_limit:
            raise Drop(f"request of {size} bytes refused (limit {self.config.request_limit})")
        return max(0, wire.SIZE.size + size - len(conn.buffer))

    def _dispatch(self, conn: Connection) -> None:
        """Hand a complete request to a worker (and the connection with it)."""
        try:
            if self._needed(conn):
                return
        except Drop as e:
            self._close(conn, str(e))
            return
        (size,) = wire.SIZE.unpack_from(conn.buffer)
        end = wire.SIZE.size + size
        request = bytes(conn.buffer[wire.SIZE.size : end])
        del conn.buffer[:end]
        conn.started = time.monotonic() if conn.buffer else None
        self._selector.unregister(conn.sock)
        self._busy += 1
        self._work.put((conn, request))

    def _take_back(self) -> None:
        while True:
            try:
                conn, keep = self._returned.get_nowait()
            except queue.Empty:
                return
            self._busy -= 1
            if not keep or self._stopping.is_set():
                self._close(conn, None)
                continue
            conn.last_active = time.monotonic()
            self._selector.register(conn.sock, selectors.EVENT_READ, conn)
            self._dispatch(conn)

    def _sweep(self) -> None:
        now, c = time.monotonic(), self.config
        for conn in list(self._connections):
            if conn.started is not None and now - conn.started > c.request_timeout:
                self._close(conn, f"request not complete after {c.request_timeout:g} s")
            elif conn.started is None and now - conn.last_active > c.idle_timeout and self._registered(conn):
                self._close(conn, f"idle for {c.idle_timeout:g} s")

    def _registered(self, conn: Connection) -> bool:
        try:
            self._selector.get_key(conn.sock)
            return True
        except (KeyError, ValueError):
            return False

    def _close(self, conn: Connection, reason: str | None) -> None:
        if reason:
            log.warning("closed %s: %s", conn.peer, reason)
        if self._registered(conn):
            self._selector.unregister(conn.sock)
        self._connections.discard(conn)
        conn.sock.close()

    # ----------------------------------------------------------------- workers

    def _worker(self) -> None:
        while True:
            item = self._work.get()
            if item is None:
                return
            conn, request = item
            keep = True
            try:
                conn.sock.settimeout(self.config.request_timeout)
                self._handle(conn, request)
                conn.sock.setblocking(False)
            except Drop as e:
                log.warning("closed %s: %s", conn.peer, e)
                keep = False
            except ProtocolError as e:
                log.warning("closed %s: bad request: %s", conn.peer, e)
                keep = False
            except OSError as e:
                log.warning("closed %s: %s", conn.peer, _reason(e))
                keep = False
            except Exception:
                log.exception("closed %s: unexpected error", conn.peer)
                keep = False
            self._returned.put((conn, keep))
            self._wake()

    def _handle(self, conn: Connection, request: bytes) -> None:
        reader = Reader(request)
        kind = reader.int16()
        handler = HANDLERS.get(kind)
        if handler is None:
            raise Drop(f"unknown request type {kind}")
        if kind >= wire.HELLO:
            conn.kl = True
        handler(self, conn, reader)

    # ----------------------------------------------------------------- requests

    def _fetch(self, conn: Connection, reader: Reader) -> None:
        fetch = reader.fetch()
        reader.done()
        part = self._part(conn, fetch)
        try:
            _send_parts(conn.sock, [part], None, self.config.request_timeout)
        finally:
            _close_part(part)

    def _multifetch(self, conn: Connection, reader: Reader) -> None:
        count = reader.int16()
        if count < 0:
            raise ProtocolError(f"MULTIFETCH of {count} fetches")
        fetches = [reader.fetch() for _ in range(count)]
        reader.done()
        parts: list[_Part] = []
        try:
            for fetch in fetches:
                parts.append(self._part(conn, fetch))
            _send_parts(conn.sock, parts, wire.NO_ERROR, self.config.request_timeout)
        finally:
            for part in parts:
                _close_part(part)

    def _part(self, conn: Connection, fetch: Fetch) -> _Part:
        """One fetch's answer: an error code and bytes, or a span of a segment file."""
        if fetch.max_bytes < 0:
            return self._error(conn, wire.INVALID_FETCH_SIZE, KlError(f"fetch size {fetch.max_bytes} is negative"))
        try:
            config = self._topic(conn, fetch.topic, fetch.partition)
            if config is None:
                return (wire.NO_ERROR, b"")  # Kafka 0.7: an unknown topic is an empty set
            if not conn.kl and getattr(config, "format", KL_FORMAT) == KL_FORMAT:
                return self._error(conn, wire.FORMAT_NOT_UNDERSTOOD, KlError(f"topic {fetch.topic} is in kl's format"))
            span = self.root.log(fetch.topic, fetch.partition).span(fetch.offset, fetch.max_bytes)
        except _Refused as e:
            return self._error(conn, e.code, e.error)
        except KlError as e:
            return self._error(conn, *_coded(e))
        if span is None:
            return (wire.NO_ERROR, b"")
        return span

    def _offsets(self, conn: Connection, reader: Reader) -> None:
        topic = reader.string()
        partition, time_ms, max_offsets = reader.unpack(wire.PARTITION_TIME_COUNT)
        reader.done()
        try:
            if self._topic(conn, topic, partition) is None:
                offsets = [0] if time_ms in (-1, -2) and max_offsets > 0 else []  # Kafka 0.7's getEmptyOffsets
            else:
                offsets = self.root.log(topic, partition).offsets_before(time_ms, max(0, max_offsets))
        except _Refused as e:
            self._reply_error(conn, e.code, e.error, b"\0\0\0\0")
            return
        except KlError as e:
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
        """Kafka 0.7's produce has no answer: a refused set closes the connection, logged."""
        for p in produces:
            try:
                self._append(conn, p.topic, p.partition, p.data, None, False)
            except _Refused as e:
                raise Drop(f"produce to {p.topic}/{p.partition} refused: {e.error}") from None
            except KlError as e:
                raise Drop(f"produce to {p.topic}/{p.partition} refused: {e}") from None

    def _append(self, conn: Connection, topic: str, partition: int, data: bytes, count: int | None, fsync: bool) -> int:
        if not self.config.allow_produce:
            raise _Refused(wire.NOT_ALLOWED, KlError("produce is off on this server (kl serve --allow-produce)"))
        if partition == -1:  # Kafka 0.7's "random partition"
            config = self._topic(conn, topic, 0, strict=True)
            assert config is not None
            partition = random.randrange(config.partitions)
        config = self._topic(conn, topic, partition, strict=True)
        assert config is not None
        found = validate_set(data, getattr(config, "format", KL_FORMAT), config.max_message_bytes)
        if count is not None and count != found:
            raise _Refused(wire.INVALID_MESSAGE, KlError(f"the set holds {found} messages, not {count}"))
        return self.root.log(topic, partition).append(data, found, fsync=fsync)

    def _hello(self, conn: Connection, reader: Reader) -> None:
        reader.int16()
        reader.string()
        self._reply(conn, wire.NO_ERROR, wire.INT16.pack(wire.VERSION) + wire.string("kl"))

    def _topics(self, conn: Connection, reader: Reader) -> None:
        reader.done()
        parts = []
        names = [n for n in self.root.topics() if self._served(n)]
        for name in names:
            try:
                config = self.root.config(name)
            except KlError:
                continue
            parts.append(wire.string(name) + wire.string(config.to_json().decode()))
        self._reply(conn, wire.NO_ERROR, wire.INT32.pack(len(parts)) + b"".join(parts))

    def _offset_for_time(self, conn: Connection, reader: Reader) -> None:
        self._lookup(conn, reader, lambda log, value: log.offset_for_time(value))

    def _offset_back(self, conn: Connection, reader: Reader) -> None:
        self._lookup(conn, reader, lambda log, value: log.offset_back(value))

    def _check_offset(self, conn: Connection, reader: Reader) -> None:
        self._lookup(conn, reader, lambda log, value: log.check_offset(value))

    def _lookup(self, conn: Connection, reader: Reader, call) -> None:  # type: ignore[no-untyped-def]
        topic = reader.string()
        partition, value = reader.unpack(wire.PARTITION_INT64)
        reader.done()
        try:
            self._topic(conn, topic, partition, strict=True)
            result = call(self.root.log(topic, partition), value)
        except _Refused as e:
            self._reply_error(conn, e.code, e.error)
            return
        except KlError as e:
            self._reply_error(conn, *_coded(e))
            return
        self._reply(conn, wire.NO_ERROR, b"" if result is None else wire.INT64.pack(result))

    def _append_request(self, conn: Connection, reader: Reader) -> None:
        topic = reader.string()
        partition, fsync, count, size = reader.unpack(wire.APPEND_HEAD)
        data = bytes(reader.take(size))
        reader.done()
        try:
            offset = self._append(conn, topic, partition, data, count, bool(fsync))
        except _Refused as e:
            self._reply_error(conn, e.code, e.error)
            return
        except KlError as e:
            self._reply_error(conn, *_coded(e))
            return
        self._reply(conn, wire.NO_ERROR, wire.INT64.pack(offset))

    # ----------------------------------------------------------------- helpers

    def _served(self, topic: str) -> bool:
        pattern = self.config.topics
        return pattern is None or pattern.fullmatch(topic) is not None

    def _topic(self, conn: Connection, topic: str, partition: int, *, strict: bool = False) -> TopicConfig | None:
        """The topic's config after the checks every request gets; None for an unknown
        topic asked by a Kafka 0.7 client, which gets Kafka 0.7's answer to it."""
        try:
            validate_name(topic)
        except InvalidTopicName as e:
            raise _Refused(wire.UNKNOWN if not conn.kl else wire.KL_ERROR, e) from None
        if not self._served(topic):
            raise _Refused(wire.NOT_ALLOWED, KlError(f"topic {topic} is not served here (kl serve --topics)"))
        try:
            config = self.root.config(topic)
        except TopicNotFound as e:
            if conn.kl or strict:
                raise _Refused(wire.TOPIC_NOT_FOUND, e) from None
            return None
        if not 0 <= partition < config.partitions:
            error = TopicNotFound(f"topic {topic!r} has partitions 0 to {config.partitions - 1}, not {partition}")
            raise _Refused(wire.WRONG_PARTITION if not conn.kl else wire.TOPIC_NOT_FOUND, error)
        return config

    def _error(self, conn: Connection, code: int, error: BaseException) -> _Part:
        return (code, wire.error_payload(error)[1] if conn.kl else b"")

    def _reply(self, conn: Connection, code: int, body: bytes) -> None:
        conn.sock.sendall(wire.HEAD.pack(2 + len(body), code) + body)

    def _reply_error(self, conn: Connection, code: int, error: BaseException, plain: bytes = b"") -> None:
        """An error answer: the JSON on a kl connection, Kafka 0.7's ``plain`` bytes on another."""
        self._reply(conn, code, wire.error_payload(error)[1] if conn.kl else plain)


_Part = tuple[int, bytes] | tuple[Segment, int, int]


class _Refused(Exception):
    def __init__(self, code: int, error: BaseException):
        self.code = code
        self.error = error


def _coded(error: KlError) -> tuple[int, KlError]:
    return wire.error_payload(error)[0], error


def _close_part(part: _Part) -> None:
    if isinstance(part[0], Segment):
        part[0].close()


def _send_parts(sock: socket.socket, parts: list[_Part], outer: int | None, timeout: float) -> None:
    """Write parts as ``size error payload`` each (under one more header when ``outer`` is
    a code: MULTIFETCH); segment spans go by sendfile.  TCP_CORK makes one stream of it."""
    heads = []
    total = 0
    for part in parts:
        if isinstance(part[0], Segment):
            size = part[2]
            heads.append(wire.HEAD.pack(2 + size, wire.NO_ERROR))
        else:
            size = len(part[1])
            heads.append(wire.HEAD.pack(2 + size, part[0]))
        total += wire.HEAD.size + size
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)
    try:
        if outer is not None:
            sock.sendall(wire.HEAD.pack(2 + total, outer))
        for head, part in zip(heads, parts, strict=True):
            if isinstance(part[0], Segment):
                sock.sendall(head)
                _sendfile(sock, part[0].fd, part[1], part[2], timeout)
            else:
                sock.sendall(head + part[1])
    finally:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 0)


def _sendfile(sock: socket.socket, fd: int, offset: int, count: int, timeout: float) -> None:
    """Copy ``count`` bytes of the file at ``offset`` to the socket, in the kernel."""
    out = sock.fileno()
    deadline = time.monotonic() + timeout
    while count > 0:
        try:
            sent = os.sendfile(out, fd, offset, count)
        except (BlockingIOError, InterruptedError):
            remaining = deadline - time.monotonic()
            poll = select.poll()
            poll.register(out, select.POLLOUT)
            if remaining <= 0 or not poll.poll(remaining * 1000):
                raise Drop(f"response not taken within {timeout:g} s") from None
            continue
        if sent == 0:
            raise Drop("segment file shorter than its published end")
        offset += sent
        count -= sent
        deadline = time.monotonic() + timeout


def _reason(error: OSError) -> str:
    if error.errno in (errno.EPIPE, errno.ECONNRESET):
        return "the peer went away"
    if isinstance(error, TimeoutError):
        return "timed out"
    return error.strerror or str(error)


HANDLERS = {
    wire.PRODUCE: Server._produce,
    wire.FETCH: Server._fetch,
    wire.MULTIFETCH: Server._multifetch,
    wire.MULTIPRODUCE: Server._multiproduce,
    wire.OFFSETS: Server._offsets,
    wire.HELLO: Server._hello,
    wire.TOPICS: Server._topics,
    wire.OFFSET_FOR_TIME: Server._offset_for_time,
    wire.APPEND: Server._append_request,
    wire.OFFSET_BACK: Server._offset_back,
    wire.CHECK_OFFSET: Server._check_offset,
}
