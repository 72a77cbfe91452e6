"""torch optimizers that never import torch._dynamo: a second off every learner's (re)start.

torch.optim wraps an optimizer's public methods for torch.compile's sake: ``__init__``'s
``add_param_group``, ``zero_grad``, ``state_dict`` and ``load_state_dict`` through
``torch._disable_dynamo`` (torch/_compile.py), ``step`` through
``_use_grad_for_differentiable`` (torch/optim/optimizer.py), and each wrapper imports
``torch._dynamo`` on its first call: 1.2-1.3 s of one core per process, measured here,
more than ``import torch`` itself. A restart after a node death pays it in every learner
at once, beside the other ranks' starts on the same cores (benchmarks/node_death.md: four
MoE LM learners on two cores, about two seconds of the restart).

In eager execution those wrappers do nothing to the numbers: ``torch._dynamo.disable``
only matters while dynamo traces, ``graph_break()`` is a no-op outside a trace, and the
step's one effect is ``set_grad_enabled(defaults["differentiable"])`` around the update,
which ``eager`` keeps. ``eager(cls)`` is a subclass whose five methods are the functions the
wrappers wrap (``__wrapped__``, set by ``functools.wraps``), so the update is the very same
code: parameters and state are bit-identical to ``cls``'s (tests/test_eager_optim.py, which
also fails if a torch release moves the import somewhere this does not reach).

Not for an optimizer that torch.compile should trace: hetrun's examples run eagerly. The
subclass is local: ``cls`` and every other optimizer keep torch's behaviour.
"""

from __future__ import annotations

import functools
from typing import Any, TypeVar

import torch
from torch._compile import _disable_dynamo
from torch.optim.optimizer import Optimizer, _use_grad_for_differentiable

OptimizerT = TypeVar("OptimizerT", bound=Optimizer)

# The methods torch wraps with _disable_dynamo; step is handled apart (its wrapper also sets grad mode).
_DISABLE_WRAPPED = ("add_param_group", "zero_grad", "state_dict", "load_state_dict")
# The wrappers' own code: a method is unwrapped only when it is exactly one of them (an
# optimizer whose step is under torch.no_grad() instead, LBFGS, keeps that decorator).
_DISABLE_CODE = _disable_dynamo(lambda: None).__code__
_USE_GRAD_CODE = _use_grad_for_differentiable(lambda: None).__code__
# Optimizer.__init__ wraps its class's step once with the step hooks (_patch_step_function):
# looked through here; the subclass's own step gets that wrapper at its first instance.
_HOOK_CODE = Optimizer.profile_hook_step(lambda: None).__code__


def _unwrapped(fn: Any, wrapper_code: Any) -> Any:
    while getattr(fn, "__code__", None) is _HOOK_CODE:
        fn = getattr(fn, "__wrapped__", None)
    inner = getattr(fn, "__wrapped__", None)
    return inner if inner is not None and getattr(fn, "__code__", None) is wrapper_code else None


@functools.cache
def eager(cls: type[OptimizerT]) -> type[OptimizerT]:
    """``cls`` without torch.compile's wrappers (module doc); one subclass per ``cls``."""
    namespace: dict[str, Any] = {}
    for name in _DISABLE_WRAPPED:
        inner = _unwrapped(getattr(cls, name), _DISABLE_CODE)
        if inner is not None:
            namespace[name] = inner
    raw_step = _unwrapped(cls.step, _USE_GRAD_CODE)

    def step(self: Optimizer, closure: Any = None) -> Any:
        # What _use_grad_for_differentiable does around the update, less its graph breaks.
        prev = torch.is_grad_enabled()
        try:
            torch.set_grad_enabled(self.defaults["differentiable"])
            return raw_step(self, closure)
        finally:
            torch.set_grad_enabled(prev)

    if raw_step is not None:
        namespace["step"] = step
    namespace["__doc__"] = f"{cls.__name__} that never imports torch._dynamo (hetrun.runtime.eager_optim)."
    namespace["__module__"] = __name__
    return type(f"Eager{cls.__name__}", (cls,), namespace)
