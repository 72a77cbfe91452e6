"""CPU cost of one PPO CartPole evaluation (20 episodes of a solved policy: 10,000 env steps),
the evaluation loop as it was (tests/test_ppo_eval.py's ``reference_returns``: nn.Sequential,
torch.multinomial, gymnasium's vector ``step``) against the shipped ``evaluate()``, alternating in
one process, median of ``--repeat`` each. CPU seconds (``process_time``), so another process on
the machine slows both sides alike; the two give the same returns (asserted).

    python3 benchmarks/ppo_eval_cost.py --repeat 15
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from test_ppo_eval import balancing, learner, reference_returns  # the old loop lives there


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=15)
    args = ap.parse_args()
    torch.set_num_threads(1)
    w = learner(0)
    balancing(w, gain=20.0)  # every episode runs to CartPole's 500-step limit
    assert float(reference_returns(w).mean()) == w.evaluate()["eval_return_mean"] == 500.0
    old, new = [], []
    load = os.getloadavg()[0]
    for _ in range(args.repeat):
        t0 = time.process_time()
        reference_returns(w)
        old.append(time.process_time() - t0)
        t0 = time.process_time()
        w.evaluate()
        new.append(time.process_time() - t0)
    o, n = statistics.median(old), statistics.median(new)
    print(f"CPU per evaluation of 10,000 env steps, median of {args.repeat}: old loop {o * 1e3:.1f} ms "
          f"({o / 1e4 * 1e6:.1f} us/env step), evaluate() {n * 1e3:.1f} ms ({n / 1e4 * 1e6:.1f} us/env step): "
          f"{o / n:.2f}x cheaper (fastest: {min(old) * 1e3:.1f} vs {min(new) * 1e3:.1f} ms); "
          f"load average {load:.2f} -> {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
