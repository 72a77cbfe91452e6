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

Where blobs live (``MemoryTier``): ``<root>/hetrun-mem/<run key>/rank-<owner>/
<step>.snap``, ``root`` a node-local tmpfs (``$HETRUN_MEMORY_DIR``, default
``/dev/shm``): it outlives the rank's process (a new job step restarts every
rank) but not the node. A node holds its own ranks' snapshots and the replicas
its ranks received from partners on other nodes (runtime/memory_tier.py).
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import json
import os
import re
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hetrun.errors import CheckpointError
from hetrun.rundir import MEMORY_DIR_ENV

from . import state
from .store import fast_digest

MAGIC = b"HRMEMSN2"
FORMAT = "hetrun-memsnap/2"
ENV_DIR = MEMORY_DIR_ENV
DEFAULT_ROOT = "/dev/shm"
_DIGEST_LEN = 32  # xxh3-128 hex
_IDS = struct.Struct("<IQ")  # owner, step
_IDS_AT = len(MAGIC) + 4
_DIGEST_AT = _IDS_AT + _IDS.size
_PREFIX = _DIGEST_AT + _DIGEST_LEN
_HEADER_MAX = 64 << 20
_SNAP_RE = re.compile(r"([0-9]{12})\.snap")
_OWNER_RE = re.compile(r"rank-([0-9]{6})")
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)
_REUSE = os.O_WRONLY | getattr(os, "O_CLOEXEC", 0)  # an old blob's file, overwritten in place
RELIST = 32  # MemoryTier.write lists an owner's directory again after this many writes


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
    sizes = [memoryview(r).nbytes for r in raws]
    out = bytearray(_PREFIX + len(head) + sum(sizes))
    out[:len(MAGIC)] = MAGIC
    struct.pack_into("<I", out, len(MAGIC), len(head))
    _IDS.pack_into(out, _IDS_AT, int(owner), int(step))
    out[_DIGEST_AT:_PREFIX] = fast_digest(head).encode()
    pos = _PREFIX + len(head)
    out[_PREFIX:pos] = head
    view = memoryview(out)
    for r, n in zip(raws, sizes, strict=True):
        view[pos:pos + n] = r
        pos += n
    return out


def _prefix(blob: Any, where: str) -> memoryview:
    """A view of ``blob`` once its magic and prefix length are right."""
    view = memoryview(blob)
    if len(view) < _PREFIX or bytes(view[:len(MAGIC)]) != MAGIC:
        raise CheckpointError(f"{where}: not a memory snapshot (bad magic); corrupt")
    return view


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


def peek(blob: Any, where: str = "memory snapshot") -> tuple[int, int]:
    """(owner, step) from the prefix alone: where a received replica is filed. Not a
    verification: ``verify``/``decode`` check everything before a copy is used."""
    owner, step = _IDS.unpack_from(_prefix(blob, where), _IDS_AT)
    return int(owner), int(step)


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


def run_key(run_dir: str | os.PathLike[str]) -> str:
    """A directory name for one run: its run directory's name and a hash of its full path."""
    p = Path(run_dir).resolve()
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", p.name)[:64] or "run"
    return f"{safe}-{hashlib.sha256(str(p).encode()).hexdigest()[:12]}"


def default_root() -> Path:
    return Path(os.environ.get(ENV_DIR) or DEFAULT_ROOT)


class MemoryTier:
    """This node's snapshots of one run (its own ranks' and the replicas it holds)."""

    def __init__(self, run_dir: str | os.PathLike[str], root: str | os.PathLike[str] | None = None,
                 keep: int = 4) -> None:
        self.dir = Path(root if root is not None else default_root()) / "hetrun-mem" / run_key(run_dir)
        self.keep = max(1, int(keep))
        # ``write``'s: owner -> its directory (made), the steps it holds (sorted), writes since listed.
        self._dirs: dict[int, str] = {}
        self._held: dict[int, list[int]] = {}
        self._writes: dict[int, int] = {}
        self._pid = os.getpid()  # in temporary names: two processes never write the same one

    def path(self, owner: int, step: int) -> Path:
        return self.dir / f"rank-{int(owner):06d}" / f"{int(step):012d}.snap"

    def write(self, owner: int, step: int, blob: Any) -> None:
        """Write atomically (a reader sees a whole blob or none), then keep the newest ``keep``.

        Runs at every snapshot on the training thread (and for every replica received), after the
        step's compute, caches cold: there each system call and each ``pathlib`` object counts
        (15 calls took 0.35 ms; these 5 take 0.23: benchmarks/node_death.md, session 21). So: string
        paths, the owner's directory made once (again if it went), no buffered file object (its
        fstat, ioctl and lseek), and the steps this directory holds remembered, not listed each
        time: one rank writes an owner's directory on a node (the owner, or its one partner
        there), and it lists what an earlier process left at its first write and every
        ``RELIST`` writes after (a file someone else left is pruned within that many)."""
        d = self._dirs.get(owner)
        if d is None:
            d = self._dirs[owner] = os.path.join(str(self.dir), f"rank-{int(owner):06d}")
            os.makedirs(d, exist_ok=True)
        held = self._held.get(owner)
        if held is None or self._writes.get(owner, 0) >= RELIST:
            held = self._held[owner] = self.steps(owner)
            self._writes[owner] = 0
        self._writes[owner] = self._writes.get(owner, 0) + 1
        name = f"{int(step):012d}.snap"
        tmp = os.path.join(d, f".{name}.{self._pid}.tmp")
        fd = -1
        if len(held) >= self.keep and held[0] < step and step not in held:
            # The oldest would be deleted after this write: write into its file instead (renamed
            # out of sight first). Its pages are the tmpfs's already: a third of a new file's
            # cost, which allocates them and frees the old file's (0.11 -> 0.036 ms for the PPO
            # learner's 176 KB; benchmarks/node_death.md, session 24).
            victim = os.path.join(d, f"{held.pop(0):012d}.snap")
            with contextlib.suppress(OSError):
                os.rename(victim, tmp)
                fd = os.open(tmp, _REUSE)
        if fd < 0:
            try:
                fd = os.open(tmp, _CREATE, 0o644)
            except FileNotFoundError:  # the directory went (a finished run's cleanup, a test): make it again
                os.makedirs(d, exist_ok=True)
                held.clear()
                fd = os.open(tmp, _CREATE, 0o644)
            reused = False
        else:
            reused = True
        try:
            done = os.write(fd, blob)
            while done < len(blob):  # a short write (a signal): the rest
                done += os.write(fd, memoryview(blob)[done:])
            if reused:  # the old blob may have been longer
                os.ftruncate(fd, len(blob))
        finally:
            os.close(fd)
        os.replace(tmp, os.path.join(d, name))
        if not held or held[-1] < step:
            held.append(step)
        elif step not in held:  # older than one held (after a restore to an earlier step)
            bisect.insort(held, step)
        while len(held) > self.keep:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(d, f"{held[0]:012d}.snap"))
            del held[0]

    def read(self, owner: int, step: int) -> bytes:
        try:
            return self.path(owner, step).read_bytes()
        except OSError as exc:
            raise CheckpointError(f"memory snapshot of rank {owner} step {step}: {exc}") from exc

    def steps(self, owner: int) -> list[int]:
        try:
            names = os.listdir(self.dir / f"rank-{int(owner):06d}")
        except OSError:
            return []
        return sorted(int(m.group(1)) for n in names if (m := _SNAP_RE.fullmatch(n)))

    def held(self) -> dict[int, list[int]]:
        """owner rank -> the steps this node holds of it."""
        try:
            names = os.listdir(self.dir)
        except OSError:
            return {}
        out = {}
        for n in names:
            m = _OWNER_RE.fullmatch(n)
            if m and (steps := self.steps(int(m.group(1)))):
                out[int(m.group(1))] = steps
        return out
