"""The learner's arithmetic precision, as Lightning spells it: ``"32"`` or ``"bf16-mixed"``.

``bf16-mixed`` runs the learner's forward passes (and so their backward) under
``torch.autocast`` in bfloat16: weights, optimizer state and gradients stay fp32,
convolutions and matmuls compute in bf16. On a CPU with native bf16 instructions
(AVX512-BF16 or AMX) the IMPALA CNN's minibatch step took half the time of fp32's
here (0.57 vs 1.14 s for 256 frames, one thread: benchmarks/atari.md). Without
them oneDNN emulates bf16, so ``auto`` picks bf16-mixed only where the CPU says
it has them (its /proc/cpuinfo flags) or on a CUDA device, else 32.

Rollout ranks act in fp32 either way: the behaviour log-probabilities PPO's ratio
divides by are the policy's exact ones.
"""

from __future__ import annotations

import contextlib
import functools
from pathlib import Path
from typing import Literal

import torch

from .ppo_args import Precision

NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


@functools.cache
def cpu_has_native_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return False
    flags = next((ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")), [])
    return bool(NATIVE_BF16_FLAGS & set(flags))


def resolve(precision: Precision, device: torch.device) -> Literal["32", "bf16-mixed"]:
    if precision != "auto":
        return precision
    native = device.type == "cuda" or (device.type == "cpu" and cpu_has_native_bf16())
    return "bf16-mixed" if native else "32"


def autocast(precision: Literal["32", "bf16-mixed"], device: torch.device) -> contextlib.AbstractContextManager[None]:
    """The context a learner's forward passes run in (thread-local: each part's thread enters its own)."""
    if precision == "32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)
