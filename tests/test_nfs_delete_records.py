"""DeleteRecords' cut on NFS (``Log.start_within``, as ``kl serve --kafka`` runs it): one
host moves the log start inside segments while another host produces; nothing after the
start is lost, nothing before it read, and no writer is fenced.  In the NFS lab's own run
(scripts/test: beside the other lab tests, on the labs they boot)."""

from __future__ import annotations

import json

import nfslab
import pytest

NFS_ROOT = f"{nfslab.MOUNT}/root"
"""The root tests/test_nfs.py uses too (this test's topic is its own)."""
NFS_PRODUCER = r"""
import sys, kl
producer = kl.Producer(kl.Root(ROOT, lock_timeout=300))
for b in range(int(sys.argv[1])):
    producer.send_batch("cut", [b"%06d-%02d" % (b, i) for i in range(10)], partition=0)
    print("acked", b, flush=True)
producer.close()
""".replace("ROOT", repr(NFS_ROOT))
NFS_CUTTER = r"""
import sys, time, kl
log = kl.Root(ROOT, lock_timeout=300).log("cut", 0)
cuts = 0
deadline = time.monotonic() + float(sys.argv[1])
while time.monotonic() < deadline:
    with log.locked():  # as DeleteRecords: ten records short of the end
        start, end = log.kafka_offsets()
        if end - 10 > start:
            log.start_within(log.kafka_position(end - 10).offset)
            cuts += 1
    time.sleep(0.05)
print("cuts", cuts, log.kafka_offsets()[0], flush=True)
""".replace("ROOT", repr(NFS_ROOT))
NFS_CHECK = r"""
import json, kl
from kl.log.recovery import recover
root = kl.Root(ROOT)
values = [m.value.decode() for batch in kl.Consumer(root).consume("cut") for m in batch.messages]
report = recover(root.log("cut", 0), deep=True, dry_run=True)
print(json.dumps({"values": values, "findings": [f.reason for f in report.findings]}))
""".replace("ROOT", repr(NFS_ROOT))


@pytest.mark.skipif(nfslab.unavailable() is not None, reason=str(nfslab.unavailable()))
def test_log_starts_moved_inside_segments_on_one_nfs_host_while_the_other_produces(lab):
    done = lab.python("a", f"import kl; kl.Root({NFS_ROOT!r}).create_topic('cut', kl.TopicConfig(segment_bytes=8192, "
                           "max_message_bytes=4096))")  # fmt: skip
    assert done.returncode == 0, done.stderr
    producer = lab.spawn_python("a", NFS_PRODUCER, "150")
    producer.wait_for_output("acked 5")
    cutter = lab.spawn_python("b", NFS_CUTTER, "10")
    produced, cut = producer.wait(timeout=600), cutter.wait(timeout=600)
    assert produced.returncode == 0, produced.stderr[-2000:]
    assert cut.returncode == 0, cut.stdout[-2000:] + cut.stderr[-2000:]
    cuts, start = (int(x) for x in cut.stdout.split()[-2:])
    assert "never finished" not in produced.stderr + cut.stderr  # no hold left its append mark: no writer fenced
    assert cuts > 0 and start > 0
    done = lab.python("b", NFS_CHECK, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout)
    assert seen["findings"] == []
    everything = [f"{b:06d}-{i:02d}" for b in range(150) for i in range(10)]
    assert seen["values"] == everything[start:]  # nothing after the start lost, nothing before it read
