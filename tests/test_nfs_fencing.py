"""A holder paused (SIGSTOP) while it holds a partition's lock on NFS, cut off past its
lease while another host takes the partition over and appends, then woken: it never
destroys the other host's acknowledged data, nothing foreign is served, and what it
reports of its own batches is true of the log (the scenario is in ``pausedholder``;
scripts/nfs-paused-holder repeats it): on hosts that are separate machines, a machine
frozen whole instead of a process stopped, and hosts that are network namespaces of one
kernel (the shape that lost data before the fence): the steps of an append where the
loss is likeliest (scripts/nfs-paused-holder runs every step many times in each shape).
NFSv4.2 only: on NFSv3 a cut-off host keeps its
locks (no leases), so nobody takes over."""

from __future__ import annotations

import itertools

import nfslab
import pausedholder
import pytest

pytestmark = pytest.mark.skipif(nfslab.unavailable() is not None, reason=str(nfslab.unavailable()))

_topics = itertools.count()


def check(lab: nfslab.Lab, step: str, *, freeze: bool = False) -> None:
    outcome = pausedholder.run(lab, f"paused-{step}-{next(_topics)}", step, freeze=freeze)
    assert outcome.b_acked == pausedholder.B_BATCHES * pausedholder.B_SIZE
    assert outcome.lost == 0, outcome
    assert outcome.problems == [], outcome
    print(
        f"\nstopped at {step}: host b took over after {outcome.took_over:.1f} s; host a said {outcome.a_said}; "
        f"{outcome.segments} segments"
    )


@pytest.mark.parametrize("lab", ["4.2"], indirect=True)
@pytest.mark.parametrize("step", ["lock", "write", "fsync", "publish"])
def test_a_paused_holder_on_a_host_cut_off_past_its_lease_destroys_nothing_acknowledged_when_it_wakes(lab, step):
    check(lab, step)


@pytest.mark.parametrize("lab", ["4.2"], indirect=True)
@pytest.mark.parametrize("step", ["lock"])
def test_a_holder_on_a_virtual_machine_frozen_past_its_lease_destroys_nothing_acknowledged_when_it_thaws(lab, step):
    check(lab, step, freeze=True)


@pytest.mark.parametrize("step", ["lock"])
def test_a_paused_holder_cut_off_in_a_network_namespace_of_the_other_hosts_kernel_destroys_nothing_acknowledged(
    one_kernel_lab, step
):
    check(one_kernel_lab, step)
