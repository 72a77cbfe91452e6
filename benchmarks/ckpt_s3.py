"""Object-store tier benchmark: hetrun's checkpoint upload/restore against a real
S3 server (SeaweedFS ``weed server -s3`` on loopback, started here), each
figure beside its peer in the same run.

    python benchmarks/ckpt_s3.py                # 134M GPT (benchmarks/ckpt_bench.py's)
    python benchmarks/ckpt_s3.py --small        # a 10M model, for a quick look
    python benchmarks/ckpt_s3.py --restore-only # where a bucket restore's time goes (minutes)
    python benchmarks/ckpt_s3.py --bytes-only   # 134M GPT: upload bytes, default vs local chains
    python benchmarks/ckpt_s3.py --bytes-only --restores  # ... and each checkpoint's restore, timed

Sections:
  clients   the same 4 MiB random objects PUT in parallel by boto3 and by
            obstore (and s3fs where installed): how the client was chosen
  upload    hetrun's first checkpoint of the GPT state uploaded by the tier
            (HEAD + PUT only what the bucket lacks, then shard, refs,
            manifest) vs a plain parallel PUT of the same object files with
            the same client and threads (target >= 80%)
  bytes     bytes uploaded for the checkpoints 2 and N steps later vs the
            bytes the local store added for them (target: no more)
  restore   newest checkpoint from the bucket alone (download + decode +
            verify) vs from the local tier (target <= 2x)
  stall     save() stall with the upload of the previous step in flight vs a
            writer with no object tier (target: unchanged)
  gpt_bytes (--bytes-only, alone) the GPT's checkpoints 2 and N steps after the
            first uploaded side by side with the default max_fetch_ratio and with
            64 (the local tier's chains): bytes uploaded vs what the local store
            added, and the bytes a restore of each would download
  restore_breakdown (--restore-only, alone) bucket restores (chains kept short
            by the uploader, and the local tier's chains) beside the local
            tier's restore and a plain parallel GET of the objects each
            downloaded, alternating rounds; the product's restores (objects
            through obstore where installed) beside the same restores with
            boto3's GETs alone (``*_boto3``)
Every restore is checked bit-exact against the live state.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ckpt_bench import GPT, full_state, same, train

ROOT = Path(f"/var/tmp/hetrun-ckpt-s3-bench-{os.getpid()}")  # one per run: runs may overlap
BUCKET = "bench"


def _objects(tier_root: Path) -> list[Path]:
    return sorted(p for p in (tier_root / "objects").rglob("*") if p.is_file())


def bench_clients(srv: Any, mb: int, threads: int, rounds: int = 3) -> dict[str, Any]:
    """The same random objects through each client, PUT in parallel; rounds alternate
    the clients (the machine's load moves), the median is reported."""
    import statistics

    from hetrun.runtime.ckpt import s3_client

    n = max(8, mb // 4)
    blobs = [os.urandom(4 << 20) for _ in range(n)]
    c = s3_client.make_client(None, env=srv.env(), pool=threads * 2)
    put: dict[str, Any] = {"boto3": lambda key, i: c.put_object(Bucket=BUCKET, Key=key, Body=blobs[i])}
    try:
        import obstore
        from obstore.store import S3Store

        env = srv.env()
        st = S3Store(BUCKET, endpoint=srv.endpoint, access_key_id=env["AWS_ACCESS_KEY_ID"],
                     secret_access_key=env["AWS_SECRET_ACCESS_KEY"], region="us-east-1",
                     client_options={"allow_http": True})
        put["obstore"] = lambda key, i: obstore.put(st, key, blobs[i])
    except ImportError:
        pass
    speeds: dict[str, list[float]] = {k: [] for k in put}
    for _round in range(rounds):
        for name, fn in put.items():
            prefix = f"clients-{uuid.uuid4().hex[:6]}/{name}"
            t0 = time.perf_counter()
            with ThreadPoolExecutor(threads) as pool:
                list(pool.map(lambda i, fn=fn, prefix=prefix: fn(f"{prefix}/{i}", i), range(n)))
            speeds[name].append(n * (4 << 20) / (time.perf_counter() - t0) / 1e6)
    out: dict[str, Any] = {"objects": n, "bytes": n * (4 << 20), "threads": threads, "rounds": rounds}
    for name, v in speeds.items():
        out[f"{name}_MBps"] = statistics.median(v)
        out[f"{name}_MBps_all"] = v
    try:
        import s3fs  # noqa: F401

        out["s3fs"] = "installed, not measured"
    except ImportError:
        out["s3fs"] = "not installed (its aiobotocore client is botocore underneath)"
    return out


def plain_put(srv: Any, files: list[Path], threads: int) -> float:
    """Seconds for a plain parallel PUT of these files (one request each) with boto3."""
    from hetrun.runtime.ckpt import s3_client

    c = s3_client.make_client(None, env=srv.env(), pool=max(16, threads * 2))
    prefix = f"plain-{uuid.uuid4().hex[:6]}"
    t0 = time.perf_counter()

    def put(p: Path) -> None:
        c.put_object(Bucket=BUCKET, Key=f"{prefix}/{p.name}", Body=p.read_bytes())

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(put, files))
    return time.perf_counter() - t0


class Tiered:
    """A checkpoint writer on a local tier with the object tier attached, as resume.py wires it."""

    def __init__(self, srv: Any, name: str, threads: int, upload_threads: int, upload: bool = True,
                 **writer_kw: Any) -> None:
        from hetrun.runtime.ckpt import Tier
        from hetrun.runtime.ckpt.object_store import ObjectStore
        from hetrun.runtime.ckpt.object_upload import ObjectUploader
        from hetrun.runtime.ckpt.writer import CheckpointWriter

        self.dir = ROOT / name
        shutil.rmtree(self.dir, ignore_errors=True)
        self.tier = Tier(self.dir)
        self.events: list[dict[str, Any]] = []
        self.store = ObjectStore(f"s3://{BUCKET}/{name}-{uuid.uuid4().hex[:6]}/train", env=srv.env(),
                                 threads=upload_threads)
        self.up = ObjectUploader(self.store, [self.tier], rank=0, world_size=1, keep=3,
                                 on_event=self.events.append) if upload else None
        self.writer = CheckpointWriter([self.tier], keep=3, threads=threads,
                                       on_event=(lambda e: e["ok"] and self.up.submit(e["step"])) if upload else None,
                                       **writer_kw)

    def save(self, step: int, st: Any, *, wait_upload: bool = True) -> dict[str, Any]:
        before = set(_objects(self.dir))
        stall = self.writer.save(step, st)
        res = self.writer.wait()
        assert res is not None and res.ok, res
        # What the local store added on disk: its new object files (headers included) and the shard.
        added = sum(p.stat().st_size for p in set(_objects(self.dir)) - before)
        shard = self.dir / self.tier.shard_rel(step, 0)
        out: dict[str, Any] = {"stall_s": stall, "local_stored_bytes": res.stored_bytes, "write_s": res.write_s,
                               "local_added_bytes": added + shard.stat().st_size}
        if self.up is not None and wait_upload:
            assert self.up.wait(1800)
            ev = self.events[-1]
            assert ev["ev"] == "ckpt_upload", ev
            out.update(uploaded_bytes=ev["uploaded_bytes"], uploaded_objects=ev["uploaded_objects"],
                       objects=ev["objects"], upload_s=ev["seconds"])
            out["uploaded_over_local"] = out["uploaded_bytes"] / out["local_added_bytes"]
        return out

    def close(self) -> None:
        self.writer.close()
        if self.up is not None:
            self.up.close(600)


def restore_pair(t: Tiered, st: Any, threads: int) -> dict[str, Any]:
    os.sync()
    local_s = _timed_restore_local(t.dir, st, threads)
    bucket_s = _timed_restore_bucket(t.store, st, threads)
    return {"local_s": local_s, "bucket_s": bucket_s, "ratio": bucket_s / local_s, "bit_identical": True}


def _timed_restore_local(directory: Path, st: Any, threads: int) -> float:
    """Seconds to restore the newest checkpoint from the local tier alone (checked bit-exact)."""
    from hetrun.runtime.ckpt import CheckpointStore, Tier

    t0 = time.perf_counter()
    local = CheckpointStore([Tier(directory)], threads=threads).restore()
    seconds = time.perf_counter() - t0
    assert local is not None and same(local.state, st)
    return seconds


def _timed_restore_bucket(store: Any, st: Any, threads: int) -> float:
    """Seconds to restore the newest checkpoint from ``store``'s prefix alone, as a job restores
    (a fresh store, objects held in memory), checked bit-exact."""
    from hetrun.runtime.ckpt import CheckpointStore
    from hetrun.runtime.ckpt.object_store import ObjectStore
    from hetrun.runtime.ckpt.object_tier import MEMORY_BYTES, BucketTier

    tier = BucketTier(ObjectStore(store.url, env=store.env, threads=store.threads), ROOT / "cache",
                      memory_bytes=MEMORY_BYTES)
    t0 = time.perf_counter()
    remote = CheckpointStore([tier], threads=threads).restore()
    seconds = time.perf_counter() - t0
    assert remote is not None and remote.tier == "object" and same(remote.state, st)
    shutil.rmtree(ROOT / "cache", ignore_errors=True)
    return seconds


def restore_breakdown(srv: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Where a restore from the bucket spends its time (``--restore-only``): a 160 MB state of
    40 random fp32 tensors saved three times (each a delta on the last: the local tier's
    default chain), uploaded twice side by side: with the uploader's ``max_fetch_ratio``
    (default 1.2: chains the bucket keeps short) and with 64 (the local tier's chains, as
    before). Then per round, alternating: the local tier's restore; each bucket's restore
    as a job restores (a fresh tier: client creation, download and decode pipelined,
    objects held in memory until read, verify); the default one through the cache
    directory instead (as before, and as ``hetrun ckpt`` reads); the default one with its
    client made before the clock starts; a plain parallel GET of exactly the objects that
    restore downloaded (same client settings and threads, bytes discarded: the HTTP
    ceiling). CPU seconds of this process and of the weed server beside each: on two
    cores the server's, the client's and the decoder's work share them."""
    import statistics

    from hetrun.runtime.ckpt import CheckpointStore, Tier, s3_client
    from hetrun.runtime.ckpt.object_store import ObjectStore
    from hetrun.runtime.ckpt.object_tier import MEMORY_BYTES, BucketTier

    def server_cpu() -> float:
        fields = Path(f"/proc/{srv.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def timed(row: dict[str, float], name: str, fn: Any) -> Any:
        c0, s0, t0 = time.process_time(), server_cpu(), time.perf_counter()
        out = fn()
        row[f"{name}_s"] = time.perf_counter() - t0
        row[f"{name}_cpu_client_s"] = time.process_time() - c0
        row[f"{name}_cpu_server_s"] = server_cpu() - s0
        return out

    gen = torch.Generator().manual_seed(0)
    st = {f"t{i}": torch.randn(1_000_000, generator=gen) for i in range(40)}
    chain = {} if args.max_delta_chain is None else {"max_delta_chain": args.max_delta_chain}
    t = Tiered(srv, "synthetic", args.threads, args.upload_threads, **chain)
    ratios = {"bounded": args.max_fetch_ratio or (t.up.max_fetch_ratio if t.up else None), "unbounded": 64.0}
    stores = {"bounded": t.store}
    other = ObjectStore(f"s3://{BUCKET}/unbounded-{uuid.uuid4().hex[:6]}/train", env=srv.env(),
                        threads=args.upload_threads)
    stores["unbounded"] = other
    if args.max_fetch_ratio is not None:
        assert t.up is not None
        t.up.max_fetch_ratio = args.max_fetch_ratio
    from hetrun.runtime.ckpt.object_upload import ObjectUploader

    up2 = ObjectUploader(other, [t.tier], rank=0, world_size=1, keep=3, max_fetch_ratio=64.0)
    t.writer.prepare(st)
    uploads: dict[str, list[dict[str, Any]]] = {"bounded": [], "unbounded": []}
    for step, scale in ((1, 0.0), (2, 1e-4), (3, 1e-3)):
        for v in st.values():
            v.add_(scale * torch.randn(v.shape, generator=gen))
        out = t.save(step, st)
        uploads["bounded"].append({k: out[k] for k in ("uploaded_bytes", "upload_s", "local_added_bytes")})
        up2.submit(step)
        assert up2.wait(1800)
        ev = up2.results[-1]
        assert ev["ev"] == "ckpt_upload", ev
        uploads["unbounded"].append({"uploaded_bytes": ev["uploaded_bytes"], "upload_s": ev["seconds"]})
    up2.close(60)
    os.sync()
    obs = _obstore(srv)
    rows: list[dict[str, float]] = []
    for _round in range(args.rounds):
        row: dict[str, float] = {}
        local = timed(row, "local", lambda: CheckpointStore([Tier(t.dir)], threads=args.threads).restore())
        assert local is not None and same(local.state, st)
        del local
        # (name, store, memory_bytes, client made before the clock: what a job sees when
        # ObjectStore.warm overlaps its own setup, objects through obstore as the product
        # does where installed (runtime/ckpt/s3_fast_get.py), or boto3's GETs alone)
        runs = [("bounded", stores["bounded"], MEMORY_BYTES, False, True),
                ("bounded_warm", stores["bounded"], MEMORY_BYTES, True, True),
                ("bounded_boto3", stores["bounded"], MEMORY_BYTES, False, False),
                ("bounded_warm_boto3", stores["bounded"], MEMORY_BYTES, True, False),
                ("bounded_files_warm", stores["bounded"], 0, True, True),
                ("unbounded", stores["unbounded"], MEMORY_BYTES, False, True)]
        for name, store, memory, warm, fast in runs:
            reader = ObjectStore(store.url, env=store.env, threads=args.upload_threads)
            reader.fast_get.off = reader.fast_get.off or not fast  # before the tier: boto3's warm() as without obstore
            tier = BucketTier(reader, ROOT / "cache", memory_bytes=memory)
            if warm:
                tier.store.client  # noqa: B018
            remote = timed(row, name, lambda tier=tier: CheckpointStore([tier], threads=args.threads).restore())
            assert remote is not None and remote.tier == "object" and same(remote.state, st)
            del remote
            assert tier.store.fast_get.why_off is None, tier.store.fast_get.why_off  # off only where asked
            row[f"{name}_fast_gets"] = tier.store.fast_get.gets
            row[f"{name}_bytes"] = tier.fetched_bytes
            row[f"{name}_ratio"] = row[f"{name}_s"] / row["local_s"]
            fetched = list(tier.fetched)
            tier.close()
            shutil.rmtree(ROOT / "cache", ignore_errors=True)
            if name not in ("bounded", "unbounded"):
                continue  # the same objects as "bounded"
            c = s3_client.make_client(None, env=srv.env(), pool=max(16, 2 * args.upload_threads))

            def plain_get(c: Any = c, store: Any = store, fetched: list[str] = fetched) -> None:
                with ThreadPoolExecutor(args.upload_threads) as pool:
                    list(pool.map(lambda h: len(c.get_object(
                        Bucket=BUCKET, Key=store.url.key(store.object_rel(h)))["Body"].read()), fetched))

            timed(row, f"{name}_plain_get", plain_get)
            if obs is not None and name == "bounded":  # the same GETs through obstore (Rust)
                timed(row, "bounded_plain_get_obstore", lambda store=store, fetched=fetched: _obstore_get(
                    obs, [store.url.key(store.object_rel(h)) for h in fetched], args.upload_threads))
        row["bounded_warm_ratio"] = row["bounded_warm_s"] / row["local_s"]
        row["bounded_warm_over_plain_get"] = row["bounded_warm_s"] / row["bounded_plain_get_s"]
        # What client creation alone costs (a new boto3 session: as in a fresh process, boto3 imported).
        t0 = time.perf_counter()
        s3_client.make_client(None, env=srv.env(), pool=max(16, 2 * args.upload_threads))
        row["client_s"] = time.perf_counter() - t0
        row["load1"] = os.getloadavg()[0]
        rows.append(row)
    t.close()
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    return {"max_delta_chain": args.max_delta_chain or "default", "max_fetch_ratio": ratios,
            "state_bytes": 160_000_000, "uploads": uploads, "rounds": rows, "median": med}


def _obstore(srv: Any) -> Any:
    """An obstore S3 store on the benchmark's bucket, or None where obstore is not installed."""
    try:
        from obstore.store import S3Store
    except ImportError:
        return None
    env = srv.env()
    return S3Store(BUCKET, endpoint=srv.endpoint, access_key_id=env["AWS_ACCESS_KEY_ID"],
                   secret_access_key=env["AWS_SECRET_ACCESS_KEY"], region="us-east-1",
                   client_options={"allow_http": True})


def _obstore_get(st: Any, keys: list[str], threads: int) -> None:
    import obstore

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda k: len(obstore.get(st, k).bytes()), keys))


def gpt(args: argparse.Namespace, srv: Any) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    model = GPT(args.vocab, args.dim, args.layers, args.heads, args.seq)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    train(model, opt, 3, args.vocab, args.seq, gen)
    res: dict[str, Any] = {"params": sum(p.numel() for p in model.parameters())}
    st = full_state(model, opt)
    t = Tiered(srv, "gpt", args.threads, args.upload_threads)
    t.writer.prepare(st)
    first = t.save(3, st)
    res["state_bytes"] = sum(x.numel() * x.element_size() for x in _tensors(st))
    files = _objects(t.dir)
    plain_s = plain_put(srv, files, args.upload_threads)
    plain_bytes = sum(p.stat().st_size for p in files)
    res["upload"] = {"hetrun_MBps": first["uploaded_bytes"] / first["upload_s"] / 1e6,
                     "plain_put_MBps": plain_bytes / plain_s / 1e6, "bytes": first["uploaded_bytes"],
                     "objects": first["uploaded_objects"], "hetrun_s": first["upload_s"], "plain_s": plain_s}
    res["upload"]["ratio"] = res["upload"]["hetrun_MBps"] / res["upload"]["plain_put_MBps"]
    train(model, opt, 2, args.vocab, args.seq, gen)
    st = full_state(model, opt)
    res["after_2"] = t.save(5, st)
    t0 = time.perf_counter()
    train(model, opt, args.interval, args.vocab, args.seq, gen)
    res["train_s_per_step"] = (time.perf_counter() - t0) / args.interval
    st = full_state(model, opt)
    res["after_n"] = t.save(5 + args.interval, st)
    res["restore"] = restore_pair(t, st, args.threads)
    # Stall: a save while the previous step's upload is still in flight, vs no object tier.
    plain = Tiered(srv, "gpt-noobj", args.threads, args.upload_threads, upload=False)
    plain.writer.prepare(st)
    plain.save(1, st)
    train(model, opt, 1, args.vocab, args.seq, gen)
    st = full_state(model, opt)
    t.save(6 + args.interval, st, wait_upload=False)  # its upload runs now
    in_flight = t.up is not None and not t.up.wait(0)
    train(model, opt, 1, args.vocab, args.seq, gen)
    st = full_state(model, opt)
    res["stall"] = {"with_upload_in_flight_s": t.writer.save(7 + args.interval, st), "upload_was_in_flight": in_flight,
                    "no_object_tier_s": plain.writer.save(2, st)}
    t.writer.wait()
    plain.close()
    t.close()
    return res


def gpt_bytes(args: argparse.Namespace, srv: Any) -> dict[str, Any]:
    """``--bytes-only``: the GPT trained as in :func:`gpt`, checkpointed at steps 3, 5
    and 5 + interval; each checkpoint uploaded to two prefixes of the same bucket from
    the same local tier: with the default ``max_fetch_ratio`` and with 64 (the local
    tier's delta chains). Reports the bytes each upload sent, what the local store
    added on disk for the step, and what a restore of the step from each prefix would
    download (every object the shard's chunks reach in that bucket). With ``--restores``, each
    checkpoint is also restored from the local tier and from each prefix alone, timed."""
    from hetrun.runtime.ckpt.object_store import ObjectStore
    from hetrun.runtime.ckpt.object_upload import ObjectUploader

    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    model = GPT(args.vocab, args.dim, args.layers, args.heads, args.seq)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    train(model, opt, 3, args.vocab, args.seq, gen)
    st = full_state(model, opt)
    res: dict[str, Any] = {"params": sum(p.numel() for p in model.parameters()),
                           "state_bytes": sum(x.numel() * x.element_size() for x in _tensors(st))}
    t = Tiered(srv, "gpt", args.threads, args.upload_threads)
    assert t.up is not None
    other = ObjectStore(f"s3://{BUCKET}/gpt-local-chains-{uuid.uuid4().hex[:6]}/train", env=srv.env(),
                        threads=args.upload_threads)
    up2 = ObjectUploader(other, [t.tier], rank=0, world_size=1, keep=3, max_fetch_ratio=64.0)
    res["max_fetch_ratio"] = {"default": t.up.max_fetch_ratio, "local_chains": 64.0}
    t.writer.prepare(st)
    rows = []
    for label, steps, step in (("first", 0, 3), ("after_2", 2, 5), (f"after_{args.interval}", args.interval,
                                                                     5 + args.interval)):
        if steps:
            t0 = time.perf_counter()
            train(model, opt, steps, args.vocab, args.seq, gen)
            res.setdefault("train_s_per_step", []).append((time.perf_counter() - t0) / steps)
            st = full_state(model, opt)
        out = t.save(step, st)
        up2.submit(step)
        assert up2.wait(3600)
        ev = up2.results[-1]
        assert ev["ev"] == "ckpt_upload", ev
        shard = json.loads((t.dir / t.tier.shard_rel(step, 0)).read_bytes())
        chunks = {h for td in shard["tensors"] for h, _n in td["chunks"]}
        row = {"label": label, "step": step, "local_added_bytes": out["local_added_bytes"],
               "default_uploaded_bytes": out["uploaded_bytes"],
               "default_reencoded_objects": t.events[-1].get("reencoded_objects"),
               "local_chains_uploaded_bytes": ev["uploaded_bytes"],
               "default_restore_download_bytes": sum(t.up._chain_bytes[h] for h in chunks),
               "local_chains_restore_download_bytes": sum(up2._chain_bytes[h] for h in chunks),
               "objects": out["objects"], "load1": os.getloadavg()[0]}
        row["default_over_local"] = row["default_uploaded_bytes"] / row["local_added_bytes"]
        row["local_chains_over_local"] = row["local_chains_uploaded_bytes"] / row["local_added_bytes"]
        if args.restores:
            # This checkpoint is the newest in all three: each restored alone, in turn, bit-exact.
            os.sync()
            row["restore_local_s"] = _timed_restore_local(t.dir, st, args.threads)
            row["restore_default_s"] = _timed_restore_bucket(t.store, st, args.threads)
            row["restore_local_chains_s"] = _timed_restore_bucket(other, st, args.threads)
            row["restore_default_ratio"] = row["restore_default_s"] / row["restore_local_s"]
            row["restore_local_chains_ratio"] = row["restore_local_chains_s"] / row["restore_local_s"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    res["checkpoints"] = rows
    up2.close(600)
    t.close()
    return res


def _tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [x for v in obj.values() for x in _tensors(v)]
    if isinstance(obj, (list, tuple)):
        return [x for v in obj for x in _tensors(v)]
    return []


def main() -> None:
    from hetrun.runtime.ckpt import local_s3

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", action="store_true", help="10M-parameter model")
    ap.add_argument("--interval", type=int, default=100, help="steps between the 2nd and 3rd checkpoint")
    ap.add_argument("--threads", type=int, default=2, help="encoder/decoder threads")
    ap.add_argument("--upload-threads", type=int, default=8, help="parallel requests (hetrun and the plain PUT)")
    ap.add_argument("--client-mb", type=int, default=256, help="MB per client in the clients section")
    ap.add_argument("--restore-only", action="store_true",
                    help="only the restore breakdown (a synthetic 160 MB state, minutes instead of an hour)")
    ap.add_argument("--bytes-only", action="store_true",
                    help="only the GPT's upload bytes, default max_fetch_ratio beside 64 (no timings)")
    ap.add_argument("--restores", action="store_true",
                    help="--bytes-only: also time each checkpoint's restore from the local tier and from each prefix")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds of --restore-only")
    ap.add_argument("--max-delta-chain", type=int, default=None,
                    help="--restore-only: the writer's max_delta_chain (default: the writer's; 1: standalone)")
    ap.add_argument("--max-fetch-ratio", type=float, default=None,
                    help="--restore-only: the uploader's max_fetch_ratio (default: the uploader's, 1.2)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    args.vocab, args.dim, args.layers, args.heads, args.seq = (
        (8000, 256, 12, 4, 32) if args.small else (32000, 768, 12, 12, 64))
    torch.set_num_threads(2)
    shutil.rmtree(ROOT, ignore_errors=True)
    ROOT.mkdir(parents=True)
    srv = local_s3.start(ROOT / "weed")
    out: dict[str, Any] = {"argv": sys.argv[1:], "load_avg_start": os.getloadavg()}
    try:
        local_s3.make_bucket(srv, BUCKET)
        if args.restore_only:
            out["restore_breakdown"] = restore_breakdown(srv, args)
        elif args.bytes_only:
            out["gpt_bytes"] = gpt_bytes(args, srv)
        else:
            out["clients"] = bench_clients(srv, args.client_mb, args.upload_threads)
            out["gpt"] = gpt(args, srv)
    finally:
        srv.stop()
        out["load_avg_end"] = os.getloadavg()
        shutil.rmtree(ROOT, ignore_errors=True)
    text = json.dumps(out, indent=1, default=lambda o: round(o, 4) if isinstance(o, float) else str(o))
    print(text)
    if args.json:
        Path(args.json).write_text(text)


if __name__ == "__main__":
    main()
