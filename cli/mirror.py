"""``kl mirror``: topics from a root or a server into another root, offset for offset (``kl.mirror``)."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from dataclasses import asdict

import click

import kl
from kl import mirror as mirroring
from kl_cli.common import aligned, connection, connection_options, root_option


@click.command("mirror")
@click.argument("source", metavar="SOURCE")
@click.argument("target", metavar="TARGET")
@click.argument("topics", nargs=-1, metavar="[TOPIC]...")
@click.option("--follow", is_flag=True, help="Keep copying new data (and, with no TOPIC, new topics) until stopped.")
@click.option(
    "--poll",
    type=click.FloatRange(min=0.01),
    default=mirroring.POLL_SECONDS,
    show_default=True,
    metavar="SECONDS",
    help="With --follow, how long to wait after finding nothing new (a local root's new data ends the wait at once).",
)
@click.option(
    "--recreate",
    is_flag=True,
    help="Delete and copy afresh a topic of TARGET that copies an older creation of SOURCE's (deleted and created again).",
)
@click.option(
    "--partitions",
    type=click.IntRange(min=1),
    metavar="N",
    help="How many partitions each TOPIC has on a Kafka 0.7 broker (which cannot be asked).",
)
@click.option("--json", "as_json", is_flag=True, help="The summary as one JSON object per partition.")
@connection_options
@click.pass_context
def mirror_command(
    ctx: click.Context,
    source: str,
    target: str,
    topics: tuple[str, ...],
    follow: bool,
    poll: float,
    recreate: bool,
    partitions: int | None,
    as_json: bool,
) -> None:
    """Copy topics from SOURCE into the root TARGET, with identical offsets.

    SOURCE is a root directory or HOST:PORT of a kl serve (or a Kafka 0.7 broker: name
    the topics and give --partitions; --tls and --sasl-user reach a kl serve that
    requires them).  With no TOPIC, every topic of SOURCE.  Missing
    topics are created with SOURCE's settings; a run goes on from where the target
    ends, and refuses a target that is not a copy of SOURCE (or of its topic's current
    creation: see --recreate).  SIGTERM and Ctrl-C stop
    it after the append in progress (exit 0 and 130).  See kl-mirror(1).
    """
    given = root_option(ctx, "root")
    if root_option(ctx, "root_given") and os.path.realpath(str(given)) != os.path.realpath(target):
        raise click.UsageError(f"kl mirror copies into TARGET ({target}), not into --root {given}: give one root", ctx)
    lock_timeout = root_option(ctx, "lock_timeout")
    root = kl.Root(target) if lock_timeout is None else kl.Root(target, lock_timeout=lock_timeout)
    stop = threading.Event()
    stopped_by: list[int] = []

    def on_signal(signum: int, frame: object) -> None:
        stopped_by.append(signum)
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        src = mirroring.open_source(source, partitions=partitions, **connection(ctx))
        try:
            copies = mirroring.Mirror(src, root, list(topics) or None, recreate=recreate).run(follow=follow, stop=stop, poll=poll)
        finally:
            src.close()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        root.close()
    _summary(copies, as_json)
    if signal.SIGINT in stopped_by:
        raise KeyboardInterrupt


def _summary(copies: list[mirroring.PartitionCopy], as_json: bool) -> None:
    """One line per partition on stdout: JSON, plain columns, or a table on a terminal."""
    if as_json:
        sys.stdout.write("".join(json.dumps(asdict(c)) + "\n" for c in copies))
        return
    head = ["topic", "partition", "from", "to", "bytes", "messages"]
    rows = [[c.topic, str(c.partition), str(c.from_offset), str(c.to_offset), str(c.bytes), str(c.messages)] for c in copies]
    if sys.stdout.isatty():
        from rich.console import Console
        from rich.table import Table

        total = f"copied {sum(c.messages for c in copies):,} messages ({sum(c.bytes for c in copies):,} bytes)"
        table = Table(title=total, title_justify="left")
        for name in head:
            table.add_column(name, justify="left" if name == "topic" else "right")
        for row in rows:
            table.add_row(*row)
        Console(highlight=False).print(table)
        return
    sys.stdout.write("".join(line + "\n" for line in aligned([head, *rows])))
