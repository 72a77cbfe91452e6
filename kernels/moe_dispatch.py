"""MoE gating + top-k + token permutation, and the inverse (weighted combine).

``gate_topk_permute`` scores every token against every expert, keeps the
top ``k`` experts per token and returns the token rows grouped by expert (the
order the expert-parallel all-to-all sends them in) with the per-expert
counts; ``unpermute_combine`` brings expert outputs back to token order,
weighting each of a token's ``k`` copies by its gate value and summing.

The permutation and the combine are custom autograd Functions: the backward
of a gather is one ``index_add_`` and the backward of the weighted combine
gathers the output gradient once for both the expert-output and the weight
gradients, instead of autograd's chain of index/mul/sum nodes with their
T*k x H temporaries. The gate (a T x E softmax and top-k) stays ordinary
autograd: it is small.

``*_reference`` are the plain versions the fused ones are tested against.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from hetrun.errors import HetrunError

__all__ = [
    "Dispatch",
    "gate_topk_permute",
    "gate_topk_permute_reference",
    "unpermute_combine",
    "unpermute_combine_reference",
]


class Dispatch(NamedTuple):
    permuted_x: torch.Tensor  # [T*k, H], rows grouped by expert 0..E-1
    token_index: torch.Tensor  # [T*k] int64: source token of each permuted row
    weights: torch.Tensor  # [T*k]: gate weight of each permuted row (differentiable)
    splits: list[int]  # [E]: rows per expert (sum = T*k)
    probs: torch.Tensor  # [T, E]: softmax of the gate (for a load-balancing loss)


def _route(
    x: torch.Tensor, gate_weight: torch.Tensor, k: int, normalize: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, list[int]]:
    num_experts = gate_weight.shape[0]
    if not 1 <= k <= num_experts:
        raise HetrunError(
            f"gate_topk_permute: k={k} must be between 1 and the number of experts ({num_experts})",
            hint="choose top-k no larger than the expert count",
        )
    probs = torch.softmax(x @ gate_weight.t(), dim=-1)  # [T, E]
    top_w, top_e = torch.topk(probs, k, dim=-1)  # [T, k]
    if normalize:
        top_w = top_w / top_w.sum(dim=-1, keepdim=True)
    flat_e = top_e.reshape(-1)
    # A stable sort keeps each expert's rows in token order (deterministic, like the reference).
    order = torch.sort(flat_e, stable=True).indices
    token_index = torch.div(order, k, rounding_mode="floor")
    counts = torch.bincount(flat_e, minlength=num_experts)
    return probs, top_w, order, token_index, counts.tolist()


class _Permute(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, token_index: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(token_index)
        ctx.rows = x.shape[0]
        return x.index_select(0, token_index)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        (token_index,) = ctx.saved_tensors
        gx = torch.zeros((ctx.rows, *g.shape[1:]), dtype=g.dtype, device=g.device)
        gx.index_add_(0, token_index, g)
        return gx, None


class _Combine(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, y: torch.Tensor, token_index: torch.Tensor, w: torch.Tensor, num_tokens: int
    ) -> torch.Tensor:
        ctx.save_for_backward(y, token_index, w)
        out = torch.zeros((num_tokens, *y.shape[1:]), dtype=y.dtype, device=y.device)
        out.index_add_(0, token_index, y * w.reshape(-1, *([1] * (y.dim() - 1))))
        return out

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        y, token_index, w = ctx.saved_tensors
        g_rows = g.index_select(0, token_index)  # gathered once, used twice
        gy = gw = None
        if ctx.needs_input_grad[2]:
            gw = (g_rows * y).reshape(y.shape[0], -1).sum(dim=1)
        if ctx.needs_input_grad[0]:
            gy = g_rows.mul_(w.reshape(-1, *([1] * (y.dim() - 1))))
        return gy, None, gw, None


def gate_topk_permute(
    x: torch.Tensor, gate_weight: torch.Tensor, k: int, *, normalize: bool = True
) -> Dispatch:
    """Route tokens ``x`` [T, H] to their top-``k`` experts (``gate_weight`` [E, H]).

    ``normalize``: rescale each token's k gate values to sum to 1.
    """
    probs, top_w, order, token_index, splits = _route(x, gate_weight, k, normalize)
    triton_fused = _cuda_triton(x)
    if triton_fused is not None:
        permuted = triton_fused.permute_rows_triton(x, token_index)
    else:
        permuted = _Permute.apply(x, token_index)
    weights = top_w.reshape(-1).index_select(0, order)
    return Dispatch(permuted, token_index, weights, splits, probs)


def unpermute_combine(
    expert_out: torch.Tensor, token_index: torch.Tensor, weights: torch.Tensor, num_tokens: int
) -> torch.Tensor:
    """``out[t] = sum of weights[j] * expert_out[j]`` over the rows ``j`` of token ``t``."""
    triton_fused = _cuda_triton(expert_out)
    if triton_fused is not None:
        return triton_fused.combine_rows_triton(expert_out, token_index, weights, num_tokens)
    return _Combine.apply(expert_out, token_index, weights, num_tokens)


def _cuda_triton(rows: torch.Tensor) -> Any:
    """The Triton module for CUDA rows it takes (kernels/triton_fused.py), else None (the ATen Functions)."""
    if not rows.is_cuda:
        return None
    from hetrun.kernels import triton_fused

    return triton_fused if triton_fused.moe_supports(rows) else None


def gate_topk_permute_reference(
    x: torch.Tensor, gate_weight: torch.Tensor, k: int, *, normalize: bool = True
) -> Dispatch:
    logits = x @ gate_weight.t()
    probs = torch.softmax(logits, dim=-1)
    top_w, top_e = torch.topk(probs, k, dim=-1)
    if normalize:
        top_w = top_w / top_w.sum(dim=-1, keepdim=True)
    tokens = torch.arange(x.shape[0], device=x.device).repeat_interleave(k)
    experts = top_e.reshape(-1)
    order = torch.argsort(experts, stable=True)
    splits = [int((experts == e).sum()) for e in range(gate_weight.shape[0])]
    return Dispatch(x[tokens[order]], tokens[order], top_w.reshape(-1)[order], splits, probs)


def unpermute_combine_reference(
    expert_out: torch.Tensor, token_index: torch.Tensor, weights: torch.Tensor, num_tokens: int
) -> torch.Tensor:
    out = torch.zeros(
        (num_tokens, *expert_out.shape[1:]), dtype=expert_out.dtype, device=expert_out.device
    )
    return out.index_add(0, token_index, expert_out * weights[:, None])
