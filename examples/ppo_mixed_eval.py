"""Evaluate each checkpoint of a hetrun action learner as it lands: the command component
of a mixed job (examples/ppo_cartpole_mixed.yaml: PPO's learner and rollout workers run
actions, this evaluator runs as ``python3 -m hetrun.examples.ppo_mixed_eval`` on its own node).

The learner's checkpoint holds its workload's ``state_dict()``; the evaluator builds the same
workload from plan.json's ``workload_args`` and loads each checkpoint into it whole, then
runs the workload's own ``evaluate()`` (greedy or sampled episodes, seeded by the policy
version). Each evaluation is a ``step`` event at the learner's iteration, with the
returns as metrics, for ``hetrun status`` / ``hetrun report``.
"""

from __future__ import annotations

import argparse

import torch
from hetrun.runtime.context import RankContext
from hetrun.runtime.dispatch import checkpoint_boundary
from hetrun.runtime.plan_view import PlanView, load_plan

import hetrun

from .ppo import PPOWorkload


def last_checkpoint_step(plan: PlanView) -> int:
    """The learner's last checkpointed iteration: the newest checkpoint boundary of the run
    (a boundary b holds the state after iteration b - 1; the executor saves it at the end too)."""
    return max((b - 1 for b in range(1, plan.iterations + 1) if checkpoint_boundary(plan, b)), default=-1)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trainer", default="learner", help="the action component whose checkpoints to evaluate")
    p.add_argument("--idle-timeout", type=float, default=600.0,
                   help="give up after this many seconds without a new checkpoint")
    args = p.parse_args(argv)
    run = hetrun.attach()
    plan = load_plan(run.run_dir, validate=False)
    # A workload of this component's own: its evaluate() never touches the learner's streams.
    ctx = RankContext(rank=0, world_size=1, component=run.component, comp_rank=0, comp_size=1, group=None,
                      comm=None, device="cpu", seed=plan.seed, run_dir=run.run_dir, plan=plan, mode="inprocess")
    workload = PPOWorkload(ctx, **plan.workload_args)
    # The evaluator's own checkpoint: the last step it evaluated, so a requeued job goes on after it.
    evaluated = torch.tensor(-1)
    after = int(evaluated) if run.restore({"evaluated": evaluated}) else None
    stop = Stop(run, after)
    for step in run.checkpoints(args.trainer).follow_loaded(
            workload, last_step=last_checkpoint_step(plan), idle_timeout=args.idle_timeout, after=after, stop=stop):
        metrics = workload.evaluate()
        run.log(step, **metrics)
        print(f"evaluated {args.trainer} step {step} (policy version {workload.version}): "
              f"return {metrics['eval_return_mean']:.1f}", flush=True)
        evaluated.fill_(step)
        run.save(step, {"evaluated": evaluated})
        stop.step = step
    if stop.stopped:
        run.exit_for_requeue()  # the checkpoints that landed before the stop are evaluated
    run.close()


class Stop:
    """``follow``'s stop test: the agreed stop (the job's USR1/SIGTERM), checked while no new
    checkpoint is there. One evaluator rank: ``should_stop`` is then a local test, not a
    collective, so calling it at idle moments is safe."""

    def __init__(self, run: hetrun.Run, step: int | None) -> None:
        self.run, self.step, self.stopped = run, -1 if step is None else step, False

    def __call__(self) -> bool:
        self.stopped = self.run.should_stop(self.step)
        return self.stopped

if __name__ == "__main__":
    main()
