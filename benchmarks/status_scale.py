"""`hetrun status` over 50 runs: wall time next to `squeue --json` alone, in the same run, and the
number of Slurm commands status ran (counted through a PATH shim that logs each call).

The 50 run directories are written here (Slurm backend, job ids of jobs that no longer exist, so
status asks squeue once and sacct once for all of them; 2,000 events each with a restart).

    python3 benchmarks/status_scale.py [--runs 50] [--repeat 5]
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


def timed(cmd: list[str], env: dict[str, str], repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run(cmd, env=env, capture_output=True, check=True)
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root, bin_dir, log = Path(tmp) / "runs", Path(tmp) / "bin", Path(tmp) / "calls.log"
        bin_dir.mkdir()
        make_runs(root, args.runs)
        shim(bin_dir, log)
        env = {**os.environ, "HETRUN_RUNS": str(root), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
        squeue = timed(["squeue", "--json"], env, args.repeat)
        log.write_text("")
        status = timed([sys.executable, "-m", "hetrun.cli", "status", "--last", "0"], env, args.repeat)
        calls = log.read_text().split()
        print(json.dumps({
            "runs": args.runs, "repeat": args.repeat,
            "squeue_json_median_s": round(statistics.median(squeue), 3),
            "status_median_s": round(statistics.median(status), 3),
            "slurm_calls_per_status": {c: calls.count(c) / args.repeat for c in sorted(set(calls))},
        }))


if __name__ == "__main__":
    main()
