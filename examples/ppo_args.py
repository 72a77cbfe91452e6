"""``workload_args`` of ``hetrun.examples.ppo:PPOWorkload``, as a typed model.

Kept out of ``ppo.py`` (which imports torch and gymnasium) so ``hetrun plan``
and ``hetrun submit --dry-run`` check a job's arguments in milliseconds, by the
naming rule of ``hetrun.dag.workload_args``. The workload builds itself from
this same model, so both checks are one.
"""

from __future__ import annotations

from typing import Any, Literal

from hetrun.dag.spec_errors import SpecIssue
from pydantic import BaseModel, ConfigDict, Field, model_validator

# The learner's precision (examples/learner_precision.py applies it; here, torch-free, for `hetrun plan`).
Precision = Literal["32", "bf16-mixed", "auto"]


class PPOWorkloadArgs(BaseModel):
    """Defaults solve CartPole-v1 in ~50k env steps."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    env_id: str = Field("CartPole-v1", min_length=1, description="gymnasium environment id")
    num_envs: int = Field(8, gt=0, description="environments per rollout rank")
    num_steps: int = Field(128, gt=0, description="steps per env per rollout; batch = num_envs * num_steps")
    hidden: int = Field(64, gt=0)
    learning_rate: float = Field(2.5e-3, gt=0)
    gamma: float = Field(0.99, ge=0, le=1)
    gae_lambda: float = Field(0.95, ge=0, le=1)
    clip_coef: float = Field(0.2, ge=0)
    ent_coef: float = Field(0.0, ge=0)
    vf_coef: float = Field(0.5, ge=0)
    max_grad_norm: float = Field(0.5, gt=0)
    update_epochs: int = Field(4, gt=0)
    num_minibatches: int = Field(4, gt=0)
    norm_adv: bool = True
    eval_episodes: int = Field(20, gt=0)
    # Sampled actions by default: a greedy CartPole policy can score 500 after a single update,
    # so "solved" on greedy episodes says little about what PPO learned.
    eval_deterministic: bool = False
    # On a rank that also rolls out: each evaluation runs a slice at a time inside the rollouts
    # before the next, in the rollout rank's slack, reported at the next evaluation with the
    # version it evaluated (examples/ppo_spread_eval.py). Off: every evaluation at once.
    eval_spread: bool = False
    torch_threads: int = Field(1, gt=0)
    # The learner's update may use more cores than a rollout's small policy batches can: in a
    # pipelined job on one node the learner's peers (rollout ranks) leave their cores idle
    # while they wait for weights. "auto": before every minibatch step, the CPUs this process
    # may run on (its affinity mask: what Slurm's cgroup or binding gives it; the local
    # launcher runs ranks unbound) less one per rollout rank on its node stepping its games
    # right now, shared by the node's learners (examples/cpu_share.py). The thread count then
    # depends on timing, and torch's CPU kernels round differently per thread count: "auto"
    # gives up bit-identical runs and exact resume (a fixed number keeps them).
    learner_threads: int | Literal["auto"] | None = Field(
        None, description="torch threads of learner ranks (None: torch_threads; auto: the node's CPUs "
        "its rollout ranks leave idle at each minibatch step; not bit-reproducible)")

    staleness_correction: Literal["decoupled", "none"] = Field(
        "decoupled", description="samples collected by older weights than the learner's (a pipelined run): "
        "decoupled clips the ratio around the learner's policy at the start of the update and weights it "
        "by pi_prox/pi_behaviour (one extra forward pass over those samples); none: plain PPO, clipped "
        "around the behaviour policy")

    precision: Precision = Field(
        "32", description="the learner's forward and backward passes: 32 (fp32), bf16-mixed (torch.autocast "
        "in bfloat16, fp32 weights and optimizer), or auto: bf16-mixed on a CPU with native bf16 "
        "(AVX512-BF16/AMX) or a GPU, else 32 (examples/learner_precision.py)")

    @model_validator(mode="after")
    def _minibatches_fit(self) -> PPOWorkloadArgs:
        batch = self.num_envs * self.num_steps
        if self.num_minibatches > batch:
            raise SpecIssue(f"num_minibatches {self.num_minibatches} exceeds the batch of "
                            f"num_envs*num_steps = {batch}",
                            path=("num_minibatches",),
                            hint="lower num_minibatches or raise num_envs / num_steps")
        return self

    @model_validator(mode="after")
    def _learner_threads_positive(self) -> PPOWorkloadArgs:
        if isinstance(self.learner_threads, int) and self.learner_threads < 1:
            raise SpecIssue(f"learner_threads {self.learner_threads} is below 1", path=("learner_threads",),
                            hint="use a positive number of threads, auto, or leave it out")
        return self

    def threads_for_learner(self) -> int:
        """torch threads a learner rank runs its update with, where no rank shares its node
        (auto: every CPU it may run on; with rollout ranks beside it, PPOWorkload asks its node)."""
        if self.learner_threads is None:
            return self.torch_threads
        if self.learner_threads == "auto":
            from .cpu_share import node_cpus

            return node_cpus()
        return self.learner_threads

    @classmethod
    def from_args(cls, args: dict[str, Any]) -> PPOWorkloadArgs:
        """Validate ``workload_args`` (SpecError naming the key) the way ``hetrun plan`` does."""
        from hetrun.dag.workload_args import validate_args

        return validate_args(cls, args)
