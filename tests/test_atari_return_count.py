"""benchmarks/atari_ppo_throughput.py counts hetrun's way to the fixed return as it counts SB3's:
the env steps whose games reached it (not those run until the poll stopped the run), and no mean
over fewer than 5 finished games (the peers' rule)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import atari_ppo_throughput as bench


def _update(i: int, games: int, mean: float | None) -> dict[str, Any]:
    metrics: dict[str, Any] = {"episodes": float(games), "env_steps": float(1024 * (i + 1))}
    if mean is not None:
        metrics["episodic_return"] = mean
    return {"ev": "action", "type": "optimize", "start": 10.0 + 5 * i, "end": 14.0 + 5 * i, "metrics": metrics}


def _rollout(i: int) -> dict[str, Any]:
    return {"ev": "action", "type": "rollout", "start": 8.0 + 5 * i, "end": 10.0 + 5 * i, "steps": 1024}


def test_the_env_steps_are_those_of_the_update_that_reached_the_return_not_of_the_stop() -> None:
    # 6 updates ran (the poll stopped the run late); the 4th (3,072 + 1,024 env steps) reached 100
    events = [_rollout(i) for i in range(6)]
    events += [_update(0, 0, None), _update(1, 3, 70.0), _update(2, 3, 90.0), _update(3, 2, 104.0),
               _update(4, 3, 110.0), _update(5, 2, 120.0)]
    got = bench.time_to_return(events, 100.0)
    assert got["env_steps_at_target"] == 4096
    assert got["solved_at_s"] == 29.0 - 8.0  # that update's end, from the first action's start
    assert got["training_return"] == 120.0


def test_a_mean_over_fewer_than_five_games_does_not_count() -> None:
    # two lucky early games score 150 on average; the peers would not count them, nor does hetrun now
    events = [_update(0, 2, 150.0), _update(1, 2, 95.0), _update(2, 3, 101.0)]
    got = bench.time_to_return(events, 100.0)
    assert got["env_steps_at_target"] == 3072 and got["solved_at_s"] == 24.0 - 10.0
    assert bench.time_to_return(events[:2], 100.0)["env_steps_at_target"] is None
    assert bench.time_to_return(events[:2], 100.0)["solved_at_s"] is None
