"""`hetrun plan` and `hetrun schema`, through the real console entry point."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hetrun.cli.app import main
from hetrun.dag.plan import Plan, build_plan
from hetrun.dag.spec import load_spec
from setup_tools import import_or_require

ROOT = Path(__file__).resolve().parent.parent
PPO = ROOT / "examples" / "ppo_cartpole.yaml"
MOE = ROOT / "examples" / "moe_lm.yaml"


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        main(argv)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    out, err = capsys.readouterr()
    return code, out, err


def test_plan_shows_dag_components_and_script(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = run(["plan", str(PPO), "--capacity", "spec", "--runs-dir", str(tmp_path)], capsys)
    assert code == 0, err
    assert "het components" in out and "learner" in out and "rollout" in out
    assert "action DAG per iteration" in out and "forward.m0+backward.m0" in out
    assert "sync.policy@-2" in out  # the rollout's tolerance window as a lagged dep
    assert "priority = 0.7 x qos + 0.3 x utilization" in out
    assert "rank-level actions" in out
    try:
        import hetrun.slurm_plugin.render  # noqa: F401
    except ImportError:
        assert "sbatch script not shown" in out
    else:
        script = out[out.index("#!/bin/bash"):]
        assert "#SBATCH hetjob" in script and "--het-group" in script and str(tmp_path) in script


def test_plan_json_is_the_plan(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["plan", str(MOE), "--json", "--capacity", "spec"], capsys)
    assert code == 0, err
    assert Plan.from_json(out) == build_plan(load_spec(MOE))


def test_plan_overrides(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["plan", str(PPO), "--json", "--capacity", "spec", "-p", "high", "-t", "10:00",
                          "-N", "rollout=3", "--set", "training.micro_batches=4"], capsys)
    assert code == 0, err
    plan = Plan.from_json(out)
    assert plan.slurm.partition == "high" and plan.slurm.time == "10:00"
    assert plan.component("rollout").nodes == 3 and plan.training.micro_batches == 4
    assert sum(1 for a in plan.actions if a.type == "forward") == 4


def test_plan_explain_shows_each_pass(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["plan", str(MOE), "--explain", "--capacity", "spec"], capsys)
    assert code == 0
    for header in ("(1) split", "(2) memory", "(3) fuse"):
        assert header in out
    assert out.count("before") >= 3 and out.count("after") >= 3
    assert "peak memory per rank" in out


def test_plan_unroll(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["plan", str(PPO), "--unroll", "3", "--capacity", "spec"], capsys)
    assert code == 0
    assert "unrolled over 3 iterations" in out and "i2/rollout" in out
    assert "i1/forward.m0+backward.m0  <- i0/sync.grads+optimize, i1/rollout" in out


def test_spec_error_is_one_message_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "job.yaml"
    bad.write_text(PPO.read_text().replace("micro_batches: 2", "micro_batchs: 2"))
    code, out, err = run(["plan", str(bad)], capsys)
    assert code == 2
    assert err.startswith(f"hetrun: error: {bad}:") and "did you mean 'micro_batches'" in err
    assert "Traceback" not in err and out == ""


def test_override_error_names_override(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["plan", str(PPO), "--set", "training.iterations=abc"], capsys)
    assert code == 2 and "override --set training.iterations=abc: training.iterations" in err


def test_graph_error_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["plan", str(PPO), "--capacity", "spec", "--set", "actions.optimize.after=[checkpoint]"],
                       capsys)
    assert code == 2 and "dependency cycle: " in err and "Traceback" not in err


def test_bad_capacity_choice(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["plan", str(PPO), "--capacity", "sinfo"], capsys)
    assert code == 2 and "expected auto, cluster or spec" in err


def test_schema_validates_the_examples(capsys: pytest.CaptureFixture[str]) -> None:
    jsonschema = import_or_require("jsonschema", "jsonschema (pip, the dev extra)")
    code, out, _ = run(["schema"], capsys)
    assert code == 0
    schema = json.loads(out)
    for example in (PPO, MOE):
        jsonschema.validate(yaml.safe_load(example.read_text()), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"name": "x", "workload": "a:B", "components": {}, "training": {"kind": "rl"},
                             "bogus": 1}, schema)


def test_console_script_subprocess_no_traceback(tmp_path: Path) -> None:
    """The installed `python -m hetrun.cli` path: real process, real exit code, no traceback."""
    junk = tmp_path / "junk.yaml"
    junk.write_bytes(b"\xff\xfe\x00garbage: [")
    env = {**os.environ, "HETRUN_RUNS": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "hetrun.cli", "plan", str(junk)], capture_output=True,
                          text=True, timeout=120, env=env)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("hetrun: error:") and "Traceback" not in proc.stderr


def test_plan_checks_against_the_real_cluster(slurm_cluster: object, capsys: pytest.CaptureFixture[str]) -> None:
    """With a cluster up, resources are checked against sinfo's nodes, not the spec."""
    from hetrun.slurm_plugin.inventory import node_capacities

    caps = node_capacities("debug")
    assert caps, "sinfo answered no nodes"
    code, out, err = run(["plan", str(PPO), "--capacity", "cluster", "-p", "debug"], capsys)
    assert code == 0, err
    assert f"resources checked against sinfo: {len(caps)} nodes of debug" in out
    too_many = len(caps) + 1
    code, _, err = run(["plan", str(PPO), "--capacity", "cluster", "-p", "debug", "-N", f"rollout={too_many}"],
                       capsys)
    assert code == 2 and f"needs {too_many} nodes" in err and f"only {len(caps)} such nodes" in err
    biggest = max(c.mem_mb for c in caps)
    code, _, err = run(["plan", str(PPO), "--capacity", "cluster", "-p", "debug",
                        "--set", f"components.learner.mem={biggest + 1}M"], capsys)
    assert code == 2 and f"(max {biggest})" in err


@pytest.mark.parametrize("example", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_plans(example: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["plan", str(example), "--json", "--capacity", "spec"], capsys)
    assert code == 0, err
    plan = Plan.from_json(out)
    assert plan.order and len(plan.components) >= 2  # every example is a real het job


def test_a_missing_command_module_is_a_loud_packaging_error() -> None:
    """cli/app.py used to skip command modules that were "not there yet" (issue 12)."""
    probe = ("import sys; sys.modules['hetrun.cli.ckpt_cmd'] = None\n"
             "try:\n    import hetrun.cli.app\nexcept ImportError as exc:\n    print('LOUD', exc)\n")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False)
    assert "LOUD" in proc.stdout and "ckpt_cmd" in proc.stdout, proc.stdout + proc.stderr


PLACED_JOB = """\
name: plan-placed
components:
  trainer:
    nodes: 1
    gpus_per_node: 1
    mem: 200M
    placement: auto
    partitions: [debug]
    command: [sleep, "1"]
slurm: {partition: high, time: "00:05:00"}
"""


def test_plan_without_a_controller_says_the_auto_blocks_are_unplaced(tmp_path: Path) -> None:
    """No sbatch on PATH: the script is shown unplaced (the YAML's partition), and plan says so and why."""
    (tmp_path / "job.yaml").write_text(PLACED_JOB)
    env = {**os.environ, "PATH": str(Path(sys.executable).parent), "COLUMNS": "200"}
    proc = subprocess.run([sys.executable, "-m", "hetrun.cli", "plan", str(tmp_path / "job.yaml"), "--runs-dir",
                           str(tmp_path / "runs")], capture_output=True, text=True, timeout=120, env=env, check=False)
    assert proc.returncode == 0, proc.stderr
    out = " ".join(proc.stdout.split())  # rich may wrap the note
    assert "note: trainer is not placed in this script" in out and "no sbatch on PATH" in out, proc.stdout
    assert "#SBATCH --partition=high" in proc.stdout and "placed trainer on" not in proc.stdout
    js = subprocess.run([sys.executable, "-m", "hetrun.cli", "plan", str(tmp_path / "job.yaml"), "--json"],
                        capture_output=True, text=True, timeout=120, env=env, check=False)
    assert js.returncode == 0 and "not placed" in js.stderr, js.stderr
    assert "placement" not in json.loads(js.stdout)["components"][0]


@pytest.mark.slurm
def test_plan_prints_the_placed_script_submit_would_send(slurm_cluster, shared_tmp: Path) -> None:  # type: ignore[no-untyped-def]
    """With a controller, plan renders submit's choice (the fit step of submit itself): the component
    may only go to debug, so its block says debug, not the YAML's job-wide high (which a plan that
    ignored the placement would print). `submit --dry-run` renders the same het block."""
    from tests.cli_helpers import hetrun_cli

    (shared_tmp / "job.yaml").write_text(PLACED_JOB)
    plan = hetrun_cli("plan", str(shared_tmp / "job.yaml"), "--runs-dir", str(shared_tmp / "runs"), timeout=120)
    assert plan.returncode == 0, plan.stderr
    assert "placed trainer on debug" in plan.stdout and "not placed" not in plan.stdout, plan.stdout
    script = plan.stdout[plan.stdout.index("#!/bin/bash"):]
    dry = hetrun_cli("submit", str(shared_tmp / "job.yaml"), "--runs-dir", str(shared_tmp / "runs"), "--dry-run",
                     timeout=120)
    assert dry.returncode == 0, dry.stderr

    def sbatch_lines(text: str) -> list[str]:  # without the lines naming the run directory (a new name each)
        return [ln for ln in text.splitlines() if ln.startswith("#SBATCH --") and "/runs/" not in ln]

    block = sbatch_lines(script)
    assert "#SBATCH --partition=debug" in block and "#SBATCH --partition=high" not in block, script
    assert block == sbatch_lines(dry.stdout)
    # --fit places a fixed component too (against the job-wide partition: high)
    (shared_tmp / "fixed.yaml").write_text(PLACED_JOB.replace("    placement: auto\n    partitions: [debug]\n", ""))
    fit = hetrun_cli("plan", str(shared_tmp / "fixed.yaml"), "--json", "--fit", timeout=120)
    assert json.loads(fit.stdout)["components"][0]["placement"]["partition"] == "high", fit.stderr
    plain = hetrun_cli("plan", str(shared_tmp / "fixed.yaml"), "--json", timeout=120)
    assert "placement" not in json.loads(plain.stdout)["components"][0], plain.stdout
