"""benchmarks/pool_preempt_budget.py: plain victims charged to the start that took their nodes,
and the age bound's count of starts that took an older victim (a hand-made two-start replay)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import pool_preempt_budget as budget


def _run(state: str, start: float, end: float, nodelist: str, nodes: int) -> dict:
    return {"state": state, "submit": start, "start": start, "end": end, "nodelist": nodelist, "nodes": nodes}


def _doc() -> dict:
    trace = [
        {"i": 0, "tier": "normal", "ckpt": False, "hetrun": False},  # plain, ran 40 s on 2 nodes
        {"i": 1, "tier": "normal", "ckpt": False, "hetrun": False},  # plain, ran 4 s on 1 node
        {"i": 2, "tier": "normal", "ckpt": True, "hetrun": False},   # checkpointing: never charged
        {"i": 3, "tier": "critical", "ckpt": False, "hetrun": False},  # took n[1-2] from job 0
        {"i": 4, "tier": "high", "ckpt": False, "hetrun": False},      # took n3 from job 1 (and n4 from 2)
        {"i": 5, "tier": "normal", "ckpt": False, "hetrun": False},    # same tier: never a preemptor
    ]
    names = {str(j["i"]): f"t-{j['i']:03d}-{j['tier']}" for j in trace}
    runs = {
        names["0"]: [_run("PREEMPTED", 100, 140, "n[1-2]", 2), _run("COMPLETED", 200, 260, "n[1-2]", 2)],
        names["1"]: [_run("PREEMPTED", 146, 150, "n3", 1)],
        names["2"]: [_run("PREEMPTED", 120, 150, "n4", 1)],
        names["3"]: [_run("COMPLETED", 141, 170, "n[1-2]", 2)],
        names["4"]: [_run("COMPLETED", 151, 180, "n[3-4]", 2)],
        names["5"]: [_run("COMPLETED", 140.5, 150, "n1", 1)],
    }
    side = {"raw": {"names": names, "runs": runs}, "work_node_s": 1000.0,
            "wait_s": {"critical": {"p50": 2.0, "p95": 2.0, "n": 1}}}
    return {"trace": trace, "policy_fit": side}


def test_victims_are_charged_to_the_higher_tier_start_on_their_nodes() -> None:
    doc = _doc()
    starts = {s.job: s for s in budget.preempting_starts(doc, doc["policy_fit"])}
    assert set(starts) == {"t-003-critical", "t-004-high"}  # the same-tier job 5 is never a preemptor
    assert starts["t-003-critical"].victims == [(40, 80)]
    assert starts["t-004-high"].victims == [(4, 4)]  # the checkpointing job 2 is not charged


def test_an_age_bound_keeps_the_young_victims_and_counts_the_starts_that_took_older_ones() -> None:
    doc = _doc()
    starts = budget.preempting_starts(doc, doc["policy_fit"])
    assert budget.under_bound(starts, 10) == (4, {"critical": 1, "high": 0})
    assert budget.under_bound(starts, 60) == (84, {"critical": 0, "high": 0})


def test_report_reads_a_result_file(tmp_path: Path) -> None:
    import json

    path = tmp_path / "replay.json"
    path.write_text(json.dumps(_doc()))
    lines = budget.report(path, [10])
    assert "critical starts 80 node-s (8.00 %)" in lines[0] and "critical wait p50 2.0 s, p95 2.0 s of 1" in lines[0]
    assert "T   10 s: kept      4 node-s (0.40 %); starts that took an older victim: critical 1, high 0" in lines[1]
