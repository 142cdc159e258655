"""kl on NFS with three client hosts, each its own kernel (the lab in ``nfslab``, NFSv4.2).

What only separate kernels make honest: a client host reset (its virtual machine killed,
a power cut, and booted again) in the middle of an append, its batch on the server but
not published; a host whose clock is minutes ahead (host c) in a consumer group and in
retention (kl reads "now" off the NFS server's clock, not the host's); and three hosts
appending to one partition at once with a follower on each.  One lab for the whole file (booting one is
most of its time); the data sizes are small because a guest computes 15-20 times slower
than this machine.
"""

from __future__ import annotations

import itertools
import json
import signal
import time
from collections import Counter

import nfslab
import pytest
from test_nfs import MEMBER, PRODUCER, ROOT, SEND, acked, check, create, delivered, expected, wait_until

pytestmark = [
    pytest.mark.skipif(nfslab.unavailable() is not None, reason=str(nfslab.unavailable())),
    pytest.mark.parametrize("lab", ["4.2"], indirect=True),  # hosts a, b and c, c's clock SKEW s ahead (conftest)
]

SKEW = 300
"""Seconds host c's clock is ahead of the others' (and of the NFS server's)."""


VICTIM = (
    r"""
import os, sys, time
# Appends in a loop (PRODUCER below); the append of batch N stops once its bytes are
# fsynced to the server, before it publishes them: where the power cut comes.
real_fsync, data_fsyncs = os.fsync, []
def fsync(fd):
    real_fsync(fd)
    if os.readlink(f"/proc/self/fd/{fd}").endswith(".kl"):
        data_fsyncs.append(fd)
        if len(data_fsyncs) == int(sys.argv[5]) + 1:
            print("written", flush=True)
            time.sleep(3600)
os.fsync = fsync
"""
    + PRODUCER
)


def test_a_host_reset_in_the_middle_of_an_append_loses_nothing_acknowledged_and_produces_again_once_back(lab):
    create(lab, "reset")
    size, paused_at = 20, 10
    victim = lab.spawn_python("a", VICTIM, "reset", "a", "100000", str(size), str(paused_at))
    victim.wait_for_output("written", timeout=180)
    other = lab.spawn_python("b", PRODUCER, "reset", "b", "20", str(size))
    other.wait_for_output("ready", timeout=180)
    time.sleep(1)
    assert acked(other.output()) == [], "host b appended while host a held the partition's lock"
    started = time.monotonic()
    lab.reset("a")  # a power cut: host a's processes, page cache and NFS client state are gone
    rebooted = time.monotonic() - started
    before_back = len(acked(other.output()))  # the lease ran out during the reboot, or the reboot freed the lock
    killed = victim.result()
    assert killed.returncode == -signal.SIGKILL and acked(killed.stdout) == list(range(paused_at))
    again = lab.spawn_python("a", PRODUCER, "reset", "A", "10", str(size))  # host a, back, appends again
    for done in (other.wait(timeout=300), again.wait(timeout=300)):
        assert done.returncode == 0 and done.stdout.endswith("done\n"), done.stderr[-2000:]
    for host in "bc":
        seen = check(lab, host, "reset")
        assert seen["findings"] == []
        values = seen["values"]
        # Batch 10 of host a reached the server but was never published: the next append
        # (host b's) went where it lay, so it is nowhere; everything acknowledged is there once.
        assert values[: paused_at * size] == expected("a", range(paused_at), size)
        assert Counter(values[paused_at * size :]) == Counter(expected("b", range(20), size) + expected("A", range(10), size))
        for tag, count in (("b", 20), ("A", 10)):  # each producer's batches in its order
            assert [v for v in values if v.startswith(tag + "-")] == expected(tag, range(count), size)
    print(
        f"\nreset of host a with its batch {paused_at} on the server, unpublished: reboot {rebooted:.1f} s"
        f" (host b had appended {before_back} batches by then);"
        f" {len(values)} messages, exactly those acknowledged"
    )


FOLLOW = r"""
import sys, kl
total = int(sys.argv[2])  # what the producers will append: a duplicate would push the last one out
print("following", flush=True)
stream = kl.Consumer(kl.Root(ROOT)).stream(sys.argv[1], 0, 0, idle_timeout=120, poll_interval=0.05)
for seen, m in enumerate(stream, 1):
    print(m.value.decode(), flush=False)
    if seen == total:
        break
""".replace("ROOT", repr(ROOT))


def test_three_hosts_append_to_one_partition_and_a_follower_on_each_sees_the_log_exactly_once(lab):
    create(lab, "three")
    count, size = 25, 10
    followers = {host: lab.spawn_python(host, FOLLOW, "three", str(3 * count * size)) for host in "abc"}
    for follower in followers.values():
        follower.wait_for_output("following", timeout=180)
    started = time.monotonic()
    producers = {host: lab.spawn_python(host, PRODUCER, "three", host, str(count), str(size)) for host in "abc"}
    for producer in producers.values():
        done = producer.wait(timeout=600)
        assert done.returncode == 0 and done.stdout.endswith("done\n"), done.stderr[-2000:]
    seconds = time.monotonic() - started
    seen = check(lab, "a", "three")
    assert seen["findings"] == []
    log = seen["values"]
    assert Counter(log) == Counter(v for host in "abc" for v in expected(host, range(count), size))
    for host in "abc":  # each host's batches in the order it appended them, each whole
        assert [v for v in log if v.startswith(host + "-")] == expected(host, range(count), size)
    for host, follower in followers.items():
        followed = follower.wait(timeout=600)
        assert followed.returncode == 0, followed.stderr[-2000:]
        assert followed.stdout.splitlines()[1:] == log, f"the follower on host {host} saw another sequence"
    turns = sum(1 for x, y in itertools.pairwise(log[::size]) if x[0] != y[0])
    print(
        f"\n3 hosts appending {len(log)} messages to one partition in {seconds:.1f} s ({turns} changes of host"
        f" between {3 * count} batches); 3 followers saw the log exactly"
    )


SETTLED = r"""
import json, sys, time, kl.groups
# Wait until the partitions of the topic are owned by exactly the members named, each
# owning some; print the owners and each member's heartbeat age as this host sees it.
topic, members = sys.argv[1], set(sys.argv[2:])
while True:
    info = kl.groups.describe(ROOT, "skewed")
    owners = {p.partition: p.owner for p in info.partitions if p.topic == topic}
    if len(owners) == 4 and set(owners.values()) == members:
        break
    time.sleep(0.1)
print(json.dumps({"owners": owners, "ages": {m.id: m.beat_age_ms for m in info.members}}))
""".replace("ROOT", repr(ROOT))


def shares(member) -> set[int]:
    """The partitions ``member`` delivered messages of."""
    return {int(line.split()[1]) for line in member.output().splitlines() if line.startswith("m ")}


def settled(lab, host: str, *members) -> dict:
    """The owners once ``members`` share the topic's partitions (seen from ``host``), and
    the heartbeat ages seen from there."""
    ids = [m.wait_for_output("joined", timeout=180).split()[1] for m in members]
    done = lab.python(host, SETTLED, "grouped", *ids, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_a_group_member_on_a_host_whose_clock_is_minutes_off_shares_and_hands_over_partitions(lab):
    create(lab, "grouped", partitions=4)
    sent = set()

    def send(tag: str, count: int = 20) -> set[str]:
        assert lab.python("a", SEND, "grouped", tag, str(count)).returncode == 0
        new = {f"{tag}-{p}-{i}" for p in range(4) for i in range(count)}
        sent.update(new)
        return new

    a, c = lab.spawn_python("a", MEMBER, "grouped", "skewed"), lab.spawn_python("c", MEMBER, "grouped", "skewed")
    for host in "ca":  # a heartbeat's age is judged by the file server's clock, whichever host asks
        ages = settled(lab, host, a, c)["ages"]
        assert len(ages) == 2 and all(0 <= age < 30_000 for age in ages.values()), f"beat ages seen from host {host}: {ages}"
    first = send("first")
    wait_until(lambda: set(delivered(a, c)) >= first, "the first messages")
    split = {"a": sorted(shares(a)), "c": sorted(shares(c))}
    assert split["a"] and split["c"], split
    c.signal(signal.SIGTERM)  # host c's member leaves: host a takes every partition
    left = c.wait(timeout=120)
    assert left.returncode == 0 and left.stdout.endswith("left\n"), left.stderr[-2000:]
    second = send("second")
    wait_until(lambda: set(delivered(a)) >= second, "host a to take every partition")
    c2 = lab.spawn_python("c", MEMBER, "grouped", "skewed")  # host c joins again and takes its share
    settled(lab, "c", a, c2)
    third = send("third")
    wait_until(lambda: set(delivered(a, c2)) >= third, "the third messages")
    assert shares(c2), "host c took no share back"
    a.kill()  # host a's member is killed: host c takes every partition
    assert a.wait(timeout=60).returncode == -signal.SIGKILL
    fourth = send("fourth")
    wait_until(lambda: set(delivered(c2)) >= fourth, "host c to take every partition")
    assert {int(v.split("-")[1]) for v in delivered(c2) if v.startswith("fourth-")} == {0, 1, 2, 3}
    c2.signal(signal.SIGTERM)
    assert c2.wait(timeout=120).returncode == 0
    counts = delivered(a, c, c2)
    assert set(counts) == sent
    print(
        f"\ngroup with host c {SKEW} s ahead: shares at first {split}; "
        f"{len(sent)} messages delivered, {sum(counts.values()) - len(counts)} twice (at least once: hand-overs)"
    )


RETAIN = r"""
import sys
from kl_cli.main import main
sys.argv = ["kl", "--root", ROOT, "retain", "--json", *sys.argv[1:]]
main()
""".replace("ROOT", repr(ROOT))

STAMPS = r"""
import json, sys, kl
root = kl.Root(ROOT)
print(json.dumps({m.value.decode(): m.timestamp for b in kl.Consumer(root).consume(sys.argv[1]) for m in b.messages}))
""".replace("ROOT", repr(ROOT))

SET_ASIDE = r"""
import os, sys
print(json.dumps(sorted(n for n in os.listdir(sys.argv[1]) if n.endswith(".deleted"))))
""".replace("json", "__import__('json')")


def retain(lab, host: str, *args: str) -> dict:
    done = lab.python(host, RETAIN, "aged", *args)
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    return json.loads(done.stdout)


def test_retention_by_age_is_the_same_whichever_host_runs_it_and_a_skewed_producer_stamps_its_own_time(lab):
    # One batch per segment: a's three, then c's two (stamped SKEW s ahead), then a's last (active).
    create(lab, "aged", segment_bytes=600, max_message_bytes=600)
    size = 10
    for host, tag, count in (("a", "a", 3), ("c", "c", 2), ("a", "A", 1)):  # 340 bytes a batch
        done = lab.python(host, PRODUCER, "aged", tag, str(count), str(size))
        assert done.returncode == 0, done.stderr[-2000:]
    stamps = json.loads(lab.python("b", STAMPS, "aged").stdout)
    assert len(stamps) == 6 * size
    a_newest = max(stamps[v] for v in expected("A", range(1), size))
    c_oldest = min(stamps[v] for v in expected("c", range(2), size))
    assert c_oldest - a_newest > (SKEW - 60) * 1000, "host c's messages carry host c's clock"
    # Minutes younger than the skew: nothing is old enough, by the host a clock or by host c's.
    for host in "ca":
        report = retain(lab, host, "--max-age", f"{SKEW // 2}s")
        assert report["deleted"] == [] and report["log_start_offset"] == 0, f"host {host} deleted young segments: {report}"
    time.sleep(6)  # 3 s past the age limit: room for the guests' clocks to differ from the server's by a little
    # Older than 3 s: a's first three segments go; c's, stamped in the future, stay (and so
    # does all after them), whichever host runs it; set-aside segments wait out the delay.
    report = retain(lab, "c", "--max-age", "3s", "--delete-delay", "60")
    a_segments = [batch["base_offset"] for batch in report["deleted"]]
    assert len(a_segments) == 3 and report["log_start_offset"] > a_segments[-1], report
    assert report["unlinked"] == 0, f"host c unlinked set-aside segments before the delete delay: {report}"
    report_a = retain(lab, "a", "--max-age", "3s", "--delete-delay", "60")
    assert report_a["deleted"] == [] and report_a["unlinked"] == 0, report_a
    set_aside = json.loads(lab.python("b", SET_ASIDE, f"{ROOT}/aged/0").stdout)
    assert len(set_aside) == 3, set_aside
    assert retain(lab, "c", "--max-age", "3s", "--delete-delay", "0")["unlinked"] == 3
    seen = check(lab, "b", "aged")
    assert seen["findings"] == []
    assert seen["values"] == expected("c", range(2), size) + expected("A", range(1), size)
    print(f"\nretention: host c's messages stamped {(c_oldest - a_newest) / 1000:.0f} s after host a's; "
          f"{len(report['deleted'])} segments deleted by age from host c, none early, none unlinked before the delay")


RETRIER = r"""
import json, sys, kl
from kl.errors import OutOfOrderSequence
from kl.log.messageset import frame
from kl.log.producers import Batch
from kl.log.validate import Checked
log = kl.Root(ROOT, lock_timeout=300).log(sys.argv[1], 0)
offsets = []
for s in range(int(sys.argv[2]), int(sys.argv[3])):
    try:
        batch = Checked.framed(frame([b"i%04d" % s], 1700000000000), 1)
        offsets.append(log.append_counted(batch, fsync=True, producer=Batch(77, 0, s, s))[1])
    except OutOfOrderSequence:  # more than five behind what another host appended: as Kafka answers
        offsets.append(None)
print(json.dumps(offsets), flush=True)
""".replace("ROOT", repr(ROOT))


def test_one_idempotent_producers_batches_retried_from_other_hosts_at_once_are_appended_once_in_order(lab):
    """Host a sends an idempotent producer's batches 0-9; hosts b and c both send 5-29 at
    once, as retries racing one another across daemons on different hosts: the
    partition's producer journal, shared through NFS under the partition lock, appends
    each once, in order, and answers every retry with its offset (a host more than five
    batches behind the other is refused, as Kafka refuses such a retry)."""
    create(lab, "retried")
    done = lab.python("a", RETRIER, "retried", "0", "10")
    assert done.returncode == 0 and json.loads(done.stdout) == list(range(10)), done.stderr[-2000:]
    senders = {host: lab.spawn_python(host, RETRIER, "retried", "5", "30") for host in "bc"}
    answered = {}
    for host, sender in senders.items():
        done = sender.wait(timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        assert "append under way" not in done.stderr  # a retry answered leaves no append unfinished
        answered[host] = json.loads(done.stdout.splitlines()[-1])
        assert all(k in (None, s) for s, k in enumerate(answered[host], start=5)), f"host {host}: {answered[host]}"
    # A host is refused a batch only once the other is more than five ahead: that one answered it.
    assert [b if b is not None else c for b, c in zip(answered["b"], answered["c"], strict=True)] == list(range(5, 30))
    seen = check(lab, "b", "retried")
    assert seen["findings"] == []
    assert seen["values"] == [f"i{s:04d}" for s in range(30)]
