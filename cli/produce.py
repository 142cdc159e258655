"""``kl produce``: records from a file or stdin, appended in big batches.

The default path does little per-record Python work beyond ``bytes.split`` and a
``len``: the input is read in chunks of up to 1 MiB, split at the delimiter (the
partial last record is carried to the next chunk), and each chunk is cut into pieces
of one append each (up to ``DEFAULT_BATCH_BYTES``) for ``Producer.send_batch``.  An
append is all or nothing, so when one fails every record before it is in the topic
and the error can say so.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import contextlib
import itertools
import json
import operator
import os
import signal
import stat
import sys
from collections.abc import Iterator, Sequence
from typing import IO, Any

import click

import kl
from kl.log.message import HEADER_SIZE, Headers, timestamp_problem
from kl.net.remote import RemoteRoot
from kl.producer import DEFAULT_BATCH_BYTES, atomic_partitions, message_sizes
from kl_cli import complete
from kl_cli.common import (
    Progress,
    connection,
    delimiter_options,
    exclusive,
    get_root,
    key_delimiter_option,
    note,
    read_chunks,
    resolve_delimiter,
    server_option,
    to_bytes,
)

JSON_FIELDS = {"topic", "partition", "offset", "next_offset", "timestamp", "key", "key_b64", "value", "value_b64", "headers"}
HEADER_FIELDS = {"key", "value", "value_b64"}
Record = tuple[bytes | None, bytes | None, int | None, int | None, Headers]
"""key, value, timestamp, partition, headers of a JSON-lines record."""
PROGRESS_MIN_BYTES = 4 << 20
"""A file at least this big gets a progress bar (when stderr is a terminal)."""


class BadRecord(Exception):
    """An input record that cannot be sent (the message says why)."""


class Interrupts:
    """Ctrl-C that never lands inside an append.

    Outside :meth:`deferred` a SIGINT raises ``KeyboardInterrupt`` at once (a blocked
    read of stdin is left); inside, it is noted and raised when the append is done.
    """

    def __init__(self) -> None:
        self.deferring = False
        self.pending = False

    def handle(self, signum: int, frame: Any) -> None:
        if self.deferring:
            self.pending = True
        else:
            raise KeyboardInterrupt

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        previous = signal.signal(signal.SIGINT, self.handle)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        self.deferring = True
        try:
            yield
        finally:
            self.deferring = False
        if self.pending:
            raise KeyboardInterrupt


class Sender:
    """Appends records to one topic, one atomic append at a time, counting the records
    appended: when an append fails, every record before it is in the topic and none
    after it.  With keys on a topic of several partitions, a piece of the input is one
    append per partition, made at once (``Producer.send_batch``): a piece touches at most
    ``atomic_partitions()`` partitions."""

    def __init__(self, producer: kl.Producer, topic: str, partition: int | None, batch_size: int | None, interrupts: Interrupts):
        self.producer = producer
        self.topic = topic
        self.partition = partition
        self.batch_size = batch_size
        self.interrupts = interrupts
        self.count = 0
        config = producer.root.config(topic)
        self.partitions = config.partitions
        self.max_message_bytes = config.max_message_bytes
        self.append_bytes = min(producer.batch_bytes, config.segment_bytes)
        """The producer's largest append: a piece within it is appended at once."""
        if producer.codec:
            self.append_bytes = min(self.append_bytes, config.max_message_bytes - HEADER_SIZE)
        self.at_once = atomic_partitions()
        """The most partitions one keyed piece may touch."""
        self.next_partition: int | None = None
        """Where the next keyless append goes: the partitioner picks the first."""

    def send(
        self,
        values: list[bytes | None],
        keys: list[bytes | None] | None = None,
        timestamp: int | None = None,
        partition: int | None = None,
        headers: list[Headers] | None = None,
    ) -> None:
        """Append ``values`` (to ``partition`` unless the sender has one of its own)."""
        if not values:
            return
        if self.partition is not None:
            partition = self.partition
        with self.interrupts.deferred():
            for start, stop in self._pieces(values, None if partition is not None else keys, headers):
                target = partition if partition is not None or keys is not None else self.next_partition
                appended = self.producer.send_batch(
                    self.topic,
                    values[start:stop],
                    None if keys is None else keys[start:stop],
                    partition=target,
                    timestamp=timestamp,
                    headers=None if headers is None else headers[start:stop],
                )
                if partition is None and keys is None:
                    self.next_partition = (appended[-1].partition + 1) % self.partitions
                self.count += stop - start

    def send_records(self, data: bytes, delim: bytes, keep: bool) -> int:
        """Append the whole records of ``data`` (``Producer.send_records``): how many bytes
        of it were taken.  A record too large for the topic is sent alone, and raises."""
        with self.interrupts.deferred():
            appended, took = self.producer.send_records(
                self.topic,
                data,
                delim,
                keep_delimiter=keep,
                partition=self.partition,
                first=self.next_partition,
                max_records=self.batch_size or 0,
            )
            self.count += sum(a.count for a in appended)
            if appended and self.partition is None:
                self.next_partition = (appended[-1].partition + 1) % self.partitions
        at = data.find(delim, took)
        if at < 0:
            return took
        self.send([data[took : at + len(delim) if keep else at]])
        return at + len(delim)

    def _within_partitions(self, keys: Sequence[bytes | None], start: int, stop: int) -> int:
        """Where the piece from ``start`` must stop (``stop`` at the latest) to touch at
        most ``at_once`` partitions (a message without a key counts as one of its own)."""
        seen: set[int] = set()
        for i in range(start, stop):
            key = keys[i]
            seen.add(-i - 1 if key is None else self.producer.partition_of(self.topic, key))
            if len(seen) > self.at_once:
                return max(i, start + 1)
        return stop

    def _pieces(
        self, values: Sequence[bytes | None], keys: Sequence[bytes | None] | None, headers: Sequence[Headers] | None
    ) -> Iterator[tuple[int, int]]:
        """(start, stop) ranges of up to one append each (per partition, for ``keys``
        that go to partitions of their own); a message too large for the topic comes
        alone, after all before it."""
        sizes = message_sizes(values, keys, headers)
        end = len(values)
        if max(sizes) + HEADER_SIZE > self.max_message_bytes:
            end = next(i for i, size in enumerate(sizes) if size + HEADER_SIZE > self.max_message_bytes)
        ends = list(itertools.accumulate(map(operator.add, sizes[:end], itertools.repeat(HEADER_SIZE))))
        spread = keys is not None and self.producer.root.config(self.topic).partitions > self.at_once  # now: alter may add some
        start, consumed = 0, 0
        while start < end:
            stop = max(bisect.bisect_right(ends, consumed + self.append_bytes, lo=start), start + 1)
            if self.batch_size:
                stop = min(stop, start + self.batch_size)
            if spread:
                assert keys is not None
                stop = self._within_partitions(keys, start, stop)
            yield start, stop
            consumed, start = ends[stop - 1], stop
        if end < len(values):
            yield end, end + 1


class InputFile(click.File):
    """A file to read bytes from, ``-`` being stdin: an error when stdin is closed."""

    def __init__(self) -> None:
        super().__init__("rb")

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value == "-" and sys.stdin is None:
            raise click.ClickException("standard input is closed: give a FILE, or redirect the input")
        return super().convert(value, param, ctx)


@click.command(short_help="Append records from a file or stdin to a topic.")
@click.argument("topic", shell_complete=complete.topics)
@click.argument("file", type=InputFile(), default="-")
@delimiter_options("Read")
@key_delimiter_option("Split each record at the first TEXT into key and value; a record without TEXT has no key (null).")
@click.option("-k", "--key", metavar="KEY", help="Give every message the key KEY (so all go to KEY's partition).")
@click.option(
    "-H",
    "--header",
    "headers",
    multiple=True,
    metavar="NAME=VALUE",
    help="Give every message the header NAME with VALUE (NAME alone: a null value); repeat for more, in order.",
)
@click.option(
    "-p",
    "--partition",
    type=click.IntRange(min=0),
    metavar="N",
    shell_complete=complete.partitions("topic"),
    help="Append to partition N only.",
)
@click.option(
    "-z",
    "--compression",
    type=click.Choice(["none", "zstd", "gzip"]),
    default="none",
    show_default=True,
    help="Compress each batch.",
)
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    metavar="N",
    help=f"At most N messages per append (default: up to {DEFAULT_BATCH_BYTES >> 10} KiB of messages).",
)
@click.option("--json", "json_input", is_flag=True, help="Read JSON lines as 'kl consume --json' prints them.")
@click.option("--binary", is_flag=True, help="Keep each record's delimiter in the message: exact bytes round trip.")
@click.option("--fsync", is_flag=True, help="Exit only once the messages are durable on disk.")
@server_option("Append")
@click.pass_context
def produce(
    ctx: click.Context,
    topic: str,
    file: IO[bytes],
    delimiter: bytes | None,
    null: bool,
    key_delimiter: bytes | None,
    key: str | None,
    headers: tuple[str, ...],
    partition: int | None,
    compression: str,
    batch_size: int | None,
    json_input: bool,
    binary: bool,
    fsync: bool,
    server: str | None,
) -> None:
    """Append the records of FILE (default: stdin) to TOPIC, one message per line.

    Without --partition or a key, each append (up to 256 KiB of messages) goes to the
    next partition, starting from a random one: a small input lands in one partition.
    With --key-delimiter or --key each message goes to the partition of its key.  When an append
    fails, the error names the line it starts at: every line before it is in the topic,
    none from it on.
    """
    exclusive(json=json_input, binary=binary)
    exclusive(json=json_input, delimiter=delimiter, null=null)
    exclusive(json=json_input, binary=binary, key_delimiter=key_delimiter)
    exclusive(json=json_input, key_delimiter=key_delimiter, key=key)
    exclusive(json=json_input, header=bool(headers))
    given = _headers(headers)
    delim = resolve_delimiter(delimiter, null)
    root = RemoteRoot(server, **connection(ctx)) if server is not None else get_root(ctx)
    root.log(topic, partition if partition is not None else 0)  # fail before reading input
    codec = None if compression == "none" else compression
    batch_bytes = root.config(topic).segment_bytes if batch_size else DEFAULT_BATCH_BYTES
    if isinstance(root, RemoteRoot):
        producer: kl.Producer = kl.RemoteProducer(root, compression=codec, fsync=fsync, batch_bytes=batch_bytes)
    else:
        producer = kl.Producer(root, compression=codec, fsync=fsync, batch_bytes=batch_bytes)
    producer.check_format(topic, keyed=key_delimiter is not None or key is not None, headers=bool(given))
    interrupts = Interrupts()
    sender = Sender(producer, topic, partition, batch_size, interrupts)
    record = "line" if json_input or delim == b"\n" else "record"
    if file.isatty():
        how = "one JSON object per line" if json_input else "one per line" if record == "line" else "one per record"
        sys.stderr.write(f"kl produce: reading messages from the terminal, {how}; end with Ctrl-D\n")
        sys.stderr.flush()
    with interrupts.installed(), _input_progress(file) as chunks:
        try:
            if json_input:
                _produce_json(chunks, sender, None if partition is not None else sender.partitions)
            elif key_delimiter is not None:
                _produce_keyed(chunks, sender, delim, key_delimiter, given)
            else:
                _produce_values(chunks, sender, delim, binary, None if key is None else to_bytes(key), given)
        except (kl.KlError, OSError, BadRecord) as e:
            raise click.ClickException(_failure(e, record, sender.count)) from None
        finally:
            with interrupts.deferred():
                producer.close()
    note(f"produced {sender.count} message{'s' if sender.count != 1 else ''} to {topic}")


def _failure(e: Exception, record: str, count: int) -> str:
    """The error at record ``count + 1``, and what was committed before it."""
    reason = f"{e.strerror}: {e.filename}" if isinstance(e, OSError) and e.filename else str(e)
    if isinstance(e, OSError) and not e.filename:
        reason = f"cannot read the input: {e.strerror or e}"
    before = f"{count} {record}s before it were" if count != 1 else f"1 {record} before it was"
    return f"{record} {count + 1}: {reason}; {before} committed"


@contextlib.contextmanager
def _input_progress(file: IO[bytes]) -> Iterator[Iterator[bytes]]:
    """The input's chunks; with a progress bar of bytes read on a terminal, for a big
    regular file."""
    try:
        info = os.fstat(file.fileno())
        size = info.st_size if stat.S_ISREG(info.st_mode) else 0
    except (AttributeError, OSError, ValueError):  # an in-memory stream (tests)
        size = 0
    if size < PROGRESS_MIN_BYTES or not sys.stderr.isatty():
        yield read_chunks(file)
        return
    with Progress(size, "bytes") as progress:

        def counted() -> Iterator[bytes]:
            for chunk in read_chunks(file):
                yield chunk
                progress.advance(len(chunk))

        yield counted()


def _records(chunks: Iterator[bytes], delim: bytes) -> Iterator[tuple[list[bytes], bool]]:
    """The records of each chunk, without their delimiters, and whether they had one:
    an unterminated last record comes last, alone, with False."""
    carry = b""
    for chunk in chunks:
        if len(delim) == 1:  # the carry cannot hold part of a delimiter: no 1 MiB copy
            records = chunk.split(delim)
            records[0] = carry + records[0]
        else:
            records = (carry + chunk).split(delim)
        carry = records.pop()
        yield records, True
    if carry:
        yield [carry], False


def _headers(given: tuple[str, ...]) -> Headers:
    """``-H`` options as headers: NAME=VALUE, or NAME alone for a null value."""
    out = []
    for header in given:
        name, found, value = header.partition("=")
        out.append((name, to_bytes(value) if found else None))
    return tuple(out)


def _produce_values(
    chunks: Iterator[bytes], sender: Sender, delim: bytes, binary: bool, key: bytes | None, headers: Headers
) -> None:
    if key is None and not headers:  # split and framed by the core: no Python object per record
        carry = b""
        for chunk in chunks:
            data = carry + chunk if carry else chunk
            carry = data[sender.send_records(data, delim, binary) :]
        if carry:
            sender.send([carry])
        return
    for records, terminated in _records(chunks, delim):
        if binary and terminated:
            records = [record + delim for record in records]
        sender.send(records, None if key is None else [key] * len(records), headers=[headers] * len(records) if headers else None)


def _produce_keyed(chunks: Iterator[bytes], sender: Sender, delim: bytes, key_delim: bytes, headers: Headers) -> None:
    for records, _ in _records(chunks, delim):
        keys: list[bytes | None] = []
        values = []
        for record in records:
            key, found, value = record.partition(key_delim)
            if found:
                keys.append(key)
                values.append(value)
            else:
                keys.append(None)
                values.append(record)
        sender.send(values, keys, headers=[headers] * len(values) if headers else None)


def _produce_json(chunks: Iterator[bytes], sender: Sender, partitions: int | None) -> None:
    """JSON lines; a record's partition is used when ``partitions`` (its range) is given.
    The lines before a bad one are sent before it is reported."""
    for lines, _ in _records(chunks, b"\n"):
        batch: list[Record] = []
        try:
            for line in lines:
                batch.append(_parse_json(line, sender.topic, partitions))
        except BadRecord:
            _send_json(sender, batch)
            raise
        _send_json(sender, batch)


def _send_json(sender: Sender, batch: list[Record]) -> None:
    for (timestamp, partition), run in itertools.groupby(batch, key=lambda record: (record[2], record[3])):
        records = list(run)
        keys = [record[0] for record in records]
        values = [record[1] for record in records]
        headers = [record[4] for record in records]
        sender.send(
            values,
            keys if any(key is not None for key in keys) else None,
            timestamp,
            partition,
            headers if any(headers) else None,
        )


def _parse_json(line: bytes, topic: str, partitions: int | None) -> Record:
    """One record as ``kl consume --json`` prints it.  ``topic``, ``offset`` and
    ``next_offset`` say where it came from and are checked but not used; ``partition``
    is used when ``partitions`` is given.  Raises ``BadRecord``."""
    try:
        obj = json.loads(line)
    except RecursionError:
        raise BadRecord("invalid JSON: nested too deeply") from None
    except ValueError as e:
        raise BadRecord(f"invalid JSON: {e}") from None
    if not isinstance(obj, dict):
        raise BadRecord("expected a JSON object")
    unknown = sorted(set(obj) - JSON_FIELDS)
    if unknown:
        raise BadRecord(f"unknown field {unknown[0]!r}")
    if "value" not in obj and "value_b64" not in obj:
        raise BadRecord("no 'value' or 'value_b64'")
    value = _field(obj, "value")
    if obj.get("topic") is not None and not isinstance(obj["topic"], str):
        raise BadRecord(f"'topic' must be a string, not {obj['topic']!r}")
    for name in ("offset", "next_offset"):
        if obj.get(name) is not None and (type(obj[name]) is not int or obj[name] < 0):
            raise BadRecord(f"{name!r} must be a byte offset (a whole number >= 0), not {obj[name]!r}")
    timestamp = obj.get("timestamp")
    if timestamp is not None and type(timestamp) is not int:
        raise BadRecord(f"'timestamp' must be milliseconds since the epoch, not {timestamp!r}")
    if timestamp is not None and (problem := timestamp_problem(timestamp)) is not None:
        raise BadRecord(f"'timestamp': {problem}")
    partition = obj.get("partition")
    if partition is not None and (type(partition) is not int or partition < 0):
        raise BadRecord(f"'partition' must be a whole number >= 0, not {partition!r}")
    if partitions is None:
        partition = None
    elif partition is not None and partition >= partitions:
        raise BadRecord(
            f"'partition' {partition} is out of range: topic {topic!r} has partitions 0 to {partitions - 1} "
            "(give -p N to choose one)"
        )
    return _field(obj, "key"), value, timestamp, partition, _json_headers(obj.get("headers"))


def _json_headers(headers: object) -> Headers:
    """``"headers"`` as ``kl consume --json`` writes it: a list of objects, each with a
    ``"key"`` (a string) and a ``"value"`` (a string or null) or ``"value_b64"``."""
    if headers is None:
        return ()
    if not isinstance(headers, list):
        raise BadRecord(f'\'headers\' must be a list of {{"key": ..., "value": ...}} objects, not {headers!r:.60}')
    out = []
    for header in headers:
        if not isinstance(header, dict) or not isinstance(header.get("key"), str) or set(header) - HEADER_FIELDS:
            raise BadRecord(f"a header must be an object with a string 'key' and a 'value' or 'value_b64', not {header!r:.60}")
        if "value" not in header and "value_b64" not in header:
            raise BadRecord(f"header {header['key']!r}: no 'value' or 'value_b64'")
        try:
            header["key"].encode("utf-8")
        except UnicodeEncodeError:
            raise BadRecord(f"header key {header['key']!r:.60} is not valid Unicode") from None
        out.append((header["key"], _field(header, "value")))
    return tuple(out)


def _field(obj: dict[str, Any], name: str) -> bytes | None:
    """``name`` (text) or ``name_b64`` (base64) as bytes; None when absent or null."""
    b64 = name + "_b64"
    if name in obj and b64 in obj:
        raise BadRecord(f"both {name!r} and {b64!r}")
    if obj.get(name) is not None:
        if not isinstance(obj[name], str):
            raise BadRecord(f"{name!r} must be a string or null")
        try:
            return obj[name].encode("utf-8")
        except UnicodeEncodeError:
            raise BadRecord(f"{name!r} is not valid Unicode (use {b64!r} for bytes)") from None
    if obj.get(b64) is not None:
        if not isinstance(obj[b64], str):
            raise BadRecord(f"{b64!r} must be a base64 string")
        try:
            return base64.b64decode(obj[b64], validate=True)
        except (binascii.Error, ValueError):
            raise BadRecord(f"{b64!r} is not valid base64") from None
    return None
