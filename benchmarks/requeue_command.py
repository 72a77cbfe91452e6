"""Requeue to first resumed step of a command component (examples/ddp_train_hetrun.py), broken down.

    python benchmarks/requeue_command.py                  # 3 preemptions of the DDP example
    python benchmarks/requeue_command.py --restarts 2 --peer ppo_cartpole

The DDP example (torchrun-style script with the run API: gloo DDP, AdamW,
async incremental checkpoints) runs as a 2-node command component on the local
Slurm cluster, is preempted by a job in partition ``high`` on its first node
(PreemptMode=REQUEUE: SIGTERM, the API agrees on a step, saves, exits 143;
Slurm requeues the job), and each restart is timed from Slurm's StartTime of
the requeued job to the end of the first resumed step, stage by stage, on the
critical path (each stage ends when its slowest rank reaches it):

    Slurm StartTime -> batch script (sacct Start, 1 s resolution; $EPOCHREALTIME)
    -> srun                          (HETRUN_SRUN_START, just before srun)
    -> wrapper process started       (/proc start time of hetrun.runtime.command_rank)
    -> wrapper up                    (its ``start`` event: plan read, torchrun variables)
    -> API attached                  (the script's ``start`` event: interpreter, import torch, attach)
    -> restore entered               (``restore`` event's ``entered``: process group, model, DDP)
    -> restore done                  (``restore`` event: agree, read, verify, load in place)
    -> first resumed step            (end of the first ``step`` line after the restore)

``--peer EXAMPLE`` also runs benchmarks/requeue_bench.py's breakdown for an
action-executor example in the same invocation (same machine state). As there,
what the user waits through is shown too (Slurm's preemption and the
preemptor's end -> first resumed step, the preemptor's own run, Slurm's
requeue hold); ``--keep-hold`` keeps Slurm's hold (HETRUN_KEEP_REQUEUE_HOLD=1).
Raw timestamps: benchmarks/results/requeue_command.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from requeue_bench import (
    events,
    learner_node,
    preempt,
    slurm_start,
    stage_table,
    user_wait,
    wait_for,
    wait_summary,
)

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "ddp_train_hetrun.py"
RESULTS = ROOT / "benchmarks" / "results" / "requeue_command.json"
STAGES = [
    ("Slurm StartTime -> batch script start", "batch_start"),
    ("batch script -> srun", "srun_start"),
    ("srun -> wrapper process started", "proc_start"),
    ("wrapper up (plan, torchrun variables)", "wrapper_up"),
    ("script: interpreter, import torch, attach", "attached"),
    ("script: process group, model, DDP", "restore_entered"),
    ("restore (agree, read, verify, load)", "restore_done"),
    ("first resumed step", "first_step"),
]


def submit(args: argparse.Namespace, runs_dir: Path) -> tuple[str, Path]:
    from hetrun.dag.spec import spec_from_dict
    from hetrun.slurm_plugin.submit import submit_spec

    spec = spec_from_dict({
        "name": "requeue-cmd",
        "components": {"trainer": {"nodes": 2, "tasks_per_node": 1, "mem": "1G", "command": [
            sys.executable, str(EXAMPLE), "--steps", "100000", "--out", str(runs_dir / "out"),
            "--step-time", str(args.step_time), "--save-every", str(args.save_every)]}},
        "slurm": {"partition": "debug", "time": "00:30:00"},
        "env": {"OMP_NUM_THREADS": "1", **({"HETRUN_KEEP_REQUEUE_HOLD": "1"} if args.keep_hold else {})}})
    res = submit_spec(spec, backend="sbatch", runs_dir=runs_dir)
    return str(res.run.job_id), Path(res.run.run_dir)


def breakdown(evs: list[dict[str, Any]], restart: int, nranks: int) -> dict[str, Any] | None:
    """Critical-path times of one restart, or None while some rank has not got that far."""
    wrappers = {e["rank"]: e for e in evs if e.get("ev") == "start" and e.get("command")
                and e.get("restart_count") == restart}
    attached = {e["rank"]: e for e in evs if e.get("ev") == "start" and e.get("api")
                and e.get("restart_count") == restart}
    restores = {e["rank"]: e for e in evs if e.get("ev") == "restore" and e.get("restart_count") == restart}
    if min(len(wrappers), len(attached), len(restores)) < nranks:
        return None
    per_rank: dict[int, dict[str, float]] = {}
    for rank, w in wrappers.items():
        after = restores[rank]["time"]
        first = [e["end"] for e in evs if e.get("ev") == "action" and e.get("type") == "step"
                 and e.get("rank") == rank and e.get("end", 0) >= after]
        if not first:
            return None
        per_rank[rank] = {"batch_start": float(w["batch_start"]), "srun_start": float(w["srun_start"]),
                          "proc_start": float(w["proc_start"]), "wrapper_up": w["time"],
                          "attached": attached[rank]["time"], "restore_entered": restores[rank]["entered"],
                          "restore_done": after, "first_step": min(first)}
    crit = {key: max(t[key] for t in per_rank.values()) for _, key in STAGES}
    return {"critical": crit, "per_rank": per_rank, "restored_step": restores[min(restores)].get("step"),
            "work_lost": max((r.get("work_lost") or 0) for r in restores.values())}


def run(args: argparse.Namespace, runs_dir: Path) -> list[dict[str, Any]]:
    job, run_dir = submit(args, runs_dir)
    print(f"ddp command: job {job}, run {run_dir}", file=sys.stderr)
    rows = []
    try:
        for restart in range(1, args.restarts + 1):
            # Past a checkpoint of this attempt, mid-interval.
            def ready(r: int = restart) -> bool:
                evs = events(run_dir)
                mine = [e for e in evs if e.get("ev") == "restore" and e.get("restart_count") == r - 1]
                since = max((e["time"] for e in mine), default=0.0)
                return sum(1 for e in evs if e.get("ev") == "checkpoint" and e["time"] > since) >= 2

            wait_for(ready, 600, f"attempt {restart - 1} to checkpoint")
            time.sleep(args.save_every * args.step_time / 2)
            preempted_at = time.time()
            preemptor = preempt(learner_node(job))
            got = wait_for(lambda r=restart: breakdown(events(run_dir), r, 2), 600,
                           f"restart {restart} to take its first step")
            got["critical"]["slurm_start"] = slurm_start(job, preempted_at)
            got.update(example="ddp_train_hetrun (command)", restart=restart, job_id=job, ranks=2,
                       preempted_at=preempted_at, run_dir=str(run_dir),
                       user_wait=user_wait(job, preemptor, preempted_at),
                       hold_shortened=any(e.get("ev") == "requeue_hold_shortened"
                                          and e.get("restart_count") == restart - 1 for e in events(run_dir)))
            rows.append(got)
            total = got["critical"]["first_step"] - got["critical"]["slurm_start"]
            print(f"restart {restart}: {total:.2f} s from Slurm start to first resumed step", file=sys.stderr)
    finally:
        subprocess.run(["scancel", job], capture_output=True, check=False)
    return rows


def durations(row: dict[str, Any]) -> list[float]:
    crit, prev, out = row["critical"], row["critical"]["slurm_start"], []
    for _, key in STAGES:
        out.append(crit[key] - prev)
        prev = crit[key]
    return out


def table(rows: list[dict[str, Any]]) -> str:
    return stage_table(rows, [f"#{r['restart']}" for r in rows], [durations(r) for r in rows],
                       [label for label, _ in STAGES], "steps")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--restarts", type=int, default=3)
    ap.add_argument("--step-time", type=float, default=0.1, help="the example's extra seconds per step")
    ap.add_argument("--save-every", type=int, default=20)
    ap.add_argument("--peer", default="", help="also an action-executor example of requeue_bench.py, e.g. ppo_cartpole")
    ap.add_argument("--runs-dir", type=Path, default=Path("/var/tmp/hetrun-requeue-command"),
                    help="outside /tmp: slurmd runs jobs with a private /tmp")
    ap.add_argument("--json", type=Path, default=RESULTS)
    ap.add_argument("--keep-hold", action="store_true",
                    help="HETRUN_KEEP_REQUEUE_HOLD=1 in the job: Slurm's own requeue hold, the peer")
    args = ap.parse_args()
    if subprocess.run(["sinfo", "-h"], capture_output=True).returncode != 0:
        raise SystemExit("requeue_command: Slurm does not answer (sinfo); start it with `hetrun cluster up`")
    args.runs_dir.mkdir(parents=True, exist_ok=True)
    rows = run(args, args.runs_dir)
    print(table(rows))
    totals = [sum(durations(r)) for r in rows]
    print(f"\nmedian total {statistics.median(totals):.2f} s, max {max(totals):.2f} s (target < 10 s); "
          f"load average at the end: {Path('/proc/loadavg').read_text().split()[0]}")
    print(wait_summary(rows))
    peer: list[dict[str, Any]] = []
    if args.peer:
        import requeue_bench

        peer_args = argparse.Namespace(iterations=100000, interval=10, restarts=args.restarts,
                                       keep_hold=args.keep_hold)
        peer = requeue_bench.run_example(args.peer, peer_args, args.runs_dir)
        print(f"\npeer, {args.peer} (action executor), same invocation:\n{requeue_bench.table(peer)}")
        print(wait_summary(peer))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"stages": STAGES, "rows": rows, "peer": peer, "command": " ".join(sys.argv),
                                     "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())},
                                    indent=1, default=str))
    print(f"wrote {args.json}", file=sys.stderr)


if __name__ == "__main__":
    main()
