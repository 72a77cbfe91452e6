"""The public run API's costs, each next to its peer in the same run.

    torchrun --standalone --nproc-per-node 2 benchmarks/api_overhead.py steps   # bookkeeping per step
    python benchmarks/api_overhead.py save --params 30e6                       # save stall vs torch.save / DCP
    python benchmarks/api_overhead.py save --model gpt                         # the same on ckpt_bench's 134M GPT

``steps`` (2 CPU ranks, gloo): per-step cost of the API's bookkeeping
(``run.log`` + ``run.should_stop``, the agreed stop) next to a bare loop and
next to what a script would otherwise do for an agreed stop (a blocking
one-int all_reduce per step). Each step does a small fixed compute (a 96x96
matmul) so the non-blocking agreement has something to overlap with; the
bookkeeping alone is timed with perf_counter around the calls.

``save`` (one process): an MLP with ``--params`` parameters + AdamW state, or
(``--model gpt``) the 134M GPT of benchmarks/ckpt_bench.py + AdamW, one training
step of its own ``train`` between saves.
The stall training sees per checkpoint through ``run.save`` (snapshot copy;
the write is in the background) for the first save and for incremental saves
after optimizer steps, next to ``torch.save`` of the same state (blocking,
to the same disk) and to DCP's ``async_save`` stall where it works on CPU.
Bytes on disk for each. Writes benchmarks/results/api_overhead_<mode>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from hetrun.rundir import read_events

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def _stats(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    return {"median_us": round(statistics.median(xs) * 1e6, 2), "p90_us": round(xs[int(0.9 * len(xs))] * 1e6, 2),
            "n": len(xs)}


def bench_steps(steps: int, work_dir: Path) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    import hetrun

    run = hetrun.attach(run_dir=work_dir / "run")
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    a = torch.randn(96, 96)
    run.restore({"a": a})
    flag = torch.zeros(1, dtype=torch.int32)
    out: dict[str, list[float]] = {"bare": [], "log": [], "should_stop": [], "log+should_stop": [],
                                   "blocking_allreduce": []}
    for mode in out:
        dist.barrier()
        for step in range(steps):
            (a @ a).sum()
            t0 = time.perf_counter()
            if mode in ("log", "log+should_stop"):
                run.log(step, loss=0.5)
            if mode in ("should_stop", "log+should_stop"):
                run.should_stop(step)
            if mode == "blocking_allreduce":
                dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            out[mode].append(time.perf_counter() - t0)
        if run._agreement is not None:  # a fresh agreement per mode: every rank closes its own
            run._agreement.close()
            run._agreement = None
    res = {k: _stats(v) for k, v in out.items()}
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, res)
    run.close()
    dist.destroy_process_group()
    return {"ranks": gathered, "steps": steps}


def _model(params: float, kind: str = "mlp") -> tuple[Any, Any, Any]:
    """(model, optimizer, one training step)."""
    import torch

    if kind == "gpt":
        sys.path.insert(0, str(ROOT / "benchmarks"))
        from ckpt_bench import GPT, train  # the 134M GPT every checkpoint benchmark uses

        vocab, seq = 32000, 64
        torch.manual_seed(0)
        gpt = GPT(vocab, 768, 12, 12, seq)
        adamw = torch.optim.AdamW(gpt.parameters(), lr=3e-4, weight_decay=0.1)
        gen = torch.Generator().manual_seed(0)
        return gpt, adamw, lambda: train(gpt, adamw, 1, vocab, seq, gen)
    width = int((params / 4) ** 0.5)  # 4 layers of width x width
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(4)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return model, opt, lambda: _train_step(model, opt)


def _train_step(model: Any, opt: Any) -> None:
    import torch

    x = torch.randn(8, model[0].in_features)
    model(x).square().mean().backward()
    opt.step()
    opt.zero_grad()


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def bench_save(params: float, saves: int, work_dir: Path, kind: str = "mlp") -> dict[str, Any]:
    import torch

    import hetrun

    model, opt, step = _model(params, kind)
    step()
    state = {"model": model, "optim": opt}
    n_params = sum(p.numel() for p in model.parameters())
    res: dict[str, Any] = {"params": n_params, "state_bytes": 3 * 4 * n_params}
    run = hetrun.attach(run_dir=work_dir / "api")
    run.restore(state)
    stalls = []
    for i in range(saves):
        stalls.append(run.save(i, state)["stall_s"])
        step()  # the next save is incremental against this one
    run.close()  # waits for the last write
    evs = list(read_events(work_dir / "api"))
    res["api"] = {"stall_s": stalls, "first_stall_s": stalls[0],
                  "median_incremental_stall_s": statistics.median(stalls[1:]),
                  "bytes_on_disk": _du(work_dir / "api" / "ckpt"),
                  "checkpoint_events": [e for e in evs if e.get("ev") == "checkpoint"]}
    ts = []
    for i in range(saves):
        t0 = time.perf_counter()
        torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, work_dir / f"torch_{i}.pt")
        ts.append(time.perf_counter() - t0)
        step()
    res["torch_save"] = {"stall_s": ts, "median_stall_s": statistics.median(ts),
                         "bytes_on_disk": sum((work_dir / f"torch_{i}.pt").stat().st_size for i in range(saves))}
    res["dcp_async_save"] = _dcp(model, opt, step, saves, work_dir)
    res["api_stall_vs_torch_save"] = round(res["api"]["median_incremental_stall_s"] / res["torch_save"]["median_stall_s"], 4)
    return res


def _dcp(model: Any, opt: Any, step: Any, saves: int, work_dir: Path) -> dict[str, Any]:
    try:
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp

        if not dist.is_initialized():
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            dist.init_process_group("gloo", rank=0, world_size=1)
        stalls, futures = [], []
        for i in range(saves):
            t0 = time.perf_counter()
            fut = dcp.async_save({"model": model.state_dict(), "optim": opt.state_dict()},
                                 checkpoint_id=str(work_dir / f"dcp_{i}"))
            stalls.append(time.perf_counter() - t0)
            futures.append(fut)
            fut.result()  # one in flight at a time, as the API's writer
            step()
        return {"stall_s": stalls, "median_stall_s": statistics.median(stalls),
                "bytes_on_disk": sum(_du(work_dir / f"dcp_{i}") for i in range(saves))}
    except Exception as exc:  # report, do not hide: the table says why there is no figure
        return {"error": f"{type(exc).__name__}: {exc}"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["steps", "save"])
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--params", type=float, default=30e6)
    p.add_argument("--saves", type=int, default=4)
    p.add_argument("--model", choices=["mlp", "gpt"], default="mlp",
                   help="save: an MLP of --params, or benchmarks/ckpt_bench.py's 134M GPT")
    p.add_argument("--dir", default=None, help="scratch directory (default: a fresh one under /var/tmp)")
    args = p.parse_args()
    if args.dir:
        work = Path(args.dir)
    elif "TORCHELASTIC_RUN_ID" in os.environ:  # every rank must find the same directory
        work = Path("/var/tmp") / f"api_bench-{os.environ['TORCHELASTIC_RUN_ID']}"
    else:
        work = Path(tempfile.mkdtemp(prefix="api_bench-", dir="/var/tmp"))
    if args.mode == "steps":
        res = bench_steps(args.steps, work)
    else:
        res = bench_save(args.params, args.saves, work, args.model)
    if os.environ.get("RANK", "0") == "0":
        res["when"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        res["command"] = " ".join(sys.argv)
        RESULTS.mkdir(parents=True, exist_ok=True)
        name = args.mode if args.model == "mlp" else f"{args.mode}_{args.model}"
        (RESULTS / f"api_overhead_{name}.json").write_text(json.dumps(res, indent=1))
        shown = dict(res)
        if "api" in shown:  # the per-save events are in the JSON file
            shown["api"] = {k: v for k, v in shown["api"].items() if k != "checkpoint_events"}
        print(json.dumps(shown, indent=1))
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
