"""`hetrun status` over 100 runs: wall time next to a bare `squeue` (and `squeue --json`) in the
same run, interleaved, and the number of Slurm commands status ran (counted through a PATH shim
that logs each call).

The run directories are written here (Slurm backend, job ids of jobs that no longer exist, so
status asks squeue once and sacct once; 2,000 events each with a restart). Issue 24's target:
`hetrun status` (its default: the newest 20 runs) within squeue + 0.3 s with 100 runs in the
directory; `--last 0` (all of them) is measured too.

    python3 benchmarks/status_scale.py [--runs 100] [--repeat 7]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def make_runs(root: Path, n: int) -> None:
    for i in range(n):
        d = root / f"bench-{i:03d}-20260101-000000-{i:04x}"
        d.mkdir(parents=True)
        (d / "run.json").write_text(json.dumps({"name": f"bench-{i:03d}", "run_dir": str(d), "backend": "sbatch",
                                                "job_id": str(900000 + i), "components": ["learner", "rollout"],
                                                "submitted_at": "2026-01-01T00:00:00Z"}))
        with (d / "events.jsonl").open("w") as fh:
            for k in range(1000):
                fh.write(json.dumps({"ev": "action", "type": "rollout", "iteration": k, "rank": 1,
                                     "component": "rollout", "node": "n2", "start": k, "end": k + 0.5}) + "\n")
            fh.write(json.dumps({"ev": "attempt_end", "restart_count": 0, "outcome": "preempted",
                                 "requeued": True, "exit_code": 0, "reason": "bench", "t": 1000}) + "\n")
            fh.write(json.dumps({"ev": "restore", "rank": 1, "component": "rollout", "restart_count": 1,
                                 "step": 990, "iteration": 990, "restored_state": True, "work_lost": 9}) + "\n")
            for k in range(990, 1990):
                fh.write(json.dumps({"ev": "action", "type": "rollout", "iteration": k, "rank": 1,
                                     "component": "rollout", "node": "n2", "start": k, "end": k + 0.5}) + "\n")


def shim(bin_dir: Path, log: Path) -> None:
    for cmd in ("squeue", "sacct"):
        real = shutil.which(cmd)
        p = bin_dir / cmd
        p.write_text(f'#!/bin/sh\necho {cmd} >> "{log}"\nexec "{real}" "$@"\n')
        p.chmod(0o755)


def timed(cmd: list[str], env: dict[str, str], times: list[float]) -> None:
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, capture_output=True, check=True)
    times.append(time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        root, bin_dir, log = Path(tmp) / "runs", Path(tmp) / "bin", Path(tmp) / "calls.log"
        bin_dir.mkdir()
        make_runs(root, args.runs)
        shim(bin_dir, log)
        env = {**os.environ, "HETRUN_RUNS": str(root), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
        hetrun = [sys.executable, "-m", "hetrun.cli"]
        cmds = {"squeue": ["squeue"], "squeue_json": ["squeue", "--json"],
                "status": [*hetrun, "status"], "status_all": [*hetrun, "status", "--last", "0"]}
        times: dict[str, list[float]] = {k: [] for k in cmds}
        for cmd in cmds.values():  # warm-up: page cache, the controller's connection
            subprocess.run(cmd, env=env, capture_output=True, check=True)
        calls: list[str] = []
        for _ in range(args.repeat):  # interleaved: every command sees the same load
            for key, cmd in cmds.items():
                log.write_text("")
                timed(cmd, env, times[key])
                if key == "status":
                    calls += log.read_text().split()
        med = {k: statistics.median(v) for k, v in times.items()}
        over = med["status"] - med["squeue"]
        print(json.dumps({
            "runs": args.runs, "repeat": args.repeat, "load_average_1m": round(os.getloadavg()[0], 2),
            "squeue_median_s": round(med["squeue"], 3), "squeue_json_median_s": round(med["squeue_json"], 3),
            "status_median_s": round(med["status"], 3), "status_all_median_s": round(med["status_all"], 3),
            "status_spread_s": [round(min(times["status"]), 3), round(max(times["status"]), 3)],
            "status_minus_squeue_s": round(over, 3), "target_s": 0.3, "met": over <= 0.3,
            "slurm_calls_per_status": {c: calls.count(c) / args.repeat for c in sorted(set(calls))},
        }))


if __name__ == "__main__":
    main()
