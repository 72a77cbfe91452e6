"""The PPO example's networks and Adam state as a few flat tensors in its ``state_dict()``.

Why: the memory tier snapshots the learner's state every iteration on its training thread
(runtime/memory_tier.py), and its encoder's walk costs per tensor (its checks, its leaf, its
view, its digest), in caches the update just left cold. The learner's state listed name by name
is 12 network tensors and 36 of Adam's (a step, ``exp_avg`` and ``exp_avg_sq`` per parameter):
~0.3 of the ~0.5 ms a snapshot took against a ~30 ms iteration, the tier's share of the learner
at the 2 % line (benchmarks/node_death.md, session 41). Here they are one tensor for the networks
and one per Adam slot, each a single copy in C (``torch._utils._flatten_dense_tensors``, no
Python per tensor), read from the live tensors at each call, so a tensor replaced or resized is
read as it is now.

Layout (``state_dict()`` keys):

- ``net.flat``: every tensor ``PPOWorkload._net_tensors`` lists (the actor's, then the
  critic's, each network's ``state_dict`` order), flattened and concatenated; ``net.layout``:
  their names, dtype and shapes as one string, which a restore compares with its own networks';
- ``optim.slots.<slot>``: a per-parameter slot shaped like its parameter (``exp_avg``,
  ``exp_avg_sq``), the parameters in param-group order, flattened and concatenated;
  ``optim.scalars.<slot>``: a 0-d slot (``step``), one element per parameter;
- ``optim.param_groups`` as before (torch's packing: options and parameter numbers).

Used only where it is exact: every network tensor of one dtype, and every parameter holding the
same slots, each slot of one dtype and every parameter's either shaped like it or 0-d. Otherwise
(an optimizer state half built, a mixed-precision network) ``state_dict()`` lists them name by
name as torch's state_dicts do, and a restore reads either form (checkpoints written before this
layout too)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch._utils import _flatten_dense_tensors

from hetrun.errors import CheckpointError

NET_FLAT = "net.flat"
NET_LAYOUT = "net.layout"
SLOTS = "optim.slots."  # + slot name: per-parameter slots shaped like their parameter
SCALARS = "optim.scalars."  # + slot name: per-parameter 0-d slots


def net_layout(named: list[tuple[str, Tensor]]) -> str | None:
    """The networks' layout string (names, shapes, dtype); None when their dtypes differ
    (the flat form would need a promotion: not exact)."""
    if not named or len({t.dtype for _, t in named}) != 1:
        return None
    return ";".join(f"{name}:{'x'.join(map(str, t.shape))}" for name, t in named) + f"|{named[0][1].dtype}"


def flatten(tensors: list[Tensor]) -> Tensor:
    """One flat copy of ``tensors``' values (one call in C), never tracked by autograd."""
    with torch.no_grad():
        return _flatten_dense_tensors(tensors)


def flat_net(tensors: list[Tensor], layout: str) -> Tensor | None:
    """``tensors`` flat, or None when they no longer fit ``layout`` (a ``Module.double()`` or a
    ``.data =`` keeps the parameter objects the layout was made from but not their dtype or size):
    the dtypes are read at every call, the size checked on the copy."""
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) != 1 or not layout.endswith(f"|{next(iter(dtypes))}"):
        return None
    flat = flatten(tensors)
    return flat if flat.numel() == _numel(layout) else None


def _numel(layout: str) -> int:
    total = 0
    for entry in layout.rsplit("|", 1)[0].split(";"):
        n = 1
        for d in filter(None, entry.rsplit(":", 1)[1].split("x")):
            n *= int(d)
        total += n
    return total


Plan = tuple[list[Any], list[tuple[str, str, Any, int]]]


class OptimizerSlots:
    """Which of an Adam-like optimizer's slots go flat: decided once per optimizer state (its
    ``state`` dict object and size: a ``load_state_dict`` replaces it, the first step fills it),
    the slot tensors read from the state at each call."""

    def __init__(self) -> None:
        self._key: tuple[Any, int] | None = None
        self._plan: Plan | None = None

    def plan(self, opt: torch.optim.Optimizer) -> Plan | None:
        """(each parameter's state dict in param-group order, [(slot, "slots" | "scalars", its
        dtype, its flat size)]), or None when the flat form is not exact for this state."""
        key = (opt.state, len(opt.state))
        if self._key is None or self._key[0] is not key[0] or self._key[1] != key[1]:
            self._key, self._plan = key, _plan(opt)
        return self._plan

    def forget(self) -> None:
        """Make the plan again at the next call (a slot no longer fit it)."""
        self._key = self._plan = None


def _plan(opt: torch.optim.Optimizer) -> Plan | None:
    params = [p for group in opt.param_groups for p in group["params"]]
    states = [opt.state.get(p) for p in params]  # .get: opt.state is a defaultdict
    if not states or any(not s for s in states):
        return None
    names = list(states[0])
    if any(list(s) != names for s in states):
        return None
    kinds = []
    for slot in names:
        values = [s[slot] for s in states]
        if not all(isinstance(v, Tensor) for v in values) or len({v.dtype for v in values}) != 1:
            return None
        if all(v.shape == p.shape for v, p in zip(values, params, strict=True)):
            kinds.append((slot, "slots", values[0].dtype, sum(v.numel() for v in values)))
        elif all(v.dim() == 0 for v in values):
            kinds.append((slot, "scalars", values[0].dtype, len(values)))
        else:
            return None
    return states, kinds


def optimizer_slots(plan: Plan) -> dict[str, Tensor] | None:
    """The optimizer's slots, one flat tensor each (``plan``: ``OptimizerSlots.plan``), or None when
    a slot no longer fits the plan (a dtype or size changed since: the caller makes it again).
    The dtypes are read at every call (a copy of mixed dtypes would promote), the size checked
    on the copy."""
    states, kinds = plan
    out = {}
    for slot, kind, dtype, numel in kinds:
        values = [s[slot] for s in states]
        if {v.dtype for v in values} != {dtype}:
            return None
        flat = flatten(values)
        if flat.numel() != numel:
            return None
        out[(SLOTS if kind == "slots" else SCALARS) + slot] = flat
    return out


def has_flat_slots(state: dict[str, Any]) -> bool:
    return any(k.startswith((SLOTS, SCALARS)) for k in state)


def load_net(state: dict[str, Any], named: list[tuple[str, Tensor]]) -> None:
    """``net.flat`` into the networks' live tensors, after its layout is checked against theirs."""
    want, got = net_layout(named), state.get(NET_LAYOUT)
    if want is None or got != want:
        raise ValueError(f"the checkpoint's network layout {str(got)[:120]!r} is not this workload's "
                         f"{str(want)[:120]!r}")
    flat = state[NET_FLAT]
    tensors = [t for _, t in named]
    numels = [t.numel() for t in tensors]
    if not isinstance(flat, Tensor) or flat.dim() != 1 or flat.numel() != sum(numels):
        raise ValueError(f"{NET_FLAT} holds {getattr(flat, 'shape', type(flat).__name__)}, "
                         f"the networks {sum(numels)} values")
    with torch.no_grad():
        for t, piece in zip(tensors, flat.split(numels), strict=True):
            t.copy_(piece.view_as(t))


def slots_from_flat(state: dict[str, Any], params: list[Tensor]) -> dict[int, dict[str, Tensor]]:
    """Per-parameter optimizer state (copies, torch's ``state`` numbering) from the flat slots."""
    numels = [p.numel() for p in params]
    slots: dict[int, dict[str, Tensor]] = {i: {} for i in range(len(params))}
    for key, value in state.items():
        if key.startswith(SLOTS):
            name, want = key[len(SLOTS):], sum(numels)
        elif key.startswith(SCALARS):
            name, want = key[len(SCALARS):], len(params)
        else:
            continue
        if not isinstance(value, Tensor) or value.dim() != 1 or value.numel() != want:
            raise ValueError(f"{key} holds {getattr(value, 'shape', type(value).__name__)}, "
                             f"the optimizer's {len(params)} parameters need {want} values")
        if key.startswith(SLOTS):
            for i, (p, piece) in enumerate(zip(params, value.split(numels), strict=True)):
                slots[i][name] = piece.view_as(p).clone()
        else:
            for i in range(len(params)):
                slots[i][name] = value[i].clone()
    return slots


def check_form(state: dict[str, Any]) -> None:
    """A state holds the networks flat or by name, not a mix (a hand-edited or foreign tree)."""
    if (NET_FLAT in state) != (NET_LAYOUT in state):
        raise CheckpointError(f"PPO checkpoint state has one of {NET_FLAT} and {NET_LAYOUT} without the other",
                              hint="resume from a checkpoint this example wrote")
