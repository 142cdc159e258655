"""Writing data to stdout: unbuffered, and with errors that say it is stdout that failed.

``kl consume`` and ``kl dump`` write a block at a time (a fetch, a few thousand lines)
straight to the file descriptor: nothing is held back to be lost when the command stops
with an error, or to fail again at exit.  A closed pipe still ends the command by
SIGPIPE, quietly, as it ends ``cat``.
"""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Callable

import click


def stdout_writer() -> Callable[[bytes], None]:
    """A function that writes all of its bytes to stdout.  Raises ``ClickException``
    ("stdout is closed", "cannot write to stdout: ...")."""
    if sys.stdout is None:  # started with file descriptor 1 closed
        raise click.ClickException("stdout is closed")
    out = sys.stdout.buffer
    try:
        fd = out.fileno()
    except (AttributeError, OSError, ValueError):  # an in-memory stream (tests)
        return out.write
    out.flush()

    def write(data: bytes) -> None:
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(fd, view) :]
        except OSError as e:
            if e.errno == errno.EPIPE:  # SIGPIPE is ignored: click exits quietly on this
                raise
            reason = e.strerror or str(e)
            raise click.ClickException(f"cannot write to stdout: {reason[:1].lower()}{reason[1:]}") from None

    return write
