"""The CLI's start-up path stays light: no torch, no mpi4py for --help and status."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = """
import sys
from hetrun.cli.app import main
try:
    main({argv!r})
except SystemExit:
    pass
heavy = sorted(m for m in ("torch", "mpi4py", "numpy", "triton") if m in sys.modules)
print("HEAVY=" + ",".join(heavy))
"""


@pytest.mark.parametrize("argv", [["--help"], ["status"], ["plan", "--help"], ["submit", "--help"]])
def test_light_commands_import_no_heavy_modules(argv: list[str], tmp_path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE.format(argv=argv)],
        capture_output=True,
        text=True,
        env={"HETRUN_RUNS": str(tmp_path), "PATH": "/usr/bin:/bin"},
        timeout=60,
    )
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("HEAVY=")]
    assert line, proc.stdout + proc.stderr
    assert line[-1] == "HEAVY=", f"{argv} imported heavy modules: {line[-1]}\n{proc.stderr}"


@pytest.mark.parametrize("check", [False, True])
def test_plan_with_an_object_store_imports_no_torch(check: bool, tmp_path) -> None:
    """``hetrun plan`` of a job with ``checkpoint.object_store``: the pre-queue check
    (runtime/ckpt/object_preflight.py) needs boto3 at most, never torch or numpy.
    With the check on, the endpoint is a closed port: the check runs and refuses."""
    from pathlib import Path

    import yaml

    doc = yaml.safe_load((Path(__file__).parents[1] / "examples" / "ppo_cartpole.yaml").read_text())
    store = {"url": "s3://hetrun-probe/x", "check": False} if not check else \
        {"url": "s3://hetrun-probe/x", "endpoint": "http://127.0.0.1:9"}  # port 9 (discard): nothing listens
    doc.setdefault("checkpoint", {})["object_store"] = store
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(doc))
    env = {"HETRUN_RUNS": str(tmp_path / "runs"), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
           "AWS_ACCESS_KEY_ID": "probe", "AWS_SECRET_ACCESS_KEY": "probe", "AWS_EC2_METADATA_DISABLED": "true"}
    proc = subprocess.run([sys.executable, "-c", PROBE.format(argv=["plan", str(job), "--capacity", "spec"])],
                          capture_output=True, text=True, env=env, timeout=120)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("HEAVY=")]
    assert line, proc.stdout + proc.stderr
    assert line[-1] == "HEAVY=", f"plan imported heavy modules: {line[-1]}\n{proc.stderr}"
    if check:  # the check really ran (and said why it refused)
        assert "does not answer" in proc.stderr, proc.stderr
    else:
        assert "#SBATCH" in proc.stdout, proc.stdout + proc.stderr
