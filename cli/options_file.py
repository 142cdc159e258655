"""A command's options from a TOML file: ``kl serve --config FILE``.

Every option of the command is a key of the file, by its long name without the dashes
(``max-connections = 100``, ``allow-produce = true``, ``listener = ["SSL://0.0.0.0:9093"]``),
but those the command leaves out (actions, such as ``--list``).  The command line wins
over the file and the file over the defaults: the file's values are the context's
``default_map``, so click converts and checks them as it does the command line's (the
option's type, range and callback), and an error names the file and the key.  Each
value must be of the TOML type the option takes: a boolean for a flag, an integer, a
number (integer or float), a string, or, for an option given more than once, an array
of them (or one).  An option added to the command later is a key at once.
"""

from __future__ import annotations

import difflib
import sys
from typing import Any

import click
from click.core import ParameterSource

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


class ConfigCommand(click.Command):
    """A command with a ``--config FILE`` option (``config_option``): it reads the file
    into the context's ``default_map`` and can parse its command line again
    (``reparse``), with the file as it is then."""

    def __init__(self, *args: Any, leave_out: tuple[str, ...] = (), **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.leave_out = ("config", *leave_out)
        """The parameters (by name) the file cannot set."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta[_ARGS] = tuple(args)
        try:
            return super().parse_args(ctx, args)
        except click.BadParameter as e:
            param = e.param
            if param is None or param.name is None or ctx.get_parameter_source(param.name) is not ParameterSource.DEFAULT_MAP:
                raise
            raise click.UsageError(f"{ctx.params.get('config')}: {key_of(param)}: {e.message}", ctx) from None

    def reparse(self, ctx: click.Context) -> click.Context:
        """A new context of the command line ``ctx`` was made of, with the config file read
        again.  Raises click's ``UsageError`` (its message names the file and key)."""
        return self.make_context(ctx.info_name, list(ctx.meta[_ARGS]), parent=ctx.parent)

    def keys(self) -> dict[str, click.Parameter]:
        """The file's keys: each option's long name (without dashes), to its parameter."""
        return {key_of(p): p for p in self.params if isinstance(p, click.Option) and p.name not in self.leave_out}


_ARGS = "kl.options_file.args"


def key_of(param: click.Parameter) -> str:
    """An option's key in the file: its first long name without the dashes."""
    longs = [opt for opt in param.opts if opt.startswith("--")]
    return (longs[0] if longs else param.opts[0]).lstrip("-")


def config_option(f: Any) -> Any:
    """The ``--config FILE`` option of a ``ConfigCommand``."""
    return click.option(
        "--config",
        metavar="FILE",
        is_eager=True,
        expose_value=True,
        callback=_read,
        help="Read options from this TOML file (KEY = VALUE by long option name); the command line wins.",
    )(f)


def _read(ctx: click.Context, param: click.Parameter, path: str | None) -> str | None:
    if path is None or ctx.resilient_parsing:
        return path
    command = ctx.command
    assert isinstance(command, ConfigCommand)
    ctx.default_map = {**(ctx.default_map or {}), **read(command, path, ctx)}
    return path


def read(command: ConfigCommand, path: str, ctx: click.Context | None = None) -> dict[str, Any]:
    """The file's values by parameter name, their TOML types checked (click checks the
    values themselves).  Raises click's ``UsageError``: one line naming the file, and
    the key and what is wrong with it (or why the file cannot be read)."""
    try:
        with open(path, "rb") as f:
            document = tomllib.load(f)
    except OSError as e:
        raise click.UsageError(f"{path}: cannot read it: {e.strerror or e}", ctx) from None
    except tomllib.TOMLDecodeError as e:
        raise click.UsageError(f"{path}: not valid TOML: {e}", ctx) from None
    except UnicodeDecodeError as e:
        raise click.UsageError(f"{path}: not valid TOML: not UTF-8 ({e.reason})", ctx) from None
    keys = command.keys()
    values: dict[str, Any] = {}
    for key, value in document.items():
        param = keys.get(key)
        if param is None:
            close = difflib.get_close_matches(key.replace("_", "-"), keys, n=1)
            hint = f" (did you mean {close[0]}?)" if close else f" (see kl-{command.name}(1))"
            raise click.UsageError(f"{path}: {key}: not an option of kl {command.name}{hint}", ctx)
        assert param.name is not None
        values[param.name] = _typed(path, key, param, value, ctx)
    return values


def _typed(path: str, key: str, param: click.Parameter, value: Any, ctx: click.Context | None) -> Any:
    """``value`` if its TOML type is the option's (a list of them for a repeatable option)."""
    types, what = _toml_type(param)
    many = param.multiple or (param.nargs != 1)
    items = value if many and isinstance(value, list) else [value]
    for item in items:
        if not isinstance(item, types) or (isinstance(item, bool) and bool not in types):
            shown = f"{_toml_name(item)} {item!r}" if not isinstance(item, (dict, list)) else _toml_name(item)
            what = f"{what}, or an array of them" if many else what
            raise click.UsageError(f"{path}: {key}: {what} is expected, not {shown}", ctx)
    return items if many else value


def _toml_type(param: click.Parameter) -> tuple[tuple[type, ...], str]:
    kind = param.type
    if (isinstance(param, click.Option) and param.is_flag) or isinstance(kind, click.types.BoolParamType):
        return (bool,), "a boolean (true or false)"
    if isinstance(kind, click.types.IntParamType):
        return (int,), "an integer"
    if isinstance(kind, click.types.FloatParamType):
        return (int, float), "a number"
    return (str,), "a string"


def _toml_name(value: Any) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a float", str: "a string", list: "an array", dict: "a table"}
    return next((name for kind, name in names.items() if isinstance(value, kind)), f"a {type(value).__name__}")
