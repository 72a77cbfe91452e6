"""`hetrun report` over a large run: wall time and peak memory for N events (default 10^6).

Writes a synthetic run directory (8 ranks on 2 components, action lines as
the executor writes them, a checkpoint every 100 iterations, two restarts),
then builds the report in a fresh process and prints its wall time and
peak RSS next to two baselines measured in the same run: reading the file
line by line without parsing, and json-parsing every line into a list (what
a load-it-whole reader does). Usage:

    python3 benchmarks/report_scale.py [--events 1000000] [--dir DIR]

``--run-dir RUN [--repeat N]`` instead times `hetrun report RUN` (the default text report, a
fresh process each time, as a user types it) interleaved with its peer, the same command with
torch imported first (what listing the checkpoint store cost before 4 December: store.py
imported the torch half of the checkpoint code), and the bare interpreter; medians.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RANKS = (("learner", 0, "n1"), ("learner", 1, "n1"), *(("rollout", r, f"n{2 + r // 4}") for r in range(2, 8)))


def write_run(run_dir: Path, n_events: int) -> int:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "plan.json").write_text(json.dumps({"name": "big", "components": [
        {"name": "learner", "nodes": 1, "cpus_per_task": 2, "gpus_per_node": 1},
        {"name": "rollout", "nodes": 2, "cpus_per_task": 1, "gpus_per_node": 0}]}))
    (run_dir / "run.json").write_text(json.dumps({"name": "big", "job_id": "1", "backend": "sbatch"}))
    dumps = json.JSONEncoder(separators=(",", ":")).encode
    written, t, it, restart = 0, 1.0e9, 0, 0
    per_restart = n_events // 3
    with (run_dir / "events.jsonl").open("w") as fh:
        while written < n_events:
            if written >= per_restart * (restart + 1) and restart < 2:
                restart += 1
                fh.write(dumps({"ev": "attempt_end", "restart_count": restart - 1, "outcome": "preempted",
                                "requeued": True, "exit_code": 0, "reason": "bench", "t": t}) + "\n")
                t += 5
                for comp, rank, node in RANKS:
                    fh.write(dumps({"ev": "start", "rank": rank, "component": comp, "node": node, "time": t,
                                    "job_id": "1", "restart_count": restart}) + "\n")
                    fh.write(dumps({"ev": "restore", "rank": rank, "component": comp, "node": node, "time": t,
                                    "restart_count": restart, "step": it - it % 100, "iteration": it - it % 100,
                                    "restored_state": True, "work_lost": it % 100, "seconds": 0.1}) + "\n")
                written += 2 * len(RANKS) + 1
            for comp, rank, node in RANKS:
                kind = "rollout" if comp == "rollout" else "optimize"
                fh.write(dumps({"ev": "action", "type": kind, "id": kind, "iteration": it, "rank": rank,
                                "component": comp, "node": node, "start": t, "end": t + 0.01, "bytes": 4096,
                                "peak_mem": 1 << 20, "steps": 64 if kind == "rollout" else 0}) + "\n")
            written += len(RANKS)
            if it % 100 == 99:
                fh.write(dumps({"ev": "checkpoint", "rank": 0, "component": "learner", "node": "n1",
                                "iteration": it + 1, "time": t, "start": t, "end": t + 0.05}) + "\n")
                written += 1
            t += 0.012
            it += 1
    return written


CHILD = """
import json, resource, sys, time
t0 = time.perf_counter()
mode, run_dir = sys.argv[1], sys.argv[2]
if mode == "report":
    from hetrun.reports.run_report import build_report
    rep = build_report(run_dir)
    extra = {"actions": rep.actions, "restarts": rep.restarts}
elif mode == "readlines":
    n = sum(1 for _ in open(run_dir + "/events.jsonl", "rb"))
    extra = {"lines": n}
else:
    evs = [json.loads(line) for line in open(run_dir + "/events.jsonl", "rb")]
    extra = {"lines": len(evs)}
print(json.dumps({"mode": mode, "wall_s": round(time.perf_counter() - t0, 3),
                  "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1), **extra}))
"""


REPORT = "import sys\n{pre}from hetrun.cli.entry import main\ntry:\n    main(['report', sys.argv[1]])\n" \
         "except SystemExit as e:\n    assert not e.code, e.code\n"


def first_look(run_dir: Path, repeat: int) -> None:
    """`hetrun report RUN` beside the same with torch imported first, and `python -c pass`."""
    import os
    import statistics

    cmds = {"report": [sys.executable, "-c", REPORT.format(pre=""), str(run_dir)],
            "report_with_torch": [sys.executable, "-c", REPORT.format(pre="import torch\n"), str(run_dir)],
            "python_floor": [sys.executable, "-c", "pass"]}
    times: dict[str, list[float]] = {k: [] for k in cmds}
    for cmd in cmds.values():  # warm-up: the page cache
        subprocess.run(cmd, capture_output=True, check=True)
    for _ in range(repeat):  # interleaved: each command sees the same load
        for key, cmd in cmds.items():
            t0 = time.perf_counter()
            subprocess.run(cmd, capture_output=True, check=True)
            times[key].append(time.perf_counter() - t0)
    print(json.dumps({"run_dir": str(run_dir), "repeat": repeat, "load_average_1m": round(os.getloadavg()[0], 2),
                      **{f"{k}_median_s": round(statistics.median(v), 3) for k, v in times.items()},
                      "report_spread_s": [round(min(times["report"]), 3), round(max(times["report"]), 3)]}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--dir", type=Path, default=None)
    ap.add_argument("--run-dir", type=Path, default=None, help="time `hetrun report` of this real run instead")
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    if args.run_dir:
        first_look(args.run_dir, args.repeat)
        return
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        run_dir = Path(tmp) / "run"
        t0 = time.perf_counter()
        n = write_run(run_dir, args.events)
        size = (run_dir / "events.jsonl").stat().st_size
        print(json.dumps({"events": n, "file_mb": round(size / 1e6, 1),
                          "write_s": round(time.perf_counter() - t0, 2)}))
        for mode in ("readlines", "json_list", "report"):
            out = subprocess.run([sys.executable, "-c", CHILD, mode, str(run_dir)], capture_output=True,
                                 text=True, check=True)
            print(out.stdout.strip())


if __name__ == "__main__":
    main()
