"""Shell/path injection: every user string that can reach the script or a path.

Each payload is either refused with a SpecError/RunDirError, or rendered
inert. Inert is proven by running the rendered script with bash: a canary
file the payload would create must not exist, the value must arrive verbatim
in the environment of the launched command, and nothing may be written
outside the run directory. The launched ``srun``/``scontrol`` are stand-ins
(``fake_bin``) that only record what they were given; the real Slurm run of a
payload-laden job is in test_submit_slurm.py.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hetrun.dag.plan import build_plan
from hetrun.dag.spec import JobSpec, SlurmSpec, spec_from_dict
from hetrun.slurm_plugin.render import render_sbatch
from hetrun.slurm_plugin.submit import submit_spec

from hetrun.errors import HetrunError, RunDirError, SpecError

FAKE_SRUN = """#!/bin/bash
# fake srun for tests: records argv and env, exits with $FAKE_SRUN_RC
printf '%s\\0' "$@" > "$HETRUN_RUN_DIR/fake-srun.argv"
env -0 > "$HETRUN_RUN_DIR/fake-srun.env"
exit "${FAKE_SRUN_RC:-0}"
"""
FAKE_SCONTROL = """#!/bin/bash
printf '%s\\0' "$@" > "$HETRUN_RUN_DIR/fake-scontrol.argv"
"""


def payloads(canary: Path) -> list[str]:
    c = str(canary)
    return [
        f"$(touch {c})",
        f"`touch {c}`",
        f"'; touch {c}; '",
        f'"; touch {c}; "',
        f"x; touch {c}",
        f"x|touch {c}",
        f"x && touch {c}",
        f"x\ntouch {c}",
        f"${{IFS}}touch${{IFS}}{c}",
        "../../../../escape",
        "/etc/passwd",
        "a\x00b",
        "--wrap=touch " + c,
        "#SBATCH --wrap=x",
        "%j%x",
    ]


def base_spec() -> dict[str, Any]:
    return {
        "name": "inj",
        "workload": "hetrun.examples.ppo:PPOWorkload",
        "workload_args": {"env_id": "CartPole-v1"},
        "components": {
            "learner": {"nodes": 1, "tasks_per_node": 1, "mem": "1G",
                        "actions": ["forward", "backward", "optimize", "sync"]},
            "rollout": {"nodes": 1, "tasks_per_node": 1, "mem": "1G", "actions": ["rollout"]},
        },
        "training": {"kind": "rl", "iterations": 1},
        "slurm": {"partition": "debug", "time": "00:05:00"},
        "env": {"OMP_NUM_THREADS": "1"},
    }


def _set(data: dict[str, Any], field: str, value: str) -> None:
    if field == "name":
        data["name"] = value
    elif field == "workload":
        data["workload"] = value
    elif field in ("partition", "account", "qos", "time", "constraint"):
        data["slurm"][field] = value
    elif field == "extra":
        data["slurm"]["extra"] = [value, f"--comment={value}", f"--mail-user={value}"]
    elif field == "env_value":
        data["env"]["PAYLOAD"] = value
    elif field == "env_key":
        data["env"][value] = "1"
    elif field == "workload_args":
        data["workload_args"] = {"env_id": value, value if value else "k": [value]}
    elif field == "component":
        comps = data["components"]
        comps[value] = comps.pop("rollout")
    elif field == "checkpoint_dir":
        data["checkpoint"] = {"directory": value}
    elif field == "signal":
        data["preemption"] = {"signal": value}
    else:  # pragma: no cover - a typo in FIELDS
        raise AssertionError(field)


FIELDS = ["name", "workload", "partition", "account", "qos", "time", "constraint", "extra",
          "env_value", "env_key", "workload_args", "component", "checkpoint_dir", "signal"]


def _outcome(data: dict[str, Any], run_dir: Path) -> tuple[str, str | None]:
    """("refused", message) or ("rendered", script)."""
    try:
        spec = spec_from_dict(data)
        plan = build_plan(spec)
        # The submit path's own checks (checkpoint dir containment) before rendering.
        from hetrun.slurm_plugin.submit import _check_checkpoint_dir

        _check_checkpoint_dir(spec, run_dir)
        return "rendered", render_sbatch(plan, spec, run_dir, python="/usr/bin/python3")
    except (SpecError, RunDirError) as exc:
        assert str(exc), "an error without a message"
        assert "Traceback" not in str(exc)
        return "refused", str(exc)


def _run_script(script: str, run_dir: Path, fake_bin: Path, *, rc: int = 0) -> subprocess.CompletedProcess[str]:
    path = run_dir / "hetjob.sbatch"
    path.write_text(script)
    env = {"PATH": f"{fake_bin}:/usr/bin:/bin", "FAKE_SRUN_RC": str(rc), "SLURM_JOB_ID": "4242",
           "HOME": str(run_dir)}
    return _run_bash(path, run_dir, env)


def _run_bash(path: Path, run_dir: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    # Output to unnamed files, not pipes: the script's watchdog leaves its `sleep 3` behind
    # when it is killed, and a pipe would be held open (and waited for) until that ends.
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.run(["bash", str(path)], cwd=run_dir, env=env, stdout=out, stderr=err, text=True,
                              timeout=60, check=False)
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out.read(), err.read())


@pytest.fixture
def fake_bin(tmp_path: Path) -> Path:
    d = tmp_path / "fake_bin"
    d.mkdir()
    for name, body in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (d / name).write_text(body)
        (d / name).chmod(0o755)
    return d


def _tree(root: Path) -> set[Path]:
    return {p for p in root.rglob("*")}


@pytest.mark.parametrize("field", FIELDS)
def test_payloads_are_refused_or_inert(field: str, tmp_path: Path, fake_bin: Path) -> None:
    sandbox = tmp_path / "sandbox"
    canary = tmp_path / "CANARY"
    rendered = 0
    for i, payload in enumerate(payloads(canary)):
        runs = sandbox / "runs"
        run_dir = runs / f"inj-{i}"
        run_dir.mkdir(parents=True)
        data = base_spec()
        _set(data, field, payload)
        kind, text = _outcome(data, run_dir)
        if kind == "refused":
            continue
        rendered += 1
        script = text or ""
        # #SBATCH lines never carry a payload (sbatch would read it, not bash).
        for line in script.splitlines():
            if line.startswith("#SBATCH"):
                assert "touch" not in line and "\x00" not in line, line
        before = _tree(tmp_path)
        proc = _run_script(script, run_dir, fake_bin)
        assert proc.returncode == 0, proc.stderr
        assert not canary.exists(), f"{field}={payload!r} executed: canary created"
        created = _tree(tmp_path) - before
        outside = [p for p in created if run_dir not in p.parents and p != run_dir]
        assert not outside, f"{field}={payload!r} wrote outside the run dir: {outside}"
        argv = (run_dir / "fake-srun.argv").read_text().split("\0")[:-1]
        assert argv.count(str(run_dir)) == 2, argv  # the runtime's argument, once per component
        env = dict(kv.split("=", 1) for kv in (run_dir / "fake-srun.env").read_text().split("\0") if "=" in kv)
        if field == "env_value":
            assert env["PAYLOAD"] == payload, "the value did not arrive verbatim"
        if field in ("workload_args", "checkpoint_dir"):
            # Workload args live in plan.json, the checkpoint directory is used by the
            # runtime as a path: neither reaches the script.
            assert payload not in script
        if field == "checkpoint_dir":
            assert ".." not in Path(payload).parts, "a relative path leaving the run dir was accepted"
    # Fields whose values are free text must accept (and neutralise) at least one payload;
    # the others must refuse every payload.
    if field in ("env_value", "workload_args", "checkpoint_dir"):
        assert rendered > 0, f"{field}: every payload refused; expected inert rendering"
    else:
        assert rendered == 0, f"{field}: a payload was accepted into a restricted field"


def test_refusals_name_the_field(tmp_path: Path) -> None:
    data = base_spec()
    data["slurm"]["partition"] = "debug; touch x"
    with pytest.raises(SpecError) as err:
        spec_from_dict(data)
    assert "partition" in str(err.value)


def test_renderer_refuses_payloads_that_bypass_the_spec(tmp_path: Path) -> None:
    """The request's gate is the last one: a spec or plan built in code without validation
    (pydantic's model_construct, a field assigned after the fact) gets the same checks."""
    spec = spec_from_dict(base_spec())
    plan = build_plan(spec)

    def bypass(**fields: Any) -> JobSpec:
        return spec.model_copy(update=fields)

    for key, value in (("partition", "a\n#SBATCH --wrap=x"), ("time", "$(id)"), ("account", "a b"),
                       ("constraint", "x`id`"), ("extra", ["--wrap=id"]), ("extra", ["--export=NONE"])):
        with pytest.raises(SpecError, match=f"slurm\\.{key}"):
            render_sbatch(plan, bypass(slurm=SlurmSpec.model_construct(**{key: value})), tmp_path,
                          python="/usr/bin/python3")
    with pytest.raises(SpecError, match=r"env\.A"):
        render_sbatch(plan, bypass(env={"A": "x\ny"}), tmp_path, python="/usr/bin/python3")
    with pytest.raises(SpecError, match="name"):
        render_sbatch(plan, bypass(name="../x"), tmp_path, python="/usr/bin/python3")
    bad_plan = plan.model_copy(update={"components": [plan.components[0].model_copy(update={"name": "a;b"})]})
    with pytest.raises(SpecError, match=r"components\[0\]\.name"):
        render_sbatch(bad_plan, spec, tmp_path, python="/usr/bin/python3")
    bad_command = plan.model_copy(update={"components": [plan.components[0].model_copy(update={"command": ["a\nb"]})]})
    with pytest.raises(SpecError, match=r"components\.learner\.command"):
        render_sbatch(bad_command, spec, tmp_path, python="/usr/bin/python3")


def test_runs_dir_payloads_never_escape(tmp_path: Path) -> None:
    spec = spec_from_dict(base_spec())
    for bad in (f"{tmp_path}/a b", f"{tmp_path}/$(id)", f"{tmp_path}/x%j", f"{tmp_path}/a\nb"):
        with pytest.raises(HetrunError):
            submit_spec(spec, backend="local", runs_dir=bad, dry_run=True)
    # '..' in the runs dir is the user's own choice of directory: it is resolved, and the
    # run directory lands inside the resolved root.
    res = submit_spec(spec, backend="local", runs_dir=f"{tmp_path}/a/../runs", dry_run=True)
    assert Path(res.run.run_dir).parent == (tmp_path / "runs")
    assert not (tmp_path / "runs").exists(), "a dry run wrote something"


def test_checkpoint_directory_may_not_leave_the_run_dir(tmp_path: Path) -> None:
    data = base_spec()
    data["checkpoint"] = {"directory": "../../elsewhere"}
    try:
        spec = spec_from_dict(data)
    except SpecError:
        return  # refused by the spec already
    with pytest.raises(RunDirError, match=r"checkpoint\.directory"):
        submit_spec(spec, backend="local", runs_dir=str(tmp_path / "runs"), dry_run=True)


def test_usr1_is_forwarded_and_exit_85_requeues(tmp_path: Path, fake_bin: Path) -> None:
    """The batch shell's own logic: trap, forward to srun, 85 -> scontrol requeue."""
    (fake_bin / "srun").write_text(
        "#!/bin/bash\n# fake srun: exits 85 when it gets USR1, like a checkpointing runtime\n"
        "trap 'echo got-usr1 > \"$HETRUN_RUN_DIR/fake-srun.sig\"; exit 85' USR1\n"
        "touch \"$HETRUN_RUN_DIR/fake-srun.started\"\n"
        "for _ in $(seq 300); do sleep 0.1; done\nexit 0\n")
    spec = spec_from_dict(base_spec())
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    script = render_sbatch(build_plan(spec), spec, run_dir, python="/usr/bin/python3")
    (run_dir / "hetjob.sbatch").write_text(script)
    env = {"PATH": f"{fake_bin}:/usr/bin:/bin", "SLURM_JOB_ID": "4242", "SLURM_RESTART_COUNT": "0"}
    # stderr to an unnamed file, not a pipe (see _run_script).
    with tempfile.TemporaryFile("w+") as errf:
        proc = subprocess.Popen(["bash", str(run_dir / "hetjob.sbatch")], cwd=run_dir, env=env,
                                stdout=subprocess.DEVNULL, stderr=errf, text=True)
        try:
            from hetrun.slurm_plugin.rundir import wait_for

            assert wait_for(lambda: (run_dir / "fake-srun.started").exists(), 20, 0.05)
            os.kill(proc.pid, 10)  # SIGUSR1 to the batch shell, as --signal=B:USR1 does
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
        errf.seek(0)
        err = errf.read()
    assert (run_dir / "fake-srun.sig").read_text().strip() == "got-usr1"
    assert (run_dir / "fake-scontrol.argv").read_text().split("\0")[:-1] == ["requeue", "4242"]
    assert proc.returncode == 0, err
    assert "requeueing job 4242" in err


def test_exit_85_past_max_restarts_is_a_failure(tmp_path: Path, fake_bin: Path) -> None:
    data = base_spec()
    data["preemption"] = {"max_restarts": 1}
    spec = spec_from_dict(data)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    script = render_sbatch(build_plan(spec), spec, run_dir, python="/usr/bin/python3")
    (run_dir / "hetjob.sbatch").write_text(script)
    env = {"PATH": f"{fake_bin}:/usr/bin:/bin", "SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "1",
           "FAKE_SRUN_RC": "85"}
    proc = _run_bash(run_dir / "hetjob.sbatch", run_dir, env)
    assert proc.returncode == 85
    assert not (run_dir / "fake-scontrol.argv").exists()
    assert "max_restarts (1) reached" in proc.stderr
