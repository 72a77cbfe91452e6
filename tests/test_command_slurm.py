"""Command components on the real local Slurm cluster: the unchanged torchrun-style
examples/ddp_train.py as a 2-node component (torchrun's variables from
hetrun.runtime.command_rank, gloo), examples/ddp_train_hetrun.py preempted through
the ``high`` partition and resumed exactly, and bad input (a command that is not
there, a rank that exits non-zero) ending with component, rank and reason named."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from hetrun.dag.spec import spec_from_dict
from hetrun.slurm_plugin.backends.sbatch import SbatchBackend
from hetrun.slurm_plugin.submit import submit_spec, wait_for_end

from hetrun.rundir import read_events
from tests.api_helpers import (
    BASELINE,
    EXAMPLE,
    assert_bit_identical,
    command,
    final_params,
    run_once,
)
from tests.preempt_helpers import preempt_at_and_wait

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def _events(run_dir: Path) -> list[dict[str, Any]]:
    # The product's reader: a missing file is no events, a line being written is skipped.
    return list(read_events(run_dir))


def _job(name: str, argv: list[str], nodes: int = 2, **extra: Any) -> Any:
    return spec_from_dict({
        "name": name, "components": {"trainer": {"nodes": nodes, "tasks_per_node": 1, "mem": "1G", "command": argv}},
        "slurm": {"partition": "debug", "time": "00:10:00"}, "env": {"OMP_NUM_THREADS": "1"}, **extra})


def _run(spec: Any, shared: Path, timeout: float = 180) -> tuple[Path, Any]:
    res = submit_spec(spec, backend="sbatch", runs_dir=shared / "runs")
    try:
        final = wait_for_end(res.run, SbatchBackend(), timeout_s=timeout, poll_s=1)
    finally:
        subprocess.run(["scancel", str(res.run.job_id)], check=False, capture_output=True)
    return Path(res.run.run_dir), final


def test_unchanged_ddp_script_runs_as_a_two_node_command_component(slurm_cluster, shared_tmp: Path) -> None:  # type: ignore[no-untyped-def]
    out = shared_tmp / "out"
    run_dir, final = _run(_job("ddp-cmd", [sys.executable, str(BASELINE), "--steps", "12", "--out", str(out)]),
                          shared_tmp)
    logs = "\n".join(p.read_text() for p in sorted((run_dir / "logs").glob("*")))
    assert [c.state for c in final.components] == ["COMPLETED"], logs
    assert "step 10 loss" in logs and (out / "final.pt").is_file(), logs
    starts = [e for e in _events(run_dir) if e["ev"] == "start"]
    # Two ranks of one torchrun-style world, on two different nodes.
    assert sorted((e["comp_rank"], e["comp_size"]) for e in starts) == [(0, 2), (1, 2)], starts
    assert len({e["node"] for e in starts}) == 2, starts
    end = [e for e in _events(run_dir) if e["ev"] == "attempt_end"]
    assert [e["outcome"] for e in end] == ["done"], end


def test_command_not_found_names_component_rank_and_reason(slurm_cluster, shared_tmp: Path) -> None:  # type: ignore[no-untyped-def]
    # A relative program with no job directory resolves in the run directory on the node: not
    # checkable at submit (a missing program on PATH is refused there: tests/test_prequeue_cli.py).
    run_dir, final = _run(_job("cmd-missing", ["./no-such-program-h4", "--x"], nodes=1), shared_tmp)
    assert [c.state for c in final.components] == ["FAILED"]
    end = next(e for e in _events(run_dir) if e["ev"] == "attempt_end")
    assert end["outcome"] == "failed" and not end["requeued"], end
    assert "rank 0 (trainer)" in end["reason"] and "command not found" in end["reason"], end
    status = subprocess.run(["hetrun", "status", str(run_dir)], capture_output=True, text=True)
    assert "command not found" in status.stdout, status.stdout


def test_rank_exiting_non_zero_is_named_and_the_job_fails(slurm_cluster, shared_tmp: Path) -> None:  # type: ignore[no-untyped-def]
    code = ("import os, sys, time; r = os.environ['RANK']; print('rank', r, 'of', os.environ['WORLD_SIZE'], flush=True); "
            "(print('bad batch: giving up', flush=True), sys.exit(3)) if r == '1' else time.sleep(60)")
    run_dir, final = _run(_job("cmd-exit", [sys.executable, "-c", code]), shared_tmp)
    assert [c.state for c in final.components] == ["FAILED"]
    end = next(e for e in _events(run_dir) if e["ev"] == "attempt_end")
    assert "rank 1 (trainer)" in end["reason"] and "exited with code 3" in end["reason"], end
    assert "bad batch: giving up" in end["reason"], end  # its own last line


def test_api_script_as_command_component_preempted_three_times_resumes_bit_identical(slurm_cluster, shared_tmp: Path) -> None:  # type: ignore[no-untyped-def]
    steps, out = 40, shared_tmp / "out"
    spec = _job("ddp-api-cmd", [sys.executable, str(EXAMPLE), "--steps", str(steps), "--out", str(out),
                                "--step-time", "0.25"])
    res = submit_spec(spec, backend="sbatch", runs_dir=shared_tmp / "runs")
    run_dir = Path(res.run.run_dir)

    def past(target: int, attempt: int) -> bool:
        # The API's step lines carry no restart count: count those after this attempt's restores.
        evs = _events(run_dir)
        restored = [i for i, e in enumerate(evs) if e["ev"] == "restore" and e.get("restart_count") == attempt]
        if attempt and len(restored) < 2:
            return False
        first = max(restored, default=-1)
        return any(e.get("ev") == "action" and e.get("iteration", -1) >= target for e in evs[first + 1:])

    with ThreadPoolExecutor(1) as pool:
        # The uninterrupted torchrun reference runs beside the preempted job, not after it.
        uninterrupted = pool.submit(run_once, command(EXAMPLE, shared_tmp / "ref", steps, 2, 0.0),
                                    shared_tmp / "ref_run")
        final = preempt_at_and_wait(res.run, shared_tmp, *(partial(past, 6 + a * 8, a) for a in range(3)),
                                    context=lambda: _events(run_dir)[-6:])
        reference = uninterrupted.result()
    evs = _events(run_dir)
    assert [c.state for c in final.components] == ["COMPLETED"], evs[-8:]
    assert [e["outcome"] for e in evs if e["ev"] == "attempt_end"] == ["preempted"] * 3 + ["done"]
    # Each preemption: both ranks saved the same agreed step before the attempt ended ...
    ends = [i for i, e in enumerate(evs) if e["ev"] == "attempt_end"]
    for attempt in (1, 2, 3):
        before = evs[ends[attempt - 2] + 1 if attempt > 1 else 0:ends[attempt - 1]]
        saved = {r: [e["iteration"] for e in before if e["ev"] == "checkpoint" and e["rank"] == r
                     and str(e.get("reason", "")).startswith("SIGTERM")] for r in (0, 1)}
        assert saved[0] and saved[0] == saved[1], (attempt, saved)
        restores = [e for e in evs if e["ev"] == "restore" and e.get("restart_count") == attempt]
        # ... and the next attempt resumed exactly at the newest of them: nothing lost.
        assert [e["iteration"] for e in restores] == [saved[0][-1]] * 2, (attempt, restores, saved)
        assert all(e["work_lost"] == 0 for e in restores), restores
    assert reference.returncode == 0, reference.stdout
    assert_bit_identical(final_params(out), final_params(shared_tmp / "ref"))
    _report_says_it_in_the_command_s_terms(run_dir, steps)


def _report_says_it_in_the_command_s_terms(run_dir: Path, steps: int) -> None:
    """Issue 24: the report of this run (3 preemptions, resumed exactly) speaks of steps and the
    metrics the script logs, counts preemptions once (as `hetrun status` does), summarises its
    checkpoints in one line, and states nothing it cannot know."""
    cli = partial(subprocess.run, capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    text = cli([sys.executable, "-m", "hetrun.cli", "report", str(run_dir)]).stdout
    lines = text.splitlines()
    assert lines[1] == "done (attempt 4)" and lines[2].startswith("result: loss ") and f"at step {steps - 1}" in lines[2]
    assert "attempts 4  restarts 3 (3 preempted); work lost 0 step(s)" in text, text
    assert f"work: trainer {steps} steps logged (last step {steps - 1}: loss=" in text, text
    for never in ("actions 0", "env steps", "preemptions 0", "unknown", "100.0% idle", "100.0%)"):
        assert never not in text, (never, text)
    ckpt = [ln for ln in lines if ln.startswith("checkpoints trainer: ")]
    assert len(ckpt) == 1 and "in the store" in ckpt[0] and f"newest step {steps} " in ckpt[0], text
    assert "not in the store" not in text  # per-checkpoint rows only with --checkpoints
    doc = json.loads(cli([sys.executable, "-m", "hetrun.cli", "report", str(run_dir), "--json"]).stdout)
    status = json.loads(cli([sys.executable, "-m", "hetrun.cli", "status", str(run_dir), "--json"]).stdout)[0]
    assert doc["headline"]["preemptions"] == doc["counts"]["preemptions"] == status["counts"]["preemptions"] == 3
    assert doc["headline"]["command_steps"] == {"trainer": steps}
    # A clean preemption reads as one in every log a user opens: the rank's, srun's, the batch's.
    logs = run_dir / "logs"
    rank_log = next(logs.glob("trainer-*-0.out")).read_text()
    assert rank_log.count("hetrun: rank 0 (trainer) stopped cleanly for preemption (SIGTERM)") == 3, rank_log
    for pattern in ("srun-*-0.err", "batch-*.out"):
        text = next(logs.glob(pattern)).read_text()
        assert "hetrun: attempt 0 stopped cleanly (preempted)" in text and "not a crash" in text, (pattern, text)
