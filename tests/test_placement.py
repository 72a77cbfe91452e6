"""Fitness-matched placement scoring (hetrun.slurm_plugin.placement) on pool snapshots
built from the real Slurm 22.05 sinfo sample, with GPU types and load set per node."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from hetrun.slurm_plugin import placement, pool

DATA = Path(__file__).parent / "data" / "pool"


def snapshot(types: dict[str, str | None], busy: set[str], drained: set[str] = frozenset(),
             pending_jobs: int = 0):
    data = copy.deepcopy(json.loads((DATA / "sinfo.json").read_text()))
    for node in data["nodes"]:
        name = node["name"]
        full = name in busy
        gtype = types[name]  # None: a node without GPUs
        node["gres"] = f"gpu:{gtype}:2" if gtype else ""
        node["gres_used"] = f"gpu:{gtype}:{2 if full else 0}" if gtype else ""
        node["alloc_cpus"] = node["cpus"] if full else 0
        node["alloc_memory"] = node["real_memory"] if full else 0
        node["state"] = "allocated" if full else "idle"
        node["state_flags"] = ["DRAIN"] if name in drained else []
        node["reason"] = "bad GPU" if name in drained else ""
    squeue = {"jobs": [{"job_state": "PENDING", "partition": "debug", "tres_req_str": "cpu=1"}] * pending_jobs}
    pending, running = pool.pending_from_squeue(squeue)
    return pool.PoolSnapshot(0.0, 1.0, pool.rows_from_sinfo(data), pending, [],
                             pool.troubled_nodes(data, {}), running, pool.nodes_from_sinfo(data))


TYPES = {"n1": "a100", "n2": "a100", "n3": "v100", "n4": "v100"}
LEARNER = placement.Need(nodes=1, cpus_per_node=1, gpus_per_node=2, mem_mb_per_node=1000)


def test_the_idle_gpu_type_wins_when_the_other_is_busy() -> None:
    best = placement.score(LEARNER, snapshot(TYPES, busy={"n1", "n2"}))
    assert (best[0].gres, best[0].fits_now) == ("gpu:v100", True)
    a100 = next(c for c in best if c.gres == "gpu:a100")
    assert not a100.fits_now and "0 nodes free now, 1 needed (would wait)" in a100.reasons
    best = placement.score(LEARNER, snapshot(TYPES, busy={"n3", "n4"}))
    assert best[0].gres == "gpu:a100"


def test_allowed_types_partitions_and_impossible_shapes() -> None:
    snap = snapshot(TYPES, busy={"n1", "n2"})
    only_a100 = placement.Need(1, 1, 2, gpu_types=("A100",), partitions=("high",))
    assert [(c.partition, c.gres) for c in placement.score(only_a100, snap)] == [("high", "gpu:a100")]
    assert placement.score(placement.Need(3, 1, 2), snap) == []  # no group has 3 nodes
    assert placement.score(placement.Need(1, 1, 4), snap) == []  # no node has 4 GPUs


def test_queue_pressure_and_failure_history_lower_the_score() -> None:
    quiet = placement.score(LEARNER, snapshot(TYPES, busy=set()))
    busy_queue = placement.score(LEARNER, snapshot(TYPES, busy=set(), pending_jobs=3))
    assert {c.partition for c in busy_queue[:2]} == {"high"}
    assert {c.partition for c in quiet[:2]} <= {"debug", "high"}
    drained = placement.score(LEARNER, snapshot(TYPES, busy=set(), drained={"n3"}))
    v100 = [c for c in drained if c.gres == "gpu:v100"]
    # n3 is drained: only n4 is usable, and it is the one chosen.
    assert all(c.nodes == ["n4"] for c in v100)


def test_cpu_only_work_prefers_nodes_without_gpus() -> None:
    cands = placement.score(placement.Need(1, 1, 0), snapshot({**TYPES, "n3": None, "n4": None}, busy=set()))
    assert cands[0].gres == "-"
    assert all("CPU-only work on GPU nodes" in c.reasons for c in cands if c.gres != "-")
    # A GPU component never lands on the nodes without GPUs.
    assert {c.gres for c in placement.score(LEARNER, snapshot({**TYPES, "n3": None, "n4": None}, busy=set()))} == {"gpu:a100"}


def test_need_from_a_plan_component() -> None:
    comp = {"name": "learner", "nodes": 2, "tasks_per_node": 2, "cpus_per_task": 3, "gpus_per_node": 1,
            "mem_mb": 2048}
    assert placement.Need.from_component(comp) == placement.Need(2, 6, 1, 2048)
