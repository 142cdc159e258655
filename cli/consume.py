"""``kl consume``: print a topic's messages.

The reading (round-robin over the partitions, stopping at the ends they had at the
start unless ``--follow``, damage) is ``Consumer.consume``'s; this renders each batch it
yields and writes it to stdout in one system call.  The default output is the fast
path: values only, joined with the delimiter.
"""

from __future__ import annotations

import json
import re
import signal
import string
from collections.abc import Callable
from typing import Any

import click

import kl
from kl import timespec
from kl.log import core
from kl_cli import complete
from kl_cli.common import (
    TIME,
    connection,
    delimiter_options,
    exclusive,
    get_root,
    key_delimiter_option,
    resolve_delimiter,
    server_option,
    to_bytes,
    unescape,
    warn,
)
from kl_cli.output import stdout_writer

FORMAT_FIELDS = ("topic", "partition", "offset", "next_offset", "kafka_offset", "timestamp", "key", "value", "headers")

Render = Callable[[str, int, list[kl.Message]], bytes]

NULL = "NULL"
"""A null key or value as -Z writes it (kcat's spelling)."""
GROUP_PIECE_BYTES = 64 << 10
"""With --group: the most each write holds (values, or one larger message), the size of
a pipe's buffer on Linux, so a commit can follow a slow reader closely."""


@click.command(short_help="Print the messages of a topic.")
@click.argument("topics", nargs=-1, required=True, metavar="TOPIC...", shell_complete=complete.topics)
@click.option(
    "-o",
    "--from-offset",
    metavar="N|kafka:N|earliest|latest|-N",
    shell_complete=complete.keywords(complete.FROM_OFFSET_KEYWORDS),
    help="Start at byte offset N, at the message of Kafka offset N (as Kafka clients of kl serve number "
    "it), at the first message (earliest, or kcat's beginning), after the last one (latest, or kcat's end), "
    "or N messages before the end  [default: earliest].",
)
@click.option(
    "--from-time",
    type=TIME,
    metavar="TIME",
    help="Start at the first message stamped at or after TIME: milliseconds since the epoch, ISO 8601 "
    "(local time unless it names a zone), now, today, yesterday, or a time ago such as -1h, -30m, -2d.",
)
@click.option(
    "--until-offset",
    type=click.IntRange(min=0),
    metavar="N",
    help="Stop before the first message at or past byte offset N (one partition), and exit, following or not.",
)
@click.option(
    "--until-time",
    type=TIME,
    metavar="TIME",
    help="Stop each partition before its first message stamped at or after TIME (the same forms; kcat's "
    "-o e@TIME), and exit when all have stopped, following or not.",
)
@click.option(
    "-p",
    "--partition",
    "partitions",
    type=click.IntRange(min=0),
    multiple=True,
    metavar="N",
    shell_complete=complete.partitions("topics"),
    help="Read partition N only; repeat to read several (of one topic).",
)
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
    + "; {timestamp:iso} is ISO 8601 in UTC; {headers} is kcat's %h, k1=v1,k2=v2 (a null value without its =).",
)
@click.option(
    "-Z",
    "--print-null",
    is_flag=True,
    help="Write a null key or value as NULL, not as an empty one (kcat's -Z).",
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
    shell_complete=complete.groups,
    help="Consume as a member of consumer group GROUP: this member's share of the partitions, from the "
    "group's committed offsets, committing what was written.",
)
@click.option(
    "--commit-interval",
    type=click.FloatRange(min=0),
    default=1.0,
    show_default=True,
    metavar="SECONDS",
    help="With --group: commit what was written to stdout this often (and when leaving).",
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
    from_time: int | None,
    until_offset: int | None,
    until_time: int | None,
    partitions: tuple[int, ...],
    count: int | None,
    follow: bool,
    delimiter: bytes | None,
    null: bool,
    key_delimiter: bytes | None,
    fmt: str | None,
    print_null: bool,
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

    Several topics are read together, their partitions in turn: each partition in
    order, the topics interleaved as their messages come ({topic} in --format, or
    --json, tells them apart)."""
    exclusive(from_offset=from_offset, from_time=from_time is not None)
    exclusive(format=fmt, json=json_output, binary=binary, key_delimiter=key_delimiter)
    exclusive(json=json_output, delimiter=delimiter, null=null)
    exclusive(binary=binary, delimiter=delimiter, null=null)
    exclusive(print_null=print_null, json=json_output, binary=binary)
    delim = resolve_delimiter(delimiter, null)
    where, n = _parse_from_offset(from_offset)
    render = None
    if key_delimiter is not None and print_null:  # (the core writes no key for a null one)
        fmt = "{key}" + key_delimiter.decode("utf-8", "surrogateescape").replace("{", "{{").replace("}", "}}") + "{value}"
    if fmt is not None:
        render = _format_renderer(fmt, delim, lambda: consumer, lambda: start, NULL if print_null else None)
    elif json_output:
        render = _render_json
    elif key_delimiter is not None:
        render = _keyed_renderer(key_delimiter, delim)
    elif print_null:
        render = _null_renderer(delim)

    if fmt is not None and "kafka_offset" in fmt and (server is not None or group is not None):
        raise click.UsageError("{kafka_offset} counts from where a read of the root starts: not with --server or --group")
    if where == "kafka" and server is not None:
        raise click.UsageError("a Kafka offset needs the root: not with --server")
    write = stdout_writer()
    emit = _emitter(write, render, binary, delim)
    if group is not None and server is not None:
        raise click.UsageError("--group needs the root: a group cannot consume through --server")
    consumer = kl.RemoteConsumer(server, **connection(ctx)) if server is not None else kl.Consumer(get_root(ctx))
    root = consumer.root
    if group is not None:
        if from_offset is not None or from_time is not None or partitions:
            raise click.UsageError(
                "--group reads from the group's committed offsets: no --from-offset, --from-time or --partition"
            )
        if until_offset is not None or until_time is not None:
            raise click.UsageError("--until-offset and --until-time read partitions from a start to an end: not with --group")
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
    if len(topics) > 1 and partitions:
        raise click.UsageError("--partition picks partitions of one topic: with several topics every partition is read")
    keys = [(topic, p) for topic in dict.fromkeys(topics) for p in (partitions or range(root.config(topic).partitions))]
    if (where in ("offset", "kafka") or until_offset is not None) and len(keys) > 1:
        if len(topics) == 1 and not partitions:
            raise click.UsageError(f"an offset needs --partition: topic {topics[0]!r} has {len(keys)} partitions")
        raise click.UsageError(f"an offset is for one partition, not {len(keys)}")
    start: kl.Start = where
    if from_time is not None:
        start = {key: consumer.offset_for_time(*key, from_time) for key in keys}
    elif where == "back":
        start = {key: consumer.position_back(*key, n) for key in keys}
    elif where == "offset":
        consumer.check_offset(*keys[0], n)
        start = n
    elif where == "kafka":
        start = {keys[0]: consumer.kafka_position(*keys[0], n)}  # type: ignore[union-attr]

    batches = consumer.consume(
        list(dict.fromkeys(topics)),
        keys if partitions else None,  # all: with --follow, partitions added meanwhile too
        start=start,
        until=until_offset,
        until_time=until_time,
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
            write(_joined(b"", batch.messages))  # type: ignore[arg-type]
        else:
            batch.messages.append(b"")  # type: ignore[arg-type]  # a delimiter after the last value too, without another copy
            write(_joined(delim, batch.messages))  # type: ignore[arg-type]

    return emit


def _joined(delim: bytes, values: list[bytes | None]) -> bytes:
    """``values`` joined with ``delim``, a null value written as an empty one."""
    try:
        return delim.join(values)  # type: ignore[arg-type]
    except TypeError:  # a null value (rare: not worth a look at every value first)
        return delim.join([b"" if value is None else value for value in values])


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
        root,
        group,
        topics,
        start=start,
        reset=reset,
        auto_commit_interval=commit_interval,
        max_bytes=GROUP_PIECE_BYTES,
        skip_corrupt=skip_corrupt,
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
        raise KeyboardInterrupt


def _warn_skipped(skipped: kl.Skipped) -> None:
    where = f"{skipped.topic}/{skipped.partition}"
    warn(f"skipped damaged data of {where} from offset {skipped.offset} to {skipped.next_offset}: {skipped.reason}")


def _text(data: bytes | None) -> str:
    return "" if data is None else data.decode("utf-8", "surrogateescape")


class _Timestamp:
    """A message's timestamp as ``--format`` writes it: ``{timestamp}`` milliseconds since
    the epoch, ``{timestamp:iso}`` ISO 8601 in UTC, any other spec as an int's (``{timestamp:>15}``);
    empty for a message without one."""

    __slots__ = ("ms",)

    def __init__(self, ms: int | None):
        self.ms = ms

    def __format__(self, spec: str) -> str:
        if spec == "iso":
            return "" if self.ms is None else timespec.format_iso(self.ms)
        return format("" if self.ms is None else self.ms, spec)

    def __str__(self) -> str:
        return format(self, "")


def _format_renderer(
    fmt: str, delim: bytes, consumer: Callable[[], Any], start: Callable[[], Any], null: str | None = None
) -> Render:
    """``consumer`` and ``start``: the consumer and the start it was given, once they are
    known (``{kafka_offset}`` counts on from them); ``null``: how a null key or value is
    written (None: as an empty one)."""
    try:
        fmt = unescape(fmt)
        fmt.format(
            topic="", partition=0, offset=0, next_offset=0, kafka_offset=0, timestamp=_Timestamp(0), key="", value="", headers=""
        )
    except (ValueError, KeyError, IndexError, AttributeError, TypeError) as e:
        raise click.BadParameter(f"{e.__class__.__name__}: {e}", param_hint="'--format'") from None
    parsed = list(string.Formatter().parse(fmt))
    if null is None and all(
        name is None or (conversion is None and (name in ("topic", "partition") or (name, spec) in _CORE_FIELDS))
        for _, name, spec, conversion in parsed
    ):  # every field one the core writes, or the batch's topic and partition (texts of their own)

        def parts(topic: str, partition: int) -> list[bytes | int]:
            out: list[bytes | int] = []
            for text, name, spec, _ in parsed:
                out.append(to_bytes(text))
                if name in ("topic", "partition"):
                    out.append(to_bytes(format(topic if name == "topic" else partition, spec or "")))
                elif name is not None:
                    out.append(_CORE_FIELDS[name, spec or ""])
            return [*out, delim]

        return _core_renderer(parts)

    counted: dict[tuple[str, int], tuple[int, int, int]] = {}
    """Partition -> its last message's offset and next offset, and its Kafka offset."""
    wants_kafka = any(name == "kafka_offset" for _, name, _, _ in parsed)

    def kafka_offset(topic: str, partition: int, m: kl.Message) -> int:
        last = counted.get((topic, partition))
        if last is not None and m.offset in (last[0], last[1]):  # the same batch, or the next message
            k = last[2] + 1
        else:
            reader = consumer()
            begun = start()
            at = begun.get((topic, partition)) if isinstance(begun, dict) else None
            skip = at.skip if isinstance(at, kl.Position) and last is None and at.offset == m.offset else 0
            k = reader.kafka_offset(topic, partition, m.offset, skip)
        counted[topic, partition] = (m.offset, m.next_offset, k)
        return k

    def render(topic: str, partition: int, messages: list[kl.Message]) -> bytes:  # specs the core does not write
        out = []
        for m in messages:
            fields = {
                "topic": topic,
                "partition": partition,
                "offset": m.offset,
                "next_offset": m.next_offset,
                "kafka_offset": kafka_offset(topic, partition, m) if wants_kafka else 0,
                "timestamp": _Timestamp(m.timestamp),
                "key": null if m.key is None and null is not None else _text(m.key),
                "value": null if m.value is None and null is not None else _text(m.value),
                "headers": _text(core.render([m], [(core.HEADERS, b"")])),
            }
            try:
                out.append(to_bytes(fmt.format_map(fields)))
            except (ValueError, KeyError, IndexError, AttributeError, TypeError) as e:
                raise click.ClickException(f"--format cannot render the message at offset {m.offset}: {e}") from None
        out.append(b"")
        return delim.join(out)

    return render


_CORE_FIELDS = {
    ("offset", ""): core.OFFSET,
    ("next_offset", ""): core.NEXT_OFFSET,
    ("timestamp", ""): core.TIMESTAMP,
    ("timestamp", "iso"): core.TIMESTAMP_ISO,
    ("key", ""): core.KEY,
    ("value", ""): core.VALUE,
    ("headers", ""): core.HEADERS,
}
"""The --format fields the core writes (``core.render``), by name and spec."""


def _core_renderer(parts: Callable[[str, int], list[bytes | int]]) -> Render:
    """A renderer by ``core.render``: ``parts`` gives a batch's texts and fields in order."""
    programs: dict[tuple[str, int], list[bytes | tuple[int, bytes]]] = {}

    def render(topic: str, partition: int, messages: list[kl.Message]) -> bytes:
        program = programs.get((topic, partition))
        if program is None:
            program = programs[topic, partition] = _program(parts(topic, partition))
        return core.render(messages, program)

    return render


def _program(parts: list[bytes | int]) -> list[bytes | tuple[int, bytes]]:
    """``core.render``'s program for texts and fields in order: each field with the text after it."""
    program: list[bytes | tuple[int, bytes]] = []
    for part in parts:
        last = program[-1] if program else None
        if isinstance(part, int):
            program.append((part, b""))
        elif isinstance(last, tuple):
            program[-1] = (last[0], last[1] + part)
        elif isinstance(last, bytes):
            program[-1] = last + part
        elif part:
            program.append(part)
    return program


def _null_renderer(delim: bytes) -> Render:
    """Values, each then ``delim``, a null one written as ``NULL`` (-Z)."""
    null = NULL.encode()

    def render(topic: str, partition: int, messages: list[kl.Message]) -> bytes:
        return b"".join((null if m.value is None else m.value) + delim for m in messages)

    return render


def _keyed_renderer(key_delim: bytes, delim: bytes) -> Render:
    return _core_renderer(lambda topic, partition: [core.KEYED, key_delim, core.VALUE, delim])


_render_json = _core_renderer(
    lambda topic, partition: [
        f'{{"topic": {json.dumps(topic, ensure_ascii=False)}, "partition": {partition}, "offset": '.encode(),
        core.OFFSET,
        b', "next_offset": ',
        core.NEXT_OFFSET,
        b', "timestamp": ',
        core.TIMESTAMP_JSON,
        b", ",
        core.KEY_JSON,
        b", ",
        core.VALUE_JSON,
        core.HEADERS_JSON,
        b"}\n",
    ]
)
"""--json: one object a line, as json.dumps writes it (UTF-8 keys and values as strings,
others as key_b64/value_b64; ``"headers"`` only for a message that has them)."""


def _parse_from_offset(text: str | None) -> tuple[str, int]:
    """("earliest" or "latest", 0), ("offset", N) for a byte offset, ("kafka", N) for a
    Kafka offset, or ("back", N) for -N;
    kcat's "beginning" and "end" are "earliest" and "latest"."""
    if text is None or text in ("earliest", "beginning"):
        return "earliest", 0
    if text in ("latest", "end"):
        return "latest", 0
    if re.fullmatch(r"[0-9]+", text):
        return "offset", int(text)
    if re.fullmatch(r"kafka:[0-9]+", text):
        return "kafka", int(text[6:])
    if re.fullmatch(r"-[0-9]+", text):
        return "back", int(text[1:])
    raise click.BadParameter(f"{text!r} is not N, kafka:N, earliest, latest or -N", param_hint="'-o' / '--from-offset'")
