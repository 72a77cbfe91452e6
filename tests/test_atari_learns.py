"""PPO on Atari really learns: Frostbite's score rises above a random policy's, same test.

Slow (minutes on 2 shared cores). The example YAML runs through the
runtime's in-process mode (same workload code and events as under MPI) with
a bounded budget: 64 iterations of 8 games x 128 agent steps (~262k frames),
a narrow IMPALA encoder (widths 4, 8, 8) on the standard 84x84 x 4 frames,
and a learning rate, epoch and minibatch count sized for that budget. Frostbite is
chosen because its reward (jumping down onto ice floes) shows within a few
tens of thousands of frames; Breakout needs ~10x more before it beats random.
Both the trained policy and the uniform-random baseline play 24 full games
(sampled actions, seeded); the test asks for a margin of 2.5 standard errors.

The budget comes from the spread over seeds and machines, margin in standard
errors (random: 75.4 +- 39.7 over the 24 seeded games, the same everywhere):

    iterations   seed 0 (this VM)  seed 0 (a fresh VM)  seed 1            seed 2
    16           -                 -                    88.8  (1.2)       103.3 (2.8)
    24           (2.84)            -                    -                 -
    32           passed            84.2  (0.8)          100.0 (2.3)       122.1 (3.7)
    48           -                 -                    116.2 (3.5)       163.3 (7.8)
    64           159.6 (7.5)       -                    -                 -

With the learner in bf16-mixed (the example's ``precision: auto`` on a CPU with native bf16,
examples/learner_precision.py; 4 December, session 16, this exact run): seed 0 147.9 (7.09),
seed 1 157.5 (6.05) at 64 iterations.

At 32 iterations two of four runs fell below 2.5; every run rises with the
budget (seed 1 by ~1.2 standard errors per 16 iterations), so at 64 the
slowest learner seen (0.8 at 32) extrapolates to ~3.2. Seeds 1 and 2 were
measured on 3 December with this exact run and evaluations at 16, 32 and 48
(an evaluation draws from its own generator, seeded by the policy version,
and does not change training); seed 0 at 64 on 3 December 19:00 (this VM).

Halving the run's cost with 42x42 frames (frame_size: 42; the update costs
~1/3, an iteration ~1/2 of CPU) was measured on 3 December and rejected: it
learns slower and levels off (seed 0: 1.16, 1.16, 2.96; seed 1: -0.31, 2.63,
2.48; seed 2: 2.54, 2.59, 1.99 at 16, 32, 48 iterations, seed 0's 48 resumed
from its checkpoint at 47; seed 4: 0.12 at 16), two of three below 2.5 at 48. Fewer iterations at 84x84 would leave the
fresh VM's seed 0 (0.8 at 32) unmeasured in between.

Halving the update instead (update_epochs: 1, num_minibatches: 16: the same 16
gradient steps per iteration on half the samples; ~355 CPU s for 48 iterations
and three evaluations against ~560 for this test) was measured on 3 December
22:11-23:03 (load 5-27) and rejected: it levels off near 100 points (seed 0:
0.00, 2.22, 2.09; seed 1: 0.32, 2.96, 1.96; seed 2: 1.37, 2.14, 2.97 at 16, 32,
48 iterations), two of three below 2.5 at 48, where two epochs reach 3.5 and 7.8.
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
ITERATIONS = 64
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
