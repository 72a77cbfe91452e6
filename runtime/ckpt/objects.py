"""Files of a store tier: content-addressed objects, shard and manifest documents,
and the path rules that keep every read inside the store.

Object file: ``MAGIC`` + 4-byte little-endian header length + JSON header +
payload. The object's name is a 256-bit hash of the chunk's *raw* bytes
(BLAKE3; sha256 in stores written before, which a shard's ``"names"`` field
tells apart), so `verify` checks the decoded bytes against the name it
looked up, and equal chunks are stored once.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import hashlib
import json
import mmap
import os
import re
import struct
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hetrun.errors import CheckpointError

MAGIC = b"HRCKOBJ1"
FORMAT = "hetrun-ckpt/1"
_HASH_RE = re.compile(r"[0-9a-f]{64}")
_SHARD_RE = re.compile(r"shards/[0-9]{12}/rank-[0-9]{6}\.json")
_MANIFEST_RE = re.compile(r"([0-9]{12})\.json")
_HEADER_MAX = 1 << 20
_MAP_POPULATE = getattr(mmap, "MAP_POPULATE", 0)
# madvise(MADV_POPULATE_READ) (Linux >= 5.14; 22 in the kernel ABI) faults a
# range in with one call; where the kernel refuses it, plain page faults do.
_MADV_POPULATE_READ: int = getattr(mmap, "MADV_POPULATE_READ", 22)
_populate_ok = [hasattr(mmap.mmap, "madvise")]


def digest(data: Any) -> str:
    return hashlib.sha256(data).hexdigest()


def check_hash(value: object, where: str) -> str:
    if not isinstance(value, str) or not _HASH_RE.fullmatch(value):
        raise CheckpointError(
            f"{where}: {value!r} is not an object name (64 hex digits); the document is corrupt or forged"
        )
    return value


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def disk_full_error(path: Path, exc: OSError) -> CheckpointError:
    return CheckpointError(
        f"cannot write checkpoint file {path}: {os.strerror(exc.errno or 0)}",
        hint="free space or point checkpoint.directory at a larger file system; "
        "older checkpoints are intact and the next checkpoint retries",
    )


_SYNC_FILE_RANGE_WRITE = 2
_sync_file_range: Any = None
try:
    _sync_file_range = ctypes.CDLL(None, use_errno=True).sync_file_range
    _sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    _sync_file_range.restype = ctypes.c_int
except (OSError, AttributeError):  # not Linux: the final fsync does all the work
    _sync_file_range = None


def _start_writeback(fd: int) -> None:
    # Starts the disk write now without waiting for it, so the final fsync
    # finds the data (mostly) on disk and the encoder thread never blocks here.
    if _sync_file_range is not None:
        _sync_file_range(fd, 0, 0, _SYNC_FILE_RANGE_WRITE)


class Staged:
    """Objects written to temporary names whose fsync and rename wait for
    :meth:`commit`: a final name always means complete, durable contents, yet
    the writes of a whole checkpoint reach the disk while encoding continues,
    and each directory is fsync'd once instead of once per object."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.items: list[tuple[Path, Path]] = []

    def add(self, tmp: Path, path: Path) -> None:
        with self._lock:
            self.items.append((tmp, path))

    def commit(self, run: Callable[[Callable[[], None]], Any] | None = None) -> None:
        """fsync + rename every staged file, then fsync their directories.
        ``run`` maps a list of thunks in parallel (e.g. a thread pool); fsyncs
        of different files then overlap in the file system's journal."""
        with self._lock:
            items, self.items = self.items, []

        def finish(tmp: Path, path: Path) -> None:
            try:
                fd = os.open(tmp, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
                os.replace(tmp, path)
            except OSError as exc:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
                    raise disk_full_error(path, exc) from exc
                raise CheckpointError(f"cannot write checkpoint file {path}: {exc}") from exc

        def fsync_dir(d: Path) -> None:
            try:
                _fsync_dir(d)
            except OSError as exc:
                raise CheckpointError(f"cannot sync checkpoint directory {d}: {exc}") from exc

        thunks: list[Callable[[], None]] = [functools.partial(finish, t, p) for t, p in items]
        try:
            _run_all(thunks, run)
        except BaseException:
            self.discard(items)
            raise
        _run_all([functools.partial(fsync_dir, d) for d in sorted({p.parent for _, p in items})], run)

    def discard(self, items: list[tuple[Path, Path]] | None = None) -> None:
        """Remove staged temporary files (a failed checkpoint)."""
        if items is None:
            with self._lock:
                items, self.items = self.items, []
        for tmp, _ in items:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def _run_all(thunks: list[Callable[[], None]], run: Callable[[Callable[[], None]], Any] | None) -> None:
    if run is None:
        for t in thunks:
            t()
        return
    futures = [run(t) for t in thunks]
    errors = []
    for f in futures:
        try:
            f.result()
        except CheckpointError as exc:
            errors.append(exc)
    if errors:
        raise errors[0]


def atomic_write(path: Path, parts: list[Any], *, durable: bool, staged: Staged | None = None) -> int:
    """Write ``parts`` to ``path`` via a temporary name + rename, so readers see
    either nothing or the whole file. Returns the bytes written. With
    ``durable`` and ``staged``, the fsync and the rename wait for
    ``staged.commit()`` (the disk write starts now)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.{uuid.uuid4().hex[:8]}.tmp")
    written = 0
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            for part in parts:
                view = memoryview(part).cast("B")
                while view:
                    n = os.write(fd, view)
                    written += n
                    view = view[n:]
            if durable and staged is not None:
                _start_writeback(fd)
            elif durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        if durable and staged is not None:
            staged.add(tmp, path)
            return written
        os.replace(tmp, path)
        if durable:
            _fsync_dir(path.parent)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            raise disk_full_error(path, exc) from exc
        raise CheckpointError(f"cannot write checkpoint file {path}: {exc}") from exc
    return written


class Tier:
    """One directory holding a complete store layout:
    ``objects/ab/<name>``, ``shards/<step>/rank-<r>.json``,
    ``manifests/<step>.json`` and ``latest``."""

    def __init__(self, root: str | os.PathLike[str], name: str = "shared") -> None:
        self.root = Path(root)
        self.name = name

    def __repr__(self) -> str:
        return f"Tier({self.name}: {self.root})"

    def ensure(self) -> None:
        for sub in ("objects", "shards", "manifests"):
            try:
                (self.root / sub).mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise CheckpointError(
                    f"cannot create checkpoint directory {self.root / sub}: {exc}",
                    hint="check checkpoint.directory in the job YAML and its permissions",
                ) from exc

    # -- path safety -----------------------------------------------------
    def safe_path(self, rel: str, where: str) -> Path:
        """``root/rel`` after rejecting absolute paths, ``..`` and symlinks inside
        the store: a manifest is data, never a way to read other files."""
        if not isinstance(rel, str) or not rel or rel.startswith(("/", "\\")) or "\\" in rel:
            raise CheckpointError(f"{where}: path {rel!r} is not a relative store path; rejected")
        parts = rel.split("/")
        if any(p in ("", ".", "..") for p in parts):
            raise CheckpointError(f"{where}: path {rel!r} leaves the checkpoint store; rejected")
        cur = self.root
        for p in parts:
            cur = cur / p
            if cur.is_symlink():
                raise CheckpointError(
                    f"{where}: {cur} is a symbolic link; links inside the store are rejected"
                )
        return cur

    def object_rel(self, h: str) -> str:
        return f"objects/{h[:2]}/{h}"

    def object_path(self, h: str) -> Path:
        return self.root / self.object_rel(check_hash(h, "object name"))

    # -- objects ------------------------------------------------------------
    def has_object(self, h: str) -> bool:
        return self.object_path(h).is_file()

    def touch_object(self, h: str) -> None:
        # Keeps a re-referenced old object out of a concurrent GC's reach (GC only
        # deletes unreachable objects older than the last commit).
        with contextlib.suppress(OSError):
            os.utime(self.object_path(h))

    def write_object(self, h: str, header: dict[str, Any], parts: list[Any], *, durable: bool,
                     staged: Staged | None = None) -> int:
        path = self.object_path(h)
        path.parent.mkdir(exist_ok=True)
        return atomic_write(path, object_parts(header, parts), durable=durable, staged=staged)

    def read_object(self, h: str, into: ReadBuffer | None = None) -> tuple[dict[str, Any], memoryview]:
        """Header and payload of object ``h``; with ``into``, read into that
        reused buffer (the payload is a view of it, valid until its next use)."""
        path = self.safe_path(self.object_rel(check_hash(h, "object name")), "object")
        try:
            if into is None:
                data: Any = path.read_bytes()
            else:
                with open(path, "rb", buffering=0) as f:
                    size = os.fstat(f.fileno()).st_size
                    data = into.get(size)
                    got = 0
                    while got < size:
                        n = f.readinto(data[got:])
                        if not n:
                            break
                        got += n
                    data = data[:got]
        except FileNotFoundError:
            raise CheckpointError(f"chunk {h[:16]}… is missing from {self.root}") from None
        except OSError as exc:
            raise CheckpointError(f"cannot read chunk {path}: {exc}") from exc
        return parse_object(data, h)

    def map_object(self, h: str, *, populate: bool = True) -> tuple[dict[str, Any], memoryview]:
        """Like :meth:`read_object`, but the payload is a read-only view of the
        file mapped with MAP_POPULATE: raw planes go straight from the page
        cache to their destination, without a copy into a read buffer. The
        mapping closes when the last view of it is dropped. Without
        ``populate`` nothing is faulted in: a delta base whose planes are only
        partly needed then calls :func:`prefault` on those byte ranges."""
        path = self.safe_path(self.object_rel(check_hash(h, "object name")), "object")
        try:
            with open(path, "rb", buffering=0) as f:
                size = os.fstat(f.fileno()).st_size
                if size == 0:
                    raise CheckpointError(f"chunk {h[:16]}… is empty; corrupt")
                m = mmap.mmap(f.fileno(), size, flags=mmap.MAP_SHARED | (_MAP_POPULATE if populate else 0), prot=mmap.PROT_READ)
        except FileNotFoundError:
            raise CheckpointError(f"chunk {h[:16]}… is missing from {self.root}") from None
        except OSError as exc:
            raise CheckpointError(f"cannot read chunk {path}: {exc}") from exc
        return parse_object(memoryview(m), h)

    def read_object_header(self, h: str) -> dict[str, Any]:
        path = self.object_path(h)
        with open(path, "rb") as f:
            data = f.read(len(MAGIC) + 4)
            if len(data) < len(MAGIC) + 4 or data[: len(MAGIC)] != MAGIC:
                raise CheckpointError(f"chunk {path} has no object header; corrupt")
            (n,) = struct.unpack("<I", data[len(MAGIC) :])
            if n > _HEADER_MAX:
                raise CheckpointError(f"chunk {path} header is {n} bytes; corrupt")
            try:
                return json.loads(f.read(n))
            except ValueError as exc:
                raise CheckpointError(f"chunk {path} header is not JSON; corrupt") from exc

    def iter_objects(self) -> list[Path]:
        out: list[Path] = []
        objs = self.root / "objects"
        if objs.is_dir():
            for sub in objs.iterdir():
                if sub.is_dir() and not sub.is_symlink():
                    out.extend(p for p in sub.iterdir() if p.is_file())
        return out

    # -- documents ------------------------------------------------------------
    def shard_rel(self, step: int, rank: int) -> str:
        return f"shards/{step:012d}/rank-{rank:06d}.json"

    def write_shard(self, step: int, rank: int, doc: dict[str, Any], *, durable: bool) -> tuple[str, str]:
        rel = self.shard_rel(step, rank)
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        data = json.dumps(doc, separators=(",", ":")).encode()
        atomic_write(path, [data], durable=durable)
        return rel, digest(data)

    def read_shard(self, rel: str, sha: str, where: str) -> dict[str, Any]:
        if not isinstance(rel, str) or not _SHARD_RE.fullmatch(rel):
            # Checked before touching the file system at all.
            self.safe_path(rel, where)
            raise CheckpointError(f"{where}: {rel!r} is not a shard path of this store; rejected")
        path = self.safe_path(rel, where)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise CheckpointError(f"{where}: shard {rel} is missing from {self.root}") from None
        if digest(data) != check_hash(sha, where):
            raise CheckpointError(f"{where}: shard {rel} does not match its hash; corrupt")
        try:
            return json.loads(data)
        except ValueError as exc:
            raise CheckpointError(f"{where}: shard {rel} is not JSON; corrupt") from exc

    def manifest_path(self, step: int) -> Path:
        return self.root / "manifests" / f"{step:012d}.json"

    def write_manifest(self, doc: dict[str, Any], *, durable: bool) -> None:
        step = int(doc["step"])
        atomic_write(self.manifest_path(step), [json.dumps(doc, indent=1).encode()], durable=durable)
        atomic_write(self.root / "latest", [f"{step}\n".encode()], durable=durable)

    def manifest_steps(self) -> list[int]:
        d = self.root / "manifests"
        if not d.is_dir():
            return []
        steps = []
        for p in d.iterdir():
            m = _MANIFEST_RE.fullmatch(p.name)
            if m:
                steps.append(int(m.group(1)))
        return sorted(steps)

    def read_manifest(self, step: int) -> dict[str, Any]:
        path = self.manifest_path(step)
        where = str(path)
        if path.is_symlink():
            raise CheckpointError(f"{where}: the manifest is a symbolic link; rejected")
        try:
            doc = json.loads(path.read_bytes())
        except FileNotFoundError:
            raise CheckpointError(f"{where}: no manifest for step {step}") from None
        except ValueError as exc:
            raise CheckpointError(f"{where}: the manifest is not JSON; corrupt") from exc
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise CheckpointError(f"{where}: not a {FORMAT} manifest")
        shards = doc.get("shards")
        if not isinstance(shards, list) or len(shards) != doc.get("world_size"):
            raise CheckpointError(f"{where}: shard list does not match world_size; corrupt")
        for i, s in enumerate(shards):
            if not isinstance(s, dict) or s.get("rank") != i:
                raise CheckpointError(f"{where}: shards[{i}] is malformed; corrupt")
            rel = s.get("path")
            if not isinstance(rel, str):
                raise CheckpointError(f"{where}: shards[{i}].path {rel!r} is not a shard path; rejected")
            self.safe_path(rel, f"{where}: shards[{i}].path")
            if not _SHARD_RE.fullmatch(rel):
                raise CheckpointError(f"{where}: shards[{i}].path {rel!r} is not a shard path; rejected")
            check_hash(s.get("sha256"), f"{where}: shards[{i}].sha256")
        return doc

    def read_latest(self) -> int | None:
        try:
            return int((self.root / "latest").read_text().strip())
        except (OSError, ValueError):
            return None

    def delete_manifest(self, step: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.manifest_path(step).unlink()


def prefault(payload: memoryview, start: int, length: int) -> None:
    """Fault in ``payload[start:start + length]``, where ``payload`` is what
    :meth:`Tier.map_object` returned (it runs to the end of the file), in one
    call rather than one page fault per 4 KiB."""
    m = payload.obj
    if not _populate_ok[0] or not isinstance(m, mmap.mmap) or length <= 0:
        return
    begin = len(m) - len(payload) + start
    aligned = begin - begin % mmap.PAGESIZE
    try:
        m.madvise(_MADV_POPULATE_READ, aligned, min(len(m), begin + length) - aligned)
    except OSError:
        _populate_ok[0] = False  # a kernel without it: plain page faults from now on


class ReadBuffer:
    """A growable read buffer reused across objects (one per thread and chain depth)."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def get(self, n: int) -> memoryview:
        if len(self._buf) < n:
            self._buf = bytearray(n)
        return memoryview(self._buf)[:n]


# The longest delta chain a chunk may have (base, delta of it, ...): a longer one is corrupt.
MAX_CHAIN = 64

def object_parts(header: dict[str, Any], parts: list[Any]) -> list[Any]:
    """An object file's bytes, in order: ``MAGIC``, the header's length, the header, the payload."""
    head = json.dumps(header, separators=(",", ":")).encode()
    return [MAGIC, struct.pack("<I", len(head)), head, *parts]


def parse_object(data: Any, h: str) -> tuple[dict[str, Any], memoryview]:
    view = memoryview(data)
    if view[: len(MAGIC)] != MAGIC or len(view) < len(MAGIC) + 4:
        raise CheckpointError(f"chunk {h[:16]}… has no object header; corrupt")
    (n,) = struct.unpack("<I", view[len(MAGIC) : len(MAGIC) + 4])
    start = len(MAGIC) + 4
    if n > _HEADER_MAX or start + n > len(view):
        raise CheckpointError(f"chunk {h[:16]}… header length {n} is invalid; corrupt")
    try:
        header = json.loads(bytes(view[start : start + n]))
    except ValueError as exc:
        raise CheckpointError(f"chunk {h[:16]}… header is not JSON; corrupt") from exc
    if not isinstance(header, dict):
        raise CheckpointError(f"chunk {h[:16]}… header is malformed; corrupt")
    return header, view[start + n :]
