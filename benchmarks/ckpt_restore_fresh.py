"""Restore after a requeue: hetrun vs torch.load, each in a fresh process.

A requeued job restores in a new process, so nothing from an earlier load
(freed memory the allocator hands back, warm scratch buffers) helps it. The
main benchmark (ckpt_bench.py) also runs fresh-process restores, but from a
parent holding ~10 GB of states and buffers, which on this VM makes fresh
pages fault in slowly; this one keeps the parent small.

Builds once (134M GPT + AdamW as in ckpt_bench.py, checkpoints at steps 3,
5 and 105 with the default delta chain, the step-105 state again with
``max_delta_chain=1``, torch.save and DCP save of it), then alternates
rounds of torch.load / hetrun (chain of 3) / hetrun (no chain) into fresh
memory, and torch.load + copy / DCP's in-place load / hetrun
``restore(into=...)`` into a live state built before the clock starts (what a requeued job has once its model
and optimizer exist), each in its own process, and prints medians with the
per-stage thread-seconds.

    python benchmarks/ckpt_restore_fresh.py            # build (~3 min) + 5 rounds
    python benchmarks/ckpt_restore_fresh.py --rounds 9 --keep   # reuse the build
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ckpt_bench as cb  # the same model, training loop and peers

ROOT = Path("/var/tmp/hetrun-restore-fresh")

def build() -> None:
    from hetrun.runtime.ckpt import tiers_for
    from hetrun.runtime.ckpt.writer import CheckpointWriter

    shutil.rmtree(ROOT, ignore_errors=True)
    ROOT.mkdir(parents=True)
    torch.set_num_threads(2)
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    model = cb.GPT(32000, 768, 12, 12, 64)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    cb.train(model, opt, 3, 32000, 64, gen)
    w = CheckpointWriter(tiers_for(ROOT / "chain"), keep=3, threads=2)
    for step, n in ((3, 0), (5, 2), (105, 100)):
        cb.train(model, opt, n, 32000, 64, gen)
        st = cb.full_state(model, opt)
        w.save(step, st)
        print(f"step {step}: {w.wait().stored_bytes / 1e6:.0f} MB", flush=True)
    w.close()
    w1 = CheckpointWriter(tiers_for(ROOT / "no_chain"), keep=1, threads=2, max_delta_chain=1)
    w1.save(105, st)
    print(f"step 105, max_delta_chain=1: {w1.wait().stored_bytes / 1e6:.0f} MB", flush=True)
    w1.close()
    torch.save(st, ROOT / "state.pt")
    import torch.distributed.checkpoint as dcp

    dcp.save(st, checkpoint_id=str(ROOT / "dcp"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--keep", action="store_true", help="reuse an earlier build in " + str(ROOT))
    args = ap.parse_args()
    if not (args.keep and (ROOT / "dcp").exists()):
        build()
    targets = {"torch.load": ("torch", ROOT / "state.pt"), "hetrun (chain of 3)": ("hetrun", ROOT / "chain"),
               "hetrun max_delta_chain=1": ("hetrun", ROOT / "no_chain"),
               "torch.load + copy into live": ("torch-into", ROOT / "state.pt"),
               "DCP in-place load": ("dcp-into", ROOT / "dcp"),
               "hetrun in place (chain of 3)": ("hetrun-into", ROOT / "chain"),
               "hetrun in place, chain=1": ("hetrun-into", ROOT / "no_chain")}
    # Every candidate reads from the page cache (as the reference
    # figures do): read every file once, so an earlier run's eviction does not
    # load the first round of one candidate with disk reads.
    for f in ROOT.rglob("*"):
        if f.is_file():
            with open(f, "rb") as fh:
                while fh.read(1 << 24):
                    pass
    for name, r in cb.fresh_restores(targets, threads=2, reps=args.rounds, template=ROOT / "state.pt").items():
        print(f"{name:30s} median {r['median_s']:.3f} s  ({', '.join(f'{x:.2f}' for x in r['runs_s'])})"
              + ("  stages (thread-s, last round): " + ", ".join(f"{k} {x:.2f}" for k, x in r["stages"].items())
                 if r["stages"] else ""))

if __name__ == "__main__":
    main()
