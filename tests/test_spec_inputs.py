"""Inputs a new user writes (issue 12): standard YAML merge keys, overrides blamed on
the flag and typed like YAML, graph errors with file/line/key, special files that
must never hang a command."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hetrun.dag.overrides import Overrides
from hetrun.dag.plan import build_plan
from hetrun.dag.spec import load_spec

from hetrun.errors import GraphError, SpecError

MERGE = """\
name: merge
workload: pkg.mod:Work
components:
  learner: &base {nodes: 1, mem: 1G, actions: [forward, backward, optimize]}
  rollout:
    <<: *base
    nodes: 2
    actions: [rollout]
training: {kind: rl, iterations: 2}
"""

SUPERVISED = """\
name: sup
workload: pkg.mod:Work
components:
  learner: {actions: [forward, backward, optimize, eval]}
training: {kind: supervised, iterations: 2, eval_interval: 1}
actions:
  optimize: {qos: high}
  forward: {after: [eval]}
"""


def _write(tmp_path: Path, text: str) -> Path:
    job = tmp_path / "job.yaml"
    job.write_text(textwrap.dedent(text))
    return job


def test_merge_key_then_overriding_key(tmp_path: Path) -> None:
    spec = load_spec(_write(tmp_path, MERGE))
    assert spec.components["rollout"].nodes == 2 and spec.components["rollout"].mem == "1G"
    assert spec.components["rollout"].actions == ["rollout"]
    assert spec.components["learner"].nodes == 1


def test_own_key_twice_is_still_a_duplicate(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="duplicate key 'nodes'") as info:
        load_spec(_write(tmp_path, MERGE.replace("    actions: [rollout]\n",
                                                 "    actions: [rollout]\n    nodes: 3\n")))
    assert info.value.line == 9


def test_merged_value_error_points_at_the_override_not_the_anchor(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as info:
        load_spec(_write(tmp_path, MERGE.replace("    nodes: 2\n", "    nodes: two\n")))
    assert info.value.key_path == "components.rollout.nodes" and info.value.line == 7


def test_set_on_a_missing_component_is_blamed_on_the_flag(tmp_path: Path) -> None:
    job = _write(tmp_path, MERGE)
    with pytest.raises(SpecError, match="no component named 'nope'") as info:
        load_spec(job, Overrides(sets=["components.nope.nodes=2"]))
    assert info.value.file == "override --set components.nope.nodes=2" and info.value.line is None
    with pytest.raises(SpecError) as info:
        load_spec(job, Overrides(sets=["components.extra={nodes: 1}"]))
    assert info.value.file.startswith("override --set components.extra") and "actions" in str(info.value)


def test_set_values_are_typed_like_the_yaml_file(tmp_path: Path) -> None:
    job = _write(tmp_path, MERGE.replace("name: merge\n", "name: merge\nworkload_args: {lr: 1e-3}\n"))
    assert load_spec(job).workload_args["lr"] == 1e-3
    spec = load_spec(job, Overrides(sets=["workload_args.lr=2e-4", "workload_args.tag=v1"]))
    assert spec.workload_args == {"lr": 2e-4, "tag": "v1"}


def test_cycle_names_file_line_and_key(tmp_path: Path) -> None:
    job = _write(tmp_path, SUPERVISED)
    with pytest.raises(GraphError, match="dependency cycle") as info:
        build_plan(load_spec(job))
    err = info.value
    assert (err.file, err.key_path, err.line) == (str(job), "actions.forward.after", 8)
    assert str(err).startswith(f"{job}:8:")


def test_gpu_action_on_cpu_component_names_the_key(tmp_path: Path) -> None:
    job = _write(tmp_path, SUPERVISED.replace("forward: {after: [eval]}", "forward: {gpu: 1}"))
    with pytest.raises(GraphError, match="1 GPUs but a rank has 0") as info:
        build_plan(load_spec(job))
    assert (info.value.key_path, info.value.line) == ("actions.forward.gpu", 8)
    with pytest.raises(GraphError) as info:
        build_plan(load_spec(job, Overrides(sets=["actions.forward.gpu=2"])))
    assert info.value.file == "override --set actions.forward.gpu=2"


def test_a_fifo_never_hangs_plan(tmp_path: Path) -> None:
    fifo = tmp_path / "job.yaml"
    os.mkfifo(fifo)
    with pytest.raises(SpecError, match="FIFO"):
        load_spec(fifo)
    proc = subprocess.run([sys.executable, "-m", "hetrun.cli", "plan", str(fifo)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 2 and "is a FIFO" in proc.stderr and "Traceback" not in proc.stderr


def test_special_and_unreadable_files_get_hetruns_format(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="character device"):
        load_spec("/dev/null")
    (tmp_path / "f").write_text("x")
    proc = subprocess.run([sys.executable, "-m", "hetrun.cli", "plan", str(tmp_path / "f" / "job.yaml")],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2 and proc.stderr.startswith("hetrun: error: ") and "cannot read" in proc.stderr


def test_permission_denied_is_a_spec_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Root reads every file here, so the refusal of a non-root user is simulated at os.open.
    job = _write(tmp_path, MERGE)

    def denied(*_: object, **__: object) -> int:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "open", denied)
    with pytest.raises(SpecError, match="cannot read: Permission denied") as info:
        load_spec(job)
    assert info.value.file == str(job) and info.value.exit_code == 2
