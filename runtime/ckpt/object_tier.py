"""The object store as a read tier of ``CheckpointStore`` (restore, ls, show, verify, export).

``BucketTier`` is a ``Tier`` whose files come from the bucket into a private
cache directory on first use (download to a temporary name, then rename), so
the store's reader decodes and verifies the very bytes every other tier holds:
a restore from the bucket is bit-identical, a corrupted object fails its
content hash exactly as on disk, and restore falls back to the next tier or
an older checkpoint. Reading a shard starts the download of its chunks on a
pool of ``upload_threads`` in the order the reader decodes them, each chunk's
delta bases right behind it on the same thread as its header names them
(the bucket's encodings, which may be shorter than the local tier's:
object_upload.py); the reader decodes each chunk as soon as its chain is in
the cache, while the rest still downloads.

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
from hetrun.runtime.ckpt.objects import MAX_CHAIN, Tier, check_hash

from hetrun.errors import CheckpointError

TIER_NAME = "object"


class BucketTier(Tier):
    def __init__(self, store: ObjectStore, cache_dir: str | os.PathLike[str] | None = None, *,
                 on_event: Callable[[dict[str, Any]], None] | None = None) -> None:
        self._own_cache = cache_dir is None
        root = Path(cache_dir) if cache_dir is not None else Path(tempfile.mkdtemp(prefix="hetrun-s3cache-"))
        super().__init__(root, TIER_NAME)
        self.store = store.warm()  # the client is made while the caller sets up
        self.on_event = on_event
        self.failures: list[str] = []
        self._steps: list[int] | None = None
        self._lock = threading.Lock()
        # Objects being downloaded (or done): name -> its file in the cache, once there.
        self._pending: dict[str, Future[Path]] = {}
        self._pool: ThreadPoolExecutor | None = None
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
        if self._own_cache:
            shutil.rmtree(self.root, ignore_errors=True)

    # -- fetching into the cache -------------------------------------------------------
    def _fetch(self, rel: str, *, refresh: bool = False) -> Path:
        path = self.root / rel
        if path.is_file() and not refresh:
            return path
        path.parent.mkdir(parents=True, exist_ok=True)
        data = self.store.get(rel)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
        if rel.startswith("objects/"):
            with self._lock:
                self.fetched_bytes += len(data)
                self.fetched.append(path.name)
        return path

    def _claim(self, h: str) -> Future[Path] | None:
        """A new pending entry for ``h`` (the caller downloads it), or None when it is
        in the cache or someone already downloads it. Under ``self._lock``."""
        if h in self._pending or self.object_path(h).is_file():
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
        behind it (as its header names them); returns at once (reads wait per object)."""
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.store.threads, thread_name_prefix="ckpt-s3-get")
            for h in dict.fromkeys(hashes):
                fut = self._claim(h)
                if fut is not None:
                    self._pool.submit(self._walk, h, fut)

    def _walk(self, h: str, fut: Future[Path]) -> None:
        """Download ``h``, then its base, its base's base … (each one nobody else has
        claimed) on this thread: a chunk's chain arrives in the order it is decoded."""
        for _depth in range(MAX_CHAIN + 1):
            try:
                path = self._fetch(self.object_rel(h))
            except BaseException as exc:
                self._unclaim(h, fut, exc)
                return
            fut.set_result(path)
            try:
                base = Tier.read_object_header(self, h).get("base")
                h = check_hash(base, "object base") if base else ""
            except (CheckpointError, OSError, ValueError, AttributeError):
                return  # the reader finds the corruption and says so
            if not h:
                return
            with self._lock:
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
        with self._lock:
            fut = self._pending.get(h)
            mine = self._claim(check_hash(h, "object name")) if fut is None else None
        if fut is None and mine is None:
            return  # in the cache
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

    def has_object(self, h: str) -> bool:
        return self.object_path(h).is_file() or self.store.exists(self.store.object_rel(h))

    def map_object(self, h: str, *, populate: bool = True) -> tuple[dict[str, Any], memoryview]:
        self._ensure_object(h)
        return super().map_object(h, populate=populate)

    def read_object(self, h: str, into: Any = None) -> tuple[dict[str, Any], memoryview]:
        self._ensure_object(h)
        return super().read_object(h, into=into)

    def read_object_header(self, h: str) -> dict[str, Any]:
        self._ensure_object(h)
        return super().read_object_header(h)

    # -- writes go through the uploader, never through this tier ----------------------
    def write_manifest(self, doc: dict[str, Any], *, durable: bool) -> None:
        raise CheckpointError("the object-store tier is written by the uploader, not as a file tier")

    def delete_manifest(self, step: int) -> None:
        self.store.delete([f"manifests/{step:012d}.json"])
        self.refresh()
