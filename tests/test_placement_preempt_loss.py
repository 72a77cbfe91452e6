"""Placement by the work a preemption would lose (placement.preemption_loss), off-line on pool
snapshots built from the real Slurm 22.05 sinfo sample: where a job that may preempt has to,
the group whose preemption loses least ranks first (idle > checkpointing jobs > the youngest
plain job > older ones); a job that may preempt nothing is ranked as before."""

from __future__ import annotations

from hetrun.slurm_plugin import placement, pool
from test_placement import TYPES, snapshot

NOW = 10_000.0
PREEMPTS, CLEAN = ("normal", "normal_ckpt"), ("normal_ckpt",)
PAIR = placement.Need(nodes=2, cpus_per_node=1, gpus_per_node=2, preempts=PREEMPTS, stops_clean=CLEAN)


def busy_with(*jobs: tuple[str, tuple[str, ...], float]) -> pool.PoolSnapshot:
    """Every GPU node full; ``jobs``: (qos, nodes, seconds it has run) of the running jobs."""
    snap = snapshot(TYPES, busy=set(TYPES))
    snap.taken_at = NOW
    snap.running_use = [pool.RunningUse("team", "u", qos, {"node": len(nodes)}, i + 1, nodes, NOW - ran)
                        for i, (qos, nodes, ran) in enumerate(jobs)]
    return snap


def best_gres(need: placement.Need, snap: pool.PoolSnapshot) -> str:
    return placement.score(need, snap)[0].gres


def test_checkpointing_jobs_are_preempted_before_plain_ones_whatever_their_age() -> None:
    snap = busy_with(("normal", ("n1", "n2"), 5), ("normal_ckpt", ("n3", "n4"), 600))
    assert best_gres(PAIR, snap) == "gpu:v100"
    v100 = placement.score(PAIR, snap)[0]
    assert "a start by preemption loses ~0 node-s of work" in v100.reasons
    snap = busy_with(("normal_ckpt", ("n1", "n2"), 600), ("normal", ("n3", "n4"), 5))
    assert best_gres(PAIR, snap) == "gpu:a100"


def test_the_youngest_plain_job_goes_first_and_the_loss_is_its_node_seconds() -> None:
    snap = busy_with(("normal", ("n1", "n2"), 30), ("normal", ("n3", "n4"), 300))
    assert best_gres(PAIR, snap) == "gpu:a100"
    assert placement.preemption_loss(PAIR, [n for n in snap.nodes if n.gres == "gpu:a100"], snap) == 60.0
    snap = busy_with(("normal", ("n1",), 30), ("normal", ("n2",), 40), ("normal", ("n3", "n4"), 20))
    assert placement.preemption_loss(PAIR, [n for n in snap.nodes if n.gres == "gpu:a100"], snap) == 70.0
    assert best_gres(PAIR, snap) == "gpu:v100"  # 40 node-s against 70


def test_a_group_preemption_cannot_free_ranks_below_one_it_can() -> None:
    # n1 + n2 run a job of a QOS this one may not preempt: only v100 can be freed
    snap = busy_with(("high", ("n1", "n2"), 5), ("normal", ("n3", "n4"), 3000))
    assert placement.preemption_loss(PAIR, [n for n in snap.nodes if n.gres == "gpu:a100"], snap) is None
    assert best_gres(PAIR, snap) == "gpu:v100"
    a100 = next(c for c in placement.score(PAIR, snap) if c.gres == "gpu:a100")
    assert "preemption cannot free enough nodes" in a100.reasons


def test_a_job_that_may_preempt_nothing_is_scored_as_before() -> None:
    plain = placement.Need(nodes=2, cpus_per_node=1, gpus_per_node=2)
    for jobs in ((("normal", ("n1", "n2"), 5), ("normal_ckpt", ("n3", "n4"), 600)),
                 (("normal_ckpt", ("n1", "n2"), 600), ("normal", ("n3", "n4"), 5))):
        snap = busy_with(*jobs)
        assert [(c.partition, c.gres, c.score) for c in placement.score(plain, snap)] == \
               [(c.partition, c.gres, c.score) for c in placement.score(plain, snapshot(TYPES, busy=set(TYPES)))]
    # and a group that fits now keeps its lead: no preemption is needed there
    snap = snapshot(TYPES, busy={"n1", "n2"})
    assert best_gres(PAIR, snap) == "gpu:v100" and placement.score(PAIR, snap)[0].fits_now


def test_squeue_running_jobs_carry_their_nodes_and_start() -> None:
    data = {"jobs": [{"job_state": "RUNNING", "job_id": 7, "account": "a", "user_name": "u", "qos": "normal",
                      "tres_alloc_str": "cpu=8,node=2", "nodes": "n[1-2]", "start_time": 1234},
                     {"job_state": "PENDING", "job_id": 8, "nodes": "", "start_time": 0}]}
    (job,) = pool.running_from_squeue(data)
    assert (job.job_id, job.nodes, job.start, job.tres["cpu"]) == (7, ("n1", "n2"), 1234.0, 8)
