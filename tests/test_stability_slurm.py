"""Stability of the real-Slurm path (Slurm 22.05, Open MPI 4.1 over PMIx, het steps).

Two failures seen in CI, each guarded here on the real local cluster:

* A rank segfaulted inside MPI_Init: with Slurm's default 'mixed' PMIx fences
  a peer could leave MPI_Init (the tree-collective barrier) while this rank
  was still in its modex fence, and the peer's first message hit a PML whose
  receive callbacks were not registered yet (a call through NULL). The
  rendered script exports ``SLURM_PMIX_FENCE=ring``; the stress test below
  starts many het MPI steps the way the script does.
* srun sometimes outlived its finished het step (about 1 step in 100 here;
  srun stuck in mpi/pmix's pmixp_abort_agent_stop, ignoring SIGTERM). The
  script's watchdog ends it and takes the tasks' exit code from accounting,
  so exit 85 still requeues: shown with an srun that never exits after its
  step.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fake_runtime_jobs import fake_runtime, two_component_spec
from hetrun.slurm_plugin.backends.sbatch import SbatchBackend
from hetrun.slurm_plugin.backends.slurm_cli import RetryPolicy
from hetrun.slurm_plugin.rundir import wait_for
from hetrun.slurm_plugin.submit import submit_spec

REQUEUE_RUNTIME = """#!/bin/bash
# Runs {seconds} s (6: the watchdog sees the step in squeue; 0: the step ends before its
# first poll, as when every rank is signalled right after the start), then asks for a requeue.
sleep {seconds}
echo "attempt restart=${SLURM_RESTART_COUNT:-0} rank=$SLURM_PROCID" >> "$HETRUN_RUN_DIR/fake-attempts"
if [ "${SLURM_RESTART_COUNT:-0}" = "0" ]; then exit 85; fi
exit 0
"""

# Stands in for Slurm 22.05's srun that does not exit after its het step ended.
HANGING_SRUN = """#!/bin/bash
{srun} "$@"
echo "test srun: real srun exited $?; now hanging like the stuck srun" >&2
exec sleep 600
"""


def _requeue_spec(name: str) -> object:
    return two_component_spec(name, slurm={"time": "00:04:00"}, preemption={"max_restarts": 2})


@pytest.mark.parametrize("seconds", [6, 0], ids=["step-seen", "step-ended-before-the-first-poll"])
def test_srun_outliving_its_step_is_ended_and_85_still_requeues(
        slurm_cluster, shared_tmp: Path, monkeypatch: pytest.MonkeyPatch, seconds: int) -> None:  # type: ignore[no-untyped-def]
    real_srun = subprocess.run(["which", "srun"], capture_output=True, text=True, check=True).stdout.strip()
    bin_dir = shared_tmp / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(HANGING_SRUN.format(srun=real_srun))
    (bin_dir / "srun").chmod(0o755)
    fake = fake_runtime(shared_tmp, "requeue_runtime.sh", REQUEUE_RUNTIME.replace("{seconds}", str(seconds)))
    # sbatch exports the submitting environment: the batch script finds the hanging srun first.
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    res = submit_spec(_requeue_spec("stuck-srun"), backend="sbatch", runs_dir=shared_tmp / "runs",
                      python=str(fake))
    run_dir = Path(res.run.run_dir)
    backend = SbatchBackend(RetryPolicy(attempts=3, first_delay_s=0.5))
    try:
        def requeued() -> bool:
            comps = backend.status([res.run])[res.run.run_dir].components
            return bool(comps) and all(c.restarts >= 1 for c in comps)

        # The watchdog ends srun 15 s after its first look at accounting. It used to ignore
        # accounting for 60 s when it had never seen the step in squeue (the CI failure this
        # guards: 75 s at the least), so under 60 s tells the two apart with a wide margin.
        started = time.monotonic()
        ok = wait_for(requeued, 150, 1.0)
        batch_log = "".join(p.read_text() for p in (run_dir / "logs").glob("batch-*.out"))
        assert ok, f"not requeued; batch log:\n{batch_log}\nstatus: {backend.status([res.run])}"
        # Usually the wrapper's own hang is what the watchdog ends. Under load the real
        # srun can itself outlive its step by more than the grace period (the 22.05 bug
        # this guards; seen in CI), and the watchdog then ends the wrapper before it
        # prints: either way the watchdog must have acted and 85 must still requeue.
        assert "after its job step ended (exit 85); ending it" in batch_log, batch_log
        assert "requeueing job" in batch_log, batch_log
        assert "restart=0" in (run_dir / "fake-attempts").read_text()
        assert time.monotonic() - started < 60, batch_log
    finally:
        subprocess.run(["scancel", str(res.run.job_id)], check=False, capture_output=True)
        # The watchdog SIGKILLs the stand-in, not the real srun it started: a real srun hung
        # itself (the 22.05 bug) would outlive the job and the test (seen once: still there 1.5 h later).
        subprocess.run(["pkill", "-KILL", "-f", f"srun .*{run_dir}"], check=False, capture_output=True)


MPI_PROBE = """
import faulthandler
faulthandler.enable()
from mpi4py import MPI
comm = MPI.COMM_WORLD
assert comm.allgather(comm.Get_rank()) == list(range(comm.Get_size()))
comm.Barrier()
print(f"probe ok rank {comm.Get_rank()}", flush=True)
"""

STRESS = """#!/bin/bash
# {n} het MPI steps, launched the way hetjob.sbatch launches the runtime.
export SLURM_PMIX_FENCE=ring
for i in $(seq 1 {n}); do
    srun --mpi=pmix --kill-on-bad-exit=0 --het-group=0 {py} {probe} : --het-group=1 {py} {probe} \\
        > {out}/step-$i.out 2>&1 &
    pid=$!
    # An srun can stay after its tasks ended (the other 22.05 bug; under the suite's load about
    # one step in ten waited out a 45 s timeout here): once every rank has said ok it gets 5 s,
    # as the rendered script's watchdog gives it; 45 s in all. KILL: a stuck srun ignores TERM.
    start=$SECONDS ok=
    while kill -0 $pid 2>/dev/null; do
        if [ -z "$ok" ] && [ "$(grep -c 'probe ok rank' {out}/step-$i.out)" -ge 3 ]; then ok=$SECONDS; fi
        if [ $((SECONDS - start)) -ge 45 ] || {{ [ -n "$ok" ] && [ $((SECONDS - ok)) -ge 5 ]; }}; then
            kill -KILL $pid
        fi
        sleep 0.2
    done
    wait $pid
    echo "step $i rc $?"
done
"""


def _job_end(job_id: str, timeout: float) -> list[tuple[str, str]]:
    """(State, ExitCode) of each het component of a batch job once accounting says it ended."""
    ended: list[tuple[str, str]] = []

    def done() -> bool:
        text = subprocess.run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State,ExitCode"],
                              capture_output=True, text=True, timeout=30, check=False).stdout
        rows = [tuple(line.split("|")[:2]) for line in text.splitlines() if line.strip()]
        busy = ("PENDING", "RUNNING", "REQUEUED", "COMPLETING", "CONFIGURING", "SUSPENDED", "RESIZING")
        ended[:] = [(r[0].split()[0], r[1]) for r in rows if len(r) == 2]
        return bool(ended) and not any(state in busy for state, _ in ended)

    assert wait_for(done, timeout, 0.5), f"job {job_id} still running after {timeout} s: {ended}"
    return ended


@pytest.mark.slow
def test_het_mpi_init_survives_many_starts(slurm_cluster, shared_tmp: Path) -> None:  # type: ignore[no-untyped-def]
    """Without ring fences about 1 start in 12 segfaulted here under load; 10 in a row must pass.

    10 starts, not 20 (issue 23): the fix is configuration (the rendered script's and the
    cluster's mpi.conf ring fence, both also checked as text), and this stress test, which sets
    ring itself, is not recorded failing in any commit since (git log). Against the old 1-in-12 rate, 10 starts
    still catch it in 58% of runs (20: 82%) at half the test's time."""
    n = 10
    probe = shared_tmp / "probe.py"
    probe.write_text(MPI_PROBE)
    script = shared_tmp / "stress.sbatch"
    script.write_text(STRESS.format(n=n, py=sys.executable, probe=probe, out=shared_tmp))
    # Not `sbatch --wait`: it polls after 2, 8 and 32 s more (Slurm 22.05), so it saw a
    # 26 s job end at 42 s. The job's end is read from accounting every 0.5 s instead.
    proc = subprocess.run(
        ["sbatch", "--parsable", "-t", "10", f"--output={shared_tmp}/stress.out",
         "-N1", "-n1", "--mem=500M", ":", "-N2", "-n2", "--ntasks-per-node=1", "--mem=500M", str(script)],
        capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip().split(";")[0]
    try:
        ends = _job_end(job_id, timeout=600)
    finally:
        subprocess.run(["scancel", job_id], capture_output=True, check=False)
    out = (shared_tmp / "stress.out").read_text() if (shared_tmp / "stress.out").exists() else ""
    # Every het component ended COMPLETED with exit 0 (what `sbatch --wait`'s status said).
    assert ends and all(e == ("COMPLETED", "0:0") for e in ends), (ends, out)
    assert sum(line.startswith("step ") for line in out.splitlines()) == n, out  # (the shell also says "Killed")
    # Every rank of every step got through MPI_Init and a collective. The step's rc is not
    # checked: an srun that hangs after its tasks ended (killed by timeout) is the other bug.
    bad = {}
    for i in range(1, n + 1):
        text = (shared_tmp / f"step-{i}.out").read_text()
        if text.count("probe ok rank") != 3 or "Segmentation fault" in text:
            bad[i] = text[-1500:]
    assert not bad, bad
