"""The pure parts of the watch over a cluster's Slurm jobs (no Slurm needed):
Slurm's compressed node lists, and which engines went with a job that ended
when some had not said their job yet (``--jobs N``: by the job's nodes)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gpucell.cluster.slurm_jobs import Job, JobWatch, hostnames


@pytest.mark.parametrize(
    ("nodelist", "names"),
    [
        ("vm", ["vm"]),
        ("vm,node2", ["vm", "node2"]),
        ("gpu[01-03,7]", ["gpu01", "gpu02", "gpu03", "gpu7"]),
        ("a[1-2]-ib,b5", ["a1-ib", "a2-ib", "b5"]),
        ("n[8-10]", ["n8", "n9", "n10"]),
        ("", []),
    ],
)
def test_node_lists_expand_as_scontrol_show_hostnames(nodelist, names):
    assert hostnames(nodelist) == names


def _gc(hosts: dict[int, str]):
    return SimpleNamespace(
        engines={e: SimpleNamespace(host=h) for e, h in hosts.items()},
        dead=set(),
    )


def test_engines_not_yet_placed_go_with_the_job_on_their_node_alone():
    a = Job("slurm", "11", 2, {}, nodes=("vm",))
    b = Job("slurm-2", "12", 2, {}, nodes=("node2",))
    watch = JobWatch(cluster=None, jobs=[a, b])
    gc = _gc({0: "vm", 1: "vm", 2: "node2.cluster.local", 3: "node2"})
    watch.job_of = {0: "11"}  # the others' answers are queued behind chunks
    assert watch.engines_of(gc, a) == [0, 1]
    assert watch.engines_of(gc, b) == [2, 3]
    # a node two jobs share names no engine of unknown job
    b.nodes = ("node2", "vm")
    assert watch.engines_of(gc, a) == [0]
    assert watch.engines_of(gc, b) == [2, 3]
    # one job left: every engine not placed is its
    a.ended = "CANCELLED, None"
    assert watch.engines_of(gc, b) == [1, 2, 3]


def test_a_requeued_job_pending_again_is_not_a_second_requeue(monkeypatch):
    """Slurm requeues job 9 (REQUEUED, then PENDING until it runs again): with
    --checkpoint 1 that is its one resubmission, and the PENDING that follows
    is its wait to run, not another requeue (its old engines said job 9; were
    they still counted, the job was cancelled as requeued twice).  Requeued
    again after it ran, it is past the limit and cancelled."""
    from gpucell.cluster import slurm_jobs
    from gpucell.cluster.restart import Restarts

    cancelled: list[str] = []
    monkeypatch.setattr(slurm_jobs, "_scancel", cancelled.append)
    said: list[str] = []
    restarts = Restarts(echo=said.append)
    gc = _gc({0: "vm", 1: "vm"})
    gc.stopping, gc.warnings = False, []
    gc.mark_dead = gc.dead.add
    watch = JobWatch(cluster=None, jobs=[Job("slurm", "9", 2, {})], resubmit=1)
    watch.job_of = {0: "9", 1: "9"}
    watch._act(gc, restarts, {"9": ("RUNNING", "None", "vm")}, ["9"])
    watch._act(gc, restarts, {"9": ("REQUEUED", "None", "vm")}, ["9"])
    assert gc.dead == {0, 1} and len(watch.jobs) == 2
    for _ in range(3):  # pending to run again, for as long as Slurm likes
        watch._act(gc, restarts, {"9": ("PENDING", "BeginTime", "")}, ["9"])
    assert cancelled == [] and watch.ids() == ["9"], said
    assert len(restarts.pending) == 2  # its dead engines wait for the new run's
    gc.engines.update({2: SimpleNamespace(host="node2")})
    watch.job_of[2] = "9"  # the new run's engine says so
    watch._act(gc, restarts, {"9": ("PENDING", "None", "")}, ["9"])
    assert cancelled == ["9"] and watch.ids() == [], said
    assert "requeued by Slurm (PENDING) and is cancelled" in said[-1]
