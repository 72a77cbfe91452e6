"""Codec encode/decode throughput per core vs a plain memory copy, side by side in one run.

    python benchmarks/kernels_codec.py [--mb 64] [--reps 7]

One thread. Input: ``mb`` MB of fp32. Throughput = input (fp32) bytes per
second, for encode and decode; ``x memcpy`` divides by the copy of the same
fp32 buffer into a pre-touched destination (numpy ``copyto``), measured in the
same rounds (each round times every row once; medians over rounds). Paths:
``native`` (the C kernels), ``numpy`` (cache-blocked fallback; for fp8 the
fallback is torch's float8 cast in cache-sized pieces, ``torch``),
``torch-ref`` (the plain PyTorch reference, i.e. a naive torch version).
Also prints the break-even link speed of each codec (runtime/comms/bandwidth.py's
model, no overlap) for the native path.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=64)
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    torch.set_num_threads(1)
    from hetrun.kernels.codecs import native as codec_native
    from hetrun.kernels.codecs import reference as codec_reference
    from hetrun.kernels.codecs.registry import get_codec
    from hetrun.runtime.comms.bandwidth import CodecSpeed, break_even_bandwidth

    n = (args.mb << 20) // 4
    x = torch.randn(n)
    xn = x.numpy()
    dst = np.empty_like(xn)
    dst.fill(0)
    out = torch.empty(n)
    out.fill_(0)
    rows: dict[str, list[float]] = {}
    ops = {}
    ops["memcpy (np.copyto)"] = lambda: np.copyto(dst, xn)
    ops["memcpy (torch copy_)"] = lambda: out.copy_(x)
    # (row label, codec, options): the block-256 fp32-scale codecs, and the MoE defaults'
    # block-64 bf16-scale variants (runtime/comms/compressed.DIRECTION_DEFAULTS)
    variants = [
        ("onebit", "onebit", {}),
        ("onebit_ef", "onebit_ef", {}),
        ("int8", "int8", {}),
        ("onebit_ef b64/bf16", "onebit_ef", {"block_size": 64, "scale_dtype": "bf16"}),
        ("int8 b64/bf16", "int8", {"block_size": 64, "scale_dtype": "bf16"}),
        ("int4 b64/bf16", "int4", {"block_size": 64, "scale_dtype": "bf16"}),
        ("onebit_stochastic", "onebit_stochastic", {}),
        ("fp8", "fp8", {}),
    ]
    for label, name, opts in variants:
        codec = get_codec(name, **opts)
        payload = torch.zeros(codec.wire_bytes(n), dtype=torch.uint8)
        state = codec.new_state() if codec.stateful else None
        # without the C kernels fp8 and int4 fall back to torch, the others to numpy
        paths = ["native", "torch"] if name in ("fp8", "int4") else ["native", "numpy"]
        for path in paths:
            def enc(c=codec, p=payload, s=state, path=path) -> None:
                os.environ["HETRUN_NATIVE_CODECS"] = "1" if path == "native" else "0"
                c.encode_into(x, p, s)

            def dec(c=codec, p=payload, path=path) -> None:
                os.environ["HETRUN_NATIVE_CODECS"] = "1" if path == "native" else "0"
                c.decode_into(p, out)

            ops[f"{label} encode [{path}]"] = enc
            ops[f"{label} decode [{path}]"] = dec
    ref_n = n // 8  # the naive reference is slow; time it on 1/8 and scale
    xr = x[:ref_n]
    pr = codec_reference.onebit_encode(xr, 256)
    ops["onebit encode [torch-ref]"] = lambda: codec_reference.onebit_encode(xr, 256)
    ops["onebit decode [torch-ref]"] = lambda: codec_reference.onebit_decode(pr, ref_n, 256)
    scale = {k: (8.0 if "torch-ref" in k else 1.0) for k in ops}
    for f in ops.values():
        f()
    for _ in range(args.reps):
        for k, f in ops.items():
            t0 = time.perf_counter()
            f()
            rows.setdefault(k, []).append((time.perf_counter() - t0) * scale[k])
    os.environ.pop("HETRUN_NATIVE_CODECS", None)
    med = {k: statistics.median(v) for k, v in rows.items()}
    base = med["memcpy (np.copyto)"]
    print(f"{args.mb} MB fp32, 1 thread, {args.reps} rounds, native C built: {codec_native.lib() is not None}")
    print(f"{'op':40s} {'ms':>8s} {'GB/s':>7s} {'x memcpy':>9s}")
    for k, t in med.items():
        print(f"{k:40s} {t * 1e3:8.2f} {n * 4 / t / 1e9:7.2f} {base / t:9.2f}")
    print()
    for name in ("onebit", "int8"):
        sp = CodecSpeed(n * 4 / med[f"{name} encode [native]"], n * 4 / med[f"{name} decode [native]"], get_codec(name).ratio(n))
        print(f"break-even link speed, {name} [native], no overlap: {break_even_bandwidth(sp) * 8 / 1e9:.1f} Gbit/s")


if __name__ == "__main__":
    main()
