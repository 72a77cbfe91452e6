"""A het job of a command trainer and a command evaluator that evaluates each new
checkpoint of the trainer as it lands (issue 11): on the local backend and on the
local Slurm cluster. And the checkpoint reader's own rules on a real store."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from hetrun.dag.spec import spec_from_dict
from hetrun.runtime.api.reader import CheckpointReader
from hetrun.slurm_plugin.submit import submit_spec, wait_for_end

from hetrun.errors import RuntimeFailure
from tests.api_helpers import EXAMPLE, events

EVALUATOR = EXAMPLE.parent / "ddp_eval_hetrun.py"
STEPS, SAVE_EVERY = 40, 5


def test_reader_yields_each_committed_step_once_and_loads_a_subset_of_names(tmp_path: Path) -> None:
    import hetrun

    run = hetrun.attach(run_dir=tmp_path / "run", component="trainer")
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters())
    run.restore(state := {"model": model, "optim": opt})
    saved = {}
    for step in (0, 3, 7):
        with torch.no_grad():
            model.weight.add_(1.0)
        run.save(step, state, wait=True)
        saved[step] = model.weight.detach().clone()
    run.close()
    reader = CheckpointReader(tmp_path / "run", "trainer")
    assert reader.steps() == [0, 3, 7]
    assert list(reader.follow(stop=lambda: True)) == [0, 3, 7]  # step 0 is a step, not "nothing yet"
    fresh = torch.nn.Linear(4, 2)
    reader.load(3, {"model": fresh})  # the optimizer's state stays where it is
    assert torch.equal(fresh.weight, saved[3])
    with pytest.raises(RuntimeFailure, match="no new checkpoint of component 'nobody'"):
        list(CheckpointReader(tmp_path / "run", "nobody").follow(idle_timeout=0.5))


def _spec(trainer: dict[str, Any], out: Path, **extra: Any) -> Any:
    py = sys.executable
    return spec_from_dict({
        "name": "train-eval",
        "components": {
            "trainer": {**trainer, "command": [py, str(EXAMPLE), "--steps", str(STEPS), "--save-every",
                                               str(SAVE_EVERY), "--step-time", "0.1", "--out", str(out)]},
            "evaluator": {"nodes": 1, "tasks_per_node": 1, "command": [
                py, str(EVALUATOR), "--steps", str(STEPS), "--idle-timeout", "120"]},
        },
        "env": {"OMP_NUM_THREADS": "1"}, **extra})


def _check_evaluations(run_dir: Path, final: Any) -> None:
    evs = events(run_dir)
    logs = "\n".join(p.read_text() for p in sorted((run_dir / "logs").glob("*")))
    assert [c.state for c in final.components] == ["COMPLETED", "COMPLETED"], logs
    evals = [e for e in evs if e.get("component") == "evaluator" and e.get("type") == "step"]
    steps = [e["iteration"] for e in evals]
    assert steps == sorted(set(steps)) and steps[-1] == STEPS - 1, steps
    assert set(steps) <= {s for s in range(STEPS) if (s + 1) % SAVE_EVERY == 0}, steps
    assert len(steps) >= 3, f"only {steps} evaluated: not 'as they land'"
    trained = [e["end"] for e in evs if e.get("component") == "trainer" and e.get("type") == "step"]
    # Evaluations ran while the trainer trained, not all after it.
    assert evals[0]["end"] < max(trained), (evals[0], max(trained))
    losses = [e["metrics"]["eval_loss"] for e in evals]
    assert losses[-1] < losses[0], losses


@pytest.mark.slow
def test_local_het_job_of_a_command_trainer_and_a_checkpoint_evaluator(tmp_path: Path) -> None:
    from hetrun.slurm_plugin.backends.local import LocalBackend

    res = submit_spec(_spec({"nodes": 1, "tasks_per_node": 2}, tmp_path / "out"), backend="local",
                      runs_dir=tmp_path / "runs")
    final = wait_for_end(res.run, LocalBackend(), timeout_s=300, poll_s=0.5)
    _check_evaluations(Path(res.run.run_dir), final)


@pytest.mark.slurm
@pytest.mark.slow
def test_slurm_het_job_of_a_command_trainer_and_a_checkpoint_evaluator(slurm_cluster, shared_tmp: Path) -> None:  # type: ignore[no-untyped-def]
    import subprocess

    from hetrun.slurm_plugin.backends.sbatch import SbatchBackend

    spec = _spec({"nodes": 2, "tasks_per_node": 1, "mem": "1G"}, shared_tmp / "out",
                 slurm={"partition": "debug", "time": "00:10:00"})
    res = submit_spec(spec, backend="sbatch", runs_dir=shared_tmp / "runs")
    try:
        final = wait_for_end(res.run, SbatchBackend(), timeout_s=300, poll_s=1)
    finally:
        subprocess.run(["scancel", str(res.run.job_id)], check=False, capture_output=True)
    run_dir = Path(res.run.run_dir)
    _check_evaluations(run_dir, final)
    starts = sorted((e["component"], e["comp_rank"]) for e in events(run_dir) if e.get("ev") == "start" and e.get("command"))
    assert starts == [("evaluator", 0), ("trainer", 0), ("trainer", 1)], starts
