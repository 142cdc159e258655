"""A holder paused (SIGSTOP) while it holds a partition's lock on NFS, cut off past its
lease while another host takes the partition over and appends, then woken: it never
destroys the other host's acknowledged data, nothing foreign is served, and what it
reports of its own batches is true of the log (the scenario is in ``pausedholder``;
scripts/nfs-paused-holder repeats it).  NFSv4.2 only: on NFSv3 a cut-off host keeps its
locks (no leases), so nobody takes over."""

from __future__ import annotations

import itertools

import nfslab
import pausedholder
import pytest

pytestmark = pytest.mark.skipif(nfslab.unavailable() is not None, reason=str(nfslab.unavailable()))

_topics = itertools.count()


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    with nfslab.Lab(tmp_path_factory.mktemp("nfslab"), version="4.2", lease=10, lifetime=900) as lab:
        yield lab


@pytest.mark.parametrize("step", pausedholder.STEPS)
def test_a_holder_paused_and_cut_off_past_its_lease_destroys_nothing_acknowledged_when_it_wakes(lab, step):
    outcome = pausedholder.run(lab, f"paused-{step}-{next(_topics)}", step)
    assert outcome.b_acked == pausedholder.B_BATCHES * pausedholder.B_SIZE
    assert outcome.lost == 0, outcome
    assert outcome.problems == [], outcome
    print(f"\nstopped at {step}: host b took over after {outcome.took_over:.1f} s; host a said {outcome.a_said}; "
          f"{outcome.segments} segments")
