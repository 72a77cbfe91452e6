"""``workload_args`` of ``hetrun.examples.moe_lm:MoELMWorkload``, as a typed model.

Kept out of ``moe_lm.py`` (torch) so ``hetrun plan`` checks a job's arguments
without importing torch (``hetrun.dag.workload_args``' naming rule). Model-shape
keys default to ``None`` = ``MoEConfig``'s own default (examples/moe_model.py owns
those numbers); how they must divide each other is checked by
``MoEConfig.validate`` when the ranks start.
"""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

# Keys that shape the model (MoEConfig's fields); the rest configure training.
MODEL_KEYS = ("d_model", "n_heads", "n_layers", "seq_len", "num_experts", "num_groups", "top_k",
              "expert_hidden", "aux_loss_coef")


class MoELMWorkloadArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    batch_size: int = Field(16, ge=1, description="sequences per micro-batch per rank")
    lr: float = Field(3e-3, gt=0)
    warmup: int = Field(10, ge=0, description="linear warm-up steps")
    weight_decay: float = Field(0.01, ge=0)
    corpus_bytes: int = Field(4_000_000, ge=1)
    heldout_every: int = Field(20, ge=2, description="every N-th window is held out for eval")
    transport: Literal["auto", "mpi", "torch"] = Field(
        "auto", description="auto: torch.distributed on GPUs and on oversubscribed CPU nodes, else "
                            "mpi4py Alltoallv; torch: the component's torch.distributed group")
    fused: bool = Field(False, description="the kernels layer's weighted combine")
    d_model: Optional[int] = Field(None, ge=1)
    n_heads: Optional[int] = Field(None, ge=1)
    n_layers: Optional[int] = Field(None, ge=1)
    seq_len: Optional[int] = Field(None, ge=1)
    num_experts: Optional[int] = Field(None, ge=1)
    num_groups: Optional[int] = Field(None, ge=1)
    top_k: Optional[int] = Field(None, ge=1)
    expert_hidden: Optional[int] = Field(None, ge=1)
    aux_loss_coef: Optional[float] = Field(None, ge=0)

    def model_args(self) -> dict[str, Any]:
        """The MoEConfig keys the job set (the others keep MoEConfig's defaults)."""
        return {k: getattr(self, k) for k in MODEL_KEYS if getattr(self, k) is not None}

    @classmethod
    def from_args(cls, args: dict[str, Any]) -> MoELMWorkloadArgs:
        """Validate ``workload_args`` (SpecError naming the key) the way ``hetrun plan`` does."""
        from hetrun.dag.workload_args import validate_args

        return validate_args(cls, args)
