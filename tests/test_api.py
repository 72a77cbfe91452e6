"""The public run API (``import hetrun; hetrun.attach()``): rank discovery, run
directories, the Stateful adapter, and a standalone run of
examples/ddp_train_hetrun.py stopped by a real SIGUSR1 at a random step,
resumed, and bit-identical to an uninterrupted run."""

from __future__ import annotations

import os
import random
import signal
import subprocess
from pathlib import Path

import pytest
import torch
from hetrun.runtime.api import env as envmod
from hetrun.runtime.api import rundir
from hetrun.runtime.api.run import StateObjects
from hetrun.runtime.ckpt import open_store

from hetrun.errors import CheckpointError, RunDirError
from tests.api_helpers import (
    EXAMPLE,
    EXIT_REQUEUE,
    assert_bit_identical,
    command,
    events,
    final_params,
    run_once,
)

LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
               "MASTER_PORT", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "SLURM_JOB_ID",
               "SLURM_STEP_ID", "SLURM_PROCID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID",
               "HETRUN_RUN_DIR", "HETRUN_RUNS", "HETRUN_RUNS_DIR", "PMIX_RANK")


@pytest.fixture
def bare_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    # A copy: export_torchrun_env writes os.environ, which must not leak into later tests.
    monkeypatch.setattr(os, "environ", os.environ.copy())
    for key in LAUNCH_VARS:
        monkeypatch.delenv(key, raising=False)
    return monkeypatch


def test_import_hetrun_exposes_attach_without_importing_torch_eagerly() -> None:
    code = "import sys, hetrun, hetrun.dag; assert 'torch' not in sys.modules; print(hetrun.attach.__module__)"
    out = subprocess.run(["python3", "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "hetrun.runtime.api.run"


def test_discover_reads_each_launcher(bare_env: pytest.MonkeyPatch) -> None:
    assert envmod.discover().launcher == "standalone"
    bare_env.setenv("SLURM_JOB_ID", "77")  # the batch shell: one process, whatever --ntasks says
    bare_env.setenv("SLURM_PROCID", "0")
    bare_env.setenv("SLURM_NTASKS", "4")
    got = envmod.discover()
    assert (got.launcher, got.world_size, got.job_id) == ("standalone", 1, "77")
    bare_env.setenv("SLURM_STEP_ID", "0")
    bare_env.setenv("SLURM_PROCID", "3")
    bare_env.setenv("SLURM_STEP_NUM_TASKS", "4")
    bare_env.setenv("SLURM_NODEID", "1")
    bare_env.setenv("SLURM_LOCALID", "1")
    bare_env.setenv("SLURM_STEP_TASKS_PER_NODE", "2(x2)")
    got = envmod.discover()
    assert (got.launcher, got.rank, got.world_size, got.local_rank, got.local_world_size, got.node_rank) == (
        "slurm", 3, 4, 1, 2, 1)
    bare_env.setenv("RANK", "1")
    bare_env.setenv("WORLD_SIZE", "2")
    assert envmod.discover().launcher == "torchrun"  # explicit torchrun names win
    bare_env.setenv("RANK", "x")
    with pytest.raises(Exception, match=r"\$RANK='x'"):
        envmod.discover()


def test_slurm_notation_helpers() -> None:
    assert envmod.tasks_on_node("2(x3),1", 2) == 2
    assert envmod.tasks_on_node("2(x3),1", 3) == 1
    assert envmod.tasks_on_node("2(x3),1", 4) is None
    assert envmod.first_host("n[01-04,7],m2") == "n01"
    assert envmod.first_host("gpu7,gpu8") == "gpu7"
    assert envmod.master_port("1234", "0") != envmod.master_port("1235", "0")


def test_export_fills_only_missing_torchrun_vars(bare_env: pytest.MonkeyPatch) -> None:
    bare_env.setenv("MASTER_ADDR", "10.0.0.9")
    rank_env = envmod.RankEnv(2, 4, 0, 2, 1, "slurm", "42")
    added = envmod.export_torchrun_env(rank_env)
    assert added["RANK"] == "2" and added["WORLD_SIZE"] == "4" and added["GROUP_RANK"] == "1"
    assert "MASTER_ADDR" not in added  # never overrides
    assert int(added["MASTER_PORT"]) == envmod.master_port("42", None)


def test_run_dir_on_slurm_refuses_node_local_tmp(bare_env: pytest.MonkeyPatch, shared_tmp: Path) -> None:
    on_slurm = envmod.RankEnv(0, 1, 0, 1, 0, "standalone", "123")
    with pytest.raises(RunDirError, match="node-local") as err:
        rundir.resolve(on_slurm, "/tmp/hetrun-api-run", None)
    assert "shared file system" in (err.value.hint or "")
    bare_env.setenv("HETRUN_RUNS", str(shared_tmp))  # the CLI's runs directory, the one variable
    assert rundir.resolve(on_slurm, None, None) == shared_tmp / "123"  # a requeue finds it again
    off_slurm = envmod.RankEnv(0, 1, 0, 1, 0, "standalone", None)
    assert rundir.resolve(off_slurm, None, "exp1") == shared_tmp / "exp1"
    # The old name is still read, with a warning; both naming different places is refused.
    bare_env.delenv("HETRUN_RUNS")
    bare_env.setenv("HETRUN_RUNS_DIR", str(shared_tmp))
    with pytest.warns(FutureWarning, match="set HETRUN_RUNS instead"):
        assert rundir.resolve(off_slurm, None, "exp2") == shared_tmp / "exp2"
    bare_env.setenv("HETRUN_RUNS", str(shared_tmp / "other"))
    with pytest.raises(RunDirError, match=r"HETRUN_RUNS_DIR=.* disagree"):
        rundir.resolve(off_slurm, None, "exp3")
    with pytest.raises(RunDirError, match="plain directory name"):
        rundir.resolve(off_slurm, None, "../x")


def test_state_objects_name_what_cannot_be_saved() -> None:
    sampler = torch.utils.data.DistributedSampler(list(range(4)), num_replicas=1, rank=0)
    with pytest.raises(CheckpointError, match="'data': a DistributedSampler has no state_dict"):
        StateObjects({"model": torch.nn.Linear(2, 2), "data": sampler})
    t = torch.zeros(3)
    objs = StateObjects({"t": t})
    with pytest.raises(CheckpointError, match=r"has no \['t'\]"):
        objs.load_state_dict({"other": torch.ones(3)})


def test_standalone_signal_at_a_random_step_resumes_bit_identical(shared_tmp: Path) -> None:
    steps = 40
    full = run_once(command(EXAMPLE, shared_tmp / "full", steps, 1, 0.0), shared_tmp / "run_full")
    assert full.returncode == 0, full.stdout
    stop_after = random.Random().randrange(3, steps - 10)
    run_dir = shared_tmp / "run"
    cmd = command(EXAMPLE, shared_tmp / "out", steps, 1, 0.05)
    first = run_once(cmd, run_dir, stop_rank=0, stop_after=stop_after)
    assert first.returncode == EXIT_REQUEUE, first.stdout
    stopped = [e for e in events(run_dir) if e["ev"] == "checkpoint" and e.get("reason") == "signal SIGUSR1"]
    assert stopped and stopped[-1]["iteration"] > stop_after and stopped[-1].get("ok") is True
    second = run_once(cmd, run_dir)
    assert second.returncode == 0, second.stdout
    restore = [e for e in events(run_dir) if e["ev"] == "restore"]
    assert restore[-1]["iteration"] == stopped[-1]["iteration"]
    assert_bit_identical(final_params(shared_tmp / "out"), final_params(shared_tmp / "full"))
    assert steps in open_store(run_dir / "ckpt" / "train").steps()  # the last save, committed before exit


def test_sigterm_exits_143_after_the_agreed_checkpoint(shared_tmp: Path) -> None:
    run_dir = shared_tmp / "run"
    cmd = command(EXAMPLE, shared_tmp / "out", 30, 1, 0.05)
    done = run_once(cmd, run_dir, stop_rank=0, stop_after=4, sig=signal.SIGTERM)
    assert done.returncode == 128 + signal.SIGTERM, done.stdout
    exits = [e for e in events(run_dir) if e["ev"] == "exit"]
    assert exits[-1]["code"] == 143 and exits[-1]["reason"] == "SIGTERM"


def test_snapshot_validates_the_state_dict_once_while_it_holds_the_same_objects() -> None:
    """Run.snapshot wraps the script's dict as StateObjects (its checks) once, and again only when
    the dict or an object in it changed: tensors are compared by identity (never by value), and a
    changed object is checked (a bad one named) before it is used."""
    import torch
    from hetrun.runtime.api.run import Run

    from hetrun.errors import CheckpointError

    run = Run.__new__(Run)
    run._state_kept = None
    model, t = torch.nn.Linear(2, 2), torch.zeros(3)
    objs = {"model": model, "t": t}
    first = run._state_of(objs)
    assert run._state_of(objs) is first and first.objs is objs
    objs["t"] = torch.zeros(3)  # an equal tensor, another object: checked again
    second = run._state_of(objs)
    assert second is not first and run._state_of(objs) is second
    assert run._state_of(dict(objs)) is not second  # another dict
    objs["t"] = object()
    with pytest.raises(CheckpointError, match="key 't'"):
        run._state_of(objs)
