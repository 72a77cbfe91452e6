"""benchmarks/pool_lost_why.py without a pool: each preempted sleep of a replay side is matched
to its preemptor (a higher tier, submitted by then, starting on its nodes within KillWait), and
counted avoidable when, the second before, a partition the preemptor accepts held enough idle or
lower-tier checkpointing nodes, else as a loss only plain jobs could have paid; idle that lasted
is read from the replay's own samples of the pool."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import pool_lost_why as why
import pool_trace_replay as replay


def _job(i: int, tier: str, nodes: int, types: tuple[str, ...], ckpt: bool = False) -> replay.TraceJob:
    return replay.TraceJob(i, 0.0, tier, nodes, 30, types, "gpu-a100", ckpt=ckpt)


def _run(state: str, start: float, end: float, part: str, nodelist: str, nodes: int,
         submit: float | None = None) -> dict:
    return {"id": "1", "state": state, "submit": start if submit is None else submit, "eligible": start,
            "start": start, "end": end, "nodes": nodes, "partition": part, "nodelist": nodelist}


def test_a_cheaper_partition_makes_the_loss_avoidable_and_none_makes_it_unavoidable() -> None:
    # every a100 node held by two 12-node normal sleeps; v100 by a 24-node normal checkpointing job
    trace = [_job(0, "normal", 12, ("a100",)), _job(1, "normal", 12, ("a100",)),
             _job(2, "normal", 24, ("v100",), ckpt=True), _job(3, "critical", 4, ("a100", "v100")),
             _job(4, "critical", 4, ("a100",))]
    names = {str(j.i): f"t-{j.i:03d}-{j.tier}" for j in trace}
    runs = {names["0"]: [_run("PREEMPTED", 100, 150, "gpu-a100", "n[1-12]", 12)],
            names["1"]: [_run("PREEMPTED", 100, 120, "gpu-a100", "n[13-24]", 12)],
            names["2"]: [_run("COMPLETED", 100, 400, "gpu-v100", "n[25-48]", 24)],
            names["3"]: [_run("COMPLETED", 151, 190, "gpu-a100", "n[1-4]", 4, submit=149)],  # v100 was there to take
            names["4"]: [_run("COMPLETED", 121, 170, "gpu-a100", "n[13-16]", 4, submit=119)]}  # a100 only, all plain
    out = why.explain(trace, names, runs)
    by = {c["victim"]: c for c in out["cases"]}
    assert by[names["0"]]["preemptor"] == names["3"] and by[names["0"]]["avoidable"]
    assert by[names["0"]]["options_at_preemption"]["gpu-v100"] == {"idle": 0, "ckpt_lower": 24,
                                                                 "ckpt_before_victim": 24}
    assert by[names["1"]]["preemptor"] == names["4"] and not by[names["1"]]["avoidable"]
    assert by[names["1"]]["options_at_preemption"] == {"gpu-a100": {"idle": 0, "ckpt_lower": 0,
                                                                    "ckpt_before_victim": 0}}
    assert out["lost_node_s"]["avoidable"] == 600.0 and out["lost_node_s"]["unavoidable"] == 240.0


def test_a_run_submitted_after_the_preemption_is_not_its_preemptor() -> None:
    # a normal sleep preempted at 150; a high job submitted at 170 starts on its nodes at 172
    trace = [_job(0, "normal", 4, ("a100",)), _job(1, "high", 2, ("a100",))]
    names = {str(j.i): f"t-{j.i:03d}-{j.tier}" for j in trace}
    runs = {names["0"]: [_run("PREEMPTED", 100, 150, "gpu-a100", "n[1-4]", 4)],
            names["1"]: [_run("COMPLETED", 172, 200, "gpu-a100", "n[1-2]", 2, submit=170)]}
    out = why.explain(trace, names, runs)
    assert out["cases"] == [{"victim": names["0"], "lost_node_s": 200, "preemptor": None}]
    assert out["lost_node_s"]["no_preemptor_found"] == 200.0


def test_idle_counts_as_live_only_when_every_sample_before_the_preemption_shows_it() -> None:
    # a critical 8-node job accepting both types preempts a 16-node a100 sleep at 150; sacct shows
    # v100's 24 nodes idle the second before, the pool's samples show 8 idle at 147 and 148 but
    # only 2 at 149 (a pending job took them): not idle that lasted
    trace = [_job(0, "normal", 16, ("a100",)), _job(1, "critical", 8, ("a100", "v100"))]
    names = {str(j.i): f"t-{j.i:03d}-{j.tier}" for j in trace}
    runs = {names["0"]: [_run("PREEMPTED", 100, 150, "gpu-a100", "n[1-16]", 16)],
            names["1"]: [_run("COMPLETED", 151, 190, "gpu-a100", "n[1-8]", 8, submit=149)]}

    def samples(v100_idle: list[int]) -> list[dict]:
        return [{"t": 147.0 + k, "idle": {"gpu-a100": 0, "gpu-v100": v, "cpu": 0}} for k, v in enumerate(v100_idle)]

    out = why.explain(trace, names, runs, samples([8, 8, 2]))
    case = out["cases"][0]
    assert case["idle_by_sacct_enough"] and not case["idle_live_enough"]
    assert case["options_at_preemption"]["gpu-v100"]["idle_live"] == 2
    assert out["lost_node_s"]["of_it_idle_by_sacct"] == 800.0 and out["lost_node_s"]["of_it_idle_live"] == 0.0
    assert out["plain_victims"] == {"preempted_runs": 1, "lost_node_s_per_run": 800.0, "nodes_per_run": 16.0}
    lasted = why.explain(trace, names, runs, samples([8, 9, 8]))
    assert lasted["cases"][0]["idle_live_enough"] and lasted["lost_node_s"]["of_it_idle_live"] == 800.0
    # without samples (an older replay): no live figure, as before
    assert "idle_live" not in why.explain(trace, names, runs)["cases"][0]["options_at_preemption"]["gpu-v100"]
