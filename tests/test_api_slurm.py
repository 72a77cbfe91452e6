"""On the real local Slurm cluster, with no hetrun submit: a user's own sbatch
script runs ``srun python examples/ddp_train_hetrun.py`` on 2 nodes (the API
sets RANK/MASTER_ADDR/... from Slurm's variables for the unchanged
``init_process_group()``). A job in the high-priority partition preempts it
(SIGTERM, PreemptMode=REQUEUE); both ranks agree on one step, checkpoint it
into ./runs/<job id>, Slurm requeues the job, it resumes from that step and
ends with parameters bit-identical to an uninterrupted torchrun run."""

from __future__ import annotations

import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hetrun.runtime.api.env import first_host

from tests.api_helpers import EXAMPLE, assert_bit_identical, command, events, final_params, run_once
from tests.preempt_helpers import release_if_held

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
STEPS = 40

SCRIPT = """#!/bin/bash
#SBATCH --job-name=api-ddp
#SBATCH --partition=debug
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --mem=1G
#SBATCH --time=00:10:00
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=slurm-%j.out
export OMP_NUM_THREADS=1
srun {python} {example} --steps {steps} --out out --step-time 0.25
"""


def _field(job: str, key: str) -> str | None:
    out = subprocess.run(["scontrol", "-o", "show", "job", job], capture_output=True, text=True).stdout
    for word in out.split():
        if word.startswith(key + "="):
            return word.split("=", 1)[1]
    return None


def _wait(pred, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def test_plain_sbatch_srun_preempted_through_high_requeues_and_resumes_exactly(slurm_cluster, shared_tmp: Path) -> None:  # type: ignore[no-untyped-def]
    script = shared_tmp / "train.sbatch"
    script.write_text(SCRIPT.format(python=sys.executable, example=EXAMPLE, steps=STEPS))
    job = subprocess.run(["sbatch", "--parsable", f"--chdir={shared_tmp}", str(script)],
                         capture_output=True, text=True, check=True).stdout.strip().split(";")[0]
    run_dir = shared_tmp / "runs" / job
    pool = ThreadPoolExecutor(1)
    # The uninterrupted torchrun reference runs beside the Slurm job, not after it.
    uninterrupted = pool.submit(run_once, command(EXAMPLE, shared_tmp / "ref", STEPS, 2, 0.0), shared_tmp / "ref_run")
    try:
        _wait(lambda: any(e.get("ev") == "action" and e.get("iteration", -1) >= 8 for e in events(run_dir)),
              180, "step 8 of the first attempt")
        node = first_host(_field(job, "NodeList") or "")
        assert node, _field(job, "NodeList")
        subprocess.run(["sbatch", "--parsable", "-p", "high", "-w", node, "--exclusive", "-t", "00:02:00",
                        "-J", "api-preemptor", f"--output={shared_tmp}/preemptor-%j.out", "--wrap", "sleep 2"],
                       capture_output=True, text=True, check=True)
        # A plain script has no hetrun post-mortem to shorten Slurm's requeue hold: release it at once.
        _wait(lambda: (release_if_held(job), _field(job, "JobState") == "COMPLETED")[1], 420,
              f"the requeued job to complete ({_field(job, 'JobState')})")
    finally:
        subprocess.run(["scancel", job], check=False, capture_output=True)
        pool.shutdown(wait=True)
    log = (shared_tmp / f"slurm-{job}.out").read_text()
    evs = events(run_dir)
    stopped = {e["rank"]: e["iteration"] for e in evs if e["ev"] == "checkpoint"
               and e.get("reason") in ("SIGTERM", "SIGTERM on another rank")}
    assert stopped.keys() == {0, 1} and len(set(stopped.values())) == 1, (stopped, log)
    restores = [e for e in evs if e["ev"] == "restore" and e.get("restart_count") == 1]
    assert {e["rank"]: e["iteration"] for e in restores} == {0: stopped[0], 1: stopped[0]}, log
    assert all(e["work_lost"] == 0 for e in restores), restores
    first_exits = [e for e in evs if e["ev"] == "exit" and e["code"] == 143]
    assert {e["rank"] for e in first_exits} == {0, 1}, log
    assert _field(job, "Restarts") == "1"
    reference = uninterrupted.result()
    assert reference.returncode == 0, reference.stdout
    assert_bit_identical(final_params(shared_tmp / "out"), final_params(shared_tmp / "ref"))
