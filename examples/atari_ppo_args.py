"""``workload_args`` of ``hetrun.examples.atari_ppo:AtariPPOWorkload``, as a typed model.

Light (no torch, no ale-py) so ``hetrun plan`` checks an Atari job's arguments
without importing the workload (hetrun.dag.workload_args naming rule). The
PPO keys are PPOWorkloadArgs'; the defaults are CleanRL's ppo_atari's.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from .ppo_args import PPOWorkloadArgs, Precision


class AtariPPOWorkloadArgs(PPOWorkloadArgs):
    env_id: str = Field("ALE/Breakout-v5", min_length=1, description="ale-py environment id")
    learning_rate: float = Field(2.5e-4, gt=0)
    clip_coef: float = Field(0.1, ge=0)
    ent_coef: float = Field(0.01, ge=0)
    hidden: int = Field(256, gt=0, description="width of the encoder's output layer")
    impala_width: int = Field(16, gt=0, description="channels of the 3 conv stages: w, 2w, 2w")
    repeat_action_probability: float = Field(0.0, ge=0, le=1, description="sticky actions (v5: 0.25)")
    frame_size: int = Field(84, ge=8, description="grey frames are frame_size x frame_size")
    frame_stack: int = Field(4, gt=0)
    noop_max: int = Field(30, ge=0, description="random no-ops after a reset")
    eval_episodes: int = Field(8, gt=0, description="games per evaluation")
    eval_max_steps: int = Field(27_000, gt=0,
                                description="agent steps per evaluation game (108k frames, ALE's cap)")
    gae_values: Literal["rollout", "learner"] = Field(
        "rollout", description="values GAE uses: the behaviour policy's, computed by the rollout ranks in "
        "the encoder pass that picks the actions (as CleanRL and SB3 do), or the learner's current "
        "critic in an extra pass over the whole batch (staleness-free targets, ~20% more learner work)")

    # Default auto here (not in the classic-control example): the update's parts make it
    # bit-reproducible (update_parts), so using the cores the rollout leaves idle costs nothing.
    learner_threads: int | Literal["auto"] | None = Field(
        "auto", description="torch threads of learner ranks (None: torch_threads; auto: update_parts run "
        "at once on the node's CPUs its rollout ranks leave idle at each minibatch step, one torch thread "
        "each; bit-reproducible)")
    update_parts: int = Field(
        2, ge=1, description="each minibatch step's gradient is the sum, in a fixed order, of this many equal "
        "parts of the minibatch, one torch thread each; with learner_threads auto the parts run at once on "
        "the cores the rollout ranks leave idle right now (sequentially otherwise): the same numbers either "
        "way, so auto is bit-reproducible")

    # Default auto here: the IMPALA CNN's convolutions take half the time in bf16 where the CPU
    # computes it natively (examples/learner_precision.py, benchmarks/atari.md).
    precision: Precision = Field(
        "auto", description="the learner's passes: 32, bf16-mixed, or auto (bf16-mixed on a CPU with native "
        "bf16 or a GPU, else 32)")

    @model_validator(mode="after")
    def _parts_fit(self) -> AtariPPOWorkloadArgs:
        from hetrun.dag.spec_errors import SpecIssue

        minibatch = self.num_envs * self.num_steps // self.num_minibatches
        if self.update_parts > minibatch:
            raise SpecIssue(f"update_parts {self.update_parts} is more than a minibatch's {minibatch} samples",
                            path=("update_parts",),
                            hint=f"use at most {minibatch} (num_envs x num_steps / num_minibatches)")
        return self

    @model_validator(mode="after")
    def _atari_id(self) -> AtariPPOWorkloadArgs:
        from hetrun.dag.spec_errors import SpecIssue

        if not self.env_id.startswith("ALE/"):
            raise SpecIssue(f"{self.env_id!r} is not an ale-py id", path=("env_id",),
                            hint="use ALE/<Game>-v5 (e.g. ALE/Breakout-v5); classic control runs "
                                 "with hetrun.examples.ppo:PPOWorkload")
        return self
