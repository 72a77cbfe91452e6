"""Exact resume for a user's own RL script: the state of gymnasium vector environments and of
the loop's own bookkeeping, as objects ``Run.save`` / ``Run.restore`` take.

A resumed RL run equals an uninterrupted one only if everything the next step
reads is restored: weights and optimizer (the script's), the global RNGs (the
run API saves them), and what lives *outside* torch: every environment's
physics, step counter (TimeLimit) and random generator, the vector env's
pending autoresets, the observation the loop carries into the next step, and
the episode statistics the script accumulates (running returns, lists of
finished returns). ``VectorEnvState`` captures the environments,
``LoopState`` the loop's own arrays, lists and counters::

    envs = gym.vector.SyncVectorEnv([...])
    loop = LoopState(next_obs=next_obs, ep_return=ep_return, finished=finished, step=[0])
    start = run.restore({"agent": agent, "optim": optimizer, "envs": VectorEnvState(envs), "loop": loop})

Nothing is pickled: values are stored as JSON (floats round-trip exactly) and
tensors. What cannot be captured that way is refused with a clear error
naming the environment: ``AsyncVectorEnv`` (its envs live in worker
processes), emulators such as ALE (the state is an opaque C++ object plus the
wrappers' frame buffers), and any wrapper this module does not know. An env
of your own can opt in with two methods, ``hetrun_state() -> dict`` (JSON
values or numpy arrays) and ``hetrun_load_state(state)``.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

from hetrun.errors import CheckpointError

# Wrapper attributes that carry state across steps (and how to read them back).
_WRAPPER_FIELDS: dict[str, tuple[str, ...]] = {
    "TimeLimit": ("_elapsed_steps",),
    "OrderEnforcing": ("_has_reset",),
    "PassiveEnvChecker": ("checked_reset", "checked_step", "checked_render"),
    "RecordEpisodeStatistics": ("episode_count", "episode_returns", "episode_lengths"),
}
_UNSUPPORTED_HINT = ("build the envs with gymnasium.vector.SyncVectorEnv from classic-control "
                     "environments, or give your env hetrun_state()/hetrun_load_state(state); "
                     "otherwise resume is not exact: restart the episodes on resume and say so")


def _encode(value: Any) -> Any:
    """A JSON value (ndarray -> {"ndarray": list, "dtype": str}) that decodes to an equal value."""
    if isinstance(value, np.ndarray):
        return {"ndarray": value.tolist(), "dtype": str(value.dtype), "shape": list(value.shape)}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, tuple | list):
        return [_encode(v) for v in value]
    return value


def _decode(value: Any) -> Any:
    if isinstance(value, dict) and "ndarray" in value and "dtype" in value:
        return np.asarray(value["ndarray"], dtype=value["dtype"]).reshape(value["shape"])
    return value


def _env_name(env: Any) -> str:
    spec = getattr(env, "spec", None)
    return spec.id if spec is not None else type(getattr(env, "unwrapped", env)).__name__


class VectorEnvState:
    """``state_dict``/``load_state_dict`` for a gymnasium ``SyncVectorEnv``.

    Built on the envs the script steps; ``load_state_dict`` restores them in
    place (the script's own references stay valid). Raises ``CheckpointError``
    at construction when the envs cannot be captured exactly.
    """

    def __init__(self, envs: Any) -> None:
        from gymnasium.vector import SyncVectorEnv

        if not isinstance(envs, SyncVectorEnv):
            raise CheckpointError(
                f"cannot capture a {type(envs).__name__} for exact resume: "
                + ("its environments live in worker processes" if type(envs).__name__ == "AsyncVectorEnv"
                   else "only gymnasium.vector.SyncVectorEnv is supported"),
                hint=_UNSUPPORTED_HINT)
        self.envs = envs
        for env in envs.envs:
            self._check(env)

    # -- one sub-environment -------------------------------------------------------------
    @staticmethod
    def _chain(env: Any) -> list[Any]:
        out = []
        while True:
            out.append(env)
            inner = getattr(env, "env", None)
            if inner is None or inner is env:
                return out
            env = inner

    def _check(self, env: Any) -> None:
        import gymnasium as gym

        for layer in self._chain(env)[:-1]:
            name = type(layer).__name__
            if name not in _WRAPPER_FIELDS and isinstance(layer, gym.Wrapper):
                raise CheckpointError(
                    f"cannot capture {_env_name(env)} for exact resume: its wrapper {name} keeps "
                    "state hetrun does not know how to save without pickle", hint=_UNSUPPORTED_HINT)
        raw = env.unwrapped
        if callable(getattr(raw, "hetrun_state", None)):
            return
        if not hasattr(raw, "state"):
            raise CheckpointError(
                f"cannot capture {_env_name(env)} ({type(raw).__name__}) for exact resume: its state is "
                "not a plain `state` attribute (classic control) and it has no hetrun_state()",
                hint=_UNSUPPORTED_HINT)

    def _capture(self, env: Any) -> dict[str, Any]:
        layers = {}
        for layer in self._chain(env)[:-1]:
            fields = _WRAPPER_FIELDS[type(layer).__name__]
            layers[type(layer).__name__] = {f: _encode(getattr(layer, f)) for f in fields if hasattr(layer, f)}
            if type(layer).__name__ == "RecordEpisodeStatistics":
                layers["RecordEpisodeStatistics"].update(
                    return_queue=[float(x) for x in layer.return_queue],
                    length_queue=[int(x) for x in layer.length_queue])
        raw = env.unwrapped
        own = (raw.hetrun_state() if callable(getattr(raw, "hetrun_state", None))
               else {"state": None if raw.state is None else np.asarray(raw.state),
                     "steps_beyond_terminated": getattr(raw, "steps_beyond_terminated", None)})
        return {"wrappers": layers, "env": {k: _encode(v) for k, v in own.items()},
                "rng": None if raw._np_random is None else raw._np_random.bit_generator.state}

    def _load(self, env: Any, saved: dict[str, Any]) -> None:
        import gymnasium as gym

        for layer in self._chain(env)[:-1]:
            values = saved["wrappers"].get(type(layer).__name__, {})
            for field, value in values.items():
                if field in ("return_queue", "length_queue"):
                    queue = getattr(layer, field)
                    queue.clear()
                    queue.extend(value)
                else:
                    setattr(layer, field, _decode(value))
        raw = env.unwrapped
        own = {k: _decode(v) for k, v in saved["env"].items()}
        if callable(getattr(raw, "hetrun_load_state", None)):
            raw.hetrun_load_state(own)
        else:
            raw.state = own["state"]
            if hasattr(raw, "steps_beyond_terminated"):
                raw.steps_beyond_terminated = own["steps_beyond_terminated"]
        if saved["rng"] is not None:
            raw._np_random, _ = gym.utils.seeding.np_random(0)
            raw._np_random.bit_generator.state = saved["rng"]

    # -- the Stateful protocol -----------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        flags = getattr(self.envs, "_autoreset_envs", None)
        return {"num_envs": len(self.envs.envs), "envs": [self._capture(e) for e in self.envs.envs],
                "autoreset": None if flags is None else [bool(x) for x in flags]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if int(state["num_envs"]) != len(self.envs.envs):
            raise CheckpointError(
                f"the checkpoint holds {state['num_envs']} environments, this script runs "
                f"{len(self.envs.envs)}", hint="resume with the same number of environments")
        for env, saved in zip(self.envs.envs, state["envs"], strict=True):
            self._load(env, saved)
        if state["autoreset"] is not None:
            self.envs._autoreset_envs = np.asarray(state["autoreset"], dtype=np.bool_)


class LoopState:
    """The loop's own values, restored in place: numpy arrays (``arr[...] = saved``), torch
    tensors (``copy_``), lists and deques (contents replaced). A plain number cannot be
    changed in place: keep counters in a one-element list (``step=[0]``)."""

    def __init__(self, **values: Any) -> None:
        import torch

        for name, value in values.items():
            if not isinstance(value, np.ndarray | torch.Tensor | list | deque):
                raise CheckpointError(
                    f"LoopState {name}={type(value).__name__}: only numpy arrays, torch tensors, lists "
                    "and deques can be restored in place",
                    hint=f"hold it in a one-element list ({name}=[value]) and read {name}[0]")
        self.values = values

    def state_dict(self) -> dict[str, Any]:
        import torch

        return {k: v.detach().clone() if isinstance(v, torch.Tensor) else _encode(
            v if isinstance(v, np.ndarray) else list(v)) for k, v in self.values.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        import torch

        missing = sorted(set(self.values) - set(state))
        if missing:
            raise CheckpointError(f"the checkpoint's loop state has no {missing}",
                                  hint="restore with the same LoopState names that were saved")
        for name, value in self.values.items():
            saved = state[name]
            if isinstance(value, torch.Tensor):
                with torch.no_grad():
                    value.copy_(saved)
            elif isinstance(value, np.ndarray):
                value[...] = _decode(saved)
            else:
                value.clear()
                value.extend(_decode(x) for x in saved)
