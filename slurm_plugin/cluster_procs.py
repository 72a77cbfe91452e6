"""Process helpers for the local cluster's daemons: liveness by pid, start, stop, wait.

A daemon counts as alive only when its pid exists *and* runs the expected
executable (and, for slurmd, the expected node name), so a stale pid file that
now names an unrelated process is never mistaken for a daemon, nor killed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from hetrun.errors import SlurmError


def read_pid(pid_file: Path) -> int | None:
    try:
        text = pid_file.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def process_matches(pid: int | None, exe: str, arg: str | None = None) -> bool:
    """True when ``pid`` is a live process running ``exe`` (and has ``arg`` in its argv)."""
    if not pid or pid <= 0:
        return False
    try:
        real = os.readlink(f"/proc/{pid}/exe")
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    if state == "Z":
        return False
    if real.removesuffix(" (deleted)") != os.path.realpath(exe):
        return False
    return arg is None or arg.encode() in argv


def find_pids(exe: str, arg: str | None = None) -> list[int]:
    """All live processes running ``exe`` (with ``arg`` in argv), found by scanning /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and process_matches(int(entry), exe, arg):
            found.append(int(entry))
    return sorted(found)


def wait_for(predicate: Callable[[], bool], timeout: float, what: str, log: Path | None) -> None:
    deadline = time.monotonic() + timeout
    delay = 0.05
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(delay)
        delay = min(delay * 1.5, 0.5)
    tail = ""
    if log is not None and log.exists():
        lines = log.read_text(errors="replace").splitlines()[-15:]
        tail = "\n  last lines of " + str(log) + ":\n    " + "\n    ".join(lines)
    raise SlurmError(
        f"local cluster: {what} did not come up within {timeout:.0f} s{tail}",
        hint="read the log named above; `hetrun cluster down && hetrun cluster up` retries from scratch",
    )


def run_checked(
    argv: Sequence[str], *, env: dict[str, str] | None = None, timeout: float = 60, what: str
) -> str:
    """Run a set-up command; a failure becomes a SlurmError naming the command and its output."""
    try:
        proc = subprocess.run(
            list(argv), env=env, capture_output=True, text=True, timeout=timeout,
            stdin=subprocess.DEVNULL, check=False,
        )
    except FileNotFoundError as exc:
        raise SlurmError(
            f"local cluster: {what}: {argv[0]} is not installed",
            hint="run scripts/setup.sh (installs slurm-wlm, munge, slurmdbd, mariadb-server, openmpi)",
        ) from exc
    except subprocess.TimeoutExpired as exc:
        raise SlurmError(f"local cluster: {what}: `{' '.join(argv)}` timed out after {timeout} s") from exc
    if proc.returncode != 0:
        raise SlurmError(
            f"local cluster: {what}: `{' '.join(argv)}` exited {proc.returncode}: "
            f"{(proc.stderr or proc.stdout).strip()[-800:]}"
        )
    return proc.stdout


def spawn_detached(argv: Sequence[str], *, env: dict[str, str], log: Path) -> int:
    """Start a foreground daemon in its own session so it outlives us; returns its pid."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            list(argv), env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
            start_new_session=True, close_fds=True,
        )
    return proc.pid


def stop_pid(pid: int, exe: str, arg: str | None = None, timeout: float = 20) -> bool:
    """SIGTERM ``pid`` if it still runs ``exe``; SIGKILL after ``timeout``. True if it was running."""
    if not process_matches(pid, exe, arg):
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not process_matches(pid, exe, arg):
            _reap(pid)
            return True
        _reap(pid)
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    time.sleep(0.2)
    _reap(pid)
    return True


def _reap(pid: int) -> None:
    # Daemons we spawned in this process are our children until they exit.
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)
