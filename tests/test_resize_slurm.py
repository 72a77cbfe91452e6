"""`hetrun resubmit RUN --resize rollout=3` on the real local Slurm cluster.

The CartPole PPO example runs as a het job with 2 rollout ranks (real Open MPI
ranks under srun, real gymnasium); `hetrun cancel` stops it (Slurm's SIGTERM:
the ranks agree a stop iteration and checkpoint it). The resubmitted job is
attempt 1 of the same run directory, restores that agreed checkpoint into 3
rollout ranks by runtime/resize.py's rule, trains on from exactly that
iteration and finishes; `hetrun report` shows both attempts' sizes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hetrun.slurm_plugin.rundir import events_of

from tests.test_resume_cmd import ITERATIONS, cli, job_file, store_steps
from tests.test_resume_cmd_slurm import cancelled_at_a_checkpoint

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def split_attempts(run_dir: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """events.jsonl cut where the first rank of attempt 1 starts (the file is in time order)."""
    lines = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines() if x.strip()]
    cut = next(i for i, e in enumerate(lines) if e.get("ev") == "start" and e.get("restart_count") == 1)
    return lines[:cut], lines[cut:]


def learner_iterations(lines: list[dict[str, Any]]) -> list[int]:
    """Iterations the learner ran actions for (the optimize step may be fused into sync)."""
    return sorted({e["iteration"] for e in lines if e.get("ev") == "action" and e.get("component") == "learner"
                   and isinstance(e.get("iteration"), int)})


def test_resize_rollout_2_to_3_on_slurm_resumes_the_same_run(slurm_cluster: object, shared_tmp: Path) -> None:
    run_dir = cancelled_at_a_checkpoint(job_file(shared_tmp), shared_tmp / "runs")
    agreed = {e["iteration"] for e in events_of(run_dir, ("preempt",))}
    assert len(agreed) == 1, agreed  # every rank checkpointed the same agreed stop
    (stop,) = agreed
    assert stop < ITERATIONS and stop in set(store_steps(run_dir, "learner")) & set(store_steps(run_dir, "rollout"))

    res = cli("resubmit", str(run_dir), "--resize", "rollout=3", "--wait", timeout=900)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "as attempt 1" in res.stdout and f"from checkpoint step {stop}" in res.stdout, res.stdout
    assert "rollout: 2 -> 3 ranks" in res.stdout

    ends = events_of(run_dir, ("attempt_end",))
    assert [e["restart_count"] for e in ends] == [0, 1] and ends[-1]["outcome"] == "done", ends
    first, second = split_attempts(run_dir)
    sizes = [{c: len({e["rank"] for e in part if e.get("ev") == "start" and e.get("component") == c})
              for c in ("learner", "rollout")} for part in (first, second)]
    assert sizes == [{"learner": 1, "rollout": 2}, {"learner": 1, "rollout": 3}]

    restores = [e for e in second if e.get("ev") == "restore"]
    assert len(restores) == 4 and all(e["restored_state"] and e["step"] == stop for e in restores), restores
    assert all(e["iteration"] == stop for e in restores), restores
    # Nothing redone: every rank that ran before resumes at the agreed stop (the new rank never ran).
    assert sorted((e["rank"], e["work_lost"]) for e in restores) == [(0, 0), (1, 0), (2, 0), (3, None)]
    rollout = sorted((e for e in restores if e["component"] == "rollout"), key=lambda e: e["rank"])
    assert [(r["resize"]["saved_ranks"], r["resize"]["ranks"]) for r in rollout] == [(2, 3)] * 3
    assert [r["resize"]["fresh_envs"] == [] for r in rollout] == [True, True, False]  # the new rank's envs
    assert "resize" not in next(e for e in restores if e["component"] == "learner")  # unchanged count

    # Step continuity: attempt 0 trained up to the agreed stop, attempt 1 from it to the end.
    assert learner_iterations(first) == list(range(stop))
    assert learner_iterations(second) == list(range(stop, ITERATIONS))
    assert max(store_steps(run_dir, "learner")) == ITERATIONS

    rep = cli("report", str(run_dir), "--json")
    assert rep.returncode == 0, rep.stderr
    (row,) = json.loads(rep.stdout)["restart_history"]
    assert row["sizes_before"] == {"learner": 1, "rollout": 2} and row["sizes"] == {"learner": 1, "rollout": 3}
    assert row["work_lost_iterations"] == 0 and row["resumed_iteration"] == stop
    text = cli("report", str(run_dir))
    assert "restart 1: resized: rollout 2 -> 3 ranks" in text.stdout, text.stdout
