"""Backends: selection, the Slurm CLI runner's retry/backoff, parsing, pyslurm refusal."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import time
from pathlib import Path

import pytest
from hetrun.slurm_plugin.backends import get_backend, resolve_name
from hetrun.slurm_plugin.backends.pyslurm_backend import PyslurmBackend, pyslurm_problem
from hetrun.slurm_plugin.backends.sbatch import (
    SbatchBackend,
    _exit_code,
    _parse_elapsed,
    _parse_sacct_parsable,
)
from hetrun.slurm_plugin.backends.slurm_cli import RetryPolicy, is_transient, run_slurm
from hetrun.slurm_plugin.rundir import RunInfo

from hetrun.errors import SlurmError


def test_unknown_backend_names_the_choices() -> None:
    with pytest.raises(SlurmError) as err:
        get_backend("sbach")
    assert "'sbatch'" in str(err.value) and "local" in str(err.value)


def _tool(directory: Path, name: str, body: str) -> None:
    (directory / name).write_text(f"#!/bin/sh\n{body}\n")
    (directory / name).chmod(0o755)


def test_auto_is_sbatch_when_a_controller_answers_else_local(monkeypatch: pytest.MonkeyPatch,
                                                             tmp_path: Path) -> None:
    """Issue 12: auto used to pick sbatch whenever sbatch was on PATH, then retry for a minute."""
    from hetrun.slurm_plugin.backends import choose_auto

    monkeypatch.setenv("PATH", str(tmp_path))  # an empty PATH: no sbatch
    assert resolve_name("auto") == "local"
    assert "no sbatch on PATH" in choose_auto().reason
    _tool(tmp_path, "sbatch", "exit 0")
    assert choose_auto().name == "local"  # no scontrol to ask
    _tool(tmp_path, "scontrol", 'echo "Slurmctld(primary) at head is UP"')
    assert resolve_name("auto") == "sbatch"
    assert "Slurmctld(primary) at head is UP" in choose_auto().reason
    _tool(tmp_path, "scontrol", 'echo "Slurmctld(primary) at head is DOWN"; exit 1')
    choice = choose_auto()
    assert choice.name == "local" and "is DOWN" in choice.reason
    _tool(tmp_path, "scontrol", "exec /bin/sleep 30")  # a controller that never answers
    choice = choose_auto(timeout_s=0.5)
    assert choice.name == "local" and "within 0.5 s" in choice.reason


@pytest.mark.skipif(importlib.util.find_spec("pyslurm") is not None, reason="pyslurm is importable here")
def test_pyslurm_backend_refuses_with_the_reason() -> None:
    problem = pyslurm_problem()
    assert problem is not None and "25.11" in problem
    with pytest.raises(SlurmError) as err:
        PyslurmBackend()
    msg = str(err.value)
    assert "pyslurm backend is not available" in msg and "25.11" in msg and "--backend sbatch" in msg
    with pytest.raises(SlurmError):
        get_backend("pyslurm")


def test_transient_errors_are_recognised() -> None:
    assert is_transient("slurm_load_jobs error: Unable to contact slurm controller (connect failure)")
    assert is_transient("sbatch: error: Batch job submission failed: Socket timed out on send/recv operation")
    assert not is_transient("sbatch: error: Batch job submission failed: Invalid partition name specified")


def test_retry_with_backoff_then_clear_error(tmp_path: Path) -> None:
    """A command that keeps reporting an unreachable controller is retried with growing delays."""
    script = tmp_path / "fake_squeue"
    script.write_text("#!/bin/sh\necho x >> \"$0.calls\"\n"
                      "echo 'squeue: error: Unable to contact slurm controller (connect failure)' >&2\nexit 1\n")
    script.chmod(0o755)
    delays: list[float] = []
    policy = RetryPolicy(attempts=4, first_delay_s=0.5, factor=2.0, max_delay_s=1.5, timeout_s=5)
    with pytest.raises(SlurmError) as err:
        run_slurm([str(script), "--json"], policy, sleep=delays.append)
    assert delays == [0.5, 1.0, 1.5]
    assert len(Path(f"{script}.calls").read_text().splitlines()) == 4
    msg = str(err.value)
    assert "fake_squeue --json" in msg and "4 attempts" in msg and "Unable to contact" in msg


def test_recovers_when_the_controller_comes_back(tmp_path: Path) -> None:
    script = tmp_path / "flaky"
    script.write_text("#!/bin/sh\nn=$(cat \"$0.n\" 2>/dev/null || echo 0); echo $((n+1)) > \"$0.n\"\n"
                      "if [ \"$n\" -lt 2 ]; then echo 'Socket timed out on send/recv operation' >&2; exit 1; fi\n"
                      "echo 123\n")
    script.chmod(0o755)
    out = run_slurm([str(script)], RetryPolicy(attempts=5, first_delay_s=0.01), sleep=lambda _s: None)
    assert out.stdout.strip() == "123"


def test_permanent_error_is_not_retried(tmp_path: Path) -> None:
    script = tmp_path / "fake_sbatch"
    script.write_text("#!/bin/sh\necho x >> \"$0.calls\"\n"
                      "echo 'sbatch: error: invalid partition specified: nope' >&2\nexit 1\n")
    script.chmod(0o755)
    with pytest.raises(SlurmError, match="invalid partition"):
        run_slurm([str(script)], RetryPolicy(attempts=5, first_delay_s=0.01), sleep=lambda _s: None)
    assert len(Path(f"{script}.calls").read_text().splitlines()) == 1


def test_missing_command_is_a_clear_error() -> None:
    with pytest.raises(SlurmError, match="not on PATH"):
        run_slurm(["hetrun-no-such-slurm-tool"], RetryPolicy(attempts=1))


def test_timeouts_count_as_unreachable(tmp_path: Path) -> None:
    script = tmp_path / "slow"
    script.write_text("#!/bin/sh\nsleep 5\n")
    script.chmod(0o755)
    with pytest.raises(SlurmError, match=r"no answer within 0\.3s"):
        run_slurm([str(script)], RetryPolicy(attempts=2, first_delay_s=0.01, timeout_s=0.3))


def test_sacct_parsable_and_exit_codes() -> None:
    raw = ("7+0|7|COMPLETED|65|n1|0:0|2026-01-01T00:00:00|job\n7+0.batch|7.batch|COMPLETED|65|n1|0:0|"
           "2026-01-01T00:00:00|batch\n7+1|8|CANCELLED by 0|86402|n[2-3]|0:15|2026-01-01T00:00:00|job\n"
           "7+1.0|8.0|CANCELLED|1|n2|0:15|2026-01-01T00:00:00|python\n")
    recs = _parse_sacct_parsable(raw)
    assert [(r["het_job_id"], r["het_offset"], r["state"], r["elapsed_s"]) for r in recs] == [
        ("7", 0, "COMPLETED", 65), ("7", 1, "CANCELLED", 86402)]
    assert _parse_elapsed("05:03") == 303
    assert _exit_code(143 << 8) == 143 and _exit_code(9) == 9 and _exit_code((0 << 8) | 9) == 9
    assert _exit_code({"status": "SUCCESS", "return_code": 0}) == 0


# --------------------------------------------------------------- on the real cluster


def _dead_controller_conf(slurm_cluster, tmp: Path) -> Path:  # type: ignore[no-untyped-def]
    """A copy of the cluster's slurm.conf whose controller port has nothing listening."""
    conf_dir = tmp / "deadconf"
    conf_dir.mkdir()
    src = Path(slurm_cluster.config.slurm_conf)
    lines = []
    for line in src.read_text().splitlines():
        lines.append("SlurmctldPort=6999" if line.startswith("SlurmctldPort=") else line)
    (conf_dir / "slurm.conf").write_text("\n".join(lines) + "\n")
    for extra in ("gres.conf", "cgroup.conf"):
        if (src.parent / extra).exists():
            (conf_dir / extra).write_text((src.parent / extra).read_text())
    return conf_dir / "slurm.conf"


def test_unreachable_controller_real_squeue(slurm_cluster, shared_tmp: Path) -> None:  # type: ignore[no-untyped-def]
    conf = _dead_controller_conf(slurm_cluster, shared_tmp)
    env = dict(os.environ, SLURM_CONF=str(conf))
    backend = SbatchBackend(RetryPolicy(attempts=2, first_delay_s=0.2, timeout_s=3), env=env)
    run = RunInfo(name="x", run_dir=str(shared_tmp), backend="sbatch", job_id="1", components=["a"])
    started = time.monotonic()
    with pytest.raises(SlurmError) as err:
        backend.status([run])
    assert time.monotonic() - started < 30
    msg = str(err.value)
    assert "squeue --json" in msg and "2 attempts" in msg and "unreachable" in msg


def test_sbatch_rejection_is_reported_at_once(slurm_cluster, shared_tmp: Path) -> None:  # type: ignore[no-untyped-def]
    script = shared_tmp / "bad.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH --partition=no_such_partition\ntrue\n")
    started = time.monotonic()
    with pytest.raises(SlurmError, match=r"(?i)partition"):
        SbatchBackend(RetryPolicy(attempts=5, first_delay_s=2)).test_only(script)
    assert time.monotonic() - started < 5, "a permanent error was retried"


def test_inventory_reads_the_cluster(slurm_cluster) -> None:  # type: ignore[no-untyped-def]
    from hetrun.slurm_plugin.inventory import node_capacities, node_inventory

    nodes = node_inventory()
    assert nodes is not None and len(nodes) == len(slurm_cluster.nodes)
    caps = node_capacities(None)
    assert caps and all(c.cpus >= 1 and c.mem_mb > 0 for c in caps)


def test_inventory_is_none_without_a_cluster(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from hetrun.slurm_plugin.inventory import node_inventory

    monkeypatch.setenv("PATH", str(tmp_path))
    assert node_inventory() is None


def test_sinfo_version_matches_what_pyslurm_check_reads(slurm_cluster) -> None:  # type: ignore[no-untyped-def]
    from hetrun.slurm_plugin.backends.pyslurm_backend import cluster_slurm_version

    out = subprocess.run(["sinfo", "--version"], capture_output=True, text=True, check=True).stdout
    assert cluster_slurm_version() in out


def test_sacct_attempts_of_a_requeued_job_collapse_to_one_record() -> None:
    from hetrun.slurm_plugin.backends.sbatch import _latest_attempts

    recs = [
        {"het_job_id": "5", "het_offset": 1, "state": "REQUEUED", "restarts": 0},
        {"het_job_id": "5", "het_offset": 0, "state": "REQUEUED", "restarts": 0},
        {"het_job_id": "5", "het_offset": 0, "state": "RUNNING", "restarts": 0},
        {"het_job_id": "5", "het_offset": 1, "state": "RUNNING", "restarts": 0},
    ]
    out = sorted(_latest_attempts(recs), key=lambda r: r["het_offset"])
    assert [(r["het_offset"], r["state"], r["restarts"]) for r in out] == [(0, "RUNNING", 1), (1, "RUNNING", 1)]


def test_a_slurm_command_that_times_out_may_have_been_carried_out_one_that_refuses_was_not() -> None:
    # hetrun submit keeps the run directory after an sbatch that timed out (the controller may
    # have queued the job) and removes it after a refusal (slurm_plugin/submit.py).
    with pytest.raises(SlurmError) as slow:
        run_slurm(["sleep", "5"], RetryPolicy(attempts=1, timeout_s=0.2))
    assert slow.value.uncertain and "no answer within 0.2s" in str(slow.value)
    with pytest.raises(SlurmError) as refused:
        run_slurm(["sh", "-c", "echo 'sbatch: error: Invalid partition name specified' >&2; exit 1"],
                  RetryPolicy(attempts=1, timeout_s=5))
    assert not refused.value.uncertain
