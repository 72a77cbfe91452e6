"""A command component that ignores Slurm's stop, on the real local Slurm cluster.

The script uses the run API for steps and checkpoints, never asks
``should_stop``, and takes the signals it gets itself (blocked, polled with
``sigtimedwait``, so it learns who sent each). Preempted through ``high``
(SIGTERM, KillWait 30 s): the rank's wrapper ends it at the hard deadline,
writes ``stop_ignored``; the attempt's end names component, rank and reason,
Slurm requeues the job, the next attempt restores the newest checkpoint, and
``hetrun report`` counts the same steps lost as the wrapper did. The wrapper
forwards none of Slurm's signals (slurmstepd signals the program itself)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hetrun.slurm_plugin.backends.sbatch import SbatchBackend
from hetrun.slurm_plugin.rundir import wait_for
from hetrun.slurm_plugin.submit import submit_spec, wait_for_end

from tests.preempt_helpers import preempt_at_and_wait
from tests.test_command_slurm import _events, _job

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

IGNORES_AND_COUNTS = """
import json, os, signal, sys, time
import torch
import hetrun

steps, every, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
run = hetrun.attach(checkpoint_every=every)
sigs = {signal.SIGUSR1, signal.SIGTERM}
signal.pthread_sigmask(signal.SIG_BLOCK, sigs)  # never handled: the stop is ignored
w = torch.zeros(4)
start = run.restore({"w": w})
for step in range(start, steps):
    time.sleep(0.05)
    w += 1
    run.log(step, w=float(w[0]))
    if run.checkpoint_due(step):
        run.save(step, {"w": w}, wait=True)
    while (info := signal.sigtimedwait(sigs, 0)) is not None:
        with open(out, "a") as f:
            f.write(json.dumps({"sig": signal.Signals(info.si_signo).name, "from": info.si_pid,
                                "wrapper": os.getppid(), "restart": os.environ.get("SLURM_RESTART_COUNT", "0")}) + "\\n")
run.close()
"""


def test_script_ignoring_slurm_preemption_is_ended_at_the_deadline_named_and_resumed(  # type: ignore[no-untyped-def]
        slurm_cluster, shared_tmp: Path) -> None:
    script, signals = shared_tmp / "ignore.py", shared_tmp / "signals.jsonl"
    script.write_text(IGNORES_AND_COUNTS)
    # The API's SIGTERM budget 5 s (not 20): the wrapper ends the program 5 + 3 s after SIGTERM.
    spec = _job("ignores-term", [sys.executable, str(script), "400", "50", str(signals)], nodes=1,
                env={"OMP_NUM_THREADS": "1", "HETRUN_PREEMPT_DEADLINE_S": "5"})
    res = submit_spec(spec, backend="sbatch", runs_dir=shared_tmp / "runs")
    run_dir = Path(res.run.run_dir)

    def past_a_checkpoint() -> bool:
        return any(e["ev"] == "checkpoint" for e in _events(run_dir))

    final = preempt_at_and_wait(res.run, shared_tmp, past_a_checkpoint, context=lambda: _events(run_dir)[-6:],
                                poll_s=0.3)
    evs = _events(run_dir)
    assert [c.state for c in final.components] == ["COMPLETED"], evs[-8:]
    [ignored] = [e for e in evs if e["ev"] == "stop_ignored"]
    assert ignored["signal"] == "TERM" and ignored["killed_with"] == "SIGKILL", ignored
    assert ignored["ignored_s"] >= ignored["deadline_s"] == 8.0 and ignored["restart_count"] == 0, ignored
    ends = [e for e in evs if e["ev"] == "attempt_end"]
    assert [e["outcome"] for e in ends] == ["preempted", "done"], ends
    reason = ends[0]["reason"]
    assert f"rank 0 (trainer) on {ignored['node']} ignored the stop signal (SIGTERM)" in reason, reason
    assert "killed at the hard deadline" in reason and ignored["work_lost"] in reason, reason
    # Resumed from the newest checkpoint; the report's work lost is the wrapper's figure.
    [restore] = [e for e in evs if e["ev"] == "restore" and e.get("restart_count") == 1]
    assert restore["iteration"] == ignored["last_checkpoint_step"] + 1, (restore, ignored)
    report = subprocess.run(["hetrun", "report", str(run_dir), "--json"], capture_output=True, text=True)
    [row] = json.loads(report.stdout)["restart_history"]
    assert row["work_lost_iterations"] == ignored["work_lost_steps"], (row, ignored)
    assert any("ignored the stop signal (SIGTERM)" in line for line in row["detail"]), row
    # Slurm's SIGTERM reached the program from slurmstepd; the wrapper added none.
    got = [json.loads(line) for line in signals.read_text().splitlines()]
    terms = [g for g in got if g["sig"] == "SIGTERM" and g["restart"] == "0"]
    assert terms and not [g for g in got if g["from"] == g["wrapper"]], got
    # While blocked, a repeat of the same signal before the next step merges into one: a count, not a proof.
    print("SIGTERMs the program took from slurmstepd on preemption:", len(terms))


def test_script_ignoring_the_warning_before_the_time_limit_ends_named_in_status(  # type: ignore[no-untyped-def]
        slurm_cluster, shared_tmp: Path) -> None:
    from tests.cli_helpers import hetrun_cli

    script, signals = shared_tmp / "ignore.py", shared_tmp / "signals.jsonl"
    script.write_text(IGNORES_AND_COUNTS)
    # USR1 as --signal=B:USR1@G delivers it (hetrun preempt: to the batch shell, which forwards it to srun);
    # grace 8 s: the API's budget 3 s, the wrapper's 6 s; no requeue, so the run ends here.
    spec = _job("ignores-usr1", [sys.executable, str(script), "100000", "0", str(signals)], nodes=1,
                preemption={"grace_seconds": 8, "max_preemptions": 0})
    res = submit_spec(spec, backend="sbatch", runs_dir=shared_tmp / "runs")
    run_dir, job = Path(res.run.run_dir), str(res.run.job_id)
    try:
        assert wait_for(lambda: sum(e["ev"] == "action" for e in _events(run_dir)) >= 10, 240, 0.3)
        sent = hetrun_cli("preempt", str(run_dir))
        assert sent.returncode == 0, sent.stdout + sent.stderr
        final = wait_for_end(res.run, SbatchBackend(), timeout_s=180, poll_s=1)
    finally:
        subprocess.run(["scancel", job], check=False, capture_output=True)
    evs = _events(run_dir)
    [ignored] = [e for e in evs if e["ev"] == "stop_ignored"]
    assert ignored["signal"] == "USR1" and ignored["killed_with"] == "SIGKILL", ignored  # the script blocks TERM too
    assert ignored["work_lost"] == f"all {ignored['last_step'] + 1} steps: no checkpoint", ignored
    [end] = [e for e in evs if e["ev"] == "attempt_end"]
    assert end["outcome"] == "time_limit" and not end["requeued"] and end["stop_ignored"] == [0], end
    assert [c.state for c in final.components] != ["COMPLETED"], final
    status = hetrun_cli("status", str(run_dir))
    assert "rank 0 (trainer)" in status.stdout and "ignored the stop signal (SIGUSR1)" in status.stdout, status.stdout
    assert "no checkpoint" in status.stdout, status.stdout
    got = [json.loads(line) for line in signals.read_text().splitlines()]
    # USR1 from slurmstepd only (the wrapper forwarded none), then the wrapper's own SIGTERM at the deadline.
    assert [(g["sig"], g["from"] == g["wrapper"]) for g in got] == [("SIGUSR1", False), ("SIGTERM", True)], got
