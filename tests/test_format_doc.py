"""man/kl-format.5 states the numbers kl/log/message.py, kl/log/state.py and kl/log/config.py use.

The page is the spec and the code is the truth; these tests read the numbers, tables
and worked examples out of the roff source and hold them against the library, so the
two cannot drift apart.
"""

from __future__ import annotations

import ast
import dataclasses
import itertools
import json
import os
import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from kl.log import config, producers, segment, state, timeindex
from kl.log import message as m

PAGE = Path(__file__).resolve().parents[1] / "man" / "kl-format.5"

MESSAGE_CONSTANTS = [
    "LENGTH_SIZE", "MAGIC_OFFSET", "ATTRIBUTES_OFFSET", "CRC_OFFSET_V0", "PAYLOAD_OFFSET_V0", "CRC_OFFSET",
    "PAYLOAD_OFFSET_V1", "TIMESTAMP_OFFSET", "KEY_LENGTH_OFFSET", "KEY_OFFSET", "HEADER_SIZE", "MIN_LENGTH",
    "HEADERS_MAGIC", "HEADERS_HEADER_SIZE", "HEADER_FIELD_SIZE",
]
HEADERS_CALL = 'headers=[("trace", b"42"), ("gone", None)]))'
HEADERS_EXAMPLE = m.encode(b"hello", b"k", 1700000000000, headers=[("trace", b"42"), ("gone", None)])
EXAMPLE_CALL = 'm.encode(b"hello", b"k", 1700000000000)'
STATE_CALL = "s.PartitionState(0, 0, 28, 0, 0, 1,"
STATE_EXAMPLE = state.PartitionState(0, 0, 28, 0, 0, 1, 1700000000000, bytes(16), bytes(16), 0, 1)

_ESCAPES = [
    ("\\-", "-"), ("\\(aq", "'"), ("\\(lq", '"'), ("\\(rq", '"'), ("\\(<=", "<="), ("\\(>=", ">="),
    ("\\(bu", "*"), ("\\&", ""), ("\\e", "\\"),
]


# ----------------------------------------------------------------- reading the page


def unescape(line: str) -> str:
    for escape, plain in _ESCAPES:
        line = line.replace(escape, plain)
    return line


def page_lines() -> list[str]:
    return [unescape(line) for line in PAGE.read_text(encoding="utf-8").splitlines()]


def section(title: str) -> list[str]:
    """The lines of the .SH or .SS section called ``title``, up to the next heading."""
    out: list[str] | None = None
    for line in page_lines():
        if line.startswith((".SH", ".SS")):
            if out is not None:
                return out
            if line.split(None, 1)[1].strip('"') == title:
                out = []
        elif out is not None:
            out.append(line)
    assert out is not None, f"kl-format(5) has no section {title!r}"
    return out


def blocks(lines: list[str]) -> list[list[str]]:
    """The preformatted (.EX ... .EE) blocks among ``lines``."""
    found, current = [], None
    for line in lines:
        if line == ".EX":
            current = []
        elif line == ".EE":
            found.append(current)
            current = None
        elif current is not None:
            current.append(line)
    return found


def table(title: str) -> list[list[str]]:
    """The rows (split on runs of spaces) of the first block of a section, header dropped."""
    rows = blocks(section(title))[0][1:]
    return [row.split() for row in rows if row.strip()]


def stated_constants() -> dict[str, object]:
    """Every ``NAME = value`` the page states (value a number or a tuple of numbers)."""
    found: dict[str, object] = {}
    for line in page_lines():
        for name, value in re.findall(r"\b([A-Z][A-Z0-9_]*[A-Z0-9]) = (\([0-9, ]+\)|[0-9]+)", line):
            parsed = ast.literal_eval(value)
            assert found.setdefault(name, parsed) == parsed, f"the page gives {name} two values"
            found[name] = parsed
    return found


def xxd_after(marker: str) -> bytes:
    """The bytes of the xxd dump that follows the line containing ``marker``."""
    lines = page_lines()
    start = next(i for i, line in enumerate(lines) if marker in line)
    data = b""
    for line in lines[start + 1 :]:
        if re.match(r"[0-9a-f]{8}: ", line):
            data += bytes.fromhex(line[10:50].replace(" ", ""))
        elif data:
            break
    assert data, f"no xxd dump after {marker!r}"
    return data


# ----------------------------------------------------------------- message constants


def test_page_states_every_message_constant():
    assert sorted(set(MESSAGE_CONSTANTS) - set(stated_constants())) == []


@pytest.mark.parametrize("name", MESSAGE_CONSTANTS)
def test_stated_constant_matches_code(name):
    assert stated_constants()[name] == getattr(m, name)


def test_every_constant_named_on_the_page_exists_in_the_code():
    unknown = [name for name in stated_constants() if not hasattr(m, name)]
    assert unknown == []


@pytest.mark.parametrize("title, magic", [("Magic 0 (Kafka 0.7)", 0), ("Magic 1 (Kafka 0.7)", 1), ("Magic 2 (kl)", 2)])
def test_field_table_is_contiguous(title, magic):
    rows = table(title)
    assert rows[0][2] == "length" and rows[1][2] == "magic"
    fixed = [(int(r[0]), int(r[1])) for r in rows if r[1].isdigit()]
    for (position, size), (next_position, _) in itertools.pairwise(fixed):
        assert position + size == next_position
    header_end = fixed[-1][0] + fixed[-1][1]
    payload_position = int(rows[len(fixed)][0]) if magic < 2 else header_end
    assert header_end - m.LENGTH_SIZE == m.MIN_LENGTH[magic]
    assert payload_position == (m.PAYLOAD_OFFSET_V0, m.PAYLOAD_OFFSET_V1, m.HEADER_SIZE)[magic]


def test_magic_2_table_matches_the_header_struct():
    rows = table("Magic 2 (kl)")
    sizes = [int(r[1]) for r in rows if r[1].isdigit()]
    assert sum(sizes) == m.HEADER.size == m.HEADER_SIZE
    assert [r[2] for r in rows] == ["length", "magic", "attrs", "crc", "timestamp", "key_length", "key", "value"]


def test_magic_3_table_is_magic_2s_then_the_value_length_count_and_headers():
    rows = table("Magic 3 (kl, headers and null values)")
    assert [r[2] for r in rows[:10]] == [
        "length", "magic", "attrs", "crc", "timestamp", "key_length", "key", "value_length", "value", "header_count",
    ]
    assert [r[:2] for r in rows[:6]] == [r[:2] for r in table("Magic 2 (kl)")[:6]]
    assert [r[:2] for r in rows[6:10]] == [["22", "k"], ["22+k", "4"], ["26+k", "n"], ["26+k+n", "4"]]
    assert m.HEADERS_HEADER_SIZE == m.HEADER_SIZE + 4 + 4 == m.MIN_LENGTH[3] + m.LENGTH_SIZE


def test_codec_table_matches_code():
    lines = section("Attributes and codecs")
    assert f"(mask 0x{m.CODEC_MASK:02x})" in " ".join(lines)
    rows = [r for r in table("Attributes and codecs") if r[0].isdigit()]
    assert {int(r[0]): r[1] for r in rows} == m.CODEC_NAMES
    writable = {r[1] for r in rows if "writes" in r}
    assert writable == set(m.CODECS)


# ----------------------------------------------------------------- worked examples


def test_worked_example_is_what_encode_writes():
    assert xxd_after(EXAMPLE_CALL) == m.encode(b"hello", b"k", 1700000000000)


def test_field_by_field_breakdown_adds_up_to_the_example():
    breakdown = blocks(section("EXAMPLES"))[1]
    data = b"".join(bytes.fromhex(line[:25]) for line in breakdown)
    assert data == m.encode(b"hello", b"k", 1700000000000)
    assert [line[25:].split()[0] for line in breakdown] == [
        "length", "magic", "attrs", "crc", "timestamp", "key_length", "key", "value",
    ]


def test_magic_3_example_is_what_encode_writes_field_by_field():
    assert xxd_after(HEADERS_CALL) == HEADERS_EXAMPLE
    breakdown = blocks(section("EXAMPLES"))[3]
    assert b"".join(bytes.fromhex(line[:25]) for line in breakdown) == HEADERS_EXAMPLE
    covered = HEADERS_EXAMPLE[m.MAGIC_OFFSET : m.CRC_OFFSET] + HEADERS_EXAMPLE[m.TIMESTAMP_OFFSET :]
    assert struct.unpack_from(">I", HEADERS_EXAMPLE, m.CRC_OFFSET)[0] == zlib.crc32(covered)
    assert len(m.encode(None, b"k", 1700000000000)) == 31


def test_example_crc_covers_magic_attrs_and_everything_after_the_crc():
    data = m.encode(b"hello", b"k", 1700000000000)
    covered = data[m.MAGIC_OFFSET : m.CRC_OFFSET] + data[m.TIMESTAMP_OFFSET :]
    assert struct.unpack_from(">I", data, m.CRC_OFFSET)[0] == zlib.crc32(covered)


def test_worked_state_record_is_what_the_code_writes():
    assert xxd_after(STATE_CALL) == STATE_EXAMPLE.encode()


# ----------------------------------------------------------------- partition state


def _struct_layout(fmt: str) -> list[tuple[int, int]]:
    """(position, size) of each field of a big-endian struct format."""
    out, position = [], 0
    for count, code in re.findall(r"(\d*)([a-zA-Z])", fmt.lstrip(">")):
        size = struct.calcsize(f">{count}{code}")
        if code == "s":
            out.append((position, size))
            position += size
        else:
            for _ in range(int(count or 1)):
                out.append((position, struct.calcsize(">" + code)))
                position += struct.calcsize(">" + code)
    return out


def test_state_table_matches_record_struct():
    rows = table("PARTITION STATE")
    layout = _struct_layout(state.RECORD.format) + [(state.RECORD.size, state.CRC.size)]
    assert [(int(r[0]), int(r[1])) for r in rows] == layout
    assert [r[2] for r in rows] == ["tag", "version", *state.PartitionState._fields, "crc32"]
    assert rows[0][3] == f'"{state.TAG.decode()}"'
    assert rows[1][4] == str(state.VERSION)


def test_producer_journal_table_matches_record_struct():
    rows = table("PRODUCER JOURNAL")
    layout = _struct_layout(producers.RECORD.format) + [(producers.RECORD.size, producers.CRC.size)]
    assert [(int(r[0]), int(r[1])) for r in rows] == layout
    assert [r[2] for r in rows] == ["tag", *producers.Entry._fields, "crc32"]
    assert rows[0][3] == f'"{producers.TAG.decode()}"'
    text = " ".join(section("PRODUCER JOURNAL"))
    assert f"{producers.SIZE}-byte record" in text and f"{producers.COMPACT_RECORDS} records" in text


def test_state_record_size_is_stated():
    text = " ".join(section("PARTITION STATE"))
    assert f"{state.SIZE}-byte record" in text
    assert f"read {state.SIZE} bytes" in text


# ----------------------------------------------------------------- topic config and segments


def test_topic_config_defaults_match_code():
    rows = table("TOPIC CONFIGURATION")
    settings = [r for r in rows if len(r) > 1 and (r[1].isdigit() or r[1] in config.FORMATS or r[1] in config.PARTITIONERS)]
    stated = {r[0]: int(r[1]) if r[1].isdigit() else r[1] for r in settings}
    defaults = {f.name: f.default for f in dataclasses.fields(config.TopicConfig)}
    assert ["topic_id", "(new)"] in [r[:2] for r in rows] and ["headers", "(new)"] in [r[:2] for r in rows]
    assert stated == {name: value for name, value in defaults.items() if name not in ("topic_id", "headers")}


def test_topic_json_example_is_what_the_code_writes():
    example = next(b for b in blocks(section("EXAMPLES")) if b[0].startswith("$ cat "))
    shown = config.TopicConfig.from_json("\n".join(example[1:]).encode(), "the page")
    written = config.TopicConfig(partitions=2, headers=True, topic_id=shown.topic_id).to_json()  # as create_topic makes it
    assert json.loads("\n".join(example[1:])) == json.loads(written)


def test_segment_names_on_the_page_parse():
    text = " ".join(section("SEGMENT FILES"))
    assert f"{segment.NAME_DIGITS} decimal digits" in text
    assert segment.SUFFIX in text and segment.LEGACY_SUFFIX in text
    names = [line.strip() for line in blocks(section("SEGMENT FILES"))[0]]
    assert [segment.parse_name(n) for n in names] == [int(n.split(".")[0]) for n in names]
    assert names[0] == segment.segment_name(0)


def test_man_page_lints_clean():
    if shutil.which("man") is None:
        pytest.skip("man is not installed")
    result = subprocess.run(
        ["man", "--warnings", "-E", "UTF-8", "-l", "-Tutf8", "-Z", str(PAGE)],
        env={**os.environ, "LC_ALL": "C.UTF-8", "MANROFFSEQ": "", "MANWIDTH": "80"},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0
    assert result.stderr == ""


# ----------------------------------------------------------------- time summaries and the timestamp range

SUMMARY_CALL = "t.TimeSummary(0, 1024, 1700000000123456789,"


def test_time_summary_table_matches_record_struct():
    rows = table("TIME SUMMARIES")
    layout = _struct_layout(timeindex.RECORD.format) + [(timeindex.RECORD.size, timeindex.CRC.size)]
    assert [(int(r[0]), int(r[1])) for r in rows] == layout
    assert [r[2] for r in rows] == ["tag", "version", *timeindex.TimeSummary._fields, "crc32"]
    assert rows[0][3] == f'"{timeindex.TAG.decode()}"'
    assert rows[1][4] == str(timeindex.VERSION)
    text = " ".join(section("TIME SUMMARIES"))
    assert f"{timeindex.SIZE}-byte record" in text and f"exactly {timeindex.SIZE} bytes" in text
    assert f"with {timeindex.SUFFIX} added" in text.replace(".B ", "")
    assert f"{timeindex.NO_TIMESTAMP} (-2^63)" in text


def test_worked_time_summary_is_what_the_code_writes():
    assert xxd_after(SUMMARY_CALL) == timeindex.TimeSummary(0, 1024, 1700000000123456789, 1700000000000, 0).encode()


def test_timestamp_range_is_stated():
    text = " ".join(section("Magic 2 (kl)"))
    assert f"MIN_TIMESTAMP = {m.MIN_TIMESTAMP}" in text
    assert f"MAX_TIMESTAMP = {m.MAX_TIMESTAMP}" in text
