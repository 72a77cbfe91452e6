"""LOSSY optimizer-state checkpoints (checkpoint.optimizer_encoding: lossy-4bit):
bytes against torch.save, and the loss curve after resume against an exact resume.

    python benchmarks/ckpt_lossy.py                 # 134M GPT bytes + loss curves
    python benchmarks/ckpt_lossy.py --small         # 10M GPT for the bytes (quick)
    python benchmarks/ckpt_lossy.py --parts curve   # only the loss curves

bytes: the 134M-parameter GPT of benchmarks/ckpt_bench.py (AdamW, fp32
  weights + exp_avg + exp_avg_sq, every embedding row touched), trained 3
  steps; hetrun's store exact vs lossy-4bit (two stores, side by side): the
  first checkpoint (no base), one 2 steps later and one --interval steps
  after that; each as a fraction of torch.save's file of the same state.
  Restores are checked: weights/steps bit-exact, moments within the bounds.
curve: a small byte-level GPT on the Python standard library's sources
  (hetrun.examples.moe_data), trained --steps steps, checkpointed through the
  real store exact and lossy, restored, then trained --after steps from each
  on the same batches. Reports the max relative gap of the 20-step mean loss
  (lossy vs exact resume) over the post-resume curve, for --seeds seeds, and
  draws both curves (benchmarks/results/ckpt_lossy_curve.png).
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ckpt_bench import GPT, full_state, same, train

ROOT = Path("/var/tmp/hetrun-ckpt-lossy")
RESULTS = Path(__file__).resolve().parent / "results"


def _writer(tag: str, threads: int) -> tuple[Any, Path]:
    from hetrun.runtime.ckpt import tiers_for
    from hetrun.runtime.ckpt.writer import CheckpointWriter

    d = ROOT / tag
    shutil.rmtree(d, ignore_errors=True)
    return CheckpointWriter(tiers_for(d), keep=3, threads=threads), d


def _save(writer: Any, step: int, st: Any, encoding: str) -> dict[str, Any]:
    from hetrun.runtime.ckpt.lossy import encode_state

    t0 = time.perf_counter()
    tree, summary = encode_state(st, encoding)
    encode_s = time.perf_counter() - t0
    stall = writer.save(step, tree, {"optimizer_encoding": encoding})
    res = writer.wait()
    assert res is not None and res.ok, res
    return {"stored_bytes": res.stored_bytes, "encode_s": encode_s, "stall_s": encode_s + stall,
            "save_s": time.perf_counter() - t0, "encoded_tensors": summary["encoded_tensors"]}


def _restore(d: Path) -> tuple[Any, float]:
    from hetrun.runtime.ckpt import open_store
    from hetrun.runtime.ckpt.lossy import decode_state

    t0 = time.perf_counter()
    res = open_store(d).restore()
    assert res is not None
    return decode_state(res.state), time.perf_counter() - t0


def _moment_error(back: Any, st: Any) -> dict[str, float]:
    """Weights bit-exact? and the relative error of m, v and the Adam update m/sqrt(v)."""
    weights_exact = same(back["model"], st["model"])
    num = {"m": 0.0, "v": 0.0, "u": 0.0}
    den = {"m": 0.0, "v": 0.0, "u": 0.0}
    steps_exact = True
    for i, s in st["optim"]["state"].items():
        b = back["optim"]["state"][i]
        steps_exact = steps_exact and torch.equal(b["step"], s["step"])
        m, v, bm, bv = s["exp_avg"], s["exp_avg_sq"], b["exp_avg"], b["exp_avg_sq"]
        u, bu = m / (v.sqrt() + 1e-8), bm / (bv.sqrt() + 1e-8)
        for k, x, y in (("m", m, bm), ("v", v, bv), ("u", u, bu)):
            num[k] += float((x - y).double().pow(2).sum())
            den[k] += float(x.double().pow(2).sum())
    out: dict[str, float] = {f"rel_err_{k}": (num[k] / den[k]) ** 0.5 if den[k] else 0.0 for k in num}
    out["weights_exact"] = weights_exact
    out["steps_exact"] = steps_exact
    return out


def part_bytes(args: argparse.Namespace, out: dict[str, Any]) -> None:
    vocab, dim, layers, heads, seq = (8000, 256, 12, 4, 32) if args.small else (32000, 768, 12, 12, 64)
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    model = GPT(vocab, dim, layers, heads, seq)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    train(model, opt, 3, vocab, seq, gen)
    res: dict[str, Any] = {"params": sum(p.numel() for p in model.parameters())}
    writers = {enc: _writer(f"bytes-{enc}", args.threads) for enc in ("exact", "lossy-4bit")}
    for label, steps, step in (("first", 0, 3), ("2_steps", 2, 5), (f"{args.interval}_steps", args.interval, 5 + args.interval)):
        train(model, opt, steps, vocab, seq, gen)
        st = full_state(model, opt)
        f = ROOT / "state.pt"
        torch.save(st, f)
        row: dict[str, Any] = {"torch_save_bytes": f.stat().st_size}
        f.unlink()
        for enc, (w, d) in writers.items():
            r = _save(w, step, st, enc)
            r["ratio"] = r["stored_bytes"] / row["torch_save_bytes"]
            back, r["restore_s"] = _restore(d)
            if enc == "exact":
                r["exact"] = same(back, st)
            else:
                r.update(_moment_error(back, st))
            del back
            row[enc] = r
        res[label] = row
        print(f"bytes {label}: " + ", ".join(f"{enc} {row[enc]['ratio']:.3f}x" for enc in writers), flush=True)
        del st
        gc.collect()
    for w, d in writers.values():
        w.close()
        shutil.rmtree(d, ignore_errors=True)
    out["bytes"] = res


# -- loss curve after resume --------------------------------------------------------------
def _batch(data: torch.Tensor, seq: int, batch: int, seed: int, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    starts = torch.randint(0, data.numel() - seq - 1, (batch,), generator=g)
    return torch.stack([data[s:s + seq + 1] for s in starts.tolist()]).long()


def _train_steps(model: GPT, opt: torch.optim.Optimizer, data: torch.Tensor, args: argparse.Namespace,
                 seed: int, first: int, n: int) -> list[float]:
    losses = []
    for step in range(first, first + n):
        idx = _batch(data, args.seq, args.batch, seed, step)
        logits = model(idx[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), idx[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        if args.verbose and (step + 1) % 100 == 0:
            print(f"  step {step + 1}: loss {losses[-1]:.4f}", flush=True)
    return losses


def _smooth(xs: list[float], w: int) -> list[float]:
    return [sum(xs[i:i + w]) / w for i in range(0, len(xs) - w + 1)]


def part_curve(args: argparse.Namespace, out: dict[str, Any]) -> None:
    from hetrun.examples.moe_data import ByteCorpus

    data = ByteCorpus.from_stdlib(budget_bytes=2_000_000).train
    runs: list[dict[str, Any]] = []
    for seed in range(args.seeds):
        torch.manual_seed(seed)
        model = GPT(256, args.dim, args.layers, 4, args.seq)
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
        before = _train_steps(model, opt, data, args, seed, 0, args.steps)
        st = full_state(model, opt)
        curves: dict[str, list[float]] = {}
        info: dict[str, Any] = {"seed": seed}
        for enc in ("exact", "lossy-4bit"):
            w, d = _writer(f"curve-{enc}", args.threads)
            info[enc] = _save(w, args.steps, st, enc)
            w.close()
            back, _ = _restore(d)
            shutil.rmtree(d, ignore_errors=True)
            if enc == "exact":
                assert same(back, st), "exact checkpoint did not round-trip bit-exact"
            torch.manual_seed(seed)
            m2 = GPT(256, args.dim, args.layers, 4, args.seq)
            o2 = torch.optim.AdamW(m2.parameters(), lr=args.lr, weight_decay=0.1)
            m2.load_state_dict(back["model"])
            o2.load_state_dict(back["optim"])
            curves[enc] = _train_steps(m2, o2, data, args, seed, args.steps, args.after)
            if enc == "exact":
                # Reference for the size of the effect: the same weights with the
                # optimizer state dropped (fresh AdamW), what a weights-only resume does.
                torch.manual_seed(seed)
                m3 = GPT(256, args.dim, args.layers, 4, args.seq)
                m3.load_state_dict(back["model"])
                o3 = torch.optim.AdamW(m3.parameters(), lr=args.lr, weight_decay=0.1)
                curves["dropped"] = _train_steps(m3, o3, data, args, seed, args.steps, args.after)
        cont = _train_steps(model, opt, data, args, seed, args.steps, args.after)
        assert cont == curves["exact"], "exact resume differs from the uninterrupted run"
        se, sl = _smooth(curves["exact"], args.window), _smooth(curves["lossy-4bit"], args.window)
        gaps = [abs(b - a) / a for a, b in zip(se, sl, strict=True)]
        sd = _smooth(curves["dropped"], args.window)
        dropped_gap = max(abs(b - a) / a for a, b in zip(se, sd, strict=True))
        info.update(before=before, exact=curves["exact"], lossy=curves["lossy-4bit"], dropped=curves["dropped"],
                    max_rel_gap=max(gaps), mean_rel_gap=sum(gaps) / len(gaps), dropped_max_rel_gap=dropped_gap,
                    final_exact=se[-1], final_lossy=sl[-1])
        print(f"curve seed {seed}: max rel gap {info['max_rel_gap'] * 100:.3f}% "
              f"(mean {info['mean_rel_gap'] * 100:.3f}%), final {se[-1]:.4f} exact vs {sl[-1]:.4f} lossy; "
              f"optimizer state dropped: max rel gap {dropped_gap * 100:.3f}%", flush=True)
        runs.append(info)
        del model, opt, st
        gc.collect()
    out["curve"] = {"args": {k: getattr(args, k) for k in ("dim", "layers", "seq", "batch", "lr", "steps", "after", "window")},
                    "runs": runs, "max_rel_gap": max(r["max_rel_gap"] for r in runs)}
    _plot(runs, args)


def _plot(runs: list[dict[str, Any]], args: argparse.Namespace) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot", flush=True)
        return
    fig, ax = plt.subplots(figsize=(8, 4.5))
    w = args.window
    for r in runs:
        xs = [args.steps + i + w for i in range(len(r["exact"]) - w + 1)]
        ax.plot(xs, _smooth(r["exact"], w), lw=1.2, label=f"exact resume (seed {r['seed']})")
        ax.plot(xs, _smooth(r["lossy"], w), lw=1.2, ls="--", label=f"lossy-4bit resume (seed {r['seed']})")
        ax.plot(xs, _smooth(r["dropped"], w), lw=0.8, ls=":", label=f"optimizer state dropped (seed {r['seed']})")
    ax.set_xlabel(f"step (resumed at {args.steps})")
    ax.set_ylabel(f"training loss ({w}-step mean)")
    ax.set_title("Loss after resume: exact vs lossy-4bit optimizer state")
    ax.legend(fontsize=7)
    RESULTS.mkdir(exist_ok=True)
    fig.tight_layout()
    fig.savefig(RESULTS / "ckpt_lossy_curve.png", dpi=110)


def summary(out: dict[str, Any]) -> str:
    lines = []
    if "bytes" in out:
        b = out["bytes"]
        lines.append(f"== bytes, GPT {b['params'] / 1e6:.0f}M params, AdamW (fraction of torch.save of the same state)")
        lines.append(f"   {'checkpoint':<12} {'torch.save MB':>13} {'exact':>7} {'lossy':>7} {'encode s':>9} "
                     f"{'restore s ex/lo':>16} {'err m':>6} {'err v':>6} {'err upd':>7} weights/steps exact")
        for label, row in b.items():
            if not isinstance(row, dict):
                continue
            ex, lo = row["exact"], row["lossy-4bit"]
            lines.append(f"   {label:<12} {row['torch_save_bytes'] / 1e6:>13.1f} {ex['ratio']:>7.3f} {lo['ratio']:>7.3f} "
                         f"{lo['encode_s']:>9.2f} {ex['restore_s']:>7.2f}/{lo['restore_s']:<8.2f} "
                         f"{lo['rel_err_m']:>6.3f} {lo['rel_err_v']:>6.3f} {lo['rel_err_u']:>7.3f} "
                         f"{lo['weights_exact']}/{lo['steps_exact']}")
    if "curve" in out:
        c = out["curve"]
        a = c["args"]
        lines.append(f"== loss after resume: GPT d{a['dim']} x{a['layers']} on stdlib bytes, resumed at step "
                     f"{a['steps']}, {a['after']} steps after, {a['window']}-step mean")
        for r in c["runs"]:
            lines.append(f"   seed {r['seed']}: max rel gap {r['max_rel_gap'] * 100:.3f}%  mean {r['mean_rel_gap'] * 100:.3f}%  "
                         f"final loss exact {r['final_exact']:.4f} lossy {r['final_lossy']:.4f}  "
                         f"(optimizer state dropped: max rel gap {r['dropped_max_rel_gap'] * 100:.3f}%)")
        lines.append(f"   worst max rel gap {c['max_rel_gap'] * 100:.3f}% (target <= 0.5%)")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default="bytes,curve")
    ap.add_argument("--small", action="store_true", help="10M GPT for the bytes part")
    ap.add_argument("--interval", type=int, default=100, help="bytes: steps between the 2nd and 3rd checkpoint")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--steps", type=int, default=200, help="curve: steps before the checkpoint")
    ap.add_argument("--after", type=int, default=200, help="curve: steps after the resume")
    ap.add_argument("--window", type=int, default=20)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--verbose", action="store_true", help="print the loss every 100 steps")
    ap.add_argument("--json", default=str(RESULTS / "ckpt_lossy.json"))
    args = ap.parse_args()
    torch.set_num_threads(2)
    ROOT.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {"argv": sys.argv[1:], "torch": torch.__version__}
    parts = args.parts.split(",")
    try:
        if "curve" in parts:
            part_curve(args, out)
        if "bytes" in parts:
            part_bytes(args, out)
    finally:
        shutil.rmtree(ROOT, ignore_errors=True)
    RESULTS.mkdir(exist_ok=True)
    Path(args.json).write_text(json.dumps(out, default=lambda o: str(o)))
    print(summary(out))


if __name__ == "__main__":
    main()
