"""What a higher tier's prompt start costs in work, read from saved trace replays
(benchmarks/pool_trace_replay.py result files): the question behind issue 21's last figure.

For each side of each file: every run of a plain job (a ``sleep``: it loses all it ran) that
was preempted is charged to its preemptor, the earliest run of a higher-tier job that started
on one of its nodes from 2 s before to 15 s after it ended (Slurm requeues the victim, then
starts the preemptor there). Printed per side:

- the work those plain victims lost, per preemptor tier, as a share of the trace's work;
- per age bound T ("a plain job that has run at most T s may still be preempted"): the loss
  the starts whose victims were all that young kept, and how many critical / high starts
  took an older victim, i.e. would have waited under that bound (each such start may become a
  long wait; the critical p95 of ~27 jobs tolerates one);
- the side's critical p50 / p95 queue wait, as the replay computed it (``wait_s``).

The attribution is a reading of one schedule: under another policy the pool's state at each
arrival differs, so the counts say what this schedule's prompt starts were made of, not what
another policy would do.

    python3 benchmarks/pool_preempt_budget.py benchmarks/results/pool_replay_victims_s35.json [...] [--bounds 5 10 20 30]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetrun.slurm_plugin.pool import expand_hostlist

TIER_RANK = {"critical": 0, "high": 1, "normal": 2}
BEFORE_S, AFTER_S = 2.0, 15.0  # the preemptor's start relative to its victim's end


@dataclass
class Start:
    """One higher-tier start that took plain victims: their ages (s) and losses (node-s)."""

    job: str
    tier: str
    victims: list[tuple[float, float]] = field(default_factory=list)  # (ran s, lost node-s)


def preempting_starts(doc: dict[str, Any], side: dict[str, Any]) -> list[Start]:
    """The starts of ``side`` (a replay side's result) that preempted plain jobs, with their victims."""
    trace = {j["i"]: j for j in doc["trace"]}
    names = {name: int(i) for i, name in side["raw"]["names"].items()}
    runs = [(name, trace[names[name]], run) for name, rs in side["raw"]["runs"].items() if name in names
            for run in rs if run.get("start") and run.get("end")]
    nodes = {id(run): set(expand_hostlist(run["nodelist"])) for _n, _j, run in runs}
    starts: dict[str, Start] = {}
    for _name, job, run in runs:
        if run["state"] != "PREEMPTED" or job.get("ckpt") or job.get("hetrun"):
            continue
        after = [(r["start"], n, j["tier"]) for n, j, r in runs
                 if TIER_RANK[j["tier"]] < TIER_RANK[job["tier"]]
                 and run["end"] - BEFORE_S <= r["start"] <= run["end"] + AFTER_S and nodes[id(r)] & nodes[id(run)]]
        if not after:
            continue
        _t, preemptor, tier = min(after)
        ran = run["end"] - run["start"]
        starts.setdefault(preemptor, Start(preemptor, tier)).victims.append((ran, ran * run["nodes"]))
    return list(starts.values())


def under_bound(starts: list[Start], bound_s: float) -> tuple[float, dict[str, int]]:
    """(node-s the starts whose victims all ran <= ``bound_s`` lost, per tier the starts that took an older one)."""
    kept, older = 0.0, {"critical": 0, "high": 0}
    for s in starts:
        if all(ran <= bound_s for ran, _ in s.victims):
            kept += sum(lost for _, lost in s.victims)
        else:
            older[s.tier] = older.get(s.tier, 0) + 1
    return kept, older


def report(path: Path, bounds: list[float]) -> list[str]:
    doc = json.loads(path.read_text())
    lines = []
    for key in ("by_hand", "policy_fit"):
        side = doc.get(key)
        if not side or "raw" not in side:
            continue
        work = side["work_node_s"]
        starts = preempting_starts(doc, side)
        per_tier = {t: sum(lost for s in starts if s.tier == t for _, lost in s.victims) for t in ("critical", "high")}
        waits = side["wait_s"]["critical"]  # the replay's own figures (pool_trace_replay.metrics)
        lines.append(f"{path.name} {key} (spare_plain {side.get('spare_plain', False)}): plain work lost by "
                     + ", ".join(f"{t} starts {v:.0f} node-s ({100 * v / work:.2f} %)" for t, v in per_tier.items())
                     + f"; critical wait p50 {waits['p50']} s, p95 {waits['p95']} s of {waits['n']}")
        for b in bounds:
            kept, older = under_bound(starts, b)
            lines.append(f"    T {b:>4.0f} s: kept {kept:6.0f} node-s ({100 * kept / work:.2f} %); starts that took an "
                         f"older victim: critical {older['critical']}, high {older['high']}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", type=Path, nargs="+")
    ap.add_argument("--bounds", type=float, nargs="+", default=[5, 10, 15, 20, 30])
    args = ap.parse_args()
    for path in args.files:
        print("\n".join(report(path, args.bounds)))


if __name__ == "__main__":
    main()
