"""One rank of a command component: torchrun's variables, then the user's program.

    python -m hetrun.runtime.command_rank RUN_DIR COMPONENT -- ARGV...

The sbatch script runs this under one ``srun --het-group=N`` step per command
component (the local backend: one process per rank). It sets, scoped to the
component, what torchrun would: ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``MASTER_ADDR`` (the component's first
node), ``MASTER_PORT`` (``command_port``: one per job and component; the local backend's
free port, ``HETRUN_COMMAND_PORT``, where it is set), plus
``HETRUN_RUN_DIR``, ``HETRUN_COMPONENT``, ``HETRUN_COMPONENT_INDEX``,
``HETRUN_GLOBAL_RANK`` (the rank in hetrun's numbering over all components,
what events and the post-mortem use) and ``HETRUN_COMPONENT_<NAME>_ADDR`` for
every component. hetrun starts no process group here: an unchanged
``init_process_group()`` makes its own.

The program runs as a child rather than by exec, so that this rank's end is
recorded whatever the program does: a ``start`` line when it starts, an
``exit`` line with its code, and a ``rank_failure`` line naming component,
rank, node and reason when it fails on its own (not found, non-zero exit,
killed by a signal that was not a stop). The stop signals (USR1/USR2, the
preemption warning; TERM/INT) reach the program once (``command_stop``: a
signal Slurm or the local supervisor already sent to the whole step is not
forwarded again); the program stops through the run API. A program without the
API has the warning ignored (so it does not kill it); one that does not stop
within the API's budget is ended at the hard deadline and a ``stop_ignored``
line says so (component, rank, how long, the work lost).

Imports nothing heavy: it is on every rank's start-up path.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from hetrun.runtime import command_stop, heartbeat, preempt, warm_command
from hetrun.runtime.api.env import PORT_BASE, PORT_SPAN, first_host, tasks_on_node
from hetrun.runtime.entry import env_time, process_start_time
from hetrun.runtime.events import EventLog
from hetrun.runtime.plan_view import PlanView, load_plan

from hetrun.rundir import RunPaths

# MASTER_PORT of component k of job J: PORT_BASE + (J * 32 + k) % PORT_SPAN (runtime/api/env.py:
# below the ephemeral ports). Components of one job never share a port (at most 32 components);
# jobs whose ids differ by less than 375 never do either. The run API's own choice for a plain
# srun step (env.master_port) is only used where no port is set.
NOT_FOUND_EXIT = 127


def command_port(job_id: str | None, index: int) -> int:
    """The component's MASTER_PORT under Slurm; 29500 (torchrun's default) + index without a
    job id (the local backend passes a free port instead: ``HETRUN_COMMAND_PORT``)."""
    digits = int(re.sub(r"\D", "", job_id or "") or 0)
    if not digits:
        return 29500 + index
    return PORT_BASE + (digits * 32 + index) % PORT_SPAN


def _given_port(environ: Mapping[str, str]) -> str | None:
    """The port the local backend's supervisor picked free for this component and attempt."""
    value = environ.get("HETRUN_COMMAND_PORT", "")
    return value if value.isdigit() and 0 < int(value) < 65536 else None


def _address(host: str | None, environ: Mapping[str, str]) -> str:
    """``host`` when it resolves; else the launch node's address (emulated nodes
    have no DNS entry and all live on the launching host)."""
    if host:
        try:
            socket.getaddrinfo(host, None)
            return host
        except OSError:
            pass
    return environ.get("SLURM_LAUNCH_NODE_IPADDR") or "127.0.0.1"


def _rank_in_component(environ: Mapping[str, str], ntasks: int) -> tuple[int, int, int, int, int]:
    """(rank, world, local rank, local world, node rank) within the component."""
    if environ.get("SLURM_STEP_ID") is not None and environ.get("SLURM_PROCID", "").isdigit():
        node = int(environ.get("SLURM_NODEID", "0"))
        local_world = tasks_on_node(environ.get("SLURM_STEP_TASKS_PER_NODE", ""), node) or 1
        world = int(environ.get("SLURM_STEP_NUM_TASKS") or ntasks)
        return (int(environ["SLURM_PROCID"]), world, int(environ.get("SLURM_LOCALID", "0")),
                local_world, node)
    # The local backend: every rank on this one host.
    rank = int(environ.get("HETRUN_COMMAND_RANK", "0"))
    return rank, ntasks, rank, ntasks, 0


def component_env(environ: Mapping[str, str], plan: PlanView, component: str,
                  run_dir: Path) -> dict[str, str]:
    """The variables a rank of ``component`` gets (pure: tested without Slurm)."""
    names = [c.name for c in plan.components]
    if component not in names:
        raise ValueError(f"no component {component!r} in the plan (components: {', '.join(names)})")
    index = names.index(component)
    sizes = [c.ntasks for c in plan.components]
    rank, world, local, local_world, node = _rank_in_component(environ, sizes[index])
    job = environ.get("HETRUN_JOB_ID") or environ.get("SLURM_JOB_ID")
    own_nodes = environ.get("SLURM_STEP_NODELIST") or environ.get(f"SLURM_JOB_NODELIST_HET_GROUP_{index}", "")
    out = {
        "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(local),
        "LOCAL_WORLD_SIZE": str(local_world), "GROUP_RANK": str(node),
        "MASTER_ADDR": environ.get("HETRUN_MASTER_ADDR") or _address(first_host(own_nodes), environ),
        "MASTER_PORT": _given_port(environ) or str(command_port(job, index)),
        "HETRUN_RUN_DIR": str(run_dir), "HETRUN_COMPONENT": component,
        "HETRUN_COMPONENT_INDEX": str(index), "HETRUN_GLOBAL_RANK": str(plan.first_rank(component) + rank),
    }
    for i, name in enumerate(names):
        nodes = own_nodes if i == index else environ.get(f"SLURM_JOB_NODELIST_HET_GROUP_{i}", "")
        out[f"HETRUN_COMPONENT_{name.upper()}_ADDR"] = _address(first_host(nodes), environ)
    return out


def _restart_count(environ: Mapping[str, str]) -> int:
    for key in ("SLURM_RESTART_COUNT", "HETRUN_RESTART_COUNT"):
        if environ.get(key, "").isdigit():
            return int(environ[key])
    return 0


def _log_path(run_dir: Path, component: str, comp_rank: int) -> str | None:
    """This rank's log: stderr itself when it is a file (local backend); under srun a pipe
    to slurmstepd, which writes ``logs/<component>-<jobid>-<task>.out`` (task = comp_rank)."""
    try:
        path = os.readlink("/proc/self/fd/2")
        if os.path.isfile(path):
            return path
    except OSError:
        pass
    found = [p for p in RunPaths(run_dir).logs.glob(f"{component}-*-{comp_rank}.out")
             if re.fullmatch(rf"{re.escape(component)}-\d+-{comp_rank}\.out", p.name)]
    return str(max(found, key=lambda p: p.stat().st_mtime)) if found else None


def _last_line(path: str | None) -> str:
    """The last non-empty line of ``path`` (the program's output), or ""."""
    if path is None:
        return ""
    time.sleep(0.3)  # slurmstepd copies the program's last output to the file asynchronously
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 4096))
            lines = [ln for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1].strip()[:300] if lines else ""


def _run(argv: Sequence[str], env: dict[str, str], cwd: str, events: EventLog, log: str | None,
         plan: PlanView, run_dir: Path) -> int:
    # The stop signals wait, blocked, for the StopWatch (it learns who sent each one).
    command_stop.block_signals()
    child = subprocess.Popen(list(argv), env=env, cwd=cwd, preexec_fn=command_stop.child_signals)
    watch = command_stop.StopWatch(child, events, run_dir, float(plan.preemption.grace_seconds))
    code = watch.wait()
    rc = watch.exit_code(code)
    stopped = bool(watch.received) or code in (0, preempt.EXIT_REQUEUE, preempt.EXIT_TERMINATED)
    events.emit("exit", code=rc, command=True, signals=watch.received, forwarded=watch.forwarded,
                **({"stop_ignored": True} if watch.ignored else {}))
    if not stopped:
        how = f"killed by signal {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
        last = _last_line(log)
        said = f"; its last line: {last}" if last else ""
        events.emit("rank_failure", signal=signal.Signals(-code).name if code < 0 else None,
                    exit_code=None if code < 0 else code, message=f"{os.path.basename(argv[0])} {how}{said}",
                    last_line=last, detected_by="runtime", command=True)
    return rc


def _which(word: str, path: str | None, cwd: str) -> str | None:
    """``word`` as the program: a path (with a '/') relative to ``cwd``, else a name on PATH."""
    if "/" in word:
        full = os.path.join(cwd, word)
        return full if os.path.isfile(full) and os.access(full, os.X_OK) else None
    return shutil.which(word, path=path)


def main(args: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if args is None else args)
    if len(args) < 4 or args[2] != "--":
        sys.stderr.write("usage: python -m hetrun.runtime.command_rank RUN_DIR COMPONENT -- ARGV...\n")
        return 2
    run_dir, component, argv = Path(args[0]), args[1], args[3:]
    plan = load_plan(run_dir, validate=False)  # validated at submit; a rank only reads it
    env = dict(os.environ)
    env.update(component_env(os.environ, plan, component, run_dir))
    node = os.environ.get("SLURMD_NODENAME") or os.environ.get("HETRUN_NODE") or socket.gethostname()
    restart = _restart_count(os.environ)
    events = EventLog(run_dir, rank=int(env["HETRUN_GLOBAL_RANK"]), component=component, node=node,
                      restart_count=restart)
    events.emit("start", comp_rank=int(env["RANK"]), comp_size=int(env["WORLD_SIZE"]), pid=os.getpid(),
                command=True, job_id=env.get("SLURM_JOB_ID"), batch_start=env_time("HETRUN_BATCH_START"),
                srun_start=env_time("HETRUN_SRUN_START"), proc_start=process_start_time())
    # The program runs where the job YAML is (script mode: where `hetrun submit` ran), as sbatch
    # runs a script in the submit directory: relative paths in the command mean what they did there.
    cwd = plan.job_dir or str(run_dir)
    program = _which(argv[0], env.get("PATH"), cwd)
    if program is None:
        why = f"command not found on {node}: {argv[0]!r}"
        sys.stderr.write(f"hetrun: {why} (component {component}, rank {env['RANK']})\n")
        events.emit("exit", code=NOT_FOUND_EXIT, command=True)
        events.emit("rank_failure", signal=None, exit_code=NOT_FOUND_EXIT, message=why, last_line="",
                    detected_by="runtime", command=True)
        return NOT_FOUND_EXIT
    log = _log_path(run_dir, component, int(env["RANK"]))
    # Spare nodes: each node's lowest rank beats for its node (the executor's beat,
    # runtime/heartbeat.py), so the batch script's monitor finds a dead node in seconds
    # (a survivor's collective on a dead peer may otherwise wait for its own timeout).
    beating = heartbeat.restarts_in_allocation(plan) and env["LOCAL_RANK"] == "0"
    if beating:
        heartbeat.start_heartbeat(run_dir, node)
    try:
        # A Python program restarted inside the allocation forks from the node's warm server
        # (torch imported there) where the job has one (runtime/warm_command.py).
        return _run(warm_command.wrapped(argv, program, env), env, cwd, events, log, plan, run_dir)
    finally:
        if beating:
            # Ended (done, stopped or failed, all recorded above): not a dead node.
            heartbeat.stop_heartbeat()


if __name__ == "__main__":
    sys.exit(main())
