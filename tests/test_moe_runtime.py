"""The shipped MoE example (examples/moe_lm.yaml) driven by hetrun's own runtime.

In-process (one rank per component) and through the local backend: mpirun
with 4 expert-parallel learner ranks and an evaluator rank that evaluates the
whole model the learners publish. Codecs are set to none here: the compressed
ones are the kernels layer's to test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from setup_tools import MPIRUN

REPO = Path(__file__).resolve().parents[1]
JOB = REPO / "examples" / "moe_lm.yaml"
EXACT = ["--set", "comms.forward_codec=none", "--set", "comms.backward_codec=none"]
SMALL = ["--set", "workload_args.corpus_bytes=300000", "--set", "workload_args.batch_size=8"]


def _plan(*overrides: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "hetrun.cli", "plan", str(JOB), "--json", "--capacity", "spec",
         *EXACT, *SMALL, *overrides],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


def _env_without_mpi_singleton() -> dict[str, str]:
    """This process's environment minus what an MPI singleton init put there.

    The in-process test initialises MPI in the pytest process; Open MPI then
    setenv()s PMIX_* / OMPI_MCA_ess... into the C environment, which a child
    inherits by default, and an mpirun started below it fails at once (exit 1,
    no output). ``os.environ`` is Python's snapshot and lacks those; scrub anyway.
    """
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("PMIX_", "OMPI_MCA_ess", "OMPI_MCA_orte", "OMPI_MCA_pmix"))}


def _events(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def test_moe_example_runs_in_process(tmp_path: Path, clean_resume_hooks: None) -> None:
    # clean_resume_hooks: resume.py caches a checkpoint slot per (component, rank) per process;
    # an earlier in-process run's learner slot would point this run at that run's store.
    from hetrun.runtime.inprocess import run_inprocess

    plan = _plan("--set", "training.iterations=8", "--set", "training.eval_interval=4",
                 "--set", "training.micro_batches=2")
    result = run_inprocess(plan, run_dir=tmp_path)
    assert result.exit_code == 0
    events = [e for e in _events(tmp_path) if e["ev"] == "action"]
    losses = [e["metrics"]["loss"] for e in events if "loss" in e.get("metrics", {})]
    evals = [e["metrics"]["eval_loss"] for e in events if "eval_loss" in e.get("metrics", {})]
    assert len(losses) == 8 and len(evals) == 2
    assert losses[-1] < losses[0] - 0.3, losses
    assert evals[-1] < evals[0], evals
    ran = {e["id"] for e in events} | {f for e in events for f in e.get("fused", [])}
    assert ran >= {"forward.m0", "backward.m1", "sync.grads", "optimize", "eval"}, ran


@pytest.mark.mpi
@pytest.mark.slow
@MPIRUN
def test_moe_example_expert_parallel_through_the_local_backend(tmp_path: Path) -> None:
    # 5 iterations, evaluation after iterations 1 and 3 (an eval at the very last
    # iteration would wait for weights the runtime does not send; see the report).
    proc = subprocess.run(
        [sys.executable, "-m", "hetrun.cli", "submit", str(JOB), "--backend", "local",
         "--runs-dir", str(tmp_path), "--wait", "--wait-timeout", "400", *EXACT, *SMALL,
         "--set", "training.iterations=5", "--set", "training.eval_interval=2",
         "--set", "checkpoint.interval=100"],
        capture_output=True, text=True, timeout=480, env=_env_without_mpi_singleton(),
    )
    run_dir = next(tmp_path.glob("moe-lm-*"))
    logs = "\n".join(p.read_text()[-2000:] for p in (run_dir / "logs").glob("*"))
    assert proc.returncode == 0, proc.stdout + proc.stderr + logs
    events = _events(run_dir)
    starts = [e for e in events if e["ev"] == "start"]
    assert sorted((e["component"], e["comp_size"]) for e in starts) == [
        ("evaluator", 1), *[("learner", 4)] * 4
    ]
    actions = [e for e in events if e["ev"] == "action"]
    optimize = [e for e in actions if "loss" in e.get("metrics", {})]
    assert sorted({e["rank"] for e in optimize}) == [0, 1, 2, 3]
    assert all(e["metrics"]["a2a_seconds"] > 0 for e in optimize)  # experts really exchanged
    evals = [e["metrics"]["eval_loss"] for e in actions if "eval_loss" in e.get("metrics", {})]
    assert len(evals) == 2 and evals[1] < evals[0] < 5.6, evals
    assert all(e.get("code") == 0 for e in events if e["ev"] == "exit")
