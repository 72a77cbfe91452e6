"""One component's checkpoint store in an S3 bucket: keys, requests, leases, retention, GC.

The layout mirrors a file-system tier (runtime/ckpt/objects.py) byte for byte
under ``<prefix>/<component>/``, so restore decodes the very bytes the other
tiers hold (bit-identical by construction) and every chunk is checked against
its content hash on the way:

    objects/<h[:2]>/<h>                 a chunk, named by the BLAKE3 of its raw bytes
    shards/<step>/rank-<r>.json         one rank's shard document (same bytes)
    shards/<step>/rank-<r>.refs.json    every object that shard needs (chunks + delta bases)
    manifests/<step>.json               the checkpoint: written LAST, after every shard
    leases/<step>/rank-<r>              an upload in progress (GC keeps off)
    gc.lock, gc.generation              a GC in progress; bumped after every deletion

Why the leases: an upload skips chunks the bucket already holds, so a GC
deleting an unreferenced chunk at that moment would break the checkpoint being
uploaded. Both sides write their flag, then read the other's (S3 is strongly
consistent since 2020; SeaweedFS too): an uploader that finds ``gc.lock``
waits for it to go; a GC that finds a fresh lease deletes nothing. Uploaders
forget what they believed the bucket held when ``gc.generation`` changed.

Keys spread by content hash: ``objects/`` is split by two hex digits, and S3
partitions a prefix as its request rate grows (docs/OBJECT_STORE.md works out
the rate at 1,000 ranks).
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from hetrun.dag.object_store_spec import DEFAULT_MAX_FETCH_RATIO
from hetrun.runtime.ckpt import object_preflight, s3_client, s3_fast_get
from hetrun.runtime.ckpt.objects import check_hash
from hetrun.runtime.ckpt.s3_client import S3Url, with_backoff
from hetrun.runtime.ckpt.s3_fast_get import FastGet, FastGetSlot

from hetrun.backoff import Backoff, poll_until
from hetrun.errors import CheckpointError
from hetrun.rundir import DEFAULTS

T = TypeVar("T")
_MANIFEST_KEY_RE = re.compile(r"manifests/([0-9]{12})\.json")
_SHARD_KEY_RE = re.compile(r"shards/([0-9]{12})/rank-([0-9]{6})(\.refs)?\.json")
_LEASE_RE = re.compile(r"leases/([0-9]{12})/rank-([0-9]{6})")
# A lease or a GC lock older than this is a crashed process's: ignored and removed.
LEASE_TTL_S = 3600.0
# Objects younger than this are never deleted by GC (a clock-skew margin on LastModified).
GC_GRACE_S = 60.0


@dataclass(frozen=True)
class Listed:
    rel: str
    size: int
    modified: float  # epoch seconds (the server's LastModified)


@dataclass(frozen=True)
class ObjectStoreConfig:
    """``checkpoint.object_store`` of a job file (no credentials: see s3_client)."""

    url: str
    endpoint: str | None = None
    region: str | None = None
    profile: str | None = None
    upload_threads: int = DEFAULTS.object_upload_threads
    shard_wait_s: float = DEFAULTS.object_shard_wait_s
    max_fetch_ratio: float = DEFAULT_MAX_FETCH_RATIO

    @classmethod
    def from_plan(cls, cfg: dict[str, Any] | None) -> ObjectStoreConfig | None:
        """From plan.json's ``checkpoint`` section (None: no object tier)."""
        obj = (cfg or {}).get("object_store")
        if not obj:
            return None
        return cls(url=str(obj["url"]), endpoint=obj.get("endpoint"), region=obj.get("region"),
                   profile=obj.get("profile"), upload_threads=int(obj.get("upload_threads") or DEFAULTS.object_upload_threads),
                   shard_wait_s=float(obj.get("shard_wait_s") or DEFAULTS.object_shard_wait_s),
                   max_fetch_ratio=float(obj.get("max_fetch_ratio", DEFAULT_MAX_FETCH_RATIO)))


class ObjectStore:
    """Requests against one store root (``s3://bucket/prefix``); throttling is retried
    with hetrun/backoff.py, every other error raises CheckpointError in words."""

    def __init__(self, url: str | S3Url, *, endpoint: str | None = None, region: str | None = None,
                 profile: str | None = None, client: Any = None, threads: int = DEFAULTS.object_upload_threads,
                 env: dict[str, str] | None = None, read_retry_s: float = s3_client.READ_RETRY_S) -> None:
        self.url = url if isinstance(url, S3Url) else s3_client.parse_url(url)
        self.endpoint, self.region, self.profile, self.env = endpoint, region, profile, env
        self.threads = max(1, threads)
        self.read_retry_s = read_retry_s  # how long a read waits out a 5xx or a silent server
        self._client = client
        self._client_lock = threading.Lock()
        self._warming: threading.Thread | None = None
        # GETs and directory listings through obstore where installed (s3_fast_get.py);
        # benchmarks/ckpt_s3.py switches it off to time boto3's alone.
        self.fast_get = FastGetSlot()

    @classmethod
    def from_config(cls, cfg: ObjectStoreConfig, component: str | None = None,
                    env: dict[str, str] | None = None) -> ObjectStore:
        url = s3_client.parse_url(cfg.url)
        return cls(url.child(component) if component else url, endpoint=cfg.endpoint, region=cfg.region,
                   profile=cfg.profile, threads=cfg.upload_threads, env=env)

    def child(self, name: str) -> ObjectStore:
        return ObjectStore(self.url.child(name), endpoint=self.endpoint, region=self.region,
                           profile=self.profile, client=self._client, threads=self.threads, env=self.env,
                           read_retry_s=self.read_retry_s)

    def warm(self) -> ObjectStore:
        """Start making the client on a thread of its own: boto3's import and its S3
        service model cost 0.1-1.8 s of CPU (benchmarks/ckpt_s3.md), which then overlap
        whatever the caller does before its first request. Errors surface at that request."""
        with self._client_lock:
            if self._client is None and self._warming is None:
                self._warming = threading.Thread(target=self._warm, name="ckpt-s3-client", daemon=True)
                self._warming.start()
        return self

    def _warm(self) -> None:
        with contextlib.suppress(Exception):  # the first request makes it again and says why
            self._make_client()

    def _make_client(self) -> Any:
        with self._client_lock:
            if self._client is None:
                self._client = s3_client.make_client(self.endpoint, region=self.region, profile=self.profile,
                                                     env=self.env, pool=max(16, 2 * self.threads))
            return self._client

    @property
    def client(self) -> Any:
        if self._client is None:
            warming = self._warming
            if warming is not None and warming is not threading.current_thread():
                warming.join()
            try:
                return self._make_client()
            except Exception as exc:
                raise CheckpointError(s3_client.describe(exc, str(self.url)), hint=s3_client.CREDENTIAL_HINT) from exc
        return self._client

    def __str__(self) -> str:
        return str(self.url)

    def _fail(self, exc: Exception, rel: str, what: str) -> CheckpointError:
        if isinstance(exc, CheckpointError):  # already in words (the client could not be made)
            return exc
        return CheckpointError(s3_client.describe(exc, f"{what} {self.url}/{rel}"), hint=s3_client.hint_for(exc))

    def _read(self, call: Callable[[], T]) -> T:
        """A read request: throttling, 5xx answers and silence retried (s3_client.with_backoff)."""
        return with_backoff(call, retry_s=self.read_retry_s)

    def pages(self, rel_prefix: str, **kw: Any) -> Iterator[dict[str, Any]]:
        """ListObjectsV2 pages under ``rel_prefix`` (1,000 keys each), each page a retried read;
        ``kw``: more ListObjectsV2 arguments (``Delimiter``)."""
        args: dict[str, Any] = {"Bucket": self.url.bucket, "Prefix": self.url.key(rel_prefix), **kw}
        while True:
            page = self._read(lambda a=dict(args): self.client.list_objects_v2(**a))
            yield page
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return
            args["ContinuationToken"] = token

    # -- single requests ------------------------------------------------------------
    def put(self, rel: str, data: bytes | memoryview) -> None:
        key = self.url.key(rel)
        try:
            with_backoff(lambda: self.client.put_object(Bucket=self.url.bucket, Key=key, Body=bytes(data)))
        except Exception as exc:
            raise self._fail(exc, rel, "cannot write") from exc

    def put_file(self, rel: str, path: str, size: int, multipart_bytes: int = 64 << 20) -> None:
        """Upload a file; multipart (s3transfer, parts in parallel) above ``multipart_bytes``."""
        key = self.url.key(rel)
        try:
            if size < multipart_bytes:
                with open(path, "rb") as f:
                    data = f.read()
                with_backoff(lambda: self.client.put_object(Bucket=self.url.bucket, Key=key, Body=data))
            else:
                from boto3.s3.transfer import TransferConfig

                cfg = TransferConfig(multipart_threshold=multipart_bytes, multipart_chunksize=16 << 20,
                                     max_concurrency=4, use_threads=True)
                with_backoff(lambda: self.client.upload_file(path, self.url.bucket, key, Config=cfg))
        except Exception as exc:
            raise self._fail(exc, rel, "cannot write") from exc

    def get(self, rel: str) -> bytes:
        body = self.get_object_body(rel)
        return body if isinstance(body, bytes) else bytes(body)

    def _get(self, rel: str) -> bytes:
        """boto3's GET: retried and reported in words."""
        key = self.url.key(rel)
        try:
            # The body is read inside the retried call: a server that dies mid-body is retried too.
            return self._read(lambda: self.client.get_object(Bucket=self.url.bucket, Key=key)["Body"].read())
        except Exception as exc:
            if s3_client.is_missing(exc):
                raise self._missing(rel) from None
            raise self._fail(exc, rel, "cannot read") from exc

    # -- reads through obstore where installed (s3_fast_get.py) ----------------------------
    def _fast_without_client(self) -> FastGet | None:
        return s3_fast_get.without_client(self.url.bucket, endpoint=self.endpoint, region=self.region,
                                          profile=self.profile, env=self.env)

    def _make_fast(self) -> FastGet:
        fast = self._fast_without_client()
        return fast if fast is not None else s3_fast_get.from_client(self.client, self.url.bucket,
                                                                     profile=self.profile, env=self.env)

    def prepare_fast_reads(self) -> bool:
        """True when reads can go through obstore with no boto3 client made (a restore then
        never makes one: its reads are GETs and the manifests' listing)."""
        return self.fast_get.prepare(self._fast_without_client)

    def get_object_body(self, rel: str) -> Any:
        """``get(rel)`` without a copy: obstore's body (bytes-like) while that path works, else
        boto3's bytes (s3_fast_get.py says when and why it stopped)."""
        key = self.url.key(rel)
        try:
            body = self.fast_get.call(self._make_fast, lambda fast: fast.get(key))
        except FileNotFoundError:
            raise self._missing(rel) from None
        return self._get(rel) if body is None else body

    def _missing(self, rel: str) -> CheckpointError:
        return CheckpointError(f"{self.url}/{rel} is missing from the bucket")

    def get_to(self, rel: str, path: str) -> int:
        """Download to ``path`` (written whole or not at all by the caller's rename)."""
        data = self.get(rel)
        with open(path, "wb") as f:
            f.write(data)
        return len(data)

    def exists(self, rel: str) -> bool:
        key = self.url.key(rel)
        try:
            self._read(lambda: self.client.head_object(Bucket=self.url.bucket, Key=key))
            return True
        except Exception as exc:
            if s3_client.is_missing(exc):
                return False
            raise self._fail(exc, rel, "cannot read") from exc

    def delete(self, rels: list[str]) -> int:
        """Delete keys, 1,000 per request (DeleteObjects); returns how many."""
        done = 0
        for i in range(0, len(rels), 1000):
            batch = [{"Key": self.url.key(r)} for r in rels[i : i + 1000]]
            try:
                with_backoff(lambda b=batch: self.client.delete_objects(
                    Bucket=self.url.bucket, Delete={"Objects": b, "Quiet": True}))
            except Exception as exc:
                raise self._fail(exc, rels[i], "cannot delete") from exc
            done += len(batch)
        return done

    def list(self, rel_prefix: str) -> Iterator[Listed]:
        """Every key under ``rel_prefix`` (paginated, 1,000 per request). A "directory" (a
        prefix ending in /) is listed through obstore while that path works (s3_fast_get.py),
        which lists whole path segments only; any other prefix through boto3."""
        base = self.url.key("")
        if rel_prefix.endswith("/"):
            fast = self.fast_get.call(self._make_fast, lambda f: f.keys_under(self.url.key(rel_prefix)))
            if fast is not None:
                yield from (Listed(k[len(base):], n, t) for k, n, t in fast)
                return
        try:
            for page in self.pages(rel_prefix):
                for o in page.get("Contents", []) or []:
                    yield Listed(o["Key"][len(base):], int(o.get("Size", 0)), o["LastModified"].timestamp())
        except Exception as exc:
            raise self._fail(exc, rel_prefix, "cannot list") from exc

    # -- checks before a job is queued ------------------------------------------------
    def check_writable(self) -> None:
        """Reachable, the bucket exists, these credentials may write and delete here:
        CheckpointError in words otherwise (runtime/ckpt/object_preflight.py, torch-free)."""
        object_preflight.check_writable(self.client, self.url, endpoint=self.endpoint, env=self.env)

    # -- store documents ---------------------------------------------------------------
    @staticmethod
    def object_rel(h: str) -> str:
        return f"objects/{h[:2]}/{check_hash(h, 'object name')}"

    def manifest_steps(self) -> list[int]:
        steps = []
        for o in self.list("manifests/"):
            m = _MANIFEST_KEY_RE.fullmatch(o.rel)
            if m:
                steps.append(int(m.group(1)))
        return sorted(steps)

    # -- leases and the GC lock ------------------------------------------------------------
    def lease_rel(self, step: int, rank: int) -> str:
        return f"leases/{step:012d}/rank-{rank:06d}"

    def take_lease(self, step: int, rank: int, *, wait_s: float = 600.0) -> None:
        """Announce an upload, then wait while a GC holds the lock (see the module doc)."""
        self.put(self.lease_rel(step, rank), json.dumps({"host": socket.gethostname(), "time": time.time()}).encode())
        if not poll_until(lambda: not self._gc_running(), Backoff(0.2, 5.0), timeout=wait_s):
            raise CheckpointError(f"{self.url}: a GC held gc.lock for over {wait_s:.0f} s; upload postponed")

    def release_leases(self, step: int) -> None:
        self.delete([o.rel for o in self.list(f"leases/{step:012d}/")])

    def _gc_running(self) -> bool:
        for o in self.list("gc.lock"):
            if o.rel == "gc.lock" and time.time() - o.modified < LEASE_TTL_S:
                return True
        return False

    def generation(self) -> str:
        """Changes whenever a GC deleted anything: cached beliefs about the bucket are void then."""
        try:
            return self.get("gc.generation").decode(errors="replace")
        except CheckpointError as exc:
            if "missing" in str(exc):
                return ""
            raise

    # -- retention and GC -----------------------------------------------------------------
    def retain(self, keep: int) -> list[int]:
        """Delete all but the newest ``keep`` manifests; returns the steps dropped."""
        steps = self.manifest_steps()
        doomed = steps[: max(0, len(steps) - max(1, keep))]
        self.delete([f"manifests/{s:012d}.json" for s in doomed])
        return doomed

    def gc(self, *, grace_s: float = GC_GRACE_S) -> tuple[int, int, str | None]:
        """Delete objects, shards and refs no manifest needs. Returns (keys deleted,
        bytes freed, why nothing was deleted or None). Never while an upload holds
        a fresh lease; never an object younger than ``grace_s``."""
        self.put("gc.lock", json.dumps({"host": socket.gethostname(), "time": time.time()}).encode())
        try:
            stale = []
            for o in self.list("leases/"):
                if time.time() - o.modified < LEASE_TTL_S:
                    return 0, 0, f"an upload is in progress ({o.rel}); nothing deleted, run gc again later"
                stale.append(o.rel)
            live, live_shards = self._live()
            cutoff = time.time() - grace_s
            doomed: list[Listed] = []
            for o in self.list("objects/"):
                if o.rel.rsplit("/", 1)[-1] not in live and o.modified < cutoff:
                    doomed.append(o)
            for o in self.list("shards/"):
                m = _SHARD_KEY_RE.fullmatch(o.rel)
                if m and int(m.group(1)) not in live_shards and o.modified < cutoff:
                    doomed.append(o)
            if doomed:
                self.put("gc.generation", uuid.uuid4().hex.encode())
                self.delete([o.rel for o in doomed])
            self.delete(stale)
            return len(doomed), sum(o.size for o in doomed), None
        finally:
            with contextlib.suppress(CheckpointError):
                self.delete(["gc.lock"])

    def _live(self) -> tuple[set[str], set[int]]:
        """Every object any manifest needs (chunks and delta bases, from the refs
        documents) and the steps whose shards stay."""
        live: set[str] = set()
        steps = set(self.manifest_steps())
        for step in steps:
            man = json.loads(self.get(f"manifests/{step:012d}.json"))
            rels = [str(e["path"]).removesuffix(".json") + ".refs.json" for e in man["shards"]]
            with ThreadPoolExecutor(self.threads) as pool:
                for refs in pool.map(self.get, rels):
                    live.update(json.loads(refs)["objects"])
        return live, steps


def component_stores(store: ObjectStore) -> list[tuple[str, ObjectStore]]:
    """(label, store) for what a URL names: one component's store (it has
    manifests/), else each component store one level below it."""
    if any(True for _ in store.list("manifests/")):
        return [(store.url.prefix.rsplit("/", 1)[-1] or store.url.bucket, store)]
    base = store.url.key("")
    try:
        names = [p["Prefix"][len(base):].strip("/") for page in store.pages("", Delimiter="/")
                 for p in page.get("CommonPrefixes", []) or []]
    except Exception as exc:
        raise store._fail(exc, "", "cannot list") from exc
    out = []
    for name in sorted(names):
        child = store.child(name)
        if any(True for _ in child.list("manifests/")):
            out.append((name, child))
    return out
