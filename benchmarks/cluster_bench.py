"""Local Slurm cluster timings, each next to a plain Slurm reference measured in the same run.

    python benchmarks/cluster_bench.py            # warm up / status / jobs
    python benchmarks/cluster_bench.py --cold     # also down + up (disturbs running jobs: not on a shared cluster)

Prints a markdown table (median of --repeat runs).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROBE = """\
from mpi4py import MPI
c = MPI.COMM_WORLD
assert c.allreduce(1) == c.Get_size() == 4
"""


def timed(argv: list[str], cwd: Path | None = None) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True, cwd=cwd)
    return time.perf_counter() - t0


def median(argv: list[str], repeat: int, cwd: Path | None = None) -> float:
    return statistics.median(timed(argv, cwd) for _ in range(repeat))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--cold", action="store_true")
    args = ap.parse_args()
    hetrun = [sys.executable, "-m", "hetrun.cli"]
    rows: list[tuple[str, float]] = []
    subprocess.run([*hetrun, "cluster", "up"], check=True, capture_output=True)
    if args.cold:
        subprocess.run([*hetrun, "cluster", "down"], check=True, capture_output=True)
        rows.append(("`hetrun cluster up` from stopped daemons", timed([*hetrun, "cluster", "up"])))
    rows.append(("`hetrun cluster up` when already up", median([*hetrun, "cluster", "up"], args.repeat)))
    rows.append(("`hetrun cluster status`", median([*hetrun, "cluster", "status"], args.repeat)))
    rows.append(("reference: `sinfo`", median(["sinfo"], args.repeat)))
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        work = Path(tmp)
        (work / "probe.py").write_text(PROBE)
        (work / "het.sbatch").write_text(
            "#!/bin/bash\n#SBATCH --output=/dev/null\n"
            "#SBATCH --nodes=1 --ntasks=2 --gres=gpu:2 --mem=400M\n#SBATCH hetjob\n"
            "#SBATCH --nodes=2 --ntasks=2 --ntasks-per-node=1 --mem=400M\n"
            f"srun --mpi=pmix --het-group=0,1 {sys.executable} {work}/probe.py\n"
        )
        rows.append((
            "het job, 2 components, 4 MPI ranks on 3 nodes: `sbatch --wait` submit to end",
            median(["sbatch", "--wait", str(work / "het.sbatch")], args.repeat, work),
        ))
        rows.append((
            "reference: 1-node `sbatch --wait --wrap true`",
            median(["sbatch", "--wait", "--output=/dev/null", "--wrap", "true"], args.repeat, work),
        ))
    print(f"| what (median of {args.repeat}) | seconds |\n|---|---|")
    for what, secs in rows:
        print(f"| {what} | {secs:.2f} |")


if __name__ == "__main__":
    main()
