"""Slurm's hold on a requeued job (slurm_plugin/requeue_hold.py), on the real local cluster.

The one test that keeps the hold: a plain ``sbatch --requeue`` job is requeued
(``scontrol requeue``: the same requeue Slurm runs on a PreemptMode=REQUEUE
preemption, without preempting other tests' jobs on a node) and Slurm holds it
``AuthInfo cred_expire + 1`` s after it ended; then its owner releases it
(``scontrol update StartTime=now``, what tests/preempt_helpers.py does for every
other requeue test) and it runs again. A hetrun job requeued the same way
shortens the hold itself from its post-mortem, says so in events.jsonl and the
batch log, and Slurm keeps the begin time hetrun set. A requeued het job left
held starts when its begin time passes: the cluster's EpilogSlurmctld
(slurm_plugin/templates/requeue_nudge.sh) touches it then, since Slurm's backfill
scheduler, the only one that starts het jobs, waits for a change.
"""

from __future__ import annotations

import json
import subprocess
from datetime import datetime
from pathlib import Path
from typing import Any

from hetrun.dag.spec import spec_from_dict
from hetrun.slurm_plugin.requeue_hold import (
    SHORTEN_TO_S,
    begin_delay_s,
    cred_expire_s,
    parse_show_job,
    shorten_own_hold,
)
from hetrun.slurm_plugin.rundir import wait_for
from hetrun.slurm_plugin.submit import submit_spec

from tests.preempt_helpers import release_if_held, show_job, wait_for_end_releasing


def test_show_job_and_cred_expire_are_read_from_scontrol_text() -> None:
    text = ("JobId=7 JobName=x UserId=root(0) JobState=PENDING Reason=BeginTime Requeue=1 Restarts=1 "
            "SubmitTime=2026-12-03T11:51:40 EligibleTime=2026-12-03T11:51:56\nJobId=8 JobState=RUNNING\n")
    info = parse_show_job(text)
    assert (info["JobId"], info["Reason"], info["Restarts"]) == ("7", "BeginTime", "1")
    assert parse_show_job("") == {}
    assert cred_expire_s("AuthAltTypes = (null)\nAuthInfo                = cred_expire=15\n") == 15
    assert cred_expire_s("AuthInfo = socket=/run/munge.sock,cred_expire=300\n") == 300
    assert cred_expire_s("AuthInfo = (null)\n") == 120  # Slurm's default


def test_the_begin_time_waits_for_slurmds_next_completion_check() -> None:
    now = 1_000_000.0
    assert begin_delay_s(now, None) == SHORTEN_TO_S  # accounting did not say when: the least
    assert begin_delay_s(now, now - 2) == SHORTEN_TO_S  # ranks out in 2 s: slurmd sees it within a second
    # Ranks out 13 s after the kill: slurmd checks again only ~21 s after it (then every 10 s).
    assert begin_delay_s(now, now - 13) == 21 + 2 - 13
    assert begin_delay_s(now, now - 25) == 30 + 2 - 25


def _sacct_attempts(job: str) -> list[dict[str, str]]:
    """The job's first two attempts in accounting (slurmdbd is written asynchronously: waits for them)."""
    keys = ("JobID", "State", "Submit", "Eligible", "Start")
    got: list[dict[str, str]] = []

    def two_known() -> bool:
        out = subprocess.run(["sacct", "-j", job, "-D", "-X", "-n", "-P", "-o", ",".join(keys)],
                             capture_output=True, text=True).stdout
        got[:] = [dict(zip(keys, line.split("|"), strict=True)) for line in out.splitlines() if line.count("|") == 4]
        return len(got) >= 2 and all(a[k][:1].isdigit() for a in got[:2] for k in ("Submit", "Eligible"))

    assert wait_for(two_known, 60, 1), got
    return got


def _seconds(a: str, b: str) -> float:
    return datetime.fromisoformat(b).timestamp() - datetime.fromisoformat(a).timestamp()


def test_slurm_holds_a_requeued_job_for_cred_expire_and_its_owner_may_release_it(  # type: ignore[no-untyped-def]
        slurm_cluster, shared_tmp: Path) -> None:
    config = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, check=True).stdout
    hold = cred_expire_s(config) + 1
    out = shared_tmp / "starts.txt"
    job = subprocess.run(["sbatch", "--parsable", "--requeue", "-p", "debug", "-n", "1", "--mem=50M", "-t", "5",
                          "-J", "hold-probe", "-o", str(shared_tmp / "probe-%j.out"), "--open-mode=append", "--wrap",
                          f'echo "restart=${{SLURM_RESTART_COUNT:-0}}" >> {out}; sleep 300'],
                         capture_output=True, text=True, check=True).stdout.strip().split(";")[0]
    try:
        assert wait_for(lambda: out.is_file() and "restart=0" in out.read_text(), 120, 0.3), show_job(job)
        subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, check=True)
        # Once the old attempt has ended Slurm holds the job: eligible cred_expire + 1 s after the requeue.
        assert wait_for(lambda: show_job(job).get("Reason") == "BeginTime", 120, 0.3), show_job(job)
        info = show_job(job)
        assert info["JobState"] == "PENDING" and info["Restarts"] == "1", info
        # (Slurm moves SubmitTime 1 s on when the requeue falls in the submission's own second.)
        assert _seconds(info["SubmitTime"], info["EligibleTime"]) in (hold, hold - 1), (info, hold)
        # The owner may make it eligible at once (a second after the requeue, for the credential).
        assert wait_for(lambda: release_if_held(job), 10, 0.3), show_job(job)
        assert wait_for(lambda: "restart=1" in out.read_text(), 60, 0.3), (show_job(job), out.read_text())
    finally:
        subprocess.run(["scancel", job], capture_output=True)
    first, second = _sacct_attempts(job)[:2]
    assert first["State"] == "REQUEUED" and _seconds(second["Submit"], second["Eligible"]) < hold, (first, second)


def test_shorten_own_hold_does_nothing_for_a_job_slurm_did_not_requeue(slurm_cluster) -> None:  # type: ignore[no-untyped-def]
    # No such job: Slurm refuses the update, nothing is written or claimed.
    assert shorten_own_hold("999999999", None, restart=0) is None
    assert shorten_own_hold("12; rm -rf /", None, restart=0) is None


def _events(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def test_a_requeued_hetrun_job_shortens_its_own_hold_and_says_so(slurm_cluster, shared_tmp: Path) -> None:  # type: ignore[no-untyped-def]
    hold = cred_expire_s(subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True).stdout) + 1
    # Attempt 0 runs until Slurm requeues it (SIGTERM, as on a preemption); attempt 1 ends at once.
    program = 'if [ "${SLURM_RESTART_COUNT:-0}" = 0 ]; then exec sleep 300; fi; echo resumed'
    spec = spec_from_dict({
        "name": "hold-short", "components": {"trainer": {"nodes": 1, "tasks_per_node": 1, "mem": "200M",
                                                        "command": ["bash", "-c", program]}},
        "slurm": {"partition": "debug", "time": "00:05:00"}})
    res = submit_spec(spec, backend="sbatch", runs_dir=shared_tmp / "runs")
    run_dir, job = Path(res.run.run_dir), str(res.run.job_id)
    try:
        assert wait_for(lambda: any(e["ev"] == "start" for e in _events(run_dir)), 180, 0.3), show_job(job)
        subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, check=True)
        final = wait_for_end_releasing(res.run, timeout_s=180)
    finally:
        subprocess.run(["scancel", job], capture_output=True)
    evs = _events(run_dir)
    assert [c.state for c in final.components] == ["COMPLETED"], evs[-6:]
    assert [e["outcome"] for e in evs if e["ev"] == "attempt_end"] == ["preempted", "done"], evs[-6:]
    [short] = [e for e in evs if e["ev"] == "requeue_hold_shortened"]
    assert short["job_id"] == job and short["restart_count"] == 0 and short["delay_s"] >= SHORTEN_TO_S, short
    batch_log = "".join(p.read_text() for p in (run_dir / "logs").glob("batch-*.out"))
    assert f"as its owner hetrun set its begin time to {short['delay_s']} s from now" in batch_log, batch_log[-2000:]
    # Slurm kept hetrun's begin time instead of adding its hold (accounting: the requeued attempt's Eligible).
    attempts = _sacct_attempts(job)
    assert _seconds(attempts[1]["Submit"], attempts[1]["Eligible"]) < hold, attempts


def _nudges(st, job: str) -> list[str]:  # type: ignore[no-untyped-def]
    log = st.config.directory / "log" / "requeue_nudge.log"
    return [line for line in log.read_text().splitlines() if f" JobId={job} " in line] if log.exists() else []


def test_a_requeued_het_job_held_by_slurm_is_nudged_when_its_begin_time_passes(  # type: ignore[no-untyped-def]
        slurm_cluster, shared_tmp: Path) -> None:
    out = shared_tmp / "het-starts.txt"
    script = shared_tmp / "het.sh"
    script.write_text("#!/bin/bash\n"
                      f"#SBATCH -p debug -n 1 --mem=50M -t 5 --requeue -J nudge-probe -o {shared_tmp}/het-%j.out\n"
                      "#SBATCH --open-mode=append\n#SBATCH hetjob\n#SBATCH -p debug -n 1 --mem=50M\n"
                      f'echo "restart=${{SLURM_RESTART_COUNT:-0}}" >> {out}\nsleep 300\n')
    job = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True,
                         check=True).stdout.strip().split(";")[0]
    nudged: list[str] = []
    try:
        assert wait_for(lambda: out.is_file() and "restart=0" in out.read_text(), 120, 0.3), show_job(job)
        # Any other change on the shared cluster after the begin time (a node or job of the test
        # before) also wakes the backfill scheduler, and then the job starts before the watcher
        # nudges it (it sees RUNNING and leaves, logging nothing). Requeue again until one round
        # is the nudge's: a nudge that never works fails every round.
        for restart in range(1, 4):
            subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, check=True)
            assert wait_for(lambda: show_job(job).get("Reason") == "BeginTime", 120, 0.3), show_job(job)
            eligible = show_job(job)["EligibleTime"]
            # Nobody releases it: Slurm's hold runs out, and the nudge makes the backfill scheduler look.
            assert wait_for(lambda restart=restart: f"restart={restart}" in out.read_text(), 120, 0.5), (
                show_job(job), _nudges(slurm_cluster, job))
            assert wait_for(lambda: show_job(job).get("JobState") == "RUNNING", 30, 0.3), show_job(job)
            # The watcher logs right after its update returns; the job may start meanwhile.
            before = len(nudged)
            wait_for(lambda before=before: len(_nudges(slurm_cluster, job)) > before, 3, 0.2)
            lines = _nudges(slurm_cluster, job)
            if len(lines) > before:
                [line] = lines[before:]
                nudged = lines
                assert f"eligible {eligible}, still pending: nudged the backfill scheduler" in line, line
                assert line.endswith("(scontrol update Requeue=1: done)"), line
                started = show_job(job)
                assert started["JobState"] == "RUNNING" and started["Requeue"] == "1", started  # the update changed nothing
                break
        assert nudged, f"started {restart} times after a requeue, never by the nudge: {_nudges(slurm_cluster, job)}"
    finally:
        subprocess.run(["scancel", job], capture_output=True)
    # Ended (cancelled), not requeued: its watcher says nothing more.
    assert wait_for(lambda: show_job(job).get("JobState") in (None, "CANCELLED"), 60, 0.5), show_job(job)
    assert _nudges(slurm_cluster, job) == nudged


def test_a_requeued_job_no_longer_asks_for_the_nodes_its_placement_named(slurm_cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A start by preemption names its victims' nodes (plan.json ``placement.nodelist``,
    ``#SBATCH --nodelist``); Slurm keeps that request across a requeue, so the post-mortem of a
    requeued job clears it (``release_named_nodes``): here on a pending job naming n1, as a
    requeued one is, and its plan saying the placement named n1."""
    from hetrun.dag.plan import PlacementChoice, build_plan
    from hetrun.slurm_plugin.requeue_hold import release_named_nodes

    spec = spec_from_dict({"name": "named", "components": {"trainer": {"nodes": 1, "command": ["true"]}}})
    plan = build_plan(spec)
    choice = PlacementChoice(partition="debug", gres="-", score=1.0, nodelist=["n1"])
    plan = plan.model_copy(update={"components": [plan.components[0].model_copy(update={"placement": choice})]})
    (tmp_path / "plan.json").write_text(plan.to_json())
    job = subprocess.run(["sbatch", "--parsable", "-H", "-N1", "-w", "n1", "-o", "/dev/null", "--wrap", "true"],
                         capture_output=True, text=True, check=True).stdout.strip()
    try:
        assert "ReqNodeList=n1" in subprocess.run(["scontrol", "show", "job", job], capture_output=True,
                                                  text=True, check=True).stdout
        assert release_named_nodes(job, tmp_path) == [job]
        shown = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True, check=True).stdout
        assert "ReqNodeList=(null)" in shown, shown
        # a plan that named nothing, or no plan: nothing to clear, nothing run
        (tmp_path / "plan.json").write_text(build_plan(spec).to_json())
        assert release_named_nodes(job, tmp_path) == []
        assert release_named_nodes(job, tmp_path / "missing") == []
        assert release_named_nodes("12; rm -rf /", tmp_path) == []
    finally:
        subprocess.run(["scancel", job], check=False)
