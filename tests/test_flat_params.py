"""examples/flat_params.py: networks' parameters over one buffer, their gradients over another."""

from __future__ import annotations

import copy

import pytest
import torch
from hetrun.examples.flat_params import FlatParams
from torch import nn


def _nets(seed: int = 0) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(seed)
    return (nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)),
            nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1)))


def _loss(a: nn.Module, c: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return a(x).pow(2).mean() + c(x).sin().sum()


def test_adam_over_the_flat_buffer_updates_the_networks_bit_for_bit_as_per_parameter_adam() -> None:
    a, c = _nets()
    ra, rc = copy.deepcopy(a), copy.deepcopy(c)  # the reference: per-parameter Adam
    flat = FlatParams((a, c))
    assert flat.numel == sum(p.numel() for p in [*a.parameters(), *c.parameters()])
    for p, q in zip([*a.parameters(), *c.parameters()], [*ra.parameters(), *rc.parameters()], strict=True):
        assert torch.equal(p, q) and isinstance(p, nn.Parameter)  # the values kept, modules' own Parameters
    opt = torch.optim.Adam([flat.param], lr=1e-2, eps=1e-5)
    ref = torch.optim.Adam([*ra.parameters(), *rc.parameters()], lr=1e-2, eps=1e-5)
    gen = torch.Generator().manual_seed(1)
    for _ in range(5):
        x = torch.randn(16, 4, generator=gen)
        _loss(a, c, x).backward()  # into the networks' .grad: views of flat.param.grad
        _loss(ra, rc, x).backward()
        assert torch.equal(flat.param.grad, torch.cat([p.grad.reshape(-1) for p in [*ra.parameters(), *rc.parameters()]]))
        flat.check()
        opt.step()
        ref.step()
        flat.zero_grad()
        ref.zero_grad()
        for p, q in zip([*a.parameters(), *c.parameters()], [*ra.parameters(), *rc.parameters()], strict=True):
            assert torch.equal(p, q)  # updated in place through the buffer, the same numbers
    assert not flat.param.grad.any()
    exp_avg = ref.state_dict()["state"]
    assert torch.equal(opt.state[flat.param]["exp_avg"],
                       flat.slots_from([exp_avg[i]["exp_avg"] for i in range(len(flat.params))]))


def test_a_gradient_set_to_none_is_caught_not_trained_past() -> None:
    a, c = _nets()
    flat = FlatParams((a, c))
    opt = torch.optim.Adam([flat.param])
    opt.zero_grad()  # set_to_none: the networks' views now point at nothing the optimizer reads
    with pytest.raises(RuntimeError, match="set to None"):
        flat.check()
    flat2 = FlatParams(_nets(1))
    next(flat2.modules[0].parameters()).grad = None
    with pytest.raises(RuntimeError, match="left the flat buffers"):
        flat2.check()


def test_covers_the_same_networks_only_and_refuses_mixed_dtypes() -> None:
    a, c = _nets()
    flat = FlatParams((a, c))
    assert flat.covers((a, c)) and not flat.covers((copy.deepcopy(a), c)) and not flat.covers((a,))
    with pytest.raises(ValueError, match="one dtype"):
        FlatParams((nn.Linear(2, 2), nn.Linear(2, 2).double()))
    with pytest.raises(ValueError, match="no parameters"):
        FlatParams((nn.Tanh(),))
    with pytest.raises(ValueError, match="shape"):
        flat.slots_from([torch.zeros(1)] * len(flat.params))
    n0 = sum(p.numel() for p in a.parameters())
    assert flat.span(0) == slice(0, n0) and flat.span(1) == slice(n0, flat.numel)
    shared = FlatParams((a, nn.Sequential(a, nn.Linear(2, 1))))  # the second holds the first's too
    with pytest.raises(ValueError, match="shares parameters"):
        shared.span(1)
