"""Checkpoint benchmark: hetrun's store against torch.save/torch.load,
torch.distributed.checkpoint (save, async_save, in-place load) and zipnn, side
by side in one run, on states taken DURING training (AdamW moments non-zero,
every embedding row touched).

    python benchmarks/ckpt_bench.py                 # 134M GPT + MoE example state
    python benchmarks/ckpt_bench.py --small         # a 10M model, for a quick look

Scenarios (bytes are compared with torch.save's file of the same state):
  full      all parameters trainable; hetrun's first checkpoint (no base),
            then one 2 steps later (the preemption checkpoint right after a
            regular one), then one 100 steps after that
  frozen    fine-tuning: last 2 of 12 layers + head trainable
  adapters  LoRA adapters (~1% of the parameters) on a frozen base
  moe       the MoE example's model (examples/moe_model.py) with AdamW
Every restore is checked bit-exact against the live state. Files go under
/var/tmp (a real disk, not tmpfs), fsync'd for every method.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = Path("/var/tmp/hetrun-ckpt-bench")


# -- a GPT-style model ----------------------------------------------------------
class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.heads = heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, d // self.heads).unbind(2)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, heads: int, ctx: int) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))


class LoRA(nn.Module):
    def __init__(self, base: nn.Linear, rank: int) -> None:
        super().__init__()
        self.base = base
        self.a = nn.Parameter(torch.randn(rank, base.in_features) * 0.01)
        self.b = nn.Parameter(torch.zeros(base.out_features, rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.a.t()) @ self.b.t()


def train(model: nn.Module, opt: torch.optim.Optimizer, steps: int, vocab: int, seq: int, gen: torch.Generator) -> None:
    wte = getattr(model, "wte", None)
    for _ in range(steps):
        idx = torch.randint(0, vocab, (1, seq + 1), generator=gen)
        logits = model(idx[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), idx[:, 1:].reshape(-1))
        if wte is not None and wte.weight.requires_grad:
            # Large-batch training touches every embedding row each step; this
            # small L2 term does the same here so no row (and no moment) stays
            # exactly zero, which would flatter every compressor.
            loss = loss + 1e-4 * wte.weight.pow(2).sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


def full_state(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    return {"model": model.state_dict(), "optim": opt.state_dict()}


def frozen_copy(obj: Any) -> Any:
    """A copy of a state's tensors (states here are live references into the model)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return {k: frozen_copy(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [frozen_copy(v) for v in obj]
    return obj


def tensors_of(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in tensors_of(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in tensors_of(v)]
    return []


def same(a: Any, b: Any) -> bool:
    ta, tb = tensors_of(a), tensors_of(b)
    return len(ta) == len(tb) and all(
        x.dtype == y.dtype and x.shape == y.shape
        and torch.equal(x.reshape(-1).view(torch.uint8), y.reshape(-1).view(torch.uint8))
        for x, y in zip(ta, tb, strict=True)
    )


def state_bytes(st: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors_of(st))


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def fsync_tree(path: Path) -> None:
    for p in [path, *path.rglob("*")] if path.is_dir() else [path]:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def clean(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


# -- peers ---------------------------------------------------------------------------
def bench_torch(st: Any, tag: str) -> dict[str, float]:
    f = ROOT / f"{tag}.pt"
    t0 = time.perf_counter()
    torch.save(st, f)
    fsync_tree(f)
    save_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    back = torch.load(f, weights_only=True)
    load_s = time.perf_counter() - t0
    ok = same(back, st)
    size = f.stat().st_size
    del back
    f.unlink()
    return {"bytes": size, "save_s": save_s, "stall_s": save_s, "load_s": load_s, "exact": ok}


def bench_dcp(st: Any, tag: str) -> dict[str, float]:
    import torch.distributed.checkpoint as dcp

    d = ROOT / f"{tag}.dcp"
    clean(d)
    t0 = time.perf_counter()
    dcp.save(st, checkpoint_id=str(d))
    fsync_tree(d)
    save_s = time.perf_counter() - t0
    size = dir_bytes(d)
    clean(d)
    t0 = time.perf_counter()
    fut = dcp.async_save(st, checkpoint_id=str(d))
    async_block = time.perf_counter() - t0
    fut.result()
    fsync_tree(d)
    async_total = time.perf_counter() - t0
    # In-place load: DCP fills the tensors of a state of the same structure.
    target = _zeros_like(st)
    t0 = time.perf_counter()
    dcp.load(target, checkpoint_id=str(d))
    load_s = time.perf_counter() - t0
    ok = same(target, st)
    del target
    clean(d)
    return {"bytes": size, "save_s": save_s, "async_stall_s": async_block, "async_total_s": async_total,
            "load_s": load_s, "exact": ok}


def _zeros_like(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return torch.zeros_like(obj)
    if isinstance(obj, dict):
        return {k: _zeros_like(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_zeros_like(v) for v in obj]
    return obj


def bench_zipnn(st: Any, threads: int) -> dict[str, float]:
    from zipnn import ZipNN

    ts = [t for t in tensors_of(st) if t.dtype == torch.float32 and t.numel() > 0]
    zp = ZipNN(input_format="byte", bytearray_dtype="float32", threads=threads)
    raw = sum(t.numel() * 4 for t in ts)
    comp = 0
    ok = True
    enc_s = dec_s = 0.0
    for t in ts:
        data = bytes(t.reshape(-1).view(torch.uint8).numpy())
        best = float("inf")
        for _ in range(2):  # best of two, as for hetrun's encoder (bench_codec)
            src = bytearray(data)  # zipnn overwrites the buffer it is given: hand it a copy
            t0 = time.perf_counter()
            z = zp.compress(src)
            best = min(best, time.perf_counter() - t0)
        enc_s += best
        comp += len(z)
        t0 = time.perf_counter()
        back = zp.decompress(z)
        dec_s += time.perf_counter() - t0
        ok = ok and bytes(back) == data
    return {"float_bytes": raw, "bytes": comp, "ratio_floats": comp / raw, "compress_MBps": raw / enc_s / 1e6,
            "decompress_MBps": raw / dec_s / 1e6, "exact": ok}


def bench_codec(st: Any, base: Any, threads: int) -> dict[str, float]:
    """hetrun's chunk encoder measured the way bench_zipnn measures zipnn: the
    same float tensors, ``threads`` threads, only the encode calls timed (the
    writer's other stages, hashing and writing, are left out as zipnn has
    none). ``base``: the previous state, for delta encoding."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from hetrun.runtime.ckpt import codec

    local = threading.local()

    def enc(raw: Any, prev: Any) -> int:
        if not hasattr(local, "c"):
            local.c, local.s = codec.new_compressor(), codec.Scratch()
        return codec.encode(raw, 4, prev, compressor=local.c, scratch=local.s).stored_len

    ts = [t for t in tensors_of(st) if t.dtype == torch.float32 and t.numel() > 0]
    bs = [t for t in tensors_of(base) if t.dtype == torch.float32 and t.numel() > 0] if base is not None else None
    chunk = 4 << 20
    jobs = []
    for i, t in enumerate(ts):
        raw = t.reshape(-1).view(torch.uint8).numpy()
        prev = bs[i].reshape(-1).view(torch.uint8).numpy() if bs is not None else None
        jobs += [(raw[o : o + chunk], None if prev is None else prev[o : o + chunk]) for o in range(0, raw.size, chunk)]
    raw_total = sum(r.size for r, _ in jobs)
    # All chunks in flight at once, as the writer does (per tensor, a small
    # tensor would leave one of the threads idle).
    # Best of two passes, as for zipnn: the machine's first-touch costs vary.
    enc_s = float("inf")
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(2):
            t0 = time.perf_counter()
            comp = sum(pool.map(lambda job: enc(*job), jobs))
            enc_s = min(enc_s, time.perf_counter() - t0)
    return {"float_bytes": raw_total, "ratio_floats": comp / raw_total, "compress_MBps": raw_total / enc_s / 1e6}


# -- hetrun ------------------------------------------------------------------------------
def hetrun_writer(tag: str, threads: int, **kw: Any):
    from hetrun.runtime.ckpt import tiers_for
    from hetrun.runtime.ckpt.writer import CheckpointWriter

    d = ROOT / f"{tag}.hetrun"
    clean(d)
    return CheckpointWriter(tiers_for(d), keep=3, threads=threads, **kw), d


def hetrun_save(writer: Any, step: int, st: Any) -> dict[str, float]:
    t0 = time.perf_counter()
    stall = writer.save(step, st)
    res = writer.wait()
    total = time.perf_counter() - t0
    assert res is not None and res.ok, res
    return {"stored_bytes": res.stored_bytes, "stall_s": stall, "save_s": total, "reused": res.reused_chunks,
            "delta": res.delta_chunks, "full": res.full_chunks, "stages": dict(res.stages)}


def hetrun_prepare(writer: Any, st: Any) -> float:
    """Warm the snapshot buffers (what runtime/resume.py does after restore);
    the first checkpoint comes after at least this much training in a real run."""
    t0 = time.perf_counter()
    writer.prepare(st)
    if writer._prep_thread is not None:
        writer._prep_thread.join()
    return time.perf_counter() - t0


def hetrun_inflight(writer: Any, step: int, st_a: Any, st_b: Any) -> dict[str, Any]:
    """A save while the previous write is still in flight (the preemption
    checkpoint right after a regular one): the stall is only the copy when a
    third buffer is free."""
    writer.save(step, st_a)
    t0 = time.perf_counter()
    busy = not writer._idle.is_set()
    stall = writer.save(step + 2, st_b)
    res = writer.wait()
    assert res is not None and res.ok, res
    return {"stall_s": stall, "write_in_flight": busy, "both_saved_s": time.perf_counter() - t0}


def hetrun_restore(d: Path, st: Any, threads: int) -> dict[str, float]:
    from hetrun.runtime.ckpt import open_store

    t0 = time.perf_counter()
    store = open_store(d, threads=threads)
    res = store.restore()
    load_s = time.perf_counter() - t0
    assert res is not None
    ok = same(res.state, st)
    return {"load_s": load_s, "exact": ok, "step": res.step, "stages": store.stage_seconds()}


_FRESH = r"""
import json, sys, time
kind, path, threads, template = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
import torch
target = None
if kind.endswith("-into"):
    # A live state to load into, as a requeued job has after building its
    # model and optimizer: allocated and touched before the clock starts.
    target = torch.load(template, weights_only=True)
    def zero(o):
        if isinstance(o, torch.Tensor):
            o.zero_()
        for v in (o.values() if isinstance(o, dict) else o if isinstance(o, (list, tuple)) else ()):
            zero(v)
    zero(target)
t0 = time.perf_counter()
stages = {}
if kind == "torch":
    torch.load(path, weights_only=True)
elif kind == "torch-into":  # what a torch.save user does on requeue: load, then copy into the model
    def copy(dst, src):
        if isinstance(dst, torch.Tensor):
            dst.copy_(src)
        elif isinstance(dst, dict):
            for k in dst:
                copy(dst[k], src[k])
        elif isinstance(dst, (list, tuple)):
            for d, x in zip(dst, src):
                copy(d, x)
    copy(target, torch.load(path, weights_only=True))
elif kind == "dcp-into":
    import torch.distributed.checkpoint as dcp
    dcp.load(target, checkpoint_id=path)
else:
    from hetrun.runtime.ckpt import open_store
    store = open_store(path, threads=threads)
    assert store.restore(into=target) is not None
    stages = store.stage_seconds()
print(json.dumps({"s": time.perf_counter() - t0, "stages": stages}))
"""


def fresh_restores(targets: dict[str, tuple[str, Path]], threads: int, reps: int,
                   template: Path | None = None) -> dict[str, Any]:
    """Each restore in a new process, as after a requeue: fresh memory faults
    in, and no allocator reuse flatters a second load in one process. Rounds
    alternate the candidates, so drift hits all alike; medians reported.
    Kinds: "torch" (torch.load), "hetrun" (restore into fresh memory), and,
    given ``template`` (a torch.save of the state), "torch-into", "dcp-into"
    and "hetrun-into": into a live state built from it before the clock
    starts (torch.load then copy_ into it, as load_state_dict does; DCP's
    in-place load; hetrun's ``restore(into=...)``)."""
    import statistics
    import subprocess

    runs: dict[str, list[float]] = {k: [] for k in targets}
    stages: dict[str, dict[str, float]] = {}
    for _ in range(reps):
        for name, (kind, path) in targets.items():
            out = subprocess.run([sys.executable, "-c", _FRESH, kind, str(path), str(threads), str(template or "")],
                                 capture_output=True, text=True, check=True).stdout
            got = json.loads(out.strip().splitlines()[-1])
            runs[name].append(got["s"])
            stages[name] = got["stages"]
    return {k: {"median_s": statistics.median(v), "runs_s": v, "stages": stages[k]} for k, v in runs.items()}


# -- scenarios -----------------------------------------------------------------------------
def gpt_full(args: argparse.Namespace, out: dict[str, Any]) -> None:
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    model = GPT(args.vocab, args.dim, args.layers, args.heads, args.seq)
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    train(model, opt, 3, args.vocab, args.seq, gen)
    res: dict[str, Any] = {"params": n_params}
    st = full_state(model, opt)
    res["state_bytes"] = state_bytes(st)
    res["torch"] = bench_torch(st, "gpt")
    res["dcp"] = bench_dcp(st, "gpt")
    res["zipnn"] = bench_zipnn(st, threads=args.threads)
    res["codec_first"] = bench_codec(st, None, args.threads)
    prev = frozen_copy(st)
    w, d = hetrun_writer("gpt", args.threads)
    res["hetrun_prepare_s"] = hetrun_prepare(w, st)
    res["hetrun_first"] = hetrun_save(w, 3, st)
    train(model, opt, 2, args.vocab, args.seq, gen)
    st = full_state(model, opt)
    res["codec_2_steps"] = bench_codec(st, prev, args.threads)
    prev = frozen_copy(st)
    res["hetrun_2_steps"] = hetrun_save(w, 5, st)
    res["hetrun_2_steps"]["restore"] = hetrun_restore(d, st, args.threads)
    t0 = time.perf_counter()
    train(model, opt, args.interval, args.vocab, args.seq, gen)
    res["train_s_per_step"] = (time.perf_counter() - t0) / args.interval
    st = full_state(model, opt)
    res["codec_100_steps"] = bench_codec(st, prev, args.threads)
    del prev
    res["torch_100"] = bench_torch(st, "gpt100")
    res["hetrun_100_steps"] = hetrun_save(w, 5 + args.interval, st)
    res["hetrun_100_steps"]["restore"] = hetrun_restore(d, st, args.threads)
    # The same state with checkpoint.max_delta_chain: 1 (no delta chain to decode).
    w1, d1 = hetrun_writer("gpt_chain1", args.threads, max_delta_chain=1)
    hetrun_prepare(w1, st)
    res["hetrun_100_steps_chain1"] = hetrun_save(w1, 5 + args.interval, st)
    res["hetrun_100_steps_chain1"]["restore"] = hetrun_restore(d1, st, args.threads)
    w1.close()
    del w1
    gc.collect()
    fresh_ref = ROOT / "gpt100_fresh.pt"
    torch.save(st, fresh_ref)
    fresh_dcp = ROOT / "gpt100_fresh.dcp"
    clean(fresh_dcp)
    import torch.distributed.checkpoint as dcp

    dcp.save(st, checkpoint_id=str(fresh_dcp))
    res["fresh_restore"] = fresh_restores(
        {"torch.load": ("torch", fresh_ref), "hetrun (chain of 3)": ("hetrun", d),
         "hetrun max_delta_chain=1": ("hetrun", d1),
         "torch.load + copy into live": ("torch-into", fresh_ref), "DCP in-place load": ("dcp-into", fresh_dcp),
         "hetrun in place (chain of 3)": ("hetrun-into", d), "hetrun in place, chain=1": ("hetrun-into", d1)},
        args.threads, args.fresh_reps, template=fresh_ref)
    fresh_ref.unlink()
    clean(fresh_dcp)
    clean(d1)
    train(model, opt, 1, args.vocab, args.seq, gen)
    st_a = full_state(model, opt)
    train(model, opt, 2, args.vocab, args.seq, gen)
    res["hetrun_save_during_write"] = hetrun_inflight(w, 6 + args.interval, st_a, full_state(model, opt))
    w.close()
    clean(d)
    out["gpt_full"] = res
    # The trained weights seed the fine-tuning scenarios (realistic starting point).
    torch.save(model.state_dict(), ROOT / "gpt_weights.pt")
    del model, opt, st, w
    gc.collect()


def gpt_partial(args: argparse.Namespace, out: dict[str, Any], kind: str) -> None:
    gen = torch.Generator().manual_seed(1)
    model = GPT(args.vocab, args.dim, args.layers, args.heads, args.seq)
    if not (ROOT / "gpt_weights.pt").exists():  # run alone: start from a briefly trained model
        train(model, torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1), 3, args.vocab, args.seq, gen)
        torch.save(model.state_dict(), ROOT / "gpt_weights.pt")
    model.load_state_dict(torch.load(ROOT / "gpt_weights.pt", weights_only=True))
    for p in model.parameters():
        p.requires_grad_(False)
    if kind == "frozen":
        for blk in list(model.blocks)[-2:]:
            for p in blk.parameters():
                p.requires_grad_(True)
        for p in [*model.ln_f.parameters(), *model.head.parameters()]:
            p.requires_grad_(True)
    else:
        # LoRA on qkv and fc1 of every block holding ~1% of the parameters.
        per_rank = sum(lin.in_features + lin.out_features for blk in model.blocks for lin in (blk.qkv, blk.fc1))
        rank = max(1, round(0.01 * sum(p.numel() for p in model.parameters()) / per_rank))
        for blk in model.blocks:
            blk.qkv = LoRA(blk.qkv, rank)
            blk.fc1 = LoRA(blk.fc1, rank)
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=1e-4, weight_decay=0.0 if kind == "adapters" else 0.1)
    train(model, opt, 2, args.vocab, args.seq, gen)
    st = full_state(model, opt)
    res: dict[str, Any] = {"trainable_fraction": sum(p.numel() for p in trainable) / sum(p.numel() for p in model.parameters())}
    res["torch"] = bench_torch(st, kind)
    w, d = hetrun_writer(kind, args.threads)
    res["hetrun_prepare_s"] = hetrun_prepare(w, st)
    res["hetrun_first"] = hetrun_save(w, 2, st)
    train(model, opt, 10, args.vocab, args.seq, gen)
    st = full_state(model, opt)
    res["hetrun_10_steps"] = hetrun_save(w, 12, st)
    res["hetrun_10_steps"]["restore"] = hetrun_restore(d, st, args.threads)
    w.close()
    clean(d)
    out[f"gpt_{kind}"] = res
    del model, opt, st, w
    gc.collect()


def moe(args: argparse.Namespace, out: dict[str, Any]) -> None:
    try:
        from hetrun.examples.moe_model import MoEConfig, MoELM
    except ImportError as exc:
        out["moe"] = {"skipped": f"examples/moe_model.py not importable: {exc}"}
        return
    torch.manual_seed(0)
    cfg = MoEConfig(d_model=256, n_heads=4, n_layers=4, seq_len=128, num_experts=16, expert_hidden=512)
    model = MoELM(cfg, reference=True)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    gen = torch.Generator().manual_seed(0)

    def steps(n: int) -> None:
        for _ in range(n):
            tokens = torch.randint(0, 256, (8, cfg.seq_len + 1), generator=gen)
            ce, aux = model(tokens)
            opt.zero_grad(set_to_none=True)
            (ce + cfg.aux_loss_coef * aux).backward()
            opt.step()

    steps(3)
    st = full_state(model, opt)
    res: dict[str, Any] = {"params": sum(p.numel() for p in model.parameters()), "state_bytes": state_bytes(st)}
    res["torch"] = bench_torch(st, "moe")
    res["dcp"] = bench_dcp(st, "moe")
    res["zipnn"] = bench_zipnn(st, threads=args.threads)
    w, d = hetrun_writer("moe", args.threads)
    res["hetrun_prepare_s"] = hetrun_prepare(w, st)
    res["hetrun_first"] = hetrun_save(w, 3, st)
    steps(2)
    st = full_state(model, opt)
    res["hetrun_2_steps"] = hetrun_save(w, 5, st)
    steps(args.interval)
    st = full_state(model, opt)
    res["torch_100"] = bench_torch(st, "moe100")
    res["hetrun_100_steps"] = hetrun_save(w, 5 + args.interval, st)
    res["hetrun_100_steps"]["restore"] = hetrun_restore(d, st, args.threads)
    w.close()
    clean(d)
    out["moe"] = res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", action="store_true", help="10M-parameter model for a quick look")
    ap.add_argument("--interval", type=int, default=100, help="steps between the 2nd and 3rd checkpoint")
    ap.add_argument("--threads", type=int, default=2, help="encoder threads for hetrun and zipnn")
    ap.add_argument("--scenarios", default="full,frozen,adapters,moe")
    ap.add_argument("--json", default=None, help="write the raw results here")
    ap.add_argument("--fresh-reps", type=int, default=5, help="rounds of restores in fresh processes")
    args = ap.parse_args()
    args.vocab, args.dim, args.layers, args.heads, args.seq = (
        (8000, 256, 12, 4, 32) if args.small else (32000, 768, 12, 12, 64)
    )
    torch.set_num_threads(2)
    ROOT.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {"argv": sys.argv[1:], "torch": torch.__version__}
    wanted = args.scenarios.split(",")
    try:
        if "full" in wanted:
            gpt_full(args, out)
        if "frozen" in wanted:
            gpt_partial(args, out, "frozen")
        if "adapters" in wanted:
            gpt_partial(args, out, "adapters")
        if "moe" in wanted:
            moe(args, out)
    finally:
        clean(ROOT)
    text = json.dumps(out, indent=1, default=lambda o: round(o, 4) if isinstance(o, float) else str(o))
    print(text)
    if args.json:
        Path(args.json).write_text(text)
    print(summary(out))


def _stages(st: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.2f}" for k, v in st.items())


def summary(out: dict[str, Any]) -> str:
    lines = []
    for name, r in out.items():
        if not isinstance(r, dict) or "torch" not in r:
            continue
        tb = r["torch"]["bytes"]
        lines.append(f"== {name}: torch.save {tb / 1e6:.1f} MB, save {r['torch']['save_s']:.2f}s, load {r['torch']['load_s']:.2f}s")
        if "dcp" in r:
            dc = r["dcp"]
            lines.append(f"   DCP save {dc['save_s']:.2f}s, async_save stall {dc['async_stall_s']:.2f}s, in-place load {dc['load_s']:.2f}s")
        if "zipnn" in r:
            z = r["zipnn"]
            lines.append(f"   zipnn {z['ratio_floats']:.3f}x of float bytes, {z['compress_MBps']:.0f} MB/s compress")
        for key in [k for k in r if k.startswith("codec_")]:
            c = r[key]
            z = r.get("zipnn", {}).get("compress_MBps")
            lines.append(f"   hetrun encoder alone, {key[6:]}: {c['ratio_floats']:.3f}x of float bytes, "
                         f"{c['compress_MBps']:.0f} MB/s" + (f" = {c['compress_MBps'] / z:.2f}x zipnn's speed" if z else ""))
        if "hetrun_prepare_s" in r:
            lines.append(f"   hetrun prepare (buffers allocated+touched in background): {r['hetrun_prepare_s']:.2f}s")
        if "hetrun_save_during_write" in r:
            f = r["hetrun_save_during_write"]
            lines.append(f"   hetrun save while the previous write is in flight ({f['write_in_flight']}): "
                         f"stall {f['stall_s']:.3f}s, both committed after {f['both_saved_s']:.2f}s")
        for key in [k for k in r if k.startswith("hetrun_") and isinstance(r[k], dict) and "stored_bytes" in r[k]]:
            h = r[key]
            ref = r.get("torch_100", r["torch"])["bytes"] if "100" in key else tb
            rest = h.get("restore", {})
            lines.append(
                f"   {key}: {h['stored_bytes'] / ref:.3f}x bytes, stall {h['stall_s']:.3f}s, save {h['save_s']:.2f}s"
                + (f", restore {rest['load_s']:.2f}s exact={rest['exact']}" if rest else "")
            )
            if h.get("stages"):
                lines.append("      save stages (thread-s): " + _stages(h["stages"]))
            if rest.get("stages"):
                lines.append("      restore stages (thread-s): " + _stages(rest["stages"]))
        for name, fr in r.get("fresh_restore", {}).items():
            lines.append(f"   restore in a fresh process, {name}: median {fr['median_s']:.3f}s "
                         f"({', '.join(f'{x:.2f}' for x in fr['runs_s'])})"
                         + (f"; stages {_stages(fr['stages'])}" if fr["stages"] else ""))
    return "\n".join(lines) if lines else ""


if __name__ == "__main__":
    main()
