"""``kl groups list|describe|reset|delete|delete-offsets|export|import``: consumer group administration.

The work is ``kl.groups``'s; this parses, calls it and renders: tables on a terminal,
plain columns when piped, JSON with ``--json``.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import json
import sys
import time

import click

import kl
from kl import groups as admin
from kl import timespec
from kl.registry import Registry, parse_position
from kl_cli import complete
from kl_cli.common import DURATION, TIME, aligned, exclusive, get_root, note, print_line

MEMBER_COLUMNS = ("member", "host", "pid", "since", "last beat")
PARTITION_COLUMNS = ("topic", "partition", "owner", "committed", "log end", "lag", "lag bytes", "lag time", "status")
NUMERIC = {"pid", "partition", "committed", "log end", "lag", "lag bytes", "lag time"}


@click.group()
def groups() -> None:
    """List, describe, reset, delete, export and import consumer groups, and delete their offsets."""


@groups.command("list", short_help="List the groups.")
@click.option("--json", "as_json", is_flag=True, help="Print, per group, what groups describe --json prints (JSON lines).")
@click.pass_context
def list_(ctx: click.Context, as_json: bool) -> None:
    """List the groups, one name a line (a table with members and offsets on a terminal)."""
    root = get_root(ctx)
    names = admin.list_groups(root)
    if as_json:
        sys.stdout.write("".join(_json(admin.describe(root, name)) for name in names))
        return
    if not sys.stdout.isatty():
        sys.stdout.write("".join(name + "\n" for name in names))
        return
    rows = []
    for name in names:
        registry = Registry(root.path, name, lock_timeout=root.lock_timeout)
        rows.append([name, str(len(registry.members())), str(len(registry.partitions("offsets")))])
    _table(None, ["group", "members", "offsets"], rows, {"members", "offsets"})


@groups.command(short_help="Show members, owners, committed offsets and lag.")
@click.argument("group", shell_complete=complete.groups)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object, on one line.")
@click.pass_context
def describe(ctx: click.Context, group: str, as_json: bool) -> None:
    """Print GROUP's live members and, per partition, its owner, committed offset and lag.

    Lag is counted from the committed offset to the log end: in messages, in bytes, and
    in time (the age of the oldest message not consumed yet).  A committed offset inside
    a compressed batch reads OFFSET+SKIP.  Exits 1 after the listing when an offset file
    is damaged, or a partition's state unreadable (its status names the damage).
    """
    info = admin.describe(get_root(ctx), group)
    damaged = [p for p in info.partitions if p.status is admin.Status.DAMAGED]
    unreadable = [p for p in info.partitions if p.status is admin.Status.UNREADABLE]
    _describe(info, as_json)
    problems = []
    if damaged:
        where = ", ".join(f"{p.topic}/{p.partition}" for p in damaged)
        problems.append(
            f"damaged committed offset file{'s' if len(damaged) > 1 else ''} of {where}:"
            f" reset {'them' if len(damaged) > 1 else 'it'} with 'kl groups reset'"
        )
    if unreadable:
        where = ", ".join(f"{p.topic}/{p.partition}" for p in unreadable)
        problems.append(f"unreadable partition state{'s' if len(unreadable) > 1 else ''} of {where}: run 'kl recover'")
    if problems:
        raise click.ClickException(f"group {info.group}: {'; '.join(problems)}")


def _member(member: admin.MemberInfo) -> str:
    """A member's id; for a group's Kafka clients, who coordinates them."""
    kafka = member.subscription.get("kafka")
    return member.id if kafka is None else f"Kafka clients (kl serve --kafka at {kafka})"


def _describe(info: admin.GroupInfo, as_json: bool) -> None:
    if as_json:
        sys.stdout.write(_json(info))
        return
    members = [[_member(m), m.host, str(m.pid), _when(m.since_ms), _ago(m.beat_age_ms)] for m in info.members]
    partitions = [
        [
            p.topic,
            str(p.partition),
            p.owner or "-",
            _number(p.position),
            _number(p.log_end_offset),
            _number(p.lag_messages),
            _number(p.lag_bytes),
            _duration(p.lag_ms),
            p.status.value if p.damage is None else f"{p.status.value}: {p.damage}",
        ]
        for p in info.partitions
    ]
    if sys.stdout.isatty():
        if members:
            _table(f"group {info.group}: members", list(MEMBER_COLUMNS), members, NUMERIC)
        else:
            from rich.console import Console

            print_line(Console(), f"group {info.group}: no live members")
        _table("partitions", list(PARTITION_COLUMNS), partitions, NUMERIC)
        return
    lines = [f"group  {info.group}", ""]
    lines += _columns(MEMBER_COLUMNS, members) if members else ["no live members"]
    lines.append("")
    lines += _columns(PARTITION_COLUMNS, partitions)
    sys.stdout.write("\n".join(lines) + "\n")


@groups.command(short_help="Move committed offsets (earliest, latest, a time, an offset, a shift).")
@click.argument("group", shell_complete=complete.groups)
@click.option(
    "--to",
    "to",
    metavar="earliest|latest|TIME|OFFSET[+SKIP]",
    shell_complete=complete.keywords(complete.RESET_KEYWORDS),
    help="The log start, the log end, the first message stamped at or after TIME (a time as below, not digits), "
    "or byte OFFSET (one partition only; OFFSET+SKIP: after the first SKIP messages of the compressed batch there).",
)
@click.option(
    "--to-datetime",
    type=TIME,
    metavar="TIME",
    help="The first message stamped at or after TIME: milliseconds since the epoch, ISO 8601 (local time unless it "
    "names a zone), now, today, yesterday, or a time ago such as -1h, -2d.",
)
@click.option(
    "--by-duration",
    type=DURATION,
    metavar="DURATION",
    help="The first message stamped at or after DURATION ago (2d, 1h30m, PT1H30M, ...).",
)
@click.option(
    "--shift-by",
    type=int,
    metavar="N",
    help="N messages after the committed offset (before it when N is negative), kept within the log.",
)
@click.option("--topic", metavar="TOPIC", shell_complete=complete.topics, help="Reset TOPIC's partitions only.")
@click.option(
    "-p",
    "--partition",
    type=click.IntRange(min=0),
    metavar="N",
    shell_complete=complete.partitions("topic"),
    help="With --topic: reset partition N only.",
)
@click.option("--force", is_flag=True, help="Reset even while the group has live members.")
@click.option("--dry-run", is_flag=True, help="Print what would change; write nothing.")
@click.pass_context
def reset(
    ctx: click.Context,
    group: str,
    to: str | None,
    to_datetime: int | None,
    by_duration: int | None,
    shift_by: int | None,
    topic: str | None,
    partition: int | None,
    force: bool,
    dry_run: bool,
) -> None:
    """Set GROUP's committed offsets, of every partition it knows of (or of --topic), to
    the place that one of the options below names.

    Refused while the group has live members (they would commit over it), unless
    --force.  Prints one line per partition: TOPIC/PARTITION: OLD -> NEW.
    """
    given = {"to": to, "to_datetime": to_datetime, "by_duration": by_duration, "shift_by": shift_by}
    exclusive(**{name: value is not None for name, value in given.items()})
    if partition is not None and topic is None:
        raise click.UsageError("--partition needs --topic")
    target: admin.Target
    if to is not None:
        target = _target(to)
    elif to_datetime is not None:
        target = admin.AtTime(to_datetime)
    elif by_duration is not None:
        target = admin.AtTime(int(time.time() * 1000) - by_duration)
    elif shift_by is not None:
        target = admin.ShiftBy(shift_by)
    else:
        raise click.UsageError("give one of --to, --to-datetime, --by-duration or --shift-by")
    changes = admin.reset(get_root(ctx), group, target, topic=topic, partition=partition, force=force, dry_run=dry_run)
    suffix = " (dry run: not written)" if dry_run else ""
    sys.stdout.write("".join(f"{c.topic}/{c.partition}: {_number(c.old)} -> {c.new}{suffix}\n" for c in changes))


@groups.command(short_help="Delete a group.")
@click.argument("group", shell_complete=complete.groups)
@click.option("--force", is_flag=True, help="Delete even while the group has live members.")
@click.pass_context
def delete(ctx: click.Context, group: str, force: bool) -> None:
    """Delete GROUP: its members' registrations, owners and committed offsets."""
    admin.delete(get_root(ctx), group, force=force)
    note(f"deleted group {group}")


@groups.command("delete-offsets", short_help="Delete a group's committed offsets of a topic.")
@click.argument("group", shell_complete=complete.groups)
@click.argument("topic", shell_complete=complete.topics)
@click.option(
    "-p",
    "--partition",
    "partitions",
    type=click.IntRange(min=0),
    multiple=True,
    metavar="N",
    shell_complete=complete.partitions("topic"),
    help="Delete the offset of partition N only (repeatable; default: every partition of TOPIC).",
)
@click.option("--force", is_flag=True, help="Delete even while live members subscribe to TOPIC.")
@click.pass_context
def delete_offsets(ctx: click.Context, group: str, topic: str, partitions: tuple[int, ...], force: bool) -> None:
    """Delete GROUP's committed offsets of TOPIC (kafka-consumer-groups --delete-offsets):
    a member starting on those partitions goes by its reset policy.

    Refused while a live member subscribes to TOPIC (or Kafka clients are members),
    unless --force.  Prints one line per offset deleted: TOPIC/PARTITION: OFFSET -> deleted.
    """
    gone = admin.delete_offsets(get_root(ctx), group, topic, list(partitions) or None, force=force)
    sys.stdout.write("".join(f"{topic}/{p}: {_number(old)} -> deleted\n" for p, old in gone))
    if not gone:
        note(f"group {group} has no committed offset of {topic}{' there' if partitions else ''}")


@groups.command(short_help="Write committed offsets to stdout.")
@click.argument("group", shell_complete=complete.groups)
@click.pass_context
def export(ctx: click.Context, group: str) -> None:
    """Write GROUP's committed offsets to stdout, one 'TOPIC PARTITION OFFSET' line each
    (OFFSET+SKIP inside a compressed batch)."""
    sys.stdout.write(admin.export(get_root(ctx), group))


@groups.command("import", short_help="Set committed offsets from stdin.")
@click.argument("group", shell_complete=complete.groups)
@click.option("--force", is_flag=True, help="Import even while the group has live members.")
@click.pass_context
def import_(ctx: click.Context, group: str, force: bool) -> None:
    """Set GROUP's committed offsets from stdin, in the format export writes.

    Blank lines and lines starting with # are skipped.  Every line is checked before
    anything is written; GROUP is created when missing.
    """
    data = sys.stdin.buffer.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise kl.InvalidImport(f"the input is not UTF-8 text (byte {e.start})") from None
    changes = admin.import_offsets(get_root(ctx), group, text, force=force)
    note(f"imported {len(changes)} offset{'s' if len(changes) != 1 else ''} into group {group}")


def _target(text: str) -> admin.Target:
    if text in ("earliest", "latest"):
        return "earliest" if text == "earliest" else "latest"
    position = parse_position(text)
    if position is not None:
        return position
    try:
        return admin.AtTime(timespec.parse_time(text))
    except kl.InvalidTime:
        raise click.BadParameter(
            f"{text!r} is not earliest, latest, a byte offset (OFFSET or OFFSET+SKIP) or a time: {timespec.TIME_FORMS}",
            param_hint="'--to'",
        ) from None


def _json(info: admin.GroupInfo) -> str:
    """``groups describe --json``'s object, as one line."""
    return json.dumps(dataclasses.asdict(info), default=_json_value) + "\n"


def _json_value(value: object) -> object:
    if isinstance(value, enum.Enum):
        return value.value
    raise TypeError(f"cannot write {value!r} as JSON")


def _number(value: object) -> str:
    return "-" if value is None else str(value)


def _when(ms: int) -> str:
    when = datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc)
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def _ago(ms: int | None) -> str:
    return "-" if ms is None else _duration(ms) + " ago"


def _duration(ms: int | None) -> str:
    """``850ms``, ``4.2s``, ``3m 05s``, ``2h 10m``, ``3d 04h``; ``-`` for None."""
    if ms is None:
        return "-"
    if ms < 1000:
        return f"{ms}ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f}s"
    seconds = ms // 1000
    if seconds < 3600:
        return f"{seconds // 60}m {seconds % 60:02d}s"
    if seconds < 86400:
        return f"{seconds // 3600}h {seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d {seconds % 86400 // 3600:02d}h"


def _columns(header: tuple[str, ...], rows: list[list[str]]) -> list[str]:
    """Plain aligned columns (header names with spaces joined by underscores)."""
    return aligned([[name.replace(" ", "_") for name in header], *rows])


def _table(title: str | None, header: list[str], rows: list[list[str]], numeric: set[str]) -> None:
    from rich.console import Console
    from rich.table import Column, Table
    from rich.text import Text

    columns = [Column(name, justify="right" if name in numeric else "left") for name in header]
    table = Table(*columns, title=None if title is None else Text(title), title_justify="left", box=None)
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))  # taken as they are (a group id may hold "[b]"), not as markup
    Console().print(table)
