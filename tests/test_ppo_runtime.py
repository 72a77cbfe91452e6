"""The PPO example as a real hetrun job: local backend, one mpirun MPMD launch, real ranks.

A learner rank and two rollout ranks (3 ranks, 2 components) run a few
iterations; every action lands in events.jsonl, the learner sees exactly the
staleness the mode allows (pipelined: at most the tolerance window; coarse:
none), and evaluation metrics come back through the runtime.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hetrun.runtime.events import read_events
from setup_tools import MPIRUN

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "ppo_cartpole.yaml"
ITERATIONS = 4

pytestmark = [
    pytest.mark.mpi,
    pytest.mark.slow,
    MPIRUN,
]


def run_job(tmp_path: Path, mode: str, iterations: int = ITERATIONS, spread: bool = False) -> list[dict]:
    """``hetrun submit -b local --wait`` as a user types it; the run's events."""
    sets = [f"training.iterations={iterations}", f"training.mode={mode}", "training.eval_interval=2",
            "checkpoint.interval=0",
            "workload_args={env_id: CartPole-v1, num_envs: 4, num_steps: 64, eval_episodes: 4, "
            f"eval_spread: {str(spread).lower()}}}"]
    cmd = [sys.executable, "-m", "hetrun.cli", "submit", str(EXAMPLE), "-b", "local",
           "--runs-dir", str(tmp_path / "runs"), "--wait", "--wait-timeout", "240"]
    for item in sets:
        cmd += ["--set", item]
    # os.environ, not the process's C environment: an earlier test may have initialised MPI in
    # this process (singleton), whose PMIX_*/OMPI_MCA_ess variables would confuse mpirun.
    proc = subprocess.run(cmd, env=dict(os.environ), capture_output=True, text=True, timeout=300)
    runs = list((tmp_path / "runs").iterdir())
    assert len(runs) == 1, (proc.stdout, proc.stderr)
    events = list(read_events(runs[0]))
    errors = [e.get("error") for e in events if e.get("ev") == "error"]
    assert not errors, errors
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert "learner=COMPLETED, rollout=COMPLETED" in proc.stdout
    return events


def actions(events: list[dict], kind: str) -> list[dict]:
    """Action events that ran an action of type ``kind``, alone or fused with others."""
    def kinds(e: dict) -> set[str]:
        return {part.split(".")[0] for part in (e.get("fused") or [e["id"]])} | {e["type"]}

    return [e for e in events if e.get("ev") == "action" and kind in kinds(e)]


# eval_lag: the example evaluates on its rollout component, the weights the rollout of that
# iteration loaded (sync.policy lag 1 + tolerance window pipelined, 1 coarse).
@pytest.mark.parametrize(("mode", "max_staleness", "eval_lag"), [("pipelined", 2, 2), ("coarse", 0, 1)])
def test_ppo_job_runs_every_action_with_the_modes_staleness(
    tmp_path: Path, mode: str, max_staleness: int, eval_lag: int
) -> None:
    events = run_job(tmp_path, mode)
    starts = [e for e in events if e.get("ev") == "start"]
    assert sorted(e["component"] for e in starts) == ["learner", "rollout", "rollout"]

    rollouts = actions(events, "rollout")
    assert len(rollouts) == 2 * ITERATIONS  # each rollout rank, every iteration
    assert {e["rank"] for e in rollouts} == {e["rank"] for e in starts if e["component"] == "rollout"}
    assert all(e["steps"] == 4 * 64 for e in rollouts)

    optimizes = actions(events, "optimize")
    assert [e["iteration"] for e in optimizes] == list(range(ITERATIONS))
    for e in optimizes:
        m = e["metrics"]
        assert m["env_steps"] == 2 * 4 * 64 * (e["iteration"] + 1)  # both ranks' batches merged
        assert m["policy_version"] == e["iteration"] + 1
        assert 0 <= m["staleness"] <= max_staleness, (mode, m["staleness"])
    assert len(actions(events, "forward")) == len(actions(events, "backward")) == 2 * ITERATIONS

    evals = [e for e in actions(events, "eval") if not e.get("skipped")]
    assert [e["iteration"] for e in evals] == [1, 3]
    # Only the first rollout rank evaluates, and each evaluation names the version it used:
    # the one its rollout had (update i - eval_lag's weights), never one it waited for.
    first = min(e["rank"] for e in starts if e["component"] == "rollout")
    assert {(e["component"], e["rank"]) for e in evals} == {("rollout", first)}
    assert [e["metrics"]["policy_version"] for e in evals] == [i + 1 - eval_lag for i in (1, 3)]
    for e in evals:
        assert e["metrics"]["reward_threshold"] == 475.0
        assert e["metrics"]["eval_episodes"] == 4
        assert 8 <= e["metrics"]["eval_return_mean"] <= 500


def test_a_spread_evaluation_reports_the_weights_of_the_rollout_after_the_one_before(tmp_path: Path) -> None:
    # eval_spread (examples/ppo_spread_eval.py), as examples/ppo_cartpole.yaml ships it: evaluations
    # at 1, 3, 5; the first at once (the version rollout 1 had: 0), the one at 3 spread over the
    # rollouts after the one at 1 (rollout 2's weights: 1), the run's last at once (rollout 5's: 4).
    events = run_job(tmp_path, "pipelined", iterations=6, spread=True)
    evals = [e for e in actions(events, "eval") if not e.get("skipped")]
    assert [e["iteration"] for e in evals] == [1, 3, 5]
    assert [e["metrics"]["policy_version"] for e in evals] == [0, 1, 4]
    rollouts = {e["iteration"]: e["policy_version"] for e in actions(events, "rollout") if e["rank"] == evals[0]["rank"]}
    assert (rollouts[1], rollouts[2], rollouts[5]) == (0, 1, 4)
