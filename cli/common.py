"""What the commands share: the root, delimiters and escapes, stderr notes, input chunks.

rich is imported only when stderr (or, for tables, stdout) is a terminal, so a piped
``kl`` starts fast and prints nothing but its data.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import logging
import os
import re
import select
import stat
import sys
from collections.abc import Callable, Iterator
from typing import IO, TYPE_CHECKING, Any, TypeVar, cast

import click

import kl
from kl import timespec
from kl.net.wire import parse_address

if TYPE_CHECKING:
    from rich.console import Console

CHUNK_BYTES = 1 << 20
"""Bytes read from the input at a time, and the largest append by default."""

F = TypeVar("F", bound=Callable[..., Any])

_ESCAPE = re.compile(r"\\(x[0-9A-Fa-f]{2}|.|$)", re.DOTALL)
_SIMPLE = {"n": "\n", "t": "\t", "r": "\r", "0": "\0", "\\": "\\"}


def unescape(text: str) -> str:
    r"""Interpret \n \t \r \0 \\ and \xNN in ``text``.

    ``\xNN`` of 0x80 and above becomes the lone surrogate that ``surrogateescape``
    encodes back to that byte, so any byte can be written.  Raises ``ValueError``.
    """

    def one(match: re.Match[str]) -> str:
        code = match.group(1)
        if code in _SIMPLE:
            return _SIMPLE[code]
        if len(code) == 3:
            byte = int(code[1:], 16)
            return chr(byte) if byte < 0x80 else chr(0xDC00 + byte)
        raise ValueError(f"unknown escape '\\{code}' (use \\n \\t \\r \\0 \\\\ or \\xNN)")

    return _ESCAPE.sub(one, text)


def to_bytes(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def _escaped_bytes(ctx: click.Context, param: click.Parameter, value: str | None) -> bytes | None:
    if value is None:
        return None
    try:
        data = to_bytes(unescape(value))
    except ValueError as e:
        raise click.BadParameter(str(e), ctx, param) from None
    if not data:
        raise click.BadParameter("must not be empty", ctx, param)
    return data


def delimiter_options(verb: str) -> Callable[[F], F]:
    """``-d/--delimiter`` and ``-0/--null``; resolve them with :func:`resolve_delimiter`."""

    def decorate(f: F) -> F:
        f = click.option("-0", "--null", is_flag=True, help=f"{verb} NUL-delimited records (same as -d '\\0').")(f)
        f = click.option(
            "-d",
            "--delimiter",
            metavar="TEXT",
            callback=_escaped_bytes,
            help=f"{verb} records delimited by TEXT instead of a newline; escapes \\n \\t \\r \\0 \\\\ \\xNN are understood.",
        )(f)
        return f

    return decorate


def key_delimiter_option(help: str) -> Callable[[F], F]:
    return click.option("-K", "--key-delimiter", metavar="TEXT", callback=_escaped_bytes, help=help)


def server_option(what: str) -> Callable[[F], F]:
    """``--server HOST:PORT``: ``what`` through a ``kl serve`` there instead of the root,
    with the options of ``connection_options``."""

    def check(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
        if value is not None:
            try:
                parse_address(value)
            except kl.KlError as e:
                raise click.BadParameter(str(e), ctx, param) from None
        return value

    option = click.option("--server", metavar="HOST:PORT", callback=check, help=f"{what} through the kl serve at HOST:PORT.")

    def decorate(f: F) -> F:
        @functools.wraps(f)
        def checked(*args: Any, **kwargs: Any) -> Any:
            if kwargs.get("server") is None:
                given = click.get_current_context().meta.get(_CONNECTION, {})
                unused = [name for name, value in given.items() if value not in (None, False) and name != "sasl_mechanism"]
                if unused:
                    raise click.UsageError(f"--{unused[0].replace('_', '-')} is for a server: give --server too")
            return f(*args, **kwargs)

        return option(connection_options(cast(F, checked)))

    return decorate


SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
PASSWORD_VARIABLE = "KL_PASSWORD"
_CONNECTION = "kl_connection"
"""Where in ``ctx.meta`` the connection options are kept (``connection``)."""


def connection_options(f: F) -> F:
    """How to reach a ``kl serve`` over the network: TLS (the server's certificate checked
    against ``--tls-ca`` or the system's CAs; a client certificate for mTLS) and SASL
    (``--sasl-user``; the password from ``$KL_PASSWORD``, ``--password-file`` or a prompt,
    never an argument, which other users see in ps).  ``connection`` gives them to
    ``RemoteRoot``."""

    def keep(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        assert param.name is not None
        ctx.meta.setdefault(_CONNECTION, {})[param.name] = value
        return value

    def option(*names: str, **settings: Any) -> Callable[[F], F]:
        return click.option(*names, expose_value=False, callback=keep, **settings)

    path = click.Path(dir_okay=False)
    options = [
        option("--tls", is_flag=True, help="Connect over TLS (kl serve --tls), the server's certificate checked."),
        option("--tls-ca", type=path, help="The CAs that sign the server's certificate (PEM; implies --tls)."),
        option("--tls-cert", type=path, help="A client certificate (PEM) for mTLS (implies --tls)."),
        option("--tls-key", type=path, help="The client certificate's private key (PEM)."),
        option("--sasl-user", metavar="NAME", help="Authenticate with SASL as NAME (kl serve --sasl)."),
        option(
            "--sasl-mechanism",
            type=click.Choice(SASL_MECHANISMS),
            default="SCRAM-SHA-256",
            show_default=True,
            help="The SASL mechanism --sasl-user logs in with.",
        ),
        option(
            "--password-file",
            type=click.File("r"),
            help=f"Read --sasl-user's password from the first line of this file (else ${PASSWORD_VARIABLE}, else a prompt).",
        ),
    ]
    for each in reversed(options):
        f = each(f)
    return f


def connection(ctx: click.Context) -> dict[str, Any]:
    """``RemoteRoot``'s ``tls`` and ``sasl`` from the options of ``connection_options``
    (a TLS file that is missing or not usable is ``TlsError``'s one line)."""
    from kl.net.tls import client_context

    given = ctx.meta.get(_CONNECTION, {})
    tls = None
    if given.get("tls") or given.get("tls_ca") or given.get("tls_cert"):
        if bool(given.get("tls_cert")) != bool(given.get("tls_key")):
            raise click.UsageError("a client certificate needs its key, and a key its certificate (--tls-cert, --tls-key)")
        tls = client_context(given.get("tls_ca"), given.get("tls_cert"), given.get("tls_key"))
    sasl = None
    user = given.get("sasl_user")
    if user is not None:
        sasl = (given["sasl_mechanism"], user, _password(given.get("password_file")))
    elif given.get("password_file") is not None:
        raise click.UsageError("--password-file is the password of --sasl-user: give it too")
    return {"tls": tls, "sasl": sasl}


def _password(file: IO[str] | None) -> str:
    if file is not None:
        return file.readline().rstrip("\r\n")
    if PASSWORD_VARIABLE in os.environ:
        return os.environ[PASSWORD_VARIABLE]
    if sys.stdin.isatty():
        return str(click.prompt("Password", hide_input=True, err=True))
    raise click.UsageError(f"--sasl-user needs a password: ${PASSWORD_VARIABLE}, --password-file, or a terminal to ask on")


def resolve_delimiter(delimiter: bytes | None, null: bool) -> bytes:
    exclusive(delimiter=delimiter, null=null)
    return b"\0" if null else delimiter or b"\n"


def exclusive(**options: object) -> None:
    """Raise a usage error when more than one of ``options`` is set."""
    given = [name for name, value in options.items() if value not in (None, False)]
    if len(given) > 1:
        names = ", ".join("--" + name.replace("_", "-") for name in given)
        raise click.UsageError(f"{names} cannot be used together")


class TimespecType(click.ParamType):
    """A value one of ``kl.timespec``'s readers takes: a time, as milliseconds since the
    epoch (``parse_time``), or a duration, as milliseconds (``parse_duration``)."""

    def __init__(self, name: str, parse: Callable[[str], int]) -> None:
        self.name = name
        self.parse = parse

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        try:
            return value if isinstance(value, int) else self.parse(value)
        except kl.InvalidTime as e:
            self.fail(str(e), param, ctx)


TIME = TimespecType("time", timespec.parse_time)
DURATION = TimespecType("duration", timespec.parse_duration)


def aligned(rows: list[list[str]]) -> list[str]:
    """Rows of cells as plain columns two spaces apart (output that is not a terminal)."""
    widths = [max(map(len, column)) for column in zip(*rows, strict=True)]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]


ROOT_OPTIONS = ("--root", "--lock-timeout")
"""Options every command takes, before or after its name: the value closest to the command wins."""


def _remember(ctx: click.Context, param: click.Parameter, value: object) -> object:
    """Keep a given ``--root``/``--lock-timeout`` in the contexts' shared ``meta``: a
    command's own context is parsed after its group's, so the innermost value wins."""
    if value is not None:
        ctx.meta[f"kl.{param.name}"] = value
        if ctx.get_parameter_source(str(param.name)) is click.core.ParameterSource.COMMANDLINE:
            ctx.meta[f"kl.{param.name}_given"] = True
    return value


def add_root_options(command: click.Command, *, from_env: bool) -> None:
    """Give ``command`` the options ``--root DIR`` and ``--lock-timeout SECONDS``.

    Only the top command (``from_env``) reads ``KL_ROOT`` and ``KL_LOCK_TIMEOUT``, so an
    option given on the command line, at any depth, wins over the environment."""
    env = {"envvar": "KL_ROOT", "show_envvar": True} if from_env else {}
    command.params.append(
        click.Option(
            ["--root"],
            metavar="DIR",
            expose_value=False,
            callback=_remember,
            help="The directory holding the topics" + ("." if from_env else " (default: KL_ROOT)."),
            **env,
        )
    )
    env = {"envvar": "KL_LOCK_TIMEOUT", "show_envvar": True} if from_env else {}
    command.params.append(
        click.Option(
            ["--lock-timeout"],
            metavar="SECONDS",
            type=click.FloatRange(min=0),
            expose_value=False,
            callback=_remember,
            help="Give up waiting for a partition's lock after SECONDS (default: "
            + ("120)." if from_env else "KL_LOCK_TIMEOUT, or 120)."),
            **env,
        )
    )


def root_option(ctx: click.Context, name: str) -> object:
    """The value of ``--root`` or ``--lock-timeout`` (``name`` "root" or "lock_timeout"),
    from the command line at any depth or else the environment; None if neither.
    ``name`` "root_given": whether ``--root`` was given on the command line."""
    return ctx.meta.get(f"kl.{name}")


def get_root(ctx: click.Context) -> kl.Root:
    """The root from ``--root`` or ``KL_ROOT``, with ``--lock-timeout`` if given; a usage
    error when there is no root."""
    path, lock_timeout = root_option(ctx, "root"), root_option(ctx, "lock_timeout")
    if not path:
        raise click.UsageError("no root directory: pass --root or set KL_ROOT", ctx)
    return kl.Root(path) if lock_timeout is None else kl.Root(path, lock_timeout=lock_timeout)


def warn(text: str) -> None:
    """Something a person must hear about even when stderr is not a terminal."""
    sys.stderr.write(f"Warning: {text}\n")
    sys.stderr.flush()


class WarningLines(logging.Handler):
    """The library's records as one ``Warning: <message>`` line each (no tracebacks)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            warn(record.getMessage())
        except Exception:
            self.handleError(record)


def log_warnings() -> None:
    """Print kl's (and only kl's) warnings and errors on stderr, once however often called."""
    logger = logging.getLogger("kl")
    if not any(isinstance(h, WarningLines) for h in logger.handlers):
        logger.addHandler(WarningLines(logging.WARNING))


def note(text: str) -> None:
    """A summary for a person: to stderr, only when it is a terminal."""
    if sys.stderr.isatty():
        from rich.console import Console

        print_line(Console(stderr=True), text)


def print_line(console: Console, text: str, style: str = "") -> None:
    """``text`` as one line on a rich console, whatever the terminal's width: never
    wrapped or cropped (the terminal folds it on screen; a copy or a reader of the
    output gets it whole), and taken as it is, not as markup."""
    from rich.text import Text

    console.print(Text(text, style=style), soft_wrap=True, highlight=False)


def read_chunks(stream: IO[bytes], size: int = CHUNK_BYTES) -> Iterator[bytes]:
    """The input in chunks of up to ``size`` bytes, as soon as they are there.

    A pipe delivers 64 KiB at a time: reads go on while more is ready at once, so a
    fast writer still gives big chunks and a slow one (``tail -f``) is not kept waiting.
    """
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # an in-memory stream (tests)
        while chunk := stream.read(size):
            yield chunk
        return
    mode = os.fstat(fd).st_mode
    regular = stat.S_ISREG(mode)
    if stat.S_ISFIFO(mode) and hasattr(fcntl, "F_SETPIPE_SZ"):
        with contextlib.suppress(OSError):  # a bigger pipe: fewer reads and wake-ups (Linux)
            fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, size)
    ended = False
    while not ended:
        chunk = os.read(fd, size)
        if not chunk:
            return
        if not regular and len(chunk) < size:
            parts, have = [chunk], len(chunk)
            while have < size and select.select([fd], [], [], 0)[0]:
                more = os.read(fd, size - have)
                if not more:  # the end (on a terminal, Ctrl-D: it is not seen twice)
                    ended = True
                    break
                parts.append(more)
                have += len(more)
            chunk = b"".join(parts)
        yield chunk


class Progress:
    """A progress bar on stderr when it is a terminal (rich imported only then), else
    nothing: ``total`` partitions, or bytes when ``unit`` is "bytes"."""

    def __init__(self, total: int, unit: str):
        self.bar = None
        if not sys.stderr.isatty():
            return
        from rich import progress as bars
        from rich.console import Console

        amount = bars.DownloadColumn() if unit == "bytes" else bars.MofNCompleteColumn()
        self.bar = bars.Progress(
            bars.TextColumn("{task.description}"),
            bars.BarColumn(),
            amount,
            bars.TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=True,
            redirect_stdout=False,
            redirect_stderr=False,
        )
        self.task = self.bar.add_task("", total=total)
        self.bar.start()

    def show(self, description: str) -> None:
        if self.bar is not None:
            self.bar.update(self.task, description=description)

    def advance(self, amount: int = 1) -> None:
        if self.bar is not None:
            self.bar.advance(self.task, amount)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()
