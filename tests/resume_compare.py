"""Helpers of the exact-resume tests: example plans shrunk, checkpoint contents compared.

Two runs are "the same" when, for every component and rank, the newest
checkpoint holds the same tree: every tensor bit for bit (weights, optimizer
moments, per-rank generators, environment state, the pipeline's saved policy
versions) and every JSON value (global python/numpy RNG, counters, RNG of
each gymnasium environment).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]


def example_spec(name: str, **overrides: Any) -> dict[str, Any]:
    """``examples/<name>.yaml`` as a dict with nested ``overrides`` merged in
    (``{"training": {"iterations": 8}}``)."""
    doc = yaml.safe_load((ROOT / "examples" / f"{name}.yaml").read_text())

    def merge(dst: dict[str, Any], src: dict[str, Any]) -> None:
        for k, v in src.items():
            if isinstance(v, dict) and isinstance(dst.get(k), dict):
                merge(dst[k], v)
            else:
                dst[k] = copy.deepcopy(v)

    merge(doc, overrides)
    return doc


def plan_dict(spec: dict[str, Any]) -> dict[str, Any]:
    import json

    from hetrun.dag.plan import build_plan
    from hetrun.dag.spec import spec_from_dict

    return json.loads(build_plan(spec_from_dict(spec)).to_json())


def flat(obj: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            out.update(flat(v, f"{prefix}/{k}"))
        return out
    if isinstance(obj, (list, tuple)):
        out = {}
        for i, v in enumerate(obj):
            out.update(flat(v, f"{prefix}/{i}"))
        return out
    return {prefix: obj}


def stored(run_dir: Path, component: str, rank: int, step: int) -> dict[str, Any]:
    from hetrun.runtime.ckpt import open_store

    store = open_store(run_dir / "ckpt" / component)
    assert step in store.steps(), (component, store.steps())
    return flat(store.load_rank(step, rank)[0])


def differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Keys whose values differ (tensors by their bytes); missing keys count."""
    out = sorted(set(a) ^ set(b))
    for key in sorted(set(a) & set(b)):
        va, vb = a[key], b[key]
        if isinstance(va, torch.Tensor) and isinstance(vb, torch.Tensor):
            same = va.dtype == vb.dtype and va.shape == vb.shape and torch.equal(
                va.reshape(-1).view(torch.uint8), vb.reshape(-1).view(torch.uint8)) if va.numel() else (
                va.shape == vb.shape)
        elif isinstance(va, np.ndarray) or isinstance(vb, np.ndarray):
            same = isinstance(va, np.ndarray) and isinstance(vb, np.ndarray) and va.dtype == vb.dtype \
                and np.array_equal(va, vb)
        else:
            same = va == vb
        if not same:
            out.append(key)
    return out


def assert_same_checkpoints(a: Path, b: Path, ranks: dict[str, int], step: int) -> None:
    """Every component's checkpoint at ``step``: identical content in runs ``a`` and ``b``."""
    for component, n in ranks.items():
        for rank in range(n):
            x, y = stored(a, component, rank, step), stored(b, component, rank, step)
            diff = differences(x, y)
            assert not diff, (component, rank, diff[:12], len(diff))
            assert any(k.startswith("/rng/") for k in x), sorted(x)[:10]
