"""Why each sleep of a trace replay side was preempted, and whether anything cheaper was there:
at the moment of each preemption of a plain sleep (a run that ended PREEMPTED), the preemptor
(a higher-tier run, submitted by then, that started on the victim's nodes within KillWait after it), the
partitions the preemptor's job accepts, and in each of them the nodes idle and the nodes held
by lower-tier checkpointing jobs (which lose ~0) at that second. "avoidable": some accepted
partition had enough of those for the preemptor; else only plain jobs could free its nodes.
Idle by sacct is not idle in Slurm (a preempted or finished job holds its nodes through its
stop and epilog); where the replay sampled the pool (its 1-s ``sinfo`` samples, ``raw.samples``)
``idle_live`` is each accepted partition's fewest idle nodes over the samples of the
``LIVE_WINDOW_S`` before the preemption: idle that lasted, which the preemptor could have had.

    python3 benchmarks/pool_lost_why.py R.json [--side policy_fit] [--sacct DUMP]

Needs each run's Partition and NodeList (benchmarks/pool_trace_replay.py's SACCT_FORMAT since
issue 21's second session, or ``--sacct``: a ``sacct -M hrpool -a -D -X -P -n
--format=<SACCT_FORMAT>`` dump of the same jobs, read with the side's job-name prefix).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from hetrun.slurm_plugin.pool import expand_hostlist
from pool_trace_replay import TIERS, TraceJob, parse_sacct

PARTITION_NODES = {"gpu-a100": {f"n{i}" for i in range(1, 25)}, "gpu-v100": {f"n{i}" for i in range(25, 49)},
                   "cpu": {f"n{i}" for i in range(49, 65)}}
KILL_WAIT_S = 35  # KillWait 30 s + a tick: the preemptor starts once the victim's nodes are free
LIVE_WINDOW_S = 3.0  # the sampled idle nodes that count: those of every sample this long before


def accepted(job: TraceJob) -> list[str]:
    return [f"gpu-{t}" for t in job.gpu_types] if job.gpu_types else ["cpu"]


def live_idle(samples: list[dict[str, Any]], at: float, part: str) -> int | None:
    """``part``'s fewest idle nodes over the samples of the LIVE_WINDOW_S before ``at`` (None:
    no sample there)."""
    seen = [s["idle"].get(part, 0) for s in samples if at - LIVE_WINDOW_S <= s["t"] < at]
    return min(seen) if seen else None


def explain(trace: list[TraceJob], names: dict[str, str], runs: dict[str, list[dict[str, Any]]],
            samples: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    by_name = {names[str(j.i)]: j for j in trace}
    flat = [(n, r) for n, rs in runs.items() for r in rs if r.get("start") and r.get("end") and r.get("nodelist")]
    rank = {t: i for i, t in enumerate(TIERS)}  # 0: critical
    cases, totals = [], {"avoidable": 0.0, "unavoidable": 0.0, "no_preemptor_found": 0.0,
                      "of_it_idle_by_sacct": 0.0, "of_it_idle_live": 0.0, "of_it_slurm_order_would_spare": 0.0}
    for name, r in flat:
        job = by_name.get(name)
        if job is None or job.ckpt or job.hetrun or r["state"] != "PREEMPTED":
            continue
        t, nodes = r["end"], set(expand_hostlist(r["nodelist"]))
        lost = (r["end"] - r["start"]) * r["nodes"]
        pre = sorted(((n2, r2) for n2, r2 in flat if n2 in by_name and rank[by_name[n2].tier] < rank[job.tier]
                      and t - 1 <= r2["start"] <= t + KILL_WAIT_S and r2.get("submit", t) <= t
                      and nodes & set(expand_hostlist(r2["nodelist"]))),
                     key=lambda x: x[1]["start"])
        if not pre:
            totals["no_preemptor_found"] += lost
            cases.append({"victim": name, "lost_node_s": lost, "preemptor": None})
            continue
        pname, prun = pre[0]
        pjob = by_name[pname]
        # what held nodes the second before the preemption (sacct's times are whole seconds: at t
        # itself the victims' and other jobs' ends and starts blur)
        running = [(n2, r2) for n2, r2 in flat if r2["start"] <= t - 1 < r2["end"]]
        options = {}
        for part in accepted(pjob):
            held = set().union(*[set(expand_hostlist(r2["nodelist"])) for _, r2 in running]) & PARTITION_NODES[part]
            clean = set().union(*[set(expand_hostlist(r2["nodelist"])) for n2, r2 in running
                                  if n2 in by_name and by_name[n2].ckpt and rank[by_name[n2].tier] > rank[pjob.tier]])
            # of those, the ones Slurm's preempt/qos takes before the victim: a checkpointing job of
            # the victim's tier or below (a higher tier's ``_ckpt`` QOS ranks above a lower plain tier)
            before = set().union(*[set(expand_hostlist(r2["nodelist"])) for n2, r2 in running
                                   if n2 in by_name and by_name[n2].ckpt and rank[by_name[n2].tier] >= rank[job.tier]])
            options[part] = {"idle": len(PARTITION_NODES[part] - held), "ckpt_lower": len(clean & PARTITION_NODES[part]),
                             "ckpt_before_victim": len(before & PARTITION_NODES[part])}
            if samples:
                options[part]["idle_live"] = live_idle(samples, t, part)
        # "idle" by sacct may still be COMPLETING in Slurm (its epilog on a loaded host): Slurm then
        # preempts at once rather than wait; "with_ckpt": lower-tier checkpointing jobs' nodes too
        ok = any(o["idle"] + o["ckpt_lower"] >= pjob.nodes for o in options.values())
        idle_only = any(o["idle"] >= pjob.nodes for o in options.values())
        totals["avoidable" if ok else "unavoidable"] += lost
        totals["of_it_idle_by_sacct"] += lost if idle_only else 0.0
        idle_live = any((o.get("idle_live") or 0) >= pjob.nodes for o in options.values())
        totals["of_it_idle_live"] += lost if idle_live else 0.0
        slurm_order = any(o["idle"] + o["ckpt_before_victim"] >= pjob.nodes for o in options.values())
        totals["of_it_slurm_order_would_spare"] += lost if ok and slurm_order else 0.0
        cases.append({"victim": name, "victim_nodes": r["nodes"], "lost_node_s": lost, "at": t,
                      "preemptor": pname, "preemptor_nodes": pjob.nodes, "preemptor_partition": prun.get("partition"),
                      "accepted": accepted(pjob), "options_at_preemption": options, "avoidable": ok,
                      "idle_by_sacct_enough": idle_only, "idle_live_enough": idle_live})
    plain = [c for c in cases if c.get("preemptor")]
    victims = {"preempted_runs": len(plain),
               "lost_node_s_per_run": round(sum(c["lost_node_s"] for c in plain) / len(plain), 1) if plain else None,
               "nodes_per_run": round(sum(c["victim_nodes"] for c in plain) / len(plain), 1) if plain else None}
    return {"cases": cases, "lost_node_s": {k: round(v, 1) for k, v in totals.items()}, "plain_victims": victims,
            "youngest_first": youngest_first(cases, by_name, flat, rank)}


def youngest_first(cases: list[dict[str, Any]], by_name: dict[str, TraceJob],
                   flat: list[tuple[str, dict[str, Any]]], rank: dict[str, int]) -> dict[str, float]:
    """An estimate, not a replay: what each preemptor's victims would have lost had Slurm taken
    the youngest lower-tier runs in the preemptor's partition first (SchedulerParameters=
    preempt_youngest_first) instead of its QOS-priority order (ties: the oldest job first, job_list
    order). A checkpointing run loses ~0 either way; a plain one all it has run. Idle nodes count
    as freed first. Ignores that another choice changes what runs later."""
    actual, young = 0.0, 0.0
    by_preemptor: dict[str, list[dict[str, Any]]] = {}
    for c in cases:
        if c.get("preemptor"):
            by_preemptor.setdefault(c["preemptor"], []).append(c)
    for pname, victims in by_preemptor.items():
        pjob, part = by_name[pname], victims[0]["preemptor_partition"]
        t = min(c["at"] for c in victims)
        actual += sum(c["lost_node_s"] for c in victims)
        if part not in PARTITION_NODES:
            young += sum(c["lost_node_s"] for c in victims)
            continue
        running = [(n2, r2) for n2, r2 in flat if r2["start"] <= t - 1 < r2["end"]
                   and set(expand_hostlist(r2["nodelist"])) <= PARTITION_NODES[part]]
        held = set().union(*[set(expand_hostlist(r2["nodelist"])) for _, r2 in running])
        freed = len(PARTITION_NODES[part] - held)
        cands = sorted(((n2, r2) for n2, r2 in running
                        if n2 in by_name and rank[by_name[n2].tier] > rank[pjob.tier]),
                       key=lambda x: -x[1]["start"])
        lost = 0.0
        for n2, r2 in cands:
            if freed >= pjob.nodes:
                break
            freed += r2["nodes"]
            job = by_name[n2]
            lost += 0.0 if (job.ckpt or job.hetrun) else (t - r2["start"]) * r2["nodes"]
        young += lost
    return {"actual_plain_lost_node_s": round(actual, 1), "youngest_first_estimate_node_s": round(young, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("result", type=Path)
    ap.add_argument("--side", default="policy_fit")
    ap.add_argument("--sacct", type=Path, help="a sacct dump with Partition,NodeList (old results lack them)")
    args = ap.parse_args()
    doc = json.loads(args.result.read_text())
    side = doc[args.side]
    trace = [TraceJob(**{**j, "gpu_types": tuple(j["gpu_types"])}) for j in doc["trace"]]
    names = side["raw"]["names"]
    runs = side["raw"]["runs"]
    if args.sacct:
        runs = parse_sacct(args.sacct.read_text(), side["tag"] + "-")
    out = explain(trace, names, runs, side["raw"].get("samples"))
    out["work_node_s"] = side.get("work_node_s")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
