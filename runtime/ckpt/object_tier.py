"""The object store as a read tier of ``CheckpointStore`` (restore, ls, show, verify, export).

``BucketTier`` is a ``Tier`` whose files come from the bucket on first use, so
the store's reader decodes and verifies the very bytes every other tier holds:
a restore from the bucket is bit-identical, a corrupted object fails its
content hash exactly as on disk, and restore falls back to the next tier or
an older checkpoint. Reading a shard starts the download of its chunks on a
pool of ``upload_threads`` in the order the reader decodes them, each chunk's
delta bases right behind it on the same thread as its header names them
(the bucket's encodings, which may be shorter than the local tier's:
object_upload.py); the reader decodes each chunk as soon as its chain is
there, while the rest still downloads.

Where the downloaded bytes wait: a private cache directory (download to a
temporary name, then rename), so ``hetrun ckpt ls|show|verify|export`` read an
object shared by several checkpoints once. A job's restore (object_rank.py)
reads each object once and then closes the tier: there, with ``memory_bytes``
> 0, a prefetched object stays in memory, as the response body, until the
reader has used it as often as the shard names it (then it is dropped: held
memory is the read-ahead, not the shard), up to ``memory_bytes`` at a time
(beyond it, the cache directory). Writing every object to a file and mapping
it back cost the restore a copy and file-system work on the same cores the
server and the decoder need (benchmarks/ckpt_s3.md). A read the shard did not
announce (a verify after the restore) downloads the object again.

A server that does not answer is a tier with no checkpoints (``failures``
says why, ``on_event`` reports a ``ckpt_tier_failure``), never an exception
out of the listing: the other tiers still restore.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from hetrun.runtime.ckpt.object_store import ObjectStore
from hetrun.runtime.ckpt.objects import MAX_CHAIN, Tier, check_hash, parse_object

from hetrun.errors import CheckpointError

TIER_NAME = "object"
# A job's restore: downloaded objects held in memory at once, at most (beyond it they go to
# the cache directory). The tier's own default is 0: the cache directory only.
MEMORY_BYTES = 512 << 20


class BucketTier(Tier):
    def __init__(self, store: ObjectStore, cache_dir: str | os.PathLike[str] | None = None, *,
                 on_event: Callable[[dict[str, Any]], None] | None = None, memory_bytes: int = 0) -> None:
        self._own_cache = cache_dir is None
        root = Path(cache_dir) if cache_dir is not None else Path(tempfile.mkdtemp(prefix="hetrun-s3cache-"))
        super().__init__(root, TIER_NAME)
        # Reads through obstore need no boto3 client where the environment names the endpoint and
        # keys (s3_fast_get.py); else the client is made while the caller sets up.
        self.store = store if store.prepare_fast_reads() else store.warm()
        self.on_event = on_event
        self.failures: list[str] = []
        self._steps: list[int] | None = None
        self._lock = threading.Lock()
        # Objects being downloaded (or done): name -> its file in the cache, once there.
        self._pending: dict[str, Future[Path]] = {}
        self._pool: ThreadPoolExecutor | None = None
        # Prefetched objects waiting in memory (name -> the whole object), how many more
        # reads the reader will make of each, and their bytes (bounded by memory_bytes).
        self.memory_bytes = memory_bytes
        self._mem: dict[str, bytes] = {}
        self._uses: dict[str, int] = {}
        self._mem_held = 0
        self.fetched_bytes = 0  # object bytes downloaded (benchmarks/ckpt_s3.py reads it)
        self.fetched: list[str] = []  # and which objects

    def __repr__(self) -> str:
        return f"Tier({self.name}: {self.store})"

    def location(self) -> str:
        return str(self.store)

    def _failed(self, op: str, exc: CheckpointError) -> None:
        msg = exc.message
        self.failures.append(f"{op}: {msg}")
        if self.on_event is not None:
            with contextlib.suppress(Exception):
                self.on_event({"ev": "ckpt_tier_failure", "tier": TIER_NAME, "op": op, "ok": False,
                               "url": str(self.store), "error": msg,
                               "message": "falling back to the other tiers"})

    def ensure(self) -> None:
        for sub in ("objects", "shards", "manifests"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)

    def close(self) -> None:
        """Stop the downloads (those under way finish) and remove the download cache
        (only one this tier made itself)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        with self._lock:  # downloads cancelled before they began: nobody waits on them forever
            left = [f for f in self._pending.values() if not f.done()]
            self._pending.clear()
        for f in left:
            f.set_exception(CheckpointError(f"{self.store}: the bucket tier was closed during a read"))
        with self._lock:
            self._mem.clear()
            self._uses.clear()
            self._mem_held = 0
        if self._own_cache:
            shutil.rmtree(self.root, ignore_errors=True)

    # -- fetching into the cache -------------------------------------------------------
    def _fetch(self, rel: str, *, refresh: bool = False) -> Path:
        path = self.root / rel
        if path.is_file() and not refresh:
            return path
        data = self.store.get(rel)
        if rel.startswith("objects/"):
            self._count(path.name, data)
        return self._to_file(rel, data)

    def _to_file(self, rel: str, data: bytes) -> Path:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
        return path

    def _count(self, h: str, data: bytes) -> None:
        with self._lock:
            self.fetched_bytes += len(data)
            self.fetched.append(h)

    def _download(self, h: str) -> dict[str, Any] | None:
        """Object ``h`` from the bucket into memory (while it has room and the reader
        will read it) or the cache directory; returns its header (None: unreadable,
        which the reader finds and reports)."""
        rel = self.object_rel(h)
        data = self.store.get_object_body(rel)
        self._count(h, data)
        try:
            header: dict[str, Any] | None = parse_object(data, h)[0]
        except CheckpointError:
            header = None
        with self._lock:
            keep = self._uses.get(h, 0) > 0 and self._mem_held + len(data) <= self.memory_bytes
            if keep:
                self._mem[h] = data
                self._mem_held += len(data)
        if not keep:
            self._to_file(rel, data)
        return header

    def _take(self, h: str) -> bytes | None:
        """The reader's use of ``h``: its bytes while in memory (dropped after the last
        use the shard named), else None (read from the cache directory)."""
        with self._lock:
            data = self._mem.get(h)
            if data is None:
                return None
            left = self._uses.get(h, 1) - 1
            if left > 0:
                self._uses[h] = left
            else:
                self._drop(h)
            return data

    def _drop(self, h: str) -> None:
        """Under ``self._lock``: forget ``h``'s bytes in memory; a later read downloads it again."""
        data = self._mem.pop(h, None)
        self._uses.pop(h, None)
        if data is not None:
            self._mem_held -= len(data)
            self._pending.pop(h, None)

    def _claim(self, h: str) -> Future[Path] | None:
        """A new pending entry for ``h`` (the caller downloads it), or None when it is
        in the cache or someone already downloads it. Under ``self._lock``."""
        if h in self._pending or h in self._mem or self.object_path(h).is_file():
            return None
        fut: Future[Path] = Future()
        self._pending[h] = fut
        return fut

    def _unclaim(self, h: str, fut: Future[Path], exc: BaseException) -> None:
        """A failed download: its waiters get the error, a later read asks again."""
        with self._lock:
            if self._pending.get(h) is fut:
                del self._pending[h]
        fut.set_exception(exc)

    def prefetch(self, hashes: list[str]) -> None:
        """Start downloading these objects, in this order, and each one's delta bases
        behind it (as its header names them); returns at once (reads wait per object).
        ``hashes`` holds an object as often as the reader will decode it."""
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.store.threads, thread_name_prefix="ckpt-s3-get")
            for h in hashes:
                self._uses[h] = self._uses.get(h, 0) + 1
            for h in dict.fromkeys(hashes):
                fut = self._claim(h)
                if fut is not None:
                    self._pool.submit(self._walk, h, fut)

    def _walk(self, h: str, fut: Future[Path]) -> None:
        """Download ``h``, then its base, its base's base … (each one nobody else has
        claimed) on this thread: a chunk's chain arrives in the order it is decoded."""
        for _depth in range(MAX_CHAIN + 1):
            try:
                header = self._download(h)
            except BaseException as exc:
                self._unclaim(h, fut, exc)
                return
            fut.set_result(self.object_path(h))
            try:
                base = header.get("base") if header is not None else None
                base = check_hash(base, "object base") if base else ""
            except (CheckpointError, ValueError, AttributeError):
                return  # the reader finds the corruption and says so
            if not base:
                return
            with self._lock:
                # Each read of this object reads its base once more (a delta whose planes
                # need none of the base's leaves it unread: dropped at close()).
                self._uses[base] = self._uses.get(base, 0) + self._uses.get(h, 1)
                h = base
                nxt = self._claim(h)
            if nxt is None:
                return
            fut = nxt

    # -- Tier's reads -------------------------------------------------------------------
    def manifest_steps(self) -> list[int]:
        with self._lock:
            if self._steps is None:
                try:
                    self._steps = self.store.manifest_steps()
                except CheckpointError as exc:
                    self._failed("list", exc)
                    self._steps = []
            return list(self._steps)

    def refresh(self) -> None:
        with self._lock:
            self._steps = None

    def read_manifest(self, step: int) -> dict[str, Any]:
        try:
            self._fetch(f"manifests/{step:012d}.json", refresh=True)
        except CheckpointError as exc:
            self._failed("read", exc)
            raise
        return super().read_manifest(step)

    def read_shard(self, rel: str, sha: str, where: str) -> dict[str, Any]:
        self.safe_path(rel, where)  # reject a forged path before any request
        try:
            self._fetch(rel, refresh=True)
        except CheckpointError as exc:
            self._failed("read", exc)
            raise
        doc = super().read_shard(rel, sha, where)
        try:
            chunks = [str(h) for td in doc["tensors"] for h, _n in td["chunks"]]
        except (KeyError, TypeError, ValueError):
            chunks = []  # malformed: the store's reader says so, with where
        self.prefetch(chunks)  # (the refs document is GC's: it may list bases no longer needed)
        return doc

    def _ensure_object(self, h: str) -> None:
        """``h`` in memory or in the cache directory (a download in flight is waited for;
        one whose bytes were used up is made again, into the cache directory)."""
        with self._lock:
            fut = self._pending.get(h)
            mine = self._claim(check_hash(h, "object name")) if fut is None else None
        if fut is None and mine is None:
            return  # in memory or in the cache
        try:
            if mine is not None:  # not prefetched: fetched here
                try:
                    mine.set_result(self._fetch(self.object_rel(h)))
                except BaseException as exc:
                    self._unclaim(h, mine, exc)
                    raise
            else:
                assert fut is not None
                fut.result()
        except CheckpointError as exc:
            self._failed("read", exc)
            raise

    def _held(self, h: str) -> bytes | None:
        """One read of ``h`` by the reader: its bytes while held in memory, else None
        with ``h`` in the cache directory (downloaded once more if its bytes in memory
        were used up: a read the shard did not announce)."""
        self._ensure_object(h)
        data = self._take(h)
        if data is None and not self.object_path(h).is_file():
            try:
                self._fetch(self.object_rel(h))
            except CheckpointError as exc:
                self._failed("read", exc)
                raise
        return data

    def has_object(self, h: str) -> bool:
        return h in self._mem or self.object_path(h).is_file() or self.store.exists(self.store.object_rel(h))

    def map_object(self, h: str, *, populate: bool = True) -> tuple[dict[str, Any], memoryview]:
        data = self._held(h)
        if data is not None:  # the payload is a view of the response body: no copy, no file
            return parse_object(data, h)
        return super().map_object(h, populate=populate)

    def read_object(self, h: str, into: Any = None) -> tuple[dict[str, Any], memoryview]:
        data = self._held(h)
        if data is not None:
            return parse_object(data, h)
        return super().read_object(h, into=into)

    def read_object_header(self, h: str) -> dict[str, Any]:
        """A caller outside the reader (``copy_object_tree``: export) then reads the
        object's file: one held in memory is written to the cache directory first."""
        self._ensure_object(h)
        with self._lock:
            data = self._mem.get(h)
            if data is not None:
                self._drop(h)
        if data is not None:
            self._to_file(self.object_rel(h), data)
        return super().read_object_header(h)

    # -- writes go through the uploader, never through this tier ----------------------
    def write_manifest(self, doc: dict[str, Any], *, durable: bool) -> None:
        raise CheckpointError("the object-store tier is written by the uploader, not as a file tier")

    def delete_manifest(self, step: int) -> None:
        self.store.delete([f"manifests/{step:012d}.json"])
        self.refresh()
