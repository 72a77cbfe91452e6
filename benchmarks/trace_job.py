"""A trace job of benchmarks/pool_trace_replay.py that checkpoints through hetrun's run API.

``STEPS`` steps of ``--step-s`` seconds each (the sleep jobs' work, cut into steps); a
checkpoint every ``--every`` steps through ``run.save``; on a stop signal (Slurm's
preemption sends SIGTERM, then the QOS GraceTime / KillWait before SIGKILL) it stops at
the agreed step (``run.should_stop``), saves that step and exits for the requeue
(``run.exit_for_requeue``: 143 after SIGTERM, Slurm requeues it). A requeued run resumes
from the newest checkpoint (``run.restore``), so only the steps after it are redone.
Everything it does is in the run directory's events.jsonl (``start``, ``restore``,
``checkpoint`` with its time, ``exit``): the replay reads the work each cut run lost there.

    HETRUN_RUN_DIR=/var/tmp/... python3 benchmarks/trace_job.py STEPS [--every 10] [--step-s 1]
"""

from __future__ import annotations

import argparse
import time

import torch

import hetrun


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("steps", type=int)
    ap.add_argument("--every", type=int, default=10, help="checkpoint every N steps")
    ap.add_argument("--step-s", type=float, default=1.0, help="seconds of work per step")
    args = ap.parse_args()
    run = hetrun.attach(checkpoint_every=args.every)
    done = torch.zeros(1, dtype=torch.int64)  # the job's state: steps done
    state = {"done": done}
    start = run.restore(state)
    for step in range(start, args.steps):
        time.sleep(args.step_s)  # one step of work (a signal handler returns into it)
        done += 1
        run.log(step)
        if run.should_stop(step):
            run.save(step, state, wait=True)  # the agreed step, durable before the exit
            run.exit_for_requeue()
        if run.checkpoint_due(step):
            run.save(step, state)
    run.close()


if __name__ == "__main__":
    main()
