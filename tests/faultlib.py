"""Fault-injection helpers shared by kl's crash-safety tests and ``scripts/soak``.

Damage (leveldb style, one line each)::

    flip_bit(path, bit)          # invert one bit, counting from the first byte's MSB
    shrink_to(path, size)        # cut a file (a torn tail)
    append_bytes(path, data)     # bytes past the end (what a crashed writer leaves)
    snapshot(directory)          # {name: bytes} of a directory, for byte-for-byte checks
    failing_writes(monkeypatch, directory)  # its segment writes fail as on a full disk

Checkable payloads: ``payload(ident, count, size)`` builds a value carrying its id
(trial, producer, batch, index), its batch's size and a CRC32 of itself;
``parse_payload(value)`` returns ``(ident, count)`` or raises ``ValueError``.

The kill -9 harness: ``run_kill_trials(workdir, trials)`` forks producer processes
that append in a loop and report each acknowledged batch through a pipe only after
``send``/``send_batch`` returned, kills them with SIGKILL at random moments, and keeps a
reader process tailing the partition with ``Consumer.stream`` that checks every message.
It returns a ``KillReport``; ``report.problems`` is empty when every rule held.
This module imports nothing from pytest so scripts can use it (``sys.path`` the tests dir).
"""

from __future__ import annotations

import contextlib
import hashlib
import multiprocessing
import os
import random
import select
import signal
import struct
import time
import traceback
import zlib
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import kl
from kl.log.recovery import recover
from kl.log.segment import Segment, list_segments, segment_name
from kl.log.state import SIZE as STATE_SIZE
from kl.log.state import STATE_FILE, read_state

# ----------------------------------------------------------------- damaging files


def flip_bit(path: Path | str, bit: int) -> None:
    """Invert one bit of a file, counting from its first byte's most significant bit."""
    with open(path, "r+b") as f:
        f.seek(bit // 8)
        byte = f.read(1)[0]
        f.seek(bit // 8)
        f.write(bytes([byte ^ (0x80 >> (bit % 8))]))


def shrink_to(path: Path | str, size: int) -> None:
    """Cut a file to ``size`` bytes."""
    os.truncate(path, size)


def append_bytes(path: Path | str, data: bytes) -> None:
    """Append raw bytes past a file's end."""
    with open(path, "ab") as f:
        f.write(data)


def write_at(path: Path | str, position: int, data: bytes) -> None:
    """Overwrite bytes of a file in place."""
    with open(path, "r+b") as f:
        f.seek(position)
        f.write(data)


def failing_writes(monkeypatch: object, directory: str) -> None:
    """With pytest's ``monkeypatch``: segment writes under ``directory`` fail as on a full disk
    (a ``StorageError``), all others go through."""
    real = Segment.append

    def append(segment: Segment, data: bytes, position: int) -> None:
        if segment.path.startswith(directory):
            raise kl.StorageError(f"cannot append {len(data)} bytes to {segment.path}: no space left on device")
        real(segment, data, position)

    monkeypatch.setattr(Segment, "append", append)  # type: ignore[attr-defined]


def wait_flushed(log: kl.Log, seconds: float = 20.0) -> bool:
    """Wait until the background flush has fsynced all the partition publishes (True),
    or ``seconds`` went by (False)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        state = log.state()
        if state.flushed_offset == state.log_end_offset:
            return True
        time.sleep(0.01)
    return False


def as_if_rebooted(log: kl.Log) -> None:
    """Rewrite the partition's state as if written before a reboot: data not yet fsynced
    then is what a crash may have torn (the stable offset becomes the flushed offset)."""
    state = log.state()._replace(boot_id=b"\x01" * 16)
    with open(log.state_path, "r+b") as f:
        f.write(state.encode())


def snapshot(directory: Path | str) -> dict[str, bytes]:
    """Every regular file of a directory (not recursive), name -> bytes; of a state file
    its record (past it lie the writers' marks, which a failed roll leaves up)."""
    out = {}
    for entry in sorted(os.scandir(directory), key=lambda e: e.name):
        if entry.is_file(follow_symlinks=False):
            with open(entry.path, "rb") as f:
                out[entry.name] = f.read(STATE_SIZE) if entry.name == STATE_FILE else f.read()
    return out


def fresh_log(log: kl.Log) -> kl.Log:
    """A new handle on the same partition (no cached writer state)."""
    return kl.Log(log.directory, log.lock_path, log.config, lock_timeout=log.lock_timeout)


def read_log(log: kl.Log, offset: int | None = None, max_bytes: int = 1 << 16) -> list[kl.Message]:
    """Every message from ``offset`` (the log start) to the published end, through ``Log.read``."""
    state = log.state()
    offset = state.log_start_offset if offset is None else offset
    out: list[kl.Message] = []
    while offset < state.log_end_offset:
        messages = log.read(offset, max_bytes)
        got = list(messages)
        out.extend(got)
        nxt = max(messages.next_offset, got[-1].next_offset if got else offset)
        if nxt == offset:  # stopped at a torn tail: the data ends here
            break
        offset = nxt
    return out


# ----------------------------------------------------------------- checkable payloads

PAYLOAD_TAG = b"KLF1"
_HEAD = struct.Struct(">4sIBIHH")
"""tag, trial, producer, batch, index, count."""
_CRC = struct.Struct(">I")
MARKER_TRIAL = 0xFFFFFFFF
"""The trial number of the final batch the harness writes after all trials."""


def payload(ident: tuple[int, int, int, int], count: int, size: int = 0) -> bytes:
    """A value carrying its id, its batch's size, ``size`` filler bytes and a CRC32."""
    trial, producer, batch, index = ident
    head = _HEAD.pack(PAYLOAD_TAG, trial, producer, batch, index, count)
    body = head + bytes([(trial * 7 + batch * 13 + index) & 0xFF]) * size
    return body + _CRC.pack(zlib.crc32(body))


def parse_payload(value: bytes) -> tuple[tuple[int, int, int, int], int]:
    """``((trial, producer, batch, index), count)``; ``ValueError`` for anything malformed."""
    if len(value) < _HEAD.size + _CRC.size:
        raise ValueError(f"payload of {len(value)} bytes is too short")
    body, (crc,) = value[: -_CRC.size], _CRC.unpack(value[-_CRC.size :])
    if zlib.crc32(body) != crc:
        raise ValueError("payload fails its checksum")
    tag, trial, producer, batch, index, count = _HEAD.unpack_from(body)
    if tag != PAYLOAD_TAG:
        raise ValueError(f"payload has tag {tag!r}")
    if not 0 <= index < count:
        raise ValueError(f"payload index {index} outside its batch of {count}")
    return (trial, producer, batch, index), count


class OrderChecker:
    """Checks a stream of consumed messages: payloads valid, offsets strictly increasing
    (inner messages of one compressed batch share their wrapper's offset and must come
    in order), no id twice.  ``problems`` collects what went wrong."""

    def __init__(self, limit: int = 20):
        self.problems: list[str] = []
        self.count = 0
        self.resets = 0
        self.digest = hashlib.sha256()
        self._limit = limit
        self._last: tuple[int, tuple[int, int, int, int]] | None = None
        self._seen: set[int] = set()

    def problem(self, text: str) -> None:
        if len(self.problems) < self._limit:
            self.problems.append(text)

    def check(self, msg: kl.Message) -> tuple[tuple[int, int, int, int], int] | None:
        try:
            ident, count = parse_payload(msg.value)
        except ValueError as e:
            self.problem(f"invalid message at offset {msg.offset}: {e}")
            return None
        if self._last is not None:
            last_offset, last_ident = self._last
            if msg.offset == last_offset:
                if ident[:3] != last_ident[:3] or ident[3] != last_ident[3] + 1:
                    self.problem(f"offset {msg.offset} repeated by {ident} after {last_ident}")
            elif msg.offset < last_offset:
                self.problem(f"offset went back from {last_offset} to {msg.offset}")
        packed = ident[0] << 72 | ident[1] << 64 | ident[2] << 16 | ident[3]  # small, for million-message soaks
        if packed in self._seen:
            self.problem(f"id {ident} seen twice (offset {msg.offset})")
        self._seen.add(packed)
        self._last = (msg.offset, ident)
        self.count += 1
        self.digest.update(_HEAD.pack(PAYLOAD_TAG, *ident, count))
        return ident, count


# ----------------------------------------------------------------- the kill -9 harness

TOPIC = "crash"
HARNESS_CONFIG = kl.TopicConfig(
    segment_bytes=128 << 10, max_message_bytes=64 << 10, flush_messages=500, flush_ms=20, retention_ms=0
)
"""Segments of 128 KiB against batches of up to ~50 KiB, so that kills land mid-roll (an
unpublished segment left behind) in about one trial in ten; a flush policy so the stable
offset lags the log end by varying amounts."""
_ACK = struct.Struct(">IH")
"""batch number, message count: written to the pipe after send returned."""


@dataclass
class KillReport:
    trials: int = 0
    producers: int = 0
    killed: int = 0
    acked_batches: int = 0
    acked_messages: int = 0
    kills_with_torn_tail: int = 0
    """Trials after which the active segment held bytes past the published end."""
    orphan_segments: int = 0
    """Trials after which an unpublished segment (a killed roll) was on disk."""
    final_messages: int = 0
    final_batches: int = 0
    unacked_batches_present: int = 0
    reader_messages: int = 0
    reader_resets: int = 0
    segments: int = 0
    recover_findings: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0
    seed: int = 0
    fsync: str = "off"

    def summary(self) -> str:
        lines = [
            f"kill -9 trials: {self.trials} (seed {self.seed}, fsync {self.fsync}) in {self.seconds:.1f}s",
            f"  producers started {self.producers}, killed by SIGKILL {self.killed}",
            f"  acknowledged: {self.acked_batches} batches, {self.acked_messages} messages",
            f"  torn tails left by a kill: {self.kills_with_torn_tail}; "
            f"unpublished segments left by a killed roll: {self.orphan_segments}",
            f"  final log: {self.final_messages} messages in {self.final_batches} batches over {self.segments} segments "
            f"({self.unacked_batches_present} complete batches were published but never acknowledged)",
            f"  reader: {self.reader_messages} messages checked while tailing",
            f"  recover afterwards: {'; '.join(self.recover_findings) or 'nothing to do'}",
            f"  result: {'OK' if not self.problems else 'FAILED'}",
        ]
        lines += [f"  PROBLEM: {p}" for p in self.problems]
        return "\n".join(lines)


def _producer_main(root_path: str, trial: int, producer_no: int, seed: int, fsync: bool, compression: str | None,
                   ack_fd: int, error_path: str) -> None:
    try:
        rng = random.Random(seed)
        producer = kl.Producer(kl.Root(root_path, lock_timeout=60), fsync=fsync, compression=compression)
        batch = 0
        while True:
            # At most 50 x ~1 KiB: a batch is one append (one chunk, one zstd wrapper).
            count = 1 if rng.random() < 0.3 else rng.randint(2, 50)
            size = rng.choice((0, 20, 100, 400, 1000))
            values = [payload((trial, producer_no, batch, i), count, rng.randint(0, size)) for i in range(count)]
            if count == 1 and rng.random() < 0.7:
                producer.send(TOPIC, values[0], partition=0)
            else:
                producer.send_batch(TOPIC, values, partition=0)
            os.write(ack_fd, _ACK.pack(batch, count))  # acknowledged: send returned
            batch += 1
    except BaseException:  # anything but SIGKILL is a failure the parent must see
        with open(error_path, "w") as f:
            f.write(traceback.format_exc())
        os._exit(3)


def _reader_main(root_path: str, conn, stop_event) -> None:
    checker = OrderChecker()
    try:
        consumer = kl.Consumer(kl.Root(root_path))
        offset = 0
        done = False
        while not done:
            for msg in consumer.stream(TOPIC, 0, offset, idle_timeout=0.5, poll_interval=0.002):
                checked = checker.check(msg)
                offset = msg.next_offset
                if checked and checked[0][0] == MARKER_TRIAL and checked[0][3] == checked[1] - 1:
                    done = True
                    break
            if stop_event.is_set() and not done:
                checker.problem("reader stopped before it saw the final marker batch")
                break
    except BaseException:
        checker.problem(f"reader raised: {traceback.format_exc()}")
    conn.send((checker.count, checker.resets, checker.digest.hexdigest(), checker.problems))
    conn.close()


def _read_first_ack(fd: int, timeout: float) -> bytes:
    """The first acknowledgement's bytes from ``fd`` (fewer if the writer ends or ``timeout`` passes)."""
    data = b""
    deadline = time.monotonic() + timeout
    poller = select.poll()  # not select(): a long test session's descriptors pass 1024
    poller.register(fd, select.POLLIN)
    while len(data) < _ACK.size and poller.poll(max(0, round((deadline - time.monotonic()) * 1000))):
        chunk = os.read(fd, _ACK.size - len(data))
        if not chunk:
            break
        data += chunk
    return data


def _read_to_eof(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    return b"".join(chunks)


def tail_facts(directory: str) -> tuple[int, int]:
    """(bytes past the published end in the active segment, unpublished segments)."""
    state = read_state(os.path.join(directory, STATE_FILE))
    torn = os.path.getsize(os.path.join(directory, segment_name(state.active_base_offset))) - (
        state.log_end_offset - state.active_base_offset
    )
    orphans = sum(1 for base, _ in list_segments(directory) if base > state.active_base_offset)
    return torn, orphans


def run_kill_trials(
    workdir: Path | str,
    trials: int,
    *,
    seed: int | None = None,
    fsync: str = "off",
    max_delay: float = 0.03,
    log=print,
    progress_every: int = 0,
) -> KillReport:
    """``trials`` rounds of: start 1-2 producer processes, SIGKILL each at a random moment
    (counted from its start, or from its first acknowledgement).

    ``fsync`` is "off", "on" (``Producer(fsync=True)``) or "mixed" (chosen per producer).
    Afterwards one clean producer appends a marker batch (repairing the tail), the reader
    must have seen every message up to it, recover must find nothing to report, and the
    log must hold every acknowledged message exactly once, every batch whole or not at all.
    """
    seed = random.randrange(1 << 32) if seed is None else seed
    rng = random.Random(seed)
    report = KillReport(seed=seed, fsync=fsync)
    started = time.monotonic()
    workdir = Path(workdir)
    root_path = str(workdir / "root")
    root = kl.Root(root_path, lock_timeout=60)
    root.create_topic(TOPIC, HARNESS_CONFIG)
    directory = root.log(TOPIC, 0).directory
    ctx = multiprocessing.get_context("fork")
    acked: dict[tuple[int, int, int], int] = {}

    parent_conn, child_conn = ctx.Pipe(duplex=False)
    stop_event = ctx.Event()
    reader = ctx.Process(target=_reader_main, args=(root_path, child_conn, stop_event), daemon=True)
    reader.start()
    child_conn.close()
    try:
        for trial in range(trials):
            report.trials += 1
            procs = []
            for producer_no in range(1 if rng.random() < 0.7 else 2):
                sync = fsync == "on" or (fsync == "mixed" and rng.random() < 0.5)
                compression = "zstd" if rng.random() < 0.2 else None
                r, w = os.pipe()
                error_path = str(workdir / f"error-{trial}-{producer_no}.txt")
                p = ctx.Process(
                    target=_producer_main,
                    args=(root_path, trial, producer_no, rng.randrange(1 << 32), sync, compression, w, error_path),
                )
                p.start()
                os.close(w)
                # Half the kills count their delay from the start, half from the first
                # acknowledgement: on a busy machine a first append can outlast every
                # delay, and then no trial would acknowledge anything.
                after_ack = rng.random() < 0.5
                procs.append((p, r, producer_no, error_path, rng.uniform(0.001, max_delay), after_ack))
                report.producers += 1
            start = time.monotonic()
            heads: dict[int, bytes] = {}
            for p, r, _, _, delay, after_ack in sorted(procs, key=lambda x: (x[5], x[4])):
                if after_ack:
                    heads[r] = _read_first_ack(r, timeout=60)
                    time.sleep(delay)
                else:
                    time.sleep(max(0.0, start + delay - time.monotonic()))
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGKILL)
            for p, r, producer_no, error_path, *_ in procs:
                p.join(10)
                if p.exitcode is None:
                    report.problems.append(f"trial {trial} producer {producer_no} did not die")
                    p.kill()
                    p.join()
                data = heads.get(r, b"") + _read_to_eof(r)
                os.close(r)
                if p.exitcode == -signal.SIGKILL:
                    report.killed += 1
                else:
                    detail = Path(error_path).read_text() if os.path.exists(error_path) else ""
                    report.problems.append(f"trial {trial} producer {producer_no} exited with {p.exitcode}: {detail}")
                usable = len(data) - len(data) % _ACK.size
                for pos in range(0, usable, _ACK.size):
                    batch, count = _ACK.unpack_from(data, pos)
                    acked[(trial, producer_no, batch)] = count
                    report.acked_batches += 1
                    report.acked_messages += count
            torn, orphans = tail_facts(directory)
            report.kills_with_torn_tail += torn > 0
            report.orphan_segments += orphans > 0
            if progress_every and (trial + 1) % progress_every == 0:
                log(f"  ... {trial + 1} trials, {report.acked_messages} messages acknowledged")

        # One clean producer: repairs the tail, then the marker tells the reader to stop.
        producer = kl.Producer(root, fsync=True)
        marker = [payload((MARKER_TRIAL, 0, 0, i), 3) for i in range(3)]
        producer.send_batch(TOPIC, marker, partition=0)
        torn, orphans = tail_facts(directory)
        if torn:
            report.problems.append(f"the producer after the last kill left {torn} bytes past the published end")

        reader_result = None
        if parent_conn.poll(60):
            reader_result = parent_conn.recv()
        stop_event.set()
        if reader_result is None and parent_conn.poll(5):
            reader_result = parent_conn.recv()
    finally:
        stop_event.set()
        reader.join(5)
        if reader.is_alive():
            reader.kill()
            reader.join()
    if reader_result is None:
        report.problems.append("the reader never reported")
        reader_result = (0, 0, "", [])
    report.reader_messages, report.reader_resets, reader_digest, reader_problems = reader_result
    report.problems += [f"reader: {p}" for p in reader_problems]

    # recover must find nothing committed damaged; a second run nothing at all.
    log_ = kl.Log(directory, root.log(TOPIC, 0).lock_path, HARNESS_CONFIG)
    first = recover(log_, deep=True)
    report.recover_findings = [f"{f.action} at {f.offset}: {f.reason}" for f in first.findings]
    for f in first.findings:
        if f.action not in ("cut", "removed"):
            report.problems.append(f"recover found damage: {f}")
    second = recover(kl.Log(directory, log_.lock_path, HARNESS_CONFIG), deep=True)
    if second.findings:
        report.problems.append(f"a second recover still found {second.findings}")

    # The final log, read from scratch.
    checker = OrderChecker()
    batches: dict[tuple[int, int, int], list[int]] = defaultdict(list)
    counts: dict[tuple[int, int, int], int] = {}
    final_end = log_.state().log_end_offset
    try:
        messages = read_log(fresh_log(log_))
    except kl.KlError as e:
        report.problems.append(f"reading the final log raised {e!r}")
        messages = []
    reached = messages[-1].next_offset if messages else 0
    if reached != final_end:
        report.problems.append(f"reading the final log stopped at offset {reached}, before its end {final_end}")
    for msg in messages:
        checked = checker.check(msg)
        if checked:
            ident, count = checked
            batches[ident[:3]].append(ident[3])
            counts[ident[:3]] = count
    report.problems += [f"final log: {p}" for p in checker.problems]
    report.final_messages = checker.count
    report.final_batches = len(batches)
    report.segments = len(list_segments(directory))
    if reader_digest and (checker.count, checker.digest.hexdigest()) != (report.reader_messages, reader_digest):
        report.problems.append(
            f"the reader saw {report.reader_messages} messages, the final log holds {checker.count} (or they differ)"
        )
    for key, indexes in batches.items():
        if sorted(indexes) != list(range(counts[key])):
            report.problems.append(f"batch {key} is partial: {len(indexes)} of {counts[key]} messages")
    missing = [key for key in acked if key not in batches]
    for key in missing[:10]:
        report.problems.append(f"acknowledged batch {key} ({acked[key]} messages) is missing (or unreadable)")
    if len(missing) > 10:
        report.problems.append(f"... {len(missing)} acknowledged batches are missing in all")
    for key, count in acked.items():
        if key in counts and counts[key] != count:
            report.problems.append(f"acknowledged batch {key} had {count} messages, the log says {counts[key]}")
    report.unacked_batches_present = sum(1 for key in batches if key not in acked and key[0] != MARKER_TRIAL)
    report.seconds = time.monotonic() - started
    root.close()
    return report


__all__ = [
    "HARNESS_CONFIG", "KillReport", "MARKER_TRIAL", "OrderChecker", "TOPIC", "append_bytes",
    "flip_bit", "fresh_log", "parse_payload", "payload", "read_log", "run_kill_trials", "shrink_to", "snapshot",
    "tail_facts", "write_at",
]
