"""What checking workload_args at plan time costs `hetrun plan` (issue 12).

`hetrun plan` now imports the workload's light arguments module
(``hetrun.examples.ppo_args``) and validates ``workload_args`` against it. This
times the cold command, each in a fresh process, with the check (as shipped)
and without it (``find_args_model`` patched to find nothing: the behaviour
before), interleaved so both see the same machine load; next to them the
command that would be needed without a light module: importing the workload
module itself (``hetrun.examples.ppo``, which imports torch and gymnasium).

    python benchmarks/plan_args_check.py [--repeat 15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

JOB = str(Path(__file__).resolve().parent.parent / "examples" / "ppo_cartpole.yaml")
PLAN = f"from hetrun.cli.app import main; main(['plan', {JOB!r}, '--json', '--capacity', 'spec'])"
CASES = {
    "hetrun plan, workload_args checked (now)": PLAN,
    "hetrun plan, no workload_args check (before)":
        "import hetrun.dag.workload_args as w; w.find_args_model = lambda *a, **k: None; " + PLAN,
    "import the workload module instead (torch, gymnasium)": "import hetrun.examples.ppo",
    "python -c pass (interpreter floor)": "pass",
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=15)
    args = ap.parse_args()
    env = dict(os.environ, HETRUN_RUNS=tempfile.mkdtemp(prefix="hetrun-bench-runs-", dir="/var/tmp"))
    times: dict[str, list[float]] = {label: [] for label in CASES}
    for i in range(args.repeat + 1):  # round 0 warms the page cache and is dropped
        for label, code in CASES.items():
            t0 = time.perf_counter()
            proc = subprocess.run([sys.executable, "-c", code], env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True, check=False)
            if "Traceback" in proc.stderr:
                sys.exit(f"{label} failed:\n{proc.stderr}")
            if i:
                times[label].append(time.perf_counter() - t0)
    print(f"| command | median ms | min ms | max ms | (n={args.repeat}, interleaved) |")
    print("|---|---:|---:|---:|---|")
    for label, ts in times.items():
        print(f"| {label} | {statistics.median(ts) * 1e3:.0f} | {min(ts) * 1e3:.0f} | {max(ts) * 1e3:.0f} | |")


if __name__ == "__main__":
    main()
