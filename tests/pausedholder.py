"""The paused-holder scenario on the NFS lab (``nfslab``), for tests/test_nfs_fencing.py
and scripts/nfs-paused-holder.

Host a's producer appends a few batches, then stops itself (SIGSTOP: a GC pause, a frozen
VM) at one step of its next append, holding the partition lock; host a is cut off from
the server; host b waits out a's lease and appends batches, each acknowledged; host a
comes back and its producer is continued, and tries one batch more.  Then both hosts
read the log.  ``STEPS`` names where a stops:

* ``lock``: just after it took the partition lock, before it read anything;
* ``mark``: after its "append under way" mark reached the server;
* ``write``: after its data write (the data in its page cache);
* ``fsync``: inside the fsync of its data, which hangs as the host is cut off just before
  it (a thread stops the process meanwhile);
* ``publish``: with its data fsynced, just before it publishes (before its last check).
"""

from __future__ import annotations

import json
import signal
import time
from dataclasses import dataclass, field

import nfslab

ROOT = f"{nfslab.MOUNT}/root"
STEPS = ("lock", "mark", "write", "fsync", "publish")
FIRST, LATE, B_BATCHES, B_SIZE = 3, 50, 10, 5

PAUSED = r"""
import os, signal, sys, threading, kl, kl.log, kl.log.segment
topic, step, late = sys.argv[1], sys.argv[2], int(sys.argv[3])
producer = kl.Producer(kl.Root(ROOT, lock_timeout=300))
for b in range(FIRST):
    producer.send_batch(topic, [b"a-%06d-%03d" % (b, i) for i in range(10)], partition=0)
    print("acked first", b, flush=True)
stopped = []

def stop():
    if not stopped:
        stopped.append(step)
        print("stopping", step, flush=True)
        signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)  # stops this thread before it goes on

def hook(cls, name, before):
    real = getattr(cls, name)
    def hooked(*args, **kwargs):
        if before:
            stop()
        result = real(*args, **kwargs)
        if not before:
            stop()
        return result
    setattr(cls, name, hooked)

if step == "lock":
    hook(kl.log.Log, "writable_state", before=True)
elif step == "mark":
    hook(kl.log.Log, "_announce", before=False)
elif step == "write":
    hook(kl.log.segment.Segment, "append", before=False)
elif step == "publish":
    hook(kl.log.Log, "publish", before=True)
elif step == "fsync":
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])
    real_fsync = os.fsync
    def fsync(fd):
        if not stopped and os.readlink(f"/proc/self/fd/{fd}").endswith(".kl"):
            stopped.append(step)
            print("stopping", step, flush=True)
            signal.sigwait([signal.SIGUSR1])  # the host is cut off now: the fsync hangs
            threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGSTOP)).start()
        return real_fsync(fd)
    os.fsync = fsync
try:
    producer.send_batch(topic, [b"late-%03d-%s" % (i, b"x" * 100) for i in range(late)], partition=0)
    print("acked late", flush=True)
except kl.KlError as e:
    print("error late", e, flush=True)
try:
    producer.send_batch(topic, [b"later"], partition=0)
    print("acked later", flush=True)
except kl.KlError as e:
    print("error later", e, flush=True)
""".replace("ROOT", repr(ROOT)).replace("FIRST", str(FIRST))

PRODUCER = r"""
import sys, kl
topic, batches, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
producer = kl.Producer(kl.Root(ROOT, lock_timeout=300))
for b in range(batches):
    producer.send_batch(topic, [b"b-%06d-%03d" % (b, i) for i in range(size)], partition=0)
    print("acked", b, flush=True)
producer.close()
""".replace("ROOT", repr(ROOT))

CHECK = r"""
import json, sys, kl
from kl.log.recovery import recover
root = kl.Root(ROOT)
log = root.log(sys.argv[1], 0)
values = [m.value.decode() for batch in kl.Consumer(root).consume(sys.argv[1]) for m in batch.messages]
report = recover(log, deep=True, dry_run=True)
print(json.dumps({"values": values, "findings": [[f.kind, f.reason] for f in report.findings],
                  "segments": len(log.segments())}))
""".replace("ROOT", repr(ROOT))


@dataclass
class Outcome:
    """What one run came to."""

    step: str
    a_said: list[str]
    """Host a's lines about its late batch and the one after ("acked late", "error later ...")."""
    b_acked: int
    lost: int
    """Lines host b was told were appended that the log does not hold (on either host)."""
    problems: list[str] = field(default_factory=list)
    """Everything else that is wrong: a torn batch, foreign lines, a's report untrue, findings."""
    took_over: float = 0.0
    segments: int = 0


def create(lab: nfslab.Lab, topic: str, prelude: str = "") -> None:
    done = lab.python("a", f"{prelude}import kl; kl.Root({ROOT!r}).create_topic({topic!r})")
    if done.returncode:
        raise nfslab.LabError(done.stderr)


def run(lab: nfslab.Lab, topic: str, step: str, prelude: str = "", *, freeze: bool = False) -> Outcome:
    """One run of the scenario, stopping host a at ``step``, on a new ``topic``
    (``prelude``: Python run first in each guest process, e.g. to import another kl).
    With ``freeze``, host a's whole virtual machine is paused instead of cut off (its NFS
    client renews nothing meanwhile): a frozen VM, not a lost network."""
    if freeze and step == "fsync":
        raise ValueError("the fsync step needs a host cut off (its fsync hangs), not a frozen one")
    create(lab, topic, prelude)
    a = lab.spawn_python("a", prelude + PAUSED, topic, step, str(LATE))
    a.wait_for_output("stopping", timeout=120)
    time.sleep(0.5)  # the SIGSTOP has landed
    (lab.freeze if freeze else lab.disconnect)("a")
    cut_at = time.monotonic()
    if step == "fsync":
        a.signal(signal.SIGUSR1)
    b = lab.spawn_python("b", prelude + PRODUCER, topic, str(B_BATCHES), str(B_SIZE))
    b_result = b.wait(timeout=300)
    took_over = time.monotonic() - cut_at
    b_acked = [int(line.split()[1]) for line in b_result.stdout.splitlines() if line.startswith("acked ")]
    (lab.thaw if freeze else lab.reconnect)("a")
    a.signal(signal.SIGCONT)
    a_result = a.wait(timeout=300)
    a_said = [line for line in a_result.stdout.splitlines() if line.split()[0] in ("acked", "error") and "first" not in line]
    seen = {}
    for host in "ab":
        done = lab.python(host, prelude + CHECK, topic, timeout=300)
        if done.returncode:
            raise nfslab.LabError(f"the check on host {host} failed: {done.stderr[-2000:]}")
        seen[host] = json.loads(done.stdout)
    outcome = Outcome(step, a_said, len(b_acked) * B_SIZE, 0, took_over=took_over, segments=seen["b"]["segments"])
    if b_result.returncode:
        outcome.problems.append(f"host b's producer failed: {b_result.stderr[-500:]}")
    expected_late = [f"late-{i:03d}-{'x' * 100}" for i in range(LATE)]
    for host, view in seen.items():
        values = view["values"]
        b_lines = {f"b-{n:06d}-{i:03d}" for n in b_acked for i in range(B_SIZE)}
        outcome.lost = max(outcome.lost, len(b_lines - set(values)))
        outcome.problems += _whole_batches(host, values, a_said)
        findings = [f"host {host}: recover finds {kind}: {reason}" for kind, reason in view["findings"] if kind != "LONG_FILE"]
        outcome.problems += findings  # (a fenced writer's late bytes past a closed segment's end are LONG_FILE)
        held = values.count(expected_late[0])
        if ("acked late" in a_said) != (held == 1):
            outcome.problems.append(f"host {host}: host a said {a_said[:1]} but the log holds its late batch {held} times")
    if seen["a"]["values"] != seen["b"]["values"]:
        outcome.problems.append("the hosts read different logs")
    return outcome


def _whole_batches(host: str, values: list[str], a_said: list[str]) -> list[str]:
    """The log must be: a's first batches, then whole batches of b's and a's, each once."""
    problems = []
    first = [f"a-{b:06d}-{i:03d}" for b in range(FIRST) for i in range(10)]
    if values[: len(first)] != first:
        problems.append(f"host {host}: a's first batches are not at the start")
    rest = values[len(first) :]
    position = 0
    while position < len(rest):
        value = rest[position]
        if value.startswith("b-"):
            batch = [f"{value[:8]}-{i:03d}" for i in range(B_SIZE)]
        elif value.startswith("late-"):
            batch = [f"late-{i:03d}-{'x' * 100}" for i in range(LATE)]
        elif value == "later":
            batch = ["later"]
        else:
            problems.append(f"host {host}: a foreign line at {position}: {value[:40]!r}")
            break
        if rest[position : position + len(batch)] != batch:
            problems.append(f"host {host}: a torn batch at {position}: {value[:40]!r}")
            break
        position += len(batch)
    if ("acked later" in a_said) != ("later" in rest):
        holds = "holds" if "later" in rest else "lacks"
        problems.append(f"host {host}: host a said {a_said[1:]} of its last batch, and the log {holds} it")
    return problems
