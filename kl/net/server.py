"""``kl serve``'s core: connections, limits and workers, shared by its protocols' front ends.

A front end (``FrontEnd``) answers one protocol; the server listens on one port per
protocol, each protocol's front end given by the caller (``kl.net.daemon`` wires Kafka
0.7's, ``kl.net.kafka07``, and today's Kafka protocol's, ``kl.net.kafka``).  The core knows
no protocol but that a request is framed as an int32 size and the bytes it counts.

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

A request that has to wait for data (a Kafka fetch with ``max_wait_ms``) holds no worker
either: its connection is parked with one waiter thread, which watches the partitions
it waits on (``kl.follow.Watch``) and hands it back to a worker once one of them grew
by enough or its time is up.

A listener whose security protocol is SSL or SASL_SSL speaks TLS (``kl.net.tls``): the
loop does the handshake on the non-blocking socket, a worker writes answers through it
(segment bytes read and encrypted: ``sendfile`` cannot go through TLS), and bytes TLS has
decrypted but not handed over (``pending``) are read without waiting for the socket.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import ipaddress
import logging
import os
import queue
import re
import selectors
import socket
import ssl
import struct
import termios
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from kl.errors import KlError
from kl.follow import Watch
from kl.log.config import CONFIG_FILE, TopicConfig
from kl.log.log import DELETED_SUFFIX, Log
from kl.log.segment import Segment
from kl.net.acls import Acls, Authorizer
from kl.net.frames import SIZE, ProtocolError
from kl.net.metrics import Endpoint, Metrics, Traffic
from kl.net.repeats import Repeats, more
from kl.net.tls import RECORD_HANDSHAKE, Tls, TlsError
from kl.topic import Root

log = logging.getLogger("kl.serve")

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
LOOPBACK: tuple[Network, ...] = (ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128"))
SMALL_REQUEST = 1 << 20
"""The largest request when produce is off: a Kafka fetch of every partition a consumer
may be assigned (2,000 partitions are 84 KB; this takes about 25,000), an admin request
naming thousands of topics."""
REQUEST_AROUND = 64 << 10
"""Room in a produce request for what is around its largest message (its header, topic
and partition names, a batch's header)."""
LARGEST_RECHECK = 5.0
"""How long the largest message served topics take is trusted (``Server._request_limit``)."""
RECV_CHUNK = 256 << 10
TLS_CHUNK = 256 << 10
"""The segment bytes read at a time for a TLS connection (which ``sendfile`` cannot serve)."""
FILES_PER_CONNECTION = 16
"""The most segment files an answer holds open while it waits to be sent: the spans past
them are closed and opened again (the same file, checked) when their turn comes."""
SWEEP_INTERVAL = 0.25
"""How often connections are checked against the idle and request timeouts."""
ACCEPT_PAUSE = 0.5
"""How long accepting stops when the process is out of file descriptors."""
STOP_GRACE = 5.0
"""After the request timeout at shutdown: how long workers still get to give connections back."""
WAIT_CHECK = 0.1
"""How often the waiter reads the ends of the partitions parked requests wait on, whatever
inotify says (it sees nothing that another NFS client writes)."""
WAIT_PICKUP = 0.01
"""The longest a newly parked request waits before the waiter watches it (and reads its ends)."""
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
"""The SASL mechanisms ``kl serve`` can take (``ServeConfig.sasl_mechanisms``)."""


class ServerError(KlError):
    """``kl serve`` cannot start as asked (bad bind address, port in use, unsafe settings)."""


NO_CERTIFICATE = "an SSL or SASL_SSL listener needs a certificate and its key (--tls-cert, --tls-key)"
LIVE = frozenset({
    "allow", "networks", "allow_produce", "allow_admin", "auto_create", "default_partitions", "topics",
    "max_connections", "max_request_bytes", "idle_timeout", "request_timeout", "answer_memory",
    "tls_cert", "tls_key", "tls_ca", "tls_client_auth", "tls_principal_rules",
    "sasl_mechanisms", "failed_authentication_delay", "acls", "super_users",
})  # fmt: skip
"""The ``ServeConfig`` fields a running server changes when given a new config
(``Server.apply``); the others (addresses, ports, listeners, workers, and any field not
named here) need a restart."""


@dataclass
class ServeConfig:
    """What ``kl serve`` serves, to whom, and within which bounds."""

    bind: str = "127.0.0.1"
    port: int | None = 9092
    """Kafka 0.7's port (None: not served; 0: any free port)."""
    kafka_bind: str | None = None
    """The address of today's Kafka protocol (None: ``bind``)."""
    kafka_port: int | None = None
    """Today's Kafka protocol's port (None: not served; 0: any free port)."""
    advertised: str | None = None
    """The host Kafka clients are told to connect to (Metadata); None: the bound address."""
    allow: tuple[Network, ...] = ()
    """The only networks connections may come from (default: loopback); needed to bind elsewhere."""
    allow_produce: bool = False
    allow_admin: bool = False
    """Take changes to topics from Kafka's admin clients (create, delete, configure)."""
    auto_create: bool = False
    """Create a topic a Kafka client names (Metadata, Produce) that does not exist."""
    default_partitions: int = 1
    """The partitions of a topic created without a number (Kafka's ``num.partitions``)."""
    topics: re.Pattern[str] | None = None
    """Serve only topics whose whole name matches."""
    workers: int = 8
    max_connections: int = 1024
    max_request_bytes: int = 8 << 20
    """The largest request accepted when produce is on (a message set and its header)."""
    idle_timeout: float = 600.0
    """Close a connection that sent no request for this long."""
    request_timeout: float = 30.0
    """Close a connection that takes longer to send one request, or that takes nothing of
    its answer for this long."""
    answer_memory: int = 256 << 20
    """The bytes of answers held in memory for clients yet to take them, in all: past it
    a fetch answer carries one message (``Server.reserve``)."""
    listeners: tuple[tuple[str, str, int], ...] = ()
    """More listeners of today's Kafka protocol: (security protocol, address, port)."""
    port_tls: bool = False
    """Kafka 0.7's port over TLS (its listener's security protocol SSL)."""
    port_sasl: bool = False
    """Kafka 0.7's port takes only kl clients that authenticate with SASL (kl's AUTHENTICATE,
    ``sasl_mechanisms``) before any other request but HELLO."""
    tls_cert: str | None = None
    """The server's certificate (PEM, its chain after it), for SSL and SASL_SSL listeners."""
    tls_key: str | None = None
    tls_ca: str | None = None
    """The CAs that sign client certificates (PEM)."""
    tls_client_auth: str = "none"
    """Kafka's ``ssl.client.auth``: none, requested or required."""
    tls_principal_rules: str | None = None
    """Kafka's ``ssl.principal.mapping.rules`` (None: ``DEFAULT``, the subject's DN)."""
    sasl_mechanisms: tuple[str, ...] = SASL_MECHANISMS
    """The SASL mechanisms the SASL listeners take, in the order SaslHandshake names them."""
    failed_authentication_delay: float = 0.25
    """How long the answer to a host's second failed SASL authentication in a row waits
    (each further one twice as long, up to 8 s; 0: none)."""
    acls: bool = False
    """Enforce Kafka's ACLs kept in the root (``kl.net.acls``) on every request."""
    super_users: tuple[str, ...] = ()
    """Principals (``User:NAME``) the ACLs do not bind: they may do anything."""
    metrics: tuple[str | None, int] | None = None
    """Where ``/metrics`` is served over HTTP (``kl.net.metrics``): (address or None for
    ``bind``, port; 0: any free port); None: nowhere."""
    networks: tuple[Network, ...] = field(init=False, default=())

    def __post_init__(self) -> None:
        self.networks = tuple(self.allow) or LOOPBACK
        if self.port is None and self.kafka_port is None and not self.listeners:
            raise ServerError("nothing to serve: give a port for Kafka 0.7's protocol, today's Kafka protocol, or both")
        for bind, port in self.addresses() + ([] if self.metrics is None else [(self.metrics[0] or self.bind, self.metrics[1])]):
            try:
                address = ipaddress.ip_address(bind)
            except ValueError:
                raise ServerError(f"a listening address must be an IP address, not {bind!r}") from None
            if not address.is_loopback and not self.allow:
                raise ServerError(f"binding to {bind} needs --allow CIDR naming who may connect")
            if not 0 <= port < 65536:
                raise ServerError(f"port {port} is not between 0 and 65535")
        if self.tls_cert is None and any(security in TLS_PROTOCOLS for security, _, _ in self.endpoints()):
            raise ServerError(NO_CERTIFICATE)
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ServerError("a TLS certificate needs its key, and a key its certificate (--tls-cert, --tls-key)")
        for name in ("workers", "max_connections", "max_request_bytes", "default_partitions", "answer_memory"):
            if getattr(self, name) < 1:
                raise ServerError(f"{name} must be at least 1, not {getattr(self, name)}")
        if not self.sasl_mechanisms or not set(self.sasl_mechanisms) <= set(SASL_MECHANISMS):
            raise ServerError(f"SASL mechanisms must be some of {', '.join(SASL_MECHANISMS)}, not {self.sasl_mechanisms}")
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

    def addresses(self) -> list[tuple[str, int]]:
        """(address, port) of each listener: Kafka 0.7's first, then today's protocol's."""
        return [(bind, port) for _, bind, port in self.endpoints()]

    def endpoints(self) -> list[tuple[str, str, int]]:
        """(security protocol, address, port) of each listener: Kafka 0.7's first, then
        today's protocol's (``kafka_port``'s, in plaintext, then ``listeners``)."""
        found = [] if self.port is None else [("SSL" if self.port_tls else "PLAINTEXT", self.bind, self.port)]
        if self.kafka_port is not None:
            found.append(("PLAINTEXT", self.kafka_bind or self.bind, self.kafka_port))
        return found + list(self.listeners)

    @property
    def request_limit(self) -> int:
        return self.max_request_bytes if self.allow_produce else SMALL_REQUEST


class Connection:
    """A client's socket and what has been read of its next request."""

    __slots__ = (
        "sock", "peer", "front", "security", "principal", "kl", "client", "buffer", "last_active", "started", "out", "wait",
        "handshake", "hang_up", "cut_at",
    )  # fmt: skip

    def __init__(self, sock: socket.socket, peer: str, front: FrontEnd, security: str = "PLAINTEXT"):
        self.sock = sock
        self.peer = peer
        self.front = front
        self.security = security
        """Its listener's security protocol (``SECURITY_PROTOCOLS``)."""
        self.principal = "User:ANONYMOUS"
        """Who the client is, as Kafka names it: ``User:ANONYMOUS`` until SASL or a client
        certificate says otherwise."""
        self.kl = False
        """A kl client (it said HELLO), not a Kafka 0.7 one."""
        self.client: str | None = None
        """The client id its last request gave (today's Kafka protocol)."""
        self.buffer = bytearray()
        """The request being received; never more than one (reads stop at its end)."""
        self.last_active = time.monotonic()
        self.started: float | None = None
        """When the request being received began (None between requests)."""
        self.out: Response | None = None
        """The answer not yet sent (None between requests)."""
        self.wait: Wait | None = None
        """What a parked request waits for (None unless parked)."""
        self.handshake: str | None = HELLO if security in TLS_PROTOCOLS else None
        """Where its TLS handshake is: HELLO (its first byte not yet seen), HANDSHAKE, or
        None once done (and on plaintext listeners)."""
        self.hang_up = False
        """Close it once its answer is sent (a failed SASL authentication, as Kafka's brokers do)."""
        self.cut_at: float | None = None
        """When (monotonic) to close it unless the front end clears this first: an
        unfinished SASL exchange."""


def host_of(conn: Connection) -> str:
    """The IP address a connection comes from, as an ACL's host names it."""
    return conn.peer.rpartition(":")[0]


class Wait:
    """A request waiting for data: until the partitions in ``logs`` (each with the end it
    had) hold ``min_bytes`` more in all, or ``deadline`` (monotonic), whichever comes
    first; ``request`` is whatever the front end needs to answer it then.  (A subclass
    waits for something else: ``kl.net.kafka.coordinator.GroupWait``, for the rest of a group.)"""

    __slots__ = ("logs", "min_bytes", "deadline", "request")

    def __init__(self, logs: list[tuple[Log, int]], min_bytes: int, deadline: float, request: object):
        self.logs = logs
        self.min_bytes = max(1, min_bytes)
        self.deadline = deadline
        self.request = request

    def ready(self, now: float) -> bool:
        if now >= self.deadline:
            return True
        grown = 0
        for log, offset in self.logs:
            try:
                grown += max(0, log.log_end_offset - offset)
            except KlError:
                return True  # the answer says what is wrong
        return grown >= self.min_bytes


class FrontEnd:
    """One protocol's side of the daemon: ``handle`` answers a request (the bytes after
    its size) by queueing its answer (``server.queue``), or parks it (``server.park``) to be
    ``resume``d once its wait is over."""

    def __init__(self, server: Server):
        self.server = server

    def handle(self, conn: Connection, request: memoryview) -> None:
        raise NotImplementedError

    def resume(self, conn: Connection, wait: Wait) -> None:
        raise NotImplementedError

    def stopping(self) -> None:
        """The daemon is stopping: answer what waits for others (it will not wait long
        enough); the requests under way are still answered."""

    def close(self) -> None:
        """The daemon stopped: let go of what the front end holds."""

    def closed(self, conn: Connection) -> None:
        """The connection was closed (its client hung up, or it failed); called by the loop."""

    def listening(self, address: str, port: int) -> None:
        """Log where this protocol is served."""

    def listener_name(self, security: str) -> str:
        """The ``listener`` label of its metrics: Kafka's default listener name, its security protocol."""
        return security


class Drop(Exception):
    """Close this connection, logging the reason (bad request, a peer gone)."""


class WrongDoor(Drop):
    """Close this connection: its client speaks another protocol, or TLS where there is
    none (or the reverse).  Logged once a minute per host and reason, as clients retry."""


SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
"""Kafka's names for what a listener asks of its connections: TLS (SSL), SASL, both or neither."""
TLS_PROTOCOLS = ("SSL", "SASL_SSL")
HELLO, HANDSHAKE = "hello", "handshake"
"""Where a TLS connection's handshake is (``Connection.handshake``)."""


class Listener(NamedTuple):
    """Where a protocol is served (address, port: 0 for any free one), its front end's
    maker (given the server), and its security protocol (one of ``SECURITY_PROTOCOLS``)."""

    bind: str
    port: int
    front_end: Callable[[Server], FrontEnd]
    security: str = "PLAINTEXT"


class Server:
    """Serves ``root`` as configured, a front end on each listener; ``serve_forever``
    until ``stop``."""

    def __init__(
        self,
        root: Root | str | os.PathLike[str],
        config: ServeConfig | None,
        listeners: Sequence[Listener],
    ):
        if not listeners:
            raise ValueError("a server needs a listener (kl.net.daemon.Daemon gives one per configured port)")
        self.root = root if isinstance(root, Root) else Root(root)
        self.config = config or ServeConfig()
        acls = Acls(self.root.path, self.root.lock_timeout)
        self.authorizer = Authorizer(acls, self.config.super_users) if self.config.acls else None
        """Kafka's ACLs, enforced on every request of either protocol (``kl serve --acls``); None: none are."""
        self.metrics = Metrics()
        """What the daemon does, counted (``kl.net.metrics``); served by ``ServeConfig.metrics``."""
        self._traffic: dict[FrontEnd, Traffic] = {}
        """Each listener's counters, by its front end."""
        self._endpoint: Endpoint | None = None
        self.metrics_port: int | None = None
        """The port ``/metrics`` is served on (the one bound, where 0 was asked); None: none."""
        self.listeners: list[tuple[socket.socket, FrontEnd]] = []
        """Each listener's listening socket and front end (one of its own)."""
        self.security: dict[FrontEnd, str] = {}
        """Each listener's security protocol, by its front end."""
        self.ports: list[int] = []
        """Each listener's port (the one bound, where 0 was asked), in their order."""
        self._wrong_doors = Repeats()
        """Clients closed for knocking at the wrong listener, as logged (``_told``)."""
        self._bound: list[tuple[FrontEnd, str, str]] = []
        """Each listener's front end, address bound (``HOST:PORT``) and security protocol."""
        self._tls_listeners = any(listener.security in TLS_PROTOCOLS for listener in listeners)
        self.tls = self._tls(self.config)
        """The TLS side of SSL and SASL_SSL listeners (None without them)."""
        self._reload: Callable[[], None] | bool = False
        """What the loop does next round (``reload``): call it, or (True) read the TLS certificates again."""
        try:
            for listener in listeners:
                if listener.security not in SECURITY_PROTOCOLS:
                    raise ServerError(f"unknown security protocol {listener.security!r}")
                self.ports.append(self._listen(listener, listener.front_end(self)))
            if self.config.metrics is not None:
                self._endpoint = self._serve_metrics(*self.config.metrics)
                self.metrics_port = self._endpoint.port
        except BaseException:
            for sock, _ in self.listeners:
                sock.close()
            raise
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
        self._largest: tuple[float, int] = (0.0, 0)
        """(until when it holds, the largest max_message_bytes of the served topics)."""
        self._held = 0
        """The bytes in memory of the answers under way (``Response.held``), in all."""
        self._held_lock = threading.Lock()
        self._parked: queue.SimpleQueue[Connection | str] = queue.SimpleQueue()
        """Connections handed to the waiter, or STOP_WAITING (answer everything at once
        from now on), CHECK (look at the waits now) or EXIT."""
        self.metrics.answer_memory.set_function(lambda: self._held)
        self.metrics.producer_ids.set_function(lambda: sum(log.producer_ids for log in self.root.open_logs()))

    def _serve_metrics(self, host: str | None, port: int) -> Endpoint:
        host = host or self.config.bind
        try:
            return Endpoint(self.metrics, host, port, lambda client: self.config.allows(client))  # as reloaded
        except OSError as e:
            raise ServerError(f"cannot serve metrics on {host}:{port}: {os.strerror(e.errno) if e.errno else e}") from None

    def _tls(self, config: ServeConfig) -> Tls | None:
        """The TLS side ``config`` gives (its files read now), None without TLS."""
        if not self._tls_listeners and config.tls_cert is None:
            return None
        if config.tls_cert is None or config.tls_key is None:
            raise ServerError(NO_CERTIFICATE)
        try:
            return Tls(config.tls_cert, config.tls_key, config.tls_ca, config.tls_client_auth, config.tls_principal_rules)
        except TlsError as e:
            raise ServerError(str(e)) from None

    def reload(self, read: Callable[[], None] | None = None) -> None:
        """Have the loop call ``read`` (which reads the config again and gives it to
        ``apply``), or without it read the TLS certificates again (new connections get
        them, open ones keep theirs).  Safe from a signal handler: the loop's thread does
        the work, between two of its rounds; a ``KlError`` it raises is logged."""
        self._reload = read or True
        self._wake()

    def _reloaded(self) -> None:
        read, self._reload = self._reload, False
        try:
            if callable(read):
                read()
            else:
                self.read_certificates()
        except KlError as e:
            log.warning("%s", e)
        except Exception as e:  # a bug: the reload goes, the daemon stays
            log.error("reload failed: unexpected %s: %s", type(e).__name__, e)

    def read_certificates(self) -> None:
        """Read the TLS certificates and key again, or keep those in use (logged).  Called
        on the loop's thread (``reload``)."""
        if self.tls is None:
            log.info("no TLS listener: nothing to reload")
            return
        try:
            self.tls.reload()
        except TlsError as e:
            log.warning("kept the TLS certificates in use: %s", e)
            return
        log.info("TLS certificates reloaded from %s", self.tls.cert)

    def apply(self, config: ServeConfig) -> None:
        """Serve by ``config`` from now on: its ``LIVE`` settings at once (new connections
        and requests see them; the TLS certificates, read again, go to new connections),
        the others kept as they are.  Called on the loop's thread (from ``reload``'s
        ``read``).  Raises ``ServerError``, having changed nothing, when the TLS files
        cannot be used or the settings kept make the config invalid."""
        old = self.config
        kept = {f.name: getattr(old, f.name) for f in dataclasses.fields(ServeConfig) if f.init and f.name not in LIVE}
        applied = dataclasses.replace(config, **kept)
        tls = self._tls(applied)
        authorizer = self.authorizer
        if (applied.acls, applied.super_users) != (old.acls, old.super_users):
            authorizer = Authorizer(Acls(self.root.path, self.root.lock_timeout), applied.super_users) if applied.acls else None
        self.config, self.tls, self.authorizer = applied, tls, authorizer  # each read whole by the workers

    def _listen(self, listener: Listener, front: FrontEnd) -> int:
        bind, port = listener.bind, listener.port
        family = socket.AF_INET6 if ":" in bind else socket.AF_INET
        try:
            sock = socket.create_server((bind, port), family=family, backlog=1024)
        except OSError as e:
            raise ServerError(f"cannot listen on {bind}:{port}: {os.strerror(e.errno) if e.errno else e}") from None
        sock.setblocking(False)
        self.listeners.append((sock, front))
        self.security[front] = listener.security
        self._traffic[front] = Traffic(self.metrics, front.listener_name(listener.security))
        host, port = sock.getsockname()[:2]
        self._bound.append((front, f"[{host}]:{port}" if ":" in host else f"{host}:{port}", listener.security))
        return int(port)

    # ----------------------------------------------------------------- the loop

    def serve_forever(self) -> None:
        """Accept and answer until ``stop``; then finish the responses under way and close."""
        sel = self._selector
        for sock, front in self.listeners:
            sel.register(sock, selectors.EVENT_READ, front)
        sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        workers = [threading.Thread(target=self._worker, name=f"kl-serve-{i}", daemon=True) for i in range(self.config.workers)]
        workers.append(threading.Thread(target=self._waiter, name="kl-serve-waiter", daemon=True))
        for w in workers:
            w.start()
        for sock, front in self.listeners:
            front.listening(sock.getsockname()[0], sock.getsockname()[1])
        if self._endpoint is not None:
            self._endpoint.start()
        next_sweep = 0.0
        finished = False
        try:
            while not self._stopping.is_set():
                for key, _ in sel.select(timeout=SWEEP_INTERVAL):
                    if isinstance(key.data, FrontEnd):
                        self._accept(key.fileobj, key.data)  # type: ignore[arg-type]
                    elif key.data == "wake":
                        self._drain_wake()
                    elif key.data.handshake is not None:
                        self._handshake(key.data)
                    elif key.data.out is not None:
                        self._send_more(key.data)
                    else:
                        self._readable(key.data)
                if self._reload:
                    self._reloaded()
                self._take_back()
                now = time.monotonic()
                if now >= next_sweep:
                    self._sweep(now)
                    next_sweep = now + SWEEP_INTERVAL
                if not self._accepting and now >= self._resume_at:
                    for sock, front in self.listeners:
                        sel.register(sock, selectors.EVENT_READ, front)
                    self._accepting = True
            finished = self._shutdown(workers)
        finally:
            sel.close()
            for sock, _ in self.listeners:
                sock.close()
            for conn in self._connections:
                self._discard(conn)
            for _, front in self.listeners:
                front.close()
            if self._endpoint is not None:
                self._endpoint.close()
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
        for sock, _ in self.listeners:
            if self._accepting:
                self._selector.unregister(sock)
            sock.close()
        for _, front in self.listeners:
            front.stopping()
        self._parked.put(STOP_WAITING)  # parked requests are answered now
        for conn in [c for c in self._connections if self._registered(c) and c.out is None]:
            self._close(conn, None)
        if self._connections:
            log.info("draining %d connections (at most %g s)", len(self._connections), self.config.request_timeout)
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
        for _ in workers[1:]:
            self._work.put(None)
        self._parked.put(EXIT)
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

    def _accept(self, listener: socket.socket, front: FrontEnd) -> None:
        for _ in range(64):
            try:
                sock, address = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    log.warning("not accepting for %g s: %s", ACCEPT_PAUSE, e.strerror or e)
                    self.metrics.refused.labels(self._traffic[front].name, "out_of_fds").inc()
                    for listening, _ in self.listeners:
                        self._selector.unregister(listening)
                    self._accepting = False
                    self._resume_at = time.monotonic() + ACCEPT_PAUSE
                    return
                continue  # the peer gave up before it was accepted, and the like
            peer = f"{address[0]}:{address[1]}"
            traffic = self._traffic[front]
            if not self.config.allows(address[0]):
                log.warning("refused %s: not in --allow", peer)
                self.metrics.refused.labels(traffic.name, "allow_list").inc()
                sock.close()
                continue
            if len(self._connections) >= self.config.max_connections:
                log.warning("refused %s: %d connections open (--max-connections)", peer, len(self._connections))
                self.metrics.refused.labels(traffic.name, "max_connections").inc()
                sock.close()
                continue
            traffic.created.inc()
            traffic.connections.inc()
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = Connection(sock, peer, front, self.security[front])
            if conn.handshake is not None:
                conn.started = conn.last_active  # the handshake must end within the request timeout
            self._connections.add(conn)
            self._selector.register(sock, selectors.EVENT_READ, conn)

    def _handshake(self, conn: Connection) -> None:
        """Go on with a TLS connection's handshake (its first byte must begin a TLS
        record); once done, its client certificate names its principal."""
        assert self.tls is not None
        if conn.handshake == HELLO:
            try:
                first = conn.sock.recv(1, socket.MSG_PEEK)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                self._close(conn, f"read failed: {_reason(e)}")
                return
            if not first or first[0] != RECORD_HANDSHAKE:
                self._close(conn, None)
                if first:
                    self._told(conn, self._wrong_door(conn, "a plaintext client", plain=True))
                return
            self._selector.unregister(conn.sock)
            conn.sock = self.tls.wrap(conn.sock)
            conn.handshake = HANDSHAKE
            self._selector.register(conn.sock, selectors.EVENT_READ, conn)
        sock = conn.sock
        assert isinstance(sock, ssl.SSLSocket)
        try:
            sock.do_handshake()
        except ssl.SSLWantReadError:
            self._selector.modify(sock, selectors.EVENT_READ, conn)
            return
        except ssl.SSLWantWriteError:
            self._selector.modify(sock, selectors.EVENT_WRITE, conn)
            return
        except OSError as e:
            reason = e.reason if isinstance(e, ssl.SSLError) and e.reason else _reason(e)
            self._close(conn, f"TLS handshake failed: {reason}")
            return
        principal = self.tls.principal(sock)
        if principal is None:
            self._close(conn, "no principal mapping rule matches the subject of the client's certificate")
            return
        conn.principal, conn.handshake, conn.started = principal, None, None
        conn.last_active = time.monotonic()
        self._selector.modify(sock, selectors.EVENT_READ, conn)
        if sock.pending():
            self._readable(conn)

    def _readable(self, conn: Connection) -> None:
        """Read what is missing of the connection's request, no more; hand it over once
        whole.  A TLS connection may hold more than the socket shows (``pending``)."""
        while True:
            try:
                need = self._needed(conn)
                data = conn.sock.recv(min(need, RECV_CHUNK))
            except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                return
            except WrongDoor as e:
                self._close(conn, None)
                self._told(conn, str(e))
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
            self._traffic[conn.front].bytes_in.inc(len(data))
            conn.buffer += data
            try:
                if self._needed(conn):
                    if _pending(conn.sock):
                        continue
                    return
            except WrongDoor as e:
                self._close(conn, None)
                self._told(conn, str(e))
                return
            except Drop as e:
                self._close(conn, str(e))
                return
            request, conn.buffer, conn.started = conn.buffer, bytearray(), None
            self._selector.unregister(conn.sock)
            self._busy += 1
            self._work.put((conn, request))
            return

    def _send_more(self, conn: Connection) -> None:
        """A parked answer's socket takes more: a worker goes on sending it."""
        self._selector.unregister(conn.sock)
        self._busy += 1
        self._work.put((conn, None))

    def _needed(self, conn: Connection) -> int:
        """Bytes still missing from the request being received (its size checked first)."""
        if len(conn.buffer) < SIZE.size:
            return SIZE.size - len(conn.buffer)
        (size,) = SIZE.unpack_from(conn.buffer)
        if conn.buffer[0] == RECORD_HANDSHAKE and conn.handshake is None and conn.security not in TLS_PROTOCOLS:
            raise WrongDoor(self._wrong_door(conn, "a TLS client", plain=False))
        if size < 2 or size > self.config.request_limit and size > self._request_limit():  # (topics read only then)
            raise Drop(f"request of {size} bytes refused (limit {self._request_limit()})")
        return SIZE.size + size - len(conn.buffer)

    def _told(self, conn: Connection, reason: str) -> None:
        """Log a wrong door's closing, once a minute per host and reason."""
        untold = self._wrong_doors.due((host_of(conn), reason))
        if untold is not None:
            log.warning("closed %s: %s%s", conn.peer, reason, more(untold))

    def _wrong_door(self, conn: Connection, who: str, *, plain: bool) -> str:
        """The log line for ``who`` on a listener of the other kind (TLS or not), naming
        this protocol's listeners of the kind it needs."""
        doors = self.doors(type(conn.front), tls=not plain)
        if doors:
            instead = f"{'plaintext' if plain else 'TLS'} is on {', '.join(doors)}"
        else:
            instead = f"this protocol is not served {'in plaintext' if plain else 'over TLS'} here"
        return f"{who} connected to a {'TLS' if plain else 'plaintext'} listener ({instead})"

    def doors(self, front_type: type[FrontEnd], *, tls: bool | None = None) -> list[str]:
        """``HOST:PORT (SECURITY)`` of each listener whose front end is a ``front_type``
        (only those over TLS, or not, when ``tls`` says): where a client that knocked at
        the wrong one is sent."""
        return [
            f"{address} ({security})"
            for front, address, security in self._bound
            if isinstance(front, front_type) and (tls is None or (security in TLS_PROTOCOLS) == tls)
        ]

    def _request_limit(self) -> int:
        """The largest request taken: the configured one or, with produce on, one that
        holds the largest message a served topic takes (its ``max_message_bytes``), so that
        such a message is appended, not cut off with its connection (its client would send
        it again until its delivery timeout).  The topics are looked at again only for a
        request past the configured limit, at most every ``LARGEST_RECHECK`` seconds."""
        if not self.config.allow_produce:
            return self.config.request_limit
        until, largest = self._largest
        if time.monotonic() >= until:
            largest = 0
            with contextlib.suppress(KlError):
                for topic in filter(self.served, self.root.topics()):
                    with contextlib.suppress(KlError):
                        largest = max(largest, self.topic_config(topic).max_message_bytes)
            self._largest = (time.monotonic() + LARGEST_RECHECK, largest)
        return max(self.config.request_limit, largest + REQUEST_AROUND)

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
                if _pending(conn.sock):  # its next request came with the last one
                    self._readable(conn)

    def _sweep(self, now: float) -> None:
        config = self.config
        for conn in [c for c in self._connections if self._registered(c)]:
            if conn.out is not None:
                unsent = _unsent(conn.sock)
                if unsent != conn.out.unsent:  # the client took some since the last look: it reads, if slowly
                    conn.out.unsent, conn.out.deadline = unsent, now + config.request_timeout
                elif now > conn.out.deadline:
                    self._close(conn, "response not taken within the request timeout")
            elif conn.cut_at is not None and now > conn.cut_at:
                self._close(conn, "authentication not complete within the request timeout")
            elif conn.started is not None and now - conn.started > config.request_timeout:
                what = "TLS handshake not finished" if conn.handshake is not None else "request not complete"
                self._close(conn, f"{what} after {config.request_timeout:g} s")
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
        if conn in self._connections:
            self._connections.discard(conn)
            traffic = self._traffic[conn.front]
            traffic.closed.inc()
            traffic.connections.dec()
        self._discard(conn)
        conn.front.closed(conn)

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
                    conn.front.handle(conn, memoryview(request)[SIZE.size :])
                elif conn.wait is not None:
                    wait, conn.wait = conn.wait, None
                    self.metrics.parked.dec()
                    conn.front.resume(conn, wait)
                if conn.wait is not None:
                    self._parked.put(conn)  # the waiter hands it back
                    continue
                if conn.out is not None and not self._flush(conn):
                    then = WRITE
                elif conn.hang_up:
                    then = CLOSE
            except WrongDoor as e:
                self._told(conn, str(e))
                then = CLOSE
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
        out.deadline = time.monotonic() + self.config.request_timeout  # the socket took more: the client reads
        if not out.corked:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)
            out.corked = True
        pieces = out.pieces
        sent = 0
        try:
            while pieces:
                piece = pieces[0]
                try:
                    if isinstance(piece, Span):
                        left = piece.count
                        done = piece.send(sock)
                        sent += left - piece.count
                        if not done:
                            return False
                    else:
                        went = sock.send(piece)  # (TLS sends all of it, or raises: then the same piece again)
                        sent += went
                        if went < len(piece):
                            pieces[0] = piece[went:]
                            continue
                except (BlockingIOError, InterruptedError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
                    return False
                pieces.popleft()
        finally:
            self._traffic[conn.front].bytes_out.inc(sent)
        self._release(out)
        conn.out = None
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 0)
        return True

    # ----------------------------------------------------------------- for front ends

    def queue(self, conn: Connection, *pieces: memoryview | Span) -> None:
        """Add ``pieces`` to the connection's answer (sent by ``_flush``, in order); the
        bytes in memory count against ``answer_memory`` until the answer is done."""
        if conn.out is None:
            conn.out = Response(time.monotonic() + self.config.request_timeout)
        held = sum(piece.nbytes for piece in pieces if isinstance(piece, memoryview))
        conn.out.pieces.extend(pieces)
        conn.out.held += held
        with self._held_lock:
            self._held += held

    def reserve(self, wanted: int) -> int:
        """Room in memory for an answer being built, up to ``wanted`` bytes, taken from
        ``answer_memory`` until ``unreserve``d (0 past it: the answer holds as little as
        will do, as connections that take nothing of their answers must not grow the
        daemon).  The builder queues its answer before giving the room back."""
        with self._held_lock:
            granted = max(0, min(wanted, self.config.answer_memory - self._held))
            self._held += granted
        return granted

    def unreserve(self, granted: int) -> None:
        with self._held_lock:
            self._held -= granted

    @property
    def answers_held(self) -> int:
        """The bytes in memory of the answers under way and the room reserved for them."""
        return self._held

    def _release(self, out: Response) -> None:
        self.unreserve(out.held)
        out.held = 0

    def _discard(self, conn: Connection) -> None:
        """Close a connection's socket and the files of its unsent answer."""
        if conn.out is not None:
            conn.out.close()
            self._release(conn.out)
            conn.out = None
        conn.sock.close()

    def park(self, conn: Connection, wait: Wait) -> None:
        """Answer the request later: once ``wait`` is over, a worker calls the front end's
        ``resume`` (at once when the daemon is stopping)."""
        conn.wait = wait
        self.metrics.parked.inc()

    def allows(self, conn: Connection, operation: str, resource_type: str, name: str, *, logged: bool = True) -> bool:
        """Whether the connection's principal may do ``operation`` (Kafka's ``AclOperation``
        name) on the resource (always, without ``--acls``); a denial is logged unless not
        ``logged`` (a listing that leaves out what may not be seen)."""
        if self.authorizer is None:
            return True
        allowed = self.authorizer.allows(conn.peer, conn.principal, host_of(conn), operation, resource_type, name, logged=logged)
        if not allowed and logged:
            self.metrics.denials.labels(operation, resource_type).inc()
        return allowed

    def listener_of(self, conn: Connection) -> str:
        """The ``listener`` label of the connection's metrics (``FrontEnd.listener_name``)."""
        return self._traffic[conn.front].name

    def recheck(self) -> None:
        """Have the waiter look at the parked requests now (one's wait was ended)."""
        self._parked.put(CHECK)

    def served(self, topic: str) -> bool:
        """Whether ``--topics`` lets this daemon serve ``topic``."""
        pattern = self.config.topics
        return pattern is None or pattern.fullmatch(topic) is not None

    def topic_config(self, topic: str) -> TopicConfig:
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

    # ----------------------------------------------------------------- the waiter

    def _waiter(self) -> None:
        """Hand parked connections back to the workers once their wait is over: when one of
        their partitions grew (inotify wakes the check, which also runs every ``WAIT_CHECK``
        seconds for what inotify cannot see), or their time is up, or the daemon stops."""
        waiting: list[Connection] = []
        watched: dict[Log, int] = {}  # log -> how many parked requests wait on it
        stopping = False
        next_check = 0.0
        with Watch(poll_interval=WAIT_PICKUP, detect_recreation=False) as watch:
            while True:
                try:
                    conn = self._parked.get(timeout=SWEEP_INTERVAL) if not waiting else self._parked.get_nowait()
                    while True:
                        if conn == EXIT:
                            return
                        if conn == STOP_WAITING:
                            stopping = True
                        elif conn != CHECK:
                            assert isinstance(conn, Connection)
                            waiting.append(conn)
                            for log_, _ in conn.wait.logs:  # type: ignore[union-attr]
                                if watched.get(log_, 0) == 0:
                                    watch.add(log_)
                                watched[log_] = watched.get(log_, 0) + 1
                        next_check = 0.0
                        conn = self._parked.get_nowait()
                except queue.Empty:
                    pass
                now = time.monotonic()
                if stopping or now >= next_check:
                    next_check = now + WAIT_CHECK
                    still = []
                    for conn in waiting:
                        wait = conn.wait
                        assert wait is not None
                        if stopping or wait.ready(now):
                            for log_, _ in wait.logs:
                                watched[log_] -= 1
                                if not watched[log_]:
                                    del watched[log_]
                                    watch.remove(log_)
                            self._work.put((conn, None))
                        else:
                            still.append(conn)
                    waiting = still
                if waiting:
                    deadline = min(c.wait.deadline for c in waiting)  # type: ignore[union-attr]
                    if watch.wait(max(0.0, min(deadline - now, WAIT_PICKUP))):
                        next_check = 0.0
                    elif time.monotonic() >= deadline:
                        next_check = 0.0


class Span:
    """Bytes of a segment file an answer sends: held open, or closed (past a connection's
    ``FILES_PER_CONNECTION``) and opened again when their turn comes, by its name or the
    name retention sets it aside under, only if it is still the same file."""

    __slots__ = ("segment", "position", "count", "identity", "direct", "chunk")

    def __init__(self, segment: Segment, position: int, count: int):
        self.segment = segment
        self.position = position
        self.count = count
        self.identity: tuple[int, int] | None = None
        self.direct = 0
        """``O_DIRECT`` when the segment was open past the page cache (``Log.open_segment``)."""
        self.chunk: bytes | None = None
        """The bytes read for a TLS connection that it has not taken yet (sent again as they are)."""

    def close(self) -> None:
        if self.segment.fd >= 0:
            st = os.fstat(self.segment.fd)
            self.identity = (st.st_dev, st.st_ino)
            self.direct = fcntl.fcntl(self.segment.fd, fcntl.F_GETFL) & os.O_DIRECT
            self.segment.close()

    def send(self, sock: socket.socket) -> bool:
        """Copy the bytes to the socket, in the kernel (or, on a TLS connection, read and
        written through TLS): True once all went, False when the socket is full.  Raises
        ``Drop`` when the file is gone or shorter."""
        segment = self.segment
        if segment.fd < 0:
            segment.fd = self._reopen()
        tls = isinstance(sock, ssl.SSLSocket)
        while self.count > 0:
            try:
                if tls:
                    if self.chunk is None:
                        self.chunk = os.pread(segment.fd, min(self.count, TLS_CHUNK), self.position)
                    sent = sock.send(self.chunk) if self.chunk else 0
                    self.chunk = None
                else:
                    sent = os.sendfile(sock.fileno(), segment.fd, self.position, self.count)
            except (BlockingIOError, InterruptedError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
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
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | self.direct)
            except FileNotFoundError:
                continue
            except OSError as e:
                raise Drop(f"cannot open {name} again: {_reason(e)}") from None
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) == self.identity:
                return fd
            os.close(fd)
        raise Drop(f"{path} was deleted before the answer that reads it was sent")


class Response:
    """What is left to send of a connection's answer: bytes and segment spans, in order."""

    __slots__ = ("pieces", "deadline", "corked", "unsent", "held")

    def __init__(self, deadline: float):
        self.pieces: deque[memoryview | Span] = deque()
        self.held = 0
        """The bytes of its pieces in memory (``Server.queue``), counted until it is done."""
        self.deadline = deadline
        """When the client must have taken more of it: the request timeout after the
        answer began or the client last took some (a slow reader is not cut off)."""
        self.corked = False
        self.unsent = -1
        """The bytes the socket held unsent at the last look (``_unsent``)."""

    def close(self) -> None:
        for piece in self.pieces:
            if isinstance(piece, Span):
                piece.segment.close()
        self.pieces.clear()


READ, WRITE, CLOSE = "read", "write", "close"
STOP_WAITING, EXIT, CHECK = "stop waiting", "exit", "check"
"""What the waiter is told besides connections."""
"""What the loop does with a connection a worker gives back."""


def _unsent(sock: socket.socket) -> int:
    """The bytes a socket's send queue holds that the peer has not taken (SIOCOUTQ; -1
    where it cannot tell): they go down while the client reads, even when too little
    was read for the socket to take more of the answer."""
    try:
        return int(struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0])
    except OSError:
        return -1


def _pending(sock: socket.socket) -> int:
    """The bytes TLS has decrypted that the connection has not read (0 in plaintext)."""
    return sock.pending() if isinstance(sock, ssl.SSLSocket) else 0


def _reason(error: OSError) -> str:
    if error.errno in (errno.EPIPE, errno.ECONNRESET):
        return "the peer went away"
    return error.strerror or str(error)
