"""One Atari PPO update (examples/atari_ppo.py, the example's network) timed per way of using the cores,
in this process: what ``learner_threads`` buys, and what it costs on a host with other work.

Ways (``--ways``, each run in turn, repeat a name to repeat it):
- ``1``, ``2``: the whole minibatch on 1 or 2 torch (intra-op) threads (``update_parts: 1``);
- ``parts``: the example's default, ``learner_threads: auto`` with ``update_parts: 2``: each step's
  two halves at once on two threads of one torch thread each (in process: every CPU is free);
- ``parts-seq``: the same halves in turn on one thread (the same numbers as ``parts``).

Run it twice to see OpenMP's wait policy (it is read when torch loads, so per process):

    python3 benchmarks/atari_update_threads.py --steps 128 --ways 1 2 parts parts-seq 1 2 parts parts-seq
    OMP_WAIT_POLICY=PASSIVE python3 benchmarks/atari_update_threads.py --steps 32 --ways 1 2 1 2

``--keep-freed-memory`` first applies the malloc settings an Atari rank process runs with
(examples/atari_ppo.py's keep_freed_memory; a process-wide setting, so compare two processes).

Each line: the way, wall and CPU seconds of one update (forward, backward, optimize: 2 epochs x 8
minibatches of ``8 x steps`` frames), and /proc/loadavg at its end (the host's other work).
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

from hetrun.examples.atari_ppo import AtariPPOWorkload, keep_freed_memory
from hetrun.runtime.context import RankContext

WAYS: dict[str, dict[str, Any]] = {
    "1": {"learner_threads": 1, "update_parts": 1},
    "2": {"learner_threads": 2, "update_parts": 1},
    "parts": {"learner_threads": "auto", "update_parts": 2},
    "parts-seq": {"learner_threads": 1, "update_parts": 2},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=128, help="agent steps per game in the batch (8 games)")
    ap.add_argument("--ways", nargs="+", choices=sorted(WAYS), default=["1", "2", "parts", "1", "2", "parts"])
    ap.add_argument("--keep-freed-memory", action="store_true", help="an Atari rank's malloc settings")
    args = ap.parse_args()
    if args.keep_freed_memory:
        keep_freed_memory()
    hyper = {"env_id": "ALE/Frostbite-v5", "num_envs": 8, "num_steps": args.steps, "update_epochs": 2,
             "num_minibatches": 8}
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        def ctx(rank: int, component: str) -> RankContext:
            return RankContext(rank=rank, world_size=2, component=component, comp_rank=0, comp_size=1,
                               group=None, comm=None, device="cpu", seed=0, run_dir=Path(tmp), mode="inprocess")

        batch = AtariPPOWorkload(ctx(1, "rollout"), **hyper).rollout(0)
        for way in args.ways:
            learner = AtariPPOWorkload(ctx(0, "learner"), **hyper, **WAYS[way])
            wall, cpu, usage = time.perf_counter(), time.process_time(), resource.getrusage(resource.RUSAGE_SELF)
            for micro in range(2):  # the example's micro_batches: 2
                learner.backward(learner.forward(batch, micro, 2))
            threads = learner.optimize()["update_threads"]
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - usage.ru_minflt
            print(f"{way:>9}: wall {time.perf_counter() - wall:.2f} s, cpu {time.process_time() - cpu:.2f} s, "
                  f"sys {resource.getrusage(resource.RUSAGE_SELF).ru_stime - usage.ru_stime:.2f} s, page faults {faults}, "
                  f"threads per step {threads:.2f}, loadavg {Path('/proc/loadavg').read_text().strip()}",
                  flush=True)


if __name__ == "__main__":
    main()
