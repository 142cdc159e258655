"""``kl produce``: records from a file or stdin, appended in big batches.

The default path does no per-record Python work beyond ``bytes.split``: the input is
read in chunks of up to 1 MiB, split at the delimiter (the partial last record is
carried to the next chunk), and each chunk goes to ``Producer.send_batch``, which
appends it in batches of up to ``DEFAULT_BATCH_BYTES``.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import itertools
import json
import signal
from collections.abc import Callable, Iterator
from typing import IO, Any

import click

import kl
from kl.producer import DEFAULT_BATCH_BYTES
from kl_cli.common import (
    delimiter_options,
    exclusive,
    get_root,
    key_delimiter_option,
    note,
    read_chunks,
    resolve_delimiter,
)

JSON_FIELDS = {"topic", "partition", "offset", "next_offset", "timestamp", "key", "key_b64", "value", "value_b64"}
INT64 = range(-(1 << 63), 1 << 63)
Record = tuple[bytes | None, bytes, int | None]
"""key, value, timestamp of a JSON-lines record."""


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
    """Appends batches of records to one topic, counting them."""

    def __init__(
        self, producer: kl.Producer, topic: str, partition: int | None, batch_size: int | None, interrupts: Interrupts
    ):
        self.producer = producer
        self.topic = topic
        self.partition = partition
        self.batch_size = batch_size
        self.interrupts = interrupts
        self.count = 0

    def send(self, values: list[bytes], keys: list[bytes | None] | None = None, timestamp: int | None = None) -> None:
        if not values:
            return
        step = self.batch_size or len(values)
        with self.interrupts.deferred():
            for i in range(0, len(values), step):
                self.producer.send_batch(
                    self.topic,
                    values[i : i + step],
                    None if keys is None else keys[i : i + step],
                    partition=self.partition,
                    timestamp=timestamp,
                )
                self.count += min(step, len(values) - i)


@click.command(short_help="Append records from a file or stdin to a topic.")
@click.argument("topic")
@click.argument("file", type=click.File("rb"), default="-")
@delimiter_options("Read")
@key_delimiter_option(
    "Split each record at the first TEXT into key and value; a record without TEXT has no key (null)."
)
@click.option("-p", "--partition", type=click.IntRange(min=0), metavar="N", help="Append to partition N only.")
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
@click.pass_context
def produce(
    ctx: click.Context,
    topic: str,
    file: IO[bytes],
    delimiter: bytes | None,
    null: bool,
    key_delimiter: bytes | None,
    partition: int | None,
    compression: str,
    batch_size: int | None,
    json_input: bool,
    binary: bool,
    fsync: bool,
) -> None:
    """Append the records of FILE (default: stdin) to TOPIC, one message per line.

    Without --partition the appends go to the partitions in turn, or with
    --key-delimiter each message to the partition of its key.
    """
    exclusive(json=json_input, binary=binary)
    exclusive(json=json_input, delimiter=delimiter, null=null)
    exclusive(json=json_input, binary=binary, key_delimiter=key_delimiter)
    delim = resolve_delimiter(delimiter, null)
    root = get_root(ctx)
    root.log(topic, partition if partition is not None else 0)  # fail before reading input
    producer = kl.Producer(
        root,
        compression=None if compression == "none" else compression,
        fsync=fsync,
        batch_bytes=root.config(topic).segment_bytes if batch_size else DEFAULT_BATCH_BYTES,
    )
    interrupts = Interrupts()
    sender = Sender(producer, topic, partition, batch_size, interrupts)
    with interrupts.installed():
        try:
            if json_input:
                _produce_json(file, sender)
            elif key_delimiter is not None:
                _produce_keyed(file, sender, delim, key_delimiter)
            else:
                _produce_values(file, sender, delim, binary)
        finally:
            with interrupts.deferred():
                producer.close()
    note(f"produced {sender.count} message{'s' if sender.count != 1 else ''} to {topic}")


def _records(file: IO[bytes], delim: bytes) -> Iterator[tuple[list[bytes], bool]]:
    """The records of each chunk, without their delimiters, and whether they had one:
    an unterminated last record comes last, alone, with False."""
    carry = b""
    for chunk in read_chunks(file):
        if len(delim) == 1:  # the carry cannot hold part of a delimiter: no 1 MiB copy
            records = chunk.split(delim)
            records[0] = carry + records[0]
        else:
            records = (carry + chunk).split(delim)
        carry = records.pop()
        yield records, True
    if carry:
        yield [carry], False


def _produce_values(file: IO[bytes], sender: Sender, delim: bytes, binary: bool) -> None:
    for records, terminated in _records(file, delim):
        if binary and terminated:
            records = [record + delim for record in records]
        sender.send(records)


def _produce_keyed(file: IO[bytes], sender: Sender, delim: bytes, key_delim: bytes) -> None:
    for records, _ in _records(file, delim):
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
        sender.send(values, keys)


def _produce_json(file: IO[bytes], sender: Sender) -> None:
    number = 0
    for lines, _ in _records(file, b"\n"):
        batch = []
        for line in lines:
            number += 1
            batch.append(_parse_json(line, number))
        for timestamp, run in itertools.groupby(batch, key=lambda record: record[2]):
            records = list(run)
            keys = [key for key, _, _ in records]
            values = [value for _, value, _ in records]
            sender.send(values, keys if any(key is not None for key in keys) else None, timestamp)


def _parse_json(line: bytes, number: int) -> Record:
    def bad(reason: str) -> click.ClickException:
        return click.ClickException(f"line {number}: {reason}")

    try:
        obj = json.loads(line)
    except ValueError as e:
        raise bad(f"invalid JSON: {e}") from None
    if not isinstance(obj, dict):
        raise bad("expected a JSON object")
    unknown = sorted(set(obj) - JSON_FIELDS)
    if unknown:
        raise bad(f"unknown field {unknown[0]!r}")
    if "value" not in obj and "value_b64" not in obj:
        raise bad("no 'value' or 'value_b64'")
    value = _field(obj, "value", bad)
    if value is None:
        raise bad("'value' must not be null")
    timestamp = obj.get("timestamp")
    if timestamp is not None and (type(timestamp) is not int or timestamp not in INT64):
        raise bad(f"'timestamp' must be milliseconds since the epoch, not {timestamp!r}")
    return _field(obj, "key", bad), value, timestamp


def _field(obj: dict[str, Any], name: str, bad: Callable[[str], click.ClickException]) -> bytes | None:
    """``name`` (text) or ``name_b64`` (base64) as bytes; None when absent or null."""
    b64 = name + "_b64"
    if name in obj and b64 in obj:
        raise bad(f"both {name!r} and {b64!r}")
    if obj.get(name) is not None:
        if not isinstance(obj[name], str):
            raise bad(f"{name!r} must be a string or null")
        try:
            return obj[name].encode("utf-8")
        except UnicodeEncodeError:
            raise bad(f"{name!r} is not valid Unicode (use {b64!r} for bytes)") from None
    if obj.get(b64) is not None:
        if not isinstance(obj[b64], str):
            raise bad(f"{b64!r} must be a base64 string")
        try:
            return base64.b64decode(obj[b64], validate=True)
        except (binascii.Error, ValueError):
            raise bad(f"{b64!r} is not valid base64") from None
    return None
