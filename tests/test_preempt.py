"""Preemption hooks in one process with real signals, plus the resume hooks
against a real plan.json (no MPI: a one-rank component)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from hetrun.runtime import preempt, resume
from hetrun.runtime.context import RankContext
from hetrun.runtime.plan_view import load_plan

from hetrun.errors import RuntimeFailure


def make_ctx(tmp_path: Path, checkpoint: dict[str, Any] | None = None, **preemption: Any) -> RankContext:
    from hetrun.dag.plan import build_plan
    from hetrun.dag.spec import load_spec
    from hetrun.runtime.plan_view import load_plan

    doc = {
        "name": "probe", "workload": "x:Y",
        "components": {"learner": {"nodes": 1, "tasks_per_node": 1, "cpus_per_task": 1, "mem": "1G",
                                   "actions": ["forward", "backward", "optimize", "checkpoint"]}},
        "training": {"kind": "supervised", "iterations": 10, "micro_batches": 1, "pipeline_window": 1, "seed": 0},
        "checkpoint": {"interval": 2, "keep": 3, **(checkpoint or {})},
        "preemption": {"signal": "USR1", "grace_seconds": 60, "max_restarts": 2, **preemption},
    }
    (tmp_path / "job.yaml").write_text(json.dumps(doc))
    (tmp_path / "plan.json").write_text(build_plan(load_spec(tmp_path / "job.yaml")).to_json())
    plan = load_plan(tmp_path)
    return RankContext(rank=0, world_size=1, component="learner", comp_rank=0, comp_size=1, group=None,
                       comm=None, device="cpu", seed=0, run_dir=tmp_path, plan=plan)


pytestmark = pytest.mark.usefixtures("clean_resume_hooks")


def test_signal_sets_a_flag_and_chains_the_previous_handler(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path)
    seen: list[int] = []
    old = signal.signal(signal.SIGUSR1, lambda s, f: seen.append(s))
    try:
        preempt.install(ctx)
        assert not preempt.should_stop(ctx)
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.01)
        assert seen == [signal.SIGUSR1]  # the handler installed before ours still runs
        assert preempt.should_stop(ctx) and preempt.stop_reason() == "signal SIGUSR1"
        assert preempt.exit_code(ctx) == preempt.EXIT_REQUEUE == 85
        preempt.uninstall()
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.01)
        assert seen == [signal.SIGUSR1] * 2  # ours is gone, theirs is back
    finally:
        preempt.uninstall()
        signal.signal(signal.SIGUSR1, old)


def test_sigterm_means_slurm_requeues_so_just_exit(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path)
    old = signal.getsignal(signal.SIGTERM)
    try:
        preempt.install(ctx)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.01)
        assert preempt.should_stop(ctx) and preempt.stop_reason() == "SIGTERM"
        assert preempt.exit_code(ctx) == 143
    finally:
        preempt.uninstall()
        signal.signal(signal.SIGTERM, old)


def test_stop_levels_and_the_agreed_level_decide_every_ranks_exit_code(tmp_path: Path) -> None:
    """A rank that never saw a signal exits like the ranks that did: the
    executor's agreement MAX-reduces stop_level and hands the result to agree()."""
    ctx = make_ctx(tmp_path)
    old = signal.getsignal(signal.SIGTERM)
    try:
        preempt.install(ctx)
        assert preempt.stop_level(ctx) == preempt.LEVEL_NONE
        preempt.agree(preempt.LEVEL_NONE)  # nobody asked: nothing changes
        assert preempt.stop_reason() is None and preempt.exit_code(ctx) == 85
        preempt.agree(preempt.LEVEL_TERMINATED)  # SIGTERM reached another rank only
        assert preempt.stop_reason() == "SIGTERM on another rank"
        assert preempt.exit_code(ctx) == 143 and not preempt.should_stop(ctx)
        preempt.agree(preempt.LEVEL_REQUEUE)  # the MAX so far stays
        assert preempt.exit_code(ctx) == 143
        preempt.uninstall()
        preempt.install(ctx)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.01)
        assert preempt.stop_level(ctx) == preempt.LEVEL_TERMINATED
        preempt.agree(preempt.LEVEL_TERMINATED)
        assert preempt.stop_reason() == "SIGTERM" and preempt.exit_code(ctx) == 143
    finally:
        preempt.uninstall()
        signal.signal(signal.SIGTERM, old)


def test_configured_signal_and_unknown_signal(tmp_path: Path) -> None:
    assert preempt.warning_signal(make_ctx(tmp_path, signal="USR2")) == signal.SIGUSR2
    assert preempt.warning_signal(make_ctx(tmp_path, signal="XCPU")) == signal.SIGXCPU
    ctx = make_ctx(tmp_path)
    # The spec rejects it; a hand-edited plan.json must not slip by.
    edited = json.loads((tmp_path / "plan.json").read_text())
    edited["preemption"]["signal"] = "KILL"
    (tmp_path / "plan.json").write_text(json.dumps(edited))
    ctx.plan = load_plan(tmp_path, validate=False)
    with pytest.raises(RuntimeFailure, match=r"preemption\.signal='KILL' is not supported"):
        preempt.warning_signal(ctx)


@pytest.mark.parametrize(("text", "seconds"), [
    ("1-02:03:04", 93784.0), ("02:03:04", 7384.0), ("03:04", 184.0), ("59", 59.0),
    ("UNLIMITED", None), ("NOT_SET", None), ("", None)])
def test_time_left_parsing(text: str, seconds: float | None) -> None:
    assert preempt.parse_time_left(text) == seconds


def test_time_limit_without_a_signal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = make_ctx(tmp_path)
    monkeypatch.setenv("SLURM_JOB_END_TIME", str(int(time.time()) + 3600))
    assert not preempt.should_stop(ctx)
    preempt.uninstall()
    # Closer than the (default) checkpoint cost times the safety factor: stop now.
    monkeypatch.setenv("SLURM_JOB_END_TIME", str(int(time.time()) + 12))
    assert preempt.should_stop(ctx) and "time limit" in (preempt.stop_reason() or "")
    assert preempt.exit_code(ctx) == 85


def test_hard_deadline_exits_even_if_the_agreement_hangs(tmp_path: Path) -> None:
    ctx_code = f"""
        import os, signal, time, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_preempt import make_ctx
        from pathlib import Path
        from hetrun.runtime import preempt
        ctx = make_ctx(Path({str(tmp_path)!r}))
        preempt.install(ctx)
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.05)
        assert preempt.should_stop(ctx)
        time.sleep(60)  # a peer never answers
        sys.exit(3)
    """
    env = {**os.environ, "HETRUN_PREEMPT_DEADLINE_S": "1"}
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(ctx_code)], env=env, capture_output=True, timeout=60)
    assert r.returncode == 85, r.stderr.decode()[-2000:]
    assert time.monotonic() - t0 < 30


class Probe:
    """A minimal workload: one linear layer and AdamW."""

    def __init__(self, seed: int) -> None:
        torch.manual_seed(seed)
        self.lin = torch.nn.Linear(8, 8)
        self.opt = torch.optim.AdamW(self.lin.parameters(), lr=0.1)

    def step(self) -> None:
        self.lin(torch.randn(4, 8)).pow(2).mean().backward()
        self.opt.step()
        self.opt.zero_grad()

    def state_dict(self) -> dict[str, Any]:
        return {"lin": self.lin.state_dict(), "opt": self.opt.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.lin.load_state_dict(state["lin"])
        self.opt.load_state_dict(state["opt"])


def events(run_dir: Path) -> list[dict[str, Any]]:
    p = run_dir / "events.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []


def test_first_run_has_nothing_to_resume(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path)
    assert resume.restore_if_any(ctx, Probe(0)) == 0
    assert not [e for e in events(tmp_path) if e["ev"] == "restore"]


def test_save_then_restore_with_rng_and_restart_events(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = make_ctx(tmp_path)
    log = resume._events(ctx)
    log.emit("start", restart_count=0)  # as the executor announces a rank
    log.close()
    wl = Probe(0)
    resume.restore_if_any(ctx, wl)
    wl.step()
    info = resume.save_checkpoint(ctx, wl, 4)
    assert info["step"] == 4 and info["stall_s"] >= 0
    assert resume.flush(ctx)["ok"]  # type: ignore[index]
    assert resume.save_checkpoint(ctx, wl, 4)["skipped"]  # same iteration twice: once
    want_rng = (random.random(), torch.rand(1))
    expected = wl.state_dict()
    resume.reset()

    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    random.seed(123)
    torch.manual_seed(123)
    fresh = Probe(7)
    assert resume.restore_if_any(make_ctx(tmp_path), fresh) == 4
    assert torch.equal(fresh.lin.weight, expected["lin"]["weight"])
    assert torch.equal(fresh.opt.state_dict()["state"][0]["exp_avg"], expected["opt"]["state"][0]["exp_avg"])
    assert (random.random(), torch.rand(1)) == want_rng
    (ev,) = [e for e in events(tmp_path) if e["ev"] == "restore"]
    assert ev["step"] == 4 and ev["restart_count"] == 1 and ev["max_restarts"] == 2 and ev["skipped"] == []
    # This rank ran in attempt 0 but logged no action before the stop (like an evaluator
    # stopped before its first evaluation): it lost nothing, a known 0, not an unknown
    # (a rank new in this attempt says None: tests/test_resize_slurm.py).
    assert ev["work_lost"] == 0, ev


@pytest.mark.parametrize(("chain", "deepest"), [(None, 3), (2, 1), (1, 0)])
def test_max_delta_chain_bounds_how_deep_a_chunk_depends(tmp_path: Path, chain: int | None, deepest: int) -> None:
    """checkpoint.max_delta_chain reaches the writer: with N, no chunk depends on
    more than N-1 older ones (1: every checkpoint stands alone)."""
    from hetrun.runtime.ckpt.objects import Tier

    ctx = make_ctx(tmp_path, checkpoint={} if chain is None else {"max_delta_chain": chain})
    wl = Probe(0)
    resume.restore_if_any(ctx, wl)
    for it in (2, 4, 6, 8):
        wl.step()
        resume.save_checkpoint(ctx, wl, it)
        assert resume.flush(ctx)["ok"]  # type: ignore[index]
    tier = Tier(resume.checkpoint_dir(ctx))
    depths = [int(tier.read_object_header(p.name).get("depth", 0)) for p in tier.iter_objects()]
    assert max(depths) == deepest, depths


def test_restart_limit_is_honoured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_RESTART_COUNT", "3")
    with pytest.raises(RuntimeFailure, match=r"restart 3 exceeds preemption.max_restarts=2"):
        resume.restore_if_any(make_ctx(tmp_path), Probe(0))
