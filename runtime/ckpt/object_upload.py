"""Background upload of committed checkpoints to the object store (the cold tier).

One ``ObjectUploader`` per rank. The checkpoint writer calls
:meth:`ObjectUploader.submit` once a step has committed to the file-system
tiers; the upload runs on this class's own thread, so training never waits
for it (and neither does the next checkpoint's write: a step still queued
when a newer one commits is replaced by it). For a step, each rank:

1. takes a lease (object_store.py: a GC then keeps off);
2. sends the chunks of its shard that the bucket lacks: an index of what it
   sent or saw, seeded by one LIST of ``objects/`` on the first upload and
   after every GC (``gc.generation``); in parallel, multipart above 64 MiB.
   A chunk goes as the very file the local tier holds while that is whole,
   or a delta on a base the bucket holds whose chain there stays within
   ``max_fetch_ratio`` x the chunk's raw bytes; otherwise it is re-encoded
   whole (same name: the name is the hash of the raw bytes). So a restore
   from the bucket downloads ~1x the state, not the local tier's whole delta
   chain (1.9x with the default chain of 4: benchmarks/ckpt_s3.md);
3. sends its shard document and its refs document (every object the LOCAL
   encodings reach, a superset of what the bucket's need: GC keeps them all).

Rank 0 then waits until every rank's shard document is in the bucket and
writes the manifest LAST: a reader never sees a partial checkpoint. It drops
the step's leases, applies ``keep`` and collects unreferenced objects.

A failure (server down, denied, throttled past the limit, a rank too slow) is
reported through ``on_event`` as a ``ckpt_tier_failure`` event and ends that
step's upload only: the checkpoint stays on the faster tiers, training goes
on, the next step tries again (sending only what is still missing).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from hetrun.dag.object_store_spec import DEFAULT_MAX_FETCH_RATIO
from hetrun.runtime.ckpt import codec
from hetrun.runtime.ckpt.object_store import ObjectStore
from hetrun.runtime.ckpt.objects import MAX_CHAIN, Tier, check_hash, object_parts
from hetrun.runtime.ckpt.store import CheckpointStore

from hetrun.backoff import Backoff, poll_until
from hetrun.errors import CheckpointError
from hetrun.rundir import DEFAULTS

TIER_NAME = "object"


class ObjectUploader:
    def __init__(self, store: ObjectStore, tiers: list[Tier], *, rank: int, world_size: int, keep: int,
                 on_event: Callable[[dict[str, Any]], None] | None = None, shard_wait_s: float = DEFAULTS.object_shard_wait_s,
                 max_fetch_ratio: float = DEFAULT_MAX_FETCH_RATIO) -> None:
        self.store = store
        self.tiers = tiers
        self.rank, self.world_size, self.keep = rank, world_size, keep
        self.on_event = on_event
        self.shard_wait_s = shard_wait_s
        self.max_fetch_ratio = max_fetch_ratio
        self._known: set[str] = set()  # objects this rank sent or saw in the bucket
        # Bytes a restore downloads for an object this rank sent (itself + its bucket bases);
        # an object only listed is not in it, so nothing is sent as a delta on it.
        self._chain_bytes: dict[str, int] = {}
        self._local = threading.local()  # per upload thread: the codec's compressor and scratch
        self._generation: str | None = None
        self._listed = False
        self._cond = threading.Condition()
        self._pending: int | None = None
        self._busy = False
        self._closed = False
        self.results: list[dict[str, Any]] = []
        self._thread = threading.Thread(target=self._run, name="ckpt-upload", daemon=True)
        self._thread.start()

    # -- the writer's side ----------------------------------------------------------------
    def submit(self, step: int) -> None:
        with self._cond:
            if self._pending is not None and self._pending != step:
                # Not a failure: the newer checkpoint holds everything the bucket needs.
                self._emit({"ev": "ckpt_upload_skipped", "tier": TIER_NAME, "step": self._pending,
                            "replaced_by": step, "message": "a newer checkpoint committed before its upload began"})
            self._pending = step
            self._cond.notify_all()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until nothing is queued or uploading; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._pending is None and not self._busy, timeout)

    def close(self, timeout: float | None = None) -> bool:
        done = self.wait(timeout)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        return done

    # -- the upload thread --------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending is not None or self._closed)
                if self._pending is None:
                    return
                step, self._pending, self._busy = self._pending, None, True
            t0 = time.perf_counter()
            try:
                stats = self.upload(step)
                stats.update(ev="ckpt_upload", tier=TIER_NAME, step=step, ok=True, url=str(self.store),
                             seconds=round(time.perf_counter() - t0, 4))
                self.results.append(stats)
                self._emit(stats)
            except CheckpointError as exc:
                self._emit_failure(step, exc.message, seconds=round(time.perf_counter() - t0, 4))
            except Exception as exc:  # never let the thread die: the next step retries
                self._emit_failure(step, f"{type(exc).__name__}: {exc}")
            with self._cond:
                self._busy = False
                self._cond.notify_all()

    def _emit(self, ev: dict[str, Any]) -> None:
        if self.on_event is not None:
            with contextlib.suppress(Exception):  # reporting must never stop the upload thread
                self.on_event(ev)

    def _emit_failure(self, step: int, error: str, **extra: Any) -> None:
        ev = {"ev": "ckpt_tier_failure", "tier": TIER_NAME, "op": "upload", "step": step, "ok": False,
              "url": str(self.store), "error": error,
              "message": "the checkpoint stays on the faster tiers; training goes on", **extra}
        self.results.append(ev)
        self._emit(ev)

    # -- one step ---------------------------------------------------------------------------
    def _source(self, step: int) -> Tier:
        rel = self.tiers[0].shard_rel(step, self.rank)
        for t in self.tiers:
            if (t.root / rel).is_file():
                return t
        raise CheckpointError(f"step {step}: shard {rel} is in none of the tiers (retired before its upload)")

    def _closure(self, src: Tier, shard: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """Every object the shard needs (its chunks and their delta bases), in walk order,
        with its header: each header is read once here and reused by the upload."""
        need: dict[str, dict[str, Any]] = {}
        for td in shard.get("tensors", []):
            for h, _n in td.get("chunks", []):
                cur: str | None = check_hash(h, "shard chunk")
                depth = 0
                while cur and cur not in need:
                    header = need[cur] = src.read_object_header(cur)
                    base = header.get("base")
                    cur = check_hash(base, "object base") if base else None
                    depth += 1
                    if depth > MAX_CHAIN:
                        raise CheckpointError(f"chunk {h[:16]}… has an overlong delta chain; corrupt")
        return need

    def _whole(self, decoder: CheckpointStore, h: str, nbytes: int, itemsize: int, names: str) -> bytes:
        """Object ``h`` re-encoded with no delta base: its raw bytes decoded from ``src``
        (checked against its name) and encoded as the writer encodes a full chunk."""
        loc = self._local
        if getattr(loc, "cctx", None) is None:
            loc.cctx, loc.scratch, loc.raw = codec.new_compressor(), codec.Scratch(), codec.Scratch()
        raw = loc.raw.get("raw", nbytes)
        decoder.decode_chunk(h, raw, names=names)
        enc = codec.encode(raw, itemsize, None, compressor=loc.cctx, scratch=loc.scratch)
        # The parts point into the scratch: joined before this thread's next encode.
        return b"".join(object_parts(codec.object_header(enc, nbytes), enc.parts))

    def upload(self, step: int) -> dict[str, Any]:
        store = self.store
        store.take_lease(step, self.rank)
        gen = store.generation()
        fresh = gen != self._generation or not self._listed
        if fresh:
            # A GC deleted something since (believe nothing cached), or a first upload: one
            # LIST (1,000 keys a request) says what the bucket holds, instead of a HEAD per chunk.
            self._known = {o.rel.rsplit("/", 1)[-1] for o in store.list("objects/")}
            self._chain_bytes = {h: n for h, n in self._chain_bytes.items() if h in self._known}
            self._generation, self._listed = gen, True
        src = self._source(step)
        shard_rel = src.shard_rel(step, self.rank)
        shard_bytes = (src.root / shard_rel).read_bytes()
        shard = json.loads(shard_bytes)
        need = self._closure(src, shard)
        chunks = _chunks(shard)
        # Chunks this rank neither sent nor listed: missing when the LIST was just now, else
        # asked with HEAD (another rank of the store may have sent one since).
        unknown = [] if fresh else [h for h in chunks if h not in self._known]
        sent = sent_bytes = reencoded = 0
        decoder = CheckpointStore([src], threads=1)
        names = str(shard.get("names", "sha256"))

        def send(h: str) -> tuple[int, bool]:
            path = src.object_path(h)
            size = os.stat(path).st_size
            base = need[h].get("base")
            chain = size if not base else size + self._chain_bytes.get(str(base), 1 << 62)
            if chain <= max(size, self.max_fetch_ratio * chunks[h]):
                store.put_file(store.object_rel(h), str(path), size)
                self._chain_bytes[h] = chain
                return size, False
            data = self._whole(decoder, h, chunks[h], int(need[h].get("itemsize", 1)), names)
            store.put(store.object_rel(h), data)
            self._chain_bytes[h] = len(data)
            return len(data), True

        pool = ThreadPoolExecutor(store.threads, thread_name_prefix="ckpt-upload-io")
        try:
            present = _all(pool, lambda h: store.exists(store.object_rel(h)), unknown)
            self._known.update(h for h, there in zip(unknown, present, strict=True) if there)
            missing = [h for h in chunks if h not in self._known]
            for h, (size, whole) in zip(missing, _all(pool, send, missing), strict=True):
                self._known.add(h)
                sent += 1
                sent_bytes += size
                reencoded += whole
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        refs = json.dumps({"step": step, "rank": self.rank, "objects": list(need)}, separators=(",", ":")).encode()
        store.put(shard_rel.removesuffix(".json") + ".refs.json", refs)
        store.put(shard_rel, shard_bytes)  # the rank's part is complete once this exists
        sent_bytes += len(refs) + len(shard_bytes)
        stats: dict[str, Any] = {"objects": len(need), "uploaded_objects": sent, "uploaded_bytes": sent_bytes,
                                 "reencoded_objects": reencoded}
        if self.rank == 0:
            stats.update(self._commit(step, src))
        return stats

    def _commit(self, step: int, src: Tier) -> dict[str, Any]:
        """Rank 0: wait for every shard, write the manifest last, drop leases, keep, GC."""
        store = self.store
        prefix = f"shards/{step:012d}/"
        wanted = {src.shard_rel(step, r).removeprefix(prefix) for r in range(self.world_size)}

        def all_there() -> bool:
            have = {o.rel.removeprefix(prefix) for o in store.list(prefix)}
            return wanted <= have

        if not poll_until(all_there, Backoff(0.1, 2.0), timeout=self.shard_wait_s):
            store.release_leases(step)
            raise CheckpointError(f"step {step}: not every rank's shard reached the bucket within "
                                  f"{self.shard_wait_s:.0f} s; no manifest written")
        man = next((t for t in self.tiers if step in t.manifest_steps()), None)
        if man is None:
            store.release_leases(step)
            raise CheckpointError(f"step {step}: its manifest is in none of the tiers (retired before its upload)")
        store.put(f"manifests/{step:012d}.json", man.manifest_path(step).read_bytes())
        store.release_leases(step)
        out: dict[str, Any] = {"committed": True}
        dropped = store.retain(self.keep)
        if dropped:
            out["retired"] = dropped
        try:
            deleted, freed, why = store.gc()
            out["gc_deleted"], out["gc_freed_bytes"] = deleted, freed
            if why:
                out["gc_skipped"] = why
        except CheckpointError as exc:  # best effort; `hetrun ckpt gc URL` finishes it
            out["gc_skipped"] = str(exc)
        return out


def _chunks(shard: dict[str, Any]) -> dict[str, int]:
    """The shard's chunks, in order, each once: object name -> raw bytes."""
    out: dict[str, int] = {}
    for td in shard.get("tensors", []):
        for h, n in td.get("chunks", []):
            if not isinstance(n, int) or n <= 0:
                raise CheckpointError(f"chunk {str(h)[:16]}… has length {n!r}; the shard is corrupt")
            out.setdefault(check_hash(h, "shard chunk"), n)
    return out


def _all(pool: ThreadPoolExecutor, fn: Callable[[str], Any], items: list[str]) -> list[Any]:
    """``fn`` over ``items`` on ``pool``; at the first failure the queued calls are
    cancelled (a dead server fails one request, not every one after its retries)."""
    futures = [pool.submit(fn, x) for x in items]
    try:
        return [f.result() for f in futures]
    except BaseException:
        for f in futures:
            f.cancel()
        raise
