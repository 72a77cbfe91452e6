"""The checkpoint store on real files: round trips, incremental reuse, deltas,
verification with fallback, path-escape rejection, GC, tiers, export, CLI."""

from __future__ import annotations

import hashlib
import json
import os
import random
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from hetrun.runtime.ckpt import gc, open_store, tiers_for
from hetrun.runtime.ckpt.objects import Tier, parse_object
from hetrun.runtime.ckpt.state import capture_rng, flatten, restore_rng
from hetrun.runtime.ckpt.writer import CheckpointWriter

from hetrun.errors import CheckpointError


def exact(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor):
        return (isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
                and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)))
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(exact(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(exact(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and a != a:
        return isinstance(b, float) and b != b
    return type(a) is type(b) and a == b


def trained_state(steps: int = 3, seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(steps):
        model(torch.randn(16, 64)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def step(model: torch.nn.Module, opt: torch.optim.Optimizer, n: int = 1) -> None:
    for _ in range(n):
        model(torch.randn(16, 64)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()


def writer(root: Path, **kw: object) -> CheckpointWriter:
    kw.setdefault("chunk_bytes", 1 << 16)
    return CheckpointWriter(tiers_for(root), **kw)  # type: ignore[arg-type]


def test_round_trip_of_every_supported_value(tmp_path: Path) -> None:
    model, opt = trained_state()
    state = {
        "model": model.state_dict(),
        "optim": opt.state_dict(),  # int keys, param_groups with floats/bools/None
        "misc": {
            "bf16": torch.randn(33, 7).to(torch.bfloat16),
            "f16": torch.randn(5).half(),
            "f64": torch.randn(3, dtype=torch.float64),
            "i64": torch.arange(10),
            "bool": torch.tensor([True, False, True]),
            "scalar": torch.tensor(3.5),
            "empty": torch.empty(0, 4),
            "noncontig": torch.randn(8, 6).t(),
            "np": np.arange(12, dtype=np.int16).reshape(3, 4),
            "tuple": (1, "a", None, 2.5, float("inf")),
            "nan": float("nan"),
            7: "int key",
            "loader": {"epoch": 2, "position": 12345},
        },
        "rng": capture_rng(),
    }
    w = writer(tmp_path)
    w.save(10, state, meta={"iteration": 10})
    res = w.wait()
    w.close()
    assert res is not None and res.ok, res
    back = open_store(tmp_path).restore()
    assert back is not None and back.step == 10 and back.meta == {"iteration": 10}
    expected = dict(state)
    expected["misc"] = dict(state["misc"], noncontig=state["misc"]["noncontig"].contiguous())
    assert exact(back.state, expected)


def test_lists_of_scalars_are_taken_whole_with_the_skeleton_a_walk_gives() -> None:
    import enum

    class Colour(enum.IntEnum):
        RED = 1

    t = torch.ones(2)
    rng = random.getstate()
    skeleton, tensors, _ = flatten({"rng": rng, "l": [1, 2.5, "a", None, True], "e": [Colour.RED],
                                    "mixed": [1, t], "nested": [[1, 2], (3,)], "np": [np.int64(4)]})
    assert skeleton == {"D": [
        ["rng", {"U": [rng[0], {"U": list(rng[1])}, rng[2]]}],
        ["l", {"L": [1, 2.5, "a", None, True]}],
        ["e", {"L": [Colour.RED]}],  # walked: an int subclass stays what it is
        ["mixed", {"L": [1, {"T": 0}]}],
        ["nested", {"L": [{"L": [1, 2]}, {"U": [3]}]}],
        ["np", {"L": [4]}],  # walked: a numpy scalar becomes a Python one
    ]}
    assert len(tensors) == 1 and type(skeleton["D"][5][1]["L"][0]) is int
    assert json.loads(json.dumps(skeleton))["D"][0][1]["U"][1]["U"] == list(rng[1])


def test_rng_state_round_trip_continues_the_same_stream(tmp_path: Path) -> None:
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    w = writer(tmp_path)
    w.save(1, {"rng": capture_rng()})
    w.wait()
    w.close()
    want = (random.random(), np.random.rand(), torch.rand(1).item())
    random.seed(9)
    np.random.seed(9)
    torch.manual_seed(9)
    restore_rng(open_store(tmp_path).restore().state["rng"])  # type: ignore[union-attr]
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == want


def test_unpicklable_values_are_refused_with_the_key_path(tmp_path: Path) -> None:
    w = writer(tmp_path)
    with pytest.raises(CheckpointError, match=r"state\['opt'\]\['fn'\].*function"):
        w.save(1, {"opt": {"fn": lambda: 0}})
    w.close()


def test_frozen_tensors_cost_no_bytes_and_deltas_shrink_changes(tmp_path: Path) -> None:
    torch.manual_seed(0)
    frozen = torch.randn(1 << 18)
    live = torch.randn(1 << 18)
    w = writer(tmp_path, max_delta_chain=8)
    first = w.save(1, {"frozen": frozen, "live": live}) and w.wait()
    assert first and first.ok and first.reused_chunks == 0
    live.add_(torch.randn_like(live) * 1e-4)
    second = w.save(2, {"frozen": frozen, "live": live}) and w.wait()
    w.close()
    assert second and second.ok
    n_chunks = (1 << 20) // (1 << 16)
    assert second.reused_chunks == n_chunks  # every frozen chunk referenced
    assert second.delta_chunks == n_chunks  # every live chunk XOR-encoded
    # Frozen half free; live half compresses well against the previous version.
    assert second.stored_bytes < 0.3 * first.stored_bytes
    assert exact(open_store(tmp_path).restore().state, {"frozen": frozen, "live": live})  # type: ignore[union-attr]


def test_delta_chains_are_bounded(tmp_path: Path) -> None:
    t = torch.randn(1 << 16)
    w = writer(tmp_path, max_delta_chain=3, keep=100)
    kinds = []
    for s in range(7):
        t.add_(1e-5)
        w.save(s, {"t": t})
        r = w.wait()
        assert r and r.ok
        kinds.append("delta" if r.delta_chunks else "full")
    w.close()
    assert kinds == ["full", "delta", "delta", "full", "delta", "delta", "full"]
    tier = Tier(tmp_path)
    depths = [tier.read_object_header(p.name)["depth"] for p in tier.iter_objects()]
    assert max(depths) == 2
    assert exact(open_store(tmp_path).restore().state["t"], t)  # type: ignore[union-attr]


def _save_three(root: Path) -> list[torch.Tensor]:
    w = writer(root, keep=5)
    versions = []
    gen = torch.Generator().manual_seed(0)
    t = torch.randn(1 << 16, generator=gen)
    for s in (10, 20, 30):
        t = t + 1e-2 * torch.randn(1 << 16, generator=gen)  # like an optimizer step
        versions.append(t.clone())
        w.save(s, {"t": t})
        assert w.wait().ok  # type: ignore[union-attr]
    w.close()
    return versions


def _objects_of(root: Path, step: int) -> list[str]:
    tier = Tier(root)
    man = tier.read_manifest(step)
    shard = tier.read_shard(man["shards"][0]["path"], man["shards"][0]["sha256"], "test")
    return [h for td in shard["tensors"] for h, _ in td["chunks"]]


def test_flipped_byte_is_detected_and_restore_falls_back(tmp_path: Path) -> None:
    versions = _save_three(tmp_path)
    tier = Tier(tmp_path)
    newest_only = set(_objects_of(tmp_path, 30)) - set(_objects_of(tmp_path, 20))
    # Flip a byte of a plane stored uncompressed: it decodes fine, only the hash can tell.
    for h in sorted(newest_only):
        planes = tier.read_object_header(h)["planes"]
        raw_planes = [i for i, (mode, _) in enumerate(planes) if mode in ("r", "xr", "dr")]
        if raw_planes:
            break
    else:
        pytest.fail("no uncompressed plane found")
    victim = tier.object_path(h)
    data = bytearray(victim.read_bytes())
    start = len(data) - sum(n for _, n in planes) + sum(n for _, n in planes[: raw_planes[0]])
    data[start + 3] ^= 0x01
    victim.write_bytes(bytes(data))
    store = open_store(tmp_path)
    assert store.verify(30) and not store.verify(20)
    res = store.restore()
    assert res is not None and res.step == 20
    assert res.skipped and res.skipped[0][0] == 30 and "does not match its hash" in res.skipped[0][1]
    assert exact(res.state["t"], versions[1])


def test_flipped_byte_in_a_compressed_plane_is_detected(tmp_path: Path) -> None:
    versions = _save_three(tmp_path)
    newest_only = set(_objects_of(tmp_path, 30)) - set(_objects_of(tmp_path, 20))
    victim = Tier(tmp_path).object_path(sorted(newest_only)[0])
    data = bytearray(victim.read_bytes())
    header, payload = parse_object(bytes(data), "victim")
    # The middle of the biggest compressed plane (a byte of a frame header or
    # padding could flip without changing what decodes).
    start, best = 0, (0, 0)
    for mode, stored in header["planes"]:
        if mode.endswith("z") and stored > best[1]:
            best = (start, stored)
        start += stored
    assert best[1] > 64, header["planes"]
    data[len(data) - len(payload) + best[0] + best[1] // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    res = open_store(tmp_path).restore()
    assert res is not None and res.step == 20 and "corrupt" in res.skipped[0][1]
    assert exact(res.state["t"], versions[1])


def test_missing_chunk_falls_back(tmp_path: Path) -> None:
    versions = _save_three(tmp_path)
    newest_only = set(_objects_of(tmp_path, 30)) - set(_objects_of(tmp_path, 20))
    Tier(tmp_path).object_path(sorted(newest_only)[0]).unlink()
    res = open_store(tmp_path).restore()
    assert res is not None and res.step == 20 and "missing" in res.skipped[0][1]
    assert exact(res.state["t"], versions[1])


def test_corrupt_base_of_a_delta_invalidates_dependents(tmp_path: Path) -> None:
    _save_three(tmp_path)
    tier = Tier(tmp_path)
    # Corrupt a step-10 (full) object: 20 and 30 are XOR deltas on top of it.
    victim = tier.object_path(_objects_of(tmp_path, 10)[0])
    data = bytearray(victim.read_bytes())
    data[-1] ^= 0xFF
    victim.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="no checkpoint could be restored"):
        open_store(tmp_path).restore()


@pytest.mark.parametrize("bad_path", ["../../../etc/passwd", "/etc/passwd", "shards/../../x.json",
                                      "shards/000000000010/../../../../etc/hosts", 5, None])
def test_manifest_naming_paths_outside_the_store_is_rejected(tmp_path: Path, bad_path: object) -> None:
    _save_three(tmp_path)
    tier = Tier(tmp_path)
    man = json.loads(tier.manifest_path(30).read_text())
    man["shards"][0]["path"] = bad_path
    tier.manifest_path(30).write_text(json.dumps(man))
    with pytest.raises(CheckpointError, match=r"leaves the checkpoint store|not a relative store path|not a shard path"):
        tier.read_manifest(30)
    res = open_store(tmp_path).restore()
    assert res is not None and res.step == 20 and "rejected" in res.skipped[0][1]


def test_symlinks_inside_the_store_are_rejected(tmp_path: Path) -> None:
    _save_three(tmp_path)
    tier = Tier(tmp_path)
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    shard_dir = tmp_path / "shards" / f"{30:012d}"
    for p in shard_dir.iterdir():
        (outside / p.name).write_bytes(p.read_bytes())
        p.unlink()
    shard_dir.rmdir()
    os.symlink(outside, shard_dir)
    with pytest.raises(CheckpointError, match="symbolic link"):
        tier.read_manifest(30)
    # A chunk replaced by a link is rejected too.
    h = _objects_of(tmp_path, 20)[0]
    target = tier.object_path(h)
    (outside / "obj").write_bytes(target.read_bytes())
    target.unlink()
    os.symlink(outside / "obj", target)
    res = open_store(tmp_path).restore()
    assert res is not None and res.step == 10


def test_retention_and_gc_keep_delta_bases(tmp_path: Path) -> None:
    t = torch.randn(1 << 16)
    w = writer(tmp_path, keep=2, max_delta_chain=4)
    for s in range(1, 6):
        t.add_(1e-4)
        w.save(s, {"t": t})
        assert w.wait().ok  # type: ignore[union-attr]
    w.close()
    tier = Tier(tmp_path)
    assert tier.manifest_steps() == [4, 5]
    # The kept checkpoints are deltas on bases of dropped ones; GC must keep those bases.
    assert not open_store(tmp_path).verify(4) and not open_store(tmp_path).verify(5)
    files, _ = gc(tier)  # nothing reachable may go
    assert not open_store(tmp_path).verify(5)
    assert exact(open_store(tmp_path).restore().state["t"], t)  # type: ignore[union-attr]
    # Objects of dropped checkpoints that nothing reaches are gone.
    reachable = set()
    for s in tier.manifest_steps():
        for h in _objects_of(tmp_path, s):
            while h:
                reachable.add(h)
                h = tier.read_object_header(h).get("base")
    assert {p.name for p in tier.iter_objects()} == reachable
    assert not list((tmp_path / "shards").glob("00000000000[123]"))
    del files


def test_gc_spares_another_writers_staged_file_older_than_the_newest_manifest(tmp_path: Path) -> None:
    """A rank ahead in an async pipeline stages its next checkpoint's objects (temporary
    names until its commit) before a slower rank commits an older step: GC after that commit
    must not delete them (it did once: that rank's last checkpoint failed, "No such file").
    Only a temporary file older than STALE_TMP_S, a crashed writer's, goes."""
    from hetrun.runtime.ckpt.objects import Staged, atomic_write
    from hetrun.runtime.ckpt.store import STALE_TMP_S

    t = torch.randn(1 << 12)
    w = writer(tmp_path, keep=2)
    w.save(1, {"t": t})
    assert w.wait().ok  # type: ignore[union-attr]
    tier = Tier(tmp_path)
    staged = Staged()
    h = "ab" + "0" * 62
    tier.object_path(h).parent.mkdir(exist_ok=True)  # as Tier.write_object does
    atomic_write(tier.object_path(h), [b"in flight"], durable=True, staged=staged)
    (tmp_dir,) = {p.parent for p in tier.iter_objects() if p.name.startswith(".")}
    (tmp,) = [p for p in tmp_dir.iterdir() if p.name.startswith(".")]
    crashed = tmp_dir / ".cd00.1.2.dead.tmp"
    crashed.write_bytes(b"left by a dead writer")
    old = time.time() - STALE_TMP_S - 60
    os.utime(crashed, (old, old))
    os.utime(tmp, (old + 120, old + 120))  # written before the newest manifest, still in flight
    gc(tier, cutoff=time.time() + 10)
    assert tmp.exists() and not crashed.exists()
    staged.commit()
    assert tier.object_path(h).read_bytes() == b"in flight"
    w.close()


def test_tiers_drain_and_restore_from_either(tmp_path: Path) -> None:
    local, shared = tmp_path / "local", tmp_path / "shared"
    t = torch.randn(1 << 16)
    w = CheckpointWriter(tiers_for(shared, local), chunk_bytes=1 << 16)
    for s in (1, 2):
        t.add_(1e-3)
        w.save(s, {"t": t})
        r = w.wait()
        assert r and r.ok and r.drained == ["local", "shared"]
    w.close()
    assert Tier(local).manifest_steps() == Tier(shared).manifest_steps() == [1, 2]
    # The node's local disk is gone (new node after requeue): shared serves.
    import shutil

    shutil.rmtree(local)
    res = open_store(shared, local).restore()
    assert res is not None and res.step == 2 and res.tier == "shared" and exact(res.state["t"], t)
    # Shared copy corrupt, local copy fine: local serves.
    _save_tiers = CheckpointWriter(tiers_for(shared, local), chunk_bytes=1 << 16)
    _save_tiers.save(3, {"t": t + 1})
    _save_tiers.wait()
    _save_tiers.close()
    for p in Tier(shared).iter_objects():
        p.write_bytes(b"garbage")
    res = open_store(shared, local).restore()
    assert res is not None and res.step == 3 and res.tier == "local" and exact(res.state["t"], t + 1)


def test_export_to_torch_and_dcp(tmp_path: Path) -> None:
    from hetrun.runtime.ckpt.export import export

    model, opt = trained_state()
    w = writer(tmp_path / "store")
    w.save(4, {"model": model.state_dict(), "optim": opt.state_dict(), "rng": capture_rng()})
    w.wait()
    w.close()
    store = open_store(tmp_path / "store")
    out = export(store, 4, tmp_path / "x.pt", "torch")
    back = torch.load(out, weights_only=True)
    assert exact(back["model"], model.state_dict())
    fresh, fresh_opt = trained_state(seed=5)
    fresh.load_state_dict(back["model"])
    fresh_opt.load_state_dict(back["optim"])
    assert exact(fresh_opt.state_dict()["state"], opt.state_dict()["state"])

    import torch.distributed.checkpoint as dcp

    export(store, 4, tmp_path / "dcp", "dcp")
    target = {"model": {k: torch.zeros_like(v) for k, v in model.state_dict().items()}}
    dcp.load(target, checkpoint_id=str(tmp_path / "dcp"))
    assert exact(target["model"], model.state_dict())
    with pytest.raises(CheckpointError, match="format 'zip' is not supported"):
        export(store, 4, tmp_path / "y", "zip")


class _Out:
    def __init__(self, code: int, output: str) -> None:
        self.exit_code, self.output = code, output


def _cli(capsys: pytest.CaptureFixture[str], args: list[str]) -> _Out:
    from hetrun.cli.app import main

    capsys.readouterr()
    try:
        main(args)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return _Out(code, out.out + out.err)


def test_cli_ls_show_verify_gc_export(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store_dir = tmp_path / "run" / "ckpt" / "learner"  # one store per component
    versions = _save_three(store_dir)
    (tmp_path / "run" / "run.json").write_text(json.dumps({
        "name": "t", "run_dir": str(tmp_path / "run"), "backend": "local", "job_id": None,
        "submitted_at": "2026-01-01T00:00:00Z", "components": ["learner"], "cluster": None}))
    run = str(tmp_path / "run")
    r = _cli(capsys, ["ckpt", "ls", run])
    assert r.exit_code == 0, r.output
    assert [line.split()[0] for line in r.output.splitlines()[1:]] == ["10", "20", "30"]
    r = _cli(capsys, ["ckpt", "show", run, "--step", "20"])
    assert r.exit_code == 0 and "rank    0" in r.output, r.output
    r = _cli(capsys, ["ckpt", "verify", run])
    assert r.exit_code == 0 and r.output.count(": ok") == 3, r.output
    newest_only = set(_objects_of(store_dir, 30)) - set(_objects_of(store_dir, 20))
    Tier(store_dir).object_path(sorted(newest_only)[0]).write_bytes(b"x")
    r = _cli(capsys, ["ckpt", "verify", run])
    assert r.exit_code == 5 and "step 30: INVALID" in r.output, r.output
    r = _cli(capsys, ["ckpt", "export", run, "--out", str(tmp_path / "e.pt")])
    assert r.exit_code == 0 and "step 20" in r.output, r.output
    assert exact(torch.load(tmp_path / "e.pt", weights_only=True)["t"], versions[1])
    r = _cli(capsys, ["ckpt", "gc", run, "--keep", "1"])
    assert r.exit_code == 0 and "removed 2 checkpoint(s)" in r.output, r.output
    r = _cli(capsys, ["ckpt", "ls", str(tmp_path / "nowhere")])
    assert r.exit_code == 4 and "no run matches" in r.output and "Traceback" not in r.output, r.output
    r = _cli(capsys, ["ckpt", "ls", run, "--component", "lerner"])
    assert r.exit_code == 4 and "did you mean 'learner'" in r.output, r.output


def test_previous_format_and_mixed_transform_chains_restore(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Objects written before the rotation and the difference deltas (no "xf",
    XOR delta planes), and before the sign split ("rotl1"), still decode, also
    as bases of new objects (the chain changes plane layout and delta kind on
    the way)."""
    from hetrun.runtime.ckpt import codec

    model, opt = trained_state()
    w = writer(tmp_path, max_delta_chain=8)
    tier = Tier(tmp_path, "shared")
    monkeypatch.setattr(codec, "ROTATE", False)
    monkeypatch.setattr(codec, "DELTA_SUB", False)
    for s in (1, 2):
        w.save(s, {"m": model.state_dict(), "o": opt.state_dict()})
        assert w.wait().ok  # type: ignore[union-attr]
        step(model, opt)
    headers = [tier.read_object_header(p.name) for p in tier.iter_objects()]
    assert all("xf" not in h for h in headers)
    assert any(m.startswith("x") for h in headers for m, _ in h["planes"])
    monkeypatch.setattr(codec, "ROTATE", True)
    monkeypatch.setattr(codec, "DELTA_SUB", True)
    monkeypatch.setattr(codec, "SIGN_SPLIT", False)
    w.save(3, {"m": model.state_dict(), "o": opt.state_dict()})
    assert w.wait().ok  # type: ignore[union-attr]
    step(model, opt)
    monkeypatch.setattr(codec, "SIGN_SPLIT", True)
    want = {"m": model.state_dict(), "o": opt.state_dict()}
    w.save(4, want)
    res = w.wait()
    w.close()
    assert res is not None and res.ok and res.delta_chunks > 0
    headers = [tier.read_object_header(p.name) for p in tier.iter_objects()]
    assert any(h.get("xf") == "rotl1" and h.get("base") and h.get("depth", 0) >= 2
               and any(m.startswith("d") for m, _ in h["planes"]) for h in headers)
    assert any(h.get("xf") == "rotl1s" and h.get("base") and h.get("depth", 0) >= 3 and len(h["planes"]) == 5
               and any(m.startswith("d") for m, _ in h["planes"]) for h in headers)
    got = open_store(tmp_path).restore()
    assert got is not None and got.step == 4 and exact(got.state, want)
    monkeypatch.setattr("hetrun.runtime.ckpt.store.USE_MMAP", False)  # the read-into-buffer path too
    got = open_store(tmp_path).restore()
    assert got is not None and exact(got.state, want)


def test_unknown_transform_is_refused_clearly(tmp_path: Path) -> None:
    model, _ = trained_state()
    w = writer(tmp_path)
    w.save(1, model.state_dict())
    w.wait()
    w.close()
    tier = Tier(tmp_path, "shared")
    victim = next(p for p in tier.iter_objects() if tier.read_object_header(p.name).get("xf"))
    data = victim.read_bytes().replace(b'"xf":"rotl1', b'"xf":"rotr9')  # same length: the header stays valid JSON
    victim.write_bytes(data)
    with pytest.raises(CheckpointError, match="transform 'rotr9"):
        open_store(tmp_path).load_rank(1, 0)


class GatedTier(Tier):
    """A tier whose object writes wait for a gate: a write still in flight, on demand."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, "shared")
        import threading

        self.gate = threading.Event()

    def write_object(self, h, header, parts, **kw):  # type: ignore[no-untyped-def]
        assert self.gate.wait(60)
        return super().write_object(h, header, parts, **kw)


def test_save_while_a_write_is_in_flight_only_copies(tmp_path: Path) -> None:
    import threading
    import time

    model, opt = trained_state()
    tier = GatedTier(tmp_path)
    w = CheckpointWriter([tier], chunk_bytes=1 << 16)
    tier.gate.set()
    w.save(1, {"m": model.state_dict()})
    assert w.wait().ok  # type: ignore[union-attr]
    tier.gate.clear()
    step(model, opt)
    w.save(2, {"m": model.state_dict()})  # blocked in write_object
    step(model, opt)
    want = {"m": {k: v.clone() for k, v in model.state_dict().items()}}
    done = threading.Event()
    threading.Thread(target=lambda: (w.save(3, want), done.set()), daemon=True).start()
    assert done.wait(30), "save() waited for the write in flight despite a free third buffer"
    # Three buffers are now taken (committed 1, writing 2, queued 3): a fourth save waits.
    fourth = threading.Event()
    threading.Thread(target=lambda: (w.save(4, want), fourth.set()), daemon=True).start()
    time.sleep(0.5)
    assert not fourth.is_set(), "save() went past the max_host_buffers bound"
    tier.gate.set()
    assert fourth.wait(60)
    res = w.wait()
    w.close()
    assert res is not None and res.ok and res.step == 4
    assert [r.step for r in w.results] == [1, 2, 3, 4] and all(r.ok for r in w.results)
    got = open_store(tmp_path).load_rank(3, 0)[0]
    assert exact(got, want)


def test_two_buffers_make_save_wait_for_the_write_in_flight(tmp_path: Path) -> None:
    import threading
    import time

    model, opt = trained_state()
    tier = GatedTier(tmp_path)
    w = CheckpointWriter([tier], chunk_bytes=1 << 16, max_host_buffers=2)
    tier.gate.set()
    w.save(1, model.state_dict())
    w.wait()
    tier.gate.clear()
    step(model, opt)  # changed bytes: the write reaches write_object and waits there
    w.save(2, model.state_dict())
    done = threading.Event()
    threading.Thread(target=lambda: (w.save(3, model.state_dict()), done.set()), daemon=True).start()
    time.sleep(0.5)
    assert not done.is_set()
    tier.gate.set()
    assert done.wait(60)
    w.wait()
    w.close()
    assert all(r.ok for r in w.results)
    with pytest.raises(CheckpointError, match="at least 2"):
        CheckpointWriter([Tier(tmp_path / "x")], max_host_buffers=1)


def test_prepare_warms_buffers_of_the_state_size(tmp_path: Path) -> None:
    model, opt = trained_state()
    st = {"m": model.state_dict(), "o": opt.state_dict()}
    w = writer(tmp_path)
    w.prepare(st)
    assert w.wait_prepared(60)
    nbytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    before = w.host_buffers()
    assert before and all(size >= 3 * nbytes for _, size in before)  # model + Adam's two moments
    w.save(1, st)
    assert w.wait().ok  # type: ignore[union-attr]
    assert [addr for addr, _ in w.host_buffers()] == [addr for addr, _ in before]  # no reallocation
    w.prepare({"bad": object()})  # best effort: nothing raised, save reports such states
    w.close()


def test_prepare_for_a_bigger_state_keeps_the_delta_base(tmp_path: Path) -> None:
    model, opt = trained_state()
    w = writer(tmp_path)
    w.save(1, {"m": model.state_dict()})
    assert w.wait().ok  # type: ignore[union-attr]
    w.prepare({"m": model.state_dict(), "o": opt.state_dict()})  # larger: buffers regrow
    assert w.wait_prepared(60)
    step(model, opt)
    want = {"m": model.state_dict()}
    w.save(2, want)
    res = w.wait()
    w.close()
    assert res is not None and res.ok and res.delta_chunks > 0
    got = open_store(tmp_path).restore()
    assert got is not None and got.step == 2 and exact(got.state, want)


def _rewrite_shard(root: Path, step: int, edit: object) -> None:
    """Edit rank 0's shard document of ``step`` and re-seal it in the manifest
    (what a writer of another format version would have produced)."""
    tier = Tier(root)
    man = tier.read_manifest(step)
    entry = man["shards"][0]
    doc = tier.read_shard(entry["path"], entry["sha256"], "test")
    edit(doc)  # type: ignore[operator]
    data = json.dumps(doc).encode()
    (root / entry["path"]).write_bytes(data)
    entry["sha256"] = hashlib.sha256(data).hexdigest()
    tier.manifest_path(step).write_text(json.dumps(man))


def test_fast_digests_verify_restores_and_older_shards_still_restore(tmp_path: Path) -> None:
    import blake3
    import xxhash

    versions = _save_three(tmp_path)
    tier = Tier(tmp_path)
    man = tier.read_manifest(30)
    doc = tier.read_shard(man["shards"][0]["path"], man["shards"][0]["sha256"], "test")
    td = doc["tensors"][0]
    raw = versions[2].numpy().view(np.uint8).reshape(-1)
    off = 0
    for (_h, n), d in zip(td["chunks"], td["xxh3"], strict=True):
        assert d == xxhash.xxh3_128_hexdigest(raw[off : off + n])
        off += n

    # A shard of the previous format records BLAKE3 digests: checked with them.
    def to_blake3(d: dict) -> None:
        for t in d["tensors"]:
            t.pop("xxh3")
            t["blake3"] = [blake3.blake3(raw[:0]).hexdigest()] * len(t["chunks"])  # wrong on purpose

    _rewrite_shard(tmp_path, 30, to_blake3)
    store = open_store(tmp_path)
    res = store.restore()
    assert res is not None and res.step == 20 and "does not match its hash" in res.skipped[0][1]
    assert store.verify(30) == []  # `verify` checks the object names: the objects are intact

    def right_blake3(d: dict) -> None:
        t, off = d["tensors"][0], 0
        t["blake3"] = []
        for _h, n in t["chunks"]:
            t["blake3"].append(blake3.blake3(raw[off : off + n]).hexdigest())
            off += n

    _rewrite_shard(tmp_path, 30, right_blake3)
    res = open_store(tmp_path).restore()
    assert res is not None and res.step == 30 and not res.skipped and exact(res.state["t"], versions[2])
    # A shard written before any fast digest: checked against the object names.
    _rewrite_shard(tmp_path, 30, lambda d: [t.pop("blake3") for t in d["tensors"]])
    res = open_store(tmp_path).restore()
    assert res is not None and res.step == 30 and not res.skipped and exact(res.state["t"], versions[2])
    # A wrong XXH3 digest fails the restore; a malformed list is refused by name.
    _rewrite_shard(tmp_path, 30, lambda d: d["tensors"][0].update(xxh3=["0" * 32] * len(d["tensors"][0]["chunks"])))
    res = open_store(tmp_path).restore()
    assert res is not None and res.step == 20 and "does not match its hash" in res.skipped[0][1]
    _rewrite_shard(tmp_path, 30, lambda d: d["tensors"][0].update(xxh3=["00"]))
    with pytest.raises(CheckpointError, match="xxh3 does not match its chunk list"):
        open_store(tmp_path).load_rank(30, 0)
    _rewrite_shard(tmp_path, 30, lambda d: d["tensors"][0].update(xxh3=["zz" * 16] * len(d["tensors"][0]["chunks"])))
    with pytest.raises(CheckpointError, match="is not a xxh3 digest"):
        open_store(tmp_path).load_rank(30, 0)


def test_a_delta_reads_only_the_base_planes_it_needs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Restore walks a delta chain per plane: a base plane the newer object
    stores in full is never read, so damage there only hurts the older step."""
    versions = _save_three(tmp_path)
    tier = Tier(tmp_path)
    found = None
    for h in _objects_of(tmp_path, 30):
        head = tier.read_object_header(h)
        if head.get("base"):
            plain = [j for j, (m, _) in enumerate(head["planes"]) if m[0] not in "xd"]
            if plain:
                found = head["base"], plain[0]
                break
    assert found is not None, "no delta object with a plane stored in full"
    base, j = found
    planes = tier.read_object_header(base)["planes"]
    victim = tier.object_path(base)
    data = bytearray(victim.read_bytes())
    start = len(data) - sum(n for _, n in planes) + sum(n for _, n in planes[:j])
    for k in range(min(8, planes[j][1])):
        data[start + k] ^= 0xFF
    victim.write_bytes(bytes(data))
    store = open_store(tmp_path)
    assert store.verify(30) == [] and store.verify(20)
    res = store.restore()
    assert res is not None and res.step == 30 and exact(res.state["t"], versions[2])
    # The whole-object walk (the previous way) gives the same bytes where it can decode.
    monkeypatch.setattr("hetrun.runtime.ckpt.store.LAZY_CHAIN", False)
    if planes[j][0].endswith("r"):
        res = open_store(tmp_path).restore()
        assert res is not None and res.step == 30 and exact(res.state["t"], versions[2])


def test_compressed_plane_of_the_wrong_length_is_corrupt_when_decoded_into_a_buffer() -> None:
    from hetrun.runtime.ckpt import codec

    dctx = __import__("zstandard").ZstdDecompressor()
    plane = np.arange(4096, dtype=np.uint8)
    z = codec.new_compressor().compress(plane.data)
    buf = np.empty(4096, np.uint8)
    got = codec.decode_plane(memoryview(z), "z", len(z), 4096, None, decompressor=dctx, target=buf)
    assert got is buf and np.array_equal(buf, plane)
    for wrong in (4095, 4097):
        with pytest.raises(CheckpointError, match="expected"):
            codec.decode_plane(memoryview(z), "z", len(z), wrong, None, decompressor=dctx,
                               target=np.empty(wrong, np.uint8))
    with pytest.raises(CheckpointError, match="does not decompress"):
        codec.decode_plane(memoryview(z[:-3] + b"xyz"), "z", len(z), 4096, None, decompressor=dctx, target=buf)


def test_restore_into_a_live_state_decodes_in_place_where_tensors_fit(tmp_path: Path) -> None:
    """Matching tensors (place, dtype, shape, CPU, contiguous) are filled in
    place and returned; the others come back as fresh tensors."""
    model, opt = trained_state()
    want = {"m": model.state_dict(), "o": opt.state_dict(), "a": np.arange(12.0).reshape(3, 4)}
    w = writer(tmp_path)
    w.save(1, want)
    assert w.wait().ok  # type: ignore[union-attr]
    w.close()
    live_model, live_opt = trained_state()
    for p in live_model.parameters():
        p.data.zero_()
    live = {"m": live_model.state_dict(), "o": live_opt.state_dict(), "a": np.zeros((3, 4))}
    wrong_shape = next(iter(live["m"]))
    live["m"][wrong_shape] = torch.zeros(7)  # does not fit: a fresh tensor instead
    res = open_store(tmp_path).restore(into=live)
    assert res is not None and exact(res.state, want)
    name = next(k for k in live["m"] if k != wrong_shape)
    assert res.state["m"][name] is live["m"][name]  # the live tensor itself, now restored
    assert res.state["m"][name].data_ptr() == dict(live_model.named_parameters())[name].data_ptr()
    assert torch.equal(dict(live_model.named_parameters())[name], want["m"][name])
    assert res.state["a"] is live["a"] and np.array_equal(live["a"], want["a"])
    assert res.state["m"][wrong_shape] is not live["m"][wrong_shape] and live["m"][wrong_shape].sum() == 0


def test_numpy_fallback_writes_and_reads_the_same_objects_as_the_c_kernels(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a C compiler the byte-plane kernels run in numpy: same objects,
    so a checkpoint written on one machine restores on the other."""
    import copy

    from hetrun.kernels import byteplanes

    saved = None
    for where, native in (("c", True), ("numpy", False)):
        m, o = trained_state()
        if not native:
            monkeypatch.setattr(byteplanes, "native", lambda: None)
        w = writer(tmp_path / where)
        for s in (1, 2):
            step(m, o)
            saved = copy.deepcopy({"m": m.state_dict(), "o": o.state_dict()})
            w.save(s, saved)
            assert w.wait().ok  # type: ignore[union-attr]
        w.close()
        monkeypatch.undo()
    c_objects = {p.name: p.read_bytes() for p in Tier(tmp_path / "c").iter_objects()}
    numpy_objects = {p.name: p.read_bytes() for p in Tier(tmp_path / "numpy").iter_objects()}
    assert c_objects == numpy_objects and any(b'"rotl1s"' in b for b in c_objects.values())
    monkeypatch.setattr(byteplanes, "native", lambda: None)
    got = open_store(tmp_path / "c").restore()  # written by the C kernels, read by numpy
    assert got is not None and got.step == 2 and exact(got.state, saved)


def test_objects_are_named_by_blake3_and_sha256_named_stores_still_restore_and_verify(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import blake3
    from hetrun.runtime.ckpt import store as store_mod

    versions = _save_three(tmp_path / "new")
    tier = Tier(tmp_path / "new")
    man = tier.read_manifest(30)
    doc = tier.read_shard(man["shards"][0]["path"], man["shards"][0]["sha256"], "test")
    assert doc["names"] == "blake3"
    raw = versions[2].numpy().view(np.uint8).reshape(-1)
    off = 0
    for h, n in doc["tensors"][0]["chunks"]:
        assert h == blake3.blake3(raw[off : off + n]).hexdigest()
        off += n
    # A store written with sha256 names, its shards without the "names" field
    # (as before BLAKE3 names): restores, and `verify` checks the sha256 names.
    monkeypatch.setattr(store_mod, "NAME_HASH", "sha256")
    import hetrun.runtime.ckpt.writer as writer_mod

    monkeypatch.setattr(writer_mod, "NAME_HASH", "sha256")
    old = _save_three(tmp_path / "old")
    monkeypatch.undo()
    for step in (10, 20, 30):
        _rewrite_shard(tmp_path / "old", step, lambda d: d.pop("names"))
    old_tier = Tier(tmp_path / "old")
    man = old_tier.read_manifest(30)
    doc = old_tier.read_shard(man["shards"][0]["path"], man["shards"][0]["sha256"], "test")
    assert "names" not in doc
    raw = old[2].numpy().view(np.uint8).reshape(-1)
    assert doc["tensors"][0]["chunks"][0][0] == hashlib.sha256(raw[: doc["tensors"][0]["chunks"][0][1]]).hexdigest()
    st = open_store(tmp_path / "old")
    res = st.restore()
    assert res is not None and res.step == 30 and exact(res.state["t"], old[2])
    assert st.verify(30) == []
    # An unknown naming hash is refused by name, never guessed.
    _rewrite_shard(tmp_path / "old", 30, lambda d: d.update(names="md5"))
    with pytest.raises(CheckpointError, match="'md5', unknown to this hetrun version"):
        open_store(tmp_path / "old").load_rank(30, 0)


def test_an_unstorable_value_is_named_by_its_path() -> None:
    """The error names where in the state the value sits (built only when one is found)."""
    from hetrun.runtime.ckpt import state

    with pytest.raises(CheckpointError, match=r"state\['a'\]\[1\]\['b'\]: value of type object cannot be stored"):
        state.flatten({"a": [1, {"b": object()}]})
    with pytest.raises(CheckpointError, match=r"state\['x'\]\[3\]: tensor dtype torch.quint8 is not supported"):
        state.flatten({"x": {3: torch.quantize_per_tensor(torch.zeros(2), 1.0, 0, torch.quint8)}})
    with pytest.raises(CheckpointError, match=r"state\['k'\]: dict key \(1, 2\) of type tuple"):
        state.flatten({"k": {(1, 2): 1}})
