"""PPO on Atari really learns: Frostbite's score rises above a random policy's, same test.

Slow (minutes on 2 shared cores). The example YAML runs through the
runtime's in-process mode (same workload code and events as under MPI) with
a bounded budget: 32 iterations of 8 games x 128 agent steps (~131k frames),
a narrow IMPALA encoder (widths 4, 8, 8) on the standard 84x84 x 4 frames,
and a learning rate, epoch and minibatch count sized for that budget. Frostbite is
chosen because its reward (jumping down onto ice floes) shows within a few
tens of thousands of frames; Breakout needs ~10x more before it beats random.
Both the trained policy and the uniform-random baseline play 24 full games
(sampled actions, seeded); the test asks for a margin of 2.5 standard errors.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hetrun.dag.overrides import Overrides
from hetrun.dag.plan import build_plan
from hetrun.dag.spec import load_spec
from hetrun.examples.atari_envs import AtariSettings, random_policy_scores
from hetrun.runtime.events import read_events
from hetrun.runtime.inprocess import run_inprocess

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "ppo_atari.yaml"
ITERATIONS = 32
GAMES = 24
ARGS = ("{env_id: ALE/Frostbite-v5, num_envs: 8, num_steps: 128, impala_width: 4, hidden: 64, "
        f"learning_rate: 0.001, update_epochs: 2, num_minibatches: 8, eval_episodes: {GAMES}, eval_max_steps: 4000}}")


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_frostbite_score_rises_above_a_random_policys(tmp_path: Path) -> None:
    spec = load_spec(EXAMPLE, Overrides(sets=[
        f"training.iterations={ITERATIONS}", f"training.eval_interval={ITERATIONS}",
        "checkpoint.interval=0", f"workload_args={ARGS}"]))
    result = run_inprocess(json.loads(build_plan(spec).to_json()), run_dir=tmp_path)
    assert result.exit_code == 0 and result.iterations_done == ITERATIONS

    events = [e for e in read_events(tmp_path) if e.get("ev") == "action"]
    optimizes = [e["metrics"] for e in events if "episodic_return" in e.get("metrics", {})]
    assert optimizes[-1]["env_steps"] == ITERATIONS * 8 * 128
    trained = next(e["metrics"] for e in events if e["type"] == "eval")
    assert trained["eval_episodes"] == GAMES and trained["policy_version"] == ITERATIONS

    rand = random_policy_scores(AtariSettings(env_id="ALE/Frostbite-v5"), GAMES, seed=12345, max_steps=4000)
    se = math.sqrt(trained["eval_return_std"] ** 2 / GAMES + rand.std(ddof=1) ** 2 / GAMES)
    margin = trained["eval_return_mean"] - rand.mean()
    assert margin > 2.5 * se, (trained, rand.tolist())
