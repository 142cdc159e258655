"""The ``kl`` command line (installed as ``kl_cli``): ``main`` is the program's entry point."""

from __future__ import annotations

import sys


class Interrupted(Exception):
    """Ctrl-C, once the command has cleaned up: carried past click (which would print
    ``Aborted!`` and exit 1) to :func:`main`."""


def main() -> None:
    """The ``kl`` program.  Ctrl-C (at any moment, start-up included) ends it the way it
    ends any program: killed by SIGINT once kl has cleaned up and flushed its output, with
    no traceback; shells show status 130, and a script or loop running kl stops too (a
    shell goes on after a child that exited 130 by itself, taking it as handled)."""
    try:
        from kl_cli.main import main as run

        run()
    except (KeyboardInterrupt, Interrupted):
        sys.excepthook = _quiet  # Python ends by SIGINT after an unhandled KeyboardInterrupt
        raise KeyboardInterrupt from None


def _quiet(*_: object) -> None:
    """An excepthook printing nothing."""
