"""runtime/eager_optim.py: the same numbers as torch's optimizers, and no torch._dynamo import."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest
import torch
from hetrun.runtime.eager_optim import eager


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))


def _train(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    for i in range(steps):
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(i))
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


@pytest.mark.parametrize(("cls", "kwargs"), [
    (torch.optim.AdamW, {"lr": 1e-2, "betas": (0.9, 0.95), "weight_decay": 0.1}),
    (torch.optim.Adam, {"lr": 2.5e-3, "eps": 1e-5}),
    (torch.optim.SGD, {"lr": 1e-2, "momentum": 0.9}),
])
def test_bit_identical_to_torch(cls, kwargs):
    a, b = _model(0), _model(0)
    plain, fast = cls(a.parameters(), **kwargs), eager(cls)(b.parameters(), **kwargs)
    assert isinstance(fast, cls)
    _train(a, plain, 4)
    _train(b, fast, 4)
    # a state dict moves between the two kinds (a copy: torch's load keeps same-device tensors)
    fast.load_state_dict(copy.deepcopy(plain.state_dict()))
    _train(a, plain, 3)
    _train(b, fast, 3)
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q)
    sa, sb = plain.state_dict(), fast.state_dict()
    assert sa["param_groups"] == sb["param_groups"]
    for k in sa["state"]:
        for name, v in sa["state"][k].items():
            assert torch.equal(v, sb["state"][k][name]), (k, name)


def test_step_keeps_grad_mode_and_hooks():
    model = _model(1)
    opt = eager(torch.optim.AdamW)(model.parameters(), lr=1e-3)
    before = [p.detach().clone() for p in model.parameters()]
    seen = []
    opt.register_step_post_hook(lambda o, args, kwargs: seen.append(torch.is_grad_enabled()))
    model(torch.ones(2, 16)).sum().backward()
    with torch.enable_grad():
        # Under grad mode an in-place update of a leaf that requires grad raises: the step
        # ran with grad off (defaults["differentiable"]) and gave the caller's mode back.
        opt.step()
        assert torch.is_grad_enabled()
    assert seen == [True]  # the step hooks still run (after the update, grad mode restored)
    assert all(not torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))


def test_lbfgs_keeps_its_no_grad_step():
    # LBFGS.step is under torch.no_grad(), not torch's dynamo wrapper: left as it is.
    assert eager(torch.optim.LBFGS).step is torch.optim.LBFGS.step


_NO_DYNAMO = """
import json, sys, torch
from hetrun.runtime.eager_optim import eager
m = torch.nn.Linear(4, 4)
opt = eager(torch.optim.AdamW)(m.parameters(), lr=1e-3)
m(torch.ones(2, 4)).sum().backward()
opt.step(); opt.zero_grad(set_to_none=True)
opt.load_state_dict(opt.state_dict())
print(json.dumps({"dynamo": "torch._dynamo" in sys.modules}))
"""


def test_never_imports_dynamo():
    # A fresh interpreter: anything in this one may have imported torch._dynamo already.
    out = subprocess.run([sys.executable, "-c", _NO_DYNAMO], capture_output=True,
                         text=True, timeout=120, check=True).stdout
    assert json.loads(out.splitlines()[-1]) == {"dynamo": False}


def test_unwraps_a_class_torch_has_already_hooked():
    # Optimizer.__init__ wraps its class's step with the step hooks once: eager() looks through it.
    m = torch.nn.Linear(4, 4)
    torch.optim.Adamax(m.parameters())
    assert getattr(torch.optim.Adamax.step, "hooked", False)
    assert eager(torch.optim.Adamax).step is not torch.optim.Adamax.step
    assert eager(torch.optim.Adamax).zero_grad is not torch.optim.Optimizer.zero_grad
