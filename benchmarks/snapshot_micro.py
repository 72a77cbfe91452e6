"""The run API's memory-tier snapshot, in-process: what one snapshot costs the training thread.

    flock /var/lock/hetrun-heavy.lock python3 benchmarks/snapshot_micro.py
    flock /var/lock/hetrun-heavy.lock python3 benchmarks/snapshot_micro.py --ranks 2 --out benchmarks/results/snapshot_micro_s21.json

The state is the DDP command example's (examples/ddp_train_hetrun.py: the 32-64-1 MLP, its
AdamW after a few steps, the RNG states; a 43 KB blob). Each measured snapshot is what
``Run.snapshot`` does on the caller's thread at a step it keeps (runtime/api/run.py): the tier's
``due``, the state tree (``recovery.snapshot_tree`` of the user's objects) and
``MemorySnapshots.snapshot`` (encode, the tmpfs write, the hand-over to the replica stream).
Between snapshots one training step of the example's model runs (the tensors change, as in the
job); ``cold`` adds the example's ``time.sleep(0.05)`` (the job's step: after it the caches are
cold), ``hot`` does not. Medians of ``--snapshots`` per mode, in ms, wall (``perf_counter``) and the
training thread's CPU (``time.thread_time``).

``alternate`` (the cost beyond the snapshot's own time: its helpers'): the cold loop again with a
snapshot at every other step only, each training step timed; a step right after a snapshot is
where the replicas arrive and the helper threads wake (the partner's replica received and filed,
its own blob and the received one written in the step's gap), the step after none is the same
step without them: the medians of both and their difference. With ``--ranks 2`` each training
step ends in a one-float all-reduce, as DDP's backward syncs the job's ranks, so the partner's
replica arrives when it does in the job.

Phases: a second pass per mode with each phase timed on its own (the wrappers add about a
microsecond each): ``tree`` (the state tree), ``encode`` (the blob), ``write`` (tmpfs), ``send``
(queued for the partner's stream), and ``total`` the unwrapped pass's.

``--ranks 1``: one process, a one-rank gloo group (no partner: no replica is sent or received).
``--ranks 2``: two processes on this host as two emulated nodes (a tmpfs directory each), one
partner each over the replica streams (runtime/replica_sockets.py), as in the job; rank 0
reports, and the replica threads' CPU per snapshot is printed too.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def build_state(sync: Any = None) -> tuple[dict[str, Any], Any]:
    """The example's objects ({"model": ..., "optim": ...}, as it passes them) and a step function
    (``sync``: called after the backward, as DDP's gradient all-reduce)."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(16, 32, generator=g), torch.randn(16, 1, generator=g)

    def step() -> None:
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        if sync is not None:
            sync()
        opt.step()

    for _ in range(3):
        step()
    return {"model": model, "optim": opt}, step


class Timed:
    """A callable that adds its wall and thread-CPU time to the current snapshot's phase."""

    def __init__(self, fn: Any, name: str, into: dict[str, list[float]]) -> None:
        self.fn, self.name, self.into = fn, name, into

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        w, c = time.perf_counter(), time.thread_time()
        try:
            return self.fn(*args, **kwargs)
        finally:
            self.into[self.name][0] += time.perf_counter() - w
            self.into[self.name][1] += time.thread_time() - c


def _median_ms(xs: list[float]) -> float:
    return round(statistics.median(xs) * 1e3, 4)


def run_rank(rank: int, size: int, base: Path, snapshots: int, warmup: int) -> dict[str, Any] | None:
    import torch
    import torch.distributed as dist
    from hetrun.runtime import memory_tier, recovery
    from hetrun.runtime.api.run import StateObjects
    from hetrun.runtime.memory_tier import MemorySnapshots
    from hetrun.runtime.memory_transport import GlooTransport

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{base / 'rendezvous'}", rank=rank, world_size=size)
    node = f"node-{rank}"
    mem = MemorySnapshots(GlooTransport(), base / "run", node=node, every=1, replicas=1, keep=8,
                          root=base / node)
    one = torch.zeros(1)
    objs, train_step = build_state((lambda: dist.all_reduce(one)) if size > 1 else None)
    at = 0

    def snapshot() -> None:
        # Run.snapshot's work at a step it keeps (runtime/api/run.py).
        nonlocal at
        at += 1
        if mem.due(at):
            recovery.take_snapshot(mem, StateObjects(objs), at, None)

    out: dict[str, Any] = {}
    for mode, pause in (("hot", 0.0), ("cold", 0.05)):
        for phased in (False, True):
            phases: dict[str, list[float]] = {k: [0.0, 0.0] for k in ("tree", "encode", "write", "send")}
            saved = []
            if phased:
                # Each phase's callee, wrapped where the tier looks it up (restored after the pass).
                encoder = getattr(mem, "_encoder", None)
                targets: list[tuple[Any, str, str]] = [(recovery, "snapshot_tree", "tree"),
                                                       (mem.tier, "write", "write"),
                                                       (mem.transport, "send", "send")]
                targets.append((encoder, "encode", "encode") if encoder is not None
                               else (memory_tier.memory, "encode", "encode"))
                for obj, attr, name in targets:
                    saved.append((obj, attr, obj.__dict__.get(attr) if hasattr(obj, "__dict__") else None,
                                  getattr(obj, attr)))
                    setattr(obj, attr, Timed(getattr(obj, attr), name, phases))
            rows: dict[str, list[float]] = {"wall": [], "cpu": [], **{f"{k}_wall": [] for k in phases},
                                            **{f"{k}_cpu": [] for k in phases}}
            replica_cpu0 = mem.transport.thread_cpu_s
            for i in range(warmup + snapshots):
                train_step()
                if pause:
                    time.sleep(pause)
                for v in phases.values():
                    v[0] = v[1] = 0.0
                w, c = time.perf_counter(), time.thread_time()
                snapshot()
                w, c = time.perf_counter() - w, time.thread_time() - c
                if i == warmup - 1:
                    replica_cpu0 = mem.transport.thread_cpu_s
                if i >= warmup:
                    rows["wall"].append(w)
                    rows["cpu"].append(c)
                    for k, (pw, pc) in phases.items():
                        rows[f"{k}_wall"].append(pw)
                        rows[f"{k}_cpu"].append(pc)
            for obj, attr, own, _orig in saved:
                if own is None:
                    delattr(obj, attr)  # it was the class's (a method): the instance's wrapper goes
                else:
                    setattr(obj, attr, own)
            key = f"{mode}_phases" if phased else mode
            out[key] = {k: _median_ms(v) for k, v in rows.items() if v and (phased or k in ("wall", "cpu"))}
            out[key]["replica_threads_cpu_ms_per_snapshot"] = round(
                (mem.transport.thread_cpu_s - replica_cpu0) / snapshots * 1e3, 4)
    # The helpers' cost to the next step: a snapshot every other step, each step timed.
    after: dict[bool, list[float]] = {True: [], False: []}
    took = False
    for i in range(warmup + 2 * snapshots):
        w = time.perf_counter()
        train_step()
        w = time.perf_counter() - w
        if i >= warmup:
            after[took].append(w)
        time.sleep(0.05)
        took = i % 2 == 0
        if took:
            snapshot()
    out["alternate"] = {"step_after_snapshot_ms": _median_ms(after[True]),
                        "step_after_none_ms": _median_ms(after[False]),
                        "steps": [len(after[True]), len(after[False])]}
    out["alternate"]["difference_ms"] = round(out["alternate"]["step_after_snapshot_ms"]
                                              - out["alternate"]["step_after_none_ms"], 4)
    out["blob_bytes"] = mem.bytes
    out["code"] = os.path.dirname(memory_tier.__file__)  # which tree (an older one on PYTHONPATH, for a before/after)
    mem.close(remove=True)
    dist.destroy_process_group()
    return out if rank == 0 else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, choices=(1, 2), default=1)
    p.add_argument("--snapshots", type=int, default=300, help="measured per mode and pass (median)")
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--out", default=None, help="a JSON file for the figures")
    p.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)  # a spawned rank
    p.add_argument("--base", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank is not None:
        got = run_rank(args.rank, args.ranks, Path(args.base), args.snapshots, args.warmup)
        if got is not None:
            (Path(args.base) / "result.json").write_text(json.dumps(got))
        return
    base = Path(tempfile.mkdtemp(prefix="hetrun-snapmicro-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    try:
        procs = [subprocess.Popen([sys.executable, __file__, "--ranks", str(args.ranks), "--rank", str(r),
                                   "--base", str(base), "--snapshots", str(args.snapshots),
                                   "--warmup", str(args.warmup)], cwd=ROOT) for r in range(args.ranks)]
        codes = [pr.wait() for pr in procs]
        if any(codes):
            sys.exit(f"a rank failed: exit codes {codes}")
        result = json.loads((base / "result.json").read_text())
    finally:
        shutil.rmtree(base, ignore_errors=True)
    result.update(ranks=args.ranks, snapshots=args.snapshots, load=os.getloadavg()[0],
                  commit=subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                        capture_output=True, text=True).stdout.strip())
    print(f"ranks {args.ranks}, {args.snapshots} snapshots per mode, blob {result['blob_bytes']} B, "
          f"load {result['load']:.2f}, commit {result['commit']}, code {result['code']}")
    print(f"{'ms per snapshot (median)':<28}" + "".join(f"{m:>18}" for m in ("hot", "cold")))
    cols = [("total", "wall"), ("total", "cpu")] + [(ph, kind) for ph in ("tree", "encode", "write", "send")
                                                    for kind in ("wall", "cpu")]
    for ph, kind in cols:
        src = "" if ph == "total" else "_phases"
        key = kind if ph == "total" else f"{ph}_{kind}"
        print(f"  {ph + ' ' + ('perf_counter' if kind == 'wall' else 'thread_time'):<26}"
              + "".join(f"{result[m + src].get(key, float('nan')):>18.4f}" for m in ("hot", "cold")))
    print(f"  {'replica threads CPU':<26}"
          + "".join(f"{result[m]['replica_threads_cpu_ms_per_snapshot']:>18.4f}" for m in ("hot", "cold")))
    alt = result["alternate"]
    print(f"  training step after a snapshot {alt['step_after_snapshot_ms']:.4f} ms, after none "
          f"{alt['step_after_none_ms']:.4f} ms (cold, a snapshot every other step): "
          f"{alt['difference_ms']:+.4f} ms")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
