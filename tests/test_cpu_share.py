"""The learner's update on the cores its rollout ranks leave idle (examples/cpu_share.py,
``learner_threads: auto``), and the local launcher leaving ranks unbound so that it can."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from hetrun.examples import ppo
from hetrun.examples.cpu_share import CpuPhase, runnable_elsewhere, threads_for_update
from hetrun.examples.ppo import PPOConfig, PPOWorkload
from hetrun.runtime.context import RankContext
from hetrun.runtime.mpi_launch import loopback_mpi_env
from hetrun.slurm_plugin.backends.local import launch_commands
from setup_tools import MPIRUN

SMALL = {"num_envs": 4, "num_steps": 32, "update_epochs": 2, "num_minibatches": 2, "eval_episodes": 3,
         "learner_threads": "auto"}


@pytest.mark.parametrize(("cpus", "busy", "learners", "want"), [
    (2, 0, 1, 2),  # rollout waiting for weights: both cores
    (2, 1, 1, 1),  # rollout stepping its games: the learner keeps to its own core
    (2, 2, 1, 1),  # never below one thread
    (8, 3, 1, 5),
    (8, 2, 2, 3),  # two learners on the node share what is left
    (1, 0, 1, 1),  # a 1-CPU mask (Slurm's binding): 1
])
def test_threads_for_update(cpus: int, busy: int, learners: int, want: int) -> None:
    assert threads_for_update(cpus, busy, learners) == want


def test_other_runnable_work_caps_the_threads() -> None:
    assert threads_for_update(2, 0, 1, runnable_elsewhere=0) == 2
    assert threads_for_update(2, 0, 1, runnable_elsewhere=1) == 1  # another process on a core
    assert threads_for_update(2, 0, 1, runnable_elsewhere=12) == 1  # a loaded host: never 2 threads
    assert threads_for_update(8, 1, 1, runnable_elsewhere=2) == 6
    cpus = os.cpu_count() or 1
    got = runnable_elsewhere(torch.get_num_threads(), cpus)
    assert got is not None and got >= 0  # the host's count: this process may run on every CPU
    assert runnable_elsewhere(1, cpus + 1) is None  # a mask that is not the host's: the count says nothing


def test_phase_files_are_per_node_and_counted_by_role(tmp_path: Path) -> None:
    learner = CpuPhase(tmp_path, "n1", "learner", 0)
    roll_a, roll_b = CpuPhase(tmp_path, "n1", "rollout", 1), CpuPhase(tmp_path, "n1", "rollout", 2)
    elsewhere = CpuPhase(tmp_path, "n2", "rollout", 3)  # another node: never counted
    assert elsewhere.dir != learner.dir
    assert learner.update_threads(4) == 2  # both rollouts start busy
    roll_a.mark(busy=False)
    assert learner.update_threads(4) == 3
    roll_b.mark(busy=False)
    assert learner.update_threads(4) == 4
    second = CpuPhase(tmp_path, "n1", "learner", 4)
    assert learner.update_threads(4) == second.update_threads(4) == 2
    for p in (learner, roll_a, roll_b, elsewhere, second):
        p.close()
    with pytest.raises(ValueError, match="node name"):
        CpuPhase(tmp_path, "../x", "learner", 0)
    with pytest.raises(ValueError, match="role"):
        CpuPhase(tmp_path, "n1", "eval", 0)


def _ctx(rank: int, component: str, run_dir: Path) -> RankContext:
    # mode "mpi": ranks as processes (the in-process runtime never shares a node's cores this way).
    return RankContext(rank=rank, world_size=2, component=component, comp_rank=0, comp_size=1, group=None,
                       comm=None, device="cpu", seed=0, run_dir=run_dir, node="n1", mode="mpi")


def _update_threads(learner: PPOWorkload, batch: dict[str, torch.Tensor]) -> list[int]:
    seen: list[int] = []
    step = learner._step

    def spy() -> None:
        seen.append(torch.get_num_threads())
        step()

    learner._step = spy  # type: ignore[method-assign]
    loss = learner.forward(batch, 0, 1)
    learner.backward(loss)
    metrics = learner.optimize()
    assert metrics["update_threads"] == sum(seen) / len(seen)
    return seen


def test_auto_update_threads_follow_the_rollouts_phase(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A learner beside a rollout rank on a 4-CPU node (the affinity count given, this machine has 2):
    3 threads while the rollout steps its games, 4 while it waits, and the process's own count after."""
    monkeypatch.setattr(ppo, "node_cpus", lambda: 4)
    learner = PPOWorkload(_ctx(0, "learner", tmp_path), **SMALL)
    roller = PPOWorkload(_ctx(1, "rollout", tmp_path), **SMALL)
    batch = roller.rollout(0)  # marks itself busy while it steps, idle when done
    phase_file = tmp_path / "logs" / "cpu-phase" / "n1" / "rollout-1"
    assert phase_file.read_bytes() == b"0"
    before = torch.get_num_threads()
    assert _update_threads(learner, batch) == [4, 4, 4, 4]
    assert torch.get_num_threads() == before
    roller._phase("rollout").mark(busy=True)  # as it would be in the middle of its next rollout
    assert _update_threads(learner, batch) == [3, 3, 3, 3]
    assert torch.get_num_threads() == before


def test_threads_are_fixed_in_process_and_without_auto(tmp_path: Path) -> None:
    """No phase files unless learner_threads is auto and ranks are processes."""
    args = {**SMALL, "learner_threads": 2}
    learner = PPOWorkload(_ctx(0, "learner", tmp_path), **args)
    roller = PPOWorkload(_ctx(1, "rollout", tmp_path), **args)
    assert _update_threads(learner, roller.rollout(0)) == [2, 2, 2, 2]
    assert not (tmp_path / "logs").exists()
    assert PPOConfig.from_args({"learner_threads": "auto"}).threads_for_learner() == len(os.sched_getaffinity(0))


@pytest.mark.mpi
@MPIRUN
def test_local_launcher_leaves_ranks_unbound(tmp_path: Path) -> None:
    """Open MPI binds each of <= 2 ranks to one core unless told not to: with the local backend's
    launcher flags, two real ranks each may run on every CPU this process may."""
    mpirun = shutil.which("mpirun")
    assert mpirun is not None
    _, (argv,) = launch_commands(tmp_path, [("learner", 1), ("rollout", 1)], sys.executable, mpirun=mpirun)
    launcher = argv[: argv.index("-x")]
    assert launcher[-2:] == ["--bind-to", "none"]
    # One write per rank: mpirun forwards both ranks' output through one pipe, and with
    # PYTHONUNBUFFERED print's text and newline are two writes that can interleave (seen once).
    probe = [sys.executable, "-c", "import os; os.write(1, f'{sorted(os.sched_getaffinity(0))}\\n'.encode())"]
    proc = subprocess.run([*launcher, "-np", "1", *probe, ":", "-np", "1", *probe], capture_output=True,
                          text=True, env=loopback_mpi_env(), timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    masks = proc.stdout.splitlines()
    assert masks == [str(sorted(os.sched_getaffinity(0)))] * 2


ATARI = {"env_id": "ALE/Breakout-v5", "num_envs": 2, "num_steps": 16, "impala_width": 4, "hidden": 32,
         "num_minibatches": 2, "update_epochs": 2}


def test_atari_auto_runs_a_steps_parts_on_idle_cores_and_computes_what_one_thread_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """learner_threads auto on the Atari example: each minibatch step's fixed parts run at once on
    the cores the rollout leaves idle (1 at a time while it steps its games), and the weights and
    metrics after the update are bit-equal to a 1-thread learner's: auto is reproducible."""
    from hetrun.examples import atari_ppo
    from hetrun.examples.atari_ppo import AtariPPOWorkload

    monkeypatch.setattr(atari_ppo, "node_cpus", lambda: 2)
    roller = AtariPPOWorkload(_ctx(1, "rollout", tmp_path), **ATARI, learner_threads="auto")
    batch = roller.rollout(0)
    threads_seen: set[str] = set()

    def run(args: dict[str, object], busy_rollout: bool) -> tuple[AtariPPOWorkload, dict[str, float]]:
        learner = AtariPPOWorkload(_ctx(0, "learner", tmp_path), **ATARI, **args)
        loss = learner._loss

        def spy(minibatch: torch.Tensor, part: torch.Tensor) -> torch.Tensor:
            threads_seen.add(threading.current_thread().name)
            return loss(minibatch, part)

        learner._loss = spy  # type: ignore[method-assign]
        roller._phase("rollout").mark(busy=busy_rollout)
        for micro in range(2):
            learner.backward(learner.forward(batch, micro, 2))
        return learner, learner.optimize()

    one, m_one = run({"learner_threads": 1}, busy_rollout=False)
    assert m_one["update_threads"] == 1.0 and threads_seen == {"MainThread"}
    auto, m_auto = run({"learner_threads": "auto"}, busy_rollout=False)
    assert m_auto["update_threads"] == (1 + 2 + 2 + 2) / 4  # the runtime's first step runs in turn
    assert any(name.startswith("ppo-part") for name in threads_seen)  # a part ran on the other core
    for a, b in zip(one.parameters_to_sync(), auto.parameters_to_sync(), strict=True):
        assert torch.equal(a, b)
    assert m_one == {**m_auto, "update_threads": 1.0}
    _, m_busy = run({"learner_threads": "auto"}, busy_rollout=True)
    assert m_busy["update_threads"] == 1.0  # the rollout holds the other core: parts in turn
    assert m_busy == m_one
