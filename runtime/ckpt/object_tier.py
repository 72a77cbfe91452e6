"""The object store as a read tier of ``CheckpointStore`` (restore, ls, show, verify, export).

``BucketTier`` is a ``Tier`` whose files come from the bucket into a private
cache directory on first use (download to a temporary name, then rename), so
the store's reader decodes and verifies the very bytes every other tier holds:
a restore from the bucket is bit-identical, a corrupted object fails its
content hash exactly as on disk, and restore falls back to the next tier or
an older checkpoint. Reading a shard fetches every object it needs in
parallel (its refs document lists chunks and delta bases) before decoding.

A server that does not answer is a tier with no checkpoints (``failures``
says why, ``on_event`` reports a ``ckpt_tier_failure``), never an exception
out of the listing: the other tiers still restore.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from hetrun.runtime.ckpt.object_store import ObjectStore
from hetrun.runtime.ckpt.objects import Tier

from hetrun.errors import CheckpointError

TIER_NAME = "object"


class BucketTier(Tier):
    def __init__(self, store: ObjectStore, cache_dir: str | os.PathLike[str] | None = None, *,
                 on_event: Callable[[dict[str, Any]], None] | None = None) -> None:
        self._own_cache = cache_dir is None
        root = Path(cache_dir) if cache_dir is not None else Path(tempfile.mkdtemp(prefix="hetrun-s3cache-"))
        super().__init__(root, TIER_NAME)
        self.store = store
        self.on_event = on_event
        self.failures: list[str] = []
        self._steps: list[int] | None = None
        self._lock = threading.Lock()

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
        """Remove the download cache (only one this tier made itself)."""
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
        return path

    def prefetch(self, hashes: list[str]) -> None:
        todo = [h for h in dict.fromkeys(hashes) if not self.object_path(h).is_file()]
        if not todo:
            return
        with ThreadPoolExecutor(self.store.threads, thread_name_prefix="ckpt-s3-get") as pool:
            list(pool.map(lambda h: self._fetch(self.object_rel(h)), todo))

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
            refs = json.loads(self._fetch(rel.removesuffix(".json") + ".refs.json", refresh=True).read_bytes())
            doc = super().read_shard(rel, sha, where)
            self.prefetch([str(h) for h in refs.get("objects", [])])
        except CheckpointError as exc:
            self._failed("read", exc)
            raise
        except (ValueError, TypeError) as exc:
            raise CheckpointError(f"{where}: the refs document of {rel} is malformed; corrupt") from exc
        return doc

    def _ensure_object(self, h: str) -> None:
        if not self.object_path(h).is_file():
            try:
                self._fetch(self.object_rel(h))
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
