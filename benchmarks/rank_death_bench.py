"""Time from a rank's kill -9 to the end of its job, on the local Slurm cluster.

    flock /var/lock/hetrun-heavy.lock python benchmarks/rank_death_bench.py --kills 20 --old-kills 3

Each trial submits a small PPO job (examples/ppo_cartpole.yaml: learner + 2 rollout ranks, a checkpoint
every 2 iterations, far more iterations than it will run), waits for its
first checkpoint, waits a random 0-1.5 s more, and SIGKILLs one rank
(alternating rollout rank 2 / learner rank 0). Measured per trial:

- ``to_attempt_end``: kill -> the batch script's ``attempt_end`` line (its
  ``t``), written once srun has returned and the post-mortem named the rank;
  the script exits right after it;
- ``to_gone``: kill -> the job no longer running in squeue (polled every 0.2 s).

"new" is hetrun as rendered (the batch script's srun reader SIGKILLs the step
on the first death; the post-mortem names it).
"old" is the behaviour before it: an ``srun`` wrapper put first on PATH keeps
srun's messages from the script's reader (srun runs with
``--kill-on-bad-exit=0``), so survivors wait in a collective
until HETRUN_COLLECTIVE_TIMEOUT; that timeout is shortened to
``--old-timeout`` seconds (default 30, the real default is 120) to keep the
run short, and the result reads as "timeout + what remains".
Writes benchmarks/results/rank_death.json and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from hetrun.dag.spec import spec_from_dict
from hetrun.slurm_plugin.rundir import events_of, wait_for
from hetrun.slurm_plugin.submit import submit_spec

from hetrun.rundir import event_time

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "rank_death.json"
OLD_SRUN = """#!/bin/bash
# Benchmark stand-in: srun as hetrun rendered it before (a dead task does not end the step),
# its messages kept from the batch script's reader (which would SIGKILL the step).
exec {srun} "$@" 2>>"$HETRUN_RUN_DIR/logs/old-srun.err"
"""


def _spec(name: str, timeout_s: int) -> Any:
    """examples/ppo_cartpole.yaml, small and endless: a checkpoint every 2 iterations."""
    data = yaml.safe_load((ROOT / "examples" / "ppo_cartpole.yaml").read_text())
    data.update(name=name, checkpoint={"interval": 2, "keep": 2})
    data["workload_args"].update(num_envs=2, num_steps=32)
    data["training"].update(iterations=100000, micro_batches=1)
    data["components"]["learner"]["actions"].remove("eval")
    data["slurm"]["time"] = "00:10:00"
    data["env"]["HETRUN_COLLECTIVE_TIMEOUT"] = str(timeout_s)
    return spec_from_dict(data)


def _running(job: str) -> bool:
    out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True,
                         check=False).stdout
    return any(s.strip() in ("RUNNING", "COMPLETING", "CONFIGURING") for s in out.splitlines())


def trial(root: Path, mode: str, rank: int, timeout_s: int) -> dict[str, Any]:
    res = submit_spec(_spec(f"death-{mode}", timeout_s), backend="sbatch", runs_dir=root)
    run_dir, job = Path(res.run.run_dir), str(res.run.job_id).split(";")[0]
    try:
        def ready() -> bool:
            return len(events_of(run_dir, ("start",))) == 3 and bool(events_of(run_dir, ("checkpoint",)))

        if not wait_for(ready, 300, 0.2):
            raise RuntimeError(f"{run_dir}: no checkpoint within 300 s")
        time.sleep(random.uniform(0.0, 1.5))
        victim = next(e for e in events_of(run_dir, ("start",)) if e["rank"] == rank)
        killed = time.time()
        os.kill(int(victim["pid"]), signal.SIGKILL)
        wait_for(lambda: not _running(job), timeout_s + 240, 0.2)
        gone = time.time()
        wait_for(lambda: bool(events_of(run_dir, ("attempt_end",))), 30, 0.2)
    finally:
        subprocess.run(["scancel", job], capture_output=True, check=False)
    ends = events_of(run_dir, ("attempt_end",))
    fails = events_of(run_dir, ("rank_failure",))
    return {
        "mode": mode, "rank": rank, "component": victim["component"], "node": victim["node"],
        "to_gone": round(gone - killed, 3),
        "to_attempt_end": round(event_time(ends[0]) - killed, 3) if ends else None,
        "named": [(f.get("rank"), f.get("component"), f.get("signal"), f.get("detected_by")) for f in fails],
        "run_dir": str(run_dir),
    }


def _summary(rows: list[dict[str, Any]], key: str) -> str:
    vals = [r[key] for r in rows if r[key] is not None]
    if not vals:
        return "n/a"
    return f"median {statistics.median(vals):.2f} s, max {max(vals):.2f} s (n={len(vals)})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--old-kills", type=int, default=3)
    ap.add_argument("--old-timeout", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    random.seed(args.seed)
    root = Path(tempfile.mkdtemp(prefix="rank-death-", dir="/var/tmp"))
    rows = []
    for i in range(args.kills):
        rows.append(trial(root / "new", "new", 2 if i % 2 == 0 else 0, 900))
        print(json.dumps(rows[-1]), flush=True)
    bin_dir = root / "old-bin"
    bin_dir.mkdir(parents=True)
    real = subprocess.run(["which", "srun"], capture_output=True, text=True, check=True).stdout.strip()
    (bin_dir / "srun").write_text(OLD_SRUN.format(srun=real))
    (bin_dir / "srun").chmod(0o755)
    path = os.environ["PATH"]
    os.environ["PATH"] = f"{bin_dir}:{path}"  # sbatch exports it: the batch script finds the wrapper
    try:
        for i in range(args.old_kills):
            rows.append(trial(root / "old", "old", 2 if i % 2 == 0 else 0, args.old_timeout))
            print(json.dumps(rows[-1]), flush=True)
    finally:
        os.environ["PATH"] = path
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"args": vars(args), "trials": rows}, indent=1) + "\n")
    print("\n| behaviour | kill -> attempt_end | kill -> job gone from squeue |")
    print("|---|---|---|")
    for mode, label in (("new", "srun reader SIGKILLs the step + post-mortem"),
                        ("old", f"kill-on-bad-exit=0, collective timeout {args.old_timeout} s")):
        sel = [r for r in rows if r["mode"] == mode]
        print(f"| {label} | {_summary(sel, 'to_attempt_end')} | {_summary(sel, 'to_gone')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
