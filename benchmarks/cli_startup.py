"""Cold-start time of the hetrun CLI next to its peers, measured in one run.

Issue 2: `hetrun --help` and `hetrun status` must import neither torch nor
mpi4py. This reports their wall time next to `python -c "import submitit"`
and `sbatch --help` (when Slurm is installed), each run N times in a fresh
process; the median and the spread are printed as a Markdown table.

    python benchmarks/cli_startup.py [--repeat 15]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def _time(cmd: list[str], repeat: int, env: dict[str, str]) -> list[float]:
    out = []
    # One warm-up run so every command is timed with a warm page cache alike.
    subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=15)
    args = ap.parse_args()
    runs = tempfile.mkdtemp(prefix="hetrun-bench-runs-", dir="/var/tmp")
    env = dict(os.environ, HETRUN_RUNS=runs)
    hetrun = shutil.which("hetrun") or sys.exit("hetrun is not installed (pip install -e .)")
    cases = [
        ("hetrun --help", [hetrun, "--help"]),
        ("hetrun status (no runs)", [hetrun, "status"]),
        ('python -c "import submitit"', [sys.executable, "-c", "import submitit"]),
        ("python -c pass (interpreter floor)", [sys.executable, "-c", "pass"]),
    ]
    if shutil.which("sbatch"):
        cases.append(("sbatch --help", ["sbatch", "--help"]))
    print(f"| command | median ms | min ms | max ms | (n={args.repeat}) |")
    print("|---|---:|---:|---:|---|")
    for label, cmd in cases:
        ts = _time(cmd, args.repeat, env)
        print(f"| `{label}` | {statistics.median(ts) * 1e3:.0f} | {min(ts) * 1e3:.0f} | {max(ts) * 1e3:.0f} | |")
    shutil.rmtree(runs, ignore_errors=True)


if __name__ == "__main__":
    main()
