"""The local backend: no Slurm; each component becomes a local process group.

``submit`` starts a small supervisor (this module run as ``python -m``) in its
own session. The supervisor runs every rank of every component at once, as
one ``mpirun`` MPMD launch with one app context per component and
``-x HETRUN_COMPONENT=<name>`` (one MPI_COMM_WORLD, like the Slurm het step),
or, when ``mpirun`` is absent and the job has a single rank, as one plain
process (the runtime's MPI world is then a singleton; several ranks without
mpirun would each see a world of one, so that is refused). It plays
the batch script's part: forwards USR1/TERM, and after each attempt runs the
same post-mortem as the batch script (``hetrun.slurm_plugin.postmortem``:
names a dead rank from mpirun's report, writes ``rank_failure`` and
``attempt_end``, applies ``preemption.max_preemptions`` / ``max_failures``),
restarts when it says so (HETRUN_RESTART_COUNT tells the runtime it is a
restart), and records the outcome in ``<run_dir>/local.json``. mpirun's own
messages of attempt N go to ``logs/mpirun-N.err`` (and the supervisor's log).

``run.json`` keeps the supervisor's pid and its start time from /proc, so
status and cancel never mistake a recycled pid for the run.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hetrun.errors import SlurmError
from hetrun.planfile import read_plan

from ..postmortem import REQUEUE_EXIT_CODE, TERM_EXIT_CODE, finish_attempt
from ..rundir import LOGS, RunInfo, read_run, restart_base, utc_now_iso, write_atomic
from .base import Backend, ComponentStatus, DryRun, RunStatus

if TYPE_CHECKING:
    from hetrun.dag.plan import Plan

STATE_FILE = "local.json"
# Open MPI as root, and over loopback only (the machine's other interfaces may
# not route between its own ranks). Set only when the user has not.
_OMPI_DEFAULTS = {
    "OMPI_MCA_btl": "self,tcp",
    "OMPI_MCA_btl_tcp_if_include": "lo",
    "OMPI_MCA_oob_tcp_if_include": "lo",
}
_ROOT_DEFAULTS = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
_STOP_GRACE_S = 10.0
# Exit codes of a rank that stopped as asked (done, requeue after the warning, SIGTERM'd),
# not of one that failed.
_STOP_CODES = (0, REQUEUE_EXIT_CODE, TERM_EXIT_CODE, -signal.SIGTERM)


def proc_start_ticks(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat (start time in clock ticks); None if gone or a zombie."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    fields = raw[raw.rfind(")") + 2:].split()
    if fields[0] == "Z":
        return None
    return int(fields[19])


def _plan_components(run_dir: Path) -> tuple[list[tuple[str, int]], dict[str, Any]]:
    """(the action components' names and rank counts, plan.json as read) through the one reader."""
    plan = read_plan(run_dir)  # RunDirError names a missing or damaged plan.json
    return [(c.name, c.ntasks) for c in plan.action_components], dict(plan.raw)


def _log_wrapper(python: str, run_dir: Path, component: str, rank_var: str) -> list[str]:
    """argv that runs the runtime with its output in logs/<component>-local-<rank>.out.

    Values travel as positional parameters ($0..$3), never pasted into the
    shell text, so no quoting is involved.
    """
    script = (f'exec "$0" -m hetrun.runtime "$1" >>"$1/{LOGS}/$2-local-${{{rank_var}:-0}}.out" 2>&1')
    return ["sh", "-c", script, python, str(run_dir), component]


def plan_components(plan: Mapping[str, Any], *, commands: bool = False) -> list[tuple[str, int]]:
    """(component name, number of ranks) in het-group order, from a plan.json dict:
    the components that run actions, or (``commands``) those that run a command."""
    return [(str(c["name"]), int(c.get("ntasks") or int(c["nodes"]) * int(c["tasks_per_node"])))
            for c in plan["components"] if (c.get("command") is not None) == commands]


# Values travel as positional parameters, never pasted into the shell text.
_COMMAND_WRAPPER = ('py="$0"; rd="$1"; c="$2"; shift 2; exec "$py" -m hetrun.runtime.command_rank "$rd" "$c" -- "$@" '
                    f'>>"$rd/{LOGS}/$c-local-${{HETRUN_COMMAND_RANK:-0}}.out" 2>&1')


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports free on every local address now (the kernel's choice).

    The sockets are held together so that no two of the ports are the same, and closed
    before the ranks start; the port is then free unless another program takes it in
    that instant, the same window torchrun's ``--standalone`` accepts."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) for _ in range(count)]
        for s in socks:
            s.bind(("", 0))
        return [int(s.getsockname()[1]) for s in socks]


def command_processes(run_dir: Path, plan: Mapping[str, Any], python: str | None = None,
                      ports: Sequence[int] | None = None) -> list[tuple[list[str], dict[str, str]]]:
    """(argv, extra environment) of every rank of every command component: plain processes on
    this host, each through ``hetrun.runtime.command_rank`` (torchrun's variables, the user's argv).

    ``ports``: one MASTER_PORT per command component, in order (``HETRUN_COMMAND_PORT``; the
    supervisor picks free ones per attempt, so that two local runs at once never share one).
    Without it command_rank derives the port (the dry run)."""
    python = python or sys.executable
    out = []
    commands = [c for c in plan["components"] if c.get("command") is not None]
    if ports is not None and len(ports) != len(commands):
        raise ValueError(f"{len(ports)} ports for {len(commands)} command components")
    for k, c in enumerate(commands):
        ntasks = int(c.get("ntasks") or int(c["nodes"]) * int(c["tasks_per_node"]))
        argv = ["sh", "-c", _COMMAND_WRAPPER, python, str(run_dir), str(c["name"]), *map(str, c["command"])]
        port = {} if ports is None else {"HETRUN_COMMAND_PORT": str(ports[k])}
        out += [(argv, {"HETRUN_COMMAND_RANK": str(r), **port}) for r in range(ntasks)]
    return out


def launch_commands(run_dir: Path, comps: Sequence[tuple[str, int]], python: str | None = None,
                    mpirun: str | None = None) -> tuple[str, list[list[str]]]:
    """("mpirun", [argv]) or ("processes", [argv per rank]) for the run's components."""
    python = python or sys.executable
    mpirun = mpirun if mpirun is not None else shutil.which("mpirun")
    if mpirun:
        # --bind-to none: with at most 2 ranks Open MPI pins each rank to one core by default, so a
        # learner could never use the core its rollout leaves idle while it waits for weights
        # (learner_threads: auto read a 1-CPU mask). The ranks share this host; the OS places them.
        argv = [mpirun, "--oversubscribe", "--bind-to", "none"]
        for i, (name, ntasks) in enumerate(comps):
            if i:
                argv.append(":")
            argv += ["-x", f"HETRUN_COMPONENT={name}", "-np", str(ntasks),
                     *_log_wrapper(python, run_dir, name, "OMPI_COMM_WORLD_RANK")]
        return "mpirun", [argv]
    total = sum(n for _, n in comps)
    if total != 1:
        raise SlurmError(
            f"the local backend needs Open MPI's mpirun to start {total} ranks "
            f"({', '.join(f'{n}={k}' for n, k in comps)}), and mpirun is not on PATH",
            hint="install Open MPI (apt-get install openmpi-bin) or submit to Slurm with --backend sbatch",
        )
    # No launcher sets a rank variable: the log name falls back to rank 0.
    return "processes", [_log_wrapper(python, run_dir, comps[0][0], "HETRUN_NO_RANK")]


def _epoch(iso: str) -> float:
    return datetime.strptime(iso, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()


# Set by Open MPI/PMIx in a process that has initialised MPI itself (the
# in-process runtime, a test run, a notebook). They live in the C-level
# environment, which a child inherits when Popen is given no env=; a mpirun
# started with them believes it is a rank of that singleton and exits 1 at once.
_MPI_INHERITED_PREFIXES = (
    "PMIX_", "ORTE_", "OMPI_MCA_ess", "OMPI_MCA_orte_", "OMPI_MCA_pmix", "OMPI_APP_CTX_",
    "OMPI_COMM_WORLD_", "OMPI_UNIVERSE_SIZE", "OMPI_NUM_APP_CTX", "OMPI_FIRST_RANKS",
    "OMPI_FILE_LOCATION",
)


def launcher_env(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without the variables of an MPI world this process may belong to.

    Users' own Open MPI settings (``OMPI_MCA_btl*``, ``OMPI_ALLOW_RUN_AS_ROOT``...) stay.
    """
    return {k: v for k, v in environ.items() if not k.startswith(_MPI_INHERITED_PREFIXES)}


def _job_env(plan: Mapping[str, Any], run_dir: Path, restarts: int) -> dict[str, str]:
    env = launcher_env(os.environ)
    for k, v in (plan.get("env") or {}).items():
        env[str(k)] = str(v)
    for k, v in _OMPI_DEFAULTS.items():
        env.setdefault(k, v)
    if os.geteuid() == 0:
        for k, v in _ROOT_DEFAULTS.items():
            env.setdefault(k, v)
    env["HETRUN_RUN_DIR"] = str(run_dir)
    env["HETRUN_RESTART_COUNT"] = str(restarts)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _shell_code(returncode: int) -> int:
    """A child's exit status as a shell reports it: death by signal N reads as 128+N."""
    return returncode if returncode >= 0 else 128 - returncode


class _Supervisor:
    """Runs one local job to its end; the batch script's role for the local backend."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.children: list[subprocess.Popen[bytes]] = []
        self.cancelled = False
        self.requeue_asked = False
        self.warned: str | None = None  # the warning signal forwarded in this attempt (USR1/USR2)
        self.state: dict[str, Any] = {}

    def _write(self, **changes: Any) -> None:
        self.state.update(changes)
        write_atomic(self.run_dir / STATE_FILE, json.dumps(self.state, indent=2, sort_keys=True) + "\n")

    def _signal_children(self, sig: int) -> None:
        for child in self.children:
            if child.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(child.pid, sig)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        if signum in (signal.SIGTERM, signal.SIGINT):
            self.cancelled = True
            self._signal_children(signal.SIGTERM)
        elif signum == signal.SIGHUP:
            # `hetrun` requeue: stop this attempt and start the next one.
            self.requeue_asked = True
            self._signal_children(signal.SIGTERM)
        else:  # USR1/USR2: the preemption warning, as Slurm's --signal would send it
            self.warned = signal.Signals(signum).name.removeprefix("SIG")
            self._signal_children(signum)

    def _start(self, restarts: int) -> str:
        comps, plan = _plan_components(self.run_dir)
        # HETRUN_LOCAL_PYTHON: the interpreter for the ranks, when it is not the supervisor's.
        python = os.environ.get("HETRUN_LOCAL_PYTHON")
        env = _job_env(plan, self.run_dir, restarts)
        launcher, runs = "processes", []  # type: tuple[str, list[tuple[list[str], dict[str, str]]]]
        if comps:
            launcher, cmds = launch_commands(self.run_dir, comps, python)
            runs = [(argv, {"HETRUN_COMPONENT": comps[0][0]} if launcher == "processes" else {}) for argv in cmds]
        # A free MASTER_PORT per command component and attempt: outside Slurm no job id tells
        # two runs on this host apart (a fixed port made the second one fail with EADDRINUSE).
        runs += command_processes(self.run_dir, plan, python, ports=free_ports(len(plan_components(plan, commands=True))))
        self.children = []
        with self._launcher_log(restarts).open("wb") as err:
            for argv, extra in runs:
                # Own process group: signals reach mpirun and every rank it started.
                self.children.append(subprocess.Popen(argv, env={**env, **extra}, cwd=self.run_dir, stderr=err,
                                                      stdin=subprocess.DEVNULL, start_new_session=True))
        return launcher

    def _launcher_log(self, restarts: int) -> Path:
        return self.run_dir / LOGS / f"mpirun-{restarts}.err"

    def _wait(self) -> int:
        deadline = None
        failed_rc = None  # the first failing child's code: it names the attempt, not the peers it ended
        while True:
            codes = [c.poll() for c in self.children]
            if all(code is not None for code in codes):
                break
            if failed_rc is None and not (self.cancelled or self.requeue_asked):
                failed_rc = next((code for code in codes if code not in (None, *_STOP_CODES)), None)
                if failed_rc is not None:
                    # As the batch script's srun reader on Slurm (render.srun_reader): a rank that
                    # failed ends the others now (an evaluator waiting for checkpoints, peers in a
                    # collective), not at their own timeouts. SIGKILL, not TERM: survivors would
                    # take a TERM for a preemption and checkpoint past the failure; the newest
                    # checkpoint before it stays the restore point.
                    self._signal_children(signal.SIGKILL)
            if (self.cancelled or self.requeue_asked) and deadline is None:
                deadline = time.monotonic() + _STOP_GRACE_S
            if deadline is not None and time.monotonic() > deadline:
                self._signal_children(signal.SIGKILL)
            time.sleep(0.2)
        if failed_rc is not None:
            return _shell_code(failed_rc)
        # Like srun: the highest exit code wins.
        return max(_shell_code(ch.returncode) for ch in self.children)

    def _finish(self, restarts: int, rc: int, launcher: str) -> tuple[bool, dict[str, Any]]:
        """The post-mortem of one attempt (the batch script's, in-process)."""
        text = self._launcher_log(restarts).read_text(errors="replace")
        sys.stderr.write(text)
        forced, why = None, ""
        if self.cancelled:
            forced, why = "cancelled", "cancelled (SIGTERM/SIGINT to the supervisor)"
        elif self.requeue_asked:
            forced, why = "preempted", "requeue asked (hetrun requeue: SIGHUP to the supervisor)"
        requeue, rec = finish_attempt(self.run_dir, restart=restarts, exit_code=rc, launcher="mpirun",
                                      log_text=text if launcher == "mpirun" else "", trapped=self.warned,
                                      forced=forced, forced_reason=why)
        sys.stderr.write(f"hetrun: attempt {restarts} ended: {rec['outcome']}: {rec['reason']}\n")
        sys.stderr.flush()
        self._write(outcome=rec["outcome"], reason=rec["reason"], failed_ranks=rec["failed_ranks"])
        return requeue and not self.cancelled, rec

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(sig, self._on_signal)
        restarts = restart_base(_plan_components(self.run_dir)[1])  # `hetrun resume` counts on
        self._write(state="RUNNING", supervisor_pid=os.getpid(), started_at=utc_now_iso(),
                    restarts=restarts, exit_code=None, ended_at=None)
        while True:
            if self.cancelled:  # cancelled between attempts, or before the first started
                self._write(state="CANCELLED", ended_at=utc_now_iso())
                return 143
            launcher = self._start(restarts)
            self._write(state="RUNNING", launcher=launcher, restarts=restarts,
                        child_pids=[c.pid for c in self.children])
            rc = self._wait()
            requeue, rec = self._finish(restarts, rc, launcher)
            if self.cancelled:
                self._write(state="CANCELLED", exit_code=rc, ended_at=utc_now_iso())
                return rc
            if requeue:
                self.requeue_asked, self.warned = False, None
                restarts += 1
                self._write(state="REQUEUED", exit_code=rc)
                continue
            final = "COMPLETED" if rec["outcome"] == "done" else "FAILED"
            self._write(state=final, exit_code=rc, ended_at=utc_now_iso())
            return rc


class LocalBackend(Backend):
    name = "local"

    def __init__(self, python: str | None = None) -> None:
        self.python = python or sys.executable

    def _supervisor_argv(self, run: RunInfo) -> list[str]:
        return [self.python, "-m", "hetrun.slurm_plugin.backends.local", str(run.path)]

    def dry_run(self, run: RunInfo, script: str, plan: Plan) -> DryRun:
        data = plan.model_dump(mode="json")  # what plan.json will hold, as the supervisor reads it
        comps = plan_components(data)
        launcher, cmds = launch_commands(run.path, comps, self.python) if comps else ("processes", [])
        cmds += [[*(f"{k}={v}" for k, v in extra.items()), *argv]
                 for argv, extra in command_processes(run.path, data, self.python)]
        notes = [f"launcher: {launcher}; hetjob.sbatch is written for the record only"]
        return DryRun(self.name, self._supervisor_argv(run), script,
                      notes + ["the supervisor runs: " + shlex.join(c) for c in cmds])

    def submit(self, run: RunInfo) -> str:
        log = open(run.path / LOGS / "local-supervisor.out", "ab")  # noqa: SIM115 - handed to the child
        try:
            # env= given explicitly: without it the child inherits the C-level
            # environment, MPI's variables included (see launcher_env).
            proc = subprocess.Popen(self._supervisor_argv(run), cwd=run.path, stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                    env=launcher_env(os.environ))
        finally:
            log.close()
        ticks = proc_start_ticks(proc.pid)
        run.pids = {"supervisor": proc.pid, "start_ticks": ticks}
        return f"local-{proc.pid}"

    def _alive(self, run: RunInfo) -> bool:
        pid = run.pids.get("supervisor")
        if not isinstance(pid, int):
            return False
        ticks = proc_start_ticks(pid)
        return ticks is not None and ticks == run.pids.get("start_ticks")

    @staticmethod
    def _state(run: RunInfo) -> dict[str, Any]:
        try:
            data = json.loads((run.path / STATE_FILE).read_text())
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def status(self, runs: Sequence[RunInfo]) -> dict[str, RunStatus]:
        out = {}
        for run in runs:
            st = self._state(run)
            alive = self._alive(run)
            state = str(st.get("state") or ("PENDING" if alive else "UNKNOWN"))
            reason = ""
            if state in ("RUNNING", "REQUEUED", "PENDING") and not alive:
                state, reason = "FAILED", "local supervisor is gone"
            elapsed = None
            if st.get("started_at"):
                end = _epoch(st["ended_at"]) if st.get("ended_at") else time.time()
                elapsed = max(0, int(end - _epoch(st["started_at"])))
            comps = [ComponentStatus(name=c, state=state, job_id=run.job_id, nodes="localhost",
                                     elapsed_s=elapsed, restarts=int(st.get("restarts") or 0),
                                     reason=reason, exit_code=st.get("exit_code"))
                     for c in run.components]
            out[run.run_dir] = RunStatus(run, comps, "local")
        return out

    def _signal(self, run: RunInfo, sig: int, what: str) -> None:
        if not self._alive(run):
            raise SlurmError(f"cannot {what} {run.run_dir}: its local supervisor is not running",
                             hint="it has already ended; see `hetrun status`")
        os.kill(int(run.pids["supervisor"]), sig)

    def cancel(self, run: RunInfo) -> None:
        self._signal(run, signal.SIGTERM, "cancel")

    def requeue(self, run: RunInfo) -> None:
        self._signal(run, signal.SIGHUP, "requeue")

    def preempt(self, run: RunInfo, signal_name: str) -> str:
        # The supervisor forwards it to every rank, as the batch shell forwards Slurm's warning.
        self._signal(run, getattr(signal, f"SIG{signal_name}"), "preempt")
        return f"the local supervisor (pid {run.pids['supervisor']})"

    def accounting(self, run: RunInfo) -> list[dict[str, Any]]:
        st = self._state(run)
        return [{"component": c, "state": st.get("state"), "exit_code": st.get("exit_code"),
                 "restarts": st.get("restarts"), "started_at": st.get("started_at"),
                 "ended_at": st.get("ended_at")} for c in run.components]


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        sys.stderr.write("usage: python -m hetrun.slurm_plugin.backends.local RUN_DIR\n")
        return 2
    run_dir = Path(args[0]).resolve()
    read_run(run_dir)  # refuse anything that is not a run directory
    return _Supervisor(run_dir).run()


if __name__ == "__main__":
    sys.exit(main())
