"""The ``kl`` command: a thin face on the kl library.

Errors are turned into exit codes here, in one place: a ``kl.KlError`` (or an OS error)
prints ``Error: <message>`` and exits 1, usage errors exit 2 (click), Ctrl-C ends kl by SIGINT
(``kl_cli.main``; status 130 in a shell).
The library's warnings (a lock being waited for, a torn tail cut) print as
``Warning: <message>`` lines.
"""

from __future__ import annotations

import errno
import importlib
import signal
from collections.abc import Iterator
from typing import Any

import click

import kl
from kl.log import core, openfiles
from kl_cli import Interrupted
from kl_cli.common import add_root_options, log_warnings

COMMANDS = {
    "acls": "kl_cli.acls:acls",
    "consume": "kl_cli.consume:consume",
    "dump": "kl_cli.maintenance:dump_command",
    "groups": "kl_cli.groups:groups",
    "help": "kl_cli.manual:help_command",
    "load": "kl_cli.load:load",
    "metrics": "kl_cli.metrics:metrics",
    "mirror": "kl_cli.mirror:mirror_command",
    "produce": "kl_cli.produce:produce",
    "recover": "kl_cli.maintenance:recover_command",
    "retain": "kl_cli.maintenance:retain_command",
    "serve": "kl_cli.serve:serve",
    "topics": "kl_cli.topics:topics",
    "users": "kl_cli.users:users",
}
"""Each command's module, imported when the command runs (or is listed): ``kl produce``
does not pay for the modules of Spark loads, the daemon or the others."""


class KlGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            module, name = COMMANDS[cmd_name].split(":")
            command = getattr(importlib.import_module(module), name)
            for each in _commands(command):
                add_root_options(each, from_env=False)
            self.add_command(command, cmd_name)
        return self.commands.get(cmd_name)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except kl.KlError as e:
            raise click.ClickException(str(e)) from None
        except KeyboardInterrupt:
            raise Interrupted from None
        except OSError as e:
            if e.errno == errno.EPIPE:
                raise
            if e.filename is None:
                raise click.ClickException(e.strerror or str(e)) from None
            raise click.ClickException(f"{e.strerror}: {e.filename}") from None


def _version(ctx: click.Context, _: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        from importlib import metadata  # here: 20-50 ms at every start otherwise

        click.echo(f"kl, version {metadata.version('kl')}, {core.describe()}")
        ctx.exit()


@click.group(cls=KlGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_version,
    help="Show kl's version and which core it runs, and exit.",
)
def cli() -> None:
    """kl: the classic Kafka log design over a shared filesystem.

    Topics live in a root directory that any process (on any host that mounts it) can
    produce to and consume from.  --root and --lock-timeout go before or after the
    command (the one closest to the command wins).  See kl(1).
    """
    log_warnings()
    openfiles.raise_limit()  # as servers do: the budget of kept-open files is a share of it


add_root_options(cli, from_env=True)


def _commands(command: click.Command) -> Iterator[click.Command]:
    """``command`` and every command under it."""
    yield command
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            yield from _commands(sub)


def main() -> None:
    # Die quietly on a closed pipe, like cat: `kl consume t | head`.
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    cli.main(prog_name="kl")
