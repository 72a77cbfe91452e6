"""Start to first step of a command component, next to the same script under plain srun
(issue 11's target: at most 1 s more), on the local Slurm cluster, in one run.

    python benchmarks/command_start.py --repeats 3

Both jobs run examples/ddp_train_hetrun.py on 2 nodes x 1 task (gloo, the run API)
for a few steps. The clock starts at the batch script's first line (bash's
$EPOCHREALTIME: hetrun's script exports HETRUN_BATCH_START, the plain script
writes it to a file) and stops at the end of step 0 (the API's first ``step``
event). Queue time is not counted: it is the same scheduler for both. Stages for
hetrun: batch script -> wrapper started (``command_rank``'s ``start``) -> the API
attached (its ``start``) -> first step done. Orders alternate between repeats.
Writes benchmarks/results/command_start.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from hetrun.rundir import read_events

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "examples" / "ddp_train_hetrun.py"
RESULTS = ROOT / "benchmarks" / "results"
STEPS = 3


def _events(run_dir: Path) -> list[dict[str, Any]]:
    return list(read_events(run_dir))


def _first_step_end(evs: list[dict[str, Any]]) -> float:
    return min(e["end"] for e in evs if e.get("type") == "step" and e.get("iteration") == 0)


def run_hetrun(work: Path) -> dict[str, float]:
    from hetrun.dag.spec import spec_from_dict
    from hetrun.slurm_plugin.backends.sbatch import SbatchBackend
    from hetrun.slurm_plugin.submit import submit_spec, wait_for_end

    spec = spec_from_dict({
        "name": "cmd-start",
        "components": {"trainer": {"nodes": 2, "tasks_per_node": 1, "mem": "1G", "command": [
            sys.executable, str(SCRIPT), "--steps", str(STEPS), "--out", str(work / "out-h")]}},
        "slurm": {"partition": "debug", "time": "00:05:00"}, "env": {"OMP_NUM_THREADS": "1"}})
    res = submit_spec(spec, backend="sbatch", runs_dir=work / "runs")
    final = wait_for_end(res.run, SbatchBackend(), timeout_s=300, poll_s=0.5)
    if any(c.state != "COMPLETED" for c in final.components):
        raise SystemExit(f"hetrun job ended {final.state}; see {res.run.run_dir}/logs")
    evs = _events(Path(res.run.run_dir))
    wrappers = [e for e in evs if e.get("ev") == "start" and e.get("command")]
    api = [e for e in evs if e.get("ev") == "start" and not e.get("command")]
    batch = min(float(e["batch_start"]) for e in wrappers)
    return {"total": _first_step_end(evs) - batch, "wrapper": max(e["time"] for e in wrappers) - batch,
            "attached": max(e["time"] for e in api) - batch}


PLAIN = """#!/bin/bash
#SBATCH -N 2 --ntasks-per-node=1 -p debug -t 5 --mem=1G -o {out}/plain-%j.out
echo "$EPOCHREALTIME" > {out}/batch_start
export HETRUN_RUN_DIR={run} OMP_NUM_THREADS=1
srun {py} {script} --steps {steps} --out {out}/out-p
"""


def run_plain(work: Path, i: int) -> dict[str, float]:
    out, run = work / f"plain{i}", work / f"plain{i}" / "run"
    out.mkdir(parents=True)
    script = out / "job.sh"
    script.write_text(PLAIN.format(out=out, run=run, py=sys.executable, script=SCRIPT, steps=STEPS))
    subprocess.run(["sbatch", "--wait", "--parsable", str(script)], check=True, capture_output=True,
                   timeout=300, cwd=out)
    batch = float((out / "batch_start").read_text().strip().replace(",", "."))
    evs = _events(run)
    api = [e for e in evs if e.get("ev") == "start"]
    return {"total": _first_step_end(evs) - batch, "attached": max(e["time"] for e in api) - batch}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    rows: dict[str, list[dict[str, float]]] = {"hetrun": [], "plain": []}
    with tempfile.TemporaryDirectory(dir="/var/tmp", prefix="cmd-start-") as tmp:
        work = Path(tmp)
        for i in range(args.repeats):
            order = ["hetrun", "plain"] if i % 2 == 0 else ["plain", "hetrun"]
            for kind in order:
                rows[kind].append(run_hetrun(work / f"h{i}") if kind == "hetrun" else run_plain(work, i))
                print(f"repeat {i} {kind}: {rows[kind][-1]}", flush=True)
    med = {k: statistics.median(r["total"] for r in v) for k, v in rows.items()}
    extra = med["hetrun"] - med["plain"]
    print(f"\nstart (batch script) to first step, median of {args.repeats}:")
    print(f"  plain srun + run API : {med['plain']:.2f} s")
    print(f"  hetrun command       : {med['hetrun']:.2f} s   (wrapper up at "
          f"{statistics.median(r['wrapper'] for r in rows['hetrun']):.2f} s, API attached at "
          f"{statistics.median(r['attached'] for r in rows['hetrun']):.2f} s)")
    print(f"  hetrun - plain       : {extra:+.2f} s   (target: at most +1.00 s)")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "command_start.json").write_text(json.dumps(
        {"when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "repeats": args.repeats,
         "rows": rows, "median_total_s": med, "hetrun_minus_plain_s": extra}, indent=2))


if __name__ == "__main__":
    main()
