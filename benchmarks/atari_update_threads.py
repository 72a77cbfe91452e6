"""One Atari PPO update (examples/atari_ppo.py, the example's network) timed at given torch thread counts,
in this process: what ``learner_threads`` buys, and what it costs on a host with other work.

Run it twice to see OpenMP's wait policy (it is read when torch loads, so per process):

    python3 benchmarks/atari_update_threads.py --steps 32 --threads 1 2 1 2
    OMP_WAIT_POLICY=PASSIVE python3 benchmarks/atari_update_threads.py --steps 32 --threads 1 2 1 2

Each line: threads, wall and CPU seconds of one update (forward, backward, optimize: 2 epochs x 8
minibatches of ``8 x steps`` frames), and /proc/loadavg at its end (the host's other work).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from hetrun.examples.atari_ppo import AtariPPOWorkload
from hetrun.runtime.context import RankContext


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=128, help="agent steps per game in the batch (8 games)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2, 1, 2])
    args = ap.parse_args()
    hyper = {"env_id": "ALE/Frostbite-v5", "num_envs": 8, "num_steps": args.steps, "update_epochs": 2,
             "num_minibatches": 8}
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        def ctx(rank: int, component: str) -> RankContext:
            return RankContext(rank=rank, world_size=2, component=component, comp_rank=0, comp_size=1,
                               group=None, comm=None, device="cpu", seed=0, run_dir=Path(tmp), mode="inprocess")

        batch = AtariPPOWorkload(ctx(1, "rollout"), **hyper).rollout(0)
        for threads in args.threads:
            learner = AtariPPOWorkload(ctx(0, "learner"), **hyper, learner_threads=threads)
            wall, cpu = time.perf_counter(), time.process_time()
            learner.backward(learner.forward(batch, 0, 1))
            learner.optimize()
            print(f"threads {threads}: wall {time.perf_counter() - wall:.2f} s, cpu {time.process_time() - cpu:.2f} s, "
                  f"loadavg {Path('/proc/loadavg').read_text().strip()}", flush=True)


if __name__ == "__main__":
    main()
