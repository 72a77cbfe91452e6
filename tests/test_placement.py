"""Fitness-matched placement scoring (hetrun.slurm_plugin.placement) on pool snapshots
built from the real Slurm 22.05 sinfo sample, with GPU types and load set per node."""

from __future__ import annotations

import copy
import json
from collections.abc import Collection, Mapping
from pathlib import Path

import pytest
from hetrun.slurm_plugin import placement, pool

DATA = Path(__file__).parent / "data" / "pool"


def snapshot(types: Mapping[str, str | None], busy: Collection[str], drained: Collection[str] = frozenset(),
             pending_jobs: int = 0) -> pool.PoolSnapshot:
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


# sbatch --test-only's own lines, as Slurm 22.05 prints them on stderr.
def _recorded_sbatch(starts: dict[str, str]):
    """Stands in for sbatch --test-only: the start line Slurm printed for each partition."""
    seen: list[list[str]] = []

    def run(argv: list[str]) -> str:
        seen.append(argv)
        part = next(a.split("=", 1)[1] for a in argv if a.startswith("--partition="))
        if part not in starts:
            return "sbatch: error: Requested node configuration is not available"
        return f"sbatch: Job 41 to start at {starts[part]} using 1 processors on nodes n3 in partition {part}"
    run.seen = seen  # type: ignore[attr-defined]
    return run


def test_slurms_start_estimate_reorders_the_candidates() -> None:
    from datetime import datetime

    now = datetime.fromisoformat("2026-12-01T18:00:00").timestamp()
    cands = placement.score(LEARNER, snapshot(TYPES, busy=set()))
    assert {c.partition for c in cands} == {"debug", "high"}
    # Slurm says high starts now and debug in 30 minutes (e.g. a reservation the pool cannot see).
    fake = _recorded_sbatch({"high": "2026-12-01T18:00:00", "debug": "2026-12-01T18:30:00"})
    out = placement.with_start_estimates(LEARNER, cands, fake, now=now)
    assert out[0].partition == "high" and out[0].start_in_s == 0
    debug = next(c for c in out if c.partition == "debug")
    assert debug.start_in_s == 1800 and "Slurm expects a start in 1800 s" in debug.reasons
    assert len(fake.seen) == len(cands)  # one sbatch --test-only per candidate
    assert all(("--gres=gpu:a100:2" in a or "--gres=gpu:v100:2" in a) and "--test-only" in a and "--nodes=1" in a
               for a in fake.seen), fake.seen
    refused = placement.with_start_estimates(LEARNER, placement.score(LEARNER, snapshot(TYPES, busy=set())),
                                             _recorded_sbatch({"high": "2026-12-01T18:00:00"}), now=now)
    assert all(c.partition == "high" for c in refused[:2])
    assert any("not available" in r for c in refused if c.partition == "debug" for r in c.reasons)


@pytest.mark.slurm
def test_start_estimate_from_the_real_sbatch(slurm_cluster) -> None:
    snap = pool.collect(hours=1)
    need = placement.Need(1, 1, 0, 100)
    cands = placement.with_start_estimates(need, placement.score(need, snap), placement.slurm_test_only())
    assert cands and all(c.start_in_s is not None for c in cands), [c.reasons for c in cands]
    # No node has 64 CPUs: Slurm refuses, and the candidate says why.
    big = placement.Need(1, 64, 0)
    row = cands[0]
    [out] = placement.with_start_estimates(big, [placement.Candidate(row.partition, row.gres, 0.0, False)],
                                           placement.slurm_test_only())
    assert out.start_in_s is None and out.score == -placement.WAIT_PENALTY_MAX, out.reasons
