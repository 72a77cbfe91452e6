"""`hetrun report`: reads a run directory only; counts, busy time, throughput, cost."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hetrun.reports.run_report import build_report
from runtime_toy import toy_plan, write_run_dir

from hetrun.errors import RunDirError


def _ev(path: Path, **e: object) -> None:
    with (path / "events.jsonl").open("a") as fh:
        fh.write(json.dumps(e) + "\n")


def _synthetic(run_dir: Path) -> None:
    """Two components, one learner (2 cpus, 1 GPU/node) and two rollout ranks on two nodes."""
    run_dir.mkdir()
    (run_dir / "plan.json").write_text(json.dumps({"name": "syn", "components": [
        {"name": "learner", "nodes": 1, "cpus_per_task": 2, "gpus_per_node": 1},
        {"name": "rollout", "nodes": 2, "cpus_per_task": 1, "gpus_per_node": 0}]}))
    (run_dir / "run.json").write_text(json.dumps({"name": "syn", "job_id": "42", "backend": "sbatch"}))
    t = 1000.0
    _ev(run_dir, ev="start", rank=0, component="learner", node="n1", time=t, job_id="42", restart_count=0)
    for r, node in ((1, "n2"), (2, "n3")):
        _ev(run_dir, ev="start", rank=r, component="rollout", node=node, time=t, job_id="42", restart_count=0)
    for i in range(3):
        for r, node in ((1, "n2"), (2, "n3")):
            _ev(run_dir, ev="action", type="rollout", id="rollout", iteration=i, rank=r,
                component="rollout", node=node, start=t + 10 * i, end=t + 10 * i + 6,
                bytes=1000, peak_mem=5, steps=100)
        _ev(run_dir, ev="action", type="forward", id="fwd", iteration=i, rank=0, component="learner",
            node="n1", start=t + 10 * i + 6, end=t + 10 * i + 9, bytes=0, peak_mem=7)
        _ev(run_dir, ev="action", type="sync", id="sync.grads", part_of="fwd", iteration=i, rank=0,
            component="learner", node="n1", start=t + 10 * i + 7, end=t + 10 * i + 8, bytes=64,
            peak_mem=7)
        _ev(run_dir, ev="action", type="optimize", id="opt", iteration=i, rank=0,
            component="learner", node="n1", start=t + 10 * i + 9, end=t + 10 * i + 10, bytes=0,
            peak_mem=7, metrics={"loss": 1.0 / (i + 1)})
    _ev(run_dir, ev="checkpoint", rank=0, component="learner", node="n1", iteration=3,
        time=t + 30, start=t + 30, end=t + 30)
    for r, comp, node in ((0, "learner", "n1"), (1, "rollout", "n2"), (2, "rollout", "n3")):
        _ev(run_dir, ev="exit", rank=r, component=comp, node=node, code=0, time=t + 36)
    with (run_dir / "events.jsonl").open("a") as fh:
        fh.write('{"ev":"action","rank":0,"comp')  # a kill mid-write


def test_synthetic_counts_busy_and_cost(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    _synthetic(run_dir)
    rep = build_report(run_dir)
    assert rep.skipped_lines == 1 and rep.wall_s == pytest.approx(36)
    assert rep.env_steps == 600 and rep.steps_per_s == pytest.approx(600 / 36)
    learner, rollout = rep.components
    assert (learner.name, learner.actions, learner.iterations) == ("learner", 6, 3)
    assert learner.busy_s == pytest.approx(12)  # the fused sync part is not counted twice
    assert learner.busy_fraction == pytest.approx(12 / 36)
    assert rollout.busy_s == pytest.approx(36) and rollout.nodes == ["n2", "n3"]
    assert rollout.bytes == 6000 and learner.bytes == 192
    h = 36 / 3600
    assert learner.node_hours == pytest.approx(h) and learner.core_hours == pytest.approx(2 * h)
    assert learner.gpu_hours == pytest.approx(h)
    assert rollout.node_hours == pytest.approx(2 * h) and rollout.core_hours == pytest.approx(2 * h)
    assert rep.metrics["optimize"]["loss"] == pytest.approx(1 / 3)
    assert len(rep.checkpoints) == 1 and rep.exit_codes == {0: 3}
    # timeline: rollouts run [0,6) [10,16) [20,26); the learner [6,10) [16,20) [26,30)
    assert learner.first_action == pytest.approx(6) and learner.last_action == pytest.approx(30)
    assert learner.active_s == pytest.approx(12) and rollout.active_s == pytest.approx(18)
    assert learner.s_per_iteration == pytest.approx(8)
    assert rep.overlap_s == {"learner+rollout": pytest.approx(0)}  # a synchronous loop


def test_cli_report_table_and_json(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    _synthetic(run_dir)
    out = subprocess.run([sys.executable, "-m", "hetrun.cli", "report", str(run_dir)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    for text in ("learner", "rollout", "n2,n3", "env steps 600", "checkpoints learner: 1 written", "GPU-h",
                 "skipped 1 truncated", "timeline", "running at the same time (learner+rollout)"):
        assert text in out.stdout, (text, out.stdout)
    js = subprocess.run([sys.executable, "-m", "hetrun.cli", "report", str(run_dir), "--json"],
                        capture_output=True, text=True, timeout=60)
    data = json.loads(js.stdout)
    assert data["env_steps"] == 600 and data["components"][0]["busy_fraction"] == pytest.approx(1 / 3)


def test_report_of_a_real_run_names_the_failure(tmp_path: Path) -> None:
    from hetrun.runtime.inprocess import run_inprocess

    from hetrun.errors import RuntimeFailure

    run_dir = write_run_dir(tmp_path / "run", toy_plan(
        iterations=6, workload_args={"fail_at": 4, "fail_component": "learner"}))
    with pytest.raises(RuntimeFailure):
        run_inprocess(run_dir)
    rep = build_report(run_dir)
    assert rep.errors[0]["iteration"] == 4 and rep.errors[0]["component"] == "learner"
    assert rep.env_steps == 5 * 64
    assert {c.name for c in rep.components} == {"learner", "rollout"}
    out = subprocess.run([sys.executable, "-m", "hetrun.cli", "report", str(run_dir)],
                         capture_output=True, text=True, timeout=60)
    assert "failed: rank 0 (learner) in action forward" in out.stdout, out.stdout


def test_missing_events_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(RunDirError, match="has not started"):
        build_report(tmp_path)
    out = subprocess.run([sys.executable, "-m", "hetrun.cli", "report", str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == RunDirError.exit_code and "Traceback" not in out.stderr
    assert "hetrun: error:" in out.stderr


def test_report_reader_imports_no_torch_or_mpi() -> None:
    code = ("import sys, hetrun.reports.run_report, hetrun.cli.report_cmd; "
            "bad = [m for m in ('torch', 'mpi4py', 'numpy') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_restarts_and_work_lost_come_from_resume_restore_events(tmp_path: Path) -> None:
    """One row per restart from resume.py's per-rank restore events (every rank
    writes one): restarts, the most work any rank lost, skipped checkpoints."""
    run_dir = tmp_path / "run"
    _synthetic(run_dir)
    with (run_dir / "events.jsonl").open("a") as fh:
        fh.write("\n")  # after the synthetic run's torn last line: the restarted runtime's lines
    t = 2000.0
    for restart, step, lost in ((1, 8, [0, 2, 0]), (2, 16, [1, 0, None])):
        for r, comp in ((0, "learner"), (1, "rollout"), (2, "rollout")):
            _ev(run_dir, ev="restore", rank=r, component=comp, node="n1", time=t + restart,
                step=step, iteration=step, restart_count=restart, max_restarts=3,
                work_lost=lost[r], seconds=0.1 * (r + 1), entered=t,
                skipped=[{"step": 12, "why": "chunk hash mismatch"}] if restart == 2 and r == 0 else [])
    rep = build_report(run_dir)
    assert [(r["restart"], r["step"], r["iteration"], r["ranks"], r["work_lost"]) for r in rep.resumes] \
        == [(1, 8, 8, 3, 2), (2, 16, 16, 3, 1)]
    assert rep.resumes[1]["skipped"] == [{"step": 12, "why": "chunk hash mismatch"}]
    assert rep.resumes[0]["seconds"] == pytest.approx(0.3) and rep.resumes[0]["max_restarts"] == 3
    assert rep.restarts == 2 and rep.work_lost == 3
    d = rep.to_dict()
    assert d["restarts"] == 2 and d["work_lost"] == 3 and len(d["resumes"]) == 2


def test_no_restart_means_no_work_lost(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    _synthetic(run_dir)
    rep = build_report(run_dir)
    assert rep.resumes == [] and rep.restarts == 0 and rep.work_lost == 0


def test_status_reads_restarts_and_work_lost_from_restore_lines_only(tmp_path: Path) -> None:
    """`hetrun status` shows work lost per run from the restore events alone."""
    from hetrun.reports.run_report import restart_summary
    from hetrun.runtime.events import read_events

    run_dir = tmp_path / "run"
    _synthetic(run_dir)
    assert restart_summary(run_dir) == (0, 0)
    with (run_dir / "events.jsonl").open("a") as fh:
        fh.write("\n")
    for r, lost in ((0, 2), (1, 0)):
        _ev(run_dir, ev="restore", rank=r, component="learner", node="n1", time=3000.0,
            step=8, iteration=8, restart_count=1, max_restarts=3, work_lost=lost, seconds=0.1)
    # An action whose metrics merely mention the word is not a restore.
    _ev(run_dir, ev="action", rank=0, component="learner", node="n1", time=3001.0,
        type="eval", id="eval", iteration=9, start=3000.5, end=3001.0, metrics={"note": "restore"})
    assert restart_summary(run_dir) == (1, 2)
    assert {e["ev"] for e in read_events(run_dir, only="restore")} == {"restore"}
    assert build_report(run_dir).work_lost == restart_summary(run_dir)[1]


def test_cli_report_shows_how_long_each_restart_took_from_the_job_start(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    _synthetic(run_dir)
    with (run_dir / "events.jsonl").open("a") as fh:
        fh.write("\n")
    t = 3000.0
    for r, comp in ((0, "learner"), (1, "rollout")):
        _ev(run_dir, ev="startup", rank=r, component=comp, node="n1", time=t + 2.0, restart_count=1,
            batch_start=t, proc_start=t + 0.5, executor_ready=t + 2.0 + r)
        _ev(run_dir, ev="restore", rank=r, component=comp, node="n1", time=t + 4.25, step=8,
            iteration=8, restart_count=1, max_restarts=3, work_lost=0, seconds=0.1, skipped=[])
    out = subprocess.run([sys.executable, "-m", "hetrun.cli", "report", str(run_dir), "--all"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "(4.25s after the job started, ranks up in 3.00s)" in out.stdout, out.stdout
