"""The two example workloads, unchanged, with a pause after each update.

Only for the preemption tests: a shrunk example finishes an iteration in tens
of milliseconds, faster than a test (or Slurm) can aim a signal at it. The
pause sits after ``optimize`` on the learner, so the rollout ranks still run
ahead of it as far as the plan allows. Copied into the job directory, like
test_resume_workload.py.
"""

from __future__ import annotations

import time
from typing import Any

from hetrun.examples.moe_lm import MoELMWorkload
from hetrun.examples.ppo import PPOWorkload


class SlowPPO(PPOWorkload):
    def __init__(self, ctx: Any, pause: float = 0.0, **workload_args: Any) -> None:
        super().__init__(ctx, **workload_args)
        self.pause = pause

    def optimize(self) -> dict[str, float]:
        metrics = super().optimize()
        time.sleep(self.pause)
        return metrics


class SlowMoE(MoELMWorkload):
    def __init__(self, ctx: Any, pause: float = 0.0, **workload_args: Any) -> None:
        super().__init__(ctx, **workload_args)
        self.pause = pause

    def optimize(self) -> dict[str, float]:
        metrics = super().optimize()
        time.sleep(self.pause)
        return metrics
