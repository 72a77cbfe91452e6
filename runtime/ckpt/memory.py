"""The memory tier: one rank's state at one step as a self-checking blob in node-local memory.

Why a blob and not the store's objects: a snapshot must be usable alone, on
whichever node still holds it. The store's incremental encoding (XOR delta +
zstd against the previous checkpoint's chunk) would tie each replica to a base
that has to survive on the same node; here each snapshot is the raw bytes of
the state tree, so any one copy restores it. What is shared with the store:
the tree's pickle-free form (``state.flatten``: a JSON skeleton plus raw
tensors) and its chunk checksum (``store.fast_digest``, xxh3-128), one per
tensor, plus one over the header.

Blob: ``MAGIC`` + 4-byte little-endian header length + the owner (u32) and
step (u64), little-endian + the header's digest (32 ASCII hex) + JSON header +
the tensors' bytes back to back. The header holds the step, the owner (global
rank), the skeleton, the leaves and their digests. ``verify`` checks every
digest without building tensors, and that the prefix's owner and step are the
header's; ``decode`` checks them too, so a flipped byte anywhere is a
``CheckpointError``, never a silently wrong state. ``peek`` reads only the
prefix: a partner receiving a replica files it by owner and step without
parsing the header (the restore verifies every copy it reads before use).

Where blobs live (``MemoryTier``, runtime/ckpt/memory_slots.py, re-exported here): ``keep``
mapped slots per owner on a node-local tmpfs (``$HETRUN_MEMORY_DIR``, default ``/dev/shm``),
which outlive the rank's process but not the node. A node holds its own ranks' snapshots and
the replicas its ranks' keepers received from partners on other nodes (runtime/memory_tier.py).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

from hetrun.errors import CheckpointError

from . import state
from .memory_slots import (  # noqa: F401  (re-exported: the tier's names, one import for its users)
    _DIGEST_AT,
    _IDS,
    _IDS_AT,
    _PREFIX,
    DEFAULT_ROOT,
    ENV_DIR,
    MAGIC,
    SLOT_HEAD,
    MemoryTier,
    _prefix,
    default_root,
    peek,
    run_key,
)
from .store import fast_digest

FORMAT = "hetrun-memsnap/2"
_HEADER_MAX = 64 << 20


def _raw_bytes(t: Any) -> np.ndarray:
    """A uint8 view (or copy, for a device tensor) of one flattened tensor's bytes."""
    t = t.detach().resolve_conj().resolve_neg()  # the values, not a conj/neg view's memory (state.flatten)
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    if t.numel() == 0:
        return np.empty(0, np.uint8)
    import torch

    return t.reshape(-1).view(torch.uint8).numpy()


def encode(step: int, owner: int, tree: Any, meta: dict[str, Any] | None = None) -> bytearray:
    """The blob of ``tree`` (a state tree ``state.flatten`` accepts) at ``step`` of rank ``owner``."""
    skeleton, tensors, leaves = state.flatten(tree)
    raws = [_raw_bytes(t) for t in tensors]
    header = {"format": FORMAT, "step": int(step), "owner": int(owner), "meta": meta or {},
              "skeleton": skeleton, "leaves": [vars(leaf) for leaf in leaves],  # asdict's doc; 10x cheaper (flat fields)
              "digests": [fast_digest(r) for r in raws]}
    head = json.dumps(header, separators=(",", ":")).encode()
    return assemble(step, owner, head, [r.data if r.nbytes else b"" for r in raws])


def assemble(step: int, owner: int, head: bytes, raws: Sequence[Any]) -> bytearray:
    """The blob's framing around ``head`` (the header's JSON, encoded) and ``raws`` (flat byte
    buffers in the header's leaf order): magic, header length, owner and step, the header's
    digest, then the header and the payload. ``encode``'s, and the fast encoder's
    (memory_encode.py), so both write the same bytes."""
    out = bytearray(framed_size(head, raws))
    assemble_into(memoryview(out), step, owner, head, raws)
    return out


def framed_size(head: bytes, raws: Sequence[Any]) -> int:
    """The length of ``assemble``'s blob."""
    return _PREFIX + len(head) + sum(memoryview(r).nbytes for r in raws)


def assemble_into(out: memoryview, step: int, owner: int, head: bytes, raws: Sequence[Any]) -> None:
    """``assemble``'s bytes written into ``out`` (exactly ``framed_size`` bytes): a node's slot,
    with no blob of its own in between (runtime/ckpt/memory_slots.py ``write_with``)."""
    out[:len(MAGIC)] = MAGIC
    struct.pack_into("<I", out, len(MAGIC), len(head))
    _IDS.pack_into(out, _IDS_AT, int(owner), int(step))
    out[_DIGEST_AT:_PREFIX] = fast_digest(head).encode()
    pos = _PREFIX + len(head)
    out[_PREFIX:pos] = head
    for r in raws:
        n = memoryview(r).nbytes
        out[pos:pos + n] = r
        pos += n


def _header(blob: Any, where: str) -> tuple[dict[str, Any], int]:
    """The verified header and where the payload starts."""
    view = _prefix(blob, where)
    (n,) = struct.unpack_from("<I", view, len(MAGIC))
    if n > _HEADER_MAX or _PREFIX + n > len(view):
        raise CheckpointError(f"{where}: header length {n} out of range; corrupt")
    head = view[_PREFIX:_PREFIX + n]
    if fast_digest(head).encode() != bytes(view[_DIGEST_AT:_PREFIX]):
        raise CheckpointError(f"{where}: header checksum mismatch; corrupt")
    try:
        doc = json.loads(bytes(head))
    except ValueError as exc:
        raise CheckpointError(f"{where}: header is not JSON; corrupt") from exc
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise CheckpointError(f"{where}: unknown format {doc.get('format') if isinstance(doc, dict) else doc!r}")
    owner, step = _IDS.unpack_from(view, _IDS_AT)
    if (owner, step) != (doc.get("owner"), doc.get("step")):
        raise CheckpointError(f"{where}: prefix names rank {owner} step {step}, header rank {doc.get('owner')} "
                              f"step {doc.get('step')}; corrupt")
    return doc, _PREFIX + n


def _spans(doc: dict[str, Any], start: int, size: int, where: str) -> list[tuple[state.Leaf, int, str]]:
    leaves = [state.leaf_from_doc(d, f"{where}: leaves[{i}]") for i, d in enumerate(doc.get("leaves") or [])]
    digests = doc.get("digests") or []
    if len(digests) != len(leaves):
        raise CheckpointError(f"{where}: {len(digests)} digests for {len(leaves)} tensors; corrupt")
    out, pos = [], start
    for leaf, d in zip(leaves, digests, strict=True):
        out.append((leaf, pos, str(d)))
        pos += leaf.nbytes
    if pos != size:
        raise CheckpointError(f"{where}: payload is {size - start} bytes, the header says {pos - start}; corrupt")
    return out


def verify(blob: Any, where: str = "memory snapshot") -> dict[str, Any]:
    """Check every checksum of ``blob``; return its header (step, owner, meta). Raises CheckpointError."""
    doc, start = _header(blob, where)
    view = memoryview(blob)
    for i, (leaf, pos, d) in enumerate(_spans(doc, start, len(view), where)):
        if fast_digest(view[pos:pos + leaf.nbytes]) != d:
            raise CheckpointError(f"{where}: tensor {i} checksum mismatch; corrupt")
    return {k: doc[k] for k in ("step", "owner", "meta")}


def decode(blob: Any, where: str = "memory snapshot") -> tuple[dict[str, Any], Any]:
    """(header, the state tree) of a verified ``blob``; fresh tensors (never unpickles)."""
    doc, start = _header(blob, where)
    view = memoryview(blob)
    values = []
    for i, (leaf, pos, d) in enumerate(_spans(doc, start, len(view), where)):
        piece = view[pos:pos + leaf.nbytes]
        if fast_digest(piece) != d:
            raise CheckpointError(f"{where}: tensor {i} checksum mismatch; corrupt")
        value, raw = state.empty_for(leaf)
        if leaf.nbytes:
            raw[:] = np.frombuffer(piece, np.uint8)
        values.append(value)
    return {k: doc[k] for k in ("step", "owner", "meta")}, state.unflatten(doc["skeleton"], values)
