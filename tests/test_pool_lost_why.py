"""benchmarks/pool_lost_why.py without a pool: each preempted sleep of a replay side is matched
to its preemptor (a higher tier starting on its nodes within KillWait), and counted avoidable
when, the second before, a partition the preemptor accepts held enough idle or lower-tier
checkpointing nodes, else as a loss only plain jobs could have paid."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import pool_lost_why as why
import pool_trace_replay as replay


def _job(i: int, tier: str, nodes: int, types: tuple[str, ...], ckpt: bool = False) -> replay.TraceJob:
    return replay.TraceJob(i, 0.0, tier, nodes, 30, types, "gpu-a100", ckpt=ckpt)


def _run(state: str, start: float, end: float, part: str, nodelist: str, nodes: int) -> dict:
    return {"id": "1", "state": state, "submit": start, "eligible": start, "start": start, "end": end,
            "nodes": nodes, "partition": part, "nodelist": nodelist}


def test_a_cheaper_partition_makes_the_loss_avoidable_and_none_makes_it_unavoidable() -> None:
    # every a100 node held by two 12-node normal sleeps; v100 by a 24-node normal checkpointing job
    trace = [_job(0, "normal", 12, ("a100",)), _job(1, "normal", 12, ("a100",)),
             _job(2, "normal", 24, ("v100",), ckpt=True), _job(3, "critical", 4, ("a100", "v100")),
             _job(4, "critical", 4, ("a100",))]
    names = {str(j.i): f"t-{j.i:03d}-{j.tier}" for j in trace}
    runs = {names["0"]: [_run("PREEMPTED", 100, 150, "gpu-a100", "n[1-12]", 12)],
            names["1"]: [_run("PREEMPTED", 100, 120, "gpu-a100", "n[13-24]", 12)],
            names["2"]: [_run("COMPLETED", 100, 400, "gpu-v100", "n[25-48]", 24)],
            names["3"]: [_run("COMPLETED", 151, 190, "gpu-a100", "n[1-4]", 4)],  # v100 was there to take
            names["4"]: [_run("COMPLETED", 121, 170, "gpu-a100", "n[13-16]", 4)]}  # a100 only, all plain
    out = why.explain(trace, names, runs)
    by = {c["victim"]: c for c in out["cases"]}
    assert by[names["0"]]["preemptor"] == names["3"] and by[names["0"]]["avoidable"]
    assert by[names["0"]]["options_at_preemption"]["gpu-v100"] == {"idle": 0, "ckpt_lower": 24,
                                                                 "ckpt_before_victim": 24}
    assert by[names["1"]]["preemptor"] == names["4"] and not by[names["1"]]["avoidable"]
    assert by[names["1"]]["options_at_preemption"] == {"gpu-a100": {"idle": 0, "ckpt_lower": 0,
                                                                    "ckpt_before_victim": 0}}
    assert out["lost_node_s"]["avoidable"] == 600.0 and out["lost_node_s"]["unavoidable"] == 240.0
