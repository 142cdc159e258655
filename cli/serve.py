"""``kl serve``: the root's topics over Kafka 0.7's wire protocol and today's Kafka
protocol (``kl.net.server``), and ``kl serve --list``: the daemons registered under the
root (``kl.net.brokers``)."""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
import json
import logging
import re
import signal
import sys

import click
import prometheus_client

from kl.errors import KlError
from kl.net import brokers
from kl.net.acls import check_principal
from kl.net.daemon import Daemon
from kl.net.server import SASL_MECHANISMS, SECURITY_PROTOCOLS, Network, ServeConfig
from kl.net.tls import CLIENT_AUTH
from kl_cli.common import get_root

LIST_COLUMNS = ["address", "kafka", "pid", "since", "topics", "produce"]
DEFAULT_PORT = 9092


def _networks(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[Network, ...]:
    if value is None:
        return ()
    try:
        return tuple(ipaddress.ip_network(cidr.strip()) for cidr in value.split(",") if cidr.strip())
    except ValueError as e:
        raise click.BadParameter(str(e), ctx, param) from None


def _kafka_address(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[str | None, int] | None:
    """``--kafka [HOST:]PORT`` (and ``--metrics``) as (host or None for --bind, port)."""
    if value is None:
        return None
    host, sep, port = value.rpartition(":")
    host = host.strip("[]") if sep else ""
    if not port.isdigit() or not 0 <= int(port) < 65536 or (sep and not host):
        raise click.BadParameter(f"{value!r} is not [HOST:]PORT (PORT 0 to 65535)", ctx, param)
    return host or None, int(port)


def _listeners(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> tuple[tuple[str, str, int], ...]:
    """``--listener PROTOCOL://HOST:PORT`` as (security protocol, host, port)."""
    found = []
    for listener in value:
        security, sep, address = listener.partition("://")
        host, colon, port = address.rpartition(":")
        host = host.strip("[]")
        if security.upper() not in SECURITY_PROTOCOLS or not sep or not colon or not host or not port.isdigit():
            raise click.BadParameter(f"{listener!r} is not PROTOCOL://HOST:PORT ({', '.join(SECURITY_PROTOCOLS)})", ctx, param)
        if not 0 <= int(port) < 65536:
            raise click.BadParameter(f"port {port} is not between 0 and 65535", ctx, param)
        found.append((security.upper(), host, int(port)))
    return tuple(found)


def _principals(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> tuple[str, ...]:
    try:
        return tuple(check_principal(p) for p in value)
    except KlError as e:
        raise click.BadParameter(str(e)) from None


def _pattern(ctx: click.Context, param: click.Parameter, value: str | None) -> re.Pattern[str] | None:
    if value is None:
        return None
    try:
        return re.compile(value)
    except re.error as e:
        raise click.BadParameter(f"{value!r} is not a regular expression: {e}", ctx, param) from None


@click.command(short_help="Serve the root's topics to Kafka clients, today's and 0.7's.")
@click.option("--bind", metavar="ADDRESS", default="127.0.0.1", show_default=True, help="Listen on this IP address.")
@click.option(
    "--port",
    metavar="PORT",
    type=click.IntRange(0, 65535),
    help="Serve Kafka 0.7's protocol on this port (0: any; default 9092 unless --kafka is given alone).",
)
@click.option(
    "--kafka",
    "kafka",
    metavar="[HOST:]PORT",
    callback=_kafka_address,
    help="Serve today's Kafka protocol on this port (0: any), at HOST or --bind.",
)
@click.option(
    "--listener",
    "listeners",
    metavar="PROTOCOL://HOST:PORT",
    multiple=True,
    callback=_listeners,
    help="Serve today's Kafka protocol here too: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL (repeatable).",
)
@click.option("--tls", "port_tls", is_flag=True, help="Serve Kafka 0.7's port over TLS (--tls-cert, --tls-key).")
@click.option(
    "--sasl", "port_sasl", is_flag=True, help="Kafka 0.7's port requires kl clients to authenticate with SASL (--sasl-mechanism)."
)
@click.option("--tls-cert", metavar="FILE", help="The server's certificate (PEM, its chain after it) for TLS listeners.")
@click.option("--tls-key", metavar="FILE", help="The certificate's private key (PEM).")
@click.option("--tls-ca", metavar="FILE", help="The CAs that sign client certificates (PEM).")
@click.option(
    "--tls-client-auth",
    type=click.Choice(CLIENT_AUTH),
    default="none",
    show_default=True,
    help="Ask TLS clients for a certificate (requested), or refuse those without one (required).",
)
@click.option(
    "--tls-principal-rules",
    metavar="RULES",
    help="Kafka's ssl.principal.mapping.rules: the principal a client certificate's subject names.",
)
@click.option(
    "--advertise", metavar="HOST", help="The host name Kafka clients are told to connect to (default: the address bound)."
)
@click.option(
    "--allow",
    metavar="CIDR[,CIDR...]",
    callback=_networks,
    help="Serve only connections from these networks (default: loopback); needed to bind elsewhere.",
)
@click.option("--allow-produce", is_flag=True, help="Accept PRODUCE, MULTIPRODUCE and APPEND (off by default).")
@click.option("--allow-admin", is_flag=True, help="Take changes to topics from Kafka's admin clients and tools (off by default).")
@click.option(
    "--auto-create", is_flag=True, help="Create a topic a Kafka client names in Metadata or Produce that does not exist."
)
@click.option(
    "--partitions",
    "default_partitions",
    metavar="N",
    type=click.IntRange(1, 100_000),
    default=1,
    show_default=True,
    help="Partitions of a topic created without a number (--auto-create, CreateTopics).",
)
@click.option("--topics", "topics", metavar="REGEX", callback=_pattern, help="Serve only topics whose whole name matches.")
@click.option(
    "--workers", metavar="N", type=click.IntRange(min=1), default=8, show_default=True, help="Threads answering requests."
)
@click.option(
    "--max-connections",
    metavar="N",
    type=click.IntRange(min=1),
    default=1024,
    show_default=True,
    help="Refuse connections beyond N.",
)
@click.option(
    "--max-request-bytes",
    metavar="BYTES",
    type=click.IntRange(min=1024),
    default=8 << 20,
    show_default=True,
    help="The largest request with --allow-produce (without it: 1 MiB).",
)
@click.option(
    "--answer-memory",
    metavar="BYTES",
    type=click.IntRange(min=1 << 20),
    default=256 << 20,
    show_default=True,
    help="Answers held for clients yet to take them, in all; past it a fetch gets one message.",
)
@click.option(
    "--idle-timeout",
    metavar="SECONDS",
    type=click.FloatRange(min=0, min_open=True),
    default=600.0,
    show_default=True,
    help="Close a connection that sends no request for this long.",
)
@click.option(
    "--request-timeout",
    metavar="SECONDS",
    type=click.FloatRange(min=0, min_open=True),
    default=30.0,
    show_default=True,
    help="Close a connection that takes longer to send a request, or takes nothing of an answer for this long.",
)
@click.option(
    "--sasl-mechanism",
    "sasl_mechanisms",
    multiple=True,
    type=click.Choice(SASL_MECHANISMS),
    help="A SASL mechanism the SASL listeners take (repeat for more; default: all three; users: kl users).",
)
@click.option(
    "--failed-authentication-delay",
    metavar="SECONDS",
    type=click.FloatRange(min=0),
    default=0.25,
    show_default=True,
    help="How long a host's second failed SASL login in a row waits for its answer (each further one twice as long, up to 8 s).",
)
@click.option("--acls", is_flag=True, help="Enforce the ACLs kept in the root on every request of both protocols (kl acls).")
@click.option(
    "--super-user",
    "super_users",
    metavar="PRINCIPAL",
    multiple=True,
    callback=_principals,
    help="A principal (User:NAME) the ACLs do not bind: it may do anything (repeat for more).",
)
@click.option(
    "--metrics",
    metavar="[HOST:]PORT",
    callback=_kafka_address,
    help="Serve the daemon's metrics to Prometheus on http://HOST:PORT/metrics (0: any port), at HOST or --bind.",
)
@click.option("--json", "as_json", is_flag=True, help="Log (or, with --list, list) JSON lines.")
@click.option("--list", "list_", is_flag=True, help="List the live daemons registered under the root, and exit.")
@click.pass_context
def serve(
    ctx: click.Context,
    bind: str,
    port: int | None,
    kafka: tuple[str | None, int] | None,
    listeners: tuple[tuple[str, str, int], ...],
    port_tls: bool,
    port_sasl: bool,
    tls_cert: str | None,
    tls_key: str | None,
    tls_ca: str | None,
    tls_client_auth: str,
    tls_principal_rules: str | None,
    advertise: str | None,
    allow: tuple[Network, ...],
    allow_produce: bool,
    allow_admin: bool,
    auto_create: bool,
    default_partitions: int,
    topics: re.Pattern[str] | None,
    workers: int,
    max_connections: int,
    max_request_bytes: int,
    answer_memory: int,
    idle_timeout: float,
    request_timeout: float,
    sasl_mechanisms: tuple[str, ...],
    failed_authentication_delay: float,
    acls: bool,
    super_users: tuple[str, ...],
    metrics: tuple[str | None, int] | None,
    as_json: bool,
    list_: bool,
) -> None:
    """Serve the root's topics to hosts that do not mount it, until SIGTERM (exit 0) or
    Ctrl-C: over Kafka 0.7's wire protocol (--port; kl's own remote clients use it),
    today's Kafka protocol (--kafka; librdkafka, the Java client, kcat...), or both
    (kl-protocol(5)).

    Kafka 0.7's fetches are sent with sendfile straight from the segment files.  The
    daemon registers itself under the root while it runs (kl serve --list shows it).
    Log lines go to stderr.  --listener SSL://HOST:PORT serves the Kafka protocol over
    TLS as well (--tls: Kafka 0.7's port); SIGHUP reads the certificates again.
    """
    root = get_root(ctx)
    if list_:
        _list(root.path, as_json)
        return
    if port is None and kafka is None and not listeners:
        port = DEFAULT_PORT
    config = ServeConfig(
        bind=bind,
        port=port,
        kafka_bind=None if kafka is None else kafka[0],
        kafka_port=None if kafka is None else kafka[1],
        advertised=advertise,
        allow=allow,
        allow_produce=allow_produce,
        allow_admin=allow_admin,
        auto_create=auto_create,
        default_partitions=default_partitions,
        topics=topics,
        workers=workers,
        max_connections=max_connections,
        max_request_bytes=max_request_bytes,
        answer_memory=answer_memory,
        idle_timeout=idle_timeout,
        request_timeout=request_timeout,
        listeners=listeners,
        port_tls=port_tls,
        port_sasl=port_sasl,
        tls_cert=tls_cert,
        tls_key=tls_key,
        tls_ca=tls_ca,
        tls_client_auth=tls_client_auth,
        tls_principal_rules=tls_principal_rules,
        sasl_mechanisms=sasl_mechanisms or SASL_MECHANISMS,
        failed_authentication_delay=failed_authentication_delay,
        acls=acls,
        super_users=super_users,
        metrics=metrics,
    )
    _log_lines(as_json)
    root.topics()  # a missing root is an error now, not on every request
    if metrics is not None:  # counters without _created samples, as Kafka's exporter has them (this process is the daemon)
        prometheus_client.disable_created_metrics()
    server = Daemon(root, config)
    logger = logging.getLogger("kl.serve")
    kafka_address = None if server.kafka_port is None else (advertise or config.kafka_bind or bind, server.kafka_port)
    if kafka_address is None and listeners:  # the first listener names the daemon
        kafka_address = (advertise or listeners[0][1], server.listener_ports[0])
    advertised: dict[str, tuple[str, int]] = {}
    if server.kafka_port is not None:
        advertised["PLAINTEXT"] = (advertise or config.kafka_bind or bind, server.kafka_port)
    for (security, host, _), bound in zip(listeners, server.listener_ports, strict=True):
        advertised.setdefault(security, (advertise or host, bound))
    pattern = None if topics is None else topics.pattern
    info = brokers.info_for(bind, server.port, pattern, allow_produce, kafka_address, advertised)
    try:
        registration: brokers.Registration | None = brokers.register(root.path, info)
    except KlError as e:
        logger.warning("serving unregistered (kl serve --list will not show it): %s", e)
        registration = None
    stopped_by: list[int] = []

    def stop(signum: int, frame: object) -> None:
        stopped_by.append(signum)
        server.stop()

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, lambda signum, frame: server.reload_tls())
    # A client gone while its answer is sent is that connection's error (EPIPE), not the
    # daemon's death: kl's main() lets SIGPIPE end a pipeline quietly.
    previous[signal.SIGPIPE] = signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    try:
        server.serve_forever()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if registration is not None:
            registration.close()
    if signal.SIGINT in stopped_by:
        raise KeyboardInterrupt


class _Lines(logging.Formatter):
    """One line per record: ``TIME LEVEL message``, or a JSON object."""

    def __init__(self, as_json: bool):
        super().__init__()
        self.as_json = as_json

    def format(self, record: logging.LogRecord) -> str:
        when = datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc).isoformat(timespec="milliseconds")
        when = when.replace("+00:00", "Z")
        message = record.getMessage().replace("\n", " ")
        if self.as_json:
            return json.dumps({"time": when, "level": record.levelname.lower(), "message": message})
        return f"{when} {record.levelname.lower()} {message}"


def _log_lines(as_json: bool) -> None:
    """The library's records (the server's, and any warning) as log lines on stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Lines(as_json))
    logger = logging.getLogger("kl")
    logger.handlers = [handler]
    logger.setLevel(logging.INFO)


def _list(root_path: str, as_json: bool) -> None:
    found = brokers.live(root_path)
    if as_json:
        sys.stdout.write("".join(json.dumps({"address": b.address, **dataclasses.asdict(b)}) + "\n" for b in found))
        return
    if not sys.stdout.isatty():  # the addresses kl's own clients connect to (--server)
        sys.stdout.write("".join(b.address + "\n" for b in found if b.address))
        return
    rows = [
        [b.address or "-", b.kafka or "-", str(b.pid), _since(b.since_ms), b.topics or "(all)", "yes" if b.produce else "no"]
        for b in found
    ]
    from rich.console import Console
    from rich.table import Column, Table

    table = Table(*(Column(name, justify="right" if name == "pid" else "left") for name in LIST_COLUMNS), box=None)
    for row in rows:
        table.add_row(*row)
    Console().print(table if rows else "no kl serve daemon registered")


def _since(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000).astimezone().isoformat(timespec="seconds")
