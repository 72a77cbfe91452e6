"""`hetrun pool`'s accounting call: the parsable-text sacct it makes now beside the
`sacct --json` it made before, on this cluster's real jobs, side by side in one run,
and the whole `hetrun pool --json` command.

    flock /var/lock/hetrun-heavy.lock python3 benchmarks/pool_sacct.py --repeat 7

Each round runs the three in turn (so load drifts hit all alike); medians printed
as JSON with the rows each sacct form returned (they must be equal: -D lists
every attempt of a requeued job, as --json does) and the load average before/after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from hetrun.slurm_plugin.backends.sbatch import SACCT_TIME_ENV
from hetrun.slurm_plugin.pool import POOL_SACCT_FORMAT


def timed(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, str]:
    t0 = time.perf_counter()
    out = subprocess.run(argv, capture_output=True, text=True, check=True, env=env).stdout
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--hours", type=float, default=6.0)
    args = ap.parse_args()
    window = ["-a", "-S", f"now-{max(1, int(args.hours * 60))}minutes", "-E", "now"]
    env = {**os.environ, **SACCT_TIME_ENV}
    load_before = os.getloadavg()
    times: dict[str, list[float]] = {"sacct_json": [], "sacct_text": [], "hetrun_pool_json": []}
    rows = {}
    for _ in range(args.repeat):
        dt, out = timed(["sacct", "--json", *window])
        times["sacct_json"].append(dt)
        rows["sacct_json"] = len(json.loads(out).get("jobs") or [])
        dt, out = timed(["sacct", *window, "-X", "-D", "-P", "-n", f"--format={POOL_SACCT_FORMAT}"], env)
        times["sacct_text"].append(dt)
        rows["sacct_text"] = len(out.splitlines())
        dt, _ = timed([sys.executable, "-m", "hetrun.cli", "pool", "--json", "--hours", str(args.hours)])
        times["hetrun_pool_json"].append(dt)
    print(json.dumps({
        "median_s": {k: round(statistics.median(v), 3) for k, v in times.items()},
        "range_s": {k: [round(min(v), 3), round(max(v), 3)] for k, v in times.items()},
        "rows": rows, "repeat": args.repeat, "hours": args.hours,
        "load_before": [round(x, 2) for x in load_before], "load_after": [round(x, 2) for x in os.getloadavg()],
        "utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
    }, indent=1))


if __name__ == "__main__":
    main()
