"""Durability and storage errors: fsync before acknowledging, fsync errors, directory
fsyncs, a full filesystem (a real small tmpfs) and a read-only mount."""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import re
import resource
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import kl
from kl.log.segment import segment_name
from kl.log.state import STATE_FILE, PartitionState, read_state

from faultlib import fresh_log, read_log, run_kill_trials, snapshot, wait_flushed

TS = 1_700_000_000_000


# ----------------------------------------------------------------- recording system calls


class Calls:
    """Records os.fsync and os.pwrite as (call, path, is_directory, published), in order.

    ``published`` is the partition state a reader would have seen at that moment (the
    writer updates the state through a memory map, so its writes are not calls to see).
    """

    def __init__(self, monkeypatch, *, fail_fsync: int | None = None, error: int = errno.EIO, state_file: str | None = None):
        self.events: list[tuple[str, str, bool, PartitionState | None]] = []
        self.fsyncs_seen = 0
        self.fail_fsync = fail_fsync
        """Make the nth fsync (1-based) from now on fail with ``error``; 0 fails every one."""
        real_fsync, real_pwrite = os.fsync, os.pwrite

        def where(fd: int) -> tuple[str, bool, PartitionState | None]:
            published = read_state(state_file) if state_file else None
            return os.readlink(f"/proc/self/fd/{fd}"), stat.S_ISDIR(os.fstat(fd).st_mode), published

        def fsync(fd):
            self.fsyncs_seen += 1
            self.events.append(("fsync", *where(fd)))
            if self.fail_fsync is not None and (self.fail_fsync == 0 or self.fail_fsync == self.fsyncs_seen):
                raise OSError(error, os.strerror(error))
            return real_fsync(fd)

        def pwrite(fd, data, position):
            self.events.append(("pwrite", *where(fd)))
            return real_pwrite(fd, data, position)

        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "pwrite", pwrite)

    def clear(self) -> None:
        self.events.clear()
        self.fsyncs_seen = 0

    def index(self, call: str, path: str | Path, *, last: bool = False) -> int:
        found = [i for i, e in enumerate(self.events) if e[0] == call and e[1] == str(path)]
        assert found, f"no {call} of {path} in {self.events}"
        return found[-1] if last else found[0]

    def directories(self) -> set[str]:
        return {e[1] for e in self.events if e[0] == "fsync" and e[2]}


NO_FLUSH = kl.TopicConfig(flush_messages=0, flush_ms=0)


def make(root: kl.Root, config: kl.TopicConfig = NO_FLUSH) -> kl.Log:
    root.create_topic("t", config)
    kl.Producer(root).send("t", b"first", partition=0, timestamp=TS)
    return root.log("t", 0)


def paths(log: kl.Log) -> tuple[str, str]:
    state = log.state()
    return os.path.join(log.directory, f"{state.active_base_offset:020d}.kl"), os.path.join(log.directory, STATE_FILE)


# ----------------------------------------------------------------- fsync before acknowledging


@pytest.mark.parametrize("how", ["send", "send_batch"])
def test_fsync_true_syncs_the_data_then_the_state_before_send_returns(root, monkeypatch, how):
    log = make(root)
    segment, state_file = paths(log)
    before = log.state()
    calls = Calls(monkeypatch, state_file=state_file)
    producer = kl.Producer(root, fsync=True)
    if how == "send":
        producer.send("t", b"durable", partition=0)
    else:
        producer.send_batch("t", [b"durable"] * 10, partition=0)
    data_written = calls.index("pwrite", segment, last=True)
    data_synced = calls.index("fsync", segment, last=True)
    state_synced = calls.index("fsync", state_file, last=True)
    assert data_written < data_synced < state_synced
    assert calls.events[data_synced][3] == before, "published before the data was durable"
    state = log.state()
    assert calls.events[state_synced][3] == state, "the state was synced before it was published"
    assert state.flushed_offset == state.log_end_offset > before.log_end_offset


def test_without_fsync_send_does_not_sync_until_the_flush_policy_says_so(root, monkeypatch):
    log = make(root, kl.TopicConfig(flush_messages=3, flush_ms=0))
    segment, _ = paths(log)
    calls = Calls(monkeypatch)
    producer = kl.Producer(root)
    producer.send("t", b"a", partition=0)
    assert not [e for e in calls.events if e[0] == "fsync"]
    producer.send("t", b"b", partition=0)  # the third message since the last flush: the flusher fsyncs
    assert wait_flushed(log)
    assert calls.index("fsync", segment) >= 0
    calls.clear()
    producer.send("t", b"c", partition=0)
    producer.close()  # close flushes
    assert calls.index("fsync", segment) >= 0


def test_a_roll_syncs_the_new_segment_and_its_directory_before_publishing(root, monkeypatch):
    log = make(root, kl.TopicConfig(segment_bytes=1024, max_message_bytes=512, flush_messages=0, flush_ms=0))
    kl.Producer(root).send_batch("t", [b"x" * 100] * 8, partition=0)
    old_base = log.state().active_base_offset
    calls = Calls(monkeypatch, state_file=os.path.join(log.directory, STATE_FILE))
    kl.Producer(root, fsync=True).send_batch("t", [b"y" * 100] * 3, partition=0)  # rolls
    new_segment, state_file = paths(log)
    assert log.state().active_base_offset > old_base
    segment_synced = calls.index("fsync", new_segment)
    directory_synced = calls.index("fsync", log.directory)
    assert calls.events[directory_synced][2]
    assert calls.events[segment_synced][3].active_base_offset == old_base, "rolled before the segment was durable"
    assert calls.events[directory_synced][3].active_base_offset == old_base, "rolled before its directory entry was durable"
    assert calls.index("fsync", state_file, last=True) > max(segment_synced, directory_synced)


def test_a_roll_without_fsync_still_syncs_the_directory(root, monkeypatch):
    log = make(root, kl.TopicConfig(segment_bytes=1024, max_message_bytes=512, flush_messages=0, flush_ms=0))
    kl.Producer(root).send_batch("t", [b"x" * 100] * 8, partition=0)
    calls = Calls(monkeypatch)
    kl.Producer(root).send_batch("t", [b"y" * 100] * 3, partition=0)
    assert log.directory in calls.directories()


def test_creating_a_topic_syncs_its_files_and_directories(tmp_path, monkeypatch):
    root = kl.Root(tmp_path / "root")
    root.create_topic("seed")  # the root directory exists from here on
    calls = Calls(monkeypatch)
    root.create_topic("t", kl.TopicConfig(partitions=3))
    synced_dirs = calls.directories()
    assert root.path in synced_dirs  # the rename into the root
    partition_dirs = {d for d in synced_dirs if os.path.basename(d) in ("0", "1", "2")}
    assert len(partition_dirs) == 3  # each partition's state and segment entries
    files = {os.path.basename(e[1]) for e in calls.events if e[0] == "fsync" and not e[2]}
    assert any(".topic.json." in f or f == "topic.json" for f in files)
    assert any(".state." in f or f == STATE_FILE for f in files)


# ----------------------------------------------------------------- fsync seen from outside the process
#
# The tests above watch os.fsync from inside; these run a real producer process and watch
# its system calls: under strace where it works, and always through a wrapper of the os
# functions installed before kl is imported.  Either way each event is (call, fd, path).

PYTHON_TRACER = """
import os
_log = open(os.environ["KL_TRACE_LOG"], "w", buffering=1)

def _traced(name, real):
    def call(fd, *args):
        _log.write(f"{name} {fd} {os.readlink(f'/proc/self/fd/{fd}')}\\n")
        return real(fd, *args)
    return call

for _name in ("write", "writev", "pwrite", "pwritev", "fsync", "fdatasync"):
    if hasattr(os, _name):
        setattr(os, _name, _traced(_name, getattr(os, _name)))
"""

LIBRARY_PRODUCER = """
import os, sys
import kl
producer = kl.Producer(kl.Root(sys.argv[1]), fsync=sys.argv[2] == "fsync")
producer.send_batch("t", [b"batch"] * 5, partition=0)
os.write(1, b"acked\\n")
producer.send("t", b"single", partition=0)
os.write(1, b"acked\\n")
producer.send_batch("t", [b"another batch"] * 3, partition=0)
os.write(1, b"acked\\n")
producer.close()
os.write(1, b"closed\\n")
"""

CLI_PRODUCER = """
import sys
from kl_cli.main import main
sys.argv = ["kl", *sys.argv[1:]]
main()
"""

WRITES = {"write", "writev", "pwrite", "pwrite64", "pwritev", "pwritev2"}
SYNCS = {"fsync", "fdatasync"}
STRACE_EVENT = re.compile(r"^(?:\d+\s+)?(\w+)\((\d+)<([^>]*)>")


def strace_works() -> bool:
    if shutil.which("strace") is None:
        return False
    done = subprocess.run(["strace", "-f", "-qq", "-o", os.devnull, "true"], capture_output=True)
    return done.returncode == 0  # ptrace may be forbidden (containers)


TRACERS = ["python"] + (["strace"] if strace_works() else [])


def traced(tracer: str, tmp_path: Path, program: str, *args: str, input: bytes = b"") -> list[tuple[str, int, str]]:
    """Run ``program`` in a new interpreter under ``tracer``; its writes and fsyncs in order."""
    trace = tmp_path / f"trace-{tracer}.txt"
    env = dict(os.environ, KL_TRACE_LOG=str(trace))
    command = [sys.executable, "-c", PYTHON_TRACER + program if tracer == "python" else program, *args]
    if tracer == "strace":
        command = [
            "strace",
            "-f",
            "-qq",
            "-y",
            "-e",
            "trace=" + ",".join(sorted((WRITES | SYNCS) - {"pwrite"})),
            "-o",
            str(trace),
            *command,
        ]
    done = subprocess.run(command, input=input, capture_output=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    events = []
    for line in trace.read_text().splitlines():
        if tracer == "python":
            call, fd, path = line.split(" ", 2)
        else:
            match = STRACE_EVENT.match(line)
            if match is None:
                continue
            call, fd, path = match.groups()
        events.append(("fsync" if call in SYNCS else "write" if call in WRITES else call, int(fd), path))
    return events


def durability(events: list[tuple[str, int, str]], segment: str) -> list[str]:
    """The events that matter, in order: "write" and "fsync" of the segment, "ack" (a
    write to stdout, made by the program after an append returned)."""
    out = []
    for call, fd, path in events:
        if path == segment and call in ("write", "fsync"):
            out.append(call)
        elif call == "write" and fd == 1:
            out.append("ack")
    return out


def unsynced_at_each_ack(sequence: list[str]) -> list[bool]:
    """For each "ack": whether a write of the segment preceded it with no fsync since."""
    dirty, out = False, []
    for event in sequence:
        if event == "write":
            dirty = True
        elif event == "fsync":
            dirty = False
        else:
            out.append(dirty)
    return out


@pytest.fixture
def traced_topic(root) -> str:
    """Topic "t" with the flush policy off; the path of its segment (resolved, as traced)."""
    root.create_topic("t", NO_FLUSH)
    return os.path.realpath(os.path.join(root.log("t", 0).directory, segment_name(0)))


@pytest.mark.parametrize("tracer", TRACERS)
def test_the_tracers_see_writes_and_fsyncs_of_a_file_and_acks(tracer, tmp_path):
    path = tmp_path / "file"
    program = "import os, sys\nfd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n" + (
        "os.pwrite(fd, b'x', 0)\nos.write(1, b'ack')\nos.write(fd, b'y')\nos.fsync(fd)\nos.write(1, b'ack')\n"
    )
    sequence = durability(traced(tracer, tmp_path, program, str(path)), os.path.realpath(path))
    assert sequence == ["write", "ack", "write", "fsync", "ack"]
    assert unsynced_at_each_ack(sequence) == [True, False]


@pytest.mark.parametrize("tracer", TRACERS)
def test_producer_fsync_true_fsyncs_the_segment_before_each_append_returns(tracer, tmp_path, root, traced_topic):
    sequence = durability(traced(tracer, tmp_path, LIBRARY_PRODUCER, root.path, "fsync"), traced_topic)
    assert sequence.count("ack") == 4 and sequence.count("write") >= 3, sequence  # 3 appends, then close
    assert unsynced_at_each_ack(sequence) == [False, False, False, False], sequence


@pytest.mark.parametrize("tracer", TRACERS)
def test_a_producer_without_fsync_syncs_nothing_before_returning_and_everything_at_close(tracer, tmp_path, root, traced_topic):
    sequence = durability(traced(tracer, tmp_path, LIBRARY_PRODUCER, root.path, "nofsync"), traced_topic)
    acks = [i for i, event in enumerate(sequence) if event == "ack"]
    assert len(acks) == 4 and sequence.count("write") >= 3, sequence  # 3 appends, then close
    assert "fsync" not in sequence[: acks[2]], sequence
    assert unsynced_at_each_ack(sequence) == [True, True, True, False], sequence


def appends_left_unsynced(sequence: list[str]) -> int:
    """How many writes of the segment were followed by another before any fsync."""
    return sum(1 for a, b in itertools.pairwise([e for e in sequence if e != "ack"]) if a == b == "write")


@pytest.mark.parametrize("tracer", TRACERS)
def test_kl_produce_fsync_fsyncs_each_append_before_the_next(tracer, tmp_path, root, traced_topic):
    lines = b"".join(b"line %d\n" % i for i in range(6))
    events = traced(
        tracer, tmp_path, CLI_PRODUCER, "--root", root.path, "produce", "t", "--fsync", "--batch-size", "2", input=lines
    )
    sequence = durability(events, traced_topic)
    assert sequence.count("write") >= 3, sequence  # one append per 2 lines
    assert appends_left_unsynced(sequence) == 0 and sequence[-1] == "fsync", sequence
    assert [msg.value for msg in read_log(root.log("t", 0))] == lines.splitlines()


@pytest.mark.parametrize("tracer", TRACERS)
def test_kl_produce_without_fsync_syncs_only_at_exit(tracer, tmp_path, root, traced_topic):
    lines = b"".join(b"line %d\n" % i for i in range(6))
    events = traced(tracer, tmp_path, CLI_PRODUCER, "--root", root.path, "produce", "t", "--batch-size", "2", input=lines)
    sequence = durability(events, traced_topic)
    assert sequence.count("write") >= 3, sequence
    assert sequence.count("fsync") == 1 and sequence[-1] == "fsync", sequence  # kl produce fsyncs at exit
    assert appends_left_unsynced(sequence) == sequence.count("write") - 1, sequence


# ----------------------------------------------------------------- fsync errors


def test_an_fsync_error_fails_the_send_and_nothing_is_acknowledged(root, monkeypatch):
    log = make(root)
    before = log.state()
    producer = kl.Producer(root, fsync=True)
    calls = Calls(monkeypatch, fail_fsync=0)
    with pytest.raises(kl.StorageError, match="I/O error"):
        producer.send("t", b"lost", partition=0)
    assert log.state() == before  # never published
    assert [msg.value for msg in read_log(fresh_log(log))] == [b"first"]
    with pytest.raises(kl.StorageError, match="I/O error"):
        producer.send_batch("t", [b"also lost"] * 3, partition=0)
    calls.fail_fsync = None  # the disk "recovers": this handle must still refuse
    for attempt in (
        lambda: producer.send("t", b"x", partition=0),
        lambda: kl.Producer(root).send("t", b"x", partition=0),
        log.flush,
    ):
        with pytest.raises(kl.StorageError):
            attempt()
    assert log.state() == before
    # A new handle (a restarted process) cuts the unpublished bytes and goes on.
    kl.Producer(kl.Root(root.path), fsync=True).send("t", b"after", partition=0)
    assert [msg.value for msg in read_log(fresh_log(log))] == [b"first", b"after"]


def test_an_fsync_error_on_the_state_fails_the_send_and_the_handle(root, monkeypatch):
    make(root)
    producer = kl.Producer(root, fsync=True)
    Calls(monkeypatch, fail_fsync=2)  # the data fsync works, the state's fails
    with pytest.raises(kl.StorageError, match="I/O error"):
        producer.send("t", b"unacknowledged", partition=0)
    monkeypatch.undo()
    with pytest.raises(kl.StorageError):
        producer.send("t", b"x", partition=0)


def test_an_fsync_error_under_the_flush_policy_fails_the_handle(root, monkeypatch):
    """The flush policy fsyncs in the background after publishing: an error there fails
    the producer's flush and close and every later append through the handle, while what
    was published stays readable, like any data not yet fsynced, and is never counted as
    flushed."""
    root.create_topic("t", kl.TopicConfig(flush_messages=1, flush_ms=0))
    with kl.Producer(root, fsync=True) as first:  # fsynced before send returns: no background flush left to race
        first.send("t", b"first", partition=0, timestamp=TS)
    log = root.log("t", 0)
    before = log.state()
    assert before.flushed_offset == before.log_end_offset
    Calls(monkeypatch, fail_fsync=0)
    producer = kl.Producer(root)
    producer.send("t", b"unflushed", partition=0)  # published; its fsync fails in the background
    with pytest.raises(kl.StorageError, match="I/O error"):
        producer.close()
    monkeypatch.undo()
    assert log.state().flushed_offset == before.flushed_offset < log.state().log_end_offset
    assert [msg.value for msg in read_log(fresh_log(log))] == [b"first", b"unflushed"]
    with pytest.raises(kl.StorageError):
        kl.Producer(root).send("t", b"x", partition=0)


def test_an_fsync_error_during_a_roll_leaves_the_partition_as_it_was(root, monkeypatch):
    log = make(root, kl.TopicConfig(segment_bytes=1024, max_message_bytes=512, flush_messages=0, flush_ms=0))
    kl.Producer(root, fsync=True).send_batch("t", [b"x" * 100] * 8, partition=0)
    before_state, before_files = log.state(), snapshot(log.directory)
    Calls(monkeypatch, fail_fsync=0)
    with pytest.raises(kl.StorageError, match="I/O error"):
        kl.Producer(root, fsync=True).send_batch("t", [b"y" * 100] * 3, partition=0)
    monkeypatch.undo()
    assert log.state() == before_state
    assert snapshot(log.directory) == before_files


# ----------------------------------------------------------------- kill -9 with fsync


DURABLE_TRIALS = 60


def test_kill_9_with_fsync_loses_no_acknowledged_message(tmp_path):
    report = run_kill_trials(tmp_path, DURABLE_TRIALS, seed=int(os.environ.get("KL_KILL_SEED", "7070")), fsync="on")
    print("\n" + report.summary())
    assert report.trials == DURABLE_TRIALS and report.acked_messages > 0
    assert not report.problems, report.summary()
    assert report.kills_with_torn_tail > 0, "no kill left a torn tail"


# ----------------------------------------------------------------- real mounts


def _mount(args: list[str]) -> None:
    if os.geteuid() != 0:
        pytest.skip(f"mounting needs root (euid {os.geteuid()}): cannot run {' '.join(args)}")
    done = subprocess.run(args, capture_output=True, text=True)
    if done.returncode != 0:
        message = (done.stderr or done.stdout).strip()
        if "permission denied" in message.lower() or "not permitted" in message.lower():
            pytest.skip(f"mounting is not permitted here ({' '.join(args)}: {message})")
        pytest.fail(f"{' '.join(args)} failed with status {done.returncode}: {message}")


def _unmount(point: Path) -> None:
    if subprocess.run(["umount", str(point)], capture_output=True).returncode != 0:
        # kl keeps lock files open for the life of the process: detach lazily.
        subprocess.run(["umount", "-l", str(point)], check=True, capture_output=True)


@contextlib.contextmanager
def tmpfs(point: Path, size: str = "2m", inodes: int = 1000) -> Iterator[Path]:
    """A real tmpfs of ``size`` mounted at ``point`` (made), unmounted afterwards."""
    point.mkdir()
    _mount(["mount", "-t", "tmpfs", "-o", f"size={size},nr_inodes={inodes}", "tmpfs", str(point)])
    try:
        yield point
    finally:
        _unmount(point)


@pytest.fixture
def small_fs(tmp_path):
    """A real 2 MiB tmpfs, unmounted afterwards."""
    with tmpfs(tmp_path / "small") as point:
        yield point


def fill_up(directory: Path) -> Path:
    """Write a ballast file until the filesystem is full."""
    ballast = directory / "ballast"
    chunk = b"\xba" * 4096
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while True:
            try:
                os.write(fd, chunk)
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
                break
    finally:
        os.close(fd)
    return ballast


def free(ballast: Path, nbytes: int | None = None) -> None:
    """Give back ``nbytes`` of space (all of it by default)."""
    if nbytes is None:
        ballast.unlink()
    else:
        os.truncate(ballast, max(0, ballast.stat().st_size - nbytes))


SMALL_FS_CONFIG = kl.TopicConfig(segment_bytes=256 << 10, max_message_bytes=64 << 10, flush_messages=0, flush_ms=0)


@pytest.mark.parametrize("room", [0, 8192], ids=["full", "nearly-full"])
def test_producing_into_a_full_filesystem_fails_cleanly_and_leaves_the_partition_as_it_was(small_fs, room):
    root = kl.Root(small_fs / "root")
    root.create_topic("t", SMALL_FS_CONFIG)
    producer = kl.Producer(root)
    producer.send_batch("t", [b"before-%d" % i for i in range(10)], partition=0, timestamp=TS)
    log = root.log("t", 0)
    ballast = fill_up(small_fs)
    if room:
        free(ballast, room)
    before = snapshot(log.directory)
    state = log.state()
    for _ in range(2):  # and again: the failure left nothing behind to trip over
        with pytest.raises(kl.StorageError, match="no space left on device") as e:
            producer.send_batch("t", [b"z" * 1000] * 60, partition=0, timestamp=TS)
        assert "\n" not in str(e.value)
        assert snapshot(log.directory) == before
        assert log.state() == state
    assert [msg.value for msg in read_log(fresh_log(log))] == [b"before-%d" % i for i in range(10)]
    free(ballast)
    producer.send_batch("t", [b"after"] * 60, partition=0, timestamp=TS)
    assert [msg.value for msg in read_log(fresh_log(log))] == [b"before-%d" % i for i in range(10)] + [b"after"] * 60


def test_a_roll_onto_a_full_filesystem_fails_cleanly(small_fs):
    root = kl.Root(small_fs / "root")
    root.create_topic("t", kl.TopicConfig(segment_bytes=64 << 10, max_message_bytes=16 << 10, flush_messages=0, flush_ms=0))
    producer = kl.Producer(root)
    producer.send_batch("t", [b"a" * 1000] * 60, partition=0, timestamp=TS)  # ~61 KiB: the next batch rolls
    log = root.log("t", 0)
    ballast = fill_up(small_fs)
    before, state = snapshot(log.directory), log.state()
    with pytest.raises(kl.StorageError, match="no space left on device"):
        producer.send_batch("t", [b"b" * 1000] * 20, partition=0, timestamp=TS)
    assert snapshot(log.directory) == before  # no new segment file left behind
    assert log.state() == state
    free(ballast)
    producer.send_batch("t", [b"b" * 1000] * 20, partition=0, timestamp=TS)
    assert len(log.segments()) == 2
    assert [msg.value for msg in read_log(fresh_log(log))] == [b"a" * 1000] * 60 + [b"b" * 1000] * 20


@pytest.mark.parametrize("partitions, files", [(4, None), (200, 256)], ids=["4-partitions", "200-under-ulimit-256"])
def test_a_keyed_produce_onto_a_full_filesystem_commits_a_prefix_and_names_the_line_to_resume_from(tmp_path, partitions, files):
    """The disk fills in the middle of a keyed produce: some partitions' appends still
    fit the pages they have, others fail.  What is in the topic is exactly the lines
    before the one the error names (under ``ulimit -n 256`` a piece of the input spans
    at most 16 partitions), and ``tail -n +N`` after freeing space puts in the rest."""
    lines = [b"key%d\tvalue %d %s" % (i % 997, i, b"x" * (i % 50)) for i in range(1, 20001)]
    with tmpfs(tmp_path / "fs", "8m", 5000) as fs:
        root = kl.Root(fs / "root")
        config = kl.TopicConfig(partitions=partitions, segment_bytes=256 << 10, max_message_bytes=64 << 10, flush_ms=0)
        root.create_topic("k", config)
        root.close()
        ballast = fs / "ballast"
        vfs = os.statvfs(fs)
        ballast.write_bytes(b"\xba" * (vfs.f_bavail * vfs.f_frsize - (600 << 10)))  # room for about half the input
        limit = (lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (files, files))) if files else None
        cli = [sys.executable, "-m", "kl_cli", "--root", str(fs / "root"), "produce", "k", "-K", "\t"]
        done = subprocess.run(cli, input=b"\n".join(lines) + b"\n", capture_output=True, timeout=300, preexec_fn=limit)
        assert done.returncode == 1, done.stderr.decode()
        error = done.stderr.decode()
        assert error.count("\n") == 1 and "no space left on device" in error, error
        line = int(re.search(r"line (\d+):", error).group(1))
        assert 1 < line < len(lines) and f"{line - 1} lines before it were committed" in error
        stored = {m.value for p in range(partitions) for m in read_log(kl.Root(fs / "root").log("k", p))}
        assert stored == {v.split(b"\t", 1)[1] for v in lines[: line - 1]}  # a prefix, and only it
        ballast.unlink()
        rest = subprocess.run(
            cli, input=b"\n".join(lines[line - 1 :]) + b"\n", capture_output=True, timeout=300, preexec_fn=limit
        )
        assert rest.returncode == 0, rest.stderr.decode()
        messages = [m for p in range(partitions) for m in read_log(kl.Root(fs / "root").log("k", p), max_bytes=8 << 20)]
    assert sorted(int(m.value.split()[1]) for m in messages) == list(range(1, 20001))  # each once
    for m in messages:
        assert m.key == b"key%d" % (int(m.value.split()[1]) % 997)


def test_creating_a_topic_on_a_full_filesystem_leaves_nothing_behind(small_fs):
    root = kl.Root(small_fs / "root")
    root.create_topic("seed")
    ballast = fill_up(small_fs)
    with pytest.raises(kl.StorageError, match="no space left on device"):
        root.create_topic("t", kl.TopicConfig(partitions=2))
    assert sorted(os.listdir(root.path)) == [".locks", "seed"] or sorted(os.listdir(root.path)) == ["seed"]
    free(ballast)
    root.create_topic("t", kl.TopicConfig(partitions=2))
    assert root.topics() == ["seed", "t"]


@pytest.fixture
def read_only_view(tmp_path):
    """(writable root path, the same directory through a read-only bind mount)."""
    source = tmp_path / "rw"
    view = tmp_path / "ro"
    source.mkdir()
    view.mkdir()
    _mount(["mount", "--bind", str(source), str(view)])
    try:
        _mount(["mount", "-o", "remount,bind,ro", str(view)])
        yield source, view
    finally:
        _unmount(view)


def test_producing_on_a_read_only_filesystem_fails_with_one_clear_line_and_consuming_works(read_only_view):
    source, view = read_only_view
    writable = kl.Root(source / "root")
    writable.create_topic("t", NO_FLUSH)
    kl.Producer(writable).send_batch("t", [b"m%d" % i for i in range(5)], partition=0)
    read_only = kl.Root(view / "root")
    with pytest.raises(kl.StorageError, match="read-only file system") as e:
        kl.Producer(read_only).send("t", b"nope", partition=0)
    assert "\n" not in str(e.value)
    with pytest.raises(kl.StorageError, match="read-only file system"):
        read_only.create_topic("u")
    consumer = kl.Consumer(read_only)
    assert [msg.value for msg in consumer.fetch("t", 0, 0)] == [b"m%d" % i for i in range(5)]
    assert [msg.value for msg in consumer.stream("t", 0, 0, idle_timeout=0)] == [b"m%d" % i for i in range(5)]
    assert consumer.latest_offset("t", 0) == writable.log("t", 0).log_end_offset


def test_appends_have_the_disk_start_writing_every_few_mib_and_nothing_else_changes(tmp_path, monkeypatch):
    """Every ``WRITEBACK_BYTES`` appended through a segment, writeback of those bytes is
    started (the later fsync waits for less); a segment opened again starts counting
    where it appends; a bad descriptor is not an error (the fsync reports what fails)."""
    from kl.log import fsutil, segment

    started: list[tuple[int, int]] = []
    monkeypatch.setattr(segment, "start_writeback", lambda fd, position, length: started.append((position, length)))
    kl.Root(tmp_path).create_topic("t")
    mib = 1 << 20
    values = [b"v" * (mib // 4 - 22)] * 4  # one MiB framed per append
    producer = kl.Producer(tmp_path)
    for _ in range(9):
        producer.send_batch("t", values)
    producer.close()
    assert started == [(0, 4 * mib), (4 * mib, 4 * mib)] and segment.WRITEBACK_BYTES == 4 * mib
    with kl.Producer(tmp_path) as again:  # a new process's Segment: from where it appends
        for _ in range(4):
            again.send_batch("t", values)
    assert started[2:] == [(9 * mib, 4 * mib)]
    assert kl.Consumer(tmp_path).fetch("t", 0, 0, 100).values()[0][:1] == [values[0]]
    fsutil.start_writeback(-1, 0, 10)  # EBADF: ignored
