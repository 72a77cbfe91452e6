"""A node's memory-tier slots: where the blobs of runtime/ckpt/memory.py live on a node-local
tmpfs, and the blob's prefix (``peek``), without torch: the replica keeper
(runtime/replica_keeper.py), a process of its own beside each rank, files the replicas it
receives here and reads its rank's blobs from here, and starts in a fraction of the seconds
an import of torch takes.

``<root>/hetrun-mem/<run key>/rank-<owner>/slot-<k>``: ``keep`` slots an owner, each a header
and one blob; ``root`` a node-local tmpfs (``$HETRUN_MEMORY_DIR``, default ``/dev/shm``). The
slots outlive the rank's process (a new job step restarts every rank) but not the node.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import re
import struct
from pathlib import Path
from typing import Any

from hetrun.errors import CheckpointError
from hetrun.rundir import MEMORY_DIR_ENV

MAGIC = b"HRMEMSN2"  # a blob's (runtime/ckpt/memory.py)
ENV_DIR = MEMORY_DIR_ENV
DEFAULT_ROOT = "/dev/shm"
_DIGEST_LEN = 32  # xxh3-128 hex
_IDS = struct.Struct("<IQ")  # owner, step
_IDS_AT = len(MAGIC) + 4
_DIGEST_AT = _IDS_AT + _IDS.size
_PREFIX = _DIGEST_AT + _DIGEST_LEN
_OWNER_RE = re.compile(r"rank-([0-9]{6})")
_SLOT_RE = re.compile(r"slot-[0-9]+")
SLOT_MAGIC = b"HRSLOT01"
_SLOT = struct.Struct("<8sQQQ")  # magic, sequence (odd: a write under way), step, the blob's length
SLOT_HEAD = 64  # a slot's header bytes; the blob follows


def _prefix(blob: Any, where: str) -> memoryview:
    """A view of ``blob`` once its magic and prefix length are right."""
    view = memoryview(blob)
    if len(view) < _PREFIX or bytes(view[:len(MAGIC)]) != MAGIC:
        raise CheckpointError(f"{where}: not a memory snapshot (bad magic); corrupt")
    return view


def peek(blob: Any, where: str = "memory snapshot") -> tuple[int, int]:
    """(owner, step) from the prefix alone: where a received replica is filed. Not a
    verification: ``verify``/``decode`` check everything before a copy is used."""
    owner, step = _IDS.unpack_from(_prefix(blob, where), _IDS_AT)
    return int(owner), int(step)


def run_key(run_dir: str | os.PathLike[str]) -> str:
    """A directory name for one run: its run directory's name and a hash of its full path."""
    p = Path(run_dir).resolve()
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", p.name)[:64] or "run"
    return f"{safe}-{hashlib.sha256(str(p).encode()).hexdigest()[:12]}"


def default_root() -> Path:
    return Path(os.environ.get(ENV_DIR) or DEFAULT_ROOT)


class MemoryTier:
    """This node's snapshots of one run (its own ranks' and the replicas it holds), in slots.

    An owner's directory holds ``keep`` slot files, ``slot-<k>``, each mapped once by the process
    that writes it: a write is a copy into memory the tmpfs already holds, between a slot header
    made invalid and valid again; its one system call a ``stat`` of the owner's directory (one
    removed, by a finished run's cleanup, is made again rather than written into unlinked files). Why: a blob written as a file per step (rename
    the oldest out of sight, open, write, truncate, close, rename into place) cost the PPO
    example's whole iteration ~8 % inside one run, on the writer thread as on the training
    thread, where capturing and encoding the same snapshots cost 0.6 % (benchmarks/node_death.md,
    session 43); a copy into a mapped slot costs about a fifth of the file's write.

    A slot: SLOT_HEAD bytes (magic, a sequence number, the step, the blob's length; the sequence
    is odd while a write is under way), then the blob. A reader (``read``, ``held``; any process)
    takes a slot whose magic is right and whose sequence is even and the same before and after
    its copy: a write cut short by a death (the magic is cleared first) or under way is no copy
    at all; anything else the blob's own digests catch (every restore verifies what it reads).
    One process writes an owner's slots on a node at a time (the owner, or the replica keeper of
    its one partner there); a new one (a restart) reads the headers before its first write. The step a write
    goes to: the slot holding that step (a restart that went back writes it again), else an
    empty one, else the oldest; ``keep`` newest stay."""

    def __init__(self, run_dir: str | os.PathLike[str] | None, root: str | os.PathLike[str] | None = None,
                 keep: int = 4, *, directory: str | os.PathLike[str] | None = None) -> None:
        self.dir = (Path(directory) if directory is not None else
                    Path(root if root is not None else default_root()) / "hetrun-mem" / run_key(str(run_dir)))
        self.keep = max(1, int(keep))
        # ``write``'s, per owner: its slots' maps (None: not mapped yet) and the step each holds
        # (None: empty or torn), as this process last wrote or read them.
        self._maps: dict[int, list[mmap.mmap | None]] = {}
        self._steps: dict[int, list[int | None]] = {}
        self._seq: dict[int, list[int]] = {}
        self._dirs: dict[int, str] = {}
        self._ro: dict[tuple[int, int], mmap.mmap] = {}  # read_slot's maps

    def owner_dir(self, owner: int) -> Path:
        return self.dir / f"rank-{int(owner):06d}"

    @classmethod
    def at(cls, directory: str | os.PathLike[str], keep: int) -> MemoryTier:
        """The tier whose run directory on this node is ``directory`` (its ``dir``, as another
        process's tier named it: the replica keeper's)."""
        return cls(None, keep=keep, directory=directory)

    def write(self, owner: int, step: int, blob: Any) -> int:
        """Copy ``blob`` (``owner``'s at ``step``) into a slot; the oldest of ``keep`` goes.
        Returns the slot's number (``read_slot``)."""
        return self.write_with(owner, step, memoryview(blob).nbytes, blob)

    def write_with(self, owner: int, step: int, n: int, fill: Any) -> int:
        """``write`` of an ``n``-byte blob that ``fill`` puts in place: a bytes-like (copied) or a
        callable given the slot's ``n`` bytes to write (the encoder frames the blob there: no
        blob of its own, no second copy)."""
        steps = self._steps.get(owner)
        if steps is None or not os.path.isdir(self._dirs[owner]):  # first write here, or the directory went
            self._open(owner)
            steps = self._steps[owner]
        for j, held in enumerate(steps):
            if held is not None and held > step:
                # Newer than the step written: left by the run before a restore that went back
                # (to a step every rank held); the run goes on from here, so they are not its.
                self._mark(owner, j, self._maps[owner][j] or self._map(owner, j, SLOT_HEAD), 0, 0, valid=False)
        k = _pick(steps, step)
        m = self._maps[owner][k]
        if m is None or len(m) < SLOT_HEAD + n:
            m = self._map(owner, k, SLOT_HEAD + n)
        self._mark(owner, k, m, 0, 0, valid=False)
        if callable(fill):
            with memoryview(m) as view, view[SLOT_HEAD:SLOT_HEAD + n] as payload:
                fill(payload)  # (released before the map may be closed or grown)
        else:
            m[SLOT_HEAD:SLOT_HEAD + n] = fill
        self._mark(owner, k, m, int(step), n, valid=True)
        return k

    def _mark(self, owner: int, k: int, m: mmap.mmap, step: int, n: int, *, valid: bool) -> None:
        """Slot ``k``'s header: invalid (the magic cleared, the sequence odd) before a copy, valid
        (the magic, the next even sequence, the step and length) after it."""
        seq = self._seq[owner][k] + 1
        seq += (seq & 1) == valid  # valid: even; invalid: odd
        _SLOT.pack_into(m, 0, SLOT_MAGIC if valid else b"\0" * len(SLOT_MAGIC), seq, step, n)
        self._seq[owner][k] = seq
        self._steps[owner][k] = step if valid else None

    def _open(self, owner: int) -> None:
        """This process's view of ``owner``'s slots: the directory made, what earlier writers left
        read from the headers (a slot in flux or torn is empty)."""
        self.close(owner)
        d = self.owner_dir(owner)
        d.mkdir(parents=True, exist_ok=True)
        self._dirs[owner] = str(d)
        self._maps[owner] = [None] * self.keep
        self._steps[owner] = [None] * self.keep
        self._seq[owner] = [0] * self.keep
        for k in range(self.keep):
            head = _read_head(d / f"slot-{k}")
            if head is not None:
                self._seq[owner][k] = head[0] + (head[0] & 1)
                self._steps[owner][k] = None if head[0] & 1 else head[1]

    def _map(self, owner: int, k: int, need: int) -> mmap.mmap:
        """Slot ``k`` mapped with room for ``need`` bytes (the file grown, with headroom: blobs of
        one owner keep about their size)."""
        old = self._maps[owner][k]
        if old is not None:
            old.close()
        path = self.owner_dir(owner) / f"slot-{k}"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            size = os.fstat(fd).st_size
            if size < need:
                size = -(-(need + need // 8) // mmap.PAGESIZE) * mmap.PAGESIZE
                # Allocated now, not at the copy's first touch: a full tmpfs is an OSError
                # (ENOSPC) here, where a touch of a page it cannot back would be SIGBUS.
                os.posix_fallocate(fd, 0, size)
            m = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self._maps[owner][k] = m
        return m

    def close(self, owner: int | None = None) -> None:
        """Unmap ``owner``'s slots (every owner's: None); the slots stay on the tmpfs."""
        for o in [owner] if owner is not None else list(self._maps):
            for m in self._maps.pop(o, None) or []:
                if m is not None:
                    m.close()
            self._steps.pop(o, None)
            self._seq.pop(o, None)
        for key in [key for key in self._ro if owner is None or key[0] == owner]:
            self._ro.pop(key).close()

    def locate(self, owner: int, step: int) -> tuple[Path, int, int]:
        """(slot file, the blob's offset in it, its length) of ``owner``'s copy of ``step``."""
        for path in _slots(self.owner_dir(owner)):
            head = _read_head(path)
            if head is not None and not head[0] & 1 and head[1] == step:
                return path, SLOT_HEAD, head[2]
        raise CheckpointError(f"memory snapshot of rank {owner} step {step}: not held on this node")

    def read_slot(self, owner: int, k: int, step: int) -> bytes | None:
        """Slot ``k``'s blob when it still holds ``owner``'s ``step`` whole; else None (written
        over since, or under way). For a process that reads another's slots at every snapshot
        (the replica keeper): the slot stays mapped read-only, a read is a copy between two
        looks at its header (an open and two reads of the file cost it ~0.2 ms a blob)."""
        key = (owner, k)
        for fresh in (False, True):  # a cached map, then the file mapped afresh
            m = self._ro.pop(key, None) if not fresh else None
            if m is None:
                try:
                    fd = os.open(os.path.join(str(self.dir), f"rank-{int(owner):06d}", f"slot-{int(k)}"), os.O_RDONLY)
                except FileNotFoundError:
                    return None
                try:
                    m = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
                finally:
                    os.close(fd)
                fresh = True
            head = _parse_head(m[:SLOT_HEAD])
            if head is not None and not head[0] & 1 and head[1] == step and SLOT_HEAD + head[2] <= len(m):
                blob = m[SLOT_HEAD:SLOT_HEAD + head[2]]
                if _parse_head(m[:SLOT_HEAD]) == head:
                    self._ro[key] = m
                    return blob
            # Not this step in this map: written over or under way, or the slot grown or made
            # again (a new file) since it was mapped: once more from the file as it is now.
            m.close()
            if fresh:
                return None
        return None

    def read(self, owner: int, step: int) -> bytes:
        """The blob of ``owner`` at ``step`` as held here (not verified: ``verify`` that)."""
        where = f"memory snapshot of rank {owner} step {step}"
        for path in _slots(self.owner_dir(owner)):
            try:
                blob = self.read_slot(owner, int(path.name[len("slot-"):]), step)
            except (OSError, ValueError) as exc:  # ValueError: an empty file (mmap of 0 bytes)
                raise CheckpointError(f"{where}: {path}: {exc}") from exc
            if blob is not None:
                return blob
        raise CheckpointError(f"{where}: not held on this node")

    def steps(self, owner: int) -> list[int]:
        """The steps this node holds of ``owner`` (whole slots, newest last)."""
        got = (_read_head(p) for p in _slots(self.owner_dir(owner)))
        return sorted({h[1] for h in got if h is not None and not h[0] & 1})

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


def _pick(steps: list[int | None], step: int) -> int:
    """The slot ``step`` is written to: the one holding it, else an empty one, else the oldest."""
    if step in steps:
        return steps.index(step)
    if None in steps:
        return steps.index(None)
    return min(range(len(steps)), key=lambda k: steps[k])  # type: ignore[arg-type,return-value]


def _slots(d: Path) -> list[Path]:
    try:
        names = os.listdir(d)
    except OSError:
        return []
    return [d / n for n in sorted(names) if _SLOT_RE.fullmatch(n)]


def _parse_head(raw: bytes) -> tuple[int, int, int] | None:
    """(sequence, step, length) of a slot header whose magic is right; None otherwise."""
    if len(raw) < _SLOT.size:
        return None
    magic, seq, step, n = _SLOT.unpack_from(raw)
    return (seq, step, n) if magic == SLOT_MAGIC else None


def _read_head(path: Path) -> tuple[int, int, int] | None:
    try:
        with open(path, "rb", buffering=0) as f:
            return _parse_head(f.read(SLOT_HEAD))
    except OSError:
        return None
