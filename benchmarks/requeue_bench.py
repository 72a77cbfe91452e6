"""Requeue to first resumed step, broken down, for the example jobs on the local Slurm cluster.

    python benchmarks/requeue_bench.py            # each example preempted twice
    python benchmarks/requeue_bench.py --quick    # once each
    python benchmarks/requeue_bench.py --examples moe_lm --restarts 3

Each example job (examples/ppo_cartpole.yaml, examples/moe_lm.yaml) is
submitted with `hetrun submit` (many iterations, a checkpoint every
--interval), preempted mid-interval by a job in the high-priority partition
``high`` on the learner's node (PreemptMode=REQUEUE: Slurm signals it, the
runtime checkpoints and exits, Slurm requeues it), and timed from Slurm's
StartTime of the new attempt to the end of its first resumed optimizer step.
Every stage is a real timestamp: sacct's Start (1 s resolution: the first
stage carries up to 1 s of rounding), the batch script's $EPOCHREALTIME
exports, and the runtime's ``startup``/``restore``/``action`` events. A stage
ends when its slowest rank reached it (the critical path). Prints a markdown
table; writes every timestamp to benchmarks/results/requeue.json.

What the user waits through is measured too, from accounting (1 s
resolution): Slurm's preemption of the job (End of its PREEMPTED attempt),
the preemptor's own run (its Start/End: it frees the nodes at its End),
Slurm's requeue hold (the requeued attempt's Submit -> Eligible) and whether
hetrun shortened the hold (``requeue_hold_shortened``). ``--keep-hold`` runs
the job with HETRUN_KEEP_REQUEUE_HOLD=1 (Slurm's own hold, as without
hetrun's post-mortem), the side-by-side peer.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from hetrun.rundir import read_events

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "requeue.json"

# (label, timestamp key) in the order a restart reaches them; durations are
# differences between consecutive critical-path times.
STAGES = [
    ("Slurm StartTime -> batch script start", "batch_start"),
    ("batch script -> srun", "srun_start"),
    ("srun -> rank processes started", "proc_start"),
    ("interpreter + hetrun package", "interp_ready"),
    ("plan.json load + check", "mpi_start"),
    ("MPI_Init (mpi4py, PMIx)", "mpi_ready"),
    ("communicators (component, node)", "world_ready"),
    ("import torch", "torch_imported"),
    ("torch process groups (TCPStore, gloo)", "groups_ready"),
    ("executor (routes, mailbox, node sharing)", "executor_ready"),
    ("workload import + init", "restore_entered"),
    ("restore (agree, read, verify, load)", "restore_done"),
    ("first resumed step", "first_step"),
]


def sh(argv: list[str], check: bool = True) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=check).stdout


def events(run_dir: Path) -> list[dict[str, Any]]:
    return list(read_events(run_dir))  # a line still being written is left for the next poll


def wait_for(pred: Any, timeout: float, what: str, poll: float = 0.5) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = pred()
        if value:
            return value
        time.sleep(poll)
    raise SystemExit(f"requeue_bench: timed out after {timeout:.0f} s waiting for {what}")


def is_step(e: dict[str, Any]) -> bool:
    """An action event that ends an optimizer step (optimize alone or fused into a sync)."""
    return e.get("ev") == "action" and (
        e.get("type") == "optimize" or "optimize" in str(e.get("id", "")).split("+"))


def submit(example: str, args: argparse.Namespace, runs_dir: Path) -> tuple[str, Path]:
    keep = ["--set", "env.HETRUN_KEEP_REQUEUE_HOLD=1"] if getattr(args, "keep_hold", False) else []
    out = sh([sys.executable, "-m", "hetrun.cli", "submit", str(ROOT / "examples" / f"{example}.yaml"),
              "--runs-dir", str(runs_dir), *keep,
              "--set", f"training.iterations={args.iterations}",
              "--set", f"checkpoint.interval={args.interval}",
              "--set", f"preemption.max_restarts={args.restarts + 1}",
              "--set", "slurm.partition=debug", "--set", "slurm.time=00:30:00"])
    job = re.search(r"as job (\d+)", out)
    run = re.search(r"run directory: (\S+)", out)
    if not job or not run:
        raise SystemExit(f"requeue_bench: cannot read job id / run directory from:\n{out}")
    return job.group(1), Path(run.group(1))


def learner_node(job_id: str) -> str:
    """The first node of the first het component (the learner)."""
    line = sh(["scontrol", "-o", "show", "job", job_id]).splitlines()[0]
    nodes = re.search(r"\bNodeList=(\S+)", line)
    if not nodes or nodes.group(1) == "(null)":
        raise SystemExit(f"requeue_bench: job {job_id} has no nodes: {line}")
    return sh(["scontrol", "show", "hostnames", nodes.group(1)]).split()[0]


def preempt(node: str) -> str:
    out = sh(["sbatch", "--parsable", "-p", "high", "-w", node, "--exclusive", "-t", "00:02:00",
              "-J", "requeue-bench-preemptor", "--output=/dev/null", "--wrap", "sleep 2"])
    return out.strip().split(";")[0]


def slurm_start(job_id: str, not_before: float = 0.0) -> float:
    """sacct's Start of the current attempt (earliest het component), epoch seconds (1 s resolution).

    After a second requeue sacct may still show a het component's Start of an
    earlier attempt: starts before ``not_before`` (the preemption) are ignored."""
    starts = []
    for line in sh(["sacct", "-X", "-n", "-P", "-j", job_id, "-o", "JobID,Start"]).splitlines():
        _, _, start = line.partition("|")
        if start and start not in ("Unknown", "None"):
            starts.append(datetime.fromisoformat(start).timestamp())  # local time, as sacct prints
    current = [t for t in starts if t >= not_before - 2.0]  # 1 s resolution, seconds truncated
    if not current:
        raise SystemExit(f"requeue_bench: sacct has no Start after the preemption for job {job_id}")
    return min(current)


def _epoch(value: str) -> float | None:
    try:
        return datetime.fromisoformat(value).timestamp()  # local time, as sacct prints it
    except ValueError:
        return None


def sacct_attempts(job_id: str) -> list[dict[str, Any]]:
    """Every attempt of ``job_id`` (each het component's row), times as epoch seconds or None."""
    keys = ("JobID", "State", "Submit", "Eligible", "Start", "End")
    rows = []
    for line in sh(["sacct", "-X", "-D", "-n", "-P", "-j", job_id, "-o", ",".join(keys)]).splitlines():
        parts = line.split("|")
        if len(parts) == len(keys):
            row: dict[str, Any] = dict(zip(keys, parts, strict=True))
            for k in keys[2:]:
                row[k] = _epoch(row[k])
            rows.append(row)
    return rows


def user_wait(job_id: str, preemptor: str, not_before: float) -> dict[str, float]:
    """What the user waits through, from accounting (1 s resolution; waits for slurmdbd):
    ``preempted`` (End of the attempt Slurm preempted), the preemptor's ``preemptor_start`` and
    ``preemptor_end`` (it frees the nodes then), and the requeued attempt's ``requeued`` (its
    Submit: Slurm resets it when the requeue completes) and ``eligible`` (end of the hold)."""
    def ready() -> dict[str, float] | None:
        mine = [r for r in sacct_attempts(job_id) if r["End"] and r["End"] >= not_before - 2
                and r["State"].startswith("PREEMPTED")]
        nxt = [r for r in sacct_attempts(job_id) if r["Submit"] and r["Submit"] >= not_before - 2
               and r["Eligible"] and not r["State"].startswith("PREEMPTED")]
        # (a job id can come again on a re-created cluster: only this preemptor's run)
        pre = [r for r in sacct_attempts(preemptor) if r["Start"] and r["End"] and r["Start"] >= not_before - 2]
        if not mine or not nxt or not pre:
            return None
        return {"preempted": min(r["End"] for r in mine), "preemptor_start": pre[0]["Start"],
                "preemptor_end": pre[0]["End"], "requeued": min(r["Submit"] for r in nxt),
                "eligible": max(r["Eligible"] for r in nxt)}
    return wait_for(ready, 120, f"accounting of job {job_id}'s preemption and preemptor {preemptor}", poll=1)


def wait_rows(rows: list[dict[str, Any]]) -> list[tuple[str, list[str]]]:
    """The user's side of each restart, one table row each (first step: the critical path's)."""
    def col(f: Any) -> list[str]:
        return [f(r["critical"]["first_step"], r["user_wait"], r) for r in rows]
    return [
        ("**Slurm preempts the job -> first resumed step**",
         col(lambda s, w, r: f"**{s - w['preempted']:.1f}**")),
        ("(the preemptor's own run: its Start -> End)",
         col(lambda s, w, r: f"{w['preemptor_end'] - w['preemptor_start']:.0f}")),
        ("**preemptor frees the nodes -> first resumed step**",
         col(lambda s, w, r: f"**{s - w['preemptor_end']:.1f}**")),
        ("Slurm's requeue hold (requeued -> eligible)",
         col(lambda s, w, r: f"{w['eligible'] - w['requeued']:.0f}"
             + (" (shortened by hetrun)" if r.get("hold_shortened") else " (Slurm's)"))),
    ]


def restart_breakdown(evs: list[dict[str, Any]], restart: int, nranks: int) -> dict[str, Any] | None:
    """Critical-path times of one restart, or None while some rank has not got that far."""
    startups = {e["rank"]: e for e in evs if e.get("ev") == "startup" and e.get("restart_count") == restart}
    restores = {e["rank"]: e for e in evs if e.get("ev") == "restore" and e.get("restart_count") == restart
                and "seconds" in e}
    if len(startups) < nranks or len(restores) < nranks:
        return None
    since = min(s["time"] for s in startups.values())
    steps: dict[int, float] = {}
    for e in evs:
        if is_step(e) and e.get("start", 0) >= since and e["rank"] not in steps:
            steps[e["rank"]] = e["end"]
    learners = {e["rank"] for e in evs if is_step(e)}
    if not learners or not learners <= set(steps):
        return None
    per_rank: dict[int, dict[str, float]] = {}
    for rank, s in startups.items():
        t: dict[str, float] = {}
        # Without bash 5 the script dates nothing: its stages then read 0.
        last = float(s.get("batch_start") or s.get("srun_start") or s["proc_start"])
        for _, key in STAGES[:10]:
            last = float(s[key]) if s.get(key) is not None else last  # a 1-rank world has no groups
            t[key] = last
        t["restore_entered"] = restores[rank]["entered"]
        t["restore_done"] = restores[rank]["time"]
        if rank in steps:
            t["first_step"] = steps[rank]
        per_rank[rank] = t
    crit = {key: max(t[key] for t in per_rank.values() if key in t) for _, key in STAGES}
    # batch_start/srun_start are the same on every rank (one batch script).
    restore0 = restores[min(restores)]
    return {"critical": crit, "per_rank": per_rank, "restored_step": restore0.get("step"),
            "work_lost": max((r.get("work_lost") or 0) for r in restores.values())}


def run_example(example: str, args: argparse.Namespace, runs_dir: Path) -> list[dict[str, Any]]:
    job_id, run_dir = submit(example, args, runs_dir)
    print(f"{example}: job {job_id}, run {run_dir}", file=sys.stderr)
    rows = []
    try:
        nranks = wait_for(lambda: len({e["rank"] for e in events(run_dir) if e.get("ev") == "startup"}),
                          300, f"{example} to start")
        time.sleep(2)  # every rank's startup event (they come within a second of each other)
        nranks = len({e["rank"] for e in events(run_dir) if e.get("ev") == "startup"})
        resumed_at = 0
        for restart in range(1, args.restarts + 1):
            # Mid-interval, past a checkpoint: the preemption checkpoint is what saves the work.
            target = resumed_at + args.interval + args.interval // 2
            wait_for(lambda t=target: any(is_step(e) and e.get("iteration", -1) >= t for e in events(run_dir)),
                     600, f"{example} to pass iteration {target}")
            preempted_at = time.time()
            preemptor = preempt(learner_node(job_id))
            got = wait_for(lambda r=restart: restart_breakdown(events(run_dir), r, nranks), 600,
                           f"{example} restart {restart} to take its first step")
            start = slurm_start(job_id, preempted_at)
            got["critical"]["slurm_start"] = start
            got.update(example=example, restart=restart, job_id=job_id, ranks=nranks,
                       preempted_at=preempted_at, run_dir=str(run_dir),
                       user_wait=user_wait(job_id, preemptor, preempted_at),
                       hold_shortened=any(e.get("ev") == "requeue_hold_shortened"
                                          and e.get("restart_count") == restart - 1 for e in events(run_dir)))
            resumed_at = int(got["restored_step"] or 0)
            rows.append(got)
            total = got["critical"]["first_step"] - start
            print(f"{example} restart {restart}: {total:.2f} s from Slurm start to first step", file=sys.stderr)
    finally:
        subprocess.run(["scancel", job_id], capture_output=True, check=False)
    return rows


def durations(row: dict[str, Any]) -> list[float]:
    crit = row["critical"]
    prev = crit["slurm_start"]
    out = []
    for _, key in STAGES:
        out.append(crit[key] - prev)
        prev = crit[key]
    return out


def stage_table(rows: list[dict[str, Any]], heads: list[str], cols: list[list[float]],
                labels: list[str], lost_unit: str) -> str:
    """The markdown breakdown both requeue benchmarks print: one column per restart."""
    lines = ["| stage (critical path: slowest rank) | " + " | ".join(heads) + " |",
             "|---|" + "---|" * len(rows)]
    for i, label in enumerate(labels):
        lines.append(f"| {label} | " + " | ".join(f"{c[i]:.2f}" for c in cols) + " |")
    lines.append("| **total: Slurm StartTime -> first resumed step** | "
                 + " | ".join(f"**{sum(c):.2f}**" for c in cols) + " |")
    lines.append("| (not counted) preempted -> Slurm StartTime of the requeued job | "
                 + " | ".join(f"{r['critical']['slurm_start'] - r['preempted_at']:.1f}" for r in rows) + " |")
    lines.append(f"| work lost ({lost_unit}) | " + " | ".join(str(r["work_lost"]) for r in rows) + " |")
    if all("user_wait" in r for r in rows):
        lines += [f"| {label} | " + " | ".join(cells) + " |" for label, cells in wait_rows(rows)]
    return "\n".join(lines)


def wait_summary(rows: list[dict[str, Any]]) -> str:
    """Medians of what the user waits, per example."""
    out = []
    for ex in sorted({r["example"] for r in rows}):
        mine = [r for r in rows if r["example"] == ex]
        pre = [r["critical"]["first_step"] - r["user_wait"]["preempted"] for r in mine]
        free = [r["critical"]["first_step"] - r["user_wait"]["preemptor_end"] for r in mine]
        own = [r["user_wait"]["preemptor_end"] - r["user_wait"]["preemptor_start"] for r in mine]
        out.append(f"{ex}: preempted -> first resumed step median {statistics.median(pre):.1f} s "
                   f"(preemptor's own run {statistics.median(own):.0f} s); nodes free -> first resumed step "
                   f"median {statistics.median(free):.1f} s, max {max(free):.1f} s (target <= 10 s)")
    return "\n".join(out)


def table(rows: list[dict[str, Any]]) -> str:
    heads = [f"{r['example']} #{r['restart']} ({r['ranks']} ranks)" for r in rows]
    return stage_table(rows, heads, [durations(r) for r in rows], [label for label, _ in STAGES], "iterations")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="one restart per example (default two)")
    ap.add_argument("--restarts", type=int, default=None, help="restarts per example")
    ap.add_argument("--examples", default="ppo_cartpole,moe_lm")
    ap.add_argument("--iterations", type=int, default=100000, help="never reached: the job is cancelled after")
    ap.add_argument("--interval", type=int, default=10, help="checkpoint.interval")
    ap.add_argument("--runs-dir", type=Path, default=Path("/var/tmp/hetrun-requeue-bench"),
                    help="outside /tmp: slurmd runs jobs with a private /tmp")
    ap.add_argument("--json", type=Path, default=RESULTS)
    ap.add_argument("--keep-hold", action="store_true",
                    help="HETRUN_KEEP_REQUEUE_HOLD=1 in the job: Slurm's own requeue hold, the peer")
    args = ap.parse_args()
    args.restarts = args.restarts or (1 if args.quick else 2)
    if subprocess.run(["sinfo", "-h"], capture_output=True).returncode != 0:
        raise SystemExit("requeue_bench: Slurm does not answer (sinfo); start it with `hetrun cluster up`")
    args.runs_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for example in args.examples.split(","):
        rows += run_example(example.strip(), args, args.runs_dir)
    print(table(rows))
    totals = [sum(durations(r)) for r in rows]
    print(f"\nmedian total {statistics.median(totals):.2f} s, max {max(totals):.2f} s "
          f"(target < 10 s); Slurm StartTime has 1 s resolution. "
          f"load average at the end: {Path('/proc/loadavg').read_text().split()[0]}")
    print(wait_summary(rows))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"stages": STAGES, "rows": rows,
                                     "command": " ".join(sys.argv)}, indent=1, default=str))
    print(f"wrote {args.json}", file=sys.stderr)


if __name__ == "__main__":
    main()
