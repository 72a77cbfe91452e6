"""hetrun.rundir and hetrun.planfile: the run directory's one owner (issue 23).

One time key on every events line (old runs' ``t`` still read), the "every N" rule, the
runs-directory variable, the node-local roots, and the job file's defaults shared by the
spec (pydantic) and the typed plan view (standard library)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hetrun.dag.spec import CheckpointSpec, PreemptionSpec

from hetrun import planfile, rundir
from hetrun.errors import RunDirError


def test_every_writer_dates_its_line_with_time_and_old_t_lines_still_read(tmp_path: Path) -> None:
    with rundir.EventLog(tmp_path, rank=0) as log:
        log.emit("start")
    rundir.append_event(tmp_path, "attempt_end", restart_count=0, outcome="done")
    with (tmp_path / rundir.EVENTS).open("a") as fh:  # a line an older post-mortem wrote, then a torn one
        fh.write(json.dumps({"ev": "rank_failure", "rank": 1, "t": 12.5}) + "\n" + '{"ev": "exit", "ti')
    lines = [json.loads(x) for x in (tmp_path / rundir.EVENTS).read_text().splitlines()[:2]]
    assert all("time" in x and "t" not in x for x in lines), lines
    read = list(rundir.read_events(tmp_path))
    assert [e["ev"] for e in read] == ["start", "attempt_end", "rank_failure"]
    assert read[2]["time"] == 12.5 and rundir.event_time(read[2]) == 12.5
    assert [e["ev"] for e in rundir.events_of(tmp_path, ("rank_failure", "start"))] == ["start", "rank_failure"]
    assert list(rundir.read_events(tmp_path / "none")) == []


def test_one_reader_counts_what_it_skips_and_follows_a_growing_file(tmp_path: Path) -> None:
    with rundir.EventLog(tmp_path, rank=0) as log:
        log.emit("start")
        log.emit("action", id="a")
    with (tmp_path / rundir.EVENTS).open("a") as fh:  # a corrupt line, an old `t` line, a torn one
        fh.write("not json\n" + json.dumps({"ev": "restore", "t": 3.0}) + "\n" + '{"ev": "exit", "ti')
    for kinds in (None, ("restore", "start")):
        stream = rundir.EventStream(tmp_path, kinds)
        got = list(stream)
        assert [e["ev"] for e in got] == (["start", "action", "restore"] if kinds is None else ["start", "restore"])
        assert got[-1]["time"] == 3.0 and stream.lines == 5
        assert stream.skipped == (2 if kinds is None else 1)  # a kinds scan never parses the corrupt line

    records, offset = rundir.events_after(tmp_path, 0)
    assert [e["ev"] for e in records] == ["start", "action", "restore"] and records[-1]["time"] == 3.0
    with (tmp_path / rundir.EVENTS).open("a") as fh:  # the torn line completes, one more begins
        fh.write('me": 4.0}\n{"ev": "sam')
    records, offset = rundir.events_after(tmp_path, offset)
    assert [e["ev"] for e in records] == ["exit"]
    assert rundir.events_after(tmp_path, offset) == ([], offset)
    assert rundir.events_after(tmp_path / "none", 0) == ([], 0)


@pytest.mark.parametrize("every", [1, 2, 3, 7])
def test_the_every_n_rule(every: int) -> None:
    runs = [i for i in range(30) if rundir.runs_at(every, i)]
    assert runs == [i for i in range(30) if (i + 1) % every == 0]
    for i in range(-1, 30):
        assert rundir.last_run_at_or_before(every, i) == max((r for r in runs if r <= i), default=-1)
    assert not any(rundir.runs_at(0, i) for i in range(30))  # checkpoint.interval 0: never


def test_one_runs_directory_variable(tmp_path: Path) -> None:
    assert rundir.runs_root(None, {"HETRUN_RUNS": str(tmp_path)}) == tmp_path
    assert rundir.runs_root(str(tmp_path / "cli"), {"HETRUN_RUNS": str(tmp_path)}) == tmp_path / "cli"
    with pytest.warns(FutureWarning, match="HETRUN_RUNS_DIR is the old name"):
        assert rundir.runs_root(None, {"HETRUN_RUNS_DIR": str(tmp_path)}) == tmp_path
    with pytest.raises(RunDirError, match="disagree"):
        rundir.runs_root(None, {"HETRUN_RUNS": str(tmp_path), "HETRUN_RUNS_DIR": str(tmp_path / "x")})


def test_paths_of_a_run_directory(tmp_path: Path) -> None:
    paths = rundir.RunPaths(tmp_path / "r")
    assert paths.store("learner") == tmp_path / "r" / "ckpt" / "learner"
    assert paths.store("learner", "mystore") == tmp_path / "r" / "mystore" / "learner"
    assert paths.store("learner", "/abs/place") == Path("/abs/place/learner")
    assert paths.local_store("/tmp/fast", "learner") == Path("/tmp/fast/r/learner")
    paths.logs.mkdir(parents=True)
    for n in (3, 1):
        paths.plan_before_attempt(n).write_text("{}")
    (paths.logs / "plan-before-attempt-x.json").write_text("{}")
    assert [n for n, _ in paths.archived_plans()] == [1, 3]
    assert rundir.node_local_root("/tmp/x") == "/tmp" and rundir.node_local_root("/dev/shm") == "/dev/shm"
    assert rundir.node_local_root("/var/tmp/hetrun-tests") is None


def test_the_plan_view_carries_the_spec_defaults() -> None:
    view = planfile.plan_from_dict({"components": [{"name": "main", "command": ["true"]}]})
    spec_ckpt, spec_pre = CheckpointSpec.model_validate({}), PreemptionSpec.model_validate({})
    for key in ("interval", "directory", "keep", "max_delta_chain", "optimizer_encoding"):
        assert getattr(view.checkpoint, key) == getattr(spec_ckpt, key), key
    for key in ("signal", "grace_seconds", "max_preemptions", "max_failures", "max_restarts"):
        assert getattr(view.preemption, key) == getattr(spec_pre, key), key


def test_plan_sections_are_typed_and_still_read_as_the_json_object() -> None:
    view = planfile.plan_from_dict({"components": [{"name": "main", "command": ["true"]}],
                                    "checkpoint": {"keep": 5, "object_store": {"url": "s3://b/p"}},
                                    "preemption": {"grace_seconds": 90, "max_preemptions": 2}})
    assert view.checkpoint.keep == 5 and view.checkpoint.interval == rundir.DEFAULTS.checkpoint_interval
    assert view.checkpoint.get("keep") == 5 and view.checkpoint["object_store"] == {"url": "s3://b/p"}
    assert view.preemption.grace_seconds == 90 and view.preemption.get("max_preemptions") == 2
    with pytest.raises(RunDirError, match=r"checkpoint\.keep: 'three' is not an integer"):
        planfile.plan_from_dict({"components": [{"name": "main"}], "checkpoint": {"keep": "three"}})
    with pytest.raises(RunDirError, match="preemption: expected an object"):
        planfile.plan_from_dict({"components": [{"name": "main"}], "preemption": [1]})
