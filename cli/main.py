"""The ``kl`` command: a thin face on the kl library.

Errors are turned into exit codes here, in one place: a ``kl.KlError`` (or an OS error)
prints ``Error: <message>`` and exits 1, usage errors exit 2 (click), Ctrl-C exits 130.
The library's warnings (a lock being waited for, a torn tail cut) print as
``Warning: <message>`` lines.
"""

from __future__ import annotations

import errno
import signal
from collections.abc import Iterator
from importlib import metadata
from typing import Any

import click

import kl
from kl import core
from kl_cli.common import add_root_options, log_warnings
from kl_cli.consume import consume
from kl_cli.groups import groups
from kl_cli.load import load
from kl_cli.maintenance import dump_command, recover_command, retain_command
from kl_cli.manual import help_command
from kl_cli.mirror import mirror_command
from kl_cli.produce import produce
from kl_cli.serve import serve
from kl_cli.topics import topics

EXIT_INTERRUPTED = 130


class KlGroup(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except kl.KlError as e:
            raise click.ClickException(str(e)) from None
        except KeyboardInterrupt:
            raise click.exceptions.Exit(EXIT_INTERRUPTED) from None
        except OSError as e:
            if e.errno == errno.EPIPE:
                raise
            if e.filename is None:
                raise click.ClickException(e.strerror or str(e)) from None
            raise click.ClickException(f"{e.strerror}: {e.filename}") from None


def _version(ctx: click.Context, _: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(f"kl, version {metadata.version('kl')}, {core.describe()}")
        ctx.exit()


@click.group(cls=KlGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_version,
              help="Show kl's version and which core it runs, and exit.")
def cli() -> None:
    """kl: the classic Kafka log design over a shared filesystem.

    Topics live in a root directory that any process (on any host that mounts it) can
    produce to and consume from.  --root and --lock-timeout go before or after the
    command (the one closest to the command wins).  See kl(1).
    """
    log_warnings()


cli.add_command(topics)
cli.add_command(produce)
cli.add_command(consume)
cli.add_command(groups)
cli.add_command(recover_command)
cli.add_command(retain_command)
cli.add_command(dump_command)
cli.add_command(load)
cli.add_command(mirror_command)
cli.add_command(serve)
cli.add_command(help_command)


def _commands(command: click.Command) -> Iterator[click.Command]:
    """``command`` and every command under it."""
    yield command
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            yield from _commands(sub)


for _command in _commands(cli):
    add_root_options(_command, from_env=_command is cli)


def main() -> None:
    # Die quietly on a closed pipe, like cat: `kl consume t | head`.
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    cli.main(prog_name="kl")
