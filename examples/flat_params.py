"""One flat buffer under a set of networks' parameters, and one under their gradients: the
optimizer steps one tensor and a checkpoint or memory snapshot holds one, not one per parameter
and three per parameter's Adam slots.

Why: the memory tier snapshots the PPO learner every iteration, and its encode costs per tensor
(a few checks and a view each, ~3.5 us with the caches cold after the update): the two networks'
12 parameters and Adam's 36 slots were ~0.17 ms of a snapshot of ~0.7 ms on the learner's
critical path, which holds the tier at its 2 % line (benchmarks/node_death.md, sessions 41-42).
Flat, the state is four tensors.

How (Megatron's contiguous gradient buffer, apex's flat master parameters): each parameter stays
an ``nn.Parameter`` of its module (forward, ``Module.state_dict()`` and ``load_state_dict`` by
name work as before) whose ``.data`` is a view into ``param`` and whose ``.grad`` is a view into
``param.grad``: autograd adds a gradient into an existing ``.grad`` in place, so a backward
fills the flat gradient, and an optimizer over ``[param]`` updates every module's weights in
place. Exact: Adam's arithmetic is elementwise, the same numbers whichever way the elements are
grouped (tests/test_flat_params.py compares an update with per-parameter Adam's, bit for bit).

The one rule: never set the gradients to None (``optimizer.zero_grad()``'s default): the
modules' ``.grad`` views would keep the old buffer while a new one is made. ``zero_grad`` here
zeroes in place; ``check`` raises if a link was broken.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor, nn


class FlatParams:
    """``modules``' parameters (in ``Module.parameters()`` order, each once) over one buffer."""

    def __init__(self, modules: Iterable[nn.Module]) -> None:
        self.modules = tuple(modules)
        # Each parameter once, in the modules' order; each module's span in the buffer (empty for
        # one that shares parameters with an earlier one: not contiguous, span() refuses it).
        params: list[nn.Parameter] = []
        self._spans: list[slice] = []
        seen: set[int] = set()
        for m in self.modules:
            mine = list(m.parameters())
            own = [p for p in mine if id(p) not in seen]
            seen.update(id(p) for p in own)
            start = sum(p.numel() for p in params)
            params += own
            self._spans.append(slice(start, start + sum(p.numel() for p in own)) if len(own) == len(mine)
                               else slice(0, 0))
        if not params:
            raise ValueError("FlatParams: the modules have no parameters")
        dtypes = {p.dtype for p in params}
        devices = {p.device for p in params}
        if len(dtypes) != 1 or len(devices) != 1:
            raise ValueError(f"FlatParams: one dtype and one device, got {sorted(map(str, dtypes))} "
                             f"on {sorted(map(str, devices))}")
        (dtype,), (device,) = dtypes, devices
        self.params = params
        self.numel = sum(p.numel() for p in params)
        self.param = nn.Parameter(torch.empty(self.numel, dtype=dtype, device=device))
        self.param.grad = torch.zeros_like(self.param)
        offset = 0
        with torch.no_grad():
            for p in params:
                n = p.numel()
                self.param[offset:offset + n].copy_(p.reshape(-1))
                p.data = self.param.data[offset:offset + n].view_as(p)
                p.grad = self.param.grad[offset:offset + n].view_as(p)
                offset += n

    def span(self, i: int) -> slice:
        """Where module ``i``'s parameters lie in the buffer (its ``parameters()`` order).
        Raises ValueError for a module sharing parameters with an earlier one (not contiguous)."""
        s = self._spans[i]
        if s.stop == s.start:
            raise ValueError(f"FlatParams: module {i} shares parameters with an earlier one: no span of its own")
        return s

    def covers(self, modules: Iterable[nn.Module]) -> bool:
        """Whether these are still the networks this buffer was made under (one replaced: not)."""
        mods = tuple(modules)
        return len(mods) == len(self.modules) and all(a is b for a, b in zip(mods, self.modules, strict=True))

    def zero_grad(self) -> None:
        """Every gradient to zero, in place (the modules' views keep pointing into the buffer)."""
        grad = self.param.grad
        assert grad is not None
        grad.zero_()

    def check(self) -> None:
        """Raise if a gradient or a weight no longer lies in the buffers (a ``zero_grad`` that set
        them to None, a ``.data`` replaced): an update would then miss the networks silently."""
        grad = self.param.grad
        lo = self.param.data_ptr()
        if grad is None:
            raise RuntimeError("FlatParams: the flat gradient was set to None (zero_grad(set_to_none=True)?); "
                               "use FlatParams.zero_grad")
        glo, size = grad.data_ptr(), self.numel * self.param.element_size()
        for p in self.params:
            if not lo <= p.data_ptr() < lo + size or p.grad is None or not glo <= p.grad.data_ptr() < glo + size:
                raise RuntimeError("FlatParams: a parameter's weight or gradient left the flat buffers")

    def slots_from(self, per_param: list[Tensor]) -> Tensor:
        """One flat slot from per-parameter ones (an optimizer state written before the
        parameters were flat), in this buffer's order."""
        if len(per_param) != len(self.params):
            raise ValueError(f"{len(per_param)} slots for {len(self.params)} parameters")
        for s, p in zip(per_param, self.params, strict=True):
            if s.shape != p.shape:
                raise ValueError(f"a slot of shape {tuple(s.shape)} for a parameter of shape {tuple(p.shape)}")
        return torch.cat([s.reshape(-1).to(self.param.dtype) for s in per_param])
