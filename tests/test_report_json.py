"""`hetrun report --json` validates against its documented schema (`hetrun report --schema`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from test_report_restarts import RunWriter, _resumed


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hetrun.cli", "report", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "COLUMNS": "160"})


@pytest.fixture(scope="module")
def schema() -> dict:
    out = _cli("--schema")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    jsonschema.Draft202012Validator.check_schema(doc)
    return doc


def _restarted_run(root: Path) -> Path:
    w = RunWriter(root / "run")
    t = w.attempt(0, 1000, range(0, 4))
    w.batch_line(ev="rank_failure", rank=2, component="rollout", node="n3", signal="SIGKILL", exit_code=None,
                 detected_by="srun", restart_count=0, message="killed", t=t + 1)
    w.end(0, t + 2, "failed", requeued=True, code=9)
    t = w.attempt(1, t + 10, range(2, 5), restore=_resumed(2), work_lost=2)
    w.ev(ev="checkpoint", rank=0, component="learner", node="n1", iteration=4, time=t, start=t, end=t,
         info={"step": 4, "stall_s": 0.01})
    w.exits(t)
    w.end(1, t + 1, "done", requeued=False)
    with (w.dir / "events.jsonl").open("a") as fh:
        fh.write('{"ev":"action","rank":0')  # torn last line
    return w.dir


def test_json_of_a_restarted_run_validates(tmp_path: Path, schema: dict) -> None:
    out = _cli(str(_restarted_run(tmp_path)), "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    jsonschema.validate(doc, schema)
    assert doc["counts"]["failures"] == 1 and doc["restart_history"][0]["cause"] == "failed"
    assert doc["outcome"]["outcome"] == "done" and doc["skipped_lines"] == 1
    assert doc["checkpoint_history"]["rows"][0]["in_store"] is False


def test_json_of_a_run_with_no_actions_validates(tmp_path: Path, schema: dict) -> None:
    (tmp_path / "events.jsonl").write_text("")
    out = _cli(str(tmp_path), "--json")
    assert out.returncode == 0, out.stderr
    jsonschema.validate(json.loads(out.stdout), schema)


def test_schema_rejects_a_renamed_field(tmp_path: Path, schema: dict) -> None:
    doc = json.loads(_cli(str(_restarted_run(tmp_path)), "--json").stdout)
    doc["restart_history"][0]["why"] = doc["restart_history"][0].pop("cause")
    with pytest.raises(jsonschema.ValidationError, match="'cause' is a required property"):
        jsonschema.validate(doc, schema)
