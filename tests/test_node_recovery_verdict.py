"""node_recovery's verdict on which node died once the step has ended (no Slurm): a node
whose probe has not answered while the others have, and whose heartbeat file has been
silent for HETRUN_NODE_TIMEOUT (1 s once a rank of the step failed), is dead without waiting
out the probe; a fresh or missing
heartbeat leaves it to the probe's timeout. The probes are real processes standing in for
``srun ... true``: ``true`` a live slurmd's answer, ``sleep`` a dead node's silence."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from hetrun.slurm_plugin.node_recovery import await_probes, heartbeat_ages, node_timeout_s

from hetrun.rundir import NODE_TIMEOUT_DEFAULT_S


def _beat(alive: Path, node: str, age_s: float) -> None:
    alive.mkdir(parents=True, exist_ok=True)
    (alive / node).write_text("7\n")
    t = time.time() - age_s
    os.utime(alive / node, (t, t))


def _proc(argv: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def _live() -> subprocess.Popen[str]:
    return _proc(["true"])


def _silent() -> subprocess.Popen[str]:
    return _proc(["sleep", "60"])


def test_heartbeat_ages_stale_fresh_missing(tmp_path: Path) -> None:
    alive = tmp_path / "logs" / "alive"
    _beat(alive, "n1", 10.0)
    _beat(alive, "n2", 0.0)
    ages = heartbeat_ages(alive, ["n1", "n2", "n3"])
    assert ages["n1"] is not None and 9.0 <= ages["n1"] <= 60.0, ages
    assert ages["n2"] is not None and ages["n2"] < 5.0, ages
    assert ages["n3"] is None, ages
    assert [p.name for p in alive.iterdir()] in (["n1", "n2"], ["n2", "n1"])  # its clock file is gone
    assert heartbeat_ages(tmp_path / "none", ["n1"]) == {"n1": None}


def test_a_stale_heartbeat_and_no_answer_while_the_others_answered_is_dead_at_once(tmp_path: Path) -> None:
    alive = tmp_path / "alive"
    _beat(alive, "n2", 10.0)
    dead = _silent()
    t0 = time.monotonic()
    out = await_probes([("n1", _live()), ("n2", dead)], timeout=60.0, heartbeats=alive, node_timeout=3)
    assert list(out) == ["n2"], out
    assert "did not answer a probe step in" in out["n2"], out
    assert "heartbeat has been silent" in out["n2"] and "HETRUN_NODE_TIMEOUT=3" in out["n2"], out
    assert dead.returncode is not None and time.monotonic() - t0 < 60.0  # killed, not waited out


def test_a_failed_rank_corroborates_a_shorter_silence(tmp_path: Path) -> None:
    """A rank of the step failed (``corroborated``): a heartbeat silent for 1.5 s, under the
    3 s timeout, with no answer while the other node answered, is dead after the probe's grace
    (1 s), and the reason names the rule; without the failure the same silence is no verdict
    and the probe's own timeout decides."""
    alive = tmp_path / "alive"
    _beat(alive, "n2", 1.5)
    t0 = time.monotonic()
    out = await_probes([("n1", _live()), ("n2", _silent())], timeout=20.0, heartbeats=alive, node_timeout=3,
                       corroborated=True)
    assert list(out) == ["n2"] and "(1 s: a rank of the step failed)" in out["n2"], out
    assert time.monotonic() - t0 < 5.0
    _beat(alive, "n2", 1.0)  # (it ages while the probe waits: 2.5 s at the end, under the 3)
    out = await_probes([("n1", _live()), ("n2", _silent())], timeout=1.5, heartbeats=alive, node_timeout=3)
    assert out == {"n2": "did not answer a probe step within 1.5 s"}, out
    # A fresh file (a beat stopped a moment ago) stays no verdict even then.
    _beat(alive, "n2", 0.0)
    out = await_probes([("n1", _live()), ("n2", _silent())], timeout=0.8, heartbeats=alive, node_timeout=3,
                       corroborated=True)
    assert out == {"n2": "did not answer a probe step within 0.8 s"}, out


def test_a_fresh_or_missing_heartbeat_leaves_the_verdict_to_the_probe(tmp_path: Path) -> None:
    alive = tmp_path / "alive"
    _beat(alive, "n2", 0.0)  # merely late: younger than the timeout
    out = await_probes([("n1", _live()), ("n2", _silent()), ("n3", _silent())], timeout=1.0,
                       heartbeats=alive, node_timeout=30)
    assert out == {"n2": "did not answer a probe step within 1 s", "n3": "did not answer a probe step within 1 s"}


def test_a_live_node_with_a_stale_file_answers_and_a_lone_node_waits_for_the_probe(tmp_path: Path) -> None:
    alive = tmp_path / "alive"
    _beat(alive, "n1", 10.0)  # its rank SIGKILLed, the file left behind; its slurmd answers
    _beat(alive, "n2", 10.0)
    assert await_probes([("n1", _live())], timeout=5.0, heartbeats=alive, node_timeout=3) == {}
    # No other node answered (a one-node step, or Slurm slow for all): the probe decides.
    out = await_probes([("n2", _silent())], timeout=1.0, heartbeats=alive, node_timeout=3)
    assert out == {"n2": "did not answer a probe step within 1 s"}
    out = await_probes([("n1", _proc(["false"])), ("n2", _live())], timeout=5.0, heartbeats=tmp_path / "x")
    assert list(out) == ["n1"] and out["n1"].startswith("a probe step failed there (exit 1"), out


def test_node_timeout_is_read_as_the_batch_script_reads_it() -> None:
    assert node_timeout_s({"HETRUN_NODE_TIMEOUT": "7"}) == 7.0
    for bad in ("", "0", "05", "2.5", "x"):
        assert node_timeout_s({"HETRUN_NODE_TIMEOUT": bad}) == NODE_TIMEOUT_DEFAULT_S, bad
    assert node_timeout_s({}) == NODE_TIMEOUT_DEFAULT_S
