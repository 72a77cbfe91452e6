"""`hetrun report` and `hetrun status` show where each component was placed, why, what lost,
and where a resume re-placed it (reports/placement.py).

The run directories hold a real plan.json (the planner's) with real placement records
(placement.score over a pool snapshot from Slurm's own sinfo sample, recorded by
placement_fit.record as `hetrun submit` does); a resume's replaced plan is kept by
resume_run.keep_replaced_plan, the function `hetrun resume` calls.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
from hetrun.dag.needs import component_needs
from hetrun.dag.plan import build_plan
from hetrun.dag.spec import load_spec
from hetrun.reports.html import render_html
from hetrun.reports.placement import newest_by_component, placement_lines
from hetrun.reports.run_report import build_report
from hetrun.reports.schema import REPORT_SCHEMA
from hetrun.slurm_plugin import placement
from hetrun.slurm_plugin.placement_fit import ComponentFit, FitReport, record
from hetrun.slurm_plugin.resume_run import keep_replaced_plan
from test_placement import TYPES, snapshot

from tests.cli_helpers import run_dir_of

JOB = """\
name: placed
components:
  trainer:
    nodes: 1
    gpus_per_node: 2
    mem: 200M
    placement: auto
    command: [sleep, "30"]
  evaluator:
    nodes: 1
    command: [sleep, "30"]
slurm: {partition: debug, time: "00:05:00"}
"""


def _plan(job_yaml: Path, busy: set[str]) -> dict:
    """plan.json as `hetrun submit` writes it, the trainer placed against a pool with ``busy`` nodes."""
    spec = load_spec(job_yaml)
    need = component_needs(spec)["trainer"]
    cands = placement.score(placement.Need.from_needs(need), snapshot(TYPES, busy=busy))
    plan = record(build_plan(spec), FitReport({"trainer": ComponentFit(need, cands)}, pool_taken_at=1_700_000_000.0))
    return json.loads(plan.to_json())


def _run_dir(root: Path, busy: set[str]) -> Path:
    run_dir = root / "runs" / "placed-20260101-000000-abcd"
    (run_dir / "logs").mkdir(parents=True)
    (root / "job.yaml").write_text(JOB)
    (run_dir / "job.yaml").write_text(load_spec(root / "job.yaml").to_yaml())
    (run_dir / "plan.json").write_text(json.dumps(_plan(root / "job.yaml", busy), indent=2))
    (run_dir / "run.json").write_text(json.dumps({"name": "placed", "job_id": None, "backend": "sbatch",
                                                   "run_dir": str(run_dir), "components": ["trainer", "evaluator"]}))
    (run_dir / "events.jsonl").write_text(json.dumps({"ev": "start", "rank": 0, "component": "trainer",
                                                      "node": "n3", "time": 1000.0, "restart_count": 0}) + "\n")
    return run_dir


def _resume(run_dir: Path, root: Path, restart: int, busy: set[str]) -> None:
    """What `hetrun resume` does to plan.json: keep the old one, write the re-placed one."""
    keep_replaced_plan(run_dir, restart)
    (run_dir / "plan.json").write_text(json.dumps(_plan(root / "job.yaml", busy), indent=2))
    with (run_dir / "events.jsonl").open("a") as fh:
        fh.write(json.dumps({"ev": "resume", "restart_count": restart, "t": 2000.0}) + "\n")


def _cli(*args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "hetrun.cli", *args], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "COLUMNS": "240"})
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    return out.stdout


def test_report_shows_the_choice_why_the_losers_and_the_fixed_component(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path, busy={"n1", "n2"})  # the a100 nodes are busy: v100 wins
    sec = build_report(run_dir, accounting=False).placement
    (only,) = sec["attempts"]
    trainer, evaluator = only["components"]
    assert (trainer["mode"], trainer["gres"], trainer["node_count"], trainer["partition"]) == (
        "auto", "gpu:v100", 1, "debug")
    assert trainer["score"] is not None and trainer["reasons"]
    assert any("gpu:a100" in lost and "would wait" in lost for lost in trainer["lost"]), trainer["lost"]
    assert all("; lost because it cannot start now" in lost for lost in trainer["lost"]), trainer["lost"]
    assert (evaluator["mode"], evaluator["partition"], evaluator["score"]) == ("fixed", "debug", None)
    text = _cli("report", str(run_dir))
    assert "placed trainer on debug gpu:v100 1 node (score " in text
    assert "evaluator: fixed (from the YAML): debug 1 node" in text
    assert "  lost: debug gpu:a100: score" in text or "  lost: high gpu:a100: score" in text
    doc = json.loads(_cli("report", str(run_dir), "--json"))
    jsonschema.validate(doc, REPORT_SCHEMA)
    assert doc["placement"]["attempts"][0]["components"][0]["gres"] == "gpu:v100"


def test_a_resume_that_re_placed_shows_each_range_of_attempts(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path, busy={"n1", "n2"})
    _resume(run_dir, tmp_path, 2, busy={"n3", "n4"})  # now v100 is busy: a100 wins
    sec = build_report(run_dir, accounting=False).placement
    first, newest = sec["attempts"]
    assert (first["first_restart"], first["last_restart"], first["source"]) == (
        0, 1, "logs/plan-before-attempt-2.json")
    assert (newest["first_restart"], newest["last_restart"], newest["source"]) == (2, None, "plan.json")
    assert first["components"][0]["gres"] == "gpu:v100" and newest["components"][0]["gres"] == "gpu:a100"
    assert sec["note"] is None
    lines = placement_lines(sec)
    assert "placement (attempts 1-2, from logs/plan-before-attempt-2.json):" in lines
    assert "placement (attempt 3 on, from plan.json):" in lines
    assert newest_by_component(sec)["trainer"] == "auto: debug gpu:a100 1 node (before attempt 3: debug gpu:v100 1 node)"
    assert newest_by_component(sec)["evaluator"] == "fixed (from the YAML)"
    status = _cli("status", "--runs-dir", str(run_dir.parent))
    head = [c.strip() for c in next(ln for ln in status.splitlines() if "PLACEMENT" in ln).split("┃")]
    row = dict(zip(head, (c.strip() for c in next(ln for ln in status.splitlines() if "trainer" in ln).split("│")),
                   strict=False))
    assert row["PLACEMENT"].startswith("auto: debug gpu:a100"), status
    (doc,) = json.loads(_cli("status", "--runs-dir", str(run_dir.parent), "--json"))
    trainer, evaluator = doc["components"]
    assert (trainer["name"], trainer["placement"]["gres"], trainer["placement"]["mode"]) == ("trainer", "gpu:a100", "auto")
    assert trainer["placement_text"].endswith("(before attempt 3: debug gpu:v100 1 node)")
    assert evaluator["placement"]["mode"] == "fixed" and doc["counts"]["restarts"] == 0


def test_a_resume_whose_replaced_plan_was_not_kept_says_so(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path, busy=set())
    with (run_dir / "events.jsonl").open("a") as fh:  # resumed by a hetrun that kept no copy
        fh.write(json.dumps({"ev": "resume", "restart_count": 1, "t": 2000.0}) + "\n")
    sec = build_report(run_dir, accounting=False).placement
    (only,) = sec["attempts"]
    assert only["first_restart"] == 1 and "only the newest placement is known" in sec["note"]


def test_fixed_only_runs_get_one_line_and_unplaced_auto_is_named(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path, busy=set())
    plan = json.loads((run_dir / "plan.json").read_text())
    del plan["components"][0]["placement"]  # auto on the local backend: nothing chosen
    (run_dir / "plan.json").write_text(json.dumps(plan))
    sec = build_report(run_dir, accounting=False).placement
    assert sec["attempts"][0]["components"][0]["mode"] == "unplaced"
    assert "not placed" in "\n".join(placement_lines(sec))
    (run_dir / "job.yaml").write_text((run_dir / "job.yaml").read_text().replace("placement: auto", ""))
    assert placement_lines(build_report(run_dir, accounting=False).placement) == [
        "placement: fixed (from the YAML) for every component (partition debug)"]


def test_html_report_has_the_placement_table_escaped(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path, busy={"n1", "n2"})
    plan = json.loads((run_dir / "plan.json").read_text())
    plan["components"][0]["placement"]["reasons"].append("<b>not markup</b>")
    (run_dir / "plan.json").write_text(json.dumps(plan))
    page = render_html(build_report(run_dir, accounting=False))
    assert "<h2>Placement</h2>" in page and "auto: debug gpu:v100 1 node" in page
    assert "&lt;b&gt;not markup&lt;/b&gt;" in page and "<b>not markup</b>" not in page


def test_where_slurm_ran_each_attempt_comes_from_sacct(tmp_path: Path) -> None:
    """Slurm's own record (a real `sacct --json -D` of a het job) beside the placement."""
    from hetrun.reports.placement import placement_section
    from hetrun.reports.sacct import accounting_rows

    run_dir = _run_dir(tmp_path, busy={"n1", "n2"})
    doc = json.loads((Path(__file__).parent / "data" / "report" / "sacct_het_5.json").read_text())
    rows = accounting_rows(doc, "5", ["trainer", "evaluator"])
    sec = placement_section(run_dir, json.loads((run_dir / "plan.json").read_text()), [], rows)
    assert [(r["component"], r["attempt"], r["partition"], r["nodes"]) for r in sec["ran_on"]] == [
        ("trainer", 0, "debug", "n1"), ("evaluator", 0, "debug", "n[2-3]")]
    lines = placement_lines(sec)
    assert "  Slurm ran trainer (sacct, job 5): attempt 1 on debug (n1)" in lines
    jsonschema.validate({**json.loads(_cli("report", str(run_dir), "--json")), "placement": sec}, REPORT_SCHEMA)


def test_a_chosen_node_count_reads_as_chosen(tmp_path: Path) -> None:
    """H3's node_counts: placement rewrites the component's shape and records node_count."""
    run_dir = _run_dir(tmp_path, busy=set())
    plan = json.loads((run_dir / "plan.json").read_text())
    plan["components"][0].update(nodes=2, tasks_per_node=1)
    plan["components"][0]["placement"]["node_count"] = 2
    (run_dir / "plan.json").write_text(json.dumps(plan))
    sec = build_report(run_dir, accounting=False).placement
    assert newest_by_component(sec)["trainer"].endswith("2 nodes (chosen)")
    assert newest_by_component(sec)["evaluator"] == "fixed (from the YAML)"


def test_a_real_resume_keeps_the_replaced_plan_and_every_component_name(tmp_path: Path) -> None:
    """`hetrun submit --wait` then `hetrun resume --wait` of a command job on the local backend: the
    first attempt's plan is kept in logs/, the report shows both ranges, and run.json still names
    both components (resume used to keep only action components' names: status showed group0)."""
    (tmp_path / "job.yaml").write_text(JOB.replace('"30"', '"0"').replace("    gpus_per_node: 2\n", ""))
    sub = subprocess.run([sys.executable, "-m", "hetrun.cli", "submit", str(tmp_path / "job.yaml"), "--backend",
                          "local", "--runs-dir", str(tmp_path / "runs"), "--wait"], capture_output=True, text=True,
                         timeout=120)
    assert sub.returncode == 0, sub.stdout + sub.stderr
    run_dir = run_dir_of(sub)
    res = subprocess.run([sys.executable, "-m", "hetrun.cli", "resume", str(run_dir), "--wait"], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert (run_dir / "logs" / "plan-before-attempt-1.json").is_file()
    assert json.loads((run_dir / "run.json").read_text())["components"] == ["trainer", "evaluator"]
    sec = build_report(run_dir, accounting=False).placement
    assert [(a["first_restart"], a["last_restart"]) for a in sec["attempts"]] == [(0, 0), (1, None)]
    assert [r["mode"] for r in sec["attempts"][-1]["components"]] == ["unplaced", "fixed"]  # local: one place
