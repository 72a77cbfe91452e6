"""LOSSY optimizer-state checkpoints (checkpoint.optimizer_encoding: lossy-4bit).

Round-trip error bounds of both moment encodings, zero-safety of exp_avg_sq,
what is and is not encoded, the tags and their refusal, and a save/restore
through hetrun.runtime.resume with the spec option: weights, step counters,
RNG and iteration exact, moments within bounds, the meta says lossy.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
import torch
from hetrun.runtime import resume
from hetrun.runtime.ckpt import lossy, open_store

from hetrun.errors import CheckpointError, HetrunError

# -- encodings -----------------------------------------------------------------------


def _adam_like(n: int, seed: int = 0, spread: float = 2.0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    scale = torch.exp(torch.randn(n, generator=g) * spread) * 1e-3  # spread 2: values over many octaves
    m = torch.randn(n, generator=g) * scale
    v = (torch.randn(n, generator=g) * scale) ** 2 + scale**2 * 1e-2
    return m, v


def test_exp_avg_round_trip_is_within_half_a_level_of_its_block_scale() -> None:
    m, _ = _adam_like(10_007)  # not a multiple of the block: padding
    doc = lossy.encode_signed(m)
    back = lossy.decode_tensor(doc)
    assert back.shape == m.shape and back.dtype == m.dtype
    levels = lossy.SIGNED_LEVELS
    half_gap = float((levels[1:] - levels[:-1]).max()) / 2
    pad = (-m.numel()) % lossy.BLOCK
    blocks = torch.cat([m, m.new_zeros(pad)]).view(-1, lossy.BLOCK)
    absmax = blocks.abs().amax(dim=1)
    err = torch.cat([(back - m), m.new_zeros(pad)]).view(-1, lossy.BLOCK).abs().amax(dim=1)
    # bfloat16 scale: up to 2**-8 relative off, on top of the level gap
    assert bool((err <= absmax * (half_gap + 2**-7)).all())
    assert bool((back.sign() * m.sign() >= 0).all())  # never the wrong sign
    assert float((back - m).norm() / m.norm()) < 0.2
    zeros = lossy.decode_tensor(lossy.encode_signed(torch.zeros(5000)))
    assert bool((zeros == 0).all())


def test_exp_avg_sq_round_trip_is_within_half_an_octave_and_never_zero() -> None:
    _, v = _adam_like(10_007, seed=1)
    v[::97] = 0.0  # exact zeros inside non-zero blocks
    doc = lossy.encode_log(v)
    back = lossy.decode_tensor(doc)
    assert back.shape == v.shape and back.dtype == v.dtype
    assert bool((back > 0).all()), "a decoded exp_avg_sq of 0 would blow up m / sqrt(v)"
    hi = doc["scales"].float().repeat_interleave(lossy.BLOCK)[: v.numel()]  # the block max, as stored
    in_range = v >= hi * 2.0 ** -(15 * lossy.LOG_STEP)
    ratio = back[in_range] / v[in_range]
    slack = 1 + 2**-7  # bfloat16 block max
    assert float(ratio.min()) >= 2 ** (-lossy.LOG_STEP / 2) / slack
    assert float(ratio.max()) <= 2 ** (lossy.LOG_STEP / 2) * slack
    # Below the grid (zeros included): the smallest level, never smaller than the value.
    assert bool((back[~in_range] >= v[~in_range]).all())
    all_zero = lossy.decode_tensor(lossy.encode_log(torch.zeros(3, 4096)))
    assert all_zero.shape == (3, 4096) and bool((all_zero == 0).all())


def test_adam_update_stays_close_and_half_precision_moments_keep_their_dtype() -> None:
    # Gradient scales vary moderately within a block (a row of a weight), as in training.
    m, v = _adam_like(50_000, seed=2, spread=0.5)
    dm, dv = lossy.decode_tensor(lossy.encode_signed(m)), lossy.decode_tensor(lossy.encode_log(v))
    u, du = m / (v.sqrt() + 1e-8), dm / (dv.sqrt() + 1e-8)
    assert float((du - u).norm() / u.norm()) < 0.3
    for dt in (torch.bfloat16, torch.float16):
        back = lossy.decode_tensor(lossy.encode_signed(m.to(dt).view(100, 500)))
        assert back.dtype == dt and back.shape == (100, 500)


def _state() -> dict[str, Any]:
    model = torch.nn.Sequential(torch.nn.Linear(128, 64), torch.nn.Linear(64, 1))
    adam = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sgd = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    for opt in (adam, sgd):
        model(torch.randn(8, 128)).pow(2).mean().backward()
        opt.step()
    return {"model": model.state_dict(), "adam": adam.state_dict(), "sgd": sgd.state_dict(), "seen": 3}


def test_only_large_adam_moments_are_encoded_and_tagged() -> None:
    st = _state()
    enc, summary = lossy.encode_state(st)
    assert summary["lossy"] and summary["encoded_tensors"] == 2  # the 128x64 weight's m and v
    big = enc["adam"]["state"][0]
    assert lossy.is_encoded(big["exp_avg"]) and big["exp_avg"][lossy.TAG_KEY] == lossy.SIGNED_TAG
    assert lossy.is_encoded(big["exp_avg_sq"]) and big["exp_avg_sq"][lossy.TAG_KEY] == lossy.LOG_TAG
    assert big["exp_avg"]["codes"].dtype == torch.uint8
    assert big["exp_avg"]["codes"].numel() == 128 * 64 // 2  # two codes per byte
    assert big["step"] is st["adam"]["state"][0]["step"]  # step counters untouched
    assert not lossy.is_encoded(enc["adam"]["state"][1]["exp_avg"])  # 64 values: small, exact
    assert enc["model"] is not st["model"] and all(enc["model"][k] is t for k, t in st["model"].items())
    assert enc["sgd"]["state"][0]["momentum_buffer"] is st["sgd"]["state"][0]["momentum_buffer"]
    assert st["adam"]["state"][0]["exp_avg"].dtype == torch.float32  # the input is not modified
    back = lossy.decode_state(enc)
    assert back["seen"] == 3 and back["adam"]["param_groups"] == st["adam"]["param_groups"]
    assert back["adam"]["state"][0]["exp_avg"].shape == (64, 128)
    same, summary = lossy.encode_state(st, "exact")
    assert same is st and not summary["lossy"] and lossy.lossy_meta(summary) == {}


def test_unknown_tag_and_malformed_entries_are_refused_clearly() -> None:
    enc, _ = lossy.encode_state(_state())
    doc = dict(enc["adam"]["state"][0]["exp_avg"])
    doc[lossy.TAG_KEY] = "m2-future-v9"
    with pytest.raises(CheckpointError, match=r"'m2-future-v9'.*cannot decode.*known: m4-absmax-geo-v1") as exc:
        lossy.decode_state({"adam": {"state": {0: {"exp_avg": doc}}}})
    assert "state['adam']['state'][0]['exp_avg']" in str(exc.value)
    short = dict(enc["adam"]["state"][0]["exp_avg_sq"], codes=torch.zeros(7, dtype=torch.uint8))
    with pytest.raises(CheckpointError, match="inconsistent sizes"):
        lossy.decode_tensor(short)
    with pytest.raises(CheckpointError, match="malformed"):
        lossy.decode_tensor({lossy.TAG_KEY: lossy.SIGNED_TAG, "shape": [4]})
    with pytest.raises(CheckpointError, match="unknown encoding 'lossy-2bit'"):
        lossy.encode_state({}, "lossy-2bit")


def test_spec_accepts_the_option_and_rejects_a_typo(tmp_path: Path) -> None:
    from hetrun.dag.spec import load_spec

    path = tmp_path / "job.yaml"
    path.write_text(json.dumps(_job({"optimizer_encoding": "lossy-4bit"})))
    assert load_spec(path).checkpoint.optimizer_encoding == "lossy-4bit"
    path.write_text(json.dumps(_job({})))
    assert load_spec(path).checkpoint.optimizer_encoding == "exact"
    path.write_text(json.dumps(_job({"optimizer_encoding": "lossy"})))
    with pytest.raises(HetrunError, match="optimizer_encoding"):
        load_spec(path)


# -- through hetrun.runtime.resume ---------------------------------------------------------


def _job(checkpoint: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": "lossy-probe", "workload": "x:Y",
        "components": {"learner": {"nodes": 1, "tasks_per_node": 1, "cpus_per_task": 1, "mem": "1G",
                                   "actions": ["forward", "backward", "optimize", "checkpoint"]}},
        "training": {"kind": "supervised", "iterations": 10, "micro_batches": 1, "pipeline_window": 1, "seed": 0},
        "checkpoint": {"interval": 2, "keep": 3, **checkpoint},
    }


def _ctx(run_dir: Path, encoding: str) -> Any:
    from hetrun.dag.plan import build_plan
    from hetrun.dag.spec import load_spec
    from hetrun.runtime.context import RankContext
    from hetrun.runtime.plan_view import load_plan

    if not (run_dir / "plan.json").exists():
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "job.yaml").write_text(json.dumps(_job({"optimizer_encoding": encoding})))
        (run_dir / "plan.json").write_text(build_plan(load_spec(run_dir / "job.yaml")).to_json())
    return RankContext(rank=0, world_size=1, component="learner", comp_rank=0, comp_size=1, group=None,
                       comm=None, device="cpu", seed=0, run_dir=run_dir, plan=load_plan(run_dir))


class Learner:
    """A small AdamW regression whose first weight is big enough to be encoded."""

    def __init__(self, seed: int) -> None:
        torch.manual_seed(seed)
        self.model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.Tanh(), torch.nn.Linear(128, 1))
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-2)
        self.target = torch.randn(64, 1, generator=torch.Generator().manual_seed(99))

    def step(self, i: int = 0) -> float:
        x = torch.randn(32, 64, generator=torch.Generator().manual_seed(i))
        loss = (self.model(x) - x @ self.target * 0.1).pow(2).mean()
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        return float(loss.detach())

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "opt": self.opt.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["opt"])


pytestmark = pytest.mark.usefixtures("clean_resume_hooks")


def _save_after(run_dir: Path, encoding: str, steps: int) -> tuple[Learner, dict[str, Any], Any]:
    wl = Learner(0)
    ctx = _ctx(run_dir, encoding)
    assert resume.restore_if_any(ctx, wl) == 0
    for i in range(steps):
        wl.step(i)
    info = resume.save_checkpoint(ctx, wl, steps)
    assert resume.flush(ctx)["ok"]  # type: ignore[index]
    want_rng = (random.random(), torch.rand(1))
    expected = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in wl.model.state_dict().items()}
    opt = wl.opt.state_dict()
    moments = {i: {k: (v.clone() if torch.is_tensor(v) else v) for k, v in s.items()} for i, s in opt["state"].items()}
    resume.reset()
    return wl, {"model": expected, "moments": moments, "rng": want_rng, "info": info}, ctx


def _ckpt_show(capsys: pytest.CaptureFixture[str], store_dir: Path) -> str:
    from hetrun.cli.app import main

    capsys.readouterr()
    try:
        main(["ckpt", "show", str(store_dir)])
    except SystemExit as exc:
        assert not exc.code, capsys.readouterr()
    return capsys.readouterr().out


def test_lossy_resume_through_the_runtime_hooks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "lossy"
    live, saved, _ = _save_after(run_dir, "lossy-4bit", 30)
    assert saved["info"]["lossy"] is True
    shown = _ckpt_show(capsys, run_dir / "ckpt" / "learner")
    assert '"lossy": true' in shown and '"optimizer_encoding": "lossy-4bit"' in shown, shown
    store = open_store(run_dir / "ckpt" / "learner")
    (row,) = store.info()
    doc = store.tiers[0].read_manifest(row.step)
    assert doc["meta"]["lossy"] is True and doc["meta"]["optimizer_encoding"] == "lossy-4bit"
    assert doc["meta"]["encoded_tensors"] == 2
    raw, _, _ = store.load_rank(30, 0)  # as stored: the tagged dicts, before decoding
    first = raw["workload"]["opt"]["state"][0]
    assert first["exp_avg"][lossy.TAG_KEY] == lossy.SIGNED_TAG and torch.is_tensor(first["step"])

    from hetrun.runtime.ckpt.export import export

    exported = torch.load(export(store, 30, tmp_path / "x.pt", "torch"), weights_only=True)
    moment = exported["workload"]["opt"]["state"][0]["exp_avg"]  # decoded, a plain tensor
    assert torch.is_tensor(moment) and moment.shape == saved["moments"][0]["exp_avg"].shape

    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    random.seed(123)
    torch.manual_seed(123)
    fresh = Learner(7)
    assert resume.restore_if_any(_ctx(run_dir, "lossy-4bit"), fresh) == 30
    for k, t in fresh.model.state_dict().items():
        assert torch.equal(t, saved["model"][k]), f"weight {k} not exact"
    assert (random.random(), torch.rand(1)) == saved["rng"]
    state = fresh.opt.state_dict()["state"]
    for i, s in saved["moments"].items():
        assert torch.equal(state[i]["step"], s["step"])
        m, v, bm, bv = s["exp_avg"], s["exp_avg_sq"], state[i]["exp_avg"], state[i]["exp_avg_sq"]
        if m.numel() < lossy.MIN_NUMEL:
            assert torch.equal(bm, m) and torch.equal(bv, v)  # small: exact
        else:
            assert not torch.equal(bm, m)  # lossy, and
            assert float((bm - m).norm() / m.norm()) < 0.2  # close
            assert float((bv - v).norm() / v.norm()) < 0.4
            assert bool((bv > 0).all())
    # Training goes on from the approximate moments as from the exact ones.
    ref = [live.step(i) for i in range(30, 50)]
    got = [fresh.step(i) for i in range(30, 50)]
    assert got != ref  # the moments differ, so the losses do, but only slightly:
    assert abs(sum(got[-10:]) - sum(ref[-10:])) <= 0.05 * sum(ref[-10:])


def test_exact_is_the_default_and_stays_bit_exact(tmp_path: Path) -> None:
    run_dir = tmp_path / "exact"
    _, saved, _ = _save_after(run_dir, "exact", 5)
    assert "lossy" not in saved["info"]
    doc = open_store(run_dir / "ckpt" / "learner").tiers[0].read_manifest(5)
    assert "lossy" not in doc["meta"]
    fresh = Learner(7)
    assert resume.restore_if_any(_ctx(run_dir, "exact"), fresh) == 5
    for i, s in saved["moments"].items():
        assert torch.equal(fresh.opt.state_dict()["state"][i]["exp_avg_sq"], s["exp_avg_sq"])


def test_restore_refuses_a_checkpoint_with_an_unknown_encoding(tmp_path: Path) -> None:
    from hetrun.runtime.ckpt import tiers_for
    from hetrun.runtime.ckpt.state import capture_rng
    from hetrun.runtime.ckpt.writer import CheckpointWriter

    run_dir = tmp_path / "future"
    ctx = _ctx(run_dir, "lossy-4bit")
    wl = Learner(0)
    wl.step()
    tree, _ = lossy.encode_state(wl.state_dict())
    tree["opt"]["state"][0]["exp_avg"][lossy.TAG_KEY] = "m3-newer-v2"
    writer = CheckpointWriter(tiers_for(run_dir / "ckpt" / "learner"))
    writer.save(1, {"workload": tree, "rng": capture_rng(), "iteration": 1}, {"lossy": True})
    assert writer.wait().ok  # type: ignore[union-attr]
    writer.close()
    with pytest.raises(CheckpointError, match=r"'m3-newer-v2', which this hetrun cannot decode"):
        resume.restore_if_any(ctx, Learner(1))


def test_lossy_save_snapshots_before_training_goes_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Encoding runs off the training thread: steps taken right after the save
    must not leak into the checkpoint (the encoder works on a copy)."""
    import threading

    trained_on = threading.Event()
    real_encode = lossy.encode_state

    def encode_after_training(tree: Any, encoding: str = "lossy-4bit") -> Any:
        assert trained_on.wait(60)  # encode only once training has moved the weights
        return real_encode(tree, encoding)

    monkeypatch.setattr(lossy, "encode_state", encode_after_training)
    run_dir = tmp_path / "lossy"
    wl = Learner(0)
    ctx = _ctx(run_dir, "lossy-4bit")
    assert resume.restore_if_any(ctx, wl) == 0
    for i in range(5):
        wl.step(i)
    at_save = {k: v.clone() for k, v in wl.model.state_dict().items()}
    info = resume.save_checkpoint(ctx, wl, 5)
    assert info["lossy"] is True and "stall_s" in info
    for i in range(5, 8):  # training goes on while the encoder thread works
        wl.step(i)
    trained_on.set()
    assert resume.flush(ctx)["ok"]  # type: ignore[index]
    resume.reset()
    fresh = Learner(3)
    assert resume.restore_if_any(_ctx(run_dir, "lossy-4bit"), fresh) == 5
    for k, t in fresh.model.state_dict().items():
        assert torch.equal(t, at_save[k]), f"weight {k} is not the one at the save"
