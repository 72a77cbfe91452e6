"""Which encoding for checkpoint chunks? Measured on a real training state.

    python benchmarks/ckpt_codec_params.py [--small]

Trains the GPT of ckpt_bench.py for a few AdamW steps (every embedding row
touched), then encodes the whole state's float bytes (single thread) with:
  zstd-1            plain zstd level 1 on interleaved bytes
  planes-l1         byte planes, zstd level 1 per plane, raw when a sample shows <5% gain
  planes-fast       byte planes, zstd fast strategy with shallow search (the default)
  planes-fast-99    same, compress planes down to 1% gain
  ... +rot          the same after rotating each fp32 word left by 1 bit
                    (exponent in one plane, sign in the lowest), the writer's
                    transform (codec.ROTATE)
and, against the state 1, 10 and 100 steps earlier, the per-plane delta
choice the writer uses: XOR (the previous format) or bytewise difference
mod 256 (codec.DELTA_SUB, the default), with and without the rotation. Ratios are of the raw bytes;
MB/s of raw bytes per thread.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
import zstandard

sys.path.insert(0, str(Path(__file__).parent))

from ckpt_bench import GPT, full_state, tensors_of, train
from hetrun.runtime.ckpt import codec


def floats(st: object) -> list[np.ndarray]:
    return [t.detach().reshape(-1).contiguous().view(torch.uint8).numpy().copy()
            for t in tensors_of(st) if t.dtype == torch.float32 and t.numel() > 1]


def chunks(arrs: list[np.ndarray], size: int = 4 << 20) -> list[np.ndarray]:
    return [a[i : i + size] for a in arrs for i in range(0, a.size, size)]


def run(name: str, cur: list[np.ndarray], fn) -> None:  # type: ignore[no-untyped-def]
    sys.stdout.flush()
    raw = sum(c.size for c in cur)
    t0 = time.perf_counter()
    out = sum(fn(i, c) for i, c in enumerate(cur))
    dt = time.perf_counter() - t0
    print(f"{name:34s} {out / raw:6.3f}x  {raw / dt / 1e6:6.0f} MB/s")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", action="store_true")
    args = ap.parse_args()
    vocab, dim, layers, heads, seq = (8000, 256, 12, 4, 32) if args.small else (32000, 768, 12, 12, 64)
    torch.set_num_threads(2)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    model = GPT(vocab, dim, layers, heads, seq)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    train(model, opt, 3, vocab, seq, gen)
    s0 = chunks(floats(full_state(model, opt)))
    train(model, opt, 1, vocab, seq, gen)
    s1 = chunks(floats(full_state(model, opt)))
    train(model, opt, 9, vocab, seq, gen)
    s10 = chunks(floats(full_state(model, opt)))
    train(model, opt, 90, vocab, seq, gen)
    s100 = chunks(floats(full_state(model, opt)))
    print(f"state: {sum(c.size for c in s0) / 1e6:.0f} MB of float32 bytes")

    z1 = zstandard.ZstdCompressor(level=1)
    run("zstd-1", s0, lambda i, c: len(z1.compress(c.data)))

    def planes(cctx: zstandard.ZstdCompressor, below: float, rot: bool):  # type: ignore[no-untyped-def]
        def fn(i: int, c: np.ndarray) -> int:
            old = codec.COMPRESS_IF_BELOW
            codec.COMPRESS_IF_BELOW = below
            try:
                return codec.encode(c, 4, None, compressor=cctx, rot=rot).stored_len
            finally:
                codec.COMPRESS_IF_BELOW = old
        return fn

    fast = codec.new_compressor()
    for rot in (False, True):
        tag = " +rot" if rot else ""
        run("planes-l1" + tag, s0, planes(z1, 0.95, rot))
        run("planes-fast" + tag, s0, planes(fast, 0.95, rot))
        run("planes-fast-99" + tag, s0, planes(fast, 0.99, rot))
    for label, later in (("1 step", s1), ("10 steps", s10), ("100 steps", s100)):
        for rot in (False, True):
            tag = " +rot" if rot else ""
            for sub in (False, True):
                run(f"{'diff' if sub else 'xor'}-per-plane, {label}{tag}", later,
                    lambda i, c, rot=rot, sub=sub: codec.encode(  # type: ignore[misc]
                        c, 4, s0[i], compressor=fast, rot=rot, sub=sub).stored_len)
            run(f"planes only, {label}{tag}", later,
                lambda i, c, rot=rot: codec.encode(c, 4, None, compressor=fast, rot=rot).stored_len)  # type: ignore[misc]


if __name__ == "__main__":
    main()
