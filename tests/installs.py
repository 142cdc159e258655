"""Tools the tests install from a registry on first use (KafkaJS and the Kafka 0.7 clients
by npm, Apache Kafka by Maven), each kept in a gitignored cache under the hash of what
pins it.  Imports nothing but the standard library, so ``scripts/test`` can install them
with any python3."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

ANSI = re.compile(r"\x1b\[[0-9;]*m")
"""Colour codes, which Maven 3.8 writes into its errors whatever -B and style.color say."""
SAID_LINES = 40
"""The last lines of a failed install's output that its error shows."""


class Unavailable(Exception):
    """A tool cannot be installed or run here; the message says why."""


def cached_install(
    cache: Path,
    key: bytes,
    product: str,
    ready: Callable[[Path], bool],
    setup: Callable[[Path], list[str]],
    *,
    tool: str,
    source: str,
    timeout: float,
    network_errors: Sequence[str],
) -> Path:
    """``cache/<hash of key>/<product>``, once ``ready`` says that directory is whole: else
    made by the command ``setup`` writes its inputs into a fresh directory for and returns
    (run there, producing ``product``), and renamed into place (a run that lost the race
    to another keeps the other's).  Raises Unavailable when ``tool`` times out or cannot
    reach ``source`` (a line of its output names one of ``network_errors``), RuntimeError
    with the end of its output when it fails otherwise."""
    made = cache / hashlib.sha256(key).hexdigest()[:16] / product
    if ready(made):
        return made
    cache.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="install-", dir=cache))
    try:
        command = setup(work)
        try:
            done = subprocess.run(command, cwd=work, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise Unavailable(f"{tool} did not finish within {timeout:g} s (is {source} reachable?)") from None
        if done.returncode != 0:
            said = ANSI.sub("", done.stdout + done.stderr).splitlines()
            unreachable = [line for line in said if any(word in line for word in network_errors)]
            if unreachable:
                raise Unavailable(f"{tool} cannot reach {source}: {unreachable[0].strip()}")
            raise RuntimeError(f"{tool} failed:\n" + "\n".join(said[-SAID_LINES:]))
        made.parent.mkdir(exist_ok=True)
        try:
            (work / product).rename(made)
        except OSError:  # another run installed it meanwhile
            if not ready(made):
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return made
