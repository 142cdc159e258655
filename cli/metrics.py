"""``kl metrics``: rates and lag over time, from the root's files alone (no daemon).

The figures are ``kl.stats``'s (a snapshot every interval, and what changed since the
one before); this renders them: a live table on a terminal, else one line per row per
snapshot (the format is kl-metrics(1)'s), or JSON lines.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import signal
import sys
import threading
import time
from typing import Any

import click

from kl import stats
from kl.topic import validate_name
from kl_cli import complete
from kl_cli.common import get_root
from kl_cli.groups import _duration as duration

TOPIC_COLUMNS = ("topic", "partitions", "end offsets", "records/s", "bytes/s", "size")
GROUP_COLUMNS = ("group", "topic", "members", "lag", "lag trend", "lag bytes", "lag time")


@click.command(short_help="Show rates and lag over time, from the files.")
@click.option(
    "--interval",
    type=click.FloatRange(min=0.01),
    default=2.0,
    show_default=True,
    metavar="SECONDS",
    help="Seconds between snapshots.",
)
@click.option("--count", type=click.IntRange(min=1), metavar="N", help="Stop after N snapshots (default: go on until stopped).")
@click.option(
    "--topic",
    "topics",
    multiple=True,
    metavar="TOPIC",
    shell_complete=complete.topics,
    help="Only this topic (repeatable; one not created yet shows once it is).",
)
@click.option(
    "--group", "groups", multiple=True, metavar="GROUP", shell_complete=complete.groups, help="Only this group (repeatable)."
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines, one per row per snapshot.")
@click.pass_context
def metrics(
    ctx: click.Context, interval: float, count: int | None, topics: tuple[str, ...], groups: tuple[str, ...], as_json: bool
) -> None:
    """Every --interval seconds, per topic: its end offsets (the records ever appended)
    and the records and bytes appended per second since the snapshot before; per group
    and topic: its lag in records (and how fast it grows or shrinks), in bytes, and in
    time (the age of the oldest record not consumed).  The first snapshot has no rates.

    Read from the root's files alone, as kl groups describe reads them: no daemon needed.
    SIGTERM ends it after the snapshot at hand (exit 0); Ctrl-C at once (by SIGINT).
    """
    root = get_root(ctx)
    for topic in topics:
        validate_name(topic)
    topic_filter = None if not topics else set(topics).__contains__
    group_filter = None if not groups else set(groups).__contains__
    stopping = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    live = None
    try:
        if sys.stdout.isatty() and not as_json:
            from rich.live import Live

            live = Live(auto_refresh=False)
            live.start()
        cursor, before, taken = stats.Cursor(), None, 0
        deadline = time.monotonic()
        while True:
            snap = stats.snapshot(root, topic_filter, group_filter, cursor=cursor)
            rows = stats.figures(snap, before)
            if live is not None:
                live.update(_table(snap, *rows), refresh=True)
            else:
                _lines(snap, *rows, as_json)
            before, taken = snap, taken + 1
            if count is not None and taken >= count:
                break
            deadline = max(deadline + interval, time.monotonic())
            if stopping.wait(deadline - time.monotonic()):
                break
    finally:
        if live is not None:
            live.stop()
        signal.signal(signal.SIGTERM, previous)
        root.close()


def _lines(snap: stats.Snapshot, topics: list[stats.TopicFigures], groups: list[stats.GroupFigures], as_json: bool) -> None:
    when = _when(snap.time_ms)
    out = []
    for t in topics:
        if as_json:
            out.append(_json("topic", snap, t, records_per_second=t.records_per_second, bytes_per_second=t.bytes_per_second))
        else:
            fields = [
                ("end", t.records),
                ("records", _signed(t.records_in)),
                ("records/s", _rate(t.records_per_second)),
                ("bytes", _signed(t.bytes_in)),
                ("bytes/s", _rate(t.bytes_per_second)),
                ("size", t.size_in_bytes),
            ]
            out.append(f"{when} topic {t.topic} " + " ".join(f"{k}={_plain(v)}" for k, v in fields))
    for g in groups:
        if as_json:
            out.append(_json("group", snap, g, lag_per_second=g.lag_per_second))
        else:
            fields = [
                ("members", g.members),
                ("lag", g.lag),
                ("change", _signed(g.lag_change)),
                ("lag/s", _rate(g.lag_per_second)),
                ("lag_bytes", g.lag_bytes),
                ("lag_time", None if g.lag_ms is None else f"{g.lag_ms / 1000:.3f}s"),
            ]
            out.append(f"{when} group {g.group} {g.topic} " + " ".join(f"{k}={_plain(v)}" for k, v in fields))
    sys.stdout.write("".join(line + "\n" for line in out))
    sys.stdout.flush()


def _json(kind: str, snap: stats.Snapshot, row: Any, **more: object) -> str:
    return json.dumps({"time_ms": snap.time_ms, "kind": kind, **dataclasses.asdict(row), **more})


def _table(snap: stats.Snapshot, topics: list[stats.TopicFigures], groups: list[stats.GroupFigures]) -> Any:
    from rich.console import Group
    from rich.table import Column, Table
    from rich.text import Text

    def table(title: str, header: tuple[str, ...], rows: list[list[str]]) -> Table:
        columns = [Column(name, justify="left" if name in ("topic", "group") else "right") for name in header]
        found = Table(*columns, title=Text(title), title_justify="left", box=None)
        for row in rows:
            found.add_row(*(Text(cell) for cell in row))  # as they are (a group id may hold "[b]"), not as markup
        return found

    topic_rows = [
        [
            t.topic,
            str(t.partitions),
            _plain(t.records),
            _plain(_rate(t.records_per_second)),
            _plain(_rate(t.bytes_per_second)),
            f"{t.size_in_bytes:,}",
        ]
        for t in topics
    ]
    group_rows = [
        [
            g.group,
            g.topic,
            str(g.members),
            _plain(g.lag),
            _trend(g.lag_per_second),
            _plain(g.lag_bytes),
            duration(g.lag_ms),
        ]
        for g in groups
    ]
    title = f"{_when(snap.time_ms)}  ({snap.seconds:.2f} s to read)"
    parts: list[Any] = [table(f"topics  {title}", TOPIC_COLUMNS, topic_rows)]
    if group_rows:
        parts.append(table("groups", GROUP_COLUMNS, group_rows))
    return Group(*parts)


def _when(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")[:-4] + "Z"


def _plain(value: object) -> str:
    return "-" if value is None else str(value)


def _signed(value: int | None) -> str | None:
    return None if value is None else f"{value:+d}"


def _rate(value: float | None) -> str | None:
    return None if value is None else f"{value:.1f}"


def _trend(per_second: float | None) -> str:
    if per_second is None:
        return "-"
    arrow = "↑" if per_second > 0 else "↓" if per_second < 0 else "="
    return f"{arrow} {abs(per_second):.1f}/s"
