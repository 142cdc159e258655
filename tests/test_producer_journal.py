"""Idempotent producers' batches are appended once, by the partition's producer journal:
a retry through another handle, process or daemon answers where the batch went, a
writer killed between the journal and the publish leaves nothing that counts, and the
journal's damage, loss and growth are survived."""

from __future__ import annotations

import logging
import multiprocessing
import os

import pytest

import kl
import kl.log.log
from kl.errors import InvalidProducerEpoch, OutOfOrderSequence
from kl.log import producers
from kl.log.log import Log
from kl.log.messageset import frame
from kl.log.producers import Batch
from kl.log.recovery import recover
from kl.log.validate import Checked

TS = 1_700_000_000_000


def batch_of(*values: bytes) -> Checked:
    return Checked.framed(frame(list(values), TS), len(values))


def values(root: kl.Root, topic: str = "t") -> list[bytes]:
    log = kl.Root(root.path).log(topic, 0)
    return [msg.value for msg in log.messages(log.log_start_offset, log.log_end_offset)]


@pytest.fixture
def log(root) -> Log:
    root.create_topic("t", kl.TopicConfig(segment_bytes=4096, max_message_bytes=1024))
    return root.log("t", 0)


def other(root: kl.Root) -> Log:
    """The partition as another process (or daemon) opens it."""
    return kl.Root(root.path).log("t", 0)


def test_a_retry_answers_where_the_batch_went_through_any_handle(root, log, caplog):
    first = log.append_counted(batch_of(b"a", b"b"), producer=Batch(7, 0, 0, 1))
    second = log.append_counted(batch_of(b"c"), producer=Batch(7, 0, 2, 2))
    assert (first[1], second[1]) == (0, 2)
    assert other(root).append_counted(batch_of(b"a", b"b"), producer=Batch(7, 0, 0, 1)) == first
    assert other(root).append_counted(batch_of(b"c"), producer=Batch(7, 0, 2, 2)) == second
    assert values(root) == [b"a", b"b", b"c"]
    assert other(root).state().producer_serial == 2
    assert caplog.records == []


def test_sequences_that_skip_or_go_back_and_old_epochs_are_refused_and_nothing_is_appended(root, log):
    log.append_counted(batch_of(b"a"), producer=Batch(7, 3, 0, 0))
    with pytest.raises(OutOfOrderSequence, match="sent sequence 2, expected 1"):
        log.append_counted(batch_of(b"x"), producer=Batch(7, 3, 2, 2))
    with pytest.raises(InvalidProducerEpoch, match="epoch 2, older than its epoch 3"):
        other(root).append_counted(batch_of(b"x"), producer=Batch(7, 2, 1, 1))
    with pytest.raises(OutOfOrderSequence, match="began epoch 4 at sequence 5"):
        log.append_counted(batch_of(b"x"), producer=Batch(7, 4, 5, 5))
    log.append_counted(batch_of(b"b"), producer=Batch(7, 3, 1, 1))
    log.append_counted(batch_of(b"c"), producer=Batch(7, 4, 0, 0))  # a new epoch begins at 0
    with pytest.raises(InvalidProducerEpoch):
        other(root).append_counted(batch_of(b"b"), producer=Batch(7, 3, 1, 1))  # the old epoch's retry, too late
    assert values(root) == [b"a", b"b", b"c"]


def test_a_producer_new_to_the_partition_starts_anywhere_and_sequences_wrap(root, log):
    log.append_counted(batch_of(b"a"), producer=Batch(9, 0, producers.MAX_SEQUENCE - 1, producers.MAX_SEQUENCE))
    log.append_counted(batch_of(b"b", b"c"), producer=Batch(9, 0, 0, 1))
    assert other(root).append_counted(batch_of(b"b", b"c"), producer=Batch(9, 0, 0, 1))[1] == 1
    assert values(root) == [b"a", b"b", b"c"]


def test_plain_appends_between_idempotent_ones_disturb_nothing(root, log):
    log.append_counted(batch_of(b"a"), producer=Batch(1, 0, 0, 0))
    kl.Producer(kl.Root(root.path)).send_batch("t", [b"plain%d" % i for i in range(300)], partition=0)  # rolls too
    log.append_counted(batch_of(b"b"), producer=Batch(1, 0, 1, 1))
    assert other(root).append_counted(batch_of(b"a"), producer=Batch(1, 0, 0, 0))[1] == 0
    assert other(root).append_counted(batch_of(b"b"), producer=Batch(1, 0, 1, 1))[1] == 301
    assert len(values(root)) == 302 and len(log.segments()) > 1


def _killed_at(root_path: str, step: str) -> None:
    """Append producer 5's batch (sequence 0) and die by SIGKILL at ``step``."""
    log = kl.Root(root_path).log("t", 0)
    if step == "journaled":  # the journal's record written, the state not yet published
        log._publish_append = lambda *args, **kw: os.kill(os.getpid(), 9)  # type: ignore[method-assign]
    else:  # published, the answer not yet given
        publish = log._publish_append

        def publish_then_die(*args, **kw):
            publish(*args, **kw)
            os.kill(os.getpid(), 9)

        log._publish_append = publish_then_die  # type: ignore[method-assign]
    log.append_counted(batch_of(b"once"), producer=Batch(5, 0, 0, 0))


@pytest.mark.parametrize("step, stored", [("journaled", [b"before", b"once"]), ("published", [b"before", b"once"])])
def test_a_writer_killed_between_journal_and_publish_or_after_leaves_the_retry_appended_once(root, log, step, stored):
    log.append_counted(batch_of(b"before"), producer=Batch(4, 0, 0, 0))
    child = multiprocessing.get_context("fork").Process(target=_killed_at, args=(root.path, step))
    child.start()
    child.join(30)
    assert child.exitcode == -9
    journal = os.path.getsize(os.path.join(log.directory, producers.FILE))
    assert journal == 2 * producers.SIZE  # the record is there either way
    retry = other(root)
    assert retry.append_counted(batch_of(b"once"), producer=Batch(5, 0, 0, 0))[1] == 1
    assert retry.append_counted(batch_of(b"once"), producer=Batch(5, 0, 0, 0))[1] == 1
    assert values(root) == stored
    assert retry.state().producer_serial == 2


def test_a_torn_or_damaged_journal_loses_only_what_it_must(root, log, caplog):
    for seq in range(3):
        log.append_counted(batch_of(b"v%d" % seq), producer=Batch(1, 0, seq, seq))
    path = os.path.join(log.directory, producers.FILE)
    with open(path, "r+b") as f:  # the middle record damaged, half a record after the last
        f.seek(producers.SIZE + 10)
        f.write(b"\xff")
        f.seek(0, os.SEEK_END)
        f.write(b"\x00" * (producers.SIZE // 2))
    with caplog.at_level(logging.WARNING):
        retry = other(root)
        assert retry.append_counted(batch_of(b"v2"), producer=Batch(1, 0, 2, 2))[1] == 2  # the last one holds
        assert retry.append_counted(batch_of(b"v0"), producer=Batch(1, 0, 0, 0))[1] == 0
    assert "damaged record at byte 58 skipped" in caplog.text
    assert os.path.getsize(path) == 3 * producers.SIZE  # the torn half is cut off
    retry.append_counted(batch_of(b"v3"), producer=Batch(1, 0, 3, 3))
    assert values(root) == [b"v0", b"v1", b"v2", b"v3"]


def test_a_lost_journal_is_said_and_producers_start_again(root, log, caplog):
    log.append_counted(batch_of(b"a"), producer=Batch(1, 0, 0, 0))
    os.unlink(os.path.join(log.directory, producers.FILE))
    with caplog.at_level(logging.WARNING):
        retry = other(root)
        retry.append_counted(batch_of(b"b"), producer=Batch(1, 0, 7, 7))  # no state of it: accepted
    assert "is missing: retries of its producers' batches may be appended twice" in caplog.text
    assert retry.append_counted(batch_of(b"b"), producer=Batch(1, 0, 7, 7))[1] == 1
    assert values(root) == [b"a", b"b"]


def test_the_journal_is_rewritten_with_what_it_holds_once_it_grew(root, log, monkeypatch):
    monkeypatch.setattr(producers, "COMPACT_RECORDS", 20)
    for seq in range(40):
        log.append_counted(batch_of(b"p1-%d" % seq), producer=Batch(1, 0, seq, seq))
        log.append_counted(batch_of(b"p2-%d" % seq), producer=Batch(2, 0, seq, seq))
    path = os.path.join(log.directory, producers.FILE)
    assert os.path.getsize(path) < 40 * producers.SIZE
    retry = other(root)
    assert retry.append_counted(batch_of(b"p1-39"), producer=Batch(1, 0, 39, 39))[1] == 78
    assert retry.append_counted(batch_of(b"p2-35"), producer=Batch(2, 0, 35, 35))[1] == 71
    with pytest.raises(OutOfOrderSequence):  # older than the last five: not a retry kl can answer
        retry.append_counted(batch_of(b"p2-30"), producer=Batch(2, 0, 30, 30))
    assert len(values(root)) == 80


def test_producers_not_heard_from_for_a_day_are_forgotten_when_the_journal_is_rewritten(root, log, monkeypatch):
    monkeypatch.setattr(producers, "COMPACT_RECORDS", 4)
    log.append_counted(batch_of(b"old"), producer=Batch(1, 0, 0, 0))
    now = producers.now_ms() + producers.EXPIRY_MS + 1000
    monkeypatch.setattr(producers, "now_ms", lambda: now)
    for seq in range(20):
        log.append_counted(batch_of(b"new"), producer=Batch(2, 0, seq, seq))
    retry = other(root)
    retry.append_counted(batch_of(b"old"), producer=Batch(1, 0, 0, 0))  # forgotten: appended again
    assert values(root).count(b"old") == 2


def test_a_state_record_rebuilt_by_recovery_keeps_the_journal(root, log):
    for seq in range(3):
        log.append_counted(batch_of(b"v%d" % seq), producer=Batch(1, 0, seq, seq))
    with open(log.state_path, "r+b") as f:
        f.write(b"junk")
    report = recover(kl.Root(root.path).log("t", 0), repair=True)
    assert "STATE" in {f.kind for f in report.findings}
    retry = other(root)
    assert retry.state().producer_serial == 3
    assert retry.append_counted(batch_of(b"v2"), producer=Batch(1, 0, 2, 2))[1] == 2
    retry.append_counted(batch_of(b"v3"), producer=Batch(1, 0, 3, 3))
    assert values(root) == [b"v0", b"v1", b"v2", b"v3"]


@pytest.mark.parametrize("outcome", ["retry", "refused"])
def test_on_nfs_a_batch_answered_without_an_append_leaves_no_append_under_way(root, monkeypatch, caplog, outcome):
    """The writer's "append under way" mark (NFS) goes when a retry is answered or a batch
    refused: the next writer, on another host, finds nothing unfinished to fence."""
    monkeypatch.setattr(kl.log.log, "mount_of", lambda directory: ("/", "nfs4", "rw"))
    root.create_topic("t", kl.TopicConfig(segment_bytes=4096, max_message_bytes=1024))
    log = root.log("t", 0)
    log.append_counted(batch_of(b"a"), producer=Batch(1, 0, 0, 0))
    answering = other(root)
    if outcome == "retry":
        assert answering.append_counted(batch_of(b"a"), producer=Batch(1, 0, 0, 0))[1] == 0
    else:
        with pytest.raises(OutOfOrderSequence):
            answering.append_counted(batch_of(b"x"), producer=Batch(1, 0, 5, 5))
    answering.close()
    with caplog.at_level(logging.WARNING):
        other(root).append_counted(batch_of(b"b"), producer=Batch(1, 0, 1, 1))
    assert "append under way" not in caplog.text
    assert len(log.segments()) == 1 and values(root) == [b"a", b"b"]
