"""Run directories: naming, atomic records, finding runs by path, name prefix or job id."""

from __future__ import annotations

import json
import os
import re
from datetime import datetime, timezone
from pathlib import Path

import pytest
from hetrun.dag.spec import load_spec
from hetrun.slurm_plugin.rundir import (
    RunInfo,
    create_run_dir,
    find_run,
    list_runs,
    new_run_name,
    read_run,
    runs_root,
    write_atomic,
    write_run,
)

from hetrun.errors import RunDirError, SpecError

REPO = Path(__file__).resolve().parent.parent


def test_run_name_shape() -> None:
    name = new_run_name("ppo", datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc), "0abc")
    assert name == "ppo-20260102-030405-0abc"
    assert re.fullmatch(r"ppo-\d{8}-\d{6}-[0-9a-f]{4}", new_run_name("ppo"))


def test_runs_root_precedence(tmp_path: Path) -> None:
    assert runs_root(tmp_path / "a", env={"HETRUN_RUNS": str(tmp_path / "b")}) == tmp_path / "a"
    assert runs_root(None, env={"HETRUN_RUNS": str(tmp_path / "b")}) == tmp_path / "b"
    assert runs_root(None, env={}) == Path(os.getcwd()) / "runs"
    with pytest.raises(RunDirError):
        runs_root("a\nb", env={})


def test_create_run_dir_is_fresh_and_inside(tmp_path: Path) -> None:
    a = create_run_dir(tmp_path, "job")
    b = create_run_dir(tmp_path, "job")
    assert a != b and a.parent == tmp_path and (a / "logs").is_dir()
    for bad in ("../x", "/abs", ".hidden", "-opt", "a/b", "a\x00b"):
        with pytest.raises(Exception) as err:
            create_run_dir(tmp_path, bad)
        assert isinstance(err.value, (RunDirError, SpecError))


def test_write_atomic_leaves_no_temp_files(tmp_path: Path) -> None:
    target = tmp_path / "run.json"
    for i in range(5):
        write_atomic(target, json.dumps({"i": i}))
    assert json.loads(target.read_text()) == {"i": 4}
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]


def _mk(root: Path, name: str, job_id: str | None, when: str) -> RunInfo:
    d = create_run_dir(root, name)
    info = RunInfo(name=name, run_dir=str(d), backend="sbatch", job_id=job_id, submitted_at=when,
                   components=["learner", "rollout"])
    write_run(info)
    return info


def test_find_and_list_runs(tmp_path: Path) -> None:
    a = _mk(tmp_path, "ppo", "101", "2026-01-01T00:00:00Z")
    b = _mk(tmp_path, "ppo", "102", "2026-01-02T00:00:00Z")
    c = _mk(tmp_path, "moe", "103;clusterx", "2026-01-03T00:00:00Z")
    (tmp_path / "not-a-run").mkdir()
    assert [r.job_id for r in list_runs(tmp_path)] == ["101", "102", "103;clusterx"]
    assert find_run("102", tmp_path).run_dir == b.run_dir
    assert find_run("103", tmp_path).run_dir == c.run_dir
    assert find_run("101+1", tmp_path).run_dir == a.run_dir  # a het component's id
    assert find_run(a.run_dir, tmp_path).job_id == "101"
    assert find_run(Path(c.run_dir).name, tmp_path).job_id == "103;clusterx"
    assert find_run("moe", tmp_path).job_id == "103;clusterx"
    with pytest.raises(RunDirError, match="matches 2 runs"):
        find_run("ppo", tmp_path)
    with pytest.raises(RunDirError, match="no run matches"):
        find_run("zzz", tmp_path)


def test_read_run_rejects_damaged_records(tmp_path: Path) -> None:
    d = tmp_path / "r"
    d.mkdir()
    with pytest.raises(RunDirError, match="not a hetrun run directory"):
        read_run(d)
    (d / "run.json").write_text("{half")
    with pytest.raises(RunDirError, match="cannot read"):
        read_run(d)
    (d / "run.json").write_text(json.dumps({"name": "x"}))
    with pytest.raises(RunDirError, match="not a valid run record"):
        read_run(d)


def test_submit_writes_the_contract_files(tmp_path: Path) -> None:
    """A real local submission writes job.yaml, plan.json, hetjob.sbatch and run.json."""
    from hetrun.slurm_plugin.backends.local import LocalBackend
    from hetrun.slurm_plugin.submit import submit_spec

    spec = load_spec(REPO / "examples" / "ppo_cartpole.yaml")

    class NoStart(LocalBackend):
        """Local backend that records the submission without starting processes."""

        def submit(self, run: RunInfo) -> str:
            return "local-test"

    res = submit_spec(spec, backend=NoStart(), runs_dir=tmp_path)
    run_dir = Path(res.run.run_dir)
    assert run_dir.parent == tmp_path
    assert {p.name for p in run_dir.iterdir()} == {"job.yaml", "plan.json", "hetjob.sbatch", "run.json", "logs"}
    rec = json.loads((run_dir / "run.json").read_text())
    assert rec["job_id"] == "local-test" and rec["components"] == ["learner", "rollout"]
    assert rec["run_dir"] == str(run_dir) and rec["submitted_at"]
    assert json.loads((run_dir / "plan.json").read_text())["name"] == "ppo-cartpole"
    assert load_spec(run_dir / "job.yaml") == spec
    assert (run_dir / "hetjob.sbatch").read_text() == res.script
    assert find_run("local-test", tmp_path).run_dir == str(run_dir)
