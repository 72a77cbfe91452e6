"""workload_args are checked by `hetrun plan` against the workload's typed model,
found by the naming rule (pkg.mod:Class -> pkg.mod_args:ClassArgs) without
importing the workload module (or torch)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hetrun.dag.overrides import Overrides
from hetrun.dag.spec import load_spec
from hetrun.dag.workload_args import args_model_ref, find_args_model

from hetrun.errors import SpecError

REPO = Path(__file__).resolve().parent.parent
PPO_YAML = REPO / "examples" / "ppo_cartpole.yaml"
MOE_YAML = REPO / "examples" / "moe_lm.yaml"


def _copy_with(tmp_path: Path, src: Path, old: str, new: str) -> Path:
    text = src.read_text()
    assert old in text, old
    out = tmp_path / src.name
    out.write_text(text.replace(old, new, 1))
    return out


def _position_of(path: Path, needle: str) -> tuple[int, int]:
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if needle in line:
            return i, line.index(needle) + 1
    raise AssertionError(needle)


def test_naming_rule() -> None:
    assert args_model_ref("hetrun.examples.ppo:PPOWorkload") == ("hetrun.examples.ppo_args", "PPOWorkloadArgs")
    assert find_args_model("hetrun.examples.ppo:PPOWorkload").__name__ == "PPOWorkloadArgs"
    assert find_args_model("hetrun.examples.moe_lm:MoELMWorkload").__name__ == "MoELMWorkloadArgs"
    assert find_args_model("nowhere.mod:Work") is None


def test_wrong_type_in_ppo_args_has_file_line_col(tmp_path: Path) -> None:
    job = _copy_with(tmp_path, PPO_YAML, "num_envs: 8", 'num_envs: "eight"')
    with pytest.raises(SpecError) as info:
        load_spec(job)
    err = info.value
    assert (err.file, err.key_path) == (str(job), "workload_args.num_envs")
    assert (err.line, err.column) == _position_of(job, '"eight"')
    assert "expected an integer" in str(err)


def test_unknown_moe_arg_suggests_closest(tmp_path: Path) -> None:
    job = _copy_with(tmp_path, MOE_YAML, "num_experts: 16", "experts: 16")
    with pytest.raises(SpecError, match="did you mean 'num_experts'") as info:
        load_spec(job)
    assert info.value.key_path == "workload_args.experts" and info.value.line == 5


def test_override_of_an_arg_is_blamed_on_the_flag_and_typed_like_yaml() -> None:
    with pytest.raises(SpecError) as info:
        load_spec(PPO_YAML, Overrides(sets=["workload_args.num_envs=eight"]))
    assert info.value.file == "override --set workload_args.num_envs=eight" and info.value.line is None
    spec = load_spec(PPO_YAML, Overrides(sets=["workload_args.learning_rate=1e-3"]))
    assert spec.workload_args["learning_rate"] == 1e-3


def test_misspelt_codec_has_file_line_col(tmp_path: Path) -> None:
    job = _copy_with(tmp_path, MOE_YAML, "forward_codec: int4", "forward_codec: innt4")
    with pytest.raises(SpecError, match="did you mean 'int4'") as info:
        load_spec(job)
    assert info.value.key_path == "comms.forward_codec"
    assert (info.value.line, info.value.column) == _position_of(job, "innt4")


def _user_job(tmp_path: Path, args_module: str) -> Path:
    (tmp_path / "mywork.py").write_text("raise RuntimeError('the workload module must not be imported by plan')\n")
    (tmp_path / "mywork_args.py").write_text(textwrap.dedent(args_module))
    job = tmp_path / "job.yaml"
    job.write_text(textwrap.dedent("""\
        name: mine
        workload: mywork:MyWork
        workload_args: {steps: 3}
        components:
          learner: {actions: [forward, backward, optimize]}
        training: {kind: supervised, iterations: 2}
        """))
    return job


def test_user_workload_next_to_the_yaml(tmp_path: Path) -> None:
    job = _user_job(tmp_path, """\
        from pydantic import BaseModel, ConfigDict, Field
        class MyWorkArgs(BaseModel):
            model_config = ConfigDict(extra="forbid", strict=True)
            steps: int = Field(1, ge=5)
        """)
    with pytest.raises(SpecError, match="greater than or equal to 5") as info:
        load_spec(job)
    assert info.value.line == 3 and info.value.key_path == "workload_args.steps"
    assert str(tmp_path) not in sys.path and "mywork" not in sys.modules
    sys.modules.pop("mywork_args", None)


def test_args_module_without_the_model_is_an_error(tmp_path: Path) -> None:
    job = _user_job(tmp_path, "X = 1\n")
    with pytest.raises(SpecError, match="has no pydantic model MyWorkArgs"):
        load_spec(job)
    sys.modules.pop("mywork_args", None)


def test_plan_checks_args_without_importing_torch(tmp_path: Path) -> None:
    probe = textwrap.dedent(f"""
        import sys
        from hetrun.cli.app import main
        try:
            main(["plan", {str(PPO_YAML)!r}, "--json", "--capacity", "spec"])
        except SystemExit:
            pass
        assert "hetrun.examples.ppo_args" in sys.modules
        print("HEAVY=" + ",".join(m for m in ("torch", "numpy", "mpi4py", "gymnasium") if m in sys.modules))
        """)
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "HETRUN_RUNS": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "HEAVY=", proc.stdout[-500:] + proc.stderr
