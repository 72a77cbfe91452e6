"""LOSSY 4-bit encoding of Adam moments in a checkpoint (opt-in: ``checkpoint.optimizer_encoding: lossy-4bit``).

Why: in a full-training checkpoint the two AdamW moments are 2/3 of the
bytes and barely compress losslessly (~0.83x); a resume needs them only
approximately (they are running averages that training keeps refreshing),
while the weights, step counters and RNG must stay exact. This module is a
transform of the state tree before the (lossless, content-addressed) store
and after restore; the codes it produces are zstd-compressed by the store
like any other bytes.

What is encoded: in every dict of the tree holding both ``exp_avg`` and
``exp_avg_sq`` (the per-parameter state of Adam, AdamW, NAdam, RAdam, ...),
the floating-point tensors ``exp_avg``, ``exp_avg_sq`` and
``max_exp_avg_sq`` with at least ``MIN_NUMEL`` elements. Everything else
(weights, ``step``, SGD momentum, small tensors, non-float tensors) passes
untouched.

Encodings (blocks of ``BLOCK`` values, codes packed two per byte):
- ``exp_avg`` (signed): per block the absmax as bfloat16, each value as the
  nearest of 15 levels of a signed, roughly geometric map (fine near zero,
  where most values are; cf. the dynamic-exponent map of Li et al. 2023,
  "Memory Efficient Optimizers with 4-bit States").
- ``exp_avg_sq`` (non-negative): per block the largest value as bfloat16,
  each value as the nearest of 16 levels ``max * 2**(-1.5 k)`` (k = 0..15:
  sqrt(v) within a factor 2**0.375 everywhere). No value ever
  becomes 0, which would blow up m / sqrt(v): values more than 2**22.5 below
  the block's largest, exact zeros included, become its smallest level (a
  smaller step, never a larger one); only an all-zero block decodes to zeros
  (its ``exp_avg`` is 0 too). A fixed octave grid rather than the block's
  own [min, max] range: most values sit near the top, so the codes have
  ~2.2 bits after zstd instead of ~3.3 and one scale per block suffices
  (measured: the same error of the update m/sqrt(v)).

An encoded tensor is the tagged dict ``{TAG_KEY: <encoding name>, "dtype",
"shape", "block", "codes": uint8, "scales": bfloat16}``; ``decode_state``
refuses a tag it does not know (a checkpoint from a newer hetrun).
"""

from __future__ import annotations

from typing import Any

import torch

from hetrun.errors import CheckpointError

ENCODINGS = ("exact", "lossy-4bit")
TAG_KEY = "__hetrun_lossy__"
SIGNED_TAG = "m4-absmax-geo-v1"
LOG_TAG = "v4-log2-octave-v1"
KNOWN_TAGS = (SIGNED_TAG, LOG_TAG)
BLOCK = 128
MIN_NUMEL = 4096
_MOMENT_KEYS = {"exp_avg": SIGNED_TAG, "exp_avg_sq": LOG_TAG, "max_exp_avg_sq": LOG_TAG}
_FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
# 15 signed levels: 0, then +-1 * 0.6**k; codes 0..14 (15 unused).
_POS = sorted(0.6 ** k for k in range(7))
SIGNED_LEVELS = torch.tensor([-x for x in reversed(_POS)] + [0.0] + _POS, dtype=torch.float32)
# exp_avg_sq levels 1.5 octaves apart (log2 units): sqrt(v) within 2**+-0.375.
# Measured on a GPT's AdamW state (benchmarks/ckpt_lossy.md): 0.5 bit/value
# less than one octave after zstd, the same error of the update m/sqrt(v).
LOG_STEP = 1.5
_TINY = 1e-30  # floor for exp_avg_sq levels: keeps log2 finite and bfloat16 normal


def encode_state(tree: Any, encoding: str = "lossy-4bit") -> tuple[Any, dict[str, Any]]:
    """(tree with moments replaced by tagged dicts, summary for the checkpoint meta).

    ``encoding="exact"`` returns the tree unchanged. The input is not modified.
    """
    if encoding not in ENCODINGS:
        raise CheckpointError(f"checkpoint.optimizer_encoding: unknown encoding {encoding!r}",
                              hint=f"use one of {', '.join(ENCODINGS)}")
    summary: dict[str, Any] = {"optimizer_encoding": encoding, "lossy": encoding != "exact", "encoded_tensors": 0,
               "encoded_values": 0}
    if encoding == "exact":
        return tree, summary

    def walk(obj: Any) -> Any:
        if isinstance(obj, dict):
            adam = "exp_avg" in obj and "exp_avg_sq" in obj
            out = {}
            for k, v in obj.items():
                tag = _MOMENT_KEYS.get(k) if adam and isinstance(k, str) else None
                if tag is not None and _encodable(v):
                    out[k] = encode_signed(v) if tag == SIGNED_TAG else encode_log(v)
                    summary["encoded_tensors"] += 1
                    summary["encoded_values"] += v.numel()
                else:
                    out[k] = walk(v)
            return out
        if isinstance(obj, list):
            return [walk(v) for v in obj]
        if isinstance(obj, tuple):
            return tuple(walk(v) for v in obj)
        return obj

    return walk(tree), summary


def lossy_meta(summary: dict[str, Any]) -> dict[str, Any]:
    """What the checkpoint meta records (nothing for an exact checkpoint)."""
    if not summary.get("lossy"):
        return {}
    return {"lossy": True, "optimizer_encoding": summary["optimizer_encoding"],
            "lossy_parts": "Adam moments (exp_avg, exp_avg_sq) as 4-bit codes; weights, steps, RNG exact",
            "encoded_tensors": summary["encoded_tensors"]}


def decode_state(tree: Any) -> Any:
    """The tree with every tagged dict decoded back into a tensor; other values untouched."""

    def walk(obj: Any, path: str) -> Any:
        if isinstance(obj, dict):
            if TAG_KEY in obj:
                return decode_tensor(obj, path)
            return {k: walk(v, f"{path}[{k!r}]") for k, v in obj.items()}
        if isinstance(obj, list):
            return [walk(v, f"{path}[{i}]") for i, v in enumerate(obj)]
        if isinstance(obj, tuple):
            return tuple(walk(v, f"{path}[{i}]") for i, v in enumerate(obj))
        return obj

    return walk(tree, "state")


def is_encoded(obj: Any) -> bool:
    return isinstance(obj, dict) and TAG_KEY in obj


def _encodable(v: Any) -> bool:
    return isinstance(v, torch.Tensor) and v.dtype in _FLOATS and v.numel() >= MIN_NUMEL


def _blocks(t: torch.Tensor) -> torch.Tensor:
    flat = t.detach().reshape(-1).float()
    pad = (-flat.numel()) % BLOCK
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad)])
    return flat.view(-1, BLOCK)


def _pack(codes: torch.Tensor) -> torch.Tensor:
    c = codes.to(torch.uint8).reshape(-1, 2)
    return (c[:, 0] << 4) | c[:, 1]


def _unpack(packed: torch.Tensor, n: int) -> torch.Tensor:
    out = torch.stack([packed >> 4, packed & 0xF], dim=1).reshape(-1)
    return out[:n].long()


def _tagged(tag: str, t: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor) -> dict[str, Any]:
    return {TAG_KEY: tag, "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
            "block": BLOCK, "codes": _pack(codes), "scales": scales.to(torch.bfloat16).contiguous()}


def encode_signed(t: torch.Tensor) -> dict[str, Any]:
    """exp_avg: per-block absmax (bfloat16) and the nearest signed level."""
    x = _blocks(t)
    scale = x.abs().amax(dim=1).to(torch.bfloat16).float()  # the decoder's scale: quantize against it
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    norm = (x / safe[:, None]).clamp_(-1.0, 1.0)
    levels = SIGNED_LEVELS.to(x.device)
    mids = (levels[1:] + levels[:-1]) / 2
    codes = torch.bucketize(norm, mids)
    return _tagged(SIGNED_TAG, t, codes, scale)


def encode_log(t: torch.Tensor) -> dict[str, Any]:
    """exp_avg_sq: per-block max (bfloat16) and the nearest level ``max * 2**-k``."""
    x = _blocks(t)
    hi = x.amax(dim=1).clamp_min(0.0).to(torch.bfloat16).float()
    lhi = torch.log2(hi.clamp_min(_TINY))
    code = ((lhi[:, None] - torch.log2(x.clamp_min(_TINY))) / LOG_STEP).round_().clamp_(0, 15)
    return _tagged(LOG_TAG, t, code, hi)


def decode_tensor(doc: dict[str, Any], where: str = "state") -> torch.Tensor:
    """One tagged dict back into a tensor of its original dtype and shape."""
    tag = doc.get(TAG_KEY)
    if tag not in KNOWN_TAGS:
        raise CheckpointError(
            f"{where}: optimizer state encoded as {tag!r}, which this hetrun cannot decode "
            f"(known: {', '.join(KNOWN_TAGS)})",
            hint="restore with the hetrun version that wrote the checkpoint, or resume from an exact one")
    try:
        from hetrun.runtime.ckpt.state import _TORCH_DTYPES

        dtype = _TORCH_DTYPES[str(doc["dtype"])]
        shape = [int(s) for s in doc["shape"]]
        block = int(doc["block"])
        codes, scales = doc["codes"], doc["scales"]
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{where}: malformed {tag} entry ({exc!r}); corrupt") from exc
    numel = 1
    for s in shape:
        numel *= s
    nblocks = -(-numel // block) if numel else 0
    want_scales = nblocks
    if (block != BLOCK or not isinstance(codes, torch.Tensor) or not isinstance(scales, torch.Tensor)
            or codes.dtype != torch.uint8 or codes.numel() * 2 != nblocks * block
            or scales.numel() != want_scales):
        raise CheckpointError(f"{where}: {tag} entry has inconsistent sizes (shape {shape}, block {block}); corrupt")
    idx = _unpack(codes, nblocks * block).view(nblocks, block)
    sc = scales.float()
    if tag == SIGNED_TAG:
        vals = SIGNED_LEVELS.to(idx.device)[idx] * sc[:, None]
    else:
        vals = torch.exp2(torch.log2(sc.clamp_min(_TINY))[:, None] - idx.float() * LOG_STEP)
        vals = torch.where(sc[:, None] > 0, vals, torch.zeros_like(vals))  # all-zero block
    return vals.reshape(-1)[:numel].to(dtype).reshape(shape)
