"""On the real local Slurm cluster: a training job with 2 learner ranks (a real
gloo gradient all-reduce between them) is preempted twice by a job in the
high-priority partition ``high`` (PreemptMode=REQUEUE), Slurm requeues it, it
resumes from its checkpoints and finishes; the restarts and the work lost are
in events.jsonl and in ``hetrun status``, and the time from the requeued job's
start in Slurm to its first resumed training step is broken down from the
runtime's startup/restore/action events (printed, and written to
``requeue_timing.json`` in the run directory). benchmarks/requeue_bench.py
does the same with the example jobs. `hetrun report` is checked on the same run
(tests/test_report_slurm.py keeps the failed run).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from hetrun.dag.spec import spec_from_dict
from hetrun.reports.attempts import status_summary
from hetrun.reports.run_report import build_report
from hetrun.runtime.ckpt import open_store
from hetrun.slurm_plugin.backends.sbatch import SbatchBackend
from hetrun.slurm_plugin.rundir import events_of, wait_for
from hetrun.slurm_plugin.submit import submit_spec, wait_for_end

HERE = Path(__file__).parent
ITERATIONS = 24  # preempted at iterations 3+ and 12+; 12 more (~5 s) leave room for the second preemption
INTERVAL = 5
LEARNERS = 2
# A rank's startup stages, in the order it reaches them (runtime/entry.py startup event).
STAGES = ("proc_start", "interp_ready", "mpi_start", "mpi_ready", "world_ready",
          "torch_imported", "groups_ready", "executor_ready")

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
        "components": {"learner": {"nodes": 1, "tasks_per_node": LEARNERS, "cpus_per_task": 1, "mem": "1G",
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
                return len({e["rank"] for e in _events(run_dir) if e.get("ev") == "restore"
                            and e.get("restart_count") == attempt + 1 and "step" in e}) == LEARNERS

            assert wait_for(restored, 240, 0.5), (_events(run_dir)[-8:], _job_field(job_id, "JobState"))
            start_s = _job_field(job_id, "StartTime")
            assert start_s
            job_start = datetime.fromisoformat(start_s).timestamp()  # local time, like scontrol prints

            def first_step(attempt: int = attempt) -> dict[int, float] | None:
                steps = _first_steps(_events(run_dir), attempt + 1)
                return steps if len(steps) == LEARNERS else None

            assert wait_for(lambda: first_step() is not None, 60, 0.2)
            timings.append(_breakdown(_events(run_dir), attempt + 1, job_start))
        final = wait_for_end(res.run, SbatchBackend(), timeout_s=300, poll_s=1)
        assert [c.state for c in final.components] == ["COMPLETED"], final
        assert all(c.restarts == 2 for c in final.components), final
    finally:
        subprocess.run(["scancel", job_id], check=False, capture_output=True)
        (run_dir / "requeue_timing.json").write_text(json.dumps(timings, indent=1))
        print("requeue timings:", json.dumps(timings, indent=1))

    evs = _events(run_dir)
    exits = [e for e in evs if e.get("ev") == "exit"]
    assert len(exits) == 3 * LEARNERS, exits  # two preempted attempts and the last one
    assert {e["code"] for e in exits[-LEARNERS:]} == {0}, exits
    for t in timings:
        # Preempted mid-interval, the preemption checkpoint loses nothing; both
        # learners agreed on and restored the same step.
        assert t["work_lost"] == 0 and t["restored_step"] > 0, timings
        # Slurm's StartTime is whole seconds: only its stage may look (slightly) negative.
        assert all(v >= (-1 if k == "slurm_start_to_batch_s" else 0)
                   for k, v in t.items() if k.endswith("_s")), timings
    # Issue 24: a clean preemption reads as one in the logs a user opens, not as a crash: each
    # learner's own log says it saved and stopped, and the launcher's log explains srun's 143.
    logs = run_dir / "logs"
    for rank in range(LEARNERS):
        own = next(logs.glob(f"learner-*-{rank}.out")).read_text()
        assert own.count(f"hetrun: rank {rank} (learner) stopped cleanly for preemption (SIGTERM)") == 2, own
    srun = "".join(p.read_text() for p in sorted(logs.glob("srun-*.err")))
    for attempt in (0, 1):
        assert f"hetrun: attempt {attempt} stopped cleanly (preempted)" in srun and "not a crash" in srun, srun
    assert ITERATIONS in open_store(run_dir / "ckpt" / "learner").steps()
    # The user's view: 2 restarts and no work lost.
    out = subprocess.run(["hetrun", "status", str(run_dir)], capture_output=True, text=True,
                         env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    head = [c.strip() for c in next(line for line in lines if "RESTARTS" in line).split("┃")]
    row = dict(zip(head, (c.strip() for c in next(line for line in lines if "learner" in line).split("│")),
                   strict=False))
    assert (row["STATE"], row["RESTARTS"], row["WORK LOST"]) == ("COMPLETED", "2", "0"), out.stdout
    # `hetrun report`'s restart rows carry the startup timing.
    rep = build_report(run_dir)
    resumes = rep.resumes
    assert [r["restart"] for r in resumes] == [1, 2], resumes
    for r, t in zip(resumes, timings, strict=True):
        assert 0 < r["startup_s"] < r["start_to_restored_s"] < t["total_s"] + 1, (resumes, timings)
    _assert_report_of_two_preemptions(run_dir, rep, restored=[t["restored_step"] for t in timings])


def _cli(*args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "hetrun.cli", *args], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    return out.stdout


def _assert_report_of_two_preemptions(run_dir: Path, rep: Any, restored: list[int]) -> None:
    """`hetrun report` of this run (the one real preempted-and-resumed Slurm run it is checked on):
    the restart section carries the real cause, what was restored and the work lost; status and
    report agree; sacct's rows span the requeues."""
    assert rep.counts["restarts"] == 2 and rep.counts["preemptions"] == 2, (rep.counts, events_of(run_dir, ("attempt_end",)))
    assert [row["cause"] for row in rep.restart_history] == ["preempted", "preempted"], rep.restart_history
    for row, step in zip(rep.restart_history, restored, strict=True):
        learner = row["components"]["learner"]
        assert learner["state"] == "restored" and learner["step"] == step, row
        assert row["queue_wait_s"] is not None and row["queue_wait_s"] >= 0, row
        assert row["first_step_s"] is not None and row["first_step_s"] > 0, row
        assert row["work_lost_iterations"] == 0 and row["work_lost_s"] is not None, row
    assert rep.outcome["outcome"] == "done" and rep.outcome["attempt"] == 2, rep.outcome
    counts, lost = status_summary(run_dir)
    assert rep.counts["restarts"] == counts.restarts and lost == rep.work_lost
    acc = rep.accounting
    if acc["note"] is None:  # accounting is up on the local cluster; the rows span the requeues
        states = [r["state"] for r in acc["rows"] if r["component"] == "learner"]
        assert len(states) >= 3 and states[-1] == "COMPLETED", acc
    text = _cli("report", str(run_dir))
    assert all(f"learner@{step}" in text for step in restored), text
    assert "preempted" in text and "done (attempt 3)" in text, text
    doc = json.loads(_cli("report", str(run_dir), "--json"))
    assert [h["cause"] for h in doc["restart_history"]] == ["preempted", "preempted"], doc["restart_history"]


def _first_steps(evs: list[dict[str, Any]], restart: int) -> dict[int, float]:
    """Each rank's end of its first optimizer step after restart ``restart`` started."""
    starts = [e["time"] for e in evs if e.get("ev") == "startup" and e.get("restart_count") == restart]
    if not starts:
        return {}
    steps: dict[int, float] = {}
    for e in evs:
        if e.get("ev") == "action" and e["start"] >= min(starts) and e["rank"] not in steps and (
                e.get("type") == "optimize" or "optimize" in e["id"].split("+")):
            steps[e["rank"]] = e["end"]
    return steps


def _breakdown(evs: list[dict[str, Any]], restart: int, job_start: float) -> dict[str, Any]:
    """Slurm start -> first resumed step, stage by stage, each stage ending when its slowest rank did."""
    startups = [e for e in evs if e.get("ev") == "startup" and e.get("restart_count") == restart]
    restores = [e for e in evs if e.get("ev") == "restore" and e.get("restart_count") == restart and "step" in e]
    assert len(startups) == LEARNERS and len(restores) == LEARNERS, (startups, restores)
    for s in startups:
        # Real timestamps of one process, in order (proc_start has 10 ms ticks).
        assert s["batch_start"] <= s["srun_start"] <= s["proc_start"] + 0.02, s
        times = [s[k] for k in STAGES]
        assert times[0] <= times[1] + 0.02, s
        assert all(a <= b for a, b in itertools.pairwise(times[1:])), s
    assert len({r["step"] for r in restores}) == 1, restores
    steps = _first_steps(evs, restart)

    def last(key: str) -> float:
        return max(float(s[key]) for s in startups)

    out: dict[str, Any] = {
        "restart": restart, "restored_step": restores[0]["step"],
        "work_lost": max(r["work_lost"] for r in restores),
        # sacct/scontrol StartTime has 1 s resolution: this stage carries the rounding.
        "slurm_start_to_batch_s": round(startups[0]["batch_start"] - job_start, 2),
        "batch_to_srun_s": round(startups[0]["srun_start"] - startups[0]["batch_start"], 2),
        "srun_to_ranks_started_s": round(last("proc_start") - startups[0]["srun_start"], 2),
        "interpreter_s": round(last("interp_ready") - last("proc_start"), 2),
        "plan_load_s": round(last("mpi_start") - last("interp_ready"), 2),
        "mpi_init_s": round(last("mpi_ready") - last("mpi_start"), 2),
        "communicators_s": round(last("world_ready") - last("mpi_ready"), 2),
        "torch_import_s": round(last("torch_imported") - last("world_ready"), 2),
        "process_groups_s": round(last("groups_ready") - last("torch_imported"), 2),
        "executor_s": round(last("executor_ready") - last("groups_ready"), 2),
        "workload_init_s": round(max(r["entered"] for r in restores) - last("executor_ready"), 2),
        "restore_s": round(max(r["time"] for r in restores) - max(r["entered"] for r in restores), 3),
        "first_step_s": round(max(steps.values()) - max(r["time"] for r in restores), 2),
        "total_s": round(max(steps.values()) - job_start, 2),
    }
    return out
