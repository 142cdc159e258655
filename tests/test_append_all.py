"""``append_all``: sets appended to several partitions at once, all published or none
(``kl.log.log``), and the keyed ``send_batch`` built on it."""

from __future__ import annotations

import dataclasses
import multiprocessing

import pytest

import kl
from kl.errors import StorageError
from kl.log.log import append_all
from kl.log.message import encode
from kl.log.validate import Checked

from faultlib import failing_writes, fresh_log, read_log, snapshot

TS = 1_700_000_000_000
CONFIG = kl.TopicConfig(partitions=4, segment_bytes=2048, max_message_bytes=2048, flush_messages=0, flush_ms=0)


def frame(*values: bytes) -> Checked:
    return Checked.framed(b"".join(encode(v, timestamp=TS) for v in values), len(values))


@pytest.mark.parametrize("fill", [0, 1500], ids=["in-place", "rolling"])
def test_a_failed_write_in_one_partition_publishes_none_and_leaves_every_file_as_it_was(root, monkeypatch, fill):
    """Partition 3 fails after 0, 1 and 2 were written (in place, or into new segments
    when ``fill`` makes each append roll): none is published, no byte or file is left."""
    root.create_topic("t", CONFIG)
    logs = [root.log("t", p) for p in range(4)]
    for p, log in enumerate(logs):
        log.append(frame(b"before-%d" % p + b"." * fill))
    before = [(snapshot(log.directory), log.state()) for log in logs]
    failing_writes(monkeypatch, logs[3].directory)
    with pytest.raises(StorageError, match="no space left"):
        append_all([(log, frame(b"x" * 600)) for log in logs])
    assert [(snapshot(log.directory), log.state()) for log in logs] == before
    monkeypatch.undo()
    offsets = append_all([(log, frame(b"after-%d" % p)) for p, log in enumerate(logs)])
    for p, log in enumerate(logs):
        assert [m.value for m in read_log(fresh_log(log))] == [b"before-%d" % p + b"." * fill, b"after-%d" % p]
        assert read_log(fresh_log(log), offsets[p])[0].value == b"after-%d" % p


def test_a_keyed_batch_over_partitions_goes_in_whole_or_not_at_all(root, monkeypatch):
    root.create_topic("t", dataclasses.replace(CONFIG, segment_bytes=1 << 20, max_message_bytes=1 << 16))
    producer = kl.Producer(root)
    keys = [b"k%d" % i for i in range(40)]
    failing_writes(monkeypatch, root.log("t", producer.partition_of("t", keys[-1])).directory)
    with pytest.raises(StorageError):
        producer.send_batch("t", [b"v%d" % i for i in range(40)], keys)
    assert sum(root.log("t", p).log_end_offset for p in range(4)) == 0
    monkeypatch.undo()
    appended = producer.send_batch("t", [b"v%d" % i for i in range(40)], keys)
    assert sorted(a.partition for a in appended) == sorted({producer.partition_of("t", k) for k in keys})
    got = {(m.key, m.value) for p in range(4) for m in read_log(fresh_log(root.log("t", p)))}
    assert got == {(b"k%d" % i, b"v%d" % i) for i in range(40)}
    for a in appended:  # each report names its own append
        assert read_log(fresh_log(root.log("t", a.partition)), a.offset)[0].key is not None
        assert len(read_log(fresh_log(root.log("t", a.partition)), a.offset, a.next_offset - a.offset)) == a.count
    producer.close()


def _append_in_order(path: str, order: list[int], rounds: int) -> None:
    root = kl.Root(path, lock_timeout=30)
    logs = [root.log("t", p) for p in order]
    for i in range(rounds):
        append_all([(log, frame(b"%d-%d" % (order[0], i))) for log in logs])
    root.close()


def test_two_processes_taking_the_same_partitions_in_opposite_orders_never_wait_for_each_other(root):
    """Locks are taken in the order of their paths, whatever the order of the sets."""
    root.create_topic("t", dataclasses.replace(CONFIG, segment_bytes=1 << 20))
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_append_in_order, args=(root.path, order, 300)) for order in ([0, 1, 2, 3], [3, 2, 1, 0])]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
        assert worker.exitcode == 0
    for p in range(4):
        values = [m.value for m in read_log(fresh_log(root.log("t", p)), max_bytes=1 << 20)]
        assert sorted(values) == sorted([b"0-%d" % i for i in range(300)] + [b"3-%d" % i for i in range(300)])
