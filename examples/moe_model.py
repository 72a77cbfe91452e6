"""A byte-level decoder-only transformer whose FFNs are mixtures of experts.

Routing is two-level: a cheap hash of (byte, position) picks one of
``num_groups`` expert groups, then a learned gate picks the top-2 experts
inside that group. Groups are interleaved across ranks (expert ``e`` is in
group ``e % num_groups``; rank ``r`` owns the contiguous experts
``[r * E/P, (r + 1) * E/P)``), so the hash spreads load over groups and the
gate's choice within a group decides which rank a token visits.

Expert parallelism: each rank of the learner component holds only its slice
of the experts. A MoE layer sends every (token, expert) assignment to the
expert's rank with one all-to-all (dispatch), runs its experts on what it
received, and sends the results back with a second all-to-all (combine).
``MoEFFN(reference=True)`` holds every expert and computes the same function
densely on one rank, with no exchange: the yardstick the tests hold the
expert-parallel path to.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from hetrun.runtime.comms.alltoall import AllToAllComm, all_to_all, exact_all_to_all
from torch import nn

from hetrun.errors import HetrunError

VOCAB = 256  # bytes


@dataclass(frozen=True)
class MoEConfig:
    d_model: int = 64
    n_heads: int = 4
    n_layers: int = 2
    seq_len: int = 64
    num_experts: int = 16
    num_groups: int = 4
    top_k: int = 2
    expert_hidden: int = 128
    aux_loss_coef: float = 0.01

    def validate(self) -> None:
        def bad(key: str, value: object, fix: str) -> HetrunError:
            return HetrunError(f"MoE LM: workload_args.{key}={value!r} is invalid", hint=fix)

        for key in ("d_model", "n_heads", "n_layers", "seq_len", "num_experts", "expert_hidden"):
            value = getattr(self, key)
            if not isinstance(value, int) or value < 1:
                raise bad(key, value, "use a positive integer")
        if self.d_model % self.n_heads:
            raise bad("n_heads", self.n_heads, f"use a divisor of d_model={self.d_model}")
        if self.num_groups < 1 or self.num_experts % self.num_groups:
            raise bad(
                "num_groups", self.num_groups, f"use a divisor of num_experts={self.num_experts}"
            )
        per_group = self.num_experts // self.num_groups
        if not 1 <= self.top_k <= per_group:
            raise bad("top_k", self.top_k, f"use 1..{per_group} (experts per group)")
        if self.aux_loss_coef < 0:
            raise bad("aux_loss_coef", self.aux_loss_coef, "use a non-negative number")

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def expert_slice(num_experts: int, rank: int, size: int) -> tuple[int, int]:
    """The experts ``[lo, hi)`` rank ``rank`` of ``size`` owns."""
    if num_experts % size:
        raise HetrunError(
            f"MoE LM: {num_experts} experts cannot be split evenly over {size} learner ranks",
            hint="run the learner component with a number of ranks that divides num_experts "
            "(1, 2, 4, 8 or 16 for 16 experts)",
        )
    per_rank = num_experts // size
    return rank * per_rank, (rank + 1) * per_rank


def hash_groups(tokens: torch.Tensor, num_groups: int) -> torch.Tensor:
    """The expert group of each token, from its byte and position: ``[B, S]`` -> ``[B, S]``."""
    pos = torch.arange(tokens.shape[-1], device=tokens.device).expand_as(tokens)
    # A multiplicative hash (Knuth's constants) mixed with a shift; 32-bit wrap-around.
    h = (tokens * 0x9E3779B1 + pos * 0x85EBCA77) & 0xFFFFFFFF
    h = h ^ (h >> 15)
    return h % num_groups


@dataclass
class Routing:
    """What the gate decided for ``N`` tokens."""

    experts: torch.Tensor  # [N, k] int64, global expert ids
    weights: torch.Tensor  # [N, k] combine weights (sum to 1 per token)
    probs: torch.Tensor  # [N, E] gate probabilities (zero outside the token's group)


class MoEFFN(nn.Module):
    """A mixture-of-experts FFN; expert-parallel over ``comm`` unless ``reference``."""

    def __init__(
        self,
        cfg: MoEConfig,
        *,
        rank: int = 0,
        size: int = 1,
        comm: AllToAllComm | None = None,
        reference: bool = False,
        forward_codec: str | None = None,
        backward_codec: str | None = None,
        layer: int = 0,
        fused: bool = False,
    ) -> None:
        super().__init__()
        self.cfg = cfg
        self.layer = layer
        self.fused = fused
        self.reference = reference
        self.comm = comm
        self.size = 1 if reference else size
        self.lo, self.hi = (0, cfg.num_experts) if reference else expert_slice(
            cfg.num_experts, rank, size
        )
        if not reference and size > 1 and (comm is None or comm.size != size):
            raise HetrunError(
                f"MoE LM: expert parallelism over {size} ranks needs an AllToAllComm of that size",
                hint="build the workload from a RankContext whose component communicator is set",
            )
        self.forward_codec = forward_codec
        self.backward_codec = backward_codec
        d, h, e = cfg.d_model, cfg.expert_hidden, cfg.num_experts
        self.gate = nn.Linear(d, e, bias=False)
        # Every rank draws all experts' initial weights, then keeps its slice: the
        # random stream (and so every other parameter) is the same whatever the slice.
        w1 = torch.empty(e, d, h)
        w2 = torch.empty(e, h, d)
        for i in range(e):
            nn.init.kaiming_uniform_(w1[i].T, a=math.sqrt(5))
            nn.init.kaiming_uniform_(w2[i].T, a=math.sqrt(5))
        self.w1 = nn.Parameter(w1[self.lo : self.hi].clone())
        self.b1 = nn.Parameter(torch.zeros(self.hi - self.lo, h))
        self.w2 = nn.Parameter(w2[self.lo : self.hi].clone() / math.sqrt(2 * cfg.n_layers))
        self.b2 = nn.Parameter(torch.zeros(self.hi - self.lo, d))

    def expert_parameters(self) -> list[nn.Parameter]:
        return [self.w1, self.b1, self.w2, self.b2]

    def route(self, x: torch.Tensor, groups: torch.Tensor) -> Routing:
        """Top-k within the hashed group. ``x`` ``[N, d]``, ``groups`` ``[N]``."""
        cfg = self.cfg
        logits = self.gate(x)  # [N, E]
        expert_group = torch.arange(cfg.num_experts, device=x.device) % cfg.num_groups
        in_group = expert_group[None, :] == groups[:, None]  # [N, E]
        probs = torch.softmax(logits.masked_fill(~in_group, float("-inf")), dim=-1)
        top_p, top_e = probs.topk(cfg.top_k, dim=-1)
        weights = top_p / top_p.sum(dim=-1, keepdim=True)
        return Routing(top_e, weights, probs)

    def aux_loss(self, routing: Routing) -> torch.Tensor:
        """Switch-style load balance: ``E * sum_e f_e * P_e`` (1.0 when perfectly balanced)."""
        e = self.cfg.num_experts
        counts = torch.bincount(routing.experts.reshape(-1), minlength=e).to(routing.probs.dtype)
        fraction = counts / counts.sum().clamp_min(1.0)
        return e * (fraction * routing.probs.mean(dim=0)).sum()

    def _experts(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """Run local expert ``j`` on the next ``counts[j]`` rows of ``x`` (rows sorted by expert)."""
        outs = []
        for j, rows in enumerate(x.split(counts, dim=0)):
            hidden = F.gelu(torch.addmm(self.b1[j], rows, self.w1[j]))
            outs.append(torch.addmm(self.b2[j], hidden, self.w2[j]))
        return torch.cat(outs, dim=0) if outs else x[:0]

    def forward(self, x: torch.Tensor, groups: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``x`` ``[N, d]``, ``groups`` ``[N]`` -> (``y`` ``[N, d]``, aux loss scalar)."""
        routing = self.route(x, groups)
        aux = self.aux_loss(routing)
        if self.reference:
            return self._dense(x, routing), aux
        return self._expert_parallel(x, routing), aux

    def _dense(self, x: torch.Tensor, routing: Routing) -> torch.Tensor:
        # Every expert on every token, then pick: slow, obviously right.
        hidden = F.gelu(torch.einsum("nd,edh->enh", x, self.w1) + self.b1[:, None, :])
        y_all = torch.einsum("enh,ehd->end", hidden, self.w2) + self.b2[:, None, :]  # [E, N, d]
        tokens = torch.arange(x.shape[0], device=x.device)
        y = torch.zeros_like(x)
        for k in range(self.cfg.top_k):
            y = y + routing.weights[:, k, None] * y_all[routing.experts[:, k], tokens]
        return y

    def _expert_parallel(self, x: torch.Tensor, routing: Routing) -> torch.Tensor:
        cfg = self.cfg
        k = routing.experts.shape[1]
        per_rank = cfg.num_experts // self.size
        flat_expert = routing.experts.reshape(-1)  # [N*k], assignment a = token a//k, slot a%k
        # Sorting assignments by expert also sorts them by destination rank.
        order = torch.argsort(flat_expert, stable=True)
        sorted_expert = flat_expert[order]
        counts_e = torch.bincount(sorted_expert, minlength=cfg.num_experts)  # [E]
        send_rows = x[order // k]  # [N*k, d]
        if self.size == 1:
            recv_rows = send_rows
            local_counts = counts_e.tolist()
        else:
            assert self.comm is not None
            # Peers need per-expert counts to group what they receive by expert.
            counts_by_rank = counts_e.reshape(self.size, per_rank)
            recv_counts = exact_all_to_all(counts_by_rank, [1] * self.size, [1] * self.size,
                                           self.comm)  # [P, E/P]: row p = from rank p
            send_splits = counts_by_rank.sum(dim=1).tolist()
            recv_splits = recv_counts.sum(dim=1).tolist()
            recv_rows = all_to_all(
                send_rows, send_splits, recv_splits, self.comm,
                codec=self.forward_codec, direction="forward",
                backward_codec=self.backward_codec, stream=f"moe{self.layer}.dispatch",
            )
            # Received rows are grouped by source, then expert; regroup by expert.
            local_expert = torch.repeat_interleave(
                torch.arange(per_rank, device=x.device).repeat(self.size), recv_counts.reshape(-1)
            )
            regroup = torch.argsort(local_expert, stable=True)
            local_counts = recv_counts.sum(dim=0).tolist()
            recv_rows = recv_rows[regroup]
        y_rows = self._experts(recv_rows, local_counts)
        if self.size > 1:
            assert self.comm is not None
            y_rows = torch.empty_like(y_rows).index_copy(0, regroup, y_rows)
            y_rows = all_to_all(
                y_rows, recv_splits, send_splits, self.comm,
                codec=self.forward_codec, direction="forward",
                backward_codec=self.backward_codec, stream=f"moe{self.layer}.combine",
            )
        # y_rows[i] is the output for assignment order[i]; weight it and sum per token.
        w = routing.weights.reshape(-1)[order]
        if self.fused:
            from hetrun.kernels.moe_dispatch import unpermute_combine

            return unpermute_combine(y_rows, order // k, w, x.shape[0])
        return torch.zeros_like(x).index_add(0, order // k, y_rows * w[:, None])


def _ln_linear(x: torch.Tensor, ln: nn.LayerNorm, lin: nn.Linear, fused: bool) -> torch.Tensor:
    """``lin(ln(x))``; with ``fused`` one kernel call (LayerNorm folded into the GEMM)."""
    if not fused:
        return lin(ln(x))
    from hetrun.kernels.fused_ln_linear import ln_linear_gelu

    return ln_linear_gelu(x, ln.weight, ln.bias, lin.weight, lin.bias, eps=ln.eps, gelu=False)


class Block(nn.Module):
    def __init__(self, cfg: MoEConfig, moe: MoEFFN) -> None:
        super().__init__()
        self.fused = moe.fused
        self.n_heads = cfg.n_heads
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.moe = moe

    def forward(self, x: torch.Tensor, groups: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, s, d = x.shape
        qkv = _ln_linear(x, self.ln1, self.qkv, self.fused)
        q, k, v = qkv.view(b, s, 3, self.n_heads, d // self.n_heads).unbind(2)
        att = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )  # [B, H, S, d/H]
        x = x + self.proj(att.transpose(1, 2).reshape(b, s, d))
        y, aux = self.moe(self.ln2(x).reshape(b * s, d), groups.reshape(-1))
        return x + y.view(b, s, d), aux


class MoELM(nn.Module):
    """Byte-level decoder-only LM; ``forward`` returns (cross-entropy, aux loss)."""

    def __init__(
        self,
        cfg: MoEConfig,
        *,
        rank: int = 0,
        size: int = 1,
        comm: AllToAllComm | None = None,
        reference: bool = False,
        forward_codec: str | None = None,
        backward_codec: str | None = None,
        fused: bool = False,
    ) -> None:
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.fused = fused
        self.embed = nn.Embedding(VOCAB, cfg.d_model)
        self.pos = nn.Parameter(torch.randn(cfg.seq_len, cfg.d_model) * 0.02)
        self.blocks = nn.ModuleList(
            Block(
                cfg,
                MoEFFN(
                    cfg, rank=rank, size=size, comm=comm, reference=reference,
                    forward_codec=forward_codec, backward_codec=backward_codec, layer=i,
                    fused=fused,
                ),
            )
            for i in range(cfg.n_layers)
        )
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, VOCAB, bias=False)

    def moe_layers(self) -> list[MoEFFN]:
        return [m for m in self.modules() if isinstance(m, MoEFFN)]

    def expert_parameters(self) -> list[nn.Parameter]:
        return [p for layer in self.moe_layers() for p in layer.expert_parameters()]

    def replicated_parameters(self) -> list[nn.Parameter]:
        expert_ids = {id(p) for p in self.expert_parameters()}
        return [p for p in self.parameters() if id(p) not in expert_ids]

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``tokens`` int64 ``[B, S + 1]`` -> (mean next-byte cross-entropy, mean aux loss)."""
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        if inputs.shape[1] > self.cfg.seq_len:
            raise HetrunError(
                f"MoE LM: batch has sequences of {inputs.shape[1]} bytes, more than "
                f"seq_len={self.cfg.seq_len}",
                hint="draw batches with the workload's own seq_len",
            )
        groups = hash_groups(inputs, self.cfg.num_groups)
        x = self.embed(inputs) + self.pos[: inputs.shape[1]]
        aux_total = x.new_zeros(())
        for block in self.blocks:
            x, aux = block(x, groups)
            aux_total = aux_total + aux
        logits = _ln_linear(x, self.ln_f, self.head, self.fused)
        ce = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
        return ce, aux_total / len(self.blocks)
