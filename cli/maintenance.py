"""``kl recover``, ``kl retain`` and ``kl dump``: the operator's commands, cron-friendly.

Each prints plain lines when piped (one per partition, or per message), a table on a
terminal, or JSON lines with ``--json``; each exits 3 when it finds damage it did not
repair.  The work is the library's (``kl.log.recovery``, ``kl.log.retention``, ``kl.log.dump``).
"""

from __future__ import annotations

import base64
import collections
import contextlib
import dataclasses
import json
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

import click

import kl
from kl.log.dump import DumpRecord, Lines, Template, dump_file, dump_lines
from kl.log.message import Headers
from kl.log.recovery import RecoveryReport, recover
from kl.log.retention import DEFAULT_DELETE_DELAY, RetentionReport, retain
from kl_cli.common import DURATION, Progress, exclusive, get_root, print_line
from kl_cli.output import stdout_writer

EXIT_DAMAGE = 3
"""Damage was found and not repaired (or, with --dry-run, anything was found)."""

WRITE_LINES = 4096
"""Lines ``kl dump`` collects before it writes them out."""
SEGMENT_SUFFIXES = (".kl", ".kafka")
_SEGMENT_COPY = re.compile(r"(\d{20})\.(?:kl|kafka)(?:\..*)?")
"""A segment's name, or the name of a copy of it: ``NAME.damaged-TIME``, ``NAME.deleted``."""
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f\\\udc80-\udcff]")
_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\0": "\\0", "\\": "\\\\"}


def _partitions(root: kl.Root, topics: Iterable[str], out: _Output) -> list[tuple[str, int, kl.Log]]:
    """(topic, partition, log) of each partition to work on, all topics by default.

    A topic whose config cannot be read, and (for all topics) each stray entry of the
    root, is reported to ``out`` and left out; the others are all there.
    """
    names = list(topics)
    if not names:
        names, strays = root.listing()
        for name, reason in strays:
            stray = {"topic": name, "partition": None, "status": "stray", "reason": f"not a topic: {reason}"}
            out.other(stray | {"action": "left as it is"})
    found = []
    for name in names:
        try:
            found += [(name, p, root.log(name, p)) for p in range(root.config(name).partitions)]
        except kl.RootNotFound:
            raise
        except (kl.KlError, OSError) as e:
            out.error(name, None, e)
    return found


R = TypeVar("R")


def _each(
    targets: list[tuple[str, int, kl.Log]], out: _Output, progress: Progress, per_partition: bool, work: Callable[[kl.Log], R]
) -> Iterator[tuple[str, int, R]]:
    """``work(log)`` for each partition, named on the progress bar (advanced per partition
    when ``per_partition``); one that fails is reported on its line and the others go on."""
    for name, p, log in targets:
        progress.show(f"{name}/{p}")
        try:
            report = work(log)
        except kl.RootNotFound:
            raise
        except (kl.KlError, OSError) as e:
            out.error(name, p, e)
            continue
        finally:
            if per_partition:
                progress.advance()
        yield name, p, report


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _where(row: dict) -> str:
    return row["topic"] if row["partition"] is None else f"{row['topic']}/{row['partition']}"


def _other_line(row: dict) -> str:
    if row["status"] == "error":
        return f"{_where(row)}: error: {row['error']}"
    return f"{row.get('entry') or _where(row)}: {row['reason']} [{row['action']}]"


class _Output:
    """Rows as JSON lines, as plain lines written as they come, or (on a terminal) one
    table at the end.  ``line`` renders a row as one or more lines; ``cells`` as the
    table's columns.  Rows that are not about a partition's data (a stray entry of the
    root, a leftover, an error) go through :meth:`other` and :meth:`error`: one line
    each, after the table on a terminal."""

    def __init__(self, as_json: bool, line: Callable[[dict], str], cells: Callable[[dict], dict[str, str]]):
        self.as_json, self.line, self.cells = as_json, line, cells
        self.table = not as_json and sys.stdout.isatty()
        self.rows: list[dict] = []
        self.others: list[dict] = []
        self.skipped: list[str] = []
        """Stray entries of the root, and topics and partitions that failed: what was not done."""
        self.failed = False

    def add(self, row: dict) -> None:
        if self.table:
            self.rows.append(row)
            return
        self._write(json.dumps(row) if self.as_json else self.line(row))

    def other(self, row: dict) -> None:
        if row["status"] in ("stray", "error"):
            self.skipped.append(_where(row))
            self.failed = self.failed or row["status"] == "error"
        if self.table:
            self.others.append(row)
            return
        self._write(json.dumps(row) if self.as_json else _other_line(row))

    def error(self, topic: str, partition: int | None, e: Exception) -> None:
        text = f"{e.strerror}: {e.filename}" if isinstance(e, OSError) and e.filename is not None else str(e)
        self.other({"topic": topic, "partition": partition, "status": "error", "error": text})

    @staticmethod
    def _write(text: str) -> None:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()

    def close(self) -> None:
        if not self.rows and not self.others:
            return
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text

        console = Console()
        if self.rows:
            table = Table(*self.cells(self.rows[0]).keys(), box=None)
            for row in self.rows:
                table.add_row(*(Text(cell) for cell in self.cells(row).values()))  # plain text, not markup
            console.print(table)
        for row in self.others:
            print_line(console, _other_line(row))


def _size_in_bytes(log: kl.Log) -> int:
    try:
        return sum(s.size_in_bytes for s in log.segments())
    except (kl.KlError, OSError):
        return 0


# ----------------------------------------------------------------- kl recover


@click.command("recover")
@click.argument("topics", nargs=-1, metavar="[TOPIC]...")
@click.option("--deep", is_flag=True, help="Check every message of every segment, and segment continuity, not just the tail.")
@click.option("--dry-run", is_flag=True, help="Change nothing; exit 3 if anything is found.")
@click.option("--repair", is_flag=True, help="Also repair damage before the committed end, after copying the segment aside.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per partition.")
@click.pass_context
def recover_command(ctx: click.Context, topics: tuple[str, ...], deep: bool, dry_run: bool, repair: bool, as_json: bool) -> None:
    """Check partitions (all topics by default) and cut torn tails.

    Bytes past the published end and a damaged tail past the committed end are cut.
    Damage before the committed end is reported with its offset and left alone unless
    --repair is given.  With no TOPIC, entries of the root that are not topics are
    reported, and directories left by an interrupted topic create or delete are removed;
    so are, in each topic, what an interrupted alter, repair or write left.
    Exits 3 when damage or a stray entry remains (or, with --dry-run, anything was
    found), 1 when a topic or partition could not be checked.
    """
    exclusive(dry_run=dry_run, repair=repair)
    root = get_root(ctx)
    out = _Output(as_json, _recovery_line, _recovery_cells)
    found = False
    try:
        if not topics:
            for name, kind in root.remove_leftovers(dry_run=dry_run):
                found = found or dry_run
                action = "would remove" if dry_run else "removed"
                out.other({"topic": name, "partition": None, "status": "leftover", "reason": kind, "action": action})
        targets = _partitions(root, topics, out)
        for name, partitions in collections.Counter(name for name, _, _ in targets).items():
            found = _unfinished(root, name, partitions, out, dry_run) or found
        total = sum(_size_in_bytes(log) for _, _, log in targets) if deep else len(targets)
        with Progress(total, "bytes" if deep else "partitions") as progress:
            advance = progress.advance if deep and progress.bar is not None else None
            for name, p, report in _each(
                targets,
                out,
                progress,
                not deep,
                lambda log: recover(log, deep=deep, repair=repair, dry_run=dry_run, progress=advance),
            ):
                row = _recovery_row(name, p, report, dry_run)
                found = found or row["status"] in ("damaged", "found")
                out.add(row)
    finally:
        out.close()
    _exit(ctx, out, "not checked", EXIT_DAMAGE if found or out.skipped else 0)


def _unfinished(root: kl.Root, name: str, partitions: int, out: _Output, dry_run: bool) -> bool:
    """Report (and unless ``dry_run`` remove) what a killed ``kl topics alter`` of ``name``
    (of ``partitions`` as just read) left; True when anything found makes the exit status 3."""
    try:
        found = root.remove_unfinished(name, partitions=partitions, dry_run=dry_run)
    except kl.RootNotFound:
        raise
    except (kl.KlError, OSError) as e:
        out.error(name, None, e)
        return False
    for path, what, removable in found:
        entry = os.path.relpath(path, root.path)
        partition = os.path.basename(path)
        action = ("would remove" if dry_run else "removed") if removable else "left as it is"
        row = {"topic": name, "partition": int(partition) if partition.isdigit() else None, "entry": entry}
        out.other(row | {"status": "leftover", "reason": what, "action": action})
    return any(dry_run or not removable for _, _, removable in found)


def _exit(ctx: click.Context, out: _Output, what: str, code: int) -> None:
    """Exit 1 with one ``Error:`` line naming what was not done when a topic or partition
    failed, or when ``code`` is 1 and anything was skipped (a stray entry); else ``code``."""
    if out.failed or (code == 1 and out.skipped):
        raise click.ClickException(f"{what}: {', '.join(out.skipped)} (see the report)")
    if code:
        ctx.exit(code)


def _recovery_row(topic: str, partition: int, report: RecoveryReport, dry_run: bool) -> dict:
    if not report.findings:
        status = "ok"
    elif dry_run:
        status = "found"
    else:
        status = "damaged" if report.unrepaired else "fixed"
    return {
        "topic": topic,
        "partition": partition,
        "status": status,
        "checked_bytes": report.checked_bytes,
        "cut_bytes": report.cut_bytes,
        "cut_messages": report.cut_messages,
        "findings": [dataclasses.asdict(f) for f in report.findings],
    }


def _action(row: dict, action: str) -> str:
    if action != "reported":
        return action
    return "nothing changed" if row["status"] == "found" else "left as it is"


def _recovery_line(row: dict) -> str:
    where = f"{row['topic']}/{row['partition']}"
    if row["status"] == "ok":
        return f"{where}: ok ({row['checked_bytes']} bytes checked)"
    head = f"{where}: {row['status']}"
    lines = [f"{head}: offset {f['offset']}: {f['reason']} [{_action(row, f['action'])}]" for f in row["findings"]]
    if row["cut_bytes"]:
        verb = "would cut" if row["status"] == "found" else "cut"
        lines[-1] += f"; {verb} {_plural(row['cut_bytes'], 'byte')} ({_plural(row['cut_messages'], 'message')})"
    return "\n".join(lines)


def _recovery_cells(row: dict) -> dict[str, str]:
    return {
        "partition": f"{row['topic']}/{row['partition']}",
        "status": row["status"],
        "checked": f"{row['checked_bytes']:,}",
        "cut": f"{row['cut_bytes']:,} B, {row['cut_messages']} msg" if row["cut_bytes"] else "-",
        "findings": "\n".join(f"{f['offset']}: {f['reason']} [{_action(row, f['action'])}]" for f in row["findings"]) or "-",
    }


# ----------------------------------------------------------------- kl retain


@click.command("retain")
@click.argument("topics", nargs=-1, metavar="[TOPIC]...")
@click.option(
    "--max-age",
    type=DURATION,
    metavar="DURATION",
    help="Delete segments older than this (7d, 12h, 1h30m, 90s, 5000ms, PT1H; 0: no age limit); "
    "default: the topic's retention_ms.",
)
@click.option(
    "--max-bytes",
    type=click.IntRange(min=0),
    metavar="N",
    help="Keep at most N bytes per partition (0: no limit); default: the topic's retention_bytes.",
)
@click.option("--dry-run", is_flag=True, help="List what would be deleted; delete nothing.")
@click.option(
    "--delete-delay",
    type=click.FloatRange(min=0),
    default=DEFAULT_DELETE_DELAY,
    show_default=True,
    metavar="SECONDS",
    help="Unlink segments set aside at least this long ago.",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per partition.")
@click.pass_context
def retain_command(
    ctx: click.Context,
    topics: tuple[str, ...],
    max_age: int | None,
    max_bytes: int | None,
    dry_run: bool,
    delete_delay: float,
    as_json: bool,
) -> None:
    """Delete old segments, oldest first, by age and by size (all topics by default).

    A segment's age comes from its messages' timestamps, so copying a topic does not
    change what expires.  The active segment and lock files are never deleted.  An
    entry of the root that is not a topic, or a topic or partition that fails, is
    reported and skipped: the others are done, and the command then exits 1.
    """
    root = get_root(ctx)
    out = _Output(as_json, _retention_line, _retention_cells)
    try:
        targets = _partitions(root, topics, out)
        with Progress(len(targets), "partitions") as progress:
            limits = {"max_age_ms": max_age, "max_bytes": max_bytes}
            for name, p, report in _each(
                targets, out, progress, True, lambda log: retain(log, **limits, dry_run=dry_run, delete_delay=delete_delay)
            ):
                out.add(_retention_row(name, p, report, dry_run))
    finally:
        out.close()
    _exit(ctx, out, "not retained", 1 if out.skipped else 0)


def _retention_row(topic: str, partition: int, report: RetentionReport, dry_run: bool) -> dict:
    start, held = report.log_start_offset, report.held
    if dry_run and report.deleted:  # where the log would start: just after the last segment to go
        start = report.deleted[-1].base_offset + report.deleted[-1].size_in_bytes
    return {
        "topic": topic,
        "partition": partition,
        "dry_run": dry_run,
        "deleted": [
            {
                "segment": os.path.basename(s.path),
                "base_offset": s.base_offset,
                "size_in_bytes": s.size_in_bytes,
                "reason": reason,
            }
            for s, reason in zip(report.deleted, report.reasons, strict=True)
        ],
        "deleted_bytes": report.deleted_bytes,
        "held": None
        if held is None
        else {
            "segment": os.path.basename(held.segment.path),
            "base_offset": held.segment.base_offset,
            "offset": held.offset,
            "newest": held.newest,
            "later_segments": held.later,
            "later_bytes": held.later_bytes,
            "reason": held.reason,
        },
        "log_start_offset": start,
        "unlinked": report.unlinked,
        "unlinked_bytes": report.unlinked_bytes,
    }


def _retention_line(row: dict) -> str:
    where = f"{row['topic']}/{row['partition']}"
    verb = "would delete" if row["dry_run"] else "deleted"
    lines = [f"{where}: {verb} {d['segment']} ({_plural(d['size_in_bytes'], 'byte')}): {d['reason']}" for d in row["deleted"]]
    if row["held"]:
        lines.append(f"{where}: stopped at {row['held']['segment']}: {row['held']['reason']}")
    if row["deleted"]:
        starts = "log would start at" if row["dry_run"] else "log starts at"
        segments = _plural(len(row["deleted"]), "segment")
        summary = f"{verb} {segments} ({_plural(row['deleted_bytes'], 'byte')}); {starts} {row['log_start_offset']}"
    else:
        summary = f"nothing to delete; log starts at {row['log_start_offset']}"
    if row["unlinked"]:
        unlinked = "would unlink" if row["dry_run"] else "unlinked"
        summary += f"; {unlinked} {_plural(row['unlinked'], 'set-aside segment')} ({_plural(row['unlinked_bytes'], 'byte')})"
    return "\n".join(lines + [f"{where}: {summary}"])


def _retention_cells(row: dict) -> dict[str, str]:
    return {
        "partition": f"{row['topic']}/{row['partition']}",
        "would delete" if row["dry_run"] else "deleted": "\n".join(d["segment"] for d in row["deleted"]) or "-",
        "bytes": f"{row['deleted_bytes']:,}",
        "log start": str(row["log_start_offset"]),
        "would unlink" if row["dry_run"] else "unlinked": f"{row['unlinked']} ({row['unlinked_bytes']:,} bytes)",
        "stopped at": f"{row['held']['segment']}: {row['held']['reason']}" if row["held"] else "-",
    }


# ----------------------------------------------------------------- kl dump


@click.command("dump")
@click.argument("target")
@click.option("-p", "--partition", type=click.IntRange(min=0), metavar="N", help="Only this partition of a topic.")
@click.option("--deep", is_flag=True, help="Also list the messages inside compressed batches.")
@click.option("--print-data", is_flag=True, help="Print values too.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per message.")
@click.pass_context
def dump_command(ctx: click.Context, target: str, partition: int | None, deep: bool, print_data: bool, as_json: bool) -> None:
    """List every message of a segment file, or of every segment of a topic.

    TARGET is a segment file (kl's .kl or Kafka 0.7's .kafka) or a topic name.  Each
    message shows its offset, position, size, magic, codec, timestamp, key and whether
    its checksum is valid.  At damage the listing of that file stops and says why; the
    command then exits 3.  On a terminal, a progress bar on stderr shows the bytes read.
    """
    write = stdout_writer()
    targets = list(_dump_targets(ctx, target, partition))
    damaged = False
    with _progress(sum(size for *_, size in targets)) as advance:
        done = 0
        for path, partition_, base, published, limit, size in targets:
            out: list[str] = [] if as_json else [f"Dumping {path}\n"]
            options = {"base_offset": base, "deep": deep} | ({"max_message_bytes": limit} if limit else {})
            past_end = False
            if print_data:
                listing = dump_file(path, **options)
            else:
                templates = (_json_line(partition_, False), _json_line(partition_, True)) if as_json else (_TEXT_LINE, _TEXT_LINE)
                listing = dump_lines(path, published=published, templates=templates, **options)
            for record in listing:
                if published is not None and record.position >= published and not past_end:
                    past_end = True
                    if not as_json:
                        out.append(
                            f"published end at offset {base + published}; what follows was never published (kl recover cuts it)\n"
                        )
                if isinstance(record, Lines):  # a run of plain messages, its lines made by the core
                    write(_encode(out) + record.text)
                    out.clear()
                    advance(done + record.end)
                    continue
                out.append(_dump_json(record, print_data, partition_, past_end) if as_json else _dump_line(record, print_data))
                if len(out) >= WRITE_LINES:
                    write(_encode(out))
                    out.clear()
                    advance(done + record.position + record.size)
                if record.problem is None:
                    continue
                damaged = damaged or not past_end
                if record.codec == "-" and not as_json:  # a message that failed its checks: dump_file stops there
                    out.append(f"stopped at offset {record.offset} (position {record.position}): {record.problem}\n")
            write(_encode(out))
            done += size
            advance(done)
    if damaged:
        ctx.exit(EXIT_DAMAGE)


def _encode(lines: list[str]) -> bytes:
    """Lines as UTF-8; a file name's bytes that are not UTF-8 go out as they are."""
    return "".join(lines).encode("utf-8", "surrogateescape")


@contextlib.contextmanager
def _progress(total: int) -> Iterator[Callable[[int], None]]:
    """A function to report bytes done: a progress bar on stderr when it is a terminal
    and stdout is not (there, the listing shows how far it got)."""
    if not sys.stderr.isatty() or sys.stdout.isatty():
        yield lambda done: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

    columns = ("dumping", BarColumn(), DownloadColumn(), TimeRemainingColumn())
    with Progress(
        *columns, console=Console(stderr=True), transient=True, redirect_stdout=False, redirect_stderr=False
    ) as progress:
        task = progress.add_task("dump", total=total)
        yield lambda done: progress.update(task, completed=done)


def _dump_targets(
    ctx: click.Context, target: str, partition: int | None
) -> Iterator[tuple[str, int | None, int | None, int | None, int | None, int]]:
    """(path, partition, base offset, published size, max message bytes, file size) of each file to dump."""
    if os.path.isdir(target):
        raise click.ClickException(f"{target} is a directory: give a segment file or a topic name")
    if os.path.isfile(target) or os.sep in target or target.endswith(SEGMENT_SUFFIXES):
        if partition is not None:
            raise click.UsageError("-p/--partition applies to a topic, not to a segment file", ctx)
        if not os.path.isfile(target):
            raise click.ClickException(f"no such segment file: {target}")
        named = _SEGMENT_COPY.fullmatch(os.path.basename(target))
        yield target, None, int(named.group(1)) if named else 0, None, None, os.path.getsize(target)
        return
    root = get_root(ctx)
    config = root.config(target)
    for p in [partition] if partition is not None else range(config.partitions):
        # the last is the active one, sized to the published end; the others end at the next one's base
        for segment in root.log(target, p).segments():
            yield segment.path, p, segment.base_offset, segment.size_in_bytes, config.max_message_bytes, _file_size(segment.path)


def _file_size(path: str) -> int:
    """The size of the file at ``path``, 0 when retention deleted it meanwhile."""
    try:
        return os.path.getsize(path)
    except FileNotFoundError:
        return 0


def _show(data: bytes | None) -> str:
    """Bytes as text on one line: UTF-8, with the escapes ``kl produce -d`` understands."""
    if data is None:
        return "-"
    text = data.decode("utf-8", "surrogateescape")  # a byte that is not UTF-8 becomes U+DC80..U+DCFF
    return _UNPRINTABLE.sub(lambda m: _ESCAPES.get(m.group(), f"\\x{ord(m.group()) & 0xFF:02x}"), text)


_TEXT_LINE: Template = (b"offset: ", b" position: ", b" size: ", b" magic: 2 codec: none timestamp: ", b" valid: yes key: -\n")
"""``_dump_line``'s line for a valid plain message without a key, around its numbers."""


def _dump_line(record: DumpRecord, print_data: bool) -> str:
    if record.codec == "-":  # a message that failed its checks
        return f"offset: {record.offset} position: {record.position} size: {record.size} valid: no\n"
    timestamp = "-" if record.timestamp is None else record.timestamp
    key = "-" if record.key is None else _show(record.key)
    line = (
        f"offset: {record.offset} position: {record.position} size: {record.size} magic: {record.magic} "
        f"codec: {record.codec} timestamp: {timestamp} valid: yes key: {key}"
    )
    if record.headers:
        line += f" headers: {_show_headers(record.headers)}"
    if print_data:
        line += f" value: {_value(record)}"
    if record.problem is None and not record.inner:  # most lines
        return line + "\n"
    inner = [
        f"  inner: {i} timestamp: {_timestamp(msg)} key: {_show(msg.key)} value_size: {msg.size}"
        + (f" headers: {_show_headers(msg.headers)}" if msg.headers else "")
        + (f" value: {_value(msg)}" if print_data else "")
        for i, msg in enumerate(record.inner)
    ]
    if not record.valid:  # the batch's checksum holds, but what it holds cannot be read
        inner.append(f"  inner: cannot be read: {record.problem}")
    return "\n".join([line, *inner]) + "\n"


def _show_headers(headers: Headers) -> str:
    """Headers as ``kl consume --format {headers}`` shows them: ``k1=v1,k2`` (k2's value null)."""
    return ",".join(_show(name.encode()) if data is None else f"{_show(name.encode())}={_show(data)}" for name, data in headers)


def _timestamp(record: DumpRecord) -> str:
    return "-" if record.timestamp is None else str(record.timestamp)


def _value(record: DumpRecord) -> str:
    if record.codec == "none":
        return "(null)" if record.value is None else _show(record.value)
    return "(padding)" if record.codec == "padding" else "(compressed)"


def _json_field(obj: dict, name: str, data: bytes | None) -> None:
    """``name`` as a string when ``data`` is UTF-8, else ``name_b64`` (as kl consume --json)."""
    try:
        obj[name] = None if data is None else data.decode("utf-8")
    except UnicodeDecodeError:
        obj[name + "_b64"] = base64.b64encode(data).decode("ascii")


def _json_headers(headers: Headers) -> list[dict]:
    """Headers as ``kl consume --json`` writes them: one object per header, in order."""
    out: list[dict] = []
    for name, data in headers:
        header = {"key": name}
        _json_field(header, "value", data)
        out.append(header)
    return out


def _json_line(partition: int | None, past_end: bool) -> Template:
    """``_dump_json``'s line for a valid plain message without a key, around its numbers."""
    head = "{" if partition is None else f'{{"partition": {partition}, '
    tail = ', "valid": true, "problem": null, "key": null' + (', "past_log_end": true' if past_end else "") + "}\n"
    numbers = (b', "position": ', b', "size": ', b', "magic": 2, "codec": "none", "timestamp": ')
    return (f'{head}"offset": '.encode(), *numbers, tail.encode())


def _dump_json(record: DumpRecord, print_data: bool, partition: int | None, past_end: bool) -> str:
    obj: dict = {} if partition is None else {"partition": partition}
    obj |= {k: getattr(record, k) for k in ("offset", "position", "size", "magic", "codec", "timestamp")}
    obj |= {"valid": record.valid, "problem": record.problem}
    _json_field(obj, "key", record.key)
    if record.headers:
        obj["headers"] = _json_headers(record.headers)
    if print_data and record.codec == "none":
        _json_field(obj, "value", record.value)
    if past_end:
        obj["past_log_end"] = True
    if record.inner:
        obj["inner"] = []
        for msg in record.inner:
            inner = {"timestamp": msg.timestamp}
            _json_field(inner, "key", msg.key)
            inner["value_size"] = msg.size
            if msg.headers:
                inner["headers"] = _json_headers(msg.headers)
            if print_data:
                _json_field(inner, "value", msg.value)
            obj["inner"].append(inner)
    return json.dumps(obj) + "\n"
