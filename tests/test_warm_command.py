"""runtime/warm_command.py: a command component's Python program forked from the node's warm
server runs as it would in its own interpreter (argv, __main__, sys.path[0], environment, working
directory, exit code, an uncaught exception's traceback and code 1), in both the ``SCRIPT`` and
the ``-m MODULE`` forms; with no server it starts cold in the requester's own process; only
``python SCRIPT`` / ``python -m MODULE`` of this interpreter is wrapped. A real server process, a
real Unix socket, real requesters."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hetrun.runtime.warm_command import python_program, wrapped

from hetrun.rundir import WARM_SOCKET_ENV

PROGRAM = r"""
import json, os, sys
out = {"argv": sys.argv, "name": __name__, "path0": sys.path[0], "path1": sys.path[1], "cwd": os.getcwd(),
       "foo": os.environ.get("FOO"), "forked": "HETRUN_WARM_FORKED" in os.environ,
       "torch_before": "torch" in sys.modules}
print(json.dumps(out), flush=True)
if sys.argv[-1] == "raise":
    raise ValueError("boom")
sys.exit(int(sys.argv[-1]))
"""


@pytest.fixture
def server(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A warm server as the batch script starts one (its target: warm_start._run_rank), with
    torch imported first as ``preload`` imports it."""
    sock = tmp_path / "warm.sock"
    code = ("import sys, torch\nfrom hetrun.runtime.warm_start import WarmServer, _run_rank\n"
            "WarmServer(sys.argv[1], _run_rank).serve()\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(sock)],
                            stdout=open(tmp_path / "server.log", "wb"), stderr=subprocess.STDOUT)  # noqa: SIM115
    deadline = time.time() + 60
    while not sock.exists() and time.time() < deadline:
        time.sleep(0.02)
    assert sock.exists(), (tmp_path / "server.log").read_text()
    yield sock
    proc.kill()
    proc.wait()


def _run(tmp_path: Path, sock: Path | None, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FOO": "bar"}
    env.pop(WARM_SOCKET_ENV, None)
    if sock is not None:
        env[WARM_SOCKET_ENV] = str(sock)
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    return subprocess.run([sys.executable, "-m", "hetrun.runtime.warm_command", sys.executable, *argv],
                          cwd=work, env=env, capture_output=True, text=True, timeout=60, check=False)


def test_a_script_and_a_module_run_forked_as_in_their_own_interpreter(tmp_path: Path, server) -> None:  # type: ignore[no-untyped-def]
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "prog.py").write_text(PROGRAM)
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "progmod.py").write_text(PROGRAM)
    got = _run(tmp_path, server, str(scripts / "prog.py"), "a", "5")
    assert got.returncode == 5, got.stderr
    out = json.loads(got.stdout)
    assert out["forked"] and out["torch_before"], out  # forked from the server, torch there already
    assert out["argv"] == [str(scripts / "prog.py"), "a", "5"] and out["name"] == "__main__", out
    assert out["path0"] == str(scripts) and out["cwd"] == str(tmp_path / "work") and out["foo"] == "bar", out
    cold = _run(tmp_path, None, str(scripts / "prog.py"), "a", "5")
    assert json.loads(cold.stdout)["path1"] == out["path1"], (cold.stdout, out)  # no entry of the server's
    got = _run(tmp_path, server, "-m", "progmod", "b", "0")
    assert got.returncode == 0, got.stderr
    out = json.loads(got.stdout)
    assert out["forked"] and out["name"] == "__main__", out
    assert out["argv"] == [str(tmp_path / "work" / "progmod.py"), "b", "0"], out
    assert out["path0"] == str(tmp_path / "work"), out
    raised = _run(tmp_path, server, str(scripts / "prog.py"), "raise")
    assert raised.returncode == 1 and "ValueError: boom" in raised.stderr, raised.stderr


def test_no_server_starts_the_program_cold_in_the_requesters_process(tmp_path: Path) -> None:
    (tmp_path / "prog.py").write_text(PROGRAM)
    got = _run(tmp_path, tmp_path / "no-such.sock", str(tmp_path / "prog.py"), "7")
    assert got.returncode == 7, got.stderr
    out = json.loads(got.stdout)
    assert not out["forked"] and not out["torch_before"] and out["argv"] == [str(tmp_path / "prog.py"), "7"], out


def test_only_this_interpreters_plain_script_or_module_form_is_wrapped(tmp_path: Path) -> None:
    py = sys.executable
    assert python_program([py, "train.py", "--x"], py) and python_program(["python", "-m", "pkg.mod"], py)
    assert not python_program([py, "-u", "train.py"], py)  # interpreter options: cold, as written
    assert not python_program([py, "-m"], py) and not python_program([py], py)
    assert not python_program(["bash", "run.sh"], "/bin/bash")
    on = {WARM_SOCKET_ENV: str(tmp_path / "s.sock")}
    assert wrapped([py, "t.py", "1"], py, on) == [py, "-m", "hetrun.runtime.warm_command", py, "t.py", "1"]
    assert wrapped([py, "t.py"], py, {}) == [py, "t.py"]  # no warm servers in this job
    assert wrapped([py, "t.py"], py, {**on, "HETRUN_WARM_START": "0"}) == [py, "t.py"]
    assert wrapped(["bash", "run.sh"], "/bin/bash", on) == ["/bin/bash", "run.sh"]
