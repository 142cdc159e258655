"""``kl serve``: the root's topics over Kafka 0.7's wire protocol and today's Kafka
protocol (``kl.net.server``), and ``kl serve --list``: the daemons registered under the
root (``kl.net.brokers``)."""

from __future__ import annotations

import dataclasses
import datetime
import importlib.resources
import ipaddress
import json
import logging
import os
import re
import signal
import sys
from collections.abc import Callable
from typing import Any

import click
import prometheus_client

from kl.errors import KlError
from kl.net import brokers
from kl.net.acls import check_principal
from kl.net.daemon import Daemon
from kl.net.retainer import Retainer
from kl.net.server import LIVE, SASL_MECHANISMS, SECURITY_PROTOCOLS, Network, ServeConfig, ServerError
from kl.net.tls import CLIENT_AUTH
from kl_cli.common import DURATION, get_root
from kl_cli.options_file import ConfigCommand, config_option, key_of

LIST_COLUMNS = ["address", "kafka", "pid", "since", "topics", "produce"]
DEFAULT_PORT = 9092
LOG_LEVELS = ("debug", "info", "warning", "error")
NOT_IN_FILE = ("list_", "print_unit", "print_config", "root", "lock_timeout")
"""The options a config file does not set: actions, and the root (named where the daemon starts)."""
RELOADED_HERE = frozenset({"log_level"})
"""Options a reload applies that are the command's own (the server's are ``LIVE``)."""
UNIT = "kl-serve.service"
UNIT_KL = "@KL@"
"""What ``--print-unit`` replaces with the command that runs this kl."""
CONFIG_PATH = "/etc/kl/serve.toml"
EXAMPLE = {"port": 9092, "kafka": "9093", "json": True}
"""The settings ``--print-config`` gives for the shipped unit: both protocols, JSON log lines."""


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


def _positive(ctx: click.Context, param: click.Parameter, ms: int | None) -> int | None:
    if ms is not None and ms <= 0:
        raise click.BadParameter("a duration longer than 0 is needed", ctx, param)
    return ms


def _pattern(ctx: click.Context, param: click.Parameter, value: str | None) -> re.Pattern[str] | None:
    if value is None:
        return None
    try:
        return re.compile(value)
    except re.error as e:
        raise click.BadParameter(f"{value!r} is not a regular expression: {e}", ctx, param) from None


@click.command(
    cls=ConfigCommand, leave_out=NOT_IN_FILE, short_help="Serve the root's topics to Kafka clients, today's and 0.7's."
)
@config_option
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
@click.option(
    "--retain-every",
    metavar="DURATION",
    type=DURATION,
    callback=_positive,
    help="Run retention (as kl retain) over the whole root every DURATION (10m, 1h), one daemon of the root at a time.",
)
@click.option(
    "--log-level",
    type=click.Choice(LOG_LEVELS, case_sensitive=False),
    default="info",
    show_default=True,
    help="Log lines of this level and above.",
)
@click.option("--json", "as_json", is_flag=True, help="Log (or, with --list, list) JSON lines.")
@click.option("--list", "list_", is_flag=True, help="List the live daemons registered under the root, and exit.")
@click.option("--print-unit", is_flag=True, help="Print a systemd unit that runs this kl serve, and exit.")
@click.option("--print-config", is_flag=True, help="Print a config file for the unit, every key shown, and exit.")
@click.pass_context
def serve(
    ctx: click.Context,
    config: str | None,
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
    retain_every: int | None,
    log_level: str,
    as_json: bool,
    list_: bool,
    print_unit: bool,
    print_config: bool,
) -> None:
    """Serve the root's topics to hosts that do not mount it, until SIGTERM (exit 0) or
    Ctrl-C: over Kafka 0.7's wire protocol (--port; kl's own remote clients use it),
    today's Kafka protocol (--kafka; librdkafka, the Java client, kcat...), or both
    (kl-protocol(5)).

    Kafka 0.7's fetches are sent with sendfile straight from the segment files.  The
    daemon registers itself under the root while it runs (kl serve --list shows it).
    Log lines go to stderr.  --listener SSL://HOST:PORT serves the Kafka protocol over
    TLS as well (--tls: Kafka 0.7's port).  --config FILE reads the options from a TOML
    file (KEY = VALUE by long option name), which SIGHUP reads again, with the TLS
    certificates, applying what can change live.  --print-unit prints a systemd unit.
    """
    if print_unit:
        sys.stdout.write(unit())
        return
    if print_config:
        sys.stdout.write(example_config(ctx.command))
        return
    root = get_root(ctx)
    if list_:
        _list(root.path, as_json)
        return
    params = dict(ctx.params)
    serve_config = _serve_config(params)
    _log_lines(as_json, log_level)
    root.topics()  # a missing root is an error now, not on every request
    if serve_config.metrics is not None:  # counters without _created samples, as Kafka's exporter has them
        prometheus_client.disable_created_metrics()
    server = Daemon(root, serve_config)
    logger = logging.getLogger("kl.serve")
    registration: brokers.Registration | None = None
    retainer = None if retain_every is None else Retainer(root.path, retain_every / 1000)
    stopped_by: list[int] = []

    def stop(signum: int, frame: object) -> None:
        stopped_by.append(signum)
        server.stop()

    reload = _certificates_only(server) if config is None else _reloader(ctx, server, params, lambda: registration)
    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, lambda signum, frame: server.reload(reload))
    # A client gone while its answer is sent is that connection's error (EPIPE), not the
    # daemon's death: kl's main() lets SIGPIPE end a pipeline quietly.
    previous[signal.SIGPIPE] = signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    try:  # the handlers first: a signal from now on ends the daemon here, its registration removed
        try:
            registration = brokers.register(root.path, _broker_info(server, serve_config))
        except KlError as e:
            logger.warning("serving unregistered (kl serve --list will not show it): %s", e)
        if retainer is not None:
            retainer.start()
        server.serve_forever()
    finally:
        if retainer is not None:
            retainer.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if registration is not None:
            registration.close()
    if signal.SIGINT in stopped_by:
        raise KeyboardInterrupt


def _serve_config(params: dict[str, Any]) -> ServeConfig:
    """The server's config from the command's parameters (raises ``ServerError``)."""
    port, kafka, listeners = params["port"], params["kafka"], params["listeners"]
    if port is None and kafka is None and not listeners:
        port = DEFAULT_PORT
    return ServeConfig(
        bind=params["bind"],
        port=port,
        kafka_bind=None if kafka is None else kafka[0],
        kafka_port=None if kafka is None else kafka[1],
        advertised=params["advertise"],
        allow=params["allow"],
        allow_produce=params["allow_produce"],
        allow_admin=params["allow_admin"],
        auto_create=params["auto_create"],
        default_partitions=params["default_partitions"],
        topics=params["topics"],
        workers=params["workers"],
        max_connections=params["max_connections"],
        max_request_bytes=params["max_request_bytes"],
        answer_memory=params["answer_memory"],
        idle_timeout=params["idle_timeout"],
        request_timeout=params["request_timeout"],
        listeners=listeners,
        port_tls=params["port_tls"],
        port_sasl=params["port_sasl"],
        tls_cert=params["tls_cert"],
        tls_key=params["tls_key"],
        tls_ca=params["tls_ca"],
        tls_client_auth=params["tls_client_auth"],
        tls_principal_rules=params["tls_principal_rules"],
        sasl_mechanisms=params["sasl_mechanisms"] or SASL_MECHANISMS,
        failed_authentication_delay=params["failed_authentication_delay"],
        acls=params["acls"],
        super_users=params["super_users"],
        metrics=params["metrics"],
    )


def _broker_info(server: Daemon, config: ServeConfig) -> brokers.BrokerInfo:
    """What the daemon registers: where each of its protocols is reached, what it serves."""
    bind, advertise = config.bind, config.advertised
    kafka_address = None if server.kafka_port is None else (advertise or config.kafka_bind or bind, server.kafka_port)
    if kafka_address is None and config.listeners:  # the first listener names the daemon
        kafka_address = (advertise or config.listeners[0][1], server.listener_ports[0])
    advertised: dict[str, tuple[str, int]] = {}
    if server.kafka_port is not None:
        advertised["PLAINTEXT"] = (advertise or config.kafka_bind or bind, server.kafka_port)
    for (security, host, _), bound in zip(config.listeners, server.listener_ports, strict=True):
        advertised.setdefault(security, (advertise or host, bound))
    pattern = None if config.topics is None else config.topics.pattern
    return brokers.info_for(bind, server.port, pattern, config.allow_produce, kafka_address, advertised)


def _reloader(
    ctx: click.Context, server: Daemon, params: dict[str, Any], registration: Callable[[], brokers.Registration | None]
) -> Callable[[], None]:
    """What SIGHUP has the server's loop do (``Server.reload``): parse the command line
    again with the config file as it is now, apply what changed that can change live
    (``LIVE``, ``RELOADED_HERE``), log a line per change, and keep the rest (logged too).
    An invalid file changes nothing (one line).  ``params`` are the settings in use,
    updated as changes are applied."""
    command = ctx.command
    assert isinstance(command, ConfigCommand)
    path = ctx.params["config"]
    logger = logging.getLogger("kl.serve")
    keys = {p.name: key_of(p) for p in command.params}

    def read() -> None:
        try:
            new = command.reparse(ctx).params
            _serve_config(new)  # the new config is valid as a whole, or nothing changes
        except click.ClickException as e:
            raise ServerError(f"kept the config in use: {e.format_message()}") from None
        except KlError as e:
            raise ServerError(f"kept the config in use: {path}: {e}") from None
        old_config = _serve_config(params)
        changed = [name for name in params if new.get(name) != params[name]]
        live = {name: _live(name, params, new, old_config) for name in changed}
        applied = {name: new[name] for name in changed if live[name]}
        try:
            server.apply(_serve_config({**params, **applied}))
        except KlError as e:
            raise ServerError(f"kept the config in use: {path}: {e}") from None
        held = registration()  # registered before the log says so: other daemons name leaders by it
        if held is not None and applied.keys() & {"topics", "allow_produce"}:
            served = {**params, **applied}
            pattern = None if served["topics"] is None else served["topics"].pattern
            try:
                held.update(dataclasses.replace(held.info, topics=pattern, produce=served["allow_produce"]))
            except KlError as e:
                logger.warning("kept the registration as it was: %s", e)
        for name in changed:
            was, now = _shown(params[name]), _shown(new[name])
            if live[name]:
                logger.info("reloaded %s: %s %s -> %s", path, keys[name], was, now)
            else:
                logger.warning("reloaded %s: kept %s %s: a change to %s needs a restart", path, keys[name], was, now)
        params.update(applied)
        if not changed:
            logger.info("reloaded %s: nothing changed", path)
        logging.getLogger("kl").setLevel(params["log_level"].upper())
        if server.tls is not None:
            logger.info("TLS certificates reloaded from %s", server.tls.cert)

    return read


def _certificates_only(server: Daemon) -> Callable[[], None]:
    """What SIGHUP has the loop do without a config file: read the TLS certificates again."""

    def read() -> None:
        logging.getLogger("kl.serve").info("SIGHUP: no config file (kl serve --config): reading the TLS certificates only")
        server.read_certificates()

    return read


def _live(name: str, old: dict[str, Any], new: dict[str, Any], old_config: ServeConfig) -> bool:
    """Whether a changed option can be applied by a reload: the command's own, or one
    whose every effect on the server's config is in a field the server changes live."""
    if name in RELOADED_HERE:
        return True
    try:
        alone = _serve_config({**old, name: new[name]})
    except KlError:
        return False
    fields = {f.name for f in dataclasses.fields(ServeConfig) if getattr(alone, f.name) != getattr(old_config, f.name)}
    return bool(fields) and fields <= LIVE


def _shown(value: object) -> str:
    """A setting as a log line shows it."""
    if value is None:
        return "(none)"
    if isinstance(value, re.Pattern):
        return value.pattern
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(_shown(v) if not isinstance(v, tuple) else ":".join(map(str, v)) for v in value) or "(none)"
    return str(value)


def unit() -> str:
    """The systemd unit shipped with kl, its ``ExecStart`` running this kl."""
    text = importlib.resources.files("kl_cli").joinpath("data", UNIT).read_text()
    kl = _this_kl()
    if kl.startswith(("/home/", "/root/")):  # ProtectHome=yes would hide it from the service
        text = text.replace("\nProtectHome=yes\n", "\nProtectHome=read-only\n")
    return text.replace(UNIT_KL, kl)


def _this_kl() -> str:
    """The command that runs this kl: its ``kl`` script, or its Python with ``-m kl_cli``."""
    script = os.path.abspath(sys.argv[0])
    if os.path.basename(script) == "kl" and os.access(script, os.X_OK):
        return script
    return f"{sys.executable} -m kl_cli"


def example_config(command: click.Command) -> str:
    """A config file for the unit: ``EXAMPLE``'s settings, then every other key with its
    help, commented out at its default."""
    assert isinstance(command, ConfigCommand)
    lines = [
        f"# kl serve's config file ({CONFIG_PATH}): one key per option of kl serve, by its long",
        "# name; the command line wins.  kill -HUP reloads it (kl-serve(1), CONFIG FILE).",
        "",
    ]
    for key, param in command.keys().items():
        assert isinstance(param, click.Option)
        lines.append(f"# {param.help}")
        if key in EXAMPLE:
            lines.append(f"{key} = {_toml(EXAMPLE[key])}")
        elif param.is_flag:
            lines.append(f"# {key} = false")
        elif isinstance(param.default, (int, float, str)):
            lines.append(f"# {key} = {_toml(param.default)}")
        else:  # no default: what the option takes
            kind = param.type
            shown = param.metavar or ("|".join(kind.choices) if isinstance(kind, click.Choice) else kind.name.upper())
            lines.append(f"# {key} = {_toml([shown] if param.multiple else shown)}")
    return "\n".join(lines) + "\n"


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, str):
        return json.dumps(value)
    return str(value)


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


def _log_lines(as_json: bool, level: str = "info") -> None:
    """The library's records (the server's, and any warning) of ``level`` and above as
    log lines on stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Lines(as_json))
    logger = logging.getLogger("kl")
    logger.handlers = [handler]
    logger.setLevel(level.upper())


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
