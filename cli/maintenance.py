"""``kl recover``, ``kl retain`` and ``kl dump``: the operator's commands, cron-friendly.

Each prints one plain line per partition (or message) when piped, a table on a terminal,
or JSON with ``--json``; each exits 3 when it finds damage it did not repair.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
from collections.abc import Iterable, Iterator

import click

import kl
from kl.dump import DumpRecord, dump_file
from kl.recovery import RecoveryReport, recover
from kl.retention import DEFAULT_DELETE_DELAY, retain
from kl_cli.common import get_root

EXIT_DAMAGE = 3
_DURATION = re.compile(r"(\d+)(ms|s|m|h|d|w)?")
_UNIT_MS = {"ms": 1, None: 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}


def _duration_ms(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    if value is None:
        return None
    match = _DURATION.fullmatch(value.strip())
    if not match:
        raise click.BadParameter(f"{value!r} is not a duration such as 7d, 12h, 30m, 90s or 5000ms", ctx, param)
    return int(match.group(1)) * _UNIT_MS[match.group(2)]


def _partitions(root: kl.Root, topics: Iterable[str]) -> Iterator[tuple[str, int, kl.Log]]:
    names = list(topics) or root.topics()
    for name in names:
        for p in range(root.config(name).partitions):
            yield name, p, root.log(name, p)


def _emit(rows: list[dict], as_json: bool, line) -> None:
    if as_json:
        sys.stdout.write("".join(json.dumps(row) + "\n" for row in rows))
    elif sys.stdout.isatty() and rows:
        from rich.console import Console
        from rich.table import Table

        table = Table(*rows[0].keys(), box=None)
        for row in rows:
            table.add_row(*(_cell(v) for v in row.values()))
        Console().print(table)
    else:
        sys.stdout.write("".join(line(row) + "\n" for row in rows))


def _cell(value: object) -> str:
    if isinstance(value, list):
        return "\n".join(f"{f['offset']}: {f['reason']} ({f['action']})" for f in value) or "-"
    return str(value)


@click.command("recover")
@click.argument("topics", nargs=-1)
@click.option("--deep", is_flag=True, help="Check every message of every segment, and segment continuity, not just the tail.")
@click.option("--dry-run", is_flag=True, help="Change nothing; exit 3 if anything is found.")
@click.option("--repair", is_flag=True, help="Also repair damage before the committed end, after copying the segment aside.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per partition.")
@click.pass_context
def recover_command(ctx: click.Context, topics: tuple[str, ...], deep: bool, dry_run: bool, repair: bool, as_json: bool) -> None:
    """Check partitions (all topics by default) and cut torn tails.

    Bytes past the published end and a damaged tail past the committed end are cut.
    Damage before the committed end is reported with its offset and left alone unless
    --repair is given.  Exits 3 when damage remains (or, with --dry-run, was found).
    """
    if dry_run and repair:
        raise click.UsageError("--dry-run and --repair cannot be used together")
    root = get_root(ctx)
    rows, damaged = [], False
    for name, p, log in _partitions(root, topics):
        report = recover(log, deep=deep, repair=repair, dry_run=dry_run)
        damaged = damaged or bool(report.unrepaired) or (dry_run and bool(report.findings))
        rows.append(_recovery_row(name, p, report))
    _emit(rows, as_json, _recovery_line)
    if damaged:
        ctx.exit(EXIT_DAMAGE)


def _recovery_row(topic: str, partition: int, report: RecoveryReport) -> dict:
    return {
        "topic": topic,
        "partition": partition,
        "checked_bytes": report.checked_bytes,
        "cut_bytes": report.cut_bytes,
        "cut_messages": report.cut_messages,
        "findings": [dataclasses.asdict(f) for f in report.findings],
    }


def _recovery_line(row: dict) -> str:
    where = f"{row['topic']}/{row['partition']}"
    if not row["findings"]:
        return f"{where}: ok ({row['checked_bytes']} bytes checked)"
    found = "; ".join(f"offset {f['offset']}: {f['reason']} [{f['action']}]" for f in row["findings"])
    return f"{where}: {found} (cut {row['cut_bytes']} bytes, {row['cut_messages']} messages)"


@click.command("retain")
@click.argument("topics", nargs=-1)
@click.option("--max-age", callback=_duration_ms, metavar="DURATION", help="Delete segments older than this (7d, 12h, 30m, 90s, 5000ms); default: the topic's retention_ms.")
@click.option("--max-bytes", type=click.IntRange(min=0), metavar="N", help="Keep at most N bytes per partition; default: the topic's retention_bytes.")
@click.option("--dry-run", is_flag=True, help="List what would be deleted; delete nothing.")
@click.option("--delete-delay", type=click.FloatRange(min=0), default=DEFAULT_DELETE_DELAY, show_default=True, metavar="SECONDS", help="Unlink segments set aside at least this long ago.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per partition.")
@click.pass_context
def retain_command(
    ctx: click.Context, topics: tuple[str, ...], max_age: int | None, max_bytes: int | None, dry_run: bool, delete_delay: float, as_json: bool
) -> None:
    """Delete old segments, oldest first, by age and by size (all topics by default).

    A segment's age comes from its messages' timestamps, so copying a topic does not
    change what expires.  The active segment and lock files are never deleted.
    """
    root = get_root(ctx)
    rows = []
    for name, p, log in _partitions(root, topics):
        report = retain(log, max_age_ms=max_age, max_bytes=max_bytes, dry_run=dry_run, delete_delay=delete_delay)
        rows.append(
            {
                "topic": name,
                "partition": p,
                "deleted_segments": [os.path.basename(s.path) for s in report.deleted],
                "deleted_bytes": report.deleted_bytes,
                "log_start_offset": report.log_start_offset,
                "dry_run": dry_run,
            }
        )
    _emit(rows, as_json, _retention_line)


def _retention_line(row: dict) -> str:
    verb = "would delete" if row["dry_run"] else "deleted"
    segments = row["deleted_segments"]
    what = f"{verb} {len(segments)} segments ({row['deleted_bytes']} bytes)" if segments else "nothing to delete"
    return f"{row['topic']}/{row['partition']}: {what}; log starts at {row['log_start_offset']}"


@click.command("dump")
@click.argument("target")
@click.option("-p", "--partition", type=click.IntRange(min=0), metavar="N", help="Only this partition of a topic.")
@click.option("--deep", is_flag=True, help="Also list the messages inside compressed batches.")
@click.option("--print-data", is_flag=True, help="Print keys and values too.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per message.")
@click.pass_context
def dump_command(ctx: click.Context, target: str, partition: int | None, deep: bool, print_data: bool, as_json: bool) -> None:
    """List every message of a segment file, or of every segment of a topic.

    TARGET is a segment file (kl's .kl or Kafka 0.7's .kafka) or a topic name.  Each
    message shows its offset, position, size, magic, codec, timestamp, key and whether
    its checksum is valid.  At damage the listing stops and says why; it then exits 3.
    """
    if os.path.isfile(target):
        files = [(target, None, None)]
    else:
        root = get_root(ctx)
        config = root.config(target)
        parts = [partition] if partition is not None else range(config.partitions)
        files = [(s.path, s.base_offset, config.max_message_bytes) for p in parts for s in root.log(target, p).segments()]
    out = sys.stdout
    for path, base, limit in files:
        if not as_json:
            out.write(f"Dumping {path}\n")
        options = {"base_offset": base, "deep": deep} | ({"max_message_bytes": limit} if limit else {})
        for record in dump_file(path, **options):
            out.write(_dump_json(record, print_data) if as_json else _dump_line(record, print_data))
            if not record.valid:
                if not as_json:
                    out.write(f"stopped at offset {record.offset} (position {record.position}): {record.problem}\n")
                ctx.exit(EXIT_DAMAGE)


def _show(data: bytes | None) -> str:
    return "-" if data is None else data.decode("utf-8", "backslashreplace")


def _dump_line(record: DumpRecord, print_data: bool, indent: str = "") -> str:
    if not record.valid:
        return f"{indent}offset: {record.offset} position: {record.position} size: {record.size} valid: no\n"
    line = (
        f"{indent}offset: {record.offset} position: {record.position} size: {record.size} magic: {record.magic} "
        f"codec: {record.codec} timestamp: {record.timestamp if record.timestamp is not None else '-'} valid: yes"
    )
    if print_data:
        line += f" key: {_show(record.key)} value: {_show(record.value) if record.codec in ('none',) else '(compressed)'}"
    return line + "\n" + "".join(_dump_line(inner, print_data, indent + "  ") for inner in record.inner)


def _dump_json(record: DumpRecord, print_data: bool) -> str:
    obj = {k: v for k, v in dataclasses.asdict(record).items() if k not in ("key", "value", "inner")}
    obj["valid"] = record.valid
    if print_data:
        obj["key"] = _show(record.key) if record.key is not None else None
        obj["value"] = _show(record.value) if record.codec == "none" else None
    if record.inner:
        obj["inner"] = [json.loads(_dump_json(inner, print_data)) for inner in record.inner]
    return json.dumps(obj) + "\n"
