"""The resource sampler's overhead on a training step of the MoE example (sampler on vs off).

One process, real training steps of examples/moe_lm.py (its model settings
from examples/moe_lm.yaml; one rank, so the all-to-all is local), the real
``runtime.sampler.Sampler`` thread writing ``sample`` lines through a real
EventLog into a scratch run directory. Blocks of ``--steps`` steps alternate
off/on (the order flips every round, so drift in the machine's load hits both
sides alike); per block the median step time; overhead per round =
on/off - 1. Two periods: the default 5 s that runs use, and a period 100x
faster that bounds what sampling can cost. Last, the cost of one sample
(psutil CPU % and RSS, one events.jsonl line) timed directly: the A/B above is
noisy on a shared machine, this figure over the period is the overhead's size.

    python3 benchmarks/sampler_overhead.py                      # 6 rounds x 60 steps per block
    python3 benchmarks/sampler_overhead.py --rounds 2 --steps 20  # quicker
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

MOE_ARGS = {"d_model": 64, "n_layers": 2, "num_experts": 16, "num_groups": 4, "top_k": 2, "seq_len": 64,
            "batch_size": 16, "lr": 0.003}  # examples/moe_lm.yaml's workload_args


def _workload(run_dir: Path) -> Any:
    import torch
    from hetrun.examples.moe_lm import MoELMWorkload
    from hetrun.runtime.context import RankContext
    from mpi4py import MPI

    torch.set_num_threads(1)
    ctx = RankContext(rank=0, world_size=1, component="learner", comp_rank=0, comp_size=1, group=None,
                      comm=MPI.COMM_WORLD, device="cpu", seed=0, run_dir=run_dir,
                      comms={"forward_codec": "none", "backward_codec": "none"})
    return MoELMWorkload(ctx, corpus_bytes=1_000_000, **MOE_ARGS)


def _block(work: Any, first: int, steps: int) -> float:
    """Median seconds per training step (forward, backward, optimize) over ``steps`` steps."""
    times = []
    for it in range(first, first + steps):
        t0 = time.perf_counter()
        loss = work.forward(work.next_batch(it, 0), 0, 1)
        work.backward(loss)
        work.optimize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(rounds: int, steps: int, period: float, work: Any, log: Any) -> dict[str, Any]:
    from hetrun.runtime.sampler import Sampler

    it, ratios, offs, ons = 0, [], [], []
    for r in range(rounds):
        medians: dict[str, float] = {}
        for side in (("off", "on") if r % 2 == 0 else ("on", "off")):
            sampler = Sampler(log, period=period).start() if side == "on" else None
            medians[side] = _block(work, it, steps)
            if sampler is not None:
                sampler.stop()
            it += steps
        offs.append(medians["off"])
        ons.append(medians["on"])
        ratios.append(medians["on"] / medians["off"] - 1.0)
    return {"period_s": period, "off_ms": statistics.median(offs) * 1e3, "on_ms": statistics.median(ons) * 1e3,
            "overhead_pct": statistics.median(ratios) * 100, "min_pct": min(ratios) * 100,
            "max_pct": max(ratios) * 100, "rounds": rounds}


def sample_cost_us(log: Any, n: int = 500) -> float:
    """Median microseconds of one sample taken and written (what the thread does once per period)."""
    from hetrun.runtime.sampler import Sampler

    sampler, times = Sampler(log, period=3600.0), []
    for _ in range(n):
        t0 = time.perf_counter()
        log.emit("sample", **sampler.sample())
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=60, help="training steps per block")
    ap.add_argument("--fast-period", type=float, default=0.05, help="the stress period (s)")
    args = ap.parse_args()
    from hetrun.runtime.events import EventLog
    from hetrun.runtime.sampler import DEFAULT_PERIOD_S

    with tempfile.TemporaryDirectory(prefix="sampler-bench-", dir="/var/tmp") as tmp:
        run_dir = Path(tmp)
        work = _workload(run_dir)
        log = EventLog(run_dir, rank=0, component="learner", node="bench")
        _block(work, 0, 10)  # warm-up
        rows = [measure(args.rounds, args.steps, p, work, log) for p in (DEFAULT_PERIOD_S, args.fast_period)]
        cost = sample_cost_us(log)
        samples = sum(1 for line in (run_dir / "events.jsonl").open() if '"ev":"sample"' in line)
        log.close()
    print("| sampler period | step off (median) | step on (median) | overhead: median of rounds [min, max] |")
    print("|---|---|---|---|")
    for row in rows:
        print(f"| {row['period_s']:g} s | {row['off_ms']:.2f} ms | {row['on_ms']:.2f} ms | "
              f"{row['overhead_pct']:+.2f}% [{row['min_pct']:+.2f}%, {row['max_pct']:+.2f}%] |")
    print(f"\n{rows[0]['rounds']} rounds x {args.steps} steps per block; {samples} sample lines written")
    print(f"one sample taken and written: {cost:.0f} us median, i.e. {cost / (DEFAULT_PERIOD_S * 1e6) * 100:.4f}% "
          f"of a rank's time at the default {DEFAULT_PERIOD_S:g} s period")


if __name__ == "__main__":
    main()
