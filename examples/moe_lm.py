"""Mixture-of-experts byte-level language model as a hetrun workload.

The learner component trains data- and expert-parallel at once: every rank
draws its own batches from the standard library's source (examples/moe_data.py),
holds a full copy of the attention/embedding weights (``parameters_to_sync``:
the runtime averages their gradients) and 1/P of the 16 experts of each MoE
layer, which it trains on the tokens every rank sends it (examples/moe_model.py).
The all-to-all codecs come from the job's ``comms:`` section
(``forward_codec`` for activations, ``backward_codec`` for gradients; ``none``
is exact).

The objective is the mean over learner ranks of each rank's loss. ``sync``
averages the replicated gradients; expert gradients arrive summed over the
ranks by the all-to-all backward, so ``optimize`` divides them by P.

``transport``: ``auto`` (NCCL on GPUs; on CPU mpi4py, or gloo when the node
has more ranks than cores), ``mpi`` or ``torch`` (the component's
torch.distributed group, gloo on CPU). ``fused: true`` uses
the kernels layer's weighted combine (hetrun.kernels.moe_dispatch).

``evaluate`` is the held-out loss on a fixed set of 64 windows. On the learner
it is a collective over the component (the experts are spread); on a
component without ``forward`` (an evaluator) it runs the whole model from the
weights the learner published with ``policy_state``.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch
from hetrun.examples.moe_data import ByteCorpus
from hetrun.examples.moe_lm_args import MoELMWorkloadArgs
from hetrun.examples.moe_model import MoEConfig, MoELM, expert_slice
from hetrun.runtime import mpi_wait
from hetrun.runtime.comms.alltoall import AllToAllComm
from hetrun.runtime.context import RankContext
from hetrun.runtime.eager_optim import eager
from hetrun.runtime.workload import Workload

from hetrun.errors import CheckpointError, HetrunError

_EVAL_WINDOWS = 64  # divisible by every expert-parallel degree 16 experts allow


def _codec(comms: dict[str, Any], key: str) -> str | None:
    value = comms.get(key, "none")
    if value is None or value == "none":
        return None
    if not isinstance(value, str):
        raise HetrunError(f"comms.{key}={value!r} is not a codec name", hint="e.g. none or int8")
    return value


class MoELMWorkload(Workload):
    """Byte-level MoE transformer LM; expert-parallel over the learner component."""

    def __init__(self, ctx: RankContext, **workload_args: Any) -> None:
        super().__init__(ctx, **workload_args)
        # The typed model `hetrun plan` already checked (moe_lm_args.py); the same check here.
        args = MoELMWorkloadArgs.from_args(workload_args)
        transport = args.transport
        self.cfg = MoEConfig(**args.model_args())
        self.cfg.validate()
        self.batch_size = args.batch_size
        self.lr = args.lr
        self.warmup = args.warmup
        self.device = torch.device(ctx.device)
        self.forward_codec = _codec(ctx.comms, "forward_codec")
        self.backward_codec = _codec(ctx.comms, "backward_codec")

        plan = ctx.plan
        own_actions = set(plan.component(ctx.component).actions) if plan is not None else None
        # A component that evaluates but never runs forward holds the whole model.
        self.expert_parallel = own_actions is None or "forward" in own_actions
        size = ctx.comp_size if self.expert_parallel else 1
        rank = ctx.comp_rank if self.expert_parallel else 0
        self.ep_size, self.ep_rank = size, rank
        self.expert_range = expert_slice(self.cfg.num_experts, rank, size)
        self.comm: AllToAllComm | None = None
        self.transport = "none"
        if size > 1:
            self.transport = transport if transport != "auto" else _auto_transport(ctx)
            if self.transport == "torch":
                self.comm = AllToAllComm.from_torch(ctx.group, device=self.device)
            else:
                self.comm = AllToAllComm.from_mpi(ctx.comm)

        # Same seed on every rank: replicated weights start equal, experts are slices
        # of one full draw (MoEFFN), so P ranks hold exactly the 1-rank model.
        torch.manual_seed(ctx.seed)
        self.model = MoELM(
            self.cfg, rank=rank, size=size, comm=self.comm,
            forward_codec=self.forward_codec, backward_codec=self.backward_codec,
            fused=args.fused,
        ).to(self.device)
        self.weight_decay = args.weight_decay
        # Only a component that optimizes has an optimizer, in its state too: an evaluator
        # that built one for its checkpoints paid torch._dynamo's import (about 1 CPU-s) on
        # every restart, beside the learners it waits for (benchmarks/node_death.md).
        self.optimizes = own_actions is None or "optimize" in own_actions
        self._optimizer: torch.optim.AdamW | None = None  # built on first use (learners only)
        self.corpus = ByteCorpus.from_stdlib(args.corpus_bytes, args.heldout_every)
        self.step = 0
        # Learners publish the full model only when another component consumes it.
        self._publishing = _publishing_actions(ctx) if self.expert_parallel and size > 1 else []
        self._full_state: dict[str, torch.Tensor] | None = None
        self._full_state_step = -1
        if self._publishing and ctx.comp_rank == 0:
            # The executor sends the initial weights before any optimize: rebuild the
            # whole model from the seed (the union of every rank's slices) locally.
            torch.manual_seed(ctx.seed)
            whole = MoELM(self.cfg, reference=True)
            self._full_state = {k: v.detach().clone() for k, v in whole.state_dict().items()}
            self._full_state_step = 0
        self._num_micro = 1
        self._reset_window()

    # --- data ---
    def next_batch(self, iteration: int, micro: int) -> dict[str, torch.Tensor]:
        tokens = self.corpus.sample(
            self.batch_size, self.cfg.seq_len, seed=self.ctx.seed, iteration=iteration,
            micro=micro, rank=self.ep_rank,
        )
        return {"tokens": tokens.to(self.device)}

    def batch_steps(self, batch: dict[str, torch.Tensor]) -> int:
        tokens = batch["tokens"]
        return int(tokens.shape[0] * (tokens.shape[1] - 1))

    # --- learner ---
    def forward(self, batch: dict[str, torch.Tensor], micro: int, num_micro: int) -> torch.Tensor:
        self.model.train()
        self._num_micro = max(1, num_micro)
        ce, aux = self.model(batch["tokens"])
        self._window["ce"] += float(ce.detach())
        self._window["aux"] += float(aux.detach())
        self._window["micro"] += 1
        self._window["tokens"] += self.batch_steps(batch)
        return ce + self.cfg.aux_loss_coef * aux

    def backward(self, loss: torch.Tensor) -> None:
        (loss / self._num_micro).backward()

    def parameters_to_sync(self) -> list[torch.Tensor]:
        return list(self.model.replicated_parameters())

    def optimize(self) -> dict[str, float]:
        if self.ep_size > 1:
            # The all-to-all backward summed each expert's gradient over the ranks'
            # losses; the objective is their mean, like the averaged replicated grads.
            for p in self.model.expert_parameters():
                if p.grad is not None:
                    p.grad.div_(self.ep_size)
        lr = self.lr * min(1.0, (self.step + 1) / max(1, self.warmup))
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        if self._publishing and any(a.runs_at(self.ctx.iteration) for a in self._publishing):
            self._gather_full_state()
        w = self._window
        micro = max(1, w["micro"])
        elapsed = time.perf_counter() - w["t0"]
        a2a = self.comm.stats["seconds"] - w["a2a0"] if self.comm is not None else 0.0
        metrics = {
            "loss": w["ce"] / micro,
            "aux_loss": w["aux"] / micro,
            "lr": lr,
            "tokens": w["tokens"],
            "tokens_per_s": w["tokens"] / elapsed if elapsed > 0 else 0.0,
            "a2a_seconds": a2a,
            "a2a_share": a2a / elapsed if elapsed > 0 else 0.0,
            "step": float(self.step),
        }
        self._reset_window()
        return metrics

    def _reset_window(self) -> None:
        self._window = {
            "ce": 0.0, "aux": 0.0, "micro": 0, "tokens": 0, "t0": time.perf_counter(),
            "a2a0": self.comm.stats["seconds"] if self.comm is not None else 0.0,
        }

    # --- evaluation ---
    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        self.model.eval()
        windows = self.corpus.heldout_windows(_EVAL_WINDOWS, self.cfg.seq_len)
        mine = windows[self.ep_rank :: self.ep_size].to(self.device)
        ce, _ = self.model(mine)
        loss = float(ce)
        if self.ep_size > 1:
            loss = self._allreduce_mean(loss)
        return {"eval_loss": loss, "eval_bits_per_byte": loss / math.log(2)}

    def _allreduce_mean(self, value: float) -> float:
        assert self.comm is not None
        if self.comm.backend == "mpi":
            from mpi4py import MPI

            mpi_wait.meet(self.comm.mpi_comm)
            return float(self.comm.mpi_comm.allreduce(value, op=MPI.SUM)) / self.ep_size
        import torch.distributed as dist

        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, group=self.comm.group)
        return float(t.item()) / self.ep_size

    # --- weights for other components (an evaluator) ---
    def policy_state(self) -> dict[str, torch.Tensor]:
        if self.ep_size == 1:
            return {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}
        if self._full_state is None or self._full_state_step != self.step:
            raise HetrunError(
                f"MoE LM: policy_state() asked of learner rank {self.ctx.comp_rank} at step "
                f"{self.step}, but the whole model was last gathered at step "
                f"{self._full_state_step} (only the component leader holds it, after an "
                "optimize of an iteration on which a consumer's dependency runs)",
                hint="make the consumer depend on an action of the learner component that "
                "runs after optimize (e.g. sync.policy)",
            )
        return self._full_state

    def load_policy(self, state: dict[str, torch.Tensor], version: int) -> None:
        if self.ep_size != 1:
            raise HetrunError(
                f"MoE LM: load_policy on rank {self.ctx.comp_rank} of the expert-parallel "
                f"component {self.ctx.component!r}; only a whole-model component can load it",
            )
        self.model.load_state_dict(state)
        self.step = version

    def _gather_full_state(self) -> None:
        """Every learner sends its experts to the component leader (collective on ctx.comm)."""
        import numpy as np

        local = {k: v.detach().cpu() for k, v in self.model.state_dict().items()}
        expert_ids = {id(p) for p in self.model.expert_parameters()}
        expert_keys = sorted(
            name for name, p in self.model.named_parameters() if id(p) in expert_ids
        )
        # Equal slices on every rank: one flat buffer each, one Gather, no pickling.
        flat = torch.cat([local[k].reshape(-1) for k in expert_keys]).numpy()
        root = self.ctx.comp_rank == 0
        recv = np.empty((self.ep_size, flat.size), dtype=flat.dtype) if root else None
        # Not a blocking Gather: the leader would busy-poll a core while the other
        # learners are still restoring (on 2 shared cores it burnt ~2.6 CPU-s of a restart).
        mpi_wait.wait_politely(self.ctx.comm.Igather(flat, recv, root=0))
        if not root:
            return
        assert recv is not None
        full = {k: v.clone() for k, v in local.items()}
        offset = 0
        for key in expert_keys:
            shape = local[key].shape  # [E/P, ...]
            n = local[key].numel()
            parts = torch.from_numpy(recv[:, offset : offset + n].copy())
            full[key] = parts.reshape(self.ep_size * shape[0], *shape[1:])
            offset += n
        self._full_state = full
        self._full_state_step = self.step

    @property
    def optimizer(self) -> torch.optim.AdamW:
        # Lazy (evaluator ranks never optimize), and eager(): torch's own optimizer imports
        # torch._dynamo on first use (~1.3 s of CPU per learner, on every restart, four
        # learners on two cores here; runtime/eager_optim.py).
        if self._optimizer is None:
            self._optimizer = eager(torch.optim.AdamW)(
                self.model.parameters(), lr=self.lr, betas=(0.9, 0.95),
                weight_decay=self.weight_decay,
            )
        return self._optimizer

    # --- checkpoints ---
    def state_dict(self) -> dict[str, Any]:
        # The live tensors (on a GPU, host copies), not clones: every reader copies before training
        # goes on and a restore decodes into them in place (examples/ppo.py state_dict says why).
        state: dict[str, Any] = {
            "model": {k: v.detach().cpu() for k, v in self.model.state_dict().items()},
            "step": self.step,
            "expert_range": list(self.expert_range),
            "config": self.cfg.to_dict(),
        }
        if not self.optimizes:
            return state
        opt = self.optimizer.state_dict()
        state["optimizer"] = {
            "state": {
                str(i): {k: (v.detach().cpu() if torch.is_tensor(v) else v) for k, v in s.items()}
                for i, s in opt["state"].items()
            },
            "param_groups": [
                {k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()}
                for g in opt["param_groups"]
            ],
        }
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if list(state.get("expert_range", [])) != list(self.expert_range):
            raise CheckpointError(
                f"MoE LM: checkpoint holds experts {state.get('expert_range')} but rank "
                f"{self.ctx.comp_rank} owns experts {list(self.expert_range)}",
                hint="resume with the same number of learner ranks as the checkpointed run",
            )
        if state.get("config") != self.cfg.to_dict():
            raise CheckpointError(
                f"MoE LM: checkpoint model config {state.get('config')} differs from "
                f"workload_args {self.cfg.to_dict()}",
                hint="resume with the workload_args of the checkpointed run",
            )
        self.model.load_state_dict(state["model"])
        self.step = int(state["step"])
        if not self.optimizes:
            # An evaluator's checkpoint from before it stopped saving one holds an unused optimizer: ignored.
            return
        if "optimizer" not in state:
            raise CheckpointError(
                f"MoE LM: rank {self.ctx.comp_rank} of {self.ctx.component!r} optimizes but its "
                "checkpoint holds no optimizer state",
                hint="resume from a checkpoint written by this component (its learners save their optimizer)",
            )
        opt = state["optimizer"]
        self.optimizer.load_state_dict(
            {
                # Copies: torch's optimizer keeps the tensors it is given (examples/ppo.py says why).
                "state": {int(i): {k: (v.clone() if torch.is_tensor(v) else v) for k, v in s.items()}
                          for i, s in opt["state"].items()},
                "param_groups": [
                    {k: (tuple(v) if k == "betas" else v) for k, v in g.items()}
                    for g in opt["param_groups"]
                ],
            }
        )
        if self._publishing:
            self._gather_full_state()  # restore runs on every rank: a collective is safe


def _auto_transport(ctx: RankContext) -> str:
    """torch.distributed on GPUs (NCCL); on CPU, MPI unless the node is oversubscribed.

    MPI waits by polling and moves bytes only while a rank polls; with more
    ranks than cores on a node that costs more than it saves: on 2 shared
    cores the MoE step ran 2.2x (2 ranks) and 1.3x (4 ranks) faster over gloo's
    blocking sockets (medians of 3 interleaved rounds, benchmarks/moe.md).
    With a core per rank, as Slurm gives, the exchange is MPI's Alltoallv.
    """
    if ctx.group is None:
        return "mpi"
    if str(ctx.device).startswith("cuda"):
        return "torch"
    import os

    node_ranks = ctx.node_comm.Get_size() if ctx.node_comm is not None else ctx.comp_size
    return "torch" if node_ranks > len(os.sched_getaffinity(0)) else "mpi"


def _publishing_actions(ctx: RankContext) -> list[Any]:
    """This component's actions that another component depends on (e.g. sync.policy)."""
    plan = ctx.plan
    if plan is None:
        return []
    mine = {a.id: a for a in plan.actions if a.component == ctx.component}
    wanted = {
        dep.id for a in plan.actions if a.component != ctx.component for dep in a.deps
    }
    return [mine[i] for i in sorted(wanted & set(mine))]
