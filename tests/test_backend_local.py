"""The local backend for real: mpirun MPMD (one app context per component), status,
cancel, and the supervisor's restart on exit code 85."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fake_runtime_jobs import fake_runtime, two_component_spec
from hetrun.dag.spec import load_spec, spec_from_dict
from hetrun.slurm_plugin.backends.local import LocalBackend, launch_commands, proc_start_ticks
from hetrun.slurm_plugin.rundir import events_of, read_run, wait_for
from hetrun.slurm_plugin.submit import submit_spec, wait_for_end
from setup_tools import MPIRUN

from hetrun.errors import SlurmError

pytestmark = [pytest.mark.mpi, MPIRUN]

REPO = Path(__file__).resolve().parent.parent


def _starts(run_dir: Path) -> dict[int, dict]:
    out = {}
    path = run_dir / "events.jsonl"
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                ev = json.loads(line)
            except json.JSONDecodeError:
                continue
            if ev.get("ev") == "start":
                out[ev["rank"]] = ev
    return out


def test_launch_command_is_one_mpmd_mpirun(tmp_path: Path) -> None:
    launcher, cmds = launch_commands(tmp_path, [("learner", 1), ("rollout", 2)], "/usr/bin/python3",
                                     mpirun="/usr/bin/mpirun")
    assert launcher == "mpirun" and len(cmds) == 1
    argv = cmds[0]
    assert argv.count(":") == 1
    assert argv[argv.index("-x") + 1] == "HETRUN_COMPONENT=learner"
    assert "HETRUN_COMPONENT=rollout" in argv and argv[argv.index("HETRUN_COMPONENT=rollout") + 2] == "2"
    # Without mpirun only a single-rank job can run: several ranks would each be a world of one.
    with pytest.raises(SlurmError, match="mpirun"):
        launch_commands(tmp_path, [("learner", 1), ("rollout", 2)], "/usr/bin/python3", mpirun="")
    launcher, cmds = launch_commands(tmp_path, [("learner", 1)], "/usr/bin/python3", mpirun="")
    assert launcher == "processes" and len(cmds) == 1


def test_example_runs_every_component_then_cancel(tmp_path: Path) -> None:
    env = dict(os.environ, HETRUN_RUNS=str(tmp_path))
    proc = subprocess.run([sys.executable, "-m", "hetrun.cli", "submit", str(REPO / "examples" / "ppo_cartpole.yaml"),
                           "--backend", "local"], capture_output=True, text=True, env=env, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    run_dir = Path(next(line.split(": ", 1)[1] for line in proc.stdout.splitlines()
                        if line.startswith("run directory: ")))
    run = read_run(run_dir)
    try:
        assert run.backend == "local" and run.pids.get("supervisor")
        assert wait_for(lambda: len(_starts(run_dir)) == 3, 90, 0.5), _starts(run_dir)
        starts = _starts(run_dir)
        assert [starts[r]["component"] for r in (0, 1, 2)] == ["learner", "rollout", "rollout"]
        assert {p.name for p in (run_dir / "logs").iterdir()} >= {
            "learner-local-0.out", "rollout-local-1.out", "rollout-local-2.out"}
        st = subprocess.run([sys.executable, "-m", "hetrun.cli", "status", run_dir.name], capture_output=True,
                            text=True, env=env, timeout=60, check=False)
        assert st.returncode == 0 and st.stdout.count("RUNNING") == 2, st.stdout + st.stderr

        cancel = subprocess.run([sys.executable, "-m", "hetrun.cli", "cancel", run_dir.name],
                                capture_output=True, text=True, env=env, timeout=60, check=False)
        assert cancel.returncode == 0, cancel.stderr
        final = wait_for_end(run, LocalBackend(), timeout_s=60, poll_s=0.5)
        assert [c.state for c in final.components] == ["CANCELLED", "CANCELLED"]
        pids = [e["pid"] for e in starts.values()]
        assert wait_for(lambda: all(proc_start_ticks(p) is None for p in pids), 20, 0.5), "ranks survived cancel"
    finally:
        sup = run.pids.get("supervisor")
        if isinstance(sup, int) and proc_start_ticks(sup) == run.pids.get("start_ticks"):
            os.kill(sup, 9)


REQUEUE_RUNTIME = """#!/bin/bash
# fake runtime for tests: asks for a restart (85) on the first attempt, then succeeds.
# Called as: fake -m hetrun.runtime RUN_DIR
echo "attempt restart=$HETRUN_RESTART_COUNT component=$HETRUN_COMPONENT" >> "$3/fake-attempts"
if [ "$HETRUN_RESTART_COUNT" = "0" ]; then exit 85; fi
exit 0
"""


def test_supervisor_restarts_on_85_then_completes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = fake_runtime(tmp_path, "fake_runtime.sh", REQUEUE_RUNTIME)
    monkeypatch.setenv("HETRUN_LOCAL_PYTHON", str(fake))
    spec = two_component_spec(
        "local-requeue",
        preemption={"max_restarts": 2},
    )
    res = submit_spec(spec, backend="local", runs_dir=tmp_path / "runs")
    final = wait_for_end(res.run, LocalBackend(), timeout_s=120, poll_s=0.5)
    assert [c.state for c in final.components] == ["COMPLETED", "COMPLETED"], final
    assert all(c.restarts == 1 for c in final.components)
    attempts = (Path(res.run.run_dir) / "fake-attempts").read_text().splitlines()
    assert sorted(attempts) == sorted([
        "attempt restart=0 component=learner", "attempt restart=0 component=rollout",
        "attempt restart=1 component=learner", "attempt restart=1 component=rollout"])


def test_dry_run_writes_nothing(tmp_path: Path) -> None:
    spec = load_spec(REPO / "examples" / "moe_lm.yaml")
    res = submit_spec(spec, backend="local", runs_dir=tmp_path / "runs", dry_run=True)
    assert not (tmp_path / "runs").exists()
    assert res.dry_run is not None and res.dry_run.command[-1] == res.run.run_dir
    assert any("HETRUN_COMPONENT=learner" in n for n in res.dry_run.notes)


SINGLE_RUNTIME = """#!/bin/bash
# fake runtime for tests: records how it was started.
echo "component=$HETRUN_COMPONENT run_dir=$3 restart=$HETRUN_RESTART_COUNT" > "$3/fake-single"
"""


def test_without_mpirun_a_single_rank_job_runs_as_a_plain_process(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = fake_runtime(tmp_path, "fake_runtime.sh", SINGLE_RUNTIME)
    bin_dir = tmp_path / "bin"  # a PATH with a shell and no mpirun
    bin_dir.mkdir()
    os.symlink(shutil.which("sh") or "/bin/sh", bin_dir / "sh")
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("HETRUN_LOCAL_PYTHON", str(fake))
    spec = spec_from_dict({
        "name": "single", "workload": "hetrun.examples.moe_lm:MoEWorkload",
        "components": {"learner": {"nodes": 1, "tasks_per_node": 1, "mem": "500M",
                                   "actions": ["forward", "backward", "optimize"]}},
        "training": {"kind": "supervised", "iterations": 1},
    })
    res = submit_spec(spec, backend="local", runs_dir=tmp_path / "runs")
    final = wait_for_end(res.run, LocalBackend(), timeout_s=60, poll_s=0.3)
    assert [c.state for c in final.components] == ["COMPLETED"], final
    run_dir = Path(res.run.run_dir)
    assert (run_dir / "fake-single").read_text().strip() == f"component=learner run_dir={run_dir} restart=0"
    assert json.loads((run_dir / "local.json").read_text())["launcher"] == "processes"


WARNED_RUNTIME = """#!/bin/bash
# fake runtime for tests: waits for the warning signal, then exits 85 like a checkpointing
# runtime; from restart $FAKE_LAST_RESTART on it completes at once.
run_dir="$3"; rank="${OMPI_COMM_WORLD_RANK:-0}"
if [ "$HETRUN_RESTART_COUNT" -ge "$FAKE_LAST_RESTART" ]; then exit 0; fi
trap 'exit 85' USR1
touch "$run_dir/ready-$HETRUN_RESTART_COUNT-$rank"
while :; do sleep 0.1; done
"""


def _warn_each_attempt(run: object, run_dir: Path, attempts: int) -> None:
    """SIGUSR1 to the supervisor once every rank of each attempt is up, ``attempts`` times."""
    for restart in range(attempts):
        assert wait_for(lambda r=restart: len(list(run_dir.glob(f"ready-{r}-*"))) == 3, 60, 0.1), restart
        os.kill(int(run.pids["supervisor"]), 10)  # type: ignore[attr-defined]


def test_fifth_preemption_does_not_end_the_run_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HETRUN_LOCAL_PYTHON", str(fake_runtime(tmp_path, "fake.sh", WARNED_RUNTIME)))
    monkeypatch.setenv("FAKE_LAST_RESTART", "5")
    res = submit_spec(two_component_spec("five-warnings", rollout_nodes=2), backend="local",
                      runs_dir=tmp_path / "runs")
    run_dir = Path(res.run.run_dir)
    _warn_each_attempt(res.run, run_dir, 5)
    final = wait_for_end(res.run, LocalBackend(), timeout_s=120, poll_s=0.3)
    assert [c.state for c in final.components] == ["COMPLETED", "COMPLETED"], final
    assert all(c.restarts == 5 for c in final.components)
    ends = events_of(run_dir, ("attempt_end",))
    assert [(e["restart_count"], e["outcome"], e["requeued"], e["signal"]) for e in ends] == [
        *[(r, "time_limit", True, "USR1") for r in range(5)], (5, "done", False, None)]


def test_max_preemptions_ends_the_run_and_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HETRUN_LOCAL_PYTHON", str(fake_runtime(tmp_path, "fake.sh", WARNED_RUNTIME)))
    monkeypatch.setenv("FAKE_LAST_RESTART", "9")
    spec = two_component_spec("limited", rollout_nodes=2, preemption={"max_preemptions": 1})
    res = submit_spec(spec, backend="local", runs_dir=tmp_path / "runs")
    run_dir = Path(res.run.run_dir)
    _warn_each_attempt(res.run, run_dir, 2)
    final = wait_for_end(res.run, LocalBackend(), timeout_s=60, poll_s=0.3)
    assert [(c.state, c.exit_code) for c in final.components] == [("FAILED", 85)] * 2, final
    ends = events_of(run_dir, ("attempt_end",))
    assert [(e["outcome"], e["requeued"]) for e in ends] == [("time_limit", True), ("time_limit", False)]
    assert "preemption.max_preemptions (1) reached" in ends[-1]["reason"]
