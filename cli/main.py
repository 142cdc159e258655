"""The ``kl`` command: a thin face on the kl library.

Errors are turned into exit codes here, in one place: a ``kl.KlError`` (or an OS error)
prints ``Error: <message>`` and exits 1, usage errors exit 2 (click), Ctrl-C exits 130.
The library's warnings (a lock being waited for, a torn tail cut) print as
``Warning: <message>`` lines.
"""

from __future__ import annotations

import errno
import signal
from typing import Any

import click

import kl
from kl_cli.common import log_warnings
from kl_cli.consume import consume
from kl_cli.groups import groups
from kl_cli.load import load
from kl_cli.maintenance import dump_command, recover_command, retain_command
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


@click.group(cls=KlGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--root",
    metavar="DIR",
    envvar="KL_ROOT",
    show_envvar=True,
    help="The directory holding the topics.",
)
@click.option(
    "--lock-timeout",
    metavar="SECONDS",
    type=click.FloatRange(min=0),
    envvar="KL_LOCK_TIMEOUT",
    show_envvar=True,
    help="Give up waiting for a partition's lock after SECONDS (default: 120).",
)
@click.version_option(package_name="kl", prog_name="kl")
def cli(root: str | None, lock_timeout: float | None) -> None:
    """kl: the classic Kafka log design over a shared filesystem.

    Topics live in a root directory that any process (on any host that mounts it) can
    produce to and consume from.  See kl(1).
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


def main() -> None:
    # Die quietly on a closed pipe, like cat: `kl consume t | head`.
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    cli.main(prog_name="kl")
