"""The ``kl`` command line (installed as ``kl_cli``): ``main`` is the program's entry point."""

from __future__ import annotations

import sys


def main() -> None:
    """The ``kl`` program: Ctrl-C while it starts exits 130 too, without a traceback."""
    try:
        from kl_cli.main import main as run
    except KeyboardInterrupt:
        sys.exit(130)
    run()
