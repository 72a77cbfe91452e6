"""Exact resume for a user's own RL script (hetrun.runtime.api.gym_state).

A CleanRL-style PPO script (examples/ppo_own_script.py: SyncVectorEnv CartPole,
its own episode bookkeeping) stopped after update 3 and resumed from its
checkpoint ends with the same weights and the same per-update log, bit for
bit, as the same script run without a stop. Environments whose state cannot
be saved without pickle are refused by name.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from hetrun.runtime.api.gym_state import LoopState, VectorEnvState

from hetrun.errors import CheckpointError

SCRIPT = ["-m", "hetrun.examples.ppo_own_script", "--updates", "5", "--num-envs", "3", "--num-steps", "24"]


def _run(*extra: str) -> None:
    proc = subprocess.run([sys.executable, *SCRIPT, *extra], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_a_stopped_and_resumed_script_equals_the_uninterrupted_one(tmp_path: Path) -> None:
    _run("--run-dir", str(tmp_path / "whole"), "--out", str(tmp_path / "whole_out"))
    _run("--run-dir", str(tmp_path / "split"), "--stop-after", "3")
    assert not (tmp_path / "split_out").exists()
    _run("--run-dir", str(tmp_path / "split"), "--out", str(tmp_path / "split_out"))
    events = [json.loads(x) for x in (tmp_path / "split" / "events.jsonl").read_text().splitlines()]
    assert any(e["ev"] == "restore" for e in events)  # the second run did restore
    whole = torch.load(tmp_path / "whole_out" / "weights.pt", weights_only=True)
    split = torch.load(tmp_path / "split_out" / "weights.pt", weights_only=True)
    assert whole.keys() == split.keys()
    assert all(torch.equal(whole[k], split[k]) for k in whole)
    assert (json.loads((tmp_path / "whole_out" / "log.json").read_text())
            == json.loads((tmp_path / "split_out" / "log.json").read_text()))


def test_state_round_trips_through_json_values_into_other_envs() -> None:
    make = lambda: gym.vector.SyncVectorEnv(  # noqa: E731
        [lambda: gym.wrappers.RecordEpisodeStatistics(gym.make("CartPole-v1")) for _ in range(2)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    a, b = make(), make()
    a.reset(seed=3)
    b.reset(seed=99)
    for _ in range(30):
        a.step(np.array([0, 1]))
    saved = json.loads(json.dumps(VectorEnvState(a).state_dict()))  # only JSON values inside
    VectorEnvState(b).load_state_dict(saved)
    for _ in range(40):
        oa, ra, ta, ua, _ = a.step(np.array([1, 0]))
        ob, rb, tb, ub, _ = b.step(np.array([1, 0]))
        assert np.array_equal(oa, ob) and np.array_equal(ra, rb) and np.array_equal(ta, tb)
        assert np.array_equal(ua, ub)


def test_loop_state_restores_in_place_and_refuses_plain_numbers() -> None:
    arr, lst, ten = np.zeros(3), [1.0], torch.zeros(2)
    loop = LoopState(arr=arr, lst=lst, ten=ten)
    saved = json.loads(json.dumps({k: v for k, v in loop.state_dict().items() if k != "ten"}))
    arr[:] = 7.0
    lst.append(2.0)
    loop.load_state_dict({**saved, "ten": torch.ones(2)})
    assert arr.tolist() == [0.0, 0.0, 0.0] and lst == [1.0] and ten.tolist() == [1.0, 1.0]
    with pytest.raises(CheckpointError, match="step=int"):
        LoopState(step=5)


def test_envs_it_cannot_capture_are_refused_by_name() -> None:
    lake = gym.vector.SyncVectorEnv([lambda: gym.make("FrozenLake-v1")])
    with pytest.raises(CheckpointError, match="FrozenLake-v1"):
        VectorEnvState(lake)
    lake.close()
    stacked = gym.vector.SyncVectorEnv([lambda: gym.wrappers.FrameStackObservation(gym.make("CartPole-v1"), 2)])
    with pytest.raises(CheckpointError, match="FrameStackObservation"):
        VectorEnvState(stacked)
    stacked.close()
    vec = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="vector_entry_point")
    with pytest.raises(CheckpointError, match="CartPoleVectorEnv"):
        VectorEnvState(vec)
