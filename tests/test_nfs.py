"""kl on real NFS: two client hosts of one NFS server (the lab in ``nfslab``), over NFSv4.2
and over NFSv3 with lockd (NLM).

The scenarios of the issue that a real server showed losing acknowledged data: several
producers per host into one partition, kill -9 of a producer while the other host
appends and follows, a host cut off while it holds the lock and coming back, and
recover/retain from one host while the other produces.  Each producer prints what was
acknowledged (only after ``send_batch`` returned); the checks read the log from both
hosts.  Each version has one lab, shared by its tests; the NFSv4.2 lease is 10 s.  A cut-off
host fares differently on each: NFSv4 takes its locks away once its lease has run out,
NLM (no leases) lets it keep them until it comes back.
"""

from __future__ import annotations

import json
import signal
import time
from collections import Counter

import nfslab
import pytest

pytestmark = pytest.mark.skipif(nfslab.unavailable() is not None, reason=str(nfslab.unavailable()))

ROOT = f"{nfslab.MOUNT}/root"

PRODUCER = r"""
import sys, time, kl
topic, tag, batches, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
producer = kl.Producer(kl.Root(ROOT, lock_timeout=300))
print("ready", flush=True)
for b in range(batches):
    producer.send_batch(topic, [b"%s-%06d-%03d" % (tag.encode(), b, i) for i in range(size)], partition=0)
    print("acked", b, time.monotonic(), flush=True)
producer.close()
print("done", flush=True)
""".replace("ROOT", repr(ROOT))

CHECK = r"""
import json, sys, kl
from kl.log.recovery import recover
root = kl.Root(ROOT)
values = [m.value.decode() for batch in kl.Consumer(root).consume(sys.argv[1]) for m in batch.messages]
report = recover(root.log(sys.argv[1], 0), deep=True, dry_run=True)
print(json.dumps({"values": values, "findings": [f.reason for f in report.findings],
                  "start": root.log(sys.argv[1], 0).log_start_offset}))
""".replace("ROOT", repr(ROOT))


def create(lab, topic: str, **settings: int) -> None:
    config = ", ".join(f"{k}={v}" for k, v in settings.items())
    done = lab.python("a", f"import kl; kl.Root({ROOT!r}).create_topic({topic!r}, kl.TopicConfig({config}))")
    assert done.returncode == 0, done.stderr


def check(lab, host: str, topic: str) -> dict:
    done = lab.python(host, CHECK, topic, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def acked(output: str) -> list[int]:
    return [int(line.split()[1]) for line in output.splitlines() if line.startswith("acked ")]


def expected(tag: str, batches, size: int) -> list[str]:
    return [f"{tag}-{b:06d}-{i:03d}" for b in batches for i in range(size)]


def test_two_producers_on_each_of_two_hosts_lose_nothing(lab):
    create(lab, "many")
    batches, size = 40, 100
    started = time.monotonic()
    producers = [lab.spawn_python(host, PRODUCER, "many", f"{host}{n}", str(batches), str(size)) for host in "ab" for n in "01"]
    results = [p.wait(timeout=600) for p in producers]
    seconds = time.monotonic() - started
    for result in results:
        assert result.returncode == 0 and result.stdout.endswith("done\n"), result.stderr[-2000:]
    want = sorted(v for host in "ab" for n in "01" for v in expected(f"{host}{n}", range(batches), size))
    for host in "ab":
        seen = check(lab, host, "many")
        assert Counter(seen["values"]) == Counter(want), f"host {host}: {len(seen['values'])} of {len(want)}"
        assert seen["findings"] == []
    print(f"\n4 producers on 2 hosts: {len(want)} messages in {seconds:.1f} s, {len(want) / seconds:,.0f} msg/s")


# Follows the partition until it has the message that is appended last (sys.argv[2]).
FOLLOWER = r"""
import sys, kl
seen = 0
for m in kl.Consumer(kl.Root(ROOT)).stream(sys.argv[1], 0, 0, idle_timeout=600, poll_interval=0.05):
    seen += 1
    if m.value.decode() == sys.argv[2]:
        break
print("followed", seen, flush=True)
""".replace("ROOT", repr(ROOT))


# Appends `before` batches, waits for SIGUSR1 (given once the other host's producer is
# dead), then appends `after` more.
SURVIVOR = r"""
import signal, sys, time, kl
topic, tag, before, after, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])
producer = kl.Producer(kl.Root(ROOT, lock_timeout=300))
for b in range(before + after):
    if b == before:
        print("waiting", flush=True)
        signal.sigwait([signal.SIGUSR1])
        print("go", time.monotonic(), flush=True)
    producer.send_batch(topic, [b"%s-%06d-%03d" % (tag.encode(), b, i) for i in range(size)], partition=0)
    print("acked", b, time.monotonic(), flush=True)
producer.close()
print("done", flush=True)
""".replace("ROOT", repr(ROOT))


def test_kill_9_of_a_producer_hands_the_lock_over_and_the_other_host_sees_only_whole_data(lab):
    kill_9_hand_over(lab, "kill")


def kill_9_hand_over(lab, topic: str) -> float:
    """Host a's producer appends until kill -9 while host b's appends beside it, then
    alone; host b follows: nothing acknowledged lost, nothing torn, nothing left for
    recover.  How long b's first append after the kill took (scripts/repeat-nfs-kill9
    runs it many times)."""
    create(lab, topic)
    size = 50
    victim = lab.spawn_python("a", PRODUCER, topic, "a", "100000", str(size))
    victim.wait_for_output("acked 5")
    before, after = 10, 20
    survivor = lab.spawn_python("b", SURVIVOR, topic, "b", str(before), str(after), str(size))
    follower = lab.spawn_python("b", FOLLOWER, topic, expected("b", [before + after - 1], size)[-1])
    survivor.wait_for_output("waiting", timeout=600)  # its first appends, taking turns with host a's
    victim.kill()
    killed = victim.wait(timeout=60)
    assert killed.returncode < 0
    assert "done" not in killed.stdout
    survivor.signal(signal.SIGUSR1)  # host b appends the rest after the kill, onto what the victim left
    result = survivor.wait(timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    followed = follower.wait(timeout=600)
    assert followed.returncode == 0, followed.stderr[-2000:]
    a_acked, b_acked = acked(killed.stdout), acked(result.stdout)
    assert b_acked == list(range(before + after))
    seen = check(lab, "b", topic)
    assert seen["findings"] == []
    values = Counter(seen["values"])
    for host, done in (("a", a_acked), ("b", b_acked)):
        missing = sorted({v.rsplit("-", 1)[0] for v in expected(host, done, size) if values[v] != 1})
        assert not missing, f"acknowledged batches of host {host} missing or repeated: {missing[:5]}"
    whole = Counter(v.rsplit("-", 1)[0] for v in values)
    assert set(whole.values()) == {size}, "a batch is torn"
    assert followed.stdout.split() == ["followed", str(len(seen["values"]))]
    lines = result.stdout.splitlines()
    go = float(next(line.split()[1] for line in lines if line.startswith("go ")))
    first = min(float(line.split()[2]) for line in lines if line.startswith("acked ") and int(line.split()[1]) >= before)
    print(f"\nkill -9 on host a: host b's first append after it took {(first - go) * 1000:.0f} ms")
    return first - go


HELD = r"""
import os, signal, sys, kl
# Pause in the fsync of the append's data, with the partition lock held: where a host is
# when its network goes while it appends.
real_fsync, paused = os.fsync, []
def fsync(fd):
    if not paused and os.readlink(f"/proc/self/fd/{fd}").endswith(".kl"):
        paused.append(fd)
        print("fsyncing", flush=True)
        signal.sigwait([signal.SIGUSR1])
    return real_fsync(fd)
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])
os.fsync = fsync
producer = kl.Producer(kl.Root(ROOT, lock_timeout=300))
try:
    producer.send_batch(sys.argv[1], [b"late-%03d" % i for i in range(50)], partition=0)
    print("acked late", flush=True)
except kl.KlError as e:
    print("error", e, flush=True)
try:
    producer.send_batch(sys.argv[1], [b"later"], partition=0)
    print("acked later", flush=True)
except kl.KlError as e:
    print("error", e, flush=True)
""".replace("ROOT", repr(ROOT))


COORDINATOR = r"""
import signal, sys, time, kl
from kl.log.log import Position
from kl.net.kafka.coordinator import Coordinator, GroupWait
# A Kafka group's coordinator (kl serve --kafka's, without its sockets): it takes the
# group's coordinator lock, has one member join and commit, then (SIGUSR1) commits again.
host, then = sys.argv[1], sys.argv[2]
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])
coordinator = Coordinator(kl.Root(ROOT), lambda: None)
coordinator.start(f"{host}:9092")
def settled(outcome):
    while isinstance(outcome, GroupWait) and outcome.result is None:
        time.sleep(0.05)
    return outcome.result if isinstance(outcome, GroupWait) else outcome
while coordinator.coordinator("g") != f"{host}:9092":
    time.sleep(0.5)
print("coordinating", time.monotonic(), flush=True)
joined = settled(coordinator.join("g", "", None, host, host, 60000, 60000, "consumer", [("range", b"")], False, None))
settled(coordinator.sync("g", joined.generation, joined.member_id, None, None, {joined.member_id: b""}, None))
commit = lambda offset: coordinator.commit("g", joined.generation, joined.member_id, [("t", 0, Position(offset), "", "")])
print("committed", commit(int(then)), flush=True)
if then == "10":
    signal.sigwait([signal.SIGUSR1])
    print("late", commit(99), flush=True)
coordinator.close()
""".replace("ROOT", repr(ROOT))


@pytest.mark.parametrize("lab", ["4.2"], indirect=True)
def test_a_host_cut_off_past_its_lease_cannot_overwrite_what_the_other_host_appended(lab):
    """Nor can a Kafka group's coordinator on it: host b's takes over, and a's late commit is refused."""
    create(lab, "fenced")
    coordinating = lab.spawn_python("a", COORDINATOR, "a", "10")
    first = lab.spawn_python("a", PRODUCER, "fenced", "first", "3", "10")
    assert first.wait(timeout=120).returncode == 0
    held = lab.spawn_python("a", HELD, "fenced")
    held.wait_for_output("fsyncing")
    coordinating.wait_for_output("committed", timeout=180)
    lab.disconnect("a")
    cut_at = time.monotonic()
    other = lab.spawn_python("b", PRODUCER, "fenced", "b", "20", "10")
    successor = lab.spawn_python("b", COORDINATOR, "b", "20")
    result = other.wait(timeout=300)
    took_over = time.monotonic() - cut_at
    assert result.returncode == 0, result.stderr[-2000:]
    succeeded = successor.wait(timeout=300)
    assert succeeded.returncode == 0 and "committed [0]" in succeeded.stdout, succeeded.stdout + succeeded.stderr[-2000:]
    lab.reconnect("a")
    time.sleep(2)
    held.signal(signal.SIGUSR1)
    coordinating.signal(signal.SIGUSR1)
    outcome = held.wait(timeout=300)
    late = coordinating.wait(timeout=300)
    assert "late [16]" in late.stdout, late.stdout + late.stderr[-2000:]  # NOT_COORDINATOR
    done = lab.python("b", f"import kl; print(kl.registry.Registry({ROOT!r}, 'g').committed('t', 0).offset)")
    assert done.stdout.split() == ["20"], done.stdout + done.stderr  # b's commit, not a's late one
    lines = outcome.stdout.splitlines()
    assert not any(line.startswith("acked") for line in lines), outcome.stdout
    assert lines[1].startswith("error") and lines[2].startswith("error"), outcome.stdout
    for host in "ab":
        seen = check(lab, host, "fenced")
        # Late bytes of host a past the end of a segment it can no longer extend are never served.
        assert [f for f in seen["findings"] if "written late by a writer that had lost its lock" not in f] == []
        assert seen["values"] == expected("first", range(3), 10) + expected("b", range(20), 10)
    print(
        f"\ncut-off host a: host b took over after {took_over:.1f} s; host a's appends: {lines[1]!r}, then {lines[2]!r};"
        " its Kafka group coordinator's late commit: NOT_COORDINATOR"
    )


WAITER = r"""
import sys, time, kl
started = time.monotonic()
try:
    kl.Producer(kl.Root(ROOT, lock_timeout=float(sys.argv[2]))).send_batch(sys.argv[1], [b"never"], partition=0)
    print("acked", flush=True)
except kl.KlError as e:
    print(f"{type(e).__name__} after {time.monotonic() - started:.1f} s: {e}", flush=True)
""".replace("ROOT", repr(ROOT))


@pytest.mark.parametrize("lab", ["3"], indirect=True)
def test_a_host_cut_off_while_it_appends_on_nfsv3_keeps_the_lock_and_finishes_its_append_when_back(lab):
    create(lab, "held")
    first = lab.spawn_python("a", PRODUCER, "held", "first", "3", "10")
    assert first.wait(timeout=120).returncode == 0
    held = lab.spawn_python("a", HELD, "held")
    held.wait_for_output("fsyncing")
    lab.disconnect("a")
    cut_at = time.monotonic()
    waiter = lab.python("b", WAITER, "held", "15", timeout=120)
    assert waiter.stdout.startswith("LockTimeout after ") and "(waited 15s)" in waiter.stdout, waiter
    other = lab.spawn_python("b", PRODUCER, "held", "b", "20", "10")
    other.wait_for_output("ready")
    time.sleep(5)
    assert acked(other.output()) == [], "host b appended while host a, cut off, held the lock"
    lab.reconnect("a")
    waited = time.monotonic() - cut_at
    back_at = float(lab.python("a", "import time; print(time.monotonic())").stdout)
    held.signal(signal.SIGUSR1)
    outcome = held.wait(timeout=300)
    result = other.wait(timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert outcome.stdout.splitlines()[1:] == ["acked late", "acked later"], outcome
    times = [float(line.split()[2]) for line in result.stdout.splitlines() if line.startswith("acked ")]
    for host in "ab":
        seen = check(lab, host, "held")
        assert seen["findings"] == []
        values = seen["values"]
        late = [f"late-{i:03d}" for i in range(50)]
        assert values[:80] == expected("first", range(3), 10) + late
        assert Counter(values[80:]) == Counter(["later", *expected("b", range(20), 10)])
        assert [v for v in values if v.startswith("b-")] == expected("b", range(20), 10)
    print(
        f"\ncut-off host a on NFSv3: host b waited for the lock while a was away ({waited:.1f} s); "
        f"its first append came {times[0] - back_at:.1f} s after a was back"
    )


MAINTAIN = r"""
import subprocess, sys, time
runs = 0
deadline = time.monotonic() + float(sys.argv[2])
while time.monotonic() < deadline:
    for args in (["recover", "--deep", sys.argv[1]], ["retain", sys.argv[1], "--max-bytes", "60000", "--delete-delay", "0"]):
        done = subprocess.run([sys.executable, "-m", "kl_cli", "--root", ROOT, *args], capture_output=True, text=True)
        if done.returncode != 0:
            print("failed", args, done.returncode, done.stdout, done.stderr, flush=True)
            sys.exit(1)
    runs += 1
print("runs", runs, flush=True)
""".replace("ROOT", repr(ROOT))


def test_recover_and_retain_on_one_host_while_the_other_produces(lab):
    create(lab, "kept", segment_bytes=16384, max_message_bytes=4096)
    producer = lab.spawn_python("a", PRODUCER, "kept", "a", "150", "20")
    producer.wait_for_output("acked 5")
    maintainer = lab.spawn_python("b", MAINTAIN, "kept", "15")
    result, maintained = producer.wait(timeout=600), maintainer.wait(timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert maintained.returncode == 0, maintained.stdout[-2000:] + maintained.stderr[-2000:]
    assert int(maintained.stdout.split()[-1]) > 0
    seen = check(lab, "b", "kept")
    assert seen["findings"] == []
    values = seen["values"]
    assert values == sorted(values) and len(values) == len(set(values))
    first = values[0]
    assert values == [v for v in expected("a", range(150), 20) if v >= first], "a message after the log start is missing"


TAKE_TURNS = r"""
import fcntl, os, sys, time, kl
from kl.log.locks import lock_file
from kl.log.state import read_state
root = kl.Root(ROOT)
log = root.log("turns", 0)
producer, consumer = kl.Producer(root), kl.Consumer(root)
turn = os.open(ROOT + "/turn", os.O_RDWR | os.O_CREAT)
late = 0
for r in range(int(sys.argv[2])):
    fcntl.lockf(turn, fcntl.LOCK_EX)
    if sys.argv[1] == "a":  # what a plain consumer reaches, against the record read under a lock
        reached = max([batch.next_offset for batch in consumer.consume("turns")], default=0)
        fd = os.open(log.state_path, os.O_RDONLY)
        lock_file(fd, log.state_path, 30, shared=True)
        late += reached != read_state(log.state_path).log_end_offset
        os.close(fd)
    producer.send_batch("turns", [b"%s%d" % (sys.argv[1].encode(), r)], partition=0)
    fcntl.lockf(turn, fcntl.LOCK_UN)
    time.sleep(0.001)
print("late", late, flush=True)
""".replace("ROOT", repr(ROOT))


def test_a_consumer_sees_what_the_other_host_just_published(lab):
    """Hosts take turns appending; each time, host a's consumer must reach the log end
    that the state record holds.  Without a lock on the record, NFSv3 (no change
    attribute) served host a an old end in about half the turns, for up to a minute."""
    create(lab, "turns")
    rounds = 50
    b = lab.spawn_python("b", TAKE_TURNS, "b", str(rounds))
    a = lab.spawn_python("a", TAKE_TURNS, "a", str(rounds))
    result_a, result_b = a.wait(timeout=600), b.wait(timeout=600)
    assert result_b.returncode == 0, result_b.stderr[-2000:]
    assert result_a.returncode == 0, result_a.stderr[-2000:]
    assert result_a.stdout.split() == ["late", "0"]


MEMBER = r"""
import signal, sys, time, kl
member = kl.GroupConsumer(
    kl.Root(ROOT, lock_timeout=300), sys.argv[2], [sys.argv[1]], poll_interval=0.2, session_timeout=3, auto_commit_interval=0.2,
    on_lost=lambda topic, partition, why: print("lost", partition, why, flush=True),
)
signal.signal(signal.SIGTERM, lambda *_: member.stop())
print("joined", member.member_id, flush=True)
for record in member:
    print("m", record.partition, record.offset, record.value.decode(), flush=True)
    time.sleep(0.01)
member.close()
print("left", flush=True)
""".replace("ROOT", repr(ROOT))

SEND = r"""
import sys, kl
producer = kl.Producer(kl.Root(ROOT))
tag, count = sys.argv[2], int(sys.argv[3])
for p in range(4):
    producer.send_batch(sys.argv[1], [b"%s-%d-%d" % (tag.encode(), p, i) for i in range(count)], partition=p)
""".replace("ROOT", repr(ROOT))


def delivered(*members) -> Counter:
    return Counter(line.split()[3] for m in members for line in m.output().splitlines() if line.startswith("m "))


def wait_until(condition, what, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what() if callable(what) else what}"
        time.sleep(0.1)


@pytest.mark.parametrize("lab", ["4.2"], indirect=True)
def test_a_group_on_two_hosts_replaces_a_host_cut_off_before_its_nfs_lease_ran_out(lab):
    create(lab, "shared", partitions=4)
    assert lab.python("a", SEND, "shared", "first", "50").returncode == 0
    members = {host: lab.spawn_python(host, MEMBER, "shared", "nfs") for host in "ab"}
    for member in members.values():
        member.wait_for_output("joined")
    first = {f"first-{p}-{i}" for p in range(4) for i in range(50)}
    wait_until(lambda: all(delivered(m) for m in members.values()), "both hosts to consume")
    wait_until(lambda: set(delivered(*members.values())) >= first, "the first messages")
    shares = {host: {line.split()[1] for line in m.output().splitlines() if line.startswith("m ")} for host, m in members.items()}
    lab.disconnect("a")
    cut_at = time.monotonic()
    assert lab.python("b", SEND, "shared", "second", "50").returncode == 0
    second = {f"second-{p}-{i}" for p in range(4) for i in range(50)}
    wait_until(lambda: set(delivered(members["b"])) >= second, "host b to take over every partition", timeout=60)
    took_over = time.monotonic() - cut_at
    lab.reconnect("a")
    wait_until(
        lambda: "lost" in members["a"].output() or members["a"].poll() is not None,
        lambda: f"host a to notice: {members['a'].result().stdout[-300:]!r} {members['a'].result().stderr[-2000:]!r}",
    )
    for member in members.values():
        member.signal(signal.SIGTERM)
    results = {host: m.wait(timeout=120) for host, m in members.items()}
    assert results["b"].returncode == 0, results["b"].stderr[-2000:]
    counts = delivered(*members.values())
    assert set(counts) == first | second
    print(
        f"\ngroup on NFS: host a (partitions {sorted(shares['a'])}) cut off; host b had all 4 after {took_over:.1f} s "
        f"(session timeout 3 s, NFS lease 10 s); {sum(counts.values()) - len(counts)} duplicates; "
        f"host a: {[line for line in results['a'].stdout.splitlines() if line.startswith('lost')][:2]}"
    )


RECEIVED = r"""
def received():  # bytes this host's READs got from the server so far (its one NFS mount)
    mine = False
    for line in open("/proc/self/mountstats"):
        if line.startswith("device "):
            mine = " mounted on MOUNT " in line
        elif mine and line.strip().startswith("READ:"):
            return int(line.split()[5])
    return 0
""".replace("MOUNT", nfslab.MOUNT)

READS_OF_AN_APPEND = r"""
import os, sys, time, kl
topic, go = sys.argv[1], sys.argv[2]
RECEIVED
producer = kl.Producer(kl.Root(ROOT, lock_timeout=300))
producer.send_batch(topic, [b"b"], partition=0)  # opens and keeps the partition's files
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.01)
before = received()
producer.send_batch(topic, [b"b"], partition=0)
print("received", received() - before, flush=True)
""".replace("ROOT", repr(ROOT)).replace("RECEIVED", RECEIVED)


@pytest.mark.parametrize("lab", ["4.2"], indirect=True)
def test_an_append_after_another_hosts_reads_nothing_of_the_segment_from_the_server(lab):
    """A writer writes its segment past the page cache (``Segment.past_page_cache``).  A
    buffered append that ends inside a page the client does not hold (here: another host
    appended meanwhile) reads that page from the server first, one more round trip:
    here the 3.9 KB host a put there.  What the append may read is the state record's
    532 bytes, a few times."""
    create(lab, "pages")
    go = lab.directory / "go-pages"
    b = lab.spawn_python("b", READS_OF_AN_APPEND, "pages", str(go))
    b.wait_for_output("ready", timeout=300)
    done = lab.python("a", f"import kl; kl.Producer(kl.Root({ROOT!r})).send_batch('pages', [b'a' * 3900], partition=0)")
    assert done.returncode == 0, done.stderr[-2000:]
    go.touch()
    result = b.wait(timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    received = int(result.stdout.split()[-1])
    assert 0 < received < 3900, result.stdout


READS_TWICE = r"""
import sys, kl
RECEIVED
root = kl.Root(ROOT)
kl.Producer(root).send_batch(sys.argv[1], [b"%05d" % i * 10 for i in range(1000)], partition=0)
for _ in range(2):
    before = received()
    values = [v for batch in kl.Consumer(root).consume(sys.argv[1], values_only=True) for v in batch.messages]
    print("read", len(values), "received", received() - before, "of", root.log(sys.argv[1], 0).log_end_offset, flush=True)
""".replace("ROOT", repr(ROOT)).replace("RECEIVED", RECEIVED)


@pytest.mark.parametrize("lab", ["4.2"], indirect=True)
def test_a_reader_reads_past_its_hosts_page_cache(lab):
    """Readers read segments as writers write them, past the page cache
    (``Log.open_segment``): a read of what this host's writer just appended, and the
    same read again, both get the bytes from the server.  Through the page cache a
    follower on the writer's host read a page of zeros where the other host had
    published a batch, in about one kill -9 hand-over of six."""
    create(lab, "twice")
    done = lab.python("b", READS_TWICE, "twice")
    assert done.returncode == 0, done.stderr[-2000:]
    for line in done.stdout.splitlines():
        _, count, _, received, _, size = line.split()
        assert int(count) == 1000 and int(received) >= int(size) > 50_000, done.stdout
