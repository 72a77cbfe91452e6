"""The object-store checkpoint tier against a real S3 server (weed, one per session).

Incremental content-addressed upload, manifest last, restore from the bucket
alone (bit-identical), GC that never deletes what a checkpoint or an upload in
progress needs, pre-queue checks, and the faults: server killed mid-upload,
server down at restore, a corrupted object, denied writes, throttling.
"""

from __future__ import annotations

import http.client
import http.server
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from hetrun.dag.object_store_spec import ObjectStoreSpec
from hetrun.runtime.ckpt import CheckpointStore, Tier, local_s3
from hetrun.runtime.ckpt.object_preflight import preflight
from hetrun.runtime.ckpt.object_store import ObjectStore
from hetrun.runtime.ckpt.object_tier import MEMORY_BYTES, BucketTier
from hetrun.runtime.ckpt.object_upload import ObjectUploader
from hetrun.runtime.ckpt.writer import CheckpointWriter

from hetrun.errors import CheckpointError, SpecError

BUCKET = "hetrun-test"


@pytest.fixture(scope="module")
def s3(weed_s3: Any) -> Any:
    local_s3.make_bucket(weed_s3, BUCKET)
    return weed_s3


def _store(srv: Any, name: str | None = None, **kw: Any) -> ObjectStore:
    return ObjectStore(f"s3://{BUCKET}/{name or uuid.uuid4().hex[:12]}/train", env=srv.env(), **kw)


class Saver:
    """A solo checkpoint writer on a file tier feeding an uploader, as resume.py wires them."""

    def __init__(self, root: Path, store: ObjectStore, keep: int = 3, max_delta_chain: int = 4) -> None:
        self.tier = Tier(root / "shared")
        self.events: list[dict[str, Any]] = []
        self.up = ObjectUploader(store, [self.tier], rank=0, world_size=1, keep=keep, on_event=self.events.append,
                                 shard_wait_s=30)
        self.writer = CheckpointWriter([self.tier], keep=keep, chunk_bytes=1 << 18, max_delta_chain=max_delta_chain,
                                       on_event=lambda e: e["ok"] and self.up.submit(e["step"]))

    def save(self, step: int, state: dict[str, torch.Tensor], *, upload_wait: bool = True) -> dict[str, Any] | None:
        self.writer.save(step, state)
        res = self.writer.wait()
        assert res is not None and res.ok, res
        if upload_wait:
            assert self.up.wait(60)
            return self.events[-1]
        return None

    def close(self) -> None:
        self.writer.close()
        self.up.close(60)


def _state(seed: int = 0, n: int = 400_000) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(n, generator=g), "m": torch.randn(n // 2, generator=g), "step": torch.tensor(seed)}


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# -- job file ---------------------------------------------------------------------------
def test_job_file_object_store_section_is_validated(tmp_path: Path) -> None:
    from hetrun.dag.spec import load_spec

    ok = ObjectStoreSpec.model_validate({"url": "s3://b-1/run/x", "endpoint": "http://127.0.0.1:8333/"})
    assert (ok.url, ok.endpoint) == ("s3://b-1/run/x", "http://127.0.0.1:8333")
    base = {"name": "t", "workload": "hetrun.examples.moe_lm:MoELMWorkload",
            "components": {"learner": {"actions": ["forward", "backward", "optimize"]}},
            "training": {"kind": "supervised", "iterations": 1}}
    for bad, says in [({"url": "s3://Bad_Bucket/x"}, "not a valid bucket name"),
                      ({"url": "http://b/x"}, "not an s3:// URL"),
                      ({"url": "s3://ok-b/x", "endpoint": "http://AKIA:s3cr3t@127.0.0.1:1"}, "carries credentials"),
                      ({"url": "s3://ok-b/../x"}, "is not allowed"),
                      ({"url": "s3://ok-b/x", "secret_key": "s3cr3t"}, "secret_key"),
                      ({"url": "s3://ok-b/x", "max_fetch_ratio": -1}, "max_fetch_ratio: input should be greater")]:
        job = tmp_path / "job.yaml"
        job.write_text(json.dumps({**base, "checkpoint": {"object_store": bad}}))
        with pytest.raises(SpecError) as err:
            load_spec(job)
        text = str(err.value)
        assert "checkpoint.object_store" in text and says in text, text
        assert "s3cr3t" not in text or says == "secret_key", text


# -- upload: incremental, content-addressed, manifest last --------------------------------
def test_incremental_upload_and_bucket_only_restore_is_bit_identical(s3: Any, tmp_path: Path) -> None:
    store = _store(s3)
    saver = Saver(tmp_path, store)
    state = _state()
    first = saver.save(1, state)
    assert first is not None and first["ok"] and first["committed"], first
    assert first["uploaded_objects"] == first["objects"] > 1
    state["w"][:1000] += 1.0  # one chunk changes
    second = saver.save(2, state)
    assert second is not None and second["ok"], second
    assert 1 <= second["uploaded_objects"] < first["uploaded_objects"] // 2, (first, second)
    assert second["uploaded_bytes"] < first["uploaded_bytes"] / 4
    third = saver.save(3, state)  # nothing changed: only the documents
    assert third is not None and third["uploaded_objects"] == 0, third
    saver.close()
    # Every object is keyed by its content hash under a two-hex-digit prefix.
    keys = [o.rel for o in store.list("objects/")]
    assert keys and all(k.split("/")[1] == k.split("/")[2][:2] and len(k.split("/")[2]) == 64 for k in keys)
    reader = ObjectStore(store.url, env=s3.env())  # a fresh process's store: no client yet
    tier = BucketTier(reader)
    bucket_only = CheckpointStore([tier])
    assert bucket_only.steps() == [3, 2, 1]
    got = bucket_only.restore()
    assert got is not None and got.step == 3 and got.tier == "object"
    fetched_by_restore = len(tier.fetched)
    from_disk = CheckpointStore([Tier(tmp_path / "shared")]).restore()
    assert from_disk is not None and _same(got.state, state) and _same(got.state, from_disk.state)
    assert bucket_only.verify(1) == [] and bucket_only.verify(3) == []
    # The restore's reads went through obstore (runtime/ckpt/s3_fast_get.py), which the s3
    # extra installs; with it off, boto3's GETs restore the same bytes.
    assert reader.fast_get.why_off is None, reader.fast_get.why_off
    # every object, the listing, the manifest and the shard: and no boto3 client made at all
    assert reader.fast_get.gets >= fetched_by_restore + 3 and fetched_by_restore > 1
    assert reader._client is None
    plain = ObjectStore(store.url, env=s3.env())
    plain.fast_get.off = True
    by_boto3 = CheckpointStore([BucketTier(plain)]).restore()
    assert by_boto3 is not None and by_boto3.step == 3 and _same(by_boto3.state, state)
    assert plain.fast_get.gets == 0


def test_a_fast_get_that_fails_goes_the_boto3_way_once_and_says_why(s3: Any, tmp_path: Path) -> None:
    store = _store(s3)
    saver = Saver(tmp_path, store)
    state = _state()
    saver.save(1, state)
    saver.close()
    # obstore pointed at a port nothing listens on; boto3 keeps the real endpoint.
    reader = ObjectStore(store.url, env=s3.env())
    from hetrun.runtime.ckpt import s3_fast_get

    assert reader.fast_get.prepare(lambda: s3_fast_get.without_client(
        store.url.bucket, endpoint="http://127.0.0.1:9", region=None, profile=None, env=s3.env()))
    got = CheckpointStore([BucketTier(reader)]).restore()
    assert got is not None and got.step == 1 and _same(got.state, state) and reader.fast_get.gets == 0
    assert reader.fast_get.off and "127.0.0.1:9" in (reader.fast_get.why_off or ""), reader.fast_get.why_off


def test_the_bucket_keeps_delta_chains_short_so_a_restore_fetches_about_the_state(s3: Any, tmp_path: Path) -> None:
    # Every chunk changes at every step: the local tier chains deltas (max_delta_chain 4); the
    # bucket re-encodes a chunk whole once its chain there would pass max_fetch_ratio x raw.
    state = _state(11, n=200_000)
    raw = sum(v.numel() * v.element_size() for v in state.values())
    for ratio in (1.2, 64.0):  # the default, and the local tier's chains
        store = _store(s3)
        saver = Saver(tmp_path / str(ratio), store)
        saver.up.max_fetch_ratio = ratio
        g = torch.Generator().manual_seed(3)
        events = []
        for step in (1, 2, 3):
            for k in ("w", "m"):
                state[k] += 1e-3 * torch.randn(state[k].shape, generator=g)
            events.append(saver.save(step, state))
        saver.close()
        assert all(e is not None and e["ok"] for e in events), events
        reencoded = sum(e["reencoded_objects"] for e in events if e is not None)
        assert (reencoded > 0) == (ratio < 64), events
        # As a job restores: the objects wait in memory, each dropped after its last read.
        tier = BucketTier(_store(s3, store.url.prefix.split("/")[0]), memory_bytes=MEMORY_BYTES)
        got = CheckpointStore([tier]).restore()
        assert got is not None and got.step == 3 and _same(got.state, state)
        if ratio < 64:
            assert tier.fetched_bytes <= ratio * raw, (tier.fetched_bytes, raw)
        else:
            assert tier.fetched_bytes > 1.2 * raw, (tier.fetched_bytes, raw)  # the whole local chain
        assert not tier._mem and tier._mem_held == 0  # every object read as often as announced
        fetched = tier.fetched_bytes
        # Reads the restore did not announce: objects dropped from memory are fetched again (a
        # base the reader reached before the prefetch did went to the cache directory: not).
        assert CheckpointStore([tier]).verify(3) == []
        assert fetched < tier.fetched_bytes <= 2 * fetched
        saved = {k: v.clone() for k, v in state.items()}
        tier.close()
        # GC keeps whatever either encoding needs (the refs list the local chains).
        assert store.gc(grace_s=0)[2] is None
        got = CheckpointStore([BucketTier(store)]).restore()
        assert got is not None and got.step == 3 and _same(got.state, saved)


def test_manifest_is_written_last_and_only_when_every_rank_uploaded(s3: Any, tmp_path: Path) -> None:
    # Two ranks of one store: rank 1's shard missing -> rank 0 writes no manifest.
    store = _store(s3)
    tier = Tier(tmp_path / "shared")
    from hetrun.runtime.ckpt.collective import SoloCollective

    w = CheckpointWriter([tier], collective=SoloCollective())
    w.save(5, _state())
    assert w.wait().ok
    w.close()
    # Pretend the manifest says two ranks (rank 1 never uploads).
    man = json.loads(tier.manifest_path(5).read_text())
    man["world_size"] = 2
    man["shards"].append({**man["shards"][0], "rank": 1, "path": "shards/000000000005/rank-000001.json"})
    tier.manifest_path(5).write_text(json.dumps(man))
    events: list[dict[str, Any]] = []
    up = ObjectUploader(store, [tier], rank=0, world_size=2, keep=3, on_event=events.append, shard_wait_s=1.5)
    up.submit(5)
    assert up.wait(60)
    up.close(5)
    assert events[-1]["ev"] == "ckpt_tier_failure" and "no manifest written" in events[-1]["error"], events
    assert store.manifest_steps() == []
    assert [o.rel for o in store.list("leases/")] == []  # released: GC may collect the orphans


# -- retention and GC ----------------------------------------------------------------------
def test_keep_and_gc_never_delete_what_a_checkpoint_or_an_upload_needs(
        s3: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    store = _store(s3)
    saver = Saver(tmp_path, store, keep=2, max_delta_chain=1)  # no delta bases: old chunks become garbage
    state = _state(1)
    for step in range(1, 5):
        state["w"][step * 1000 : step * 1000 + 10] += 1.0
        saver.save(step, state)
    saver.close()
    assert store.manifest_steps() == [3, 4]
    before = {o.rel for o in store.list("objects/")}
    # An upload in progress (a fresh lease): GC deletes nothing.
    store.put(store.lease_rel(9, 0), b"{}")
    deleted, _, why = store.gc(grace_s=0)
    assert deleted == 0 and why and "in progress" in why
    store.release_leases(9)
    gen = store.generation()
    deleted, freed, why = store.gc(grace_s=0)
    assert why is None and deleted > 0 and freed > 0
    assert store.generation() != gen  # uploaders drop what they believed the bucket held
    after = {o.rel for o in store.list("objects/")}
    assert after < before
    tier = BucketTier(store)
    assert CheckpointStore([tier]).verify(3) == [] and CheckpointStore([tier]).verify(4) == []
    assert not [o for o in store.list("shards/") if "/000000000001/" in o.rel]
    # The CLI's gc on the URL agrees there is nothing more to delete.
    for k, v in s3.env().items():
        monkeypatch.setenv(k, v)
    proc = _cli(capsys, "ckpt", "gc", str(store.url), "--keep", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "removed 1 checkpoint(s) [3]" in proc.stdout
    assert store.manifest_steps() == [4]
    assert CheckpointStore([BucketTier(store)]).verify(4) == []


def test_an_upload_waits_while_a_gc_holds_the_lock(s3: Any, tmp_path: Path) -> None:
    # The other half of the lease protocol: a GC that started first (gc.lock) finishes
    # before an upload trusts what the bucket holds.
    store = _store(s3)
    store.put("gc.lock", b"{}")
    polls: list[bool] = []
    gc_running = store._gc_running
    store._gc_running = lambda: polls.append(gc_running()) or polls[-1]  # counts the uploader's polls
    saver = Saver(tmp_path, store)
    saver.save(1, _state(9), upload_wait=False)
    from hetrun.backoff import Backoff, poll_until

    assert poll_until(lambda: [o.rel for o in store.list("leases/")] == ["leases/000000000001/rank-000000"],
                      Backoff(0.1, 1.0), timeout=60)
    # The uploader found gc.lock held twice (it is in its wait loop): nothing else reached the bucket.
    assert poll_until(lambda: polls.count(True) >= 2, Backoff(0.05, 0.5), timeout=60), polls
    assert saver.up._busy and not list(store.list("objects/")) and not store.manifest_steps()
    store.delete(["gc.lock"])
    assert saver.up.wait(60)
    saver.close()
    assert saver.events[-1]["ev"] == "ckpt_upload" and store.manifest_steps() == [1]


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> Ran:
    """``hetrun ARGS`` in this process (hetrun.cli.app.main: the same error printing as the
    console script, without a ~10 s interpreter start per call on the shared machine)."""
    from hetrun.cli.app import main

    capsys.readouterr()
    code = 0
    try:
        main(list(args))
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return Ran(code, out, err)


def test_ckpt_commands_accept_the_bucket_url(s3: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    name = uuid.uuid4().hex[:10]
    store = _store(s3, name)
    saver = Saver(tmp_path, store)
    state = _state(2)
    saver.save(7, state)
    saver.close()
    for k, v in s3.env().items():
        monkeypatch.setenv(k, v)
    ls = _cli(capsys, "ckpt", "ls", f"s3://{BUCKET}/{name}")
    assert ls.returncode == 0 and "object" in ls.stdout and " 7 " in ls.stdout, ls.stdout + ls.stderr
    show = _cli(capsys, "ckpt", "show", f"s3://{BUCKET}/{name}/train")
    assert show.returncode == 0 and f"s3://{BUCKET}/{name}/train/manifests/000000000007.json" in show.stdout
    ver = _cli(capsys, "ckpt", "verify", f"s3://{BUCKET}/{name}", "-c", "train")
    assert ver.returncode == 0 and "step 7: ok" in ver.stdout, ver.stdout + ver.stderr
    out = tmp_path / "export.pt"
    exp = _cli(capsys, "ckpt", "export", f"s3://{BUCKET}/{name}/train", "-o", str(out))
    assert exp.returncode == 0, exp.stdout + exp.stderr
    assert _same(torch.load(out, weights_only=True), state)
    missing = _cli(capsys, "ckpt", "ls", f"s3://{BUCKET}/no-such-prefix")
    assert missing.returncode != 0 and "no checkpoints in" in missing.stderr and "Traceback" not in missing.stderr


# -- checks before the queue -----------------------------------------------------------------
def test_preflight_names_each_problem(s3: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for k, v in s3.env().items():
        monkeypatch.setenv(k, v)
    spec = ObjectStoreSpec.model_validate({"url": f"s3://{BUCKET}/pre"})
    preflight(spec, "job.yaml")  # reachable, bucket there, writable
    dead = local_s3.free_ports(1)[0]
    cases = [
        ({"url": f"s3://{BUCKET}/pre", "endpoint": f"http://127.0.0.1:{dead}"}, {}, "does not answer"),
        ({"url": "s3://no-such-bucket-h6/pre"}, {}, "does not exist"),
        ({"url": f"s3://{BUCKET}/pre"}, {"AWS_SECRET_ACCESS_KEY": "wrong-secret-zz"}, "credentials are wrong"),
        ({"url": f"s3://{BUCKET}/pre"}, {"AWS_ACCESS_KEY_ID": s3.ro_access_key,
                                          "AWS_SECRET_ACCESS_KEY": s3.ro_secret_key}, "access denied"),
    ]
    for doc, env, says in cases:
        with monkeypatch.context() as m:
            for k, v in env.items():
                m.setenv(k, v)
            with pytest.raises(CheckpointError) as err:
                preflight(ObjectStoreSpec.model_validate(doc), "job.yaml")
            text = str(err.value)
            assert text.startswith("job.yaml: checkpoint.object_store") and says in text, (says, text)
            assert "wrong-secret-zz" not in text and s3.ro_secret_key not in text
    with monkeypatch.context() as m:  # no credentials anywhere
        for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
            m.delenv(k, raising=False)
        m.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
        m.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
        m.setenv("AWS_EC2_METADATA_DISABLED", "true")
        with pytest.raises(CheckpointError, match="no S3 credentials"):
            preflight(spec, "job.yaml")


def test_hetrun_plan_refuses_an_unwritable_bucket_before_the_queue(
        s3: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(json.dumps({
        "name": "s3pre", "workload": "hetrun.examples.moe_lm:MoELMWorkload",
        "components": {"learner": {"actions": ["forward", "backward", "optimize", "checkpoint"]}},
        "training": {"kind": "supervised", "iterations": 2},
        "checkpoint": {"object_store": {"url": "s3://missing-bucket-h6/x", "endpoint": s3.endpoint}}}))
    for k, v in s3.env().items():
        monkeypatch.setenv(k, v)
    proc = _cli(capsys, "plan", str(job), "--capacity", "spec")
    assert proc.returncode != 0, proc.stdout
    assert "checkpoint.object_store" in proc.stderr and "does not exist" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and s3.secret_key not in proc.stderr + proc.stdout


# -- faults ---------------------------------------------------------------------------------------
def test_denied_write_is_a_named_tier_failure_and_training_goes_on(s3: Any, tmp_path: Path) -> None:
    store = ObjectStore(f"s3://{BUCKET}/{uuid.uuid4().hex[:10]}/train", env=s3.env(read_only=True))
    saver = Saver(tmp_path, store)
    ev = saver.save(1, _state(3))
    assert ev is not None and ev["ev"] == "ckpt_tier_failure" and ev["tier"] == "object", ev
    assert "access denied" in ev["error"] and "faster tiers" in ev["message"]
    assert s3.ro_secret_key not in json.dumps(saver.events)
    saver.save(2, _state(4), upload_wait=True)  # the next save still commits on the file tier
    saver.close()
    assert CheckpointStore([Tier(tmp_path / "shared")]).steps() == [2, 1]


def test_corrupted_object_is_caught_by_its_hash_and_restore_falls_back(s3: Any, tmp_path: Path) -> None:
    store = _store(s3)
    saver = Saver(tmp_path, store)
    old = _state(5)
    saver.save(1, old)
    new = {k: v.clone() for k, v in old.items()}
    new["w"][:10] = 42.0
    saver.save(2, new)
    saver.close()
    def chunks(step: int) -> list[str]:
        doc = json.loads(store.get(f"shards/{step:012d}/rank-000000.json"))
        return [h for td in doc["tensors"] for h, _ in td["chunks"]]

    changed = [(a, b) for a, b in zip(chunks(1), chunks(2), strict=True) if a != b]
    assert changed
    old_h, new_h = changed[0]
    # A well-formed object with other content under the changed chunk's name: it decodes,
    # and only its content hash can tell.
    store.put(store.object_rel(new_h), store.get(store.object_rel(old_h)))
    bucket = CheckpointStore([BucketTier(store)])
    problems = bucket.verify(2)
    assert problems and "does not match its hash" in " ".join(problems), problems
    got = bucket.restore()
    assert got is not None and got.step == 1 and _same(got.state, old)
    assert got.skipped and got.skipped[0][0] == 2
    # A flipped byte in the stored payload: corrupt too.
    rel = store.object_rel(new_h)
    data = bytearray(store.get(rel))
    data[-5] ^= 0xFF
    store.put(rel, bytes(data))
    assert "corrupt" in " ".join(CheckpointStore([BucketTier(store)]).verify(2))
    # With the file tier in front, the same corruption costs nothing: step 2 from disk.
    both = CheckpointStore([Tier(tmp_path / "shared"), BucketTier(store)]).restore()
    assert both is not None and both.step == 2 and _same(both.state, new)


@pytest.fixture(scope="module")
def _own_s3_server(weed_s3: Any) -> Iterator[Any]:
    root = Path(tempfile.mkdtemp(prefix="weed-fault-", dir=os.environ.get("HETRUN_TEST_SHARED_TMP", "/var/tmp/hetrun-tests")))
    srv = local_s3.start(root)
    local_s3.make_bucket(srv, BUCKET)
    try:
        yield srv
    finally:
        srv.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def own_s3(_own_s3_server: Any) -> Any:
    """A second weed a test may kill (the session's stays up): started again here, on its
    ports and data, only for a test that finds it killed (a restart takes seconds)."""
    if not _own_s3_server.alive():
        _own_s3_server.restart()
    return _own_s3_server


@pytest.mark.slow
def test_server_killed_mid_upload_then_back(own_s3: Any, tmp_path: Path) -> None:
    srv = own_s3
    store = ObjectStore(f"s3://{BUCKET}/{uuid.uuid4().hex[:10]}/train", env=srv.env())
    saver = Saver(tmp_path, store)
    state = _state(6, n=3_000_000)  # ~18 MB: the upload is still running when the server dies
    saver.save(1, state)
    state["w"] += 1.0
    saver.save(2, state, upload_wait=False)
    time.sleep(0.05)
    srv.kill()
    saver.save(3, state, upload_wait=False)  # training goes on while the tier is down
    assert saver.up.wait(120)
    failures = [e for e in saver.events if e["ev"] == "ckpt_tier_failure"]
    assert failures and all(e["tier"] == "object" for e in failures), saver.events
    assert CheckpointStore([Tier(tmp_path / "shared")]).steps()[0] == 3
    srv.restart()
    # Nothing partial is visible: every manifest in the bucket verifies.
    for step in store.manifest_steps():
        assert CheckpointStore([BucketTier(store)]).verify(step) == [], step
    state["m"] += 1.0
    ev = saver.save(4, state)  # the next checkpoint sends what is still missing
    saver.close()
    assert ev is not None and ev["ok"] and ev["committed"], saver.events
    got = CheckpointStore([BucketTier(store)]).restore()
    assert got is not None and got.step == 4 and _same(got.state, state)


@pytest.mark.slow
def test_server_down_at_restore_falls_back_and_says_so(own_s3: Any, tmp_path: Path) -> None:
    srv = own_s3
    store = ObjectStore(f"s3://{BUCKET}/{uuid.uuid4().hex[:10]}/train", env=srv.env())
    saver = Saver(tmp_path, store)
    state = _state(7)
    saver.save(1, state)
    saver.close()
    srv.kill()  # left down: the own_s3 fixture restarts it for a test that needs it
    events: list[dict[str, Any]] = []
    # A killed server refuses the connection: reported at once (a silent server or a
    # 5xx would be waited out for read_retry_s; 60 s here, so a retried refusal shows).
    bucket = BucketTier(ObjectStore(store.url, env=srv.env(), read_retry_s=60.0), on_event=events.append)
    got = CheckpointStore([Tier(tmp_path / "empty"), bucket, Tier(tmp_path / "shared")]).restore()
    assert got is not None and got.step == 1 and got.tier == "shared" and _same(got.state, state)
    assert events and events[0]["ev"] == "ckpt_tier_failure" and events[0]["op"] == "list"
    assert "does not answer" in events[0]["error"] and "falling back" in events[0]["message"]
    assert "connection refused" in events[0]["error"], events
    assert "(retried for " not in events[0]["error"], events


def _relay(handler: http.server.BaseHTTPRequestHandler, upstream: tuple[str, int], body: bytes) -> None:
    """Forward ``handler``'s request to weed at ``upstream`` and its answer back (no body for HEAD)."""
    conn = http.client.HTTPConnection(*upstream, timeout=30)
    conn.request(handler.command, handler.path, body=body, headers=dict(handler.headers))
    resp = conn.getresponse()
    data = resp.read()
    handler.send_response(resp.status)
    for k, v in resp.getheaders():
        if k.lower() not in ("transfer-encoding", "connection", "content-length"):
            handler.send_header(k, v)
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    if handler.command != "HEAD":
        handler.wfile.write(data)
    conn.close()


class _Hop(http.server.BaseHTTPRequestHandler):
    """A real HTTP hop in front of weed. HTTP/1.1, as S3 speaks: botocore asks a PUT's body to be
    welcome first (``Expect: 100-continue``) and waits 1 s for the answer an HTTP/1.0 server
    never sends (every PUT through the hop took 1.0 s: 16 s of the throttling test)."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass


class _Throttler(_Hop):
    """A hop answering 503 SlowDown to every other PUT at first (S3's throttling answer),
    forwarding everything else."""

    upstream: tuple[str, int] = ("127.0.0.1", 0)
    throttled = 0
    budget = 6
    lock = threading.Lock()

    def _forward(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.command == "PUT":
            with _Throttler.lock:
                slow = _Throttler.budget > 0
                if slow:
                    _Throttler.budget -= 1
                    _Throttler.throttled += 1
            if slow:
                msg = b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
                self.send_response(503)
                self.send_header("Content-Length", str(len(msg)))
                self.end_headers()
                self.wfile.write(msg)
                return
        _relay(self, _Throttler.upstream, body)

    do_GET = do_PUT = do_HEAD = do_DELETE = do_POST = _forward


def test_throttling_is_retried_with_backoff(s3: Any, tmp_path: Path) -> None:
    port = int(s3.endpoint.rsplit(":", 1)[1])
    _Throttler.upstream = ("127.0.0.1", port)
    proxy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Throttler)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        env = {**s3.env(), "AWS_ENDPOINT_URL": f"http://127.0.0.1:{proxy.server_address[1]}"}
        store = ObjectStore(f"s3://{BUCKET}/{uuid.uuid4().hex[:10]}/train", env=env)
        # botocore's own retries off: the backoff seen here is hetrun's (hetrun/backoff.py)
        from hetrun.runtime.ckpt import s3_client

        store._client = s3_client.make_client(None, env=env, retries=0)
        saver = Saver(tmp_path, store)
        state = _state(8)
        ev = saver.save(1, state)
        saver.close()
        assert ev is not None and ev["ok"], saver.events
        assert _Throttler.throttled == 6
        got = CheckpointStore([BucketTier(ObjectStore(store.url, env=s3.env()))]).restore()
        assert got is not None and _same(got.state, state)
    finally:
        proxy.shutdown()


class _Failing(_Hop):
    """A hop answering 500 InternalError (what weed answers while its volume servers register
    after a restart) to the first ``server.failures`` GETs and HEADs; the count lives on the
    server object, so no two tests share it."""

    def _forward(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        srv: Any = self.server
        with srv.lock:
            fail = self.command in ("GET", "HEAD") and srv.failures > 0
            if fail:
                srv.failures -= 1
                srv.failed += 1
        if fail:
            msg = (b"<Error><Code>InternalError</Code><Message>We encountered an internal error. "
                   b"Please try again.</Message></Error>")
            self.send_response(500)
            self.send_header("Content-Length", str(len(msg)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(msg)
            return
        _relay(self, srv.upstream, body)

    do_GET = do_PUT = do_HEAD = do_DELETE = do_POST = _forward


def test_a_read_waits_out_server_errors_then_says_what_the_server_said(s3: Any) -> None:
    from hetrun.runtime.ckpt import s3_client

    proxy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Failing)
    proxy.upstream, proxy.lock, proxy.failures, proxy.failed = (  # type: ignore[attr-defined]
        ("127.0.0.1", int(s3.endpoint.rsplit(":", 1)[1])), threading.Lock(), 0, 0)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        env = {**s3.env(), "AWS_ENDPOINT_URL": f"http://127.0.0.1:{proxy.server_address[1]}"}
        store = ObjectStore(f"s3://{BUCKET}/{uuid.uuid4().hex[:10]}/train", env=env, read_retry_s=30)
        store._client = s3_client.make_client(None, env=env, retries=0)  # the retries seen are hetrun's
        store.put("manifests/000000000001.json", b'{"step": 1}')
        proxy.failures = 5  # type: ignore[attr-defined]
        assert store.get("manifests/000000000001.json") == b'{"step": 1}'
        assert proxy.failed == 5  # type: ignore[attr-defined]
        proxy.failures = 3  # type: ignore[attr-defined]
        assert store.manifest_steps() == [1] and store.exists("manifests/000000000001.json")
        # A server that keeps failing: reported after read_retry_s, in the server's words, with
        # the server hint (not the credentials one). The write path is not retried so.
        proxy.failures = 10**6  # type: ignore[attr-defined]
        store.read_retry_s = 2.0
        with pytest.raises(CheckpointError) as err:
            store.get("manifests/000000000001.json")
        msg = err.value.message
        assert "the server answered HTTP 500 InternalError: We encountered an internal error" in msg, msg
        assert "(retried for " in msg and err.value.hint == s3_client.SERVER_HINT
        assert "credentials" not in (err.value.hint or "").replace("not a credentials problem", "")
    finally:
        proxy.shutdown()


def test_a_missing_key_or_denied_read_is_not_retried(s3: Any) -> None:
    from hetrun.runtime.ckpt import s3_client

    calls: list[str] = []
    store = ObjectStore(f"s3://{BUCKET}/{uuid.uuid4().hex[:10]}/train", env=s3.env(read_only=True), read_retry_s=30)
    real = store.client

    class Counting:
        def __getattr__(self, name: str) -> Any:
            calls.append(name)
            return getattr(real, name)

    with pytest.raises(CheckpointError, match="is missing from the bucket"):
        store.get("manifests/000000000009.json")  # through obstore: one 404, the path stays on
    assert store.fast_get.gets == 0 and not store.fast_get.off
    store._client = Counting()
    store.fast_get.off = True  # boto3's GET: one request, not retried
    with pytest.raises(CheckpointError, match="is missing from the bucket"):
        store.get("manifests/000000000009.json")
    assert calls == ["get_object"]
    with pytest.raises(CheckpointError, match="access denied") as err:
        store.put("manifests/000000000009.json", b"{}")
    assert err.value.hint == s3_client.CREDENTIAL_HINT


def test_cli_light_commands_do_not_import_the_s3_client(tmp_path: Path) -> None:
    probe = ("import sys\nfrom hetrun.cli.app import main\n"
             "for argv in (['--help'], ['ckpt', '--help'], ['plan', '--help']):\n"
             "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
             "print('LOADED=' + ','.join(m for m in ('boto3', 'botocore', 'obstore', 's3fs') if m in sys.modules))\n")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                          env={"HETRUN_RUNS": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert "LOADED=\n" in proc.stdout, proc.stdout + proc.stderr


API_SCRIPT = """
import sys, torch, hetrun
run = hetrun.attach(run_dir=sys.argv[1], checkpoint_every=2)
w = torch.zeros(50_000)
start = run.restore({"w": w})
print("START", start, float(w.sum()), flush=True)
for step in range(start, int(sys.argv[2])):
    w += step
    if run.checkpoint_due(step):
        run.save(step, {"w": w})
run.close()
print("END", float(w.sum()), flush=True)
"""


def test_run_api_takes_the_object_store_and_restores_from_it_alone(s3: Any, shared_tmp: Path) -> None:
    script = shared_tmp / "train.py"
    script.write_text(API_SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_", "PMIX_", "HETRUN_"))}
    env.update(s3.env(), HETRUN_OBJECT_STORE=f"s3://{BUCKET}/api-{uuid.uuid4().hex[:8]}")

    def run(run_dir: Path, steps: int) -> list[str]:
        proc = subprocess.run([sys.executable, str(script), str(run_dir), str(steps)], capture_output=True,
                              text=True, env=env, timeout=300, check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return [ln for ln in proc.stdout.splitlines() if ln.startswith(("START", "END"))]

    first = run(shared_tmp / "a", 6)
    assert first[0].startswith("START 0 ")
    # A new run directory: nothing on disk, the bucket holds step 6 (steps 0..5 done).
    second = run(shared_tmp / "b", 8)
    assert second[0] == f"START 6 {50_000 * sum(range(6))}.0", (first, second)
    evs = [json.loads(ln) for ln in (shared_tmp / "a" / "events.jsonl").read_text().splitlines()]
    ups = [e["step"] for e in evs if e["ev"] == "ckpt_upload"]
    skipped = [e["step"] for e in evs if e["ev"] == "ckpt_upload_skipped"]  # queued behind one in flight
    assert ups[-1] == 6 and sorted(ups + skipped) == [2, 4, 6], evs
    assert not [e for e in evs if e["ev"] == "ckpt_tier_failure"]
    assert s3.secret_key not in (shared_tmp / "a" / "events.jsonl").read_text()


# -- a rank's object tier at exit ---------------------------------------------------------------
def test_a_stopping_rank_does_not_wait_for_the_upload_at_close(
        s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """resume._close_all runs RankObjectTier.close() at exit: during a preemption the
    upload must not eat the grace (SIGKILL); otherwise it is waited for as before."""
    from hetrun.runtime import preempt
    from hetrun.runtime.ckpt.object_rank import RankObjectTier, close_wait_s

    assert close_wait_s() is None  # no stop asked for: flush's default wait
    store = _store(s3)
    store.put("gc.lock", b"{}")  # holds the upload in its lease wait (600 s)
    saver = Saver(tmp_path, store)
    saver.save(1, _state(3), upload_wait=False)
    from hetrun.backoff import Backoff, poll_until

    assert poll_until(lambda: saver.up._busy, Backoff(0.05, 0.5), timeout=60)
    monkeypatch.setattr(preempt._S, "reason", "preempted")
    assert close_wait_s() == 0
    closer = threading.Thread(target=RankObjectTier(saver.up, BucketTier(store)).close, daemon=True)
    closer.start()
    closer.join(120)  # without the rule: 300 s of flush, then the upload's own 600 s lease wait
    assert not closer.is_alive(), "close() waited for the upload during a stop"
    assert not store.manifest_steps()  # the upload did not finish: the next attempt sends it
    store.delete(["gc.lock"])
    saver.writer.close()


def test_emitting_an_upload_event_leaves_the_uploaders_record_whole(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from hetrun.runtime import resume

    ev = {"ev": "ckpt_upload", "step": 4, "objects": 2}
    ctx = SimpleNamespace(run_dir=str(tmp_path), rank=0, component="train", node=None)
    resume._emit_closed(ctx, ev)
    assert ev == {"ev": "ckpt_upload", "step": 4, "objects": 2}
    assert "ckpt_upload" in "".join(p.read_text() for p in tmp_path.rglob("*.jsonl"))


def test_object_store_defaults_have_one_home() -> None:
    """upload_threads and shard_wait_s default from hetrun.rundir.DEFAULTS in the spec,
    the plan's config, the store and the uploader alike."""
    import inspect

    from hetrun.runtime.ckpt.object_store import ObjectStoreConfig

    from hetrun.rundir import DEFAULTS

    spec = ObjectStoreSpec.model_validate({"url": f"s3://{BUCKET}/d"})
    cfg = ObjectStoreConfig.from_plan({"object_store": {"url": f"s3://{BUCKET}/d"}})
    assert cfg is not None
    assert spec.upload_threads == cfg.upload_threads == DEFAULTS.object_upload_threads
    assert spec.shard_wait_s == cfg.shard_wait_s == DEFAULTS.object_shard_wait_s
    assert ObjectStore(f"s3://{BUCKET}/d").threads == DEFAULTS.object_upload_threads
    wait = inspect.signature(ObjectUploader).parameters["shard_wait_s"].default
    assert wait == DEFAULTS.object_shard_wait_s
