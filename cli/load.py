"""``kl load``: topics into Parquet, exactly once (``kl.spark.load``; the journal is
``kl.spark.journal``).  ``--status`` and ``--dry-run`` read the journal only: they
neither import pyspark nor start Spark."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import asdict

import click

from kl.spark import journal, ranges
from kl.spark.journal import Limits, LoadProgress, Progress, RunReport, Settings, Status
from kl_cli.common import aligned, get_root, print_line


@click.command("load")
@click.argument("topics", nargs=-1, metavar="TOPIC...")
@click.option("-o", "--output", metavar="DIR", help="The directory to load into (Parquet files and the run journal).")
@click.option("--status", "status_dir", metavar="DIR", help="Show what has been loaded into DIR; start nothing.")
@click.option("--master", metavar="URL", help="Spark master (default: local[*], or what spark-submit chose).")
@click.option(
    "--start",
    type=click.Choice(journal.STARTS),
    default="earliest",
    show_default=True,
    help="Where a partition not loaded before starts.",
)
@click.option(
    "--on-data-loss",
    type=click.Choice(journal.ON_DATA_LOSS),
    default="fail",
    show_default=True,
    help="When retention deleted messages before they were loaded: exit 1 naming them, or load what is left.",
)
@click.option(
    "--on-recreated",
    type=click.Choice(ranges.ON_RECREATED),
    default="fail",
    show_default=True,
    help="When a topic was deleted and created again since it was loaded: exit 1, or load the new topic from its start.",
)
@click.option(
    "--max-bytes",
    type=click.IntRange(min=0),
    default=0,
    metavar="N",
    help="Load at most N bytes per partition per run (0: no limit).",
)
@click.option(
    "--max-messages",
    type=click.IntRange(min=0),
    default=0,
    metavar="N",
    help="Load at most N messages per partition per run (0: no limit).",
)
@click.option(
    "--granularity",
    type=click.Choice(journal.GRANULARITIES),
    default="hour",
    show_default=True,
    help="Directories per date and hour of the message timestamp (UTC), or per date only.",
)
@click.option(
    "--value-format",
    type=click.Choice(journal.VALUE_FORMATS),
    default="binary",
    show_default=True,
    help="value as bytes, as text (UTF-8), or as text parsed from JSON into the columns of --schema.",
)
@click.option("--schema", metavar="DDL", help="The columns of JSON values, as Spark DDL: 'user string, n int'.")
@click.option(
    "--headers",
    is_flag=True,
    help="Write each message's headers as a column 'headers' (a list of key/value structs; null without any).",
)
@click.option(
    "--bad-timestamps",
    type=click.Choice(("fail", "clamp", "null")),  # kl.spark.arrow.BAD_TIMESTAMPS, not imported before Spark is needed
    default="fail",
    show_default=True,
    help="A timestamp outside the years 1 to 9999: exit 1 naming the message, clamp it into the range, or load it as null.",
)
@click.option("--dry-run", is_flag=True, help="Print the planned ranges; change nothing, start no Spark.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per partition on stdout.")
@click.option("--wait", is_flag=True, help="Wait for another kl load on DIR to finish instead of exiting 1.")
@click.option("-v", "--verbose", is_flag=True, help="Let Spark and its JVM log their warnings and notices on stderr.")
@click.pass_context
def load(
    ctx: click.Context,
    topics: tuple[str, ...],
    output: str | None,
    status_dir: str | None,
    master: str | None,
    start: str,
    on_data_loss: str,
    on_recreated: str,
    max_bytes: int,
    max_messages: int,
    granularity: str,
    value_format: str,
    schema: str | None,
    headers: bool,
    bad_timestamps: str,
    dry_run: bool,
    as_json: bool,
    wait: bool,
    verbose: bool,
) -> None:
    """Load topics into Parquet files under DIR, exactly once, with Spark.

    Each run reads every partition from the offset the last run reached to its end
    fixed now, and writes DIR/topic=T/date=D/hour=H/p<partition>-<start>-<end>.parquet.
    A run that was killed is finished by the next one with the same files, so every
    message is in DIR exactly once.  On a terminal, a progress display shows the run's
    phases; otherwise only the summary is printed.  Made for cron; see kl-load(1).
    """
    if status_dir is not None:
        if output is not None or topics:
            raise click.UsageError("--status DIR takes no TOPIC and no --output", ctx)
        _show_status(journal.status(status_dir), as_json)
        return
    if output is None:
        raise click.UsageError("give --output DIR (or --status DIR)", ctx)
    if not topics:
        raise click.UsageError("give at least one TOPIC", ctx)
    if value_format == "json" and schema is None:
        raise click.UsageError("--value-format json needs --schema DDL", ctx)
    if schema is not None and value_format != "json":
        raise click.UsageError("--schema applies to --value-format json only", ctx)
    root = get_root(ctx)
    limits = Limits(start, on_data_loss, max_bytes, max_messages, on_recreated)
    settings = Settings(granularity, value_format, schema, headers)
    if dry_run:
        reports = journal.run(root, output, list(topics), limits, settings, execute=None, dry_run=True)
    else:
        from kl.spark.load import load as run_load

        with _progress() as progress:
            reports = run_load(
                root,
                output,
                list(topics),
                limits=limits,
                settings=settings,
                master=master,
                wait=wait,
                progress=progress,
                bad_timestamps=bad_timestamps,
                quiet=not verbose,
            )
    for report in reports:
        _summary(report)
        if as_json:
            for p in report.partitions:
                row = {"run": report.run, "resumed": report.resumed, "dry_run": report.dry_run, **asdict(p)}
                sys.stdout.write(json.dumps(row) + "\n")
    sys.stdout.flush()


_PHASES = {"planned": "planned", "writing": "writing", "written": "committing", "committed": "committed"}


@contextlib.contextmanager
def _progress() -> Iterator[Progress | None]:
    """A live display of each run's phases on stderr when it is a terminal (and not CI), else nothing."""
    if not sys.stderr.isatty() or os.environ.get("CI"):
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, SpinnerColumn, TextColumn

    columns = (
        SpinnerColumn(),
        TextColumn("{task.description:<10}"),
        BarColumn(12),
        DownloadColumn(),
        TextColumn("{task.fields[detail]}"),
    )
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("planning", total=None, detail="")

        def show(p: LoadProgress) -> None:
            messages = p.messages_committed if p.phase == "committed" else p.messages_written
            detail = f"{p.partitions:,} partitions, {p.tasks_done:,}/{p.tasks:,} tasks, {messages:,} messages"
            bar.update(task, description=_PHASES[p.phase], completed=p.bytes_done, total=p.bytes or None, detail=detail)

        yield show


def _summary(report: RunReport) -> None:
    """The run, one line per partition, on stderr (a table on a terminal)."""
    verb = "would load" if report.dry_run else "loaded"
    head = f"run {report.run}" + (" (finishing an interrupted run)" if report.resumed else "")
    messages = [p.messages for p in report.partitions]
    if report.dry_run:
        total = f"{verb} {sum(p.bytes for p in report.partitions):,} bytes"
    else:
        total = f"{verb} {sum(m or 0 for m in messages):,} messages ({sum(p.bytes for p in report.partitions):,} bytes)"
    rows = [
        {
            "partition": f"{p.topic}/{p.partition}",
            "messages": "-" if p.messages is None else f"{p.messages:,}",
            "bytes": f"{p.bytes:,}",
            "from -> to": f"{p.start} -> {p.end}",
            "lag": f"{p.lag:,}",
            "lost": ", ".join(f"{a}-{b}" for a, b in p.lost) or "-",
        }
        for p in report.partitions
    ]
    if sys.stderr.isatty():
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"{head}: {total}", title_justify="left")
        for name in rows[0] if rows else ():
            table.add_column(name, justify="left" if name == "partition" else "right")
        for row in rows:
            table.add_row(*row.values())
        Console(stderr=True, highlight=False).print(table)
        return
    lines = [f"{head}: {total}"]
    if rows:
        lines += aligned([list(rows[0]), *(list(r.values()) for r in rows)])
    sys.stderr.write("\n".join(lines) + "\n")
    sys.stderr.flush()


def _show_status(status: Status, as_json: bool) -> None:
    """What DIR holds, on stdout: JSON lines, plain lines, or a table on a terminal."""
    rows = [asdict(c) for c in status.partitions]
    unfinished = None
    if status.unfinished is not None:
        unfinished = {"unfinished_run": status.unfinished, "tasks": status.unfinished_tasks, "done": status.unfinished_done}
    if as_json:
        lines = [json.dumps(row) for row in rows] + ([json.dumps(unfinished)] if unfinished else [])
        sys.stdout.write("".join(line + "\n" for line in lines))
        return
    note = None
    if unfinished:
        note = (
            f"run {status.unfinished} is unfinished ({status.unfinished_done} of {status.unfinished_tasks} tasks done);"
            " the next kl load finishes it"
        )
    if sys.stdout.isatty():
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"{status.output}: last run {status.last_run or '-'}", title_justify="left")
        for name in ("partition", "offset", "rows", "last run", "loaded at"):
            table.add_column(name, justify="left" if name == "partition" else "right")
        for c in status.partitions:
            table.add_row(f"{c.topic}/{c.partition}", str(c.offset), f"{c.rows:,}", c.run, c.loaded_at)
        console = Console(highlight=False)
        console.print(table)
        if note:
            print_line(console, note)
        return
    out = [
        f"{c.topic}/{c.partition}: offset {c.offset}, {c.rows} rows, last run {c.run} at {c.loaded_at}" for c in status.partitions
    ]
    if not out:
        out.append(f"{status.output}: nothing loaded yet")
    if note:
        out.append(note)
    sys.stdout.write("".join(line + "\n" for line in out))
