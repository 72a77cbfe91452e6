"""Warm starts (runtime/warm_start.py): a rank forked from its node's warm server.

The server and its requesters are real processes talking over a real Unix socket. The
protocol tests give the server a small target in place of the rank (a script written
per test); the last test runs a real PPO plan under mpirun with every rank forked from a
real server (``python -m hetrun.runtime.warm_start``), which must end bit-identical to
the same plan started cold. tests/test_node_death_slurm.py checks that the ranks of a
restart inside a Slurm allocation fork from the servers the batch script started.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hetrun.runtime.warm_start import FORKED_ENV, SOCKET_ENV, SWITCH_ENV
from resume_compare import assert_same_checkpoints, example_spec, plan_dict
from test_resume_exact import events, mpirun

SERVER = r"""
import os, signal, sys, time
from hetrun.runtime.warm_start import WarmServer

def target(args):
    what = args[0] if args else ""
    got = []
    if what == "usr1":  # before the first line: the test signals once it has read it
        signal.signal(signal.SIGUSR1, lambda *_: got.append(1))
    out = {"pid": os.getpid(), "args": args, "cwd": os.getcwd(), "foo": os.environ.get("FOO"),
           "forked": os.environ.get("HETRUN_WARM_FORKED") is not None, "ppid": os.getppid()}
    print(__import__("json").dumps(out), flush=True)
    sys.stderr.write("on stderr\n")
    if what == "usr1":
        deadline = time.time() + 20
        while not got and time.time() < deadline:
            time.sleep(0.01)
        return 42 if got else 1
    if what == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if what == "sleep":
        time.sleep(60)
    if what == "raise":
        raise SystemExit(7)
    return 3

WarmServer(sys.argv[1], target).serve()
"""
REQUESTER = "import sys\nfrom hetrun.runtime.warm_start import run_warm\nr = run_warm(sys.argv[1:])\n" \
            "print('cold' if r is None else f'warm {r}', flush=True)\nsys.exit(0 if r is None else r)\n"


@pytest.fixture
def server(tmp_path: Path):  # type: ignore[no-untyped-def]
    (tmp_path / "server.py").write_text(SERVER)
    (tmp_path / "requester.py").write_text(REQUESTER)
    sock = tmp_path / "warm.sock"
    proc = subprocess.Popen([sys.executable, str(tmp_path / "server.py"), str(sock)],
                            stdout=open(tmp_path / "server.log", "wb"), stderr=subprocess.STDOUT)  # noqa: SIM115
    deadline = time.time() + 30
    while not sock.exists() and time.time() < deadline:
        time.sleep(0.02)
    assert sock.exists(), (tmp_path / "server.log").read_text()
    yield proc, sock
    proc.kill()
    proc.wait()


def _request(tmp_path: Path, sock: Path, *args: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(tmp_path / "requester.py"), *args], cwd=tmp_path,
                            env={**os.environ, SOCKET_ENV: str(sock), **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _gone(pid: int, timeout: float = 10) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        # A zombie child of the server counts as gone once the server reaps it.
        time.sleep(0.02)
    return False


def test_the_child_takes_over_args_env_cwd_and_the_requesters_output(tmp_path: Path, server) -> None:  # type: ignore[no-untyped-def]
    _, sock = server
    req = _request(tmp_path, sock, "a", "b c", FOO="bar")
    out, err = req.communicate(timeout=30)
    assert req.returncode == 3, (out, err)
    child = json.loads(out.splitlines()[0])
    assert child["args"] == ["a", "b c"] and child["foo"] == "bar" and child["forked"], child
    assert child["cwd"] == str(tmp_path) and child["pid"] != req.pid, child
    assert "on stderr" in err and out.splitlines()[-1] == "warm 3", (out, err)
    # A SystemExit in the child is its exit code.
    req = _request(tmp_path, sock, "raise")
    req.communicate(timeout=30)
    assert req.returncode == 7


def test_signals_reach_the_child_and_a_killed_child_kills_its_requester(tmp_path: Path, server) -> None:  # type: ignore[no-untyped-def]
    _, sock = server
    req = _request(tmp_path, sock, "usr1")
    first = req.stdout.readline()  # type: ignore[union-attr]
    assert json.loads(first)["args"] == ["usr1"]  # written once the child's handler is set
    req.send_signal(signal.SIGUSR1)
    req.communicate(timeout=30)
    assert req.returncode == 42  # the child saw the signal
    req = _request(tmp_path, sock, "kill")
    req.communicate(timeout=30)
    assert req.returncode == -signal.SIGKILL  # srun sees the task killed, as before


def test_a_requester_killed_takes_its_child_with_it(tmp_path: Path, server) -> None:  # type: ignore[no-untyped-def]
    _, sock = server
    req = _request(tmp_path, sock, "sleep")
    child = json.loads(req.stdout.readline())["pid"]  # type: ignore[union-attr]
    os.kill(child, signal.SIGSTOP)  # a hung rank: only the server can end it
    req.kill()
    req.wait()
    assert _gone(child), "the rank outlived its requester (srun's task)"


def test_no_server_or_switched_off_starts_cold(tmp_path: Path, server) -> None:  # type: ignore[no-untyped-def]
    _, sock = server
    for env in ({SWITCH_ENV: "0"}, {SOCKET_ENV: str(tmp_path / "none.sock")}, {SOCKET_ENV: ""}):
        req = _request(tmp_path, sock, "x", **env)
        out, err = req.communicate(timeout=30)
        assert (req.returncode, out.strip()) == (0, "cold"), (env, out, err)


def test_a_stopped_server_waits_for_its_ranks_and_a_second_one_refuses(tmp_path: Path, server) -> None:  # type: ignore[no-untyped-def]
    proc, sock = server
    second = subprocess.run([sys.executable, str(tmp_path / "server.py"), str(sock)],
                            capture_output=True, text=True, timeout=60)
    assert second.returncode != 0 and "another warm server answers" in second.stderr, second.stderr
    req = _request(tmp_path, sock, "usr1")
    json.loads(req.stdout.readline())  # type: ignore[union-attr]
    proc.send_signal(signal.SIGTERM)  # Slurm signals every step at a time limit
    deadline = time.time() + 30
    while sock.exists() and time.time() < deadline:
        time.sleep(0.05)
    assert not sock.exists(), "a stopping server takes no new requests"
    time.sleep(0.3)
    assert proc.poll() is None, "the server left while its rank ran (the rank dies with it)"
    req.send_signal(signal.SIGUSR1)
    req.communicate(timeout=30)
    assert req.returncode == 42
    assert proc.wait(timeout=10) == 0


def test_a_stale_socket_is_replaced(tmp_path: Path) -> None:
    import socket as socketlib

    (tmp_path / "server.py").write_text(SERVER)
    sock = tmp_path / "warm.sock"
    stale = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
    stale.bind(str(sock))  # bound, never listening: what a dead server leaves
    stale.close()
    proc = subprocess.Popen([sys.executable, str(tmp_path / "server.py"), str(sock)], stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 30
        while time.time() < deadline and proc.poll() is None:
            probe = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
            try:
                probe.connect(str(sock))
                break
            except OSError:
                time.sleep(0.05)
            finally:
                probe.close()
        assert proc.poll() is None, proc.stderr.read()  # type: ignore[union-attr]
        assert oct(sock.stat().st_mode & 0o777) == oct(0o600)
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.mpi
@pytest.mark.slow
def test_ranks_forked_from_a_warm_server_end_bit_identical_to_cold_ones(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    iterations = 6
    spec = example_spec("ppo_cartpole", workload_args={"num_envs": 2, "num_steps": 32, "eval_episodes": 1},
                        training={"iterations": iterations, "eval_interval": 3},
                        checkpoint={"interval": 3, "keep": 3})
    runs = {}
    for name in ("cold", "warm"):
        runs[name] = tmp_path / name
        runs[name].mkdir()
        (runs[name] / "plan.json").write_text(json.dumps(plan_dict(spec)))
    monkeypatch.setenv("HETRUN_MEMORY_DIR", str(tmp_path / "mem"))
    cold = mpirun(runs["cold"], 0)
    assert cold.wait(timeout=300) == 0, (runs["cold"] / "mpirun-0.log").read_text()[-3000:]

    sock = tmp_path / "warm.sock"
    server = subprocess.Popen([sys.executable, "-m", "hetrun.runtime.warm_start", str(runs["warm"])],
                              env={**os.environ, SOCKET_ENV: str(sock)},
                              stdout=open(tmp_path / "server.log", "wb"), stderr=subprocess.STDOUT)  # noqa: SIM115
    try:
        deadline = time.time() + 120
        while not sock.exists() and time.time() < deadline and server.poll() is None:
            time.sleep(0.05)
        log = (tmp_path / "server.log").read_text()
        assert sock.exists(), log
        assert "not preloaded" not in log, log  # the plan's workload module was imported too
        monkeypatch.setenv(SOCKET_ENV, str(sock))
        warm = mpirun(runs["warm"], 0)
        assert warm.wait(timeout=300) == 0, (runs["warm"] / "mpirun-0.log").read_text()[-3000:]
    finally:
        server.terminate()
        server.wait(timeout=30)
    starts = [e for e in events(runs["warm"]) if e.get("ev") == "startup"]
    plan = json.loads((runs["cold"] / "plan.json").read_text())
    ranks = {c["name"]: c["ntasks"] for c in plan["components"]}
    assert len(starts) == sum(ranks.values()) and all(e["warm_start"] for e in starts), starts
    # Forked: no interpreter start, no torch import of its own. Judged by the rank's own CPU
    # seconds at its startup event (a forked child's count starts at the fork), not by wall time,
    # which the suite's load stretched past 1 s once (a cold rank spends 1.7-1.8 CPU-s here).
    cold_cpu = [e["cpu_s"] for e in events(runs["cold"]) if e.get("ev") == "startup"]
    assert all(e["cpu_s"] < 1.0 for e in starts) and min(cold_cpu) > max(e["cpu_s"] for e in starts), \
        (starts, cold_cpu)
    assert not any(e["warm_start"] for e in events(runs["cold"]) if e.get("ev") == "startup")
    assert_same_checkpoints(runs["cold"], runs["warm"], ranks, iterations)
    assert FORKED_ENV not in os.environ
