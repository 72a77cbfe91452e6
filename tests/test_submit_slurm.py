"""Submitting for real to the local Slurm cluster (marked slurm through the fixture).

Run directories live under ``shared_tmp`` (/var/tmp): the emulated nodes have
a private /tmp.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fake_runtime_jobs import fake_runtime, two_component_spec
from hetrun.dag.spec import load_spec
from hetrun.slurm_plugin.backends.sbatch import SbatchBackend
from hetrun.slurm_plugin.backends.slurm_cli import RetryPolicy
from hetrun.slurm_plugin.rundir import read_run, wait_for
from hetrun.slurm_plugin.submit import submit_spec, wait_for_end

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


def hetrun(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hetrun.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, check=False)


def _events(run_dir: Path) -> list[dict]:
    path = run_dir / "events.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a truncated last line while ranks are writing
    return out


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_sbatch_test_only_accepts_every_example(example: Path, slurm_cluster, shared_tmp: Path) -> None:  # type: ignore[no-untyped-def]
    spec = load_spec(example)
    res = submit_spec(spec, backend="sbatch", runs_dir=shared_tmp, dry_run=True)
    script = shared_tmp / "hetjob.sbatch"
    script.write_text(res.script)
    verdict = SbatchBackend().test_only(script)
    # sbatch --test-only prints "Job <id> to start at <time> using N processors on nodes ..."
    assert "to start at" in verdict, verdict


def test_het_job_starts_every_rank_status_and_cancel(slurm_cluster, shared_tmp: Path) -> None:  # type: ignore[no-untyped-def]
    env = dict(os.environ, HETRUN_RUNS=str(shared_tmp))
    proc = hetrun("submit", str(REPO / "examples" / "ppo_cartpole.yaml"), "--backend", "sbatch", env=env)
    assert proc.returncode == 0, proc.stderr
    run_dir = Path(next(line.split(": ", 1)[1] for line in proc.stdout.splitlines()
                        if line.startswith("run directory: ")))
    run = read_run(run_dir)
    assert run.job_id and run.job_id.isdigit() and run.components == ["learner", "rollout"]
    from hetrun.slurm_plugin.cluster_conf import CLUSTER_NAME

    assert run.cluster == CLUSTER_NAME
    for name in ("job.yaml", "plan.json", "hetjob.sbatch", "run.json"):
        assert (run_dir / name).is_file(), name
    try:
        # ppo_cartpole: learner 1 rank, rollout 2 ranks -> 3 ranks in one world.
        def all_started() -> bool:
            return len({e["rank"] for e in _events(run_dir) if e.get("ev") == "start"}) == 3

        assert wait_for(all_started, 120, 1.0), f"not every rank started: {_events(run_dir)[:5]}"
        starts = {e["rank"]: e for e in _events(run_dir) if e.get("ev") == "start"}
        assert starts[0]["component"] == "learner"
        assert starts[1]["component"] == "rollout" and starts[2]["component"] == "rollout"
        assert len({starts[r]["node"] for r in (0, 1, 2)}) == 3, "components share a node"
        logs = sorted(p.name for p in (run_dir / "logs").iterdir())
        assert any(n.startswith("learner-") for n in logs) and any(n.startswith("rollout-") for n in logs)

        st = hetrun("status", run_dir.name, env=env)
        assert st.returncode == 0, st.stderr
        rows = [line for line in st.stdout.splitlines() if "learner" in line or "rollout" in line]
        assert len(rows) == 2 and all("RUNNING" in r for r in rows), st.stdout

        cancel = hetrun("cancel", run.job_id, env=env)
        assert cancel.returncode == 0, cancel.stderr
        final = wait_for_end(run, SbatchBackend(), timeout_s=60, poll_s=1)
        assert [c.state for c in final.components] == ["CANCELLED", "CANCELLED"]
        st = hetrun("status", str(run_dir), env=env)
        assert st.stdout.count("CANCELLED") == 2, st.stdout
    finally:
        subprocess.run(["scancel", run.job_id], check=False, capture_output=True)


FAKE_RUNTIME = """#!/bin/bash
# fake runtime for tests: records its environment per rank; exits $1-dependent.
printf '%s\\0' "$@" > "$HETRUN_RUN_DIR/fake-argv-$SLURM_PROCID"
env -0 > "$HETRUN_RUN_DIR/fake-env-$SLURM_PROCID"
"""


def test_payload_job_is_inert_on_the_cluster(slurm_cluster, shared_tmp: Path) -> None:  # type: ignore[no-untyped-def]
    canary = shared_tmp / "CANARY"
    payload = f"$(touch {canary}); `touch {canary}`; ' \" ; touch {canary}"
    fake = fake_runtime(shared_tmp, "fake_runtime.sh", FAKE_RUNTIME)
    spec = two_component_spec(
        "inj-live",
        workload_args={"env_id": payload},
        slurm={"time": "00:02:00"},
        env={"PAYLOAD": payload},
    )
    res = submit_spec(spec, backend="sbatch", runs_dir=shared_tmp / "runs", python=str(fake))
    run_dir = Path(res.run.run_dir)
    try:
        final = wait_for_end(res.run, SbatchBackend(), timeout_s=90, poll_s=1)
        assert [c.state for c in final.components] == ["COMPLETED", "COMPLETED"], final
        assert not canary.exists()
        for rank in (0, 1):
            env = dict(kv.split("=", 1) for kv in
                       (run_dir / f"fake-env-{rank}").read_text().split("\0") if "=" in kv)
            assert env["PAYLOAD"] == payload
        assert json.loads((run_dir / "plan.json").read_text())["workload_args"]["env_id"] == payload
        outside = {p.name for p in shared_tmp.iterdir()} - {"runs", "fake_runtime.sh"}
        assert not outside, outside
    finally:
        subprocess.run(["scancel", str(res.run.job_id)], check=False, capture_output=True)


REQUEUE_RUNTIME = """#!/bin/bash
# fake runtime for tests: "checkpoints" and asks for a requeue (exit 85) on the first attempt.
echo "attempt restart=${SLURM_RESTART_COUNT:-0} rank=$SLURM_PROCID" >> "$HETRUN_RUN_DIR/fake-attempts"
if [ "${SLURM_RESTART_COUNT:-0}" = "0" ]; then exit 85; fi
exit 0
"""


def test_exit_85_requeues_the_het_job(slurm_cluster, shared_tmp: Path) -> None:  # type: ignore[no-untyped-def]
    fake = fake_runtime(shared_tmp, "requeue_runtime.sh", REQUEUE_RUNTIME)
    spec = two_component_spec(
        "requeue",
        slurm={"time": "00:02:00"},
        preemption={"max_restarts": 2},
    )
    res = submit_spec(spec, backend="sbatch", runs_dir=shared_tmp / "runs", python=str(fake))
    run_dir = Path(res.run.run_dir)
    backend = SbatchBackend(RetryPolicy(attempts=3, first_delay_s=0.5))
    try:
        def requeued() -> bool:
            comps = backend.status([res.run])[res.run.run_dir].components
            return bool(comps) and all(c.restarts >= 1 for c in comps)

        assert wait_for(requeued, 90, 1.0), backend.status([res.run])
        batch_log = "".join(p.read_text() for p in (run_dir / "logs").glob("batch-*.out"))
        assert "requeueing job" in batch_log, batch_log
        assert "restart=0" in (run_dir / "fake-attempts").read_text()
    finally:
        subprocess.run(["scancel", str(res.run.job_id)], check=False, capture_output=True)


def test_status_asks_squeue_once_for_many_runs(slurm_cluster, shared_tmp: Path) -> None:  # type: ignore[no-untyped-def]
    """`hetrun status` over many runs: one squeue call (and one sacct for runs squeue forgot)."""
    from hetrun.slurm_plugin.rundir import RunInfo, create_run_dir, write_run

    counted = shared_tmp / "bin"
    counted.mkdir()
    for tool in ("squeue", "sacct"):
        real = subprocess.run(["which", tool], capture_output=True, text=True, check=True).stdout.strip()
        (counted / tool).write_text(f'#!/bin/sh\necho {tool} >> "{shared_tmp}/calls"\nexec {real} "$@"\n')
        (counted / tool).chmod(0o755)
    runs = shared_tmp / "runs"
    for i in range(6):
        d = create_run_dir(runs, f"many{i}")
        # Job ids far beyond what the test cluster has used: squeue does not know them.
        write_run(RunInfo(name=f"many{i}", run_dir=str(d), backend="sbatch", job_id=str(9_000_000 + i),
                          components=["learner", "rollout"]))
    env = dict(os.environ, PATH=f"{counted}:{os.environ['PATH']}", HETRUN_RUNS=str(runs))
    st = hetrun("status", env=env)
    assert st.returncode == 0, st.stderr
    calls = (shared_tmp / "calls").read_text().split()
    assert calls.count("squeue") == 1 and calls.count("sacct") == 1, calls
    assert st.stdout.count("UNKNOWN") == 12, st.stdout


SIGNAL_RUNTIME = """#!/bin/bash
# fake runtime for tests: waits; on USR1 records it and exits 85 (checkpointed), like the runtime.
if [ "${SLURM_RESTART_COUNT:-0}" != "0" ]; then exit 0; fi
trap 'echo "usr1 rank=$SLURM_PROCID" >> "$HETRUN_RUN_DIR/fake-signals"; exit 85' USR1
touch "$HETRUN_RUN_DIR/fake-ready-$SLURM_PROCID"
for _ in $(seq 600); do sleep 0.1; done
exit 1
"""


def test_usr1_reaches_every_rank_through_the_batch_shell(slurm_cluster, shared_tmp: Path) -> None:  # type: ignore[no-untyped-def]
    """Slurm's --signal=B:USR1 goes to the batch shell only; the script must pass it on
    through srun to every rank of every component, then requeue on exit 85."""
    fake = fake_runtime(shared_tmp, "signal_runtime.sh", SIGNAL_RUNTIME)
    spec = two_component_spec(
        "sig",
        rollout_nodes=2,
        slurm={"time": "00:03:00"},
    )
    res = submit_spec(spec, backend="sbatch", runs_dir=shared_tmp / "runs", python=str(fake))
    run_dir = Path(res.run.run_dir)
    backend = SbatchBackend()
    try:
        assert wait_for(lambda: len(list(run_dir.glob("fake-ready-*"))) == 3, 90, 0.5)
        # What --signal=B:USR1@grace does at the deadline: USR1 to the batch shell alone.
        subprocess.run(["scancel", "--batch", "--signal=USR1", str(res.run.job_id)], check=True)
        assert wait_for(lambda: (run_dir / "fake-signals").exists()
                        and len((run_dir / "fake-signals").read_text().splitlines()) == 3, 30, 0.5)
        got = sorted((run_dir / "fake-signals").read_text().splitlines())
        assert got == ["usr1 rank=0", "usr1 rank=1", "usr1 rank=2"]

        def requeued() -> bool:
            comps = backend.status([res.run])[res.run.run_dir].components
            return bool(comps) and all(c.restarts >= 1 for c in comps)

        assert wait_for(requeued, 60, 1.0), backend.status([res.run])
    finally:
        subprocess.run(["scancel", str(res.run.job_id)], check=False, capture_output=True)


SLEEP_RUNTIME = """#!/bin/bash
# fake runtime for tests: sleeps on the first attempt, finishes at once after a requeue.
if [ "${SLURM_RESTART_COUNT:-0}" != "0" ]; then exit 0; fi
touch "$HETRUN_RUN_DIR/fake-ready-$SLURM_PROCID"
for _ in $(seq 900); do sleep 0.1; done
"""


def test_backend_requeue_and_accounting(slurm_cluster, shared_tmp: Path) -> None:  # type: ignore[no-untyped-def]
    fake = fake_runtime(shared_tmp, "sleep_runtime.sh", SLEEP_RUNTIME)
    spec = two_component_spec(
        "rq",
        slurm={"time": "00:03:00"},
    )
    res = submit_spec(spec, backend="sbatch", runs_dir=shared_tmp / "runs", python=str(fake))
    run_dir = Path(res.run.run_dir)
    backend = SbatchBackend()
    try:
        assert wait_for(lambda: len(list(run_dir.glob("fake-ready-*"))) == 2, 90, 0.5)
        backend.requeue(res.run)

        def restarted() -> bool:
            comps = backend.status([res.run])[res.run.run_dir].components
            return bool(comps) and all(c.restarts >= 1 for c in comps)

        assert wait_for(restarted, 60, 1.0), backend.status([res.run])
        backend.cancel(res.run)

        final = wait_for_end(res.run, backend, timeout_s=60, poll_s=1)
        assert [c.state for c in final.components] == ["CANCELLED", "CANCELLED"]
        # sacct lists every attempt of a requeued job; accounting() keeps one record per
        # component (slurmdbd may lag behind the cancel, so states are not compared here).
        assert wait_for(lambda: len(backend.accounting(res.run)) == 2, 60, 1.0), backend.accounting(res.run)
        recs = sorted(backend.accounting(res.run), key=lambda r: r["het_offset"])
        assert [r["het_offset"] for r in recs] == [0, 1]
        assert all(r["het_job_id"] == res.run.job_id for r in recs)
    finally:
        subprocess.run(["scancel", str(res.run.job_id)], check=False, capture_output=True)


TIME_LIMIT_RUNTIME = """#!/bin/bash
# fake runtime for tests: on USR1 "checkpoints" (records it) and exits 85.
trap 'echo "usr1 rank=$SLURM_PROCID" >> "$HETRUN_RUN_DIR/fake-signals"; exit 85' USR1
for _ in $(seq 1200); do sleep 0.1; done
exit 1
"""


@pytest.mark.slow
def test_time_limit_signal_requeues_the_job(slurm_cluster, shared_tmp: Path) -> None:  # type: ignore[no-untyped-def]
    """The rendered --signal=B:USR1@grace, for real: Slurm warns the batch shell before the
    time limit, the shell passes it to every rank, the ranks exit 85, the job is requeued."""
    fake = fake_runtime(shared_tmp, "time_limit_runtime.sh", TIME_LIMIT_RUNTIME)
    spec = two_component_spec(
        "timelimit",
        mem="300M",
        slurm={"time": "00:03:00"},
        # USR1 at slurmctld's first periodic check (every 30 s) from the time Slurm may send it:
        # "up to 60 seconds earlier than specified" (sbatch --signal), here 10-70 s after the start.
        # With a 1-minute limit, once in a suite run on a loaded machine no check sent it before
        # the limit; with 2 minutes (the earliest time before the start) once it came 67 ms after
        # the start, before the batch script had trapped it.
        preemption={"signal": "USR1", "grace_seconds": 110, "max_restarts": 1},
    )
    res = submit_spec(spec, backend="sbatch", runs_dir=shared_tmp / "runs", python=str(fake))
    run_dir = Path(res.run.run_dir)
    backend = SbatchBackend()
    try:
        signals = run_dir / "fake-signals"
        assert wait_for(lambda: signals.exists() and len(signals.read_text().splitlines()) == 2, 135, 1.0)
        assert sorted(signals.read_text().splitlines()) == ["usr1 rank=0", "usr1 rank=1"]

        def requeued() -> bool:
            comps = backend.status([res.run])[res.run.run_dir].components
            return bool(comps) and all(c.restarts >= 1 for c in comps)

        assert wait_for(requeued, 30, 1.0), backend.status([res.run])
        batch_log = "".join(p.read_text() for p in (run_dir / "logs").glob("batch-*.out"))
        assert "requeueing job" in batch_log and "(restart 1 of 1)" in batch_log, batch_log
    finally:
        subprocess.run(["scancel", str(res.run.job_id)], check=False, capture_output=True)
