"""examples/ddp_train_hetrun.py under torchrun with 2 gloo ranks: SIGUSR1 to ONE
rank at a random step stops both at the same agreed step, both checkpoint it
and exit 85; the rerun resumes and ends bit-identical to an uninterrupted run,
which is itself bit-identical to the unchanged baseline examples/ddp_train.py
under torchrun (the API changes nothing numerically). The uninterrupted API run is
made once for both tests (module fixture)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hetrun.runtime.ckpt import open_store

from tests.api_helpers import (
    BASELINE,
    EXAMPLE,
    EXIT_REQUEUE,
    assert_bit_identical,
    command,
    events,
    final_params,
    run_once,
)

# Both tests read the one uninterrupted API run: one worker under pytest-xdist.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("api_torchrun_uninterrupted")]
STEPS = 40


@pytest.fixture(scope="module")
def api_full(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The out directory of the API example's uninterrupted torchrun run (2 gloo ranks)."""
    root = tmp_path_factory.mktemp("api-full")
    full = run_once(command(EXAMPLE, root / "out", STEPS, 2, 0.0), root / "run")
    assert full.returncode == 0, full.stdout
    return root / "out"


def test_baseline_runs_unchanged_under_torchrun_and_matches_the_api_version(shared_tmp: Path,
                                                                             api_full: Path) -> None:
    base = run_once(command(BASELINE, shared_tmp / "base", STEPS, 2, 0.0), shared_tmp / "run_base")
    assert base.returncode == 0, base.stdout
    assert (shared_tmp / "base" / "snapshot.pt").exists()  # its own torch.save snapshots
    assert_bit_identical(final_params(api_full), final_params(shared_tmp / "base"))


def test_signal_to_one_rank_stops_both_at_one_step_and_resumes_bit_identical(shared_tmp: Path,
                                                                              api_full: Path) -> None:
    run_dir = shared_tmp / "run"
    cmd = command(EXAMPLE, shared_tmp / "out", STEPS, 2, 0.1)
    stop_after = random.Random().randrange(3, STEPS - 12)
    first = run_once(cmd, run_dir, stop_rank=1, stop_after=stop_after)
    assert first.returncode != 0, first.stdout  # torchrun reports the workers' exit 85
    evs = events(run_dir)
    exits = {e["rank"]: e["code"] for e in evs if e["ev"] == "exit"}
    assert exits == {0: EXIT_REQUEUE, 1: EXIT_REQUEUE}, first.stdout
    saved = {e["rank"]: e["iteration"] for e in evs if e["ev"] == "checkpoint" and e.get("ok") is True
             and e.get("reason") != "interval"}
    assert saved.keys() == {0, 1} and saved[0] == saved[1] > stop_after
    reasons = {e["rank"]: e["reason"] for e in evs if e["ev"] == "exit"}
    assert reasons == {0: "stop agreed with other ranks", 1: "signal SIGUSR1"}
    second = run_once(cmd, run_dir)
    assert second.returncode == 0, second.stdout
    restores = [e for e in events(run_dir) if e["ev"] == "restore"]
    assert {e["rank"]: e["iteration"] for e in restores} == {0: saved[0], 1: saved[0]}
    assert_bit_identical(final_params(shared_tmp / "out"), final_params(api_full))
    assert STEPS in open_store(run_dir / "ckpt" / "train").steps()  # the last save, committed before exit
