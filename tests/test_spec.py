"""Job spec loading: valid examples, overrides, and one test per kind of mistake.

Every error must be a SpecError (exit code 2) naming file:line:column, the key
path, the bad value and the fix.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml
from hetrun.dag.overrides import Overrides
from hetrun.dag.spec import JobSpec, job_json_schema, load_spec

from hetrun.errors import SpecError

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

BASE = """\
name: toy
workload: pkg.mod:Work
components:
  learner:
    nodes: 1
    tasks_per_node: 2
    cpus_per_task: 1
    gpus_per_node: 0
    mem: 2G
    actions: [forward, backward, sync, optimize, checkpoint, eval]
  rollout:
    nodes: 2
    mem: 1G
    actions: [rollout]
training:
  kind: rl
  iterations: 10
  micro_batches: 2
  pipeline_window: 2
slurm:
  partition: debug
  time: "00:30:00"
env:
  OMP_NUM_THREADS: "1"
"""


def write(tmp_path: Path, text: str, name: str = "job.yaml") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def spec_error(tmp_path: Path, text: str, overrides: Overrides | None = None) -> SpecError:
    path = write(tmp_path, text)
    with pytest.raises(SpecError) as info:
        load_spec(path, overrides)
    err = info.value
    assert err.exit_code == 2
    return err


def replace(old: str, new: str, text: str = BASE) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


# -- valid specs ------------------------------------------------------------------------------

@pytest.mark.parametrize("example", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_examples_load_and_round_trip(example: Path, tmp_path: Path) -> None:
    spec = load_spec(example)
    again = write(tmp_path, spec.to_yaml(), "resolved.yaml")
    assert load_spec(again) == spec


def test_defaults_and_derived_values(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, BASE))
    learner = spec.components["learner"]
    assert learner.mem_mb == 2048 and learner.mem_per_task_mb == 1024 and learner.ntasks == 2
    assert spec.components["rollout"].tasks_per_node == 1
    assert spec.preemption.signal == "USR1" and spec.checkpoint.keep == 3
    assert spec.schedule.qos_weight == 0.7 and spec.schedule.util_weight == 0.3
    assert spec.slurm.time_seconds == 1800
    assert list(spec.components) == ["learner", "rollout"]  # order = het group index


def test_unquoted_slurm_time_is_not_read_as_base60_number(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, replace('time: "00:30:00"', "time: 00:30:00")))
    assert spec.slurm.time == "00:30:00"


def test_integer_env_value_becomes_string(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, replace('OMP_NUM_THREADS: "1"', "OMP_NUM_THREADS: 1")))
    assert spec.env == {"OMP_NUM_THREADS": "1"}


def test_to_yaml_is_plain_yaml(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, BASE))
    data = yaml.safe_load(spec.to_yaml())
    assert data["components"]["learner"]["mem"] == "2G"
    assert JobSpec.model_validate(data) == spec


def test_json_schema_describes_every_section() -> None:
    schema = job_json_schema()
    assert schema["type"] == "object"
    # workload and training are needed only by components that run actions (command: components don't).
    assert set(schema["required"]) == {"name", "components"}
    props = schema["properties"]
    for key in ("slurm", "checkpoint", "preemption", "env", "comms", "actions", "schedule"):
        assert key in props
    comp = schema["$defs"]["ComponentSpec"]
    assert comp["additionalProperties"] is False
    assert "gpus_per_node" in comp["properties"]


# -- overrides --------------------------------------------------------------------------------

def test_sbatch_style_overrides(tmp_path: Path) -> None:
    ov = Overrides(partition="high", time="1-00:00", account="proj1", qos="normal", constraint="a100&ib",
                   nodes=["3", "rollout=4"], gres=["learner=gpu:2"],
                   sets=["training.iterations=99", "env.FOO=bar", "slurm.extra=[--exclusive]"])
    spec = load_spec(write(tmp_path, BASE), ov)
    assert spec.slurm.partition == "high" and spec.slurm.time == "1-00:00"
    assert spec.slurm.account == "proj1" and spec.slurm.qos == "normal"
    assert spec.slurm.constraint == "a100&ib" and spec.slurm.extra == ["--exclusive"]
    assert spec.components["learner"].nodes == 3  # -N 3 = first component
    assert spec.components["rollout"].nodes == 4
    assert spec.components["learner"].gpus_per_node == 2
    assert spec.training.iterations == 99 and spec.env["FOO"] == "bar"


def test_gres_without_component_targets_first_gpu_component(tmp_path: Path) -> None:
    text = replace("  rollout:\n    nodes: 2\n", "  rollout:\n    nodes: 2\n    gpus_per_node: 1\n")
    spec = load_spec(write(tmp_path, text), Overrides(gres=["gpu:4"]))
    assert spec.components["rollout"].gpus_per_node == 4
    assert spec.components["learner"].gpus_per_node == 0
    # With no GPU component, the one running forward (the learner) gets them.
    spec = load_spec(write(tmp_path, BASE), Overrides(gres=["gpu:1"]))
    assert spec.components["learner"].gpus_per_node == 1


def test_override_errors_name_the_override(tmp_path: Path) -> None:
    err = spec_error(tmp_path, BASE, Overrides(sets=["training.iterations=abc"]))
    assert "override --set training.iterations=abc" in str(err)
    assert "expected an integer" in str(err) and "'abc'" in str(err)

    err = spec_error(tmp_path, BASE, Overrides(sets=["training.iteratons=5"]))
    assert "override --set training.iteratons=5" in str(err) and "did you mean 'iterations'" in str(err)

    err = spec_error(tmp_path, BASE, Overrides(nodes=["rollot=2"]))
    assert "-N rollot=2" in str(err) and "did you mean 'rollout'" in str(err)

    err = spec_error(tmp_path, BASE, Overrides(nodes=["two"]))
    assert "-N two" in str(err) and "not a whole number" in str(err)

    err = spec_error(tmp_path, BASE, Overrides(gres=["gpu:x"]))
    assert "--gres gpu:x" in str(err) and "gpu:N" in str(err)

    err = spec_error(tmp_path, BASE, Overrides(time="90 minutes"))
    assert "--time 90 minutes" in str(err) and "Slurm time" in str(err)

    err = spec_error(tmp_path, BASE, Overrides(sets=["noequals"]))
    assert "expected key.path=value" in str(err)

    err = spec_error(tmp_path, BASE, Overrides(sets=["name.x=1"]))
    assert "not a mapping" in str(err)


# -- one test per kind of mistake -------------------------------------------------------------

def test_misspelt_key_names_line_column_and_closest(tmp_path: Path) -> None:
    err = spec_error(tmp_path, replace("    gpus_per_node: 0", "    gpu_per_node: 0"))
    assert err.line == 8 and err.column == 19 and err.key_path == "components.learner.gpu_per_node"
    assert "unknown key 'gpu_per_node'" in str(err) and "did you mean 'gpus_per_node'" in str(err)
    assert str(err).startswith(f"{err.file}:8:19: components.learner.gpu_per_node:")


def test_misspelt_top_level_section(tmp_path: Path) -> None:
    err = spec_error(tmp_path, replace("training:", "trainng:"))
    assert "did you mean 'training'" in str(err)


def test_wrong_type_names_value_and_expectation(tmp_path: Path) -> None:
    err = spec_error(tmp_path, replace("  iterations: 10", '  iterations: "10"'))
    assert err.key_path == "training.iterations" and err.line == 17
    assert "expected an integer, got str '10'" in str(err) and "without quotes" in str(err)


def test_negative_and_huge_numbers(tmp_path: Path) -> None:
    err = spec_error(tmp_path, replace("    nodes: 1\n", "    nodes: -1\n"))
    assert err.key_path == "components.learner.nodes" and "greater than or equal to 1" in str(err)
    err = spec_error(tmp_path, replace("    nodes: 1\n", "    nodes: " + "9" * 40 + "\n"))
    assert err.key_path == "components.learner.nodes"


def test_missing_required_key(tmp_path: Path) -> None:
    err = spec_error(tmp_path, replace("workload: pkg.mod:Work\n", ""))
    assert "missing required key 'workload'" in str(err)


def test_bad_literal_suggests_closest(tmp_path: Path) -> None:
    err = spec_error(tmp_path, replace("kind: rl", "kind: supervisd"))
    assert "did you mean 'supervised'" in str(err) and err.key_path == "training.kind"


def test_unknown_action_type(tmp_path: Path) -> None:
    err = spec_error(tmp_path, replace("actions: [rollout]", "actions: [rollot]"))
    assert "did you mean 'rollout'" in str(err) and err.key_path == "components.rollout.actions[0]"
    err = spec_error(tmp_path, BASE + "actions:\n  rollot: {qos: high}\n")
    assert "did you mean 'rollout'" in str(err)


@pytest.mark.parametrize("bad", ["bad name", "x" * 65, "a$(touch x)", "", "name/../x"])
def test_invalid_job_name(tmp_path: Path, bad: str) -> None:
    err = spec_error(tmp_path, replace("name: toy", f"name: {yaml.safe_dump(bad).splitlines()[0]}"))
    assert err.key_path == "name" and "job name" in str(err)


@pytest.mark.parametrize("bad", ["Learner", "1abc", "a-b", "x" * 33])
def test_invalid_component_name(tmp_path: Path, bad: str) -> None:
    err = spec_error(tmp_path, replace("  rollout:\n", f"  {bad}:\n"))
    assert err.key_path == f"components.{bad}" and "component name" in str(err)


@pytest.mark.parametrize("bad", ["pkg.mod", "pkg.mod:", ":Work", "pkg mod:Work", "pkg.mod:Work;rm", "a..b:C"])
def test_invalid_workload_reference(tmp_path: Path, bad: str) -> None:
    err = spec_error(tmp_path, replace("workload: pkg.mod:Work", f"workload: '{bad}'"))
    assert err.key_path == "workload" and "module.path:Class" in str(err)


@pytest.mark.parametrize("bad", ["30 min", "1:2:3:4", "-5", "00:00:00", "abc"])
def test_invalid_time(tmp_path: Path, bad: str) -> None:
    err = spec_error(tmp_path, replace('time: "00:30:00"', f'time: "{bad}"'))
    assert err.key_path == "slurm.time"


@pytest.mark.parametrize("good", ["30", "30:00", "1-00", "1-02:03", "2-00:00:00", "UNLIMITED"])
def test_valid_time_formats(tmp_path: Path, good: str) -> None:
    assert load_spec(write(tmp_path, replace('time: "00:30:00"', f'time: "{good}"'))).slurm.time == good


@pytest.mark.parametrize("bad", ["2X", "lots", "-1G", "0", "2 G"])
def test_invalid_memory(tmp_path: Path, bad: str) -> None:
    err = spec_error(tmp_path, replace("    mem: 2G", f"    mem: '{bad}'"))
    assert err.key_path == "components.learner.mem"


@pytest.mark.parametrize("key,bad", [("partition", "debug;rm -rf"), ("account", "$(id)"),
                                     ("qos", "a b"), ("constraint", "`x`")])
def test_unsafe_slurm_names(tmp_path: Path, key: str, bad: str) -> None:
    text = replace("  partition: debug\n", f"  partition: debug\n  {key}: '{bad}'\n") if key != "partition" \
        else replace("partition: debug", f"partition: '{bad}'")
    err = spec_error(tmp_path, text)
    assert err.key_path == f"slurm.{key}"


def test_env_name_and_value_checks(tmp_path: Path) -> None:
    err = spec_error(tmp_path, BASE + "  1BAD: x\n")
    assert err.key_path == "env.1BAD" and "environment variable name" in str(err)
    err = spec_error(tmp_path, BASE + '  FOO: "a\\nb"\n')
    assert err.key_path == "env.FOO" and "line breaks" in str(err)
    err = spec_error(tmp_path, BASE + "  FOO: yes\n")
    assert err.key_path == "env.FOO" and "quote it" in str(err)



@pytest.mark.parametrize("name", ["AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN",
                                  "AWS_ACCESS_KEY_ID", "aws_secret_access_key"])
def test_env_refuses_credentials(tmp_path: Path, name: str) -> None:
    """A key in env: would be written to hetjob.sbatch, plan.json and job.yaml: refused,
    naming the key path and the fix, without echoing the secret."""
    err = spec_error(tmp_path, BASE + f"  {name}: abc123secret\n")
    assert err.key_path == f"env.{name}" and "credential" in str(err) and "export" in str(err)
    assert "abc123secret" not in str(err) + repr(err)
    with pytest.raises(SpecError) as info:  # the same rule via --set
        load_spec(write(tmp_path, BASE), Overrides(sets=[f"env.{name}=abc123secret"]))
    assert "credential" in str(info.value)


def test_slurm_extra_allow_list(tmp_path: Path) -> None:
    ok = load_spec(write(tmp_path, replace("  partition: debug\n",
                                           "  partition: debug\n  extra: [--exclusive, --mail-type=END]\n")))
    assert ok.slurm.extra == ["--exclusive", "--mail-type=END"]
    err = spec_error(tmp_path, replace("  partition: debug\n", "  partition: debug\n  extra: [--exclusiv]\n"))
    assert err.key_path == "slurm.extra[0]" and "did you mean --exclusive" in str(err.message).lower()
    assert "--mail-type" in str(err)  # the valid list is shown
    err = spec_error(tmp_path, replace("  partition: debug\n", "  partition: debug\n  extra: [--nodes=3]\n"))
    assert "components.<name>.nodes" in str(err)
    err = spec_error(tmp_path, replace("  partition: debug\n", "  partition: debug\n  extra: ['-x']\n"))
    assert "long sbatch option" in str(err)
    err = spec_error(tmp_path, replace("  partition: debug\n", "  partition: debug\n  extra: ['--comment=$(id)']\n"))
    assert "characters sbatch would misread" in str(err)
    err = spec_error(tmp_path, replace("  partition: debug\n", "  partition: debug\n  extra: ['--mail-user']\n"))
    assert "needs a value" in str(err)


def test_action_type_in_two_components(tmp_path: Path) -> None:
    err = spec_error(tmp_path, replace("actions: [rollout]", "actions: [rollout, eval]"))
    assert "listed by both 'learner' and 'rollout'" in str(err)


def test_missing_required_action_for_kind(tmp_path: Path) -> None:
    err = spec_error(tmp_path, replace("actions: [rollout]", "actions: [eval]").replace(", eval]", "]"))
    assert "needs a component running rollout" in str(err)


def test_rollout_in_supervised_job(tmp_path: Path) -> None:
    err = spec_error(tmp_path, replace("kind: rl", "kind: supervised"))
    assert "rollout actions need training.kind: rl" in str(err)


def test_grace_longer_than_time_limit(tmp_path: Path) -> None:
    err = spec_error(tmp_path, replace('time: "00:30:00"', 'time: "5"') + "preemption: {grace_seconds: 400}\n")
    assert err.key_path == "preemption.grace_seconds" and "time limit" in str(err)


def test_bad_signal_and_codec(tmp_path: Path) -> None:
    err = spec_error(tmp_path, BASE + "preemption: {signal: KILLME}\n")
    assert err.key_path == "preemption.signal"
    err = spec_error(tmp_path, BASE + "comms: {forward_codec: 'Int 8'}\n")
    assert err.key_path == "comms.forward_codec"


def test_workload_args_must_be_json(tmp_path: Path) -> None:
    err = spec_error(tmp_path, BASE + "workload_args: {when: 2024-01-01}\n")
    assert err.key_path == "workload_args" and "JSON" in str(err)
    err = spec_error(tmp_path, BASE + "workload_args: {x: .nan}\n")
    assert "NaN" in str(err)


def test_duplicate_key(tmp_path: Path) -> None:
    err = spec_error(tmp_path, BASE + "name: other\n")
    assert "duplicate key 'name'" in str(err) and err.line == BASE.count("\n") + 1


def test_yaml_syntax_error_position(tmp_path: Path) -> None:
    err = spec_error(tmp_path, replace("  kind: rl", "  kind: [rl"))
    assert "invalid YAML" in str(err) and err.line is not None


def test_not_a_mapping(tmp_path: Path) -> None:
    err = spec_error(tmp_path, "- just\n- a list\n")
    assert "expected a mapping" in str(err)
    err = spec_error(tmp_path, "components: [a, b]\nname: x\nworkload: a:B\ntraining: {kind: rl, iterations: 1}\n")
    assert err.key_path == "components" and "expected a mapping" in str(err)


def test_empty_file(tmp_path: Path) -> None:
    err = spec_error(tmp_path, "")
    assert "empty" in str(err)


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="no such file"):
        load_spec(tmp_path / "nope.yaml")
    with pytest.raises(SpecError, match="directory"):
        load_spec(tmp_path)


def test_non_utf8_bytes(tmp_path: Path) -> None:
    p = tmp_path / "job.yaml"
    p.write_bytes(b"name: caf\xe9\n")
    with pytest.raises(SpecError) as info:
        load_spec(p)
    assert "not UTF-8" in str(info.value) and info.value.line == 1 and info.value.column == 10


def test_binary_junk(tmp_path: Path) -> None:
    p = tmp_path / "job.yaml"
    p.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(SpecError):
        load_spec(p)


def test_alias_bomb_is_rejected_quickly(tmp_path: Path) -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):
        prev = f"*a{i - 1}"
        lines.append(f"a{i}: &a{i} [{', '.join([prev] * 10)}]")
    err = spec_error(tmp_path, "\n".join(lines) + "\n")
    assert "alias bomb" in str(err)


def test_deep_nesting(tmp_path: Path) -> None:
    err = spec_error(tmp_path, "name: " + "[" * 5000 + "]" * 5000 + "\n")
    assert "nest" in str(err)
    err = spec_error(tmp_path, "workload_args: " + "{a: " * 100 + "1" + "}" * 100 + "\n")
    assert "nest" in str(err)


def test_several_errors_are_all_listed(tmp_path: Path) -> None:
    text = replace("    nodes: 2\n", "    nodes: zero\n", replace("  iterations: 10", "  iterations: -3"))
    err = spec_error(tmp_path, text)
    assert "also" in str(err) and "training.iterations" in str(err) and "components.rollout.nodes" in str(err)


def test_yaml_tags_are_refused(tmp_path: Path) -> None:
    err = spec_error(tmp_path, BASE + "workload_args: !!python/object:os.system {a: 1}\n")
    assert "not supported" in str(err) and err.key_path == "workload_args"
    err = spec_error(tmp_path, BASE + "workload_args: {a: !!python/name:os.system ''}\n")
    assert err.key_path == "workload_args.a" and "cannot read value" in str(err)


def test_path_with_nul_byte() -> None:
    with pytest.raises(SpecError, match="invalid path"):
        load_spec("job\x00.yaml")


def test_spare_nodes_without_a_failure_budget_are_refused(tmp_path: Path) -> None:
    # A restart on the spares is a retried failure: with max_failures 0 they would never be used.
    text = replace("    actions: [rollout]\n", "    actions: [rollout]\n    spare_nodes: 1\n")
    err = spec_error(tmp_path, text)
    assert "components.rollout.spare_nodes" in str(err) and "preemption.max_failures >= 1" in str(err), err
    ok = write(tmp_path, text + "preemption:\n  max_failures: 1\n", "ok.yaml")
    assert load_spec(ok).components["rollout"].spare_nodes == 1
