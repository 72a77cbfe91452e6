"""Command components without a cluster: the spec's `command:` key and its errors,
the plan, the rendered script (checked by bash -n), the per-rank torchrun variables,
script mode, and a real local-backend run of the unchanged DDP example."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hetrun.dag.overrides import Overrides
from hetrun.dag.plan import build_plan
from hetrun.dag.script_job import is_script, script_spec
from hetrun.dag.spec import load_spec, spec_from_dict
from hetrun.runtime.command_rank import command_port, component_env
from hetrun.runtime.plan_view import plan_from_dict
from hetrun.slurm_plugin.render import render_sbatch
from hetrun.slurm_plugin.submit import submit_spec

from hetrun.errors import SpecError

ROOT = Path(__file__).resolve().parents[1]
RUN_DIR = Path("/shared/runs/cmd-1")

ACTION_LEARNER = {"nodes": 1, "actions": ["forward", "backward", "sync", "optimize"]}


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return path


def _cmd_job(command: object, **extra: object) -> dict[str, object]:
    return {"name": "cmd", "components": {"trainer": {"nodes": 2, "command": command}}, **extra}


def test_string_command_is_split_like_a_shell_and_needs_no_workload() -> None:
    spec = spec_from_dict(_cmd_job("python3 train.py --tag 'a b' --lr=3e-4"))
    assert spec.components["trainer"].command == ["python3", "train.py", "--tag", "a b", "--lr=3e-4"]
    assert spec.workload is None and spec.training is None
    assert spec.command_components == ["trainer"]


@pytest.mark.parametrize(("command", "expected"), [
    ("", "the command is empty"),
    ([], "the command is empty"),
    (["python3", 3], "command word 1 is int"),
    (["python3", "a\x1bb"], "control character"),
    (["python3", "a\tb"], "control character"),
    ("python3 'unbalanced", "cannot be split into words"),
    ({"a": 1}, "expected the command as a list of strings or one string"),
])
def test_bad_commands_are_refused_with_file_line_and_key(tmp_path: Path, command: object, expected: str) -> None:
    path = _write(tmp_path, "name: cmd\ncomponents:\n  trainer:\n    nodes: 1\n    command: "
                  + json.dumps(command) + "\n")
    with pytest.raises(SpecError) as exc:
        load_spec(path)
    text = str(exc.value)
    assert expected in text, text
    assert f"{path}:5:" in text and "components.trainer.command" in text, text


def test_a_component_runs_actions_or_a_command_not_both_nor_neither() -> None:
    both = _cmd_job(["true"])
    both["components"]["trainer"]["actions"] = ["forward"]  # type: ignore[index]
    with pytest.raises(SpecError, match="gives both command and actions"):
        spec_from_dict(both)
    with pytest.raises(SpecError, match="has neither actions nor command"):
        spec_from_dict({"name": "x", "components": {"trainer": {"nodes": 1}}})
    with pytest.raises(SpecError, match="workload is set but every component runs a command"):
        spec_from_dict(_cmd_job(["true"], workload="pkg.mod:Work"))
    with pytest.raises(SpecError, match="missing required key 'workload'"):
        spec_from_dict({"name": "x", "components": {"learner": ACTION_LEARNER},
                        "training": {"kind": "supervised", "iterations": 1}})


def test_plan_of_command_components_has_no_actions_and_keeps_argv() -> None:
    plan = build_plan(spec_from_dict(_cmd_job(["python3", "t.py"])))
    assert plan.actions == [] and plan.order == [] and plan.training is None
    data = json.loads(plan.to_json())
    assert data["components"][0]["command"] == ["python3", "t.py"]
    # An action job's plan.json carries no "command" key at all (its contract is unchanged).
    mixed = spec_from_dict({"name": "m", "workload": "pkg.mod:Work",
                            "components": {"learner": ACTION_LEARNER, "evaluator": {"command": ["true"]}},
                            "training": {"kind": "supervised", "iterations": 2}})
    comps = json.loads(build_plan(mixed).to_json())["components"]
    assert "command" not in comps[0] and comps[1]["command"] == ["true"] and comps[1]["actions"] == []


def test_rendered_command_is_shell_quoted_and_the_script_parses() -> None:
    nasty = ["python3", "train.py", "--tag", "it's $HOME; rm -rf /", "--x=`id`"]
    spec = spec_from_dict(_cmd_job(nasty))
    script = render_sbatch(build_plan(spec), spec, RUN_DIR, python="/usr/bin/python3")
    line = next(ln for ln in script.splitlines() if "hetrun.runtime.command_rank" in ln)
    assert line.startswith("srun --mpi=none --kill-on-bad-exit=0 ") and "--het-group" not in line
    words = subprocess.run(["bash", "-c", f"for w in {line.split(' 2>')[0]}; do printf '%s\\0' \"$w\"; done"],
                           capture_output=True, text=True, check=True).stdout.split("\0")[:-1]
    assert words[-len(nasty):] == nasty  # bash reads back exactly the argv: nothing expanded
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)


def test_two_command_components_run_as_two_steps_in_one_het_job() -> None:
    spec = spec_from_dict({"name": "pair", "components": {
        "trainer": {"nodes": 2, "command": ["python3", "train.py"]},
        "evaluator": {"nodes": 1, "command": ["python3", "eval.py"]}}})
    script = render_sbatch(build_plan(spec), spec, RUN_DIR, python="/usr/bin/python3")
    assert script.count("#SBATCH hetjob") == 1
    steps = [ln for ln in script.splitlines() if "hetrun.runtime.command_rank" in ln]
    assert ["--het-group=0" in steps[0], "--het-group=1" in steps[1]] == [True, True]
    assert "_hetrun_steps 2>\"$_hetrun_fifo\" &" in script
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)


def test_mixed_jobs_are_accepted_at_submit(tmp_path: Path) -> None:
    # Mixed jobs run since issue 11 (tests/test_mixed_jobs.py runs them); the dry run renders them.
    mixed = spec_from_dict({"name": "m", "workload": "pkg.mod:Work",
                            "components": {"learner": ACTION_LEARNER, "evaluator": {"command": ["true"]}},
                            "training": {"kind": "supervised", "iterations": 2}})
    res = submit_spec(mixed, backend="local", runs_dir=tmp_path, dry_run=True)
    assert res.dry_run is not None and "hetrun.runtime.command_rank" in res.script


def test_a_command_job_takes_a_checkpoint_directory(tmp_path: Path) -> None:
    # The run API in a command applies the job file's checkpoint section (tests/test_command_job_file.py).
    spec = spec_from_dict({"name": "c", "components": {"main": {"command": ["true"]}},
                           "checkpoint": {"directory": "/var/tmp/elsewhere"}})
    res = submit_spec(spec, backend="local", runs_dir=tmp_path, dry_run=True)
    assert res.dry_run is not None


@pytest.mark.parametrize(("section", "value", "key"), [
    ("preemption", {"signal": "XCPU"}, "preemption.signal"),
])
def test_a_command_job_refuses_settings_its_commands_would_not_get(
        tmp_path: Path, section: str, value: dict[str, str], key: str) -> None:
    spec = spec_from_dict({"name": "c", "components": {"main": {"command": ["true"]}}, section: value})
    with pytest.raises(SpecError) as err:
        submit_spec(spec, backend="local", runs_dir=tmp_path, dry_run=True)
    assert err.value.key_path == key
    assert not any(tmp_path.iterdir()), "nothing is written for a refused job"


def _plan_dict(*sizes: tuple[str, int]) -> dict[str, object]:
    return {"components": [{"name": n, "nodes": 1, "tasks_per_node": k, "ntasks": k, "command": ["x"]}
                           for n, k in sizes]}


def test_component_env_under_a_slurm_het_step_is_scoped_to_the_component() -> None:
    # What srun --het-group=1 gave on this cluster (job 394: group 1 = n[2-3] x 2 tasks).
    env = {"SLURM_JOB_ID": "394", "SLURM_STEP_ID": "0", "SLURM_PROCID": "3", "SLURM_LOCALID": "1",
           "SLURM_NODEID": "1", "SLURM_STEP_NUM_TASKS": "4", "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
           "SLURM_STEP_NODELIST": "n[2-3]", "SLURM_JOB_NODELIST_HET_GROUP_0": "n1",
           "SLURM_JOB_NODELIST_HET_GROUP_1": "n[2-3]", "SLURM_LAUNCH_NODE_IPADDR": "10.9.8.7"}
    out = component_env(env, plan_from_dict(_plan_dict(("evaluator", 1), ("trainer", 4))), "trainer", RUN_DIR)
    assert {k: out[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")} == \
        {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1"}
    assert out["HETRUN_GLOBAL_RANK"] == "4" and out["HETRUN_COMPONENT"] == "trainer"
    assert out["MASTER_PORT"] == str(command_port("394", 1)) != str(command_port("394", 0))
    # n2 has no DNS entry (emulated nodes): the launch node's address stands in.
    assert out["MASTER_ADDR"] == "10.9.8.7" and out["HETRUN_COMPONENT_EVALUATOR_ADDR"] == "10.9.8.7"
    assert out["HETRUN_RUN_DIR"] == str(RUN_DIR)


def test_command_ports_differ_per_component_and_between_neighbouring_jobs() -> None:
    ports = {command_port(str(job), k) for job in range(1000, 1375) for k in range(32)}
    assert len(ports) == 375 * 32 and all(20000 <= p < 32000 for p in ports)  # below the ephemeral ports


def test_script_mode_makes_a_one_component_command_job(tmp_path: Path) -> None:
    script = tmp_path / "my train.py"
    script.write_text("print('hi')\n")
    assert is_script(script) and not is_script(tmp_path / "job.yaml")
    spec = script_spec(script, ["--lr", "3e-4"], python="/usr/bin/python3", tasks_per_node=2,
                       overrides=Overrides(nodes=["2"], partition="debug"))
    comp = spec.components["main"]
    assert comp.command == ["/usr/bin/python3", str(script.resolve()), "--lr", "3e-4"]
    assert (comp.nodes, comp.tasks_per_node, spec.slurm.partition, spec.name) == (2, 2, "debug", "my-train")
    text = spec.to_yaml()  # what submit writes as job.yaml: it loads back the same
    assert "workload" not in text and "    actions:" not in text
    (tmp_path / "job.yaml").write_text(text)
    assert load_spec(tmp_path / "job.yaml") == spec
    with pytest.raises(SpecError, match="neither a job YAML"):
        (tmp_path / "notes.txt").write_text("x")
        script_spec(tmp_path / "notes.txt", [], python="/usr/bin/python3")
    # --ntasks-per-node's range is the spec's own (one home): out of it, the error names the flag.
    for bad in (0, 1025):
        with pytest.raises(SpecError, match=f"--ntasks-per-node {bad}") as info:
            script_spec(script, [], python="/usr/bin/python3", tasks_per_node=bad)
        assert info.value.key_path == "components.main.tasks_per_node", info.value.key_path


@pytest.mark.slow
def test_local_backend_runs_the_unchanged_ddp_script_and_names_a_failing_rank(tmp_path: Path) -> None:
    from hetrun.slurm_plugin.backends.local import LocalBackend
    from hetrun.slurm_plugin.submit import wait_for_end

    out = tmp_path / "out"
    spec = spec_from_dict({"name": "ddp-local", "components": {"trainer": {"nodes": 1, "tasks_per_node": 2,
        "command": [sys.executable, str(ROOT / "examples" / "ddp_train.py"), "--steps", "12", "--out", str(out)]}},
        "env": {"OMP_NUM_THREADS": "1"}})
    res = submit_spec(spec, backend="local", runs_dir=tmp_path / "runs")
    final = wait_for_end(res.run, LocalBackend(), timeout_s=240, poll_s=0.5)
    run_dir = Path(res.run.run_dir)
    assert [c.state for c in final.components] == ["COMPLETED"], (run_dir / "logs" / "mpirun-0.err").read_text()
    assert (out / "final.pt").is_file()
    assert "step 10 loss" in (run_dir / "logs" / "trainer-local-0.out").read_text()

    bad = spec_from_dict({"name": "ddp-bad", "components": {"trainer": {"nodes": 1, "tasks_per_node": 2,
        "command": ["no-such-program-h4", "--x"]}}})
    with pytest.raises(SpecError, match="program 'no-such-program-h4' is not on PATH"):  # refused before the queue
        submit_spec(bad, backend="local", runs_dir=tmp_path / "runs")
    # One the submit cannot check (relative, no job directory: resolved in the run directory) is
    # still found missing on the rank, named with its rank.
    bad = spec_from_dict({"name": "ddp-bad", "components": {"trainer": {"nodes": 1, "tasks_per_node": 2,
        "command": ["./no-such-program-h4", "--x"]}}})
    res = submit_spec(bad, backend="local", runs_dir=tmp_path / "runs")
    final = wait_for_end(res.run, LocalBackend(), timeout_s=120, poll_s=0.5)
    assert [c.state for c in final.components] == ["FAILED"]
    evs = [json.loads(ln) for ln in (Path(res.run.run_dir) / "events.jsonl").read_text().splitlines()]
    end = next(e for e in evs if e["ev"] == "attempt_end")
    assert end["outcome"] == "failed" and "trainer" in end["reason"] and "command not found" in end["reason"]
    assert "rank 0" in end["reason"] or "rank 1" in end["reason"], end
