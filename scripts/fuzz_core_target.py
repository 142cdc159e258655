"""The fuzz target of scripts/fuzz-core: one input drives one call of a core function on
both cores (kl.log._core and kl.log.pycore), which must answer alike.  Run by atheris
(libFuzzer): ``python scripts/fuzz_core_target.py CORPUS -runs=N``; ``--replay CORPUS``
runs the inputs kept there once each, without atheris (under the sanitizers)."""

from __future__ import annotations

import struct
import sys
from pathlib import Path

REPLAY = sys.argv[1:2] == ["--replay"]
if REPLAY:
    from kl.log import pycore
else:
    import atheris

    with atheris.instrument_imports():
        from kl.log import pycore

from kl.log import _core  # noqa: E402 - after the instrumented import of its twin
from kl.log.message import Message  # noqa: E402

LIMITS = (1 << 20, 4096, 64, 27, 22, 5, 0, -7)
"""max_message_bytes: the usual size, ones that cut messages short, none that fits."""


def answer(function, *args):
    try:
        return "ok", function(*args)
    except Exception as e:  # noqa: BLE001 - the kind of failure is what is compared
        return "raised", type(e).__name__


def one(data: bytes) -> None:
    if len(data) < 4:
        return
    which, limit, where, rest = data[0] % 15, LIMITS[data[1] % len(LIMITS)], data[2] | data[3] << 8, data[4:]
    if which == 14:  # kafka_records: a record count and timestamps from the first bytes, base timestamps near the int64 ends
        stamps = (-1, 0, 1_700_000_000_000, (1 << 63) - 1 - where, -(1 << 63) + where, 253402300799999)
        args = (rest, data[2] % 9 - 1, stamps[data[3] % len(stamps)], (-1, 5)[data[3] >> 7], 42, limit)
        name = "kafka_records"
    elif which == 13:  # kafka_batch: offsets near the top of the int64 range too
        args = (rest, where % (len(rest) + 1), (0, where, (1 << 62) + where)[data[1] % 3], limit)
        name = "kafka_batch"
    elif which == 12:  # render: messages of the pieces between 0xff bytes (0xfe: no key), a program of the first byte's fields
        pieces = rest.split(b"\xff")
        stamps = (None, -1, (1 << 63) - 1, -(1 << 63), 253402300799999, -62135596800000, where * 1_000_003)
        messages = [
            Message(i, -i, stamps[(where + i) % len(stamps)], None if piece[:1] == b"\xfe" else piece[:3], piece)
            for i, piece in enumerate(pieces)
        ]
        name, args = "render", (messages, [(field, bytes([field])) for field in range(data[2] % 11)] + [b"\n"])
    elif which == 11:  # read_varint at a position maybe outside; varint of the signed 64 bits of the first 8 bytes
        compare("varint", struct.unpack(">q", rest[:8].ljust(8, b"\0"))[0])
        name, args = "read_varint", (rest, data[2] - 2)
    elif which == 10:  # frame_values: values split at 0xff, those starting 0xfe not bytes, a position maybe outside
        values: list = [bytearray(v) if v[:1] == b"\xfe" else v for v in rest.split(b"\xff")]
        args = (values, data[2] % (len(values) + 2) - 1, -data[3], limit, data[3] * 4 - 9)
        name = "frame_values"
    elif which == 9:  # dump_lines: bases near the top of the int64 range too; a template of the first bytes
        pos, template = where % (len(rest) + 1), tuple(rest[i : i + data[1] % 7] for i in range(5))
        args = (rest, pos, len(rest), (1 << 63) - 1 - len(rest) - data[1] % 3, where, limit, template)
        name = "dump_lines"
    elif which == 8:  # crc32c, continuing from a crc made of the second to fourth bytes
        args = (rest, data[1] << 24 | where)
        name = "crc32c"
    elif which == 7:
        args = (rest, where % (len(rest) + 1), limit)
        name = "plain_columns"
    elif which == 6:  # recent: how many to keep from the third byte (0 and negative refused alike)
        pos = where % (len(rest) + 1)
        args = (rest, pos, len(rest), limit, data[2] % 9 - 1)
        name = "recent"
    elif which == 5:  # frame_records: the delimiter, keep and limits from the first bytes
        delimiter = rest[:1 + data[2] % 2] or b"\n"
        args = (rest, where % (len(rest) + 1), delimiter, bool(data[3] & 1), 7, limit, data[3] * 4, data[2] % 4)
        name = "frame_records"
    elif which == 4:  # frame: values split at 0xff, a timestamp from the first 8 bytes
        ts = struct.unpack(">q", rest[:8].ljust(8, b"\0"))[0]
        args: tuple = (rest[8:].split(b"\xff"), ts)
        name = "frame"
    else:
        pos = where % (len(rest) + 1)
        name = ("check", "walk", "plain_values", "plain_messages")[which]
        args = (rest, pos, len(rest), limit) if which < 2 else (rest, pos, limit) if which == 2 else (rest, pos, where, limit)
    compare(name, *args)


def compare(name: str, *args) -> None:
    compiled, pure = answer(getattr(_core, name), *args), answer(getattr(pycore, name), *args)
    if compiled != pure:
        raise AssertionError(f"{name}{args!r}: compiled {compiled!r}, pure {pure!r}")


def main() -> None:
    if REPLAY:
        inputs = sorted(Path(sys.argv[2]).iterdir())
        for path in inputs:
            one(path.read_bytes())
        print(f"fuzz-core: replayed {len(inputs)} inputs, no crash, no difference", file=sys.stderr)
        return
    atheris.Setup(sys.argv, one)
    atheris.Fuzz()  # libFuzzer ends the process; its last line says how many inputs ran ("Done N runs")


if __name__ == "__main__":
    main()
