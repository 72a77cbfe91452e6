"""On the real local Slurm cluster: a training job is preempted twice by a job in
the high-priority partition ``high`` (PreemptMode=REQUEUE), Slurm requeues it,
it resumes from its checkpoints and finishes; the restarts and the work lost
are in events.jsonl, and the time from the requeued job's start in Slurm to
its first resumed training step is measured and broken down (printed, and
written to ``requeue_timing.json`` in the run directory).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from hetrun.dag.spec import spec_from_dict
from hetrun.runtime.ckpt import open_store
from hetrun.slurm_plugin.backends.sbatch import SbatchBackend
from hetrun.slurm_plugin.rundir import wait_for
from hetrun.slurm_plugin.submit import submit_spec, wait_for_end

HERE = Path(__file__).parent
ITERATIONS = 30
INTERVAL = 5

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def _events(run_dir: Path) -> list[dict[str, Any]]:
    out = []
    path = run_dir / "events.jsonl"
    if path.exists():
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError):  # a line being written
                out.append(json.loads(line))
    return out


def _job_field(job_id: str, key: str) -> str | None:
    out = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True).stdout
    for word in out.split():
        if word.startswith(key + "="):
            return word.split("=", 1)[1]
    return None


def _idle_node() -> str | None:
    out = subprocess.run(["sinfo", "-h", "-N", "-p", "debug", "-t", "idle", "-o", "%N"], capture_output=True, text=True).stdout
    nodes = sorted(set(out.split()))
    return nodes[-1] if nodes else None


def _preempt(node: str, shared: Path) -> str:
    """A job in ``high`` that wants the whole node: Slurm preempts (requeues) ours."""
    r = subprocess.run(["sbatch", "--parsable", "-p", "high", "-w", node, "--exclusive", "-t", "00:02:00",
                        "-J", "hetrun-preemptor", f"--output={shared}/preemptor-%j.out", "--wrap", "sleep 2"],
                       capture_output=True, text=True, check=True)
    return r.stdout.strip().split(";")[0]


def test_preempted_twice_through_the_high_partition_resumes_and_finishes(slurm_cluster, shared_tmp: Path) -> None:  # type: ignore[no-untyped-def]
    job_dir = shared_tmp / "job"
    job_dir.mkdir()
    (job_dir / "resume_workload.py").write_text((HERE / "test_resume_workload.py").read_text())
    node = _idle_node()
    spec = spec_from_dict({
        "name": "preempt-probe", "workload": "resume_workload:ResumeProbe",
        "workload_args": {"sleep": 0.4},
        "components": {"learner": {"nodes": 1, "tasks_per_node": 1, "cpus_per_task": 1, "mem": "1G",
                                   "actions": ["forward", "backward", "sync", "optimize", "checkpoint"]}},
        "training": {"kind": "supervised", "iterations": ITERATIONS, "micro_batches": 1,
                     "pipeline_window": 1, "seed": 5},
        "checkpoint": {"interval": INTERVAL, "keep": 3},
        "preemption": {"signal": "USR1", "grace_seconds": 60, "max_restarts": 3},
        "slurm": {"partition": "debug", "time": "00:10:00", "extra": [f"--nodelist={node}"] if node else []},
        "env": {"OMP_NUM_THREADS": "1", "HETRUN_JOB_DIR": str(job_dir)},
    })
    res = submit_spec(spec, backend="sbatch", runs_dir=shared_tmp / "runs")
    run_dir = Path(res.run.run_dir)
    job_id = str(res.run.job_id)
    timings = []
    try:
        for attempt in range(2):
            target = 3 + attempt * 9  # well past a checkpoint, in the middle of an interval

            def running_past(target: int = target) -> bool:
                return any(e.get("ev") == "action" and e.get("iteration", -1) >= target for e in _events(run_dir))

            assert wait_for(running_past, 180, 0.5), _events(run_dir)[-5:]
            where = _job_field(job_id, "NodeList") or node
            assert where and where != "(null)"
            _preempt(where, shared_tmp)

            def restored(attempt: int = attempt) -> bool:
                return any(e.get("ev") == "restore" and e.get("restart_count") == attempt + 1
                           and "step" in e for e in _events(run_dir))

            assert wait_for(restored, 240, 0.5), (_events(run_dir)[-8:], _job_field(job_id, "JobState"))
            start_s = _job_field(job_id, "StartTime")
            assert start_s
            job_start = datetime.fromisoformat(start_s).timestamp()  # local time, like scontrol prints

            def first_step(attempt: int = attempt) -> dict[str, Any] | None:
                evs = _events(run_dir)
                idx = max(i for i, e in enumerate(evs) if e.get("ev") == "restore" and e.get("restart_count") == attempt + 1)
                return next((e for e in evs[idx:] if e.get("ev") == "action"), None)

            assert wait_for(lambda: first_step() is not None, 60, 0.2)
            evs = _events(run_dir)
            rank_start = max(e["time"] for e in evs if e.get("ev") == "start" and e.get("restart_count") == attempt + 1)
            restore = next(e for e in evs if e.get("ev") == "restore" and e.get("restart_count") == attempt + 1 and "step" in e)
            step = first_step()
            assert step is not None
            timings.append({
                "restart": attempt + 1, "restored_step": restore["step"], "work_lost": restore["work_lost"],
                "slurm_start_to_rank_start_s": round(rank_start - job_start, 2),
                # torch import + workload construction, then the restore hook itself
                "rank_start_to_workload_ready_s": round(restore["entered"] - rank_start, 2),
                "restore_s": restore["seconds"],
                "restored_to_first_step_end_s": round(step["end"] - restore["time"], 2),
                "slurm_start_to_first_step_s": round(step["end"] - job_start, 2),
            })
        final = wait_for_end(res.run, SbatchBackend(), timeout_s=300, poll_s=1)
        assert [c.state for c in final.components] == ["COMPLETED"], final
        assert all(c.restarts == 2 for c in final.components), final
    finally:
        subprocess.run(["scancel", job_id], check=False, capture_output=True)
        (run_dir / "requeue_timing.json").write_text(json.dumps(timings, indent=1))
        print("requeue timings:", json.dumps(timings, indent=1))

    evs = _events(run_dir)
    exits = [e["code"] for e in evs if e.get("ev") == "exit"]
    assert exits and exits[-1] == 0, exits
    for t in timings:
        # Preempted mid-interval, the preemption checkpoint loses nothing.
        assert t["work_lost"] == 0 and t["restored_step"] > 0, timings
    assert ITERATIONS in open_store(run_dir / "ckpt" / "learner").steps()
