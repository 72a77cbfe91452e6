"""Reading the checkpoint store: list, load one rank's shard with verification,
agree on the newest checkpoint every rank can load, verify, retention, GC.

A checkpoint exists when its manifest exists (written last, after every
rank's shard was complete). Loading decodes every chunk and checks it against
the XXH3-128 digest its shard records (the manifest's sha256 protects the
shard; shards written before record BLAKE3) or, for shards without one and in
``verify``, its object name (BLAKE3, or sha256 for shards that say
``"names": "sha256"`` or nothing), so a flipped byte or a missing chunk makes
that checkpoint invalid; ``restore`` then falls back to the previous one and says
why in ``RestoreResult.skipped``.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import blake3
import numpy as np
import xxhash
import zstandard
from hetrun.runtime.ckpt import codec, objects, zstd_direct
from hetrun.runtime.ckpt.collective import Collective, SoloCollective
from hetrun.runtime.ckpt.objects import MAX_CHAIN, ReadBuffer, Tier, atomic_write, check_hash

from hetrun.errors import CheckpointError

# Objects are mapped, not read: saves a copy of every raw plane (see Tier.map_object).
USE_MMAP = True
# A delta plane needs only the same plane of its base, recursively: decode
# per plane down the chain instead of every plane of every base (False: the
# previous whole-object walk, kept for side-by-side measurement).
LAZY_CHAIN = True
# Verify decoded chunks with the fast digest the shard records; shards
# without one, and `verify`, use the object name (a BLAKE3 or sha256 hash).
# XXH3-128 runs at ~30 GB/s here against BLAKE3's 4.8 and sha256's 1.8:
# restore's verify stage for the 1.6 GB GPT state went 0.29 -> ~0.05
# thread-s. A checksum suffices for what this check is for (a flipped or torn
# byte, a wrong file): whoever can rewrite objects can rewrite the shard's
# digests as well, whatever their strength; the content addresses stay
# cryptographic hashes.
FAST_VERIFY = True


def _blake3(data: Any) -> str:
    return blake3.blake3(data, max_threads=1).hexdigest()


# Shard field -> (hex length, function); the writer records FAST_KIND, older
# shards carry "blake3".
FAST_KIND = "xxh3"
_FAST_DIGESTS: dict[str, tuple[int, Any]] = {"xxh3": (32, xxhash.xxh3_128_hexdigest), "blake3": (64, _blake3)}
_HEX = frozenset("0123456789abcdef")


def fast_digest(data: Any) -> str:
    """The digest the writer records for a chunk under ``FAST_KIND``."""
    return _FAST_DIGESTS[FAST_KIND][1](data)


# Object names: the hash of a chunk's raw bytes. BLAKE3 (4.8 GB/s per thread
# here) for new objects; sha256 (1.8 GB/s with SHA-NI) in stores written
# before, whose shards carry no "names" field. The writer's hash stage for
# the 1.6 GB GPT state went 1.3-1.5 -> ~0.5 thread-s.
NAME_HASH = "blake3"
_NAME_HASHES: dict[str, Any] = {"blake3": _blake3, "sha256": objects.digest}


def object_name(data: Any) -> str:
    """The name the writer gives a chunk's object (``NAME_HASH`` of its raw bytes)."""
    return _NAME_HASHES[NAME_HASH](data)


# Decompress planes with libzstd's one-shot call straight into the plane
# buffer (zstd_direct) rather than python-zstandard's streaming reader, which
# copies every plane once more out of zstd's window.
DIRECT_ZSTD = True


# Fault in each fresh output chunk with one madvise call (see _populate_write).
PREFAULT_OUTPUT = True
# Fault mapped objects in up front (MAP_POPULATE / MADV_POPULATE_READ). Off:
# those populate page by page, while faults taken inside the decode and
# un-plane loops map 64 KiB of page cache each (fault-around): read stage
# 0.35 vs 0.49 thread-s for the 1.6 GB GPT state (benchmarks/ckpt.md).
POPULATE_MAPS = False
_MADV_POPULATE_WRITE = 23  # Linux >= 5.14
_madvise: Any = None
with contextlib.suppress(OSError, AttributeError):
    _madvise = ctypes.CDLL(None, use_errno=True).madvise
    _madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    _madvise.restype = ctypes.c_int


def _populate_write(out: np.ndarray) -> None:
    """Fault in a fresh output buffer with one call: restored tensors are new
    memory, and a page fault per 4 KiB inside the un-plane loop cost about
    twice as much (measured: 0.15 s vs 0.28 s per 400 MB). Transparent huge
    pages (MADV_HUGEPAGE first) measured slower in a fresh process here:
    0.8 vs 0.55 thread-s for 1.6 GB (direct compaction)."""
    global _madvise
    if not PREFAULT_OUTPUT or _madvise is None or out.size < (1 << 20):
        return
    addr = out.ctypes.data
    end = addr + out.size
    start = addr - addr % mmap.PAGESIZE
    if _madvise(start, end - start, _MADV_POPULATE_WRITE) != 0:
        _madvise = None  # an older kernel: ordinary page faults from now on


@dataclass
class _Node:
    """One object of a delta chain, mapped but not decoded."""

    h: str
    payload: memoryview
    lay: codec.Layout
    modes: list[tuple[str, int]]
    offsets: list[int]
    populated: bool
    base_h: str | None
    base: _Node | None = None
    # Set when the base was planed differently: its planes moved into this
    # object's plane space, decoded whole (rare: a dtype change between saves).
    rebased: list[np.ndarray] | None = None


class _DecodeCtx:
    """One decoding thread's reused buffers (per chain depth) and stage timers."""

    def __init__(self) -> None:
        self.dctx = zstandard.ZstdDecompressor()
        self.direct = zstd_direct.DirectDecompressor() if DIRECT_ZSTD and zstd_direct.available() else None
        self._reads: dict[int, ReadBuffer] = {}
        self._scratch = codec.Scratch()
        self.times: dict[str, float] = {}

    def read_buf(self, depth: int) -> ReadBuffer:
        b = self._reads.get(depth)
        if b is None:
            b = self._reads[depth] = ReadBuffer()
        return b

    def scratch(self, key: object, n: int) -> np.ndarray:
        return self._scratch.get(key, n)

    def add(self, stage: str, since: float) -> None:
        self.times[stage] = self.times.get(stage, 0.0) + time.perf_counter() - since


@dataclass
class RestoreResult:
    step: int
    state: Any
    tier: str
    meta: dict[str, Any]
    seconds: float
    skipped: list[tuple[int, str]] = field(default_factory=list)


@dataclass
class CheckpointInfo:
    step: int
    tiers: list[str]
    world_size: int
    created: float
    raw_bytes: int
    stored_bytes: int
    stall_s: float
    write_s: float
    meta: dict[str, Any]

    @property
    def delta_ratio(self) -> float:
        return self.stored_bytes / self.raw_bytes if self.raw_bytes else 0.0


def _layout(h: str, header: dict[str, Any], nbytes: int) -> tuple[codec.Layout, list[tuple[str, int]]]:
    """An object header's plane layout and plane modes, checked against the expected length."""
    if int(header.get("raw_len", -1)) != nbytes:
        raise CheckpointError(f"chunk {h[:16]}… has length {header.get('raw_len')}, expected {nbytes}; corrupt")
    xf = header.get("xf")
    if xf not in codec.TRANSFORMS:
        raise CheckpointError(f"chunk {h[:16]}… uses transform {xf!r}, unknown to this hetrun version",
                              hint="restore with the hetrun version that wrote the checkpoint")
    itemsize = int(header.get("itemsize", 1))
    # Objects before the transform tags: a rotation only where the item size allowed it.
    lay = codec.layout_of(itemsize, nbytes, xf if xf != codec.ROT_TAG or codec.rotates(itemsize, True) else None)
    modes = [(str(m), int(n)) for m, n in header.get("planes", [])]
    return lay, modes


def _fast_digests(td: dict[str, Any], n: int, where: str) -> list[tuple[str, str]] | None:
    """The shard's fast digest of every chunk of a tensor, or None (a shard
    written before them: the object names are checked instead)."""
    for kind, (length, _) in _FAST_DIGESTS.items():
        got = td.get(kind)
        if got is None:
            continue
        if not isinstance(got, list) or len(got) != n:
            raise CheckpointError(f"{where}.{kind} does not match its chunk list; corrupt")
        for d in got:
            if not isinstance(d, str) or len(d) != length or not _HEX.issuperset(d):
                raise CheckpointError(f"{where}.{kind}: {d!r} is not a {kind} digest; the shard is corrupt")
        return [(kind, d) for d in got]
    return None


class CheckpointStore:
    """The read side over one or more tiers (e.g. node-local first, then shared)."""

    def __init__(self, tiers: list[Tier], *, threads: int = 2) -> None:
        if not tiers:
            raise CheckpointError("a checkpoint store needs at least one directory")
        self.tiers = tiers
        self.threads = max(1, threads)
        self._lock = threading.Lock()
        self._ctxs: list[_DecodeCtx] = []
        self._free: list[_DecodeCtx] = []

    # -- listing ---------------------------------------------------------------
    def steps(self) -> list[int]:
        """Steps with a manifest in any tier, newest first."""
        found: set[int] = set()
        for t in self.tiers:
            found.update(t.manifest_steps())
        return sorted(found, reverse=True)

    def info(self) -> list[CheckpointInfo]:
        rows = []
        for step in sorted(self.steps()):
            doc, names = None, []
            for t in self.tiers:
                if step in t.manifest_steps():
                    try:
                        d = t.read_manifest(step)
                    except CheckpointError:
                        continue
                    doc = doc or d
                    names.append(t.name)
            if doc is None:
                continue
            stats = [s.get("stats", {}) for s in doc["shards"]]
            rows.append(CheckpointInfo(
                step=step, tiers=names, world_size=int(doc["world_size"]),
                created=float(doc.get("created", 0.0)),
                raw_bytes=sum(int(s.get("raw_bytes", 0)) for s in stats),
                stored_bytes=sum(int(s.get("stored_bytes", 0)) for s in stats),
                stall_s=max((float(s.get("stall_s", 0.0)) for s in stats), default=0.0),
                write_s=max((float(s.get("write_s", 0.0)) for s in stats), default=0.0),
                meta=doc.get("meta", {}),
            ))
        return rows

    # -- loading -----------------------------------------------------------------
    def _take_ctx(self) -> _DecodeCtx:
        # Contexts (buffers) outlive the per-restore pool's threads: reused, not refaulted.
        with self._lock:
            if self._free:
                return self._free.pop()
            ctx = _DecodeCtx()
            self._ctxs.append(ctx)
            return ctx

    def _planes_of(self, h: str, nbytes: int, tier: Tier, depth: int, ctx: _DecodeCtx
                   ) -> tuple[list[np.ndarray], codec.Layout]:
        """Object ``h``'s planes in plane space, its chain decoded by updating
        planes in place (no interleave per chain level). Returns (planes, layout)."""
        if depth > MAX_CHAIN:
            raise CheckpointError(f"chunk {h[:16]}… has a delta chain longer than {MAX_CHAIN}; corrupt")
        t = time.perf_counter()
        if USE_MMAP:
            header, payload = tier.map_object(h)
        else:
            header, payload = tier.read_object(h, into=ctx.read_buf(depth))
        ctx.add("read", t)
        lay, modes = _layout(h, header, nbytes)
        base_planes = None
        if header.get("base"):
            base_h = check_hash(header["base"], f"chunk {h[:16]}… base")
            bp, b_lay = self._planes_of(base_h, nbytes, tier, depth + 1, ctx)
            if b_lay != lay:
                bp = self._replane(bp, b_lay, lay, nbytes, depth, ctx)
            base_planes = bp
        t = time.perf_counter()
        planes = codec.decode_planes(payload, lay, modes, base_planes,
                                     decompressor=ctx.dctx, scratch=ctx.scratch(("xor", depth), nbytes))
        ctx.add("decode", t)
        return planes, lay

    def _replane(self, planes: list[np.ndarray], src: codec.Layout, dst: codec.Layout, nbytes: int,
                 depth: int, ctx: _DecodeCtx) -> list[np.ndarray]:
        """A base planed differently (another item size or transform): back to
        bytes, then into the layout of the object built on it."""
        t = time.perf_counter()
        raw = ctx.scratch(("rebase", depth), nbytes)
        src.merge(planes, raw)
        flat = ctx.scratch(("replane", depth), nbytes)
        dst.split(raw, flat)
        ctx.add("rebase", t)
        return dst.views(flat)

    def _open(self, h: str, nbytes: int, tier: Tier, depth: int, ctx: _DecodeCtx, *, populate: bool) -> _Node:
        if depth > MAX_CHAIN:
            raise CheckpointError(f"chunk {h[:16]}… has a delta chain longer than {MAX_CHAIN}; corrupt")
        t = time.perf_counter()
        header, payload = tier.map_object(h, populate=populate)
        ctx.add("read", t)
        lay, modes = _layout(h, header, nbytes)
        offsets = codec.plane_offsets(len(payload), modes, lay)
        base_h = check_hash(header["base"], f"chunk {h[:16]}… base") if header.get("base") else None
        return _Node(h, payload, lay, modes, offsets, populate, base_h)

    def _plane(self, node: _Node, i: int, nbytes: int, tier: Tier, depth: int, ctx: _DecodeCtx) -> np.ndarray:
        """Plane ``i`` of ``node`` in its plane space, decoding only plane ``i``
        of each base down the chain (the other planes are never read)."""
        mode, stored = node.modes[i]
        start = node.offsets[i]
        if not node.populated and POPULATE_MAPS:
            t = time.perf_counter()
            objects.prefault(node.payload, start, stored)
            ctx.add("read", t)
        base_plane = None
        if mode[0] in "xd":
            base_plane = self._base_plane(node, i, nbytes, tier, depth, ctx)
        t = time.perf_counter()
        n, at = node.lay.lengths[i], node.lay.offsets[i]
        plane = codec.decode_plane(node.payload[start : start + stored], mode, stored, n, base_plane,
                                   decompressor=ctx.dctx, target=ctx.scratch(("xor", depth), nbytes)[at : at + n],
                                   zbuf=ctx.scratch("z", n), direct=ctx.direct)
        ctx.add("decode", t)
        return plane

    def _base_plane(self, node: _Node, i: int, nbytes: int, tier: Tier, depth: int, ctx: _DecodeCtx) -> np.ndarray:
        if node.base_h is None:
            raise CheckpointError(f"chunk {node.h[:16]}… is a delta without a base; corrupt")
        if node.base is None:
            node.base = self._open(node.base_h, nbytes, tier, depth + 1, ctx, populate=False)
        b = node.base
        if b.lay == node.lay:
            return self._plane(b, i, nbytes, tier, depth + 1, ctx)
        if node.rebased is None:
            # The base was planed differently (another item size or transform).
            bp = [self._plane(b, j, nbytes, tier, depth + 1, ctx) for j in range(len(b.lay.lengths))]
            node.rebased = self._replane(bp, b.lay, node.lay, nbytes, depth, ctx)
        return node.rebased[i]

    def _decode_object(self, h: str, out: np.ndarray, prefer: Tier, fast: tuple[str, str] | None,
                       names: str) -> None:
        ctx = self._take_ctx()
        try:
            self._decode_with(ctx, h, out, prefer, fast, names)
        finally:
            with self._lock:
                self._free.append(ctx)

    def _decode_with(self, ctx: _DecodeCtx, h: str, out: np.ndarray, prefer: Tier,
                     fast: tuple[str, str] | None, names: str) -> None:
        """Decode object ``h`` into ``out`` and check it: against ``fast`` (the
        kind and value of its digest in the shard) when given, else its name
        (hashed with ``names``, "blake3" or "sha256")."""
        last: CheckpointError | None = None
        for tier in [prefer, *[t for t in self.tiers if t is not prefer]]:
            try:
                if LAZY_CHAIN and USE_MMAP:  # partial reads need the mapping
                    node = self._open(h, out.size, tier, 0, ctx, populate=POPULATE_MAPS)
                    planes = [self._plane(node, i, out.size, tier, 0, ctx) for i in range(len(node.lay.lengths))]
                    lay = node.lay
                    del node  # drops the chain's mappings before the next object
                else:
                    planes, lay = self._planes_of(h, out.size, tier, 0, ctx)
                t = time.perf_counter()
                _populate_write(out)
                ctx.add("fault", t)
                t = time.perf_counter()
                lay.merge(planes, out)
                del planes
                ctx.add("unplane", t)
                t = time.perf_counter()
                if fast is not None:
                    ok = _FAST_DIGESTS[fast[0]][1](out.data) == fast[1]
                else:
                    ok = _NAME_HASHES[names](out.data) == h
                ctx.add("verify", t)
                if not ok:
                    raise CheckpointError(f"chunk {h[:16]}… in {tier.root} does not match its hash; corrupt")
                return
            except CheckpointError as exc:
                last = exc
            except (ValueError, TypeError, KeyError) as exc:
                last = CheckpointError(f"chunk {h[:16]}… in {tier.root} is malformed ({exc}); corrupt")
        assert last is not None
        raise last

    def decode_chunk(self, h: str, out: np.ndarray, *, names: str = NAME_HASH) -> None:
        """Object ``h`` decoded (its delta chain too) into ``out`` (uint8, the chunk's raw
        length) and checked against its name, from the first tier that has it right
        (the object uploader re-encodes a chunk from these bytes)."""
        if names not in _NAME_HASHES:
            raise CheckpointError(f"objects named with {names!r}, unknown to this hetrun version")
        self._decode_object(check_hash(h, "object name"), out, self.tiers[0], None, names)

    def load_rank(self, step: int, rank: int, *, full_hash: bool = False,
                  into: Any = None) -> tuple[Any, dict[str, Any], Tier]:
        """Rank ``rank``'s state at ``step`` from the first tier where it verifies.
        ``full_hash``: check every chunk against its name (a BLAKE3 or sha256
        hash) even where the shard records a (faster) digest. ``into``: a live state of the same
        structure (e.g. the workload's ``state_dict()``); tensors of it that fit
        (same place, dtype and shape, CPU, contiguous) are decoded into in
        place and returned, instead of fresh memory that would then be copied
        over them. A load that fails leaves them partly overwritten: restore
        then loads an older checkpoint into them, or raises."""
        errors = []
        for tier in self.tiers:
            if step not in tier.manifest_steps():
                continue
            try:
                man = tier.read_manifest(step)
                if rank >= int(man["world_size"]):
                    raise CheckpointError(
                        f"checkpoint {step} was written by {man['world_size']} ranks, this is rank {rank}",
                        hint="resume with the same number of ranks per component",
                    )
                entry = man["shards"][rank]
                shard = tier.read_shard(entry["path"], entry["sha256"], f"{tier.manifest_path(step)}: shards[{rank}]")
                return self._load_shard(shard, tier, full_hash=full_hash, into=into), man.get("meta", {}), tier
            except CheckpointError as exc:
                errors.append(f"{tier.name} tier: {exc}")
        if not errors:
            raise CheckpointError(f"no checkpoint for step {step}")
        raise CheckpointError("; ".join(errors))

    def _load_shard(self, shard: dict[str, Any], tier: Tier, *, full_hash: bool = False, into: Any = None) -> Any:
        try:
            tensors_doc = shard["tensors"]
            skeleton = shard["skeleton"]
        except (KeyError, TypeError) as exc:
            raise CheckpointError("shard document is malformed; corrupt") from exc
        names = shard.get("names", "sha256")  # shards before BLAKE3 names have no field
        if names not in _NAME_HASHES:
            raise CheckpointError(f"shard names its objects with {names!r}, unknown to this hetrun version",
                                  hint="restore with the hetrun version that wrote the checkpoint")
        # Imported here, not at the top: state imports torch (~3 s on a loaded 2-core machine),
        # which `hetrun report` listing the store (info, verify) never needs.
        from hetrun.runtime.ckpt import state

        targets = state.targets_in(skeleton, into) if into is not None else {}
        values: list[Any] = []
        jobs: list[tuple[str, np.ndarray, tuple[str, str] | None]] = []
        for i, td in enumerate(tensors_doc):
            leaf = state.leaf_from_doc(td, f"tensors[{i}]")
            value, raw = state.view_of(leaf, targets.get(i)) or state.empty_for(leaf)
            values.append(value)
            off = 0
            chunks = td.get("chunks", [])
            fast = _fast_digests(td, len(chunks), f"tensors[{i}]") if FAST_VERIFY and not full_hash else None
            for ci, (h, n) in enumerate(chunks):
                if not isinstance(n, int) or n <= 0 or off + n > raw.size:
                    raise CheckpointError(f"tensors[{i}]: chunk lengths do not add up; corrupt")
                jobs.append((check_hash(h, f"tensors[{i}].chunks"), raw[off : off + n],
                             fast[ci] if fast is not None else None))
                off += n
            if off != raw.size:
                raise CheckpointError(f"tensors[{i}]: chunks cover {off} of {raw.size} bytes; corrupt")
        # Chunks decode, verify and land in place on the pool's threads;
        # hashlib, zstd, file reads and the C kernel all release the GIL.
        with ThreadPoolExecutor(self.threads) as pool:
            for fut in [pool.submit(self._decode_object, h, out, tier, fast, names) for h, out, fast in jobs]:
                fut.result()
        return state.unflatten(skeleton, values)

    def stage_seconds(self) -> dict[str, float]:
        """CPU seconds per restore stage summed over the decoding threads since
        the store was opened: where restore time goes. read (map objects, fault
        in the needed ranges), decode (zstd, delta add/XOR down the chain),
        rebase (a base planed differently), fault (fresh output pages), unplane
        (interleave planes into the output), verify (XXH3, BLAKE3 or sha256)."""
        out: dict[str, float] = {}
        with self._lock:
            for ctx in self._ctxs:
                for k, v in ctx.times.items():
                    out[k] = out.get(k, 0.0) + v
        return {k: round(v, 4) for k, v in out.items()}

    def reset_stage_seconds(self) -> None:
        with self._lock:
            for ctx in self._ctxs:
                ctx.times.clear()

    def restore(self, coll: Collective | None = None, *, into: Any = None) -> RestoreResult | None:
        """The newest checkpoint that every rank can load and verify, or None when
        there is none (a first run). Collective: every rank must call it.
        ``into``: decode into this live state's tensors where they fit (see
        :meth:`load_rank`)."""
        coll = coll or SoloCollective()
        t0 = time.perf_counter()
        steps = sorted({s for lst in coll.allgather(self.steps()) for s in lst}, reverse=True)
        skipped: list[tuple[int, str]] = []
        for step in steps:
            try:
                value, meta, tier = self.load_rank(step, coll.rank, into=into)
                mine: str | None = None
            except CheckpointError as exc:
                value, mine = None, f"rank {coll.rank}: {exc}"
            problems = [p for p in coll.allgather(mine) if p]
            if not problems:
                return RestoreResult(step, value, tier.name, meta, time.perf_counter() - t0, skipped)
            skipped.append((step, "; ".join(problems)))
            del value
        if skipped:
            raise CheckpointError(
                "no checkpoint could be restored: "
                + " | ".join(f"step {s}: {why}" for s, why in skipped),
                hint="inspect with `hetrun ckpt verify RUN`; delete the store to start from scratch",
            )
        return None

    # -- verification and maintenance ----------------------------------------
    def verify(self, step: int) -> list[str]:
        """Problems found when loading every rank of ``step`` (empty: valid)."""
        problems = []
        world = None
        for t in self.tiers:
            if step in t.manifest_steps():
                try:
                    world = int(t.read_manifest(step)["world_size"])
                    break
                except CheckpointError as exc:
                    problems.append(str(exc))
        if world is None:
            return problems or [f"no manifest for step {step}"]
        problems.clear()
        for r in range(world):
            try:
                self.load_rank(step, r, full_hash=True)
            except CheckpointError as exc:
                problems.append(f"rank {r}: {exc}")
        return problems


def retain(tier: Tier, keep: int) -> list[int]:
    """Delete all but the newest ``keep`` manifests of ``tier``; returns the deleted steps."""
    steps = tier.manifest_steps()
    doomed = steps[: max(0, len(steps) - max(1, keep))]
    for s in doomed:
        tier.delete_manifest(s)
    return doomed


# A writer's temporary file (objects.atomic_write: ".<name>.<pid>.<thread>.<rand>.tmp") is
# another rank's checkpoint in flight: staged writes keep it until their commit, which a rank
# ahead in an async pipeline reaches after a slower rank committed a newer manifest. The
# cutoff does not protect it (its mtime is its write, not its commit): GC deleted one once,
# and that rank's last checkpoint failed ("cannot write checkpoint file ...: No such file").
# Only a temporary file this old is a crashed writer's leftover.
STALE_TMP_S = 6 * 3600


def _is_tmp(name: str) -> bool:
    return name.startswith(".") and name.endswith(".tmp")


def _doomed(name: str, live: bool, mtime: float, cutoff: float, now: float) -> bool:
    if _is_tmp(name):
        return now - mtime > STALE_TMP_S
    return not live and mtime < cutoff


def gc(tier: Tier, cutoff: float | None = None) -> tuple[int, int]:
    """Delete objects and shard files no manifest reaches (through delta bases
    too) and that are older than ``cutoff`` (default: the newest manifest's
    time, so a checkpoint being written right now is never touched), and
    writers' temporary files older than STALE_TMP_S (never younger ones).
    Returns (files deleted, bytes freed)."""
    now = time.time()
    steps = tier.manifest_steps()
    if cutoff is None:
        cutoff = max((tier.manifest_path(s).stat().st_mtime for s in steps), default=time.time())
    live_shards: set[str] = set()
    live: set[str] = set()
    for s in steps:
        try:
            man = tier.read_manifest(s)
        except CheckpointError:
            continue
        for e in man["shards"]:
            live_shards.add(e["path"])
            try:
                shard = tier.read_shard(e["path"], e["sha256"], "gc")
            except CheckpointError:
                continue
            for td in shard.get("tensors", []):
                live.update(h for h, _ in td.get("chunks", []))
    frontier = list(live)
    while frontier:
        h = frontier.pop()
        try:
            base = tier.read_object_header(h).get("base")
        except (OSError, CheckpointError):
            continue
        if base and base not in live:
            live.add(base)
            frontier.append(base)
    files = freed = 0
    for p in tier.iter_objects():
        try:
            st = p.stat()
        except OSError:
            continue
        if _doomed(p.name, p.name in live, st.st_mtime, cutoff, now):
            with contextlib.suppress(OSError):
                p.unlink()
                files += 1
                freed += st.st_size
    shards_dir = tier.root / "shards"
    if shards_dir.is_dir():
        for d in shards_dir.iterdir():
            if not d.is_dir() or d.is_symlink():
                continue
            for p in d.iterdir():
                rel = f"shards/{d.name}/{p.name}"
                with contextlib.suppress(OSError):
                    st = p.stat()
                    if _doomed(p.name, rel in live_shards, st.st_mtime, cutoff, now):
                        p.unlink()
                        files += 1
                        freed += st.st_size
            with contextlib.suppress(OSError):
                d.rmdir()  # only succeeds when empty
    return files, freed


def copy_object_tree(src: Tier, dst: Tier, h: str, *, durable: bool) -> int:
    """Copy object ``h`` and its delta bases from ``src`` to ``dst`` (bases first,
    so ``dst`` never holds a delta without its base). Returns bytes copied."""
    chain = []
    cur: str | None = h
    while cur and not dst.has_object(cur):
        chain.append(cur)
        cur = src.read_object_header(cur).get("base")
        if len(chain) > MAX_CHAIN:
            raise CheckpointError(f"chunk {h[:16]}… has an overlong delta chain; corrupt")
    copied = 0
    for obj in reversed(chain):
        data = src.object_path(obj).read_bytes()
        path = dst.object_path(obj)
        path.parent.mkdir(exist_ok=True)
        copied += atomic_write(path, [data], durable=durable)
    return copied

