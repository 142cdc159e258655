"""``kl serve``: a root's topics over Kafka 0.7's wire protocol, fetches sent with sendfile.

The seed's broker: one thread accepts connections and reads requests (a selector
over non-blocking sockets), N worker threads answer them.  A connection has at most
one request under way, so its responses come in request order; the loop reads its
next request once the answer is sent.  A fetch response is a 6-byte header written by
Python and the segment's bytes copied by the kernel (``os.sendfile``), never past the
published end.  A worker writes an answer until the client's socket is full; the rest
waits, parked with the loop, until the socket takes more (a worker then goes on), so a
client that does not read holds no worker.  A parked answer holds at most
``FILES_PER_CONNECTION`` segment files open (the others are opened again when their
turn comes) and no file bytes in memory.  Specified in ``man/kl-protocol.5``.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import logging
import os
import queue
import random
import re
import selectors
import socket
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from kl.errors import InvalidTopicName, KlError, TopicNotFound
from kl.log.config import CONFIG_FILE, TopicConfig
from kl.log.log import DELETED_SUFFIX
from kl.log.messageset import validate_set
from kl.log.segment import Segment
from kl.net import wire
from kl.net.wire import Fetch, ProtocolError, Reader
from kl.topic import Root, validate_name

log = logging.getLogger("kl.serve")

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
LOOPBACK: tuple[Network, ...] = (ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128"))
SMALL_REQUEST = 64 << 10
"""The largest request when produce is off: fetches, offsets and kl's lookups are tiny."""
RECV_CHUNK = 256 << 10
KL_FORMAT = "kl"
MAX_FETCHES = 1000
"""The most fetches one MULTIFETCH may hold."""
FILES_PER_CONNECTION = 16
"""The most segment files an answer holds open while it waits to be sent: the spans past
them are closed and opened again (the same file, checked) when their turn comes."""
MAX_PAYLOAD = (1 << 31) - 1 - 2
"""A response's size field is an int32 and counts the error code: longer fetches are cut short."""
SWEEP_INTERVAL = 0.25
"""How often connections are checked against the idle and request timeouts."""
ACCEPT_PAUSE = 0.5
"""How long accepting stops when the process is out of file descriptors."""
STOP_GRACE = 5.0
"""After the request timeout at shutdown: how long workers still get to give connections back."""


class ServerError(KlError):
    """``kl serve`` cannot start as asked (bad bind address, port in use, unsafe settings)."""


@dataclass
class ServeConfig:
    """What ``kl serve`` serves, to whom, and within which bounds."""

    bind: str = "127.0.0.1"
    port: int = 9092
    allow: tuple[Network, ...] = ()
    """The only networks connections may come from (default: loopback); needed to bind elsewhere."""
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
    """Close a connection that takes longer to send one request, or to take one whole response."""
    networks: tuple[Network, ...] = field(init=False, default=())

    def __post_init__(self) -> None:
        self.networks = tuple(self.allow) or LOOPBACK
        try:
            address = ipaddress.ip_address(self.bind)
        except ValueError:
            raise ServerError(f"--bind needs an IP address, not {self.bind!r}") from None
        if not address.is_loopback and not self.allow:
            raise ServerError(f"binding to {self.bind} needs --allow CIDR naming who may connect")
        if not 0 <= self.port < 65536:
            raise ServerError(f"port {self.port} is not between 0 and 65535")
        for name in ("workers", "max_connections", "max_request_bytes"):
            if getattr(self, name) < 1:
                raise ServerError(f"{name} must be at least 1, not {getattr(self, name)}")
        for name in ("idle_timeout", "request_timeout"):
            if not getattr(self, name) > 0:
                raise ServerError(f"{name} must be positive, not {getattr(self, name)}")

    def allows(self, host: str) -> bool:
        """Whether a connection from ``host`` may be served (an IPv4 address mapped into
        IPv6, as a dual-stack socket reports it, counts as the IPv4 address)."""
        try:
            address = ipaddress.ip_address(host.partition("%")[0])
        except ValueError:
            return False
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        return any(address in net for net in self.networks)

    @property
    def request_limit(self) -> int:
        return self.max_request_bytes if self.allow_produce else SMALL_REQUEST


class Connection:
    """A client's socket and what has been read of its next request."""

    __slots__ = ("sock", "peer", "kl", "buffer", "last_active", "started", "out")

    def __init__(self, sock: socket.socket, peer: str):
        self.sock = sock
        self.peer = peer
        self.kl = False
        self.buffer = bytearray()
        """The request being received; never more than one (reads stop at its end)."""
        self.last_active = time.monotonic()
        self.started: float | None = None
        """When the request being received began (None between requests)."""
        self.out: _Response | None = None
        """The answer not yet sent (None between requests)."""


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
        self._wake_r, self._wake_w = socket.socketpair()
        """Wakes the loop; socket objects, so a wake after they are closed fails cleanly
        (a raw descriptor number may belong to another file by then)."""
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._work: queue.SimpleQueue[tuple[Connection, bytearray | None] | None] = queue.SimpleQueue()
        self._returned: queue.SimpleQueue[tuple[Connection, str]] = queue.SimpleQueue()
        """Connections workers are done with, and what comes next: READ, WRITE (the rest of
        the answer, once the socket takes more) or CLOSE."""
        self._connections: set[Connection] = set()
        self._busy = 0
        self._accepting = True
        self._resume_at = 0.0
        self._stopping = threading.Event()
        self._identities: dict[str, tuple[int, int]] = {}
        """topic -> (device, inode) of the topic.json its cached config was read from."""

    def _listen(self) -> socket.socket:
        c = self.config
        family = socket.AF_INET6 if ":" in c.bind else socket.AF_INET
        try:
            sock = socket.create_server((c.bind, c.port), family=family, backlog=1024)
        except OSError as e:
            raise ServerError(f"cannot listen on {c.bind}:{c.port}: {os.strerror(e.errno) if e.errno else e}") from None
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
        next_sweep = 0.0
        finished = False
        try:
            while not self._stopping.is_set():
                for key, _ in sel.select(timeout=SWEEP_INTERVAL):
                    if key.data == "accept":
                        self._accept()
                    elif key.data == "wake":
                        self._drain_wake()
                    elif key.data.out is not None:
                        self._send_more(key.data)
                    else:
                        self._readable(key.data)
                self._take_back()
                now = time.monotonic()
                if now >= next_sweep:
                    self._sweep(now)
                    next_sweep = now + SWEEP_INTERVAL
                if not self._accepting and now >= self._resume_at:
                    sel.register(self.listener, selectors.EVENT_READ, "accept")
                    self._accepting = True
            finished = self._shutdown(workers)
        finally:
            sel.close()
            self.listener.close()
            for conn in self._connections:
                _discard(conn)
            if finished:  # else a stuck worker may still wake it
                self._wake_r.close()
                self._wake_w.close()

    def stop(self) -> None:
        """Stop accepting and reading; responses under way are finished.  Safe from a signal handler."""
        self._stopping.set()
        self._wake()

    def _shutdown(self, workers: list[threading.Thread]) -> bool:
        """Close the listener and idle connections, finish the answers under way (a request
        timeout, then cut them short), stop the workers; whether they all stopped."""
        if self._accepting:
            self._selector.unregister(self.listener)
        self.listener.close()
        for conn in [c for c in self._connections if self._registered(c) and c.out is None]:
            self._close(conn, None)
        deadline = time.monotonic() + self.config.request_timeout
        cut = False
        while self._connections:  # each one busy with a worker or parked with an answer
            now = time.monotonic()
            if now >= deadline + (STOP_GRACE if cut else 0):
                if cut:
                    log.warning("stopped with %d requests unfinished", self._busy)
                    return False
                log.warning("cutting %d responses short after %g s", len(self._connections), self.config.request_timeout)
                for conn in list(self._connections):
                    if self._registered(conn):
                        self._close(conn, None)
                    else:
                        with contextlib.suppress(OSError):
                            conn.sock.shutdown(socket.SHUT_RDWR)
                cut = True
            for key, _ in self._selector.select(timeout=0.1):
                if key.data == "wake":
                    self._drain_wake()
                else:
                    self._send_more(key.data)
            self._take_back(stopping=True)
        for _ in workers:
            self._work.put(None)
        for w in workers:
            w.join()
        log.info("stopped")
        return True

    def _wake(self) -> None:
        """Wake the loop (from a worker, ``stop``, a signal handler).  A full buffer means
        a wake is pending; a closed socket, that the loop has ended (``stop`` raced it)."""
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def _drain_wake(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while self._wake_r.recv(4096):
                pass

    def _accept(self) -> None:
        for _ in range(64):
            try:
                sock, address = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    log.warning("not accepting for %g s: %s", ACCEPT_PAUSE, e.strerror or e)
                    self._selector.unregister(self.listener)
                    self._accepting = False
                    self._resume_at = time.monotonic() + ACCEPT_PAUSE
                    return
                continue  # the peer gave up before it was accepted, and the like
            peer = f"{address[0]}:{address[1]}"
            if not self.config.allows(address[0]):
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
        """Read what is missing of the connection's request, no more; hand it over once whole."""
        try:
            need = self._needed(conn)
            data = conn.sock.recv(min(need, RECV_CHUNK))
        except (BlockingIOError, InterruptedError):
            return
        except Drop as e:
            self._close(conn, str(e))
            return
        except OSError as e:
            self._close(conn, f"read failed: {_reason(e)}")
            return
        if not data:
            self._close(conn, None if not conn.buffer else "closed in the middle of a request")
            return
        conn.last_active = time.monotonic()
        if conn.started is None:
            conn.started = conn.last_active
        conn.buffer += data
        try:
            if self._needed(conn):
                return
        except Drop as e:
            self._close(conn, str(e))
            return
        request, conn.buffer, conn.started = conn.buffer, bytearray(), None
        self._selector.unregister(conn.sock)
        self._busy += 1
        self._work.put((conn, request))

    def _send_more(self, conn: Connection) -> None:
        """A parked answer's socket takes more: a worker goes on sending it."""
        self._selector.unregister(conn.sock)
        self._busy += 1
        self._work.put((conn, None))

    def _needed(self, conn: Connection) -> int:
        """Bytes still missing from the request being received (its size checked first)."""
        if len(conn.buffer) < wire.SIZE.size:
            return wire.SIZE.size - len(conn.buffer)
        (size,) = wire.SIZE.unpack_from(conn.buffer)
        if not 2 <= size <= self.config.request_limit:
            raise Drop(f"request of {size} bytes refused (limit {self.config.request_limit})")
        return wire.SIZE.size + size - len(conn.buffer)

    def _take_back(self, stopping: bool = False) -> None:
        """Connections a worker is done with: read their next request (unless
        ``stopping``), or wait until their socket takes more of the answer."""
        while True:
            try:
                conn, then = self._returned.get_nowait()
            except queue.Empty:
                return
            self._busy -= 1
            if then == WRITE:
                self._selector.register(conn.sock, selectors.EVENT_WRITE, conn)
            elif then == CLOSE or stopping:
                self._close(conn, None)
            else:
                conn.last_active = time.monotonic()
                self._selector.register(conn.sock, selectors.EVENT_READ, conn)

    def _sweep(self, now: float) -> None:
        config = self.config
        for conn in [c for c in self._connections if self._registered(c)]:
            if conn.out is not None:
                if now > conn.out.deadline:
                    self._close(conn, "response not taken within the request timeout")
            elif conn.started is not None and now - conn.started > config.request_timeout:
                self._close(conn, f"request not complete after {config.request_timeout:g} s")
            elif conn.started is None and now - conn.last_active > config.idle_timeout:
                self._close(conn, f"idle for {config.idle_timeout:g} s")

    def _registered(self, conn: Connection) -> bool:
        """Whether the loop is reading from the connection (else a worker has it)."""
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
        _discard(conn)

    # ----------------------------------------------------------------- workers

    def _worker(self) -> None:
        """Answer requests, or go on sending a parked answer (``request`` None); give each
        connection back to the loop, to read its next request, to wait until its socket
        takes more, or to be closed (it failed)."""
        while (item := self._work.get()) is not None:
            conn, request = item
            reason = None
            then = READ
            try:
                if request is not None:
                    self._handle(conn, memoryview(request)[wire.SIZE.size :])
                if conn.out is not None and not self._flush(conn):
                    then = WRITE
            except Drop as e:
                reason = str(e)
            except ProtocolError as e:
                reason = f"bad request: {e}"
            except KlError as e:
                reason = str(e)
            except OSError as e:
                reason = _reason(e)
            except Exception as e:  # a bug: this connection goes, the daemon stays
                reason = f"unexpected {type(e).__name__}: {e}"
            if reason is not None:
                log.warning("closed %s: %s", conn.peer, reason)
                then = CLOSE
            self._returned.put((conn, then))
            self._wake()

    def _flush(self, conn: Connection) -> bool:
        """Send what is left of the connection's answer: True once all of it went,
        False when the socket is full (the rest waits).  TCP_CORK makes one stream of it."""
        out, sock = conn.out, conn.sock
        assert out is not None
        if not out.corked:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)
            out.corked = True
        pieces = out.pieces
        while pieces:
            piece = pieces[0]
            try:
                if isinstance(piece, _Span):
                    if not piece.send(sock):
                        return False
                else:
                    sent = sock.send(piece)
                    if sent < len(piece):
                        pieces[0] = piece[sent:]
                        continue
            except (BlockingIOError, InterruptedError):
                return False
            pieces.popleft()
        conn.out = None
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 0)
        return True

    def _handle(self, conn: Connection, request: memoryview) -> None:
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
                if isinstance(part, _Span):
                    if held < FILES_PER_CONNECTION:
                        held += 1
                    else:
                        part.close()  # opened again when its turn comes
        except BaseException:
            for part in parts:
                if isinstance(part, _Span):
                    part.close()
            raise
        self._respond(conn, parts, wire.NO_ERROR)

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
        except (_Refused, KlError) as e:
            return self._error(conn, *_coded(e))
        if span is None:
            return (wire.NO_ERROR, b"")
        return _Span(*span)

    def _offsets(self, conn: Connection, reader: Reader) -> None:
        topic = reader.string()
        partition, time_ms, max_offsets = reader.unpack(wire.PARTITION_TIME_COUNT)
        reader.done()
        try:
            if self._topic(conn, topic, partition) is None:
                offsets = [0] if time_ms in (-1, -2) else []  # Kafka 0.7's getEmptyOffsets
            else:
                offsets = self.root.log(topic, partition).offsets_before(time_ms, max(0, max_offsets))
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
                raise Drop(f"produce to {p.topic}/{p.partition} refused: {_coded(e)[1]}") from None
        for p, partition, count in checked:
            self.root.log(p.topic, partition).append(p.data, count)

    def _checked(self, conn: Connection, topic: str, partition: int, data: bytes, count: int | None) -> tuple[int, int]:
        """The partition a set goes to (Kafka 0.7's -1: a random one) and its message count,
        once produce is allowed there and every message checked."""
        if not self.config.allow_produce:
            raise _Refused(wire.NOT_ALLOWED, KlError("produce is off on this server (kl serve --allow-produce)"))
        if partition == -1:
            config = self._topic(conn, topic, 0, strict=True)
            assert config is not None
            partition = random.randrange(config.partitions)
        config = self._topic(conn, topic, partition, strict=True)
        assert config is not None
        found = validate_set(data, getattr(config, "format", KL_FORMAT), config.max_message_bytes)
        if count is not None and count != found:
            raise _Refused(wire.INVALID_MESSAGE, KlError(f"the set holds {found} messages, not {count}"))
        return partition, found

    def _hello(self, conn: Connection, reader: Reader) -> None:
        reader.int16()
        reader.string()
        self._reply(conn, wire.NO_ERROR, wire.INT16.pack(wire.VERSION) + wire.string("kl"))

    def _topics(self, conn: Connection, reader: Reader) -> None:
        reader.done()
        parts = []
        try:
            names = [n for n in self.root.topics() if self._served(n)]
        except KlError as e:
            self._reply_error(conn, *_coded(e))
            return
        for name in names:
            try:
                config = self.root.config(name)
            except KlError:
                continue
            parts.append(wire.string(name) + wire.string(config.to_json().decode()))
        self._reply(conn, wire.NO_ERROR, wire.INT32.pack(len(parts)) + b"".join(parts))

    def _describe(self, conn: Connection, reader: Reader) -> None:
        topic = reader.string()
        reader.done()
        try:
            self._topic(conn, topic, 0, strict=True)
            info = self.root.describe(topic)
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

    def _lookup(self, conn: Connection, reader: Reader, call) -> None:  # type: ignore[no-untyped-def]
        topic = reader.string()
        partition, value = reader.unpack(wire.PARTITION_INT64)
        reader.done()
        try:
            self._topic(conn, topic, partition, strict=True)
            result = call(self.root.log(topic, partition), value)
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
            partition, count = self._checked(conn, topic, partition, data, count)
            offset = self.root.log(topic, partition).append(data, count, fsync=bool(fsync))
        except (_Refused, KlError) as e:
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
            config = self._config(topic)
        except TopicNotFound as e:
            if conn.kl or strict:
                raise _Refused(wire.TOPIC_NOT_FOUND, e) from None
            return None
        if not 0 <= partition < config.partitions:
            error = TopicNotFound(f"topic {topic!r} has partitions 0 to {config.partitions - 1}, not {partition}")
            raise _Refused(wire.WRONG_PARTITION if not conn.kl else wire.TOPIC_NOT_FOUND, error)
        return config

    def _config(self, topic: str) -> TopicConfig:
        """The topic's config, read again when its ``topic.json`` is another file than the
        one cached (the topic was deleted and created again, maybe in another format)."""
        try:
            st = os.stat(os.path.join(self.root.path, topic, CONFIG_FILE))
        except OSError:
            self.root.forget(topic)
        else:
            identity, seen = (st.st_dev, st.st_ino), self._identities.get(topic)
            if seen != identity:
                if seen is not None:
                    self.root.forget(topic)
                self._identities[topic] = identity
        return self.root.config(topic)

    @staticmethod
    def _code(conn: Connection, code: int) -> int:
        """kl's catch-all code is Kafka 0.7's unknown error on a Kafka 0.7 connection."""
        return wire.UNKNOWN if code == wire.KL_ERROR and not conn.kl else code

    def _error(self, conn: Connection, code: int, error: BaseException) -> _Part:
        return (self._code(conn, code), wire.error_payload(error)[1] if conn.kl else b"")

    def _reply(self, conn: Connection, code: int, body: bytes) -> None:
        self._answer(conn).pieces.append(memoryview(wire.HEAD.pack(2 + len(body), code) + body))

    def _answer(self, conn: Connection) -> _Response:
        """The connection's answer being put together (sent by ``_flush``)."""
        if conn.out is None:
            conn.out = _Response(time.monotonic() + self.config.request_timeout)
        return conn.out

    def _reply_error(self, conn: Connection, code: int, error: BaseException, plain: bytes = b"") -> None:
        """An error answer: the JSON on a kl connection, Kafka 0.7's ``plain`` bytes on another."""
        self._reply(conn, self._code(conn, code), wire.error_payload(error)[1] if conn.kl else plain)

    def _respond(self, conn: Connection, parts: list[_Part], outer: int | None) -> None:
        """Answer with parts as ``size error payload`` each (under one more header when
        ``outer`` is a code: MULTIFETCH); segment spans go by ``os.sendfile``.  Spans are
        cut short where the response would pass an int32's size."""
        room = MAX_PAYLOAD
        pieces: list[memoryview | _Span] = []
        for part in parts:
            room -= 0 if outer is None else wire.HEAD.size
            if isinstance(part, _Span):
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
        out = self._answer(conn)
        if outer is not None:
            out.pieces.append(memoryview(wire.HEAD.pack(2 + MAX_PAYLOAD - room, outer)))
        out.pieces.extend(pieces)


class _Span:
    """Bytes of a segment file an answer sends: held open, or closed (past a connection's
    ``FILES_PER_CONNECTION``) and opened again when their turn comes, by its name or the
    name retention sets it aside under, only if it is still the same file."""

    __slots__ = ("segment", "position", "count", "identity")

    def __init__(self, segment: Segment, position: int, count: int):
        self.segment = segment
        self.position = position
        self.count = count
        self.identity: tuple[int, int] | None = None

    def close(self) -> None:
        if self.segment.fd >= 0:
            st = os.fstat(self.segment.fd)
            self.identity = (st.st_dev, st.st_ino)
            self.segment.close()

    def send(self, sock: socket.socket) -> bool:
        """Copy the bytes to the socket, in the kernel: True once all went, False when
        the socket is full.  Raises ``Drop`` when the file is gone or shorter."""
        segment = self.segment
        if segment.fd < 0:
            segment.fd = self._reopen()
        while self.count > 0:
            try:
                sent = os.sendfile(sock.fileno(), segment.fd, self.position, self.count)
            except (BlockingIOError, InterruptedError):
                return False
            if sent == 0:
                raise Drop(f"{segment.path} is shorter than its published end")
            self.position += sent
            self.count -= sent
        segment.close()
        return True

    def _reopen(self) -> int:
        path = self.segment.path
        for name in (path, path + DELETED_SUFFIX):
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            except OSError as e:
                raise Drop(f"cannot open {name} again: {_reason(e)}") from None
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) == self.identity:
                return fd
            os.close(fd)
        raise Drop(f"{path} was deleted before the answer that reads it was sent")


class _Response:
    """What is left to send of a connection's answer: bytes and segment spans, in order."""

    __slots__ = ("pieces", "deadline", "corked")

    def __init__(self, deadline: float):
        self.pieces: deque[memoryview | _Span] = deque()
        self.deadline = deadline
        """When the client must have taken all of it (the request timeout)."""
        self.corked = False

    def close(self) -> None:
        for piece in self.pieces:
            if isinstance(piece, _Span):
                piece.segment.close()
        self.pieces.clear()


READ, WRITE, CLOSE = "read", "write", "close"
"""What the loop does with a connection a worker gives back."""
_Part = tuple[int, bytes] | _Span


class _Refused(Exception):
    def __init__(self, code: int, error: BaseException):
        self.code = code
        self.error = error


def _coded(error: KlError | _Refused) -> tuple[int, BaseException]:
    """The code and error to answer with: a refusal's own, or the one ``wire`` gives a ``KlError``."""
    return (error.code, error.error) if isinstance(error, _Refused) else (wire.error_payload(error)[0], error)


def _discard(conn: Connection) -> None:
    """Close a connection's socket and the files of its unsent answer."""
    if conn.out is not None:
        conn.out.close()
        conn.out = None
    conn.sock.close()


def _reason(error: OSError) -> str:
    if error.errno in (errno.EPIPE, errno.ECONNRESET):
        return "the peer went away"
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
    wire.DESCRIBE: Server._describe,
}
