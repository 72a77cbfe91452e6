"""A command component honours the job file's checkpoint and preemption settings,
exactly as an action component does, on the real local Slurm cluster.

One small job (1 rank, the loop of ``hetrun``'s own module docstring, no
``checkpoint_every`` argument) with ``checkpoint: {interval: 3, directory:
mystore, keep: 2, max_delta_chain: 2}`` and ``preemption: {max_preemptions: 0}``
is preempted once through the ``high`` partition and released at once; the
tests read what that one run left:

- interval: the script checkpoints every 3 steps (``run.checkpoint_due``);
- directory: the store is ``<run_dir>/mystore/trainer``, no ``<run_dir>/ckpt``;
- keep: the store holds the 2 newest checkpoints of the 4+ written;
- max_delta_chain: no chunk depends on more than one base (depth <= 1), while
  some are deltas (the setting is what bounds the chain);
- max_preemptions: the requeued attempt refuses to resume (restart 1 > 0) and
  the job fails naming the budget.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hetrun.dag.spec import spec_from_dict
from hetrun.slurm_plugin.backends.base import RunStatus
from hetrun.slurm_plugin.backends.sbatch import SbatchBackend
from hetrun.slurm_plugin.rundir import wait_for
from hetrun.slurm_plugin.submit import submit_spec, wait_for_end

from tests.api_helpers import events
from tests.conftest import SHARED_TMP_ROOT
from tests.preempt_helpers import first_node, preempt_through_high

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

# The loop of hetrun's module docstring, as a user writes it.
SCRIPT = """\
import sys, time
import torch
import hetrun

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Tanh(), torch.nn.Linear(256, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
run = hetrun.attach()
start = run.restore({"model": model, "optim": optimizer})
for step in range(start, int(sys.argv[1])):
    loss = model(torch.randn(16, 256)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    time.sleep(float(sys.argv[2]))
    run.log(step, loss=loss.item())
    if run.should_stop(step):
        run.save(step, {"model": model, "optim": optimizer}, wait=True)
        run.exit_for_requeue()
    if run.checkpoint_due(step):
        run.save(step, {"model": model, "optim": optimizer})
run.close()
"""
INTERVAL, KEEP, CHAIN = 3, 2, 2
PREEMPT_AFTER = 13  # step: the interval checkpoints 3, 6, 9, 12 are written by then


@dataclass
class JobRun:
    run_dir: Path
    final: RunStatus
    events: list[dict[str, Any]]


def _release(job: str) -> bool:
    """Once Slurm requeued the job: let it start now instead of after the requeue hold."""
    out = subprocess.run(["scontrol", "-o", "show", "job", job], capture_output=True, text=True).stdout
    if "JobState=PENDING" not in out or "Restarts=0" in out:
        return False
    subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], capture_output=True, text=True)
    return True


@pytest.fixture(scope="module")
def job_run(slurm_cluster) -> Iterator[JobRun]:  # type: ignore[no-untyped-def]
    SHARED_TMP_ROOT.mkdir(parents=True, exist_ok=True)
    shared = Path(tempfile.mkdtemp(prefix="command-job-file-", dir=SHARED_TMP_ROOT))
    shared.chmod(0o755)
    script = shared / "train.py"
    script.write_text(SCRIPT)
    spec = spec_from_dict({
        "name": "cmd-job-file",
        "components": {"trainer": {"nodes": 1, "tasks_per_node": 1, "mem": "1G",
                                   "command": [sys.executable, str(script), "400", "0.2"]}},
        "slurm": {"partition": "debug", "time": "00:10:00"}, "env": {"OMP_NUM_THREADS": "1"},
        "checkpoint": {"interval": INTERVAL, "directory": "mystore", "keep": KEEP, "max_delta_chain": CHAIN},
        "preemption": {"max_preemptions": 0}})
    for _ in range(3):
        res = submit_spec(spec, backend="sbatch", runs_dir=shared / "runs")
        run_dir, job = Path(res.run.run_dir), str(res.run.job_id)
        assert wait_for(lambda d=run_dir: any(e["ev"] == "attempt_end" or (e["ev"] == "action" and e.get(
            "iteration", -1) >= PREEMPT_AFTER) for e in events(d)), 240, 0.5), events(run_dir)[-5:]
        ends = [e for e in events(run_dir) if e["ev"] == "attempt_end"]
        if not ends:
            break
        # Only another test's preemptor taking the node before step 13 (tests sharing the cluster
        # at once) is worth a resubmit; a crash of the command is this test's failure, said now.
        assert all(e.get("outcome") == "preempted" for e in ends), ends
        subprocess.run(["scancel", job], check=False, capture_output=True)
    try:
        assert not any(e["ev"] == "attempt_end" for e in events(run_dir)), "preempted early three times"
        preempt_through_high(first_node(job), shared)
        assert wait_for(lambda: _release(job), 120, 0.5), events(run_dir)[-5:]
        final = wait_for_end(res.run, SbatchBackend(), timeout_s=240, poll_s=1)
    finally:
        subprocess.run(["scancel", job], check=False, capture_output=True)
    yield JobRun(run_dir, final, events(run_dir))
    if not os.environ.get("HETRUN_KEEP_TEST_DIRS"):
        shutil.rmtree(shared, ignore_errors=True)


def _first_attempt(run: JobRun) -> list[dict[str, Any]]:
    end = next(i for i, e in enumerate(run.events) if e["ev"] == "attempt_end")
    return run.events[:end]


def test_checkpoint_interval_drives_checkpoint_due(job_run: JobRun) -> None:
    saved = [e["iteration"] for e in _first_attempt(job_run) if e["ev"] == "checkpoint" and e["reason"] == "interval"]
    assert saved[:4] == [3, 6, 9, 12], saved  # resume points: after steps 2, 5, 8, 11
    assert all(s % INTERVAL == 0 for s in saved), saved


def test_checkpoint_directory_is_the_job_files(job_run: JobRun) -> None:
    store = job_run.run_dir / "mystore" / "trainer"
    assert sorted(p.name for p in (store / "manifests").iterdir()), list(store.iterdir())
    assert not (job_run.run_dir / "ckpt").exists()


def test_checkpoint_keep_bounds_the_store(job_run: JobRun) -> None:
    from hetrun.runtime.ckpt import open_store

    written = {e["iteration"] for e in _first_attempt(job_run) if e["ev"] == "checkpoint" and e.get("ok", True)}
    assert len(written) > KEEP, written
    steps = open_store(job_run.run_dir / "mystore" / "trainer").steps()
    assert len(steps) == KEEP and set(steps) <= written, (steps, written)


def test_max_delta_chain_bounds_every_chunk(job_run: JobRun) -> None:
    from hetrun.runtime.ckpt import tiers_for

    tier = tiers_for(job_run.run_dir / "mystore" / "trainer")[0]
    depths = [int(tier.read_object_header(p.name).get("depth", 0)) for p in tier.iter_objects()]
    assert depths and max(depths) == CHAIN - 1, depths  # deltas written, none deeper than the setting


def test_max_preemptions_refuses_the_restart_past_the_budget(job_run: JobRun) -> None:
    ends = [e for e in job_run.events if e["ev"] == "attempt_end"]
    assert [e["outcome"] for e in ends] == ["preempted", "failed"], ends
    assert [c.state for c in job_run.final.components] == ["FAILED"], ends
    assert "rank 0 (trainer)" in ends[-1]["reason"] and "raise preemption.max_preemptions" in ends[-1]["reason"], ends[-1]
    logs = "\n".join(p.read_text(errors="replace") for p in (job_run.run_dir / "logs").glob("trainer-*"))
    assert "component trainer: restart 1 exceeds preemption.max_preemptions=0" in logs, logs[-2000:]
    assert not any(e["ev"] == "restore" and e.get("restart_count") == 1 for e in job_run.events)
