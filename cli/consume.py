"""``kl consume``: print a topic's messages.

The reading (round-robin over the partitions, stopping at the ends they had at the
start unless ``--follow``, damage) is ``Consumer.consume``'s; this renders each batch it
yields and writes it to stdout in one system call.  The default output is the fast
path: values only, joined with the delimiter.
"""

from __future__ import annotations

import base64
import json
import re
import signal
from collections.abc import Callable

import click

import kl
from kl_cli.common import (
    delimiter_options,
    exclusive,
    get_root,
    key_delimiter_option,
    parse_time,
    resolve_delimiter,
    server_option,
    to_bytes,
    unescape,
    warn,
)
from kl_cli.output import stdout_writer

FORMAT_FIELDS = ("topic", "partition", "offset", "next_offset", "timestamp", "key", "value")

Render = Callable[[str, int, list[kl.Message]], bytes]


@click.command(short_help="Print the messages of a topic.")
@click.argument("topics", nargs=-1, required=True, metavar="TOPIC...")
@click.option(
    "-o",
    "--from-offset",
    metavar="N|earliest|latest|-N",
    help="Start at byte offset N, at the first message (earliest, or kcat's beginning), after the last one "
    "(latest, or kcat's end), or N messages before the end  [default: earliest].",
)
@click.option(
    "--from-time",
    metavar="TIME",
    help="Start at the first message stamped at or after TIME (ISO 8601, or milliseconds since the epoch).",
)
@click.option("-p", "--partition", type=click.IntRange(min=0), metavar="N", help="Read partition N only.")
@click.option("-c", "--count", type=click.IntRange(min=0), metavar="N", help="Stop after N messages.")
@click.option("-f", "--follow", is_flag=True, help="Keep waiting for new messages.")
@delimiter_options("Write")
@key_delimiter_option("Write each key, TEXT and the value (no TEXT for a message without a key).")
@click.option(
    "--format",
    "fmt",
    metavar="FMT",
    help="Write each message with the Python format string FMT, then the delimiter; fields: "
    + " ".join(f"{{{field}}}" for field in FORMAT_FIELDS)
    + ".",
)
@click.option("--json", "json_output", is_flag=True, help="Write one JSON object per message.")
@click.option("--binary", is_flag=True, help="Write the values exactly as stored, nothing added.")
@click.option(
    "--skip-corrupt",
    is_flag=True,
    help="Step over a damaged message (named on stderr) instead of stopping with an error.",
)
@click.option(
    "-g",
    "--group",
    metavar="GROUP",
    help="Consume as a member of consumer group GROUP: this member's share of the partitions, from the "
    "group's committed offsets, committing what was written.",
)
@click.option(
    "--commit-interval",
    type=click.FloatRange(min=0),
    default=1.0,
    show_default=True,
    metavar="SECONDS",
    help="With --group: commit what was written this often (and when leaving).",
)
@click.option(
    "--start",
    "group_start",
    type=click.Choice(["earliest", "latest"]),
    default="earliest",
    show_default=True,
    help="With --group: where a partition the group never committed starts.",
)
@click.option(
    "--reset",
    "group_reset",
    type=click.Choice(["earliest", "latest", "fail"]),
    default="earliest",
    show_default=True,
    help="With --group: what to do when a committed offset is no longer in the log (retention deleted it).",
)
@server_option("Read")
@click.pass_context
def consume(
    ctx: click.Context,
    topics: tuple[str, ...],
    from_offset: str | None,
    from_time: str | None,
    partition: int | None,
    count: int | None,
    follow: bool,
    delimiter: bytes | None,
    null: bool,
    key_delimiter: bytes | None,
    fmt: str | None,
    json_output: bool,
    binary: bool,
    skip_corrupt: bool,
    group: str | None,
    commit_interval: float,
    group_start: str,
    group_reset: str,
    server: str | None,
) -> None:
    """Write the messages of TOPIC to stdout, one value a line, and exit when caught up.

    With --group, several topics may be given."""
    exclusive(from_offset=from_offset, from_time=from_time)
    exclusive(format=fmt, json=json_output, binary=binary, key_delimiter=key_delimiter)
    exclusive(json=json_output, delimiter=delimiter, null=null)
    exclusive(binary=binary, delimiter=delimiter, null=null)
    delim = resolve_delimiter(delimiter, null)
    where, n = _parse_from_offset(from_offset)
    time_ms = None if from_time is None else parse_time(from_time, "--from-time")
    render = None
    if fmt is not None:
        render = _format_renderer(fmt, delim)
    elif json_output:
        render = _render_json
    elif key_delimiter is not None:
        render = _keyed_renderer(key_delimiter, delim)

    write = stdout_writer()
    emit = _emitter(write, render, binary, delim)
    if group is not None and server is not None:
        raise click.UsageError("--group needs the root: a group cannot consume through --server")
    consumer = kl.RemoteConsumer(server) if server is not None else kl.Consumer(get_root(ctx))
    root = consumer.root
    if group is not None:
        if from_offset is not None or from_time is not None or partition is not None:
            raise click.UsageError(
                "--group reads from the group's committed offsets: no --from-offset, --from-time or --partition"
            )
        for topic in topics:
            root.config(topic)
        _consume_group(
            root,
            group,
            list(topics),
            emit,
            render is None,
            follow,
            count,
            skip_corrupt,
            commit_interval,
            group_start,
            group_reset,
        )
        return
    if len(topics) > 1:
        raise click.UsageError("several topics are read together only by a group: add --group")
    topic = topics[0]
    partitions = list(range(root.config(topic).partitions)) if partition is None else [partition]
    if where == "offset" and len(partitions) > 1:
        raise click.UsageError(f"a byte offset needs --partition: topic {topic!r} has {len(partitions)} partitions")
    start: kl.Start = where
    if time_ms is not None:
        start = {p: consumer.offset_for_time(topic, p, time_ms) for p in partitions}
    elif where == "back":
        start = {p: consumer.position_back(topic, p, n) for p in partitions}
    elif where == "offset":
        consumer.check_offset(topic, partitions[0], n)
        start = n

    batches = consumer.consume(
        topic,
        None if partition is None else partitions,  # all: with --follow, partitions added meanwhile too
        start=start,
        follow=follow,
        max_messages=count,
        values_only=render is None,
        skip_corrupt=skip_corrupt,
        on_skip=_warn_skipped,
    )
    try:
        for batch in batches:
            emit(batch)
    finally:
        if isinstance(consumer, kl.RemoteConsumer):
            consumer.close()  # at once: the server stops sending what was read ahead


def _emitter(write: Callable[[bytes], None], render: Render | None, binary: bool, delim: bytes) -> Callable[[kl.Batch], None]:
    """A function writing one batch to stdout as the options ask."""

    def emit(batch: kl.Batch) -> None:
        if render is not None:
            write(render(batch.topic, batch.partition, batch.messages))  # type: ignore[arg-type]
        elif binary:
            write(b"".join(batch.messages))  # type: ignore[arg-type]
        else:
            batch.messages.append(b"")  # type: ignore[arg-type]  # a delimiter after the last value too, without another copy
            write(delim.join(batch.messages))  # type: ignore[arg-type]

    return emit


def _consume_group(
    root: kl.Root,
    group: str,
    topics: list[str],
    emit: Callable[[kl.Batch], None],
    values_only: bool,
    follow: bool,
    count: int | None,
    skip_corrupt: bool,
    commit_interval: float,
    start: str,
    reset: str,
) -> None:
    """Consume this member's share; SIGTERM and Ctrl-C end it after the batch being
    written, commit, and leave the group (exit 0 after SIGTERM, 130 after Ctrl-C)."""
    member = kl.GroupConsumer(
        root, group, topics, start=start, reset=reset, auto_commit_interval=commit_interval, skip_corrupt=skip_corrupt
    )
    stopped_by: list[int] = []

    def stop(signum: int, frame: object) -> None:
        stopped_by.append(signum)
        member.stop()

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        for batch in member.batches(follow=follow, values_only=values_only, max_messages=count):
            emit(batch)
        member.commit()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        member.close()
    if signal.SIGINT in stopped_by:
        raise SystemExit(130)


def _warn_skipped(skipped: kl.Skipped) -> None:
    where = f"{skipped.topic}/{skipped.partition}"
    warn(f"skipped damaged data of {where} from offset {skipped.offset} to {skipped.next_offset}: {skipped.reason}")


def _text(data: bytes | None) -> str:
    return "" if data is None else data.decode("utf-8", "surrogateescape")


def _format_renderer(fmt: str, delim: bytes) -> Render:
    try:
        fmt = unescape(fmt)
        fmt.format(topic="", partition=0, offset=0, next_offset=0, timestamp=0, key="", value="")
    except (ValueError, KeyError, IndexError, AttributeError, TypeError) as e:
        raise click.BadParameter(f"{e.__class__.__name__}: {e}", param_hint="'--format'") from None

    def render(topic: str, partition: int, messages: list[kl.Message]) -> bytes:
        out = []
        for m in messages:
            fields = {
                "topic": topic,
                "partition": partition,
                "offset": m.offset,
                "next_offset": m.next_offset,
                "timestamp": "" if m.timestamp is None else m.timestamp,
                "key": _text(m.key),
                "value": _text(m.value),
            }
            try:
                out.append(to_bytes(fmt.format_map(fields)))
            except (ValueError, KeyError, IndexError, AttributeError, TypeError) as e:
                raise click.ClickException(f"--format cannot render the message at offset {m.offset}: {e}") from None
        out.append(b"")
        return delim.join(out)

    return render


def _keyed_renderer(key_delim: bytes, delim: bytes) -> Render:
    def render(topic: str, partition: int, messages: list[kl.Message]) -> bytes:
        return delim.join(m.value if m.key is None else m.key + key_delim + m.value for m in messages) + delim

    return render


def _json_field(obj: dict[str, object], name: str, data: bytes | None) -> None:
    if data is None:
        obj[name] = None
        return
    try:
        obj[name] = data.decode("utf-8")
    except UnicodeDecodeError:
        obj[name + "_b64"] = base64.b64encode(data).decode("ascii")


def _render_json(topic: str, partition: int, messages: list[kl.Message]) -> bytes:
    lines = []
    for m in messages:
        obj: dict[str, object] = {
            "topic": topic,
            "partition": partition,
            "offset": m.offset,
            "next_offset": m.next_offset,
            "timestamp": m.timestamp,
        }
        _json_field(obj, "key", m.key)
        _json_field(obj, "value", m.value)
        lines.append(json.dumps(obj, ensure_ascii=False) + "\n")
    return "".join(lines).encode("utf-8")


def _parse_from_offset(text: str | None) -> tuple[str, int]:
    """("earliest" or "latest", 0), ("offset", N) for a byte offset, or ("back", N) for -N;
    kcat's "beginning" and "end" are "earliest" and "latest"."""
    if text is None or text in ("earliest", "beginning"):
        return "earliest", 0
    if text in ("latest", "end"):
        return "latest", 0
    if re.fullmatch(r"[0-9]+", text):
        return "offset", int(text)
    if re.fullmatch(r"-[0-9]+", text):
        return "back", int(text[1:])
    raise click.BadParameter(f"{text!r} is not N, earliest, latest or -N", param_hint="'-o' / '--from-offset'")
