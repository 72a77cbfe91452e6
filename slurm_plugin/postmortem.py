"""After an attempt's ranks have all ended: who died, how the attempt ended, requeue or not.

Run by the batch script once srun returns
(``python -m hetrun.slurm_plugin.postmortem RUN_DIR --launcher srun ...``) and
called in-process by the local supervisor after mpirun returns. It

- names each dead rank from the launcher's own report (srun:
  ``srun: error: n3: task 1: Killed``, where the task number counts within its
  het group; mpirun: ``process rank 2 with PID ... exited on signal 9``) and
  the ranks' ``start`` events, and appends one ``rank_failure`` line per dead
  rank (unless the runtime already wrote its own for an exception);
- decides the attempt's outcome (done / preempted / time_limit / failed /
  cancelled) from the ranks' ``exit`` events first, then the signal the batch
  shell trapped and the launcher's exit code;
- applies the budgets (``hetrun.dag.budgets``) and appends exactly one
  ``attempt_end`` line saying whether the run is requeued.

It imports no runtime code and no torch: it must start in a fraction of a
second inside Slurm's grace time.
"""

from __future__ import annotations

import argparse
import re
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from glob import escape as glob_escape
from pathlib import Path
from typing import Any

from hetrun.dag.budgets import Budgets, count_attempts, should_requeue

from hetrun.planfile import read_plan

from .rundir import LOGS, PLAN_JSON, append_event, events_of

REQUEUE_EXIT_CODE = 85
TERM_EXIT_CODE = 128 + signal.SIGTERM
# srun and Open MPI print strsignal()'s words ("Killed", "Segmentation fault").
_SIGNAL_BY_TEXT = {signal.strsignal(s): s.name for s in signal.Signals if signal.strsignal(s)}
_SRUN_TASK = re.compile(r"srun: error: (?P<node>\S+): tasks? (?P<tasks>[0-9,\-]+): (?P<what>.+?)\s*$")
# Lines after which srun reports the peers it ended itself, not deaths.
# The batch script's srun reader writes KILL_MARK into the log right before it
# SIGKILLs the step on the first death: the deaths after it are its own doing.
KILL_MARK = "hetrun: first task death seen, SIGKILL to the other tasks of the step"
_SRUN_ABORTING = ("_step_signal: Terminating", "CANCELLED AT", "Job step aborted", KILL_MARK)
_MPIRUN_SIGNAL = re.compile(r"process rank (?P<rank>\d+) with PID \d+ on node (?P<node>\S+) "
                            r"exited on signal (?P<sig>\d+)")
_MPIRUN_EXIT = re.compile(r"Process name:\s*\[\[\d+,\d+\],(?P<rank>\d+)\]\s*Exit code:\s*(?P<code>\d+)")


@dataclass
class Death:
    """One dead rank; ``task`` is srun's task number within its het group."""

    rank: int | None = None
    component: str | None = None
    node: str | None = None
    signal: str | None = None
    exit_code: int | None = None
    message: str = ""
    task: int | None = None
    last_line: str = ""  # the last line the rank wrote to its log (stderr and stdout)


def _task_numbers(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def parse_srun(text: str) -> list[Death]:
    """Deaths srun reported before it began ending the step itself."""
    deaths = []
    for line in text.splitlines():
        if any(marker in line for marker in _SRUN_ABORTING):
            break
        m = _SRUN_TASK.search(line)
        if not m:
            continue
        what = m["what"]
        code = re.fullmatch(r"Exited with exit code (\d+)", what)
        for task in _task_numbers(m["tasks"]):
            deaths.append(Death(node=m["node"], task=task, message=line.strip(),
                                exit_code=int(code[1]) if code else None,
                                signal=None if code else _SIGNAL_BY_TEXT.get(what, what)))
    return deaths


def parse_mpirun(text: str) -> list[Death]:
    """The rank Open MPI's mpirun names as the first to die (signal or exit code)."""
    deaths = []
    for m in _MPIRUN_SIGNAL.finditer(text):
        sig = int(m["sig"])
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else f"signal {sig}"
        deaths.append(Death(rank=int(m["rank"]), node=m["node"], signal=name, message=" ".join(m[0].split())))
    for m in _MPIRUN_EXIT.finditer(text):
        deaths.append(Death(rank=int(m["rank"]), exit_code=int(m["code"]),
                            message=f"rank {m['rank']} exited with code {m['code']}"))
    return deaths


@dataclass
class Attempt:
    """What the run directory says about one attempt (restart count ``restart``)."""

    run_dir: Path
    restart: int
    components: list[tuple[str, int]]  # (name, ranks) in rank order
    preemption: dict[str, Any]
    starts: dict[int, dict[str, Any]]
    exits: dict[int, int]
    runtime_failures: list[dict[str, Any]]  # the runtime's own rank_failure lines (an exception)
    groups: list[int] | None = None  # each component's het group (plan index); None: its position

    @classmethod
    def read(cls, run_dir: Path, restart: int) -> Attempt:
        # A bare script run by hand has no plan: no ranks to name.
        plan = read_plan(run_dir) if (run_dir / PLAN_JSON).exists() else None
        # Rank order (PlanView.first_rank): action components first, then command components.
        ordered = [] if plan is None else [*plan.action_components,
                                           *(c for c in plan.components if not c.runs_actions)]
        comps = [(c.name, c.ntasks) for c in ordered]
        starts: dict[int, dict[str, Any]] = {}
        exits: dict[int, int] = {}
        failures: list[dict[str, Any]] = []
        for rec in events_of(run_dir, ("start", "exit", "rank_failure")):
            if rec["ev"] == "start" and rec.get("restart_count", 0) == restart:
                starts[int(rec["rank"])] = rec
            elif rec["ev"] == "exit" and rec.get("restart_count") == restart and isinstance(rec.get("code"), int):
                exits[int(rec["rank"])] = rec["code"]
            elif rec["ev"] == "rank_failure" and rec.get("restart_count") == restart \
                    and rec.get("detected_by") == "runtime":
                failures.append(rec)
        return cls(run_dir, restart, comps, dict(plan.preemption) if plan is not None else {}, starts, exits,
                   failures, [c.index for c in ordered])

    @property
    def size(self) -> int:
        return sum(n for _, n in self.components)

    def component_of(self, rank: int) -> str | None:
        start = 0
        for name, n in self.components:
            if start <= rank < start + n:
                return name
            start += n
        return None


def _hostnames(nodelist: str) -> list[str]:
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                             text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return out.split()


def _srun_rank(death: Death, attempt: Attempt, env: Mapping[str, str]) -> int | None:
    """The global rank of srun's (node, task within its het group)."""
    hits = [r for r, s in attempt.starts.items()
            if s.get("node") == death.node and s.get("comp_rank") == death.task]
    if len(hits) == 1:
        return hits[0]
    # Died before its start event (start-up): the group's nodes, block distribution.
    first = 0
    for i, (_name, ntasks) in enumerate(attempt.components):
        g = attempt.groups[i] if attempt.groups else i
        nodes = _hostnames(env.get(f"SLURM_JOB_NODELIST_HET_GROUP_{g}") or env.get("SLURM_JOB_NODELIST", ""))
        per_node = -(-ntasks // max(1, len(nodes))) if nodes else 0
        if death.task is not None and death.task < ntasks and per_node \
                and nodes[min(death.task // per_node, len(nodes) - 1)] == death.node:
            hits.append(first + death.task)
        first += ntasks
    return hits[0] if len(hits) == 1 else None


def name_deaths(deaths: Sequence[Death], attempt: Attempt, env: Mapping[str, str]) -> list[Death]:
    """Fill in rank, component and node of each death (None where it cannot be told)."""
    for d in deaths:
        if d.rank is None and d.task is not None:
            d.rank = _srun_rank(d, attempt, env)
        if d.rank is not None:
            d.component = attempt.component_of(d.rank)
            start = attempt.starts.get(d.rank)
            if start and start.get("node"):
                d.node = start["node"]
    return list(deaths)


def outcome(attempt: Attempt, exit_code: int, trapped: str | None) -> str:
    """How the attempt ended: the ranks' own exit events first (srun may kill a
    rank that was about to exit 85 itself), then the trapped signal and code."""
    codes = set(attempt.exits.values())
    by_code = {0: "done", REQUEUE_EXIT_CODE: "time_limit", TERM_EXIT_CODE: "preempted"}
    if len(attempt.exits) == attempt.size and len(codes) == 1 and next(iter(codes)) in by_code:
        return by_code[next(iter(codes))]
    if trapped == "TERM":
        return "preempted"
    if exit_code == 0:
        return "done"
    if exit_code == REQUEUE_EXIT_CODE:
        return "time_limit"
    return "failed"


def finish_attempt(run_dir: Path, *, restart: int, exit_code: int, launcher: str, log_text: str,
                   trapped: str | None = None, forced: str | None = None, forced_reason: str = "",
                   budgets: Budgets | None = None,
                   env: Mapping[str, str] | None = None) -> tuple[bool, dict[str, Any]]:
    """Write the attempt's ``rank_failure`` lines and its ``attempt_end``;
    return (requeue?, the attempt_end record). ``forced``: an outcome the caller
    knows (the local supervisor: cancelled, or a requeue it was asked for);
    ``budgets`` default to plan.json's ``preemption`` section."""
    attempt = Attempt.read(run_dir, restart)
    result = forced or outcome(attempt, exit_code, trapped)
    deaths: list[Death] = []
    if result == "failed":
        parsed = parse_srun(log_text) if launcher == "srun" else parse_mpirun(log_text)
        deaths = name_deaths(parsed, attempt, env or {})
        for d in deaths:
            d.last_line = last_log_line(run_dir, d.component, d.rank)
        if not attempt.runtime_failures:  # else the runtime named the rank that raised
            for d in deaths:
                fields = {k: v for k, v in asdict(d).items() if k != "task"}
                append_event(run_dir, "rank_failure", **fields, detected_by=launcher, restart_count=restart)
    close_unrecorded(run_dir, restart)  # before the budgets count the run's attempts
    previous = events_of(run_dir, ("attempt_end",))
    this = {"ev": "attempt_end", "restart_count": restart, "outcome": result}
    counts = count_attempts([*previous, this], restart_count=restart)
    requeue, why = should_requeue(result, counts, budgets or Budgets.from_preemption(attempt.preemption))
    if result == "failed" and not requeue and not any(d.signal for d in deaths) \
            and _deterministic(attempt.runtime_failures):
        # The rank's own exception or exit code: a requeue would fail the same way, so the
        # max_failures hint (which could only help a node or signal death) is not given.
        # srun's own line for that rank ("task 0: Exited with exit code 1") is the same
        # exit seen from outside, not a signal: it does not bring the hint back.
        why = "failed; not requeued: the rank's own error would most likely recur on a restart (fix it, then `hetrun resume`)"
    key = failure_key(attempt, deaths) if result == "failed" else None
    if requeue and key is not None and (repeated := _repeats(run_dir, key)) is not None:
        requeue = False
        why = (f"failed as attempt {repeated} did, with no step done since and no dead node: not restarted, "
               "a restart would most likely fail the same way (fix it, then `hetrun resume`)")
    reason = forced_reason or why
    ignored = [e for e in events_of(run_dir, ("stop_ignored",)) if e.get("restart_count") == restart]
    if ignored:
        # A command that ignored the stop until the wrapper ended it: who, for how long, the work lost.
        reason = "; ".join(_describe_reported(f, verb="") for f in ignored) + f" ({why})"
    elif attempt.runtime_failures and result == "failed":
        # The failing rank said why in its own line: that beats the launcher's exit code.
        reason = "; ".join(_describe_reported(f) for f in attempt.runtime_failures) + f" ({why})"
    elif deaths:
        reason = "; ".join(_describe(d) for d in deaths) + f" ({why})"
    record = append_event(run_dir, "attempt_end", restart_count=restart, outcome=result, requeued=requeue,
                          exit_code=exit_code, reason=reason, launcher=launcher, signal=trapped,
                          failed_ranks=[d.rank for d in deaths],
                          **({"failure_key": key} if key is not None else {}),
                          **({"stop_ignored": [e.get("rank") for e in ignored]} if ignored else {}))
    return requeue, record


# The batch shell's trap writes the signal it took into logs/<SIGNAL_MARK><attempt> (render.py):
# the post-mortem of a later attempt reads it for an attempt that left no attempt_end.
SIGNAL_MARK = ".signal-"


def close_unrecorded(run_dir: Path, restart: int) -> list[dict[str, Any]]:
    """An ``attempt_end`` for each earlier attempt that started and has none: its batch script was
    killed before its post-mortem ran (Slurm's KillWait after a preemption signal, with the
    ranks' last checkpoint slow on a loaded node), so the run's attempts, its budgets and
    ``hetrun report`` would miss it. Its outcome as its own post-mortem would have said it: the
    ranks' exit events, then the signal its batch shell trapped (the mark it left in logs/);
    neither: failed. Returns the lines written."""
    ended = {e.get("restart_count") for e in events_of(run_dir, ("attempt_end",))}
    started = sorted({r for e in events_of(run_dir, ("start", "restore"))
                      if type(r := e.get("restart_count")) is int and r < restart} - ended)
    out = []
    for r in started:
        try:
            mark = (run_dir / LOGS / f"{SIGNAL_MARK}{r}").read_text().strip() or None
        except OSError:
            mark = None
        result = outcome(Attempt.read(run_dir, r), -1, mark)
        out.append(append_event(
            run_dir, "attempt_end", restart_count=r, outcome=result, requeued=True, exit_code=None,
            reason=(f"{result}; its batch script ended before its post-mortem"
                    + (f" ({mark} trapped, then killed)" if mark else "")
                    + f"; recorded by attempt {restart}'s"),
            launcher=None, signal=mark, failed_ranks=[], recorded_by=restart))
    return out


def failure_key(attempt: Attempt, deaths: Sequence[Death]) -> list[str] | None:
    """What tells this failure from another across attempts: each failing rank's component and
    its own error (the runtime's message, or the exit code srun saw). None when a rank died of a
    signal (a node lost, the OOM killer, a kill: not the program's own doing) or nothing names
    the failure."""
    if any(d.signal for d in deaths) or any(f.get("signal") for f in attempt.runtime_failures):
        return None
    if attempt.runtime_failures:
        keys = {f"{f.get('component')}: {str(f.get('message') or '').strip()[:LAST_LINE_MAX]}"
                for f in attempt.runtime_failures}
    else:
        keys = {f"{d.component}: exit code {d.exit_code}" for d in deaths if d.exit_code is not None}
    return sorted(keys) or None


def _repeats(run_dir: Path, key: list[str]) -> int | None:
    """The previous attempt's restart count when it failed with the same ``key`` and nothing
    happened since that a restart could have changed: no step done (no ``action`` line after
    its ``attempt_end``) and no dead node found (its in-allocation ``node_failure``, if any,
    named none). A job that fails at start-up would otherwise restart until ``max_failures``
    runs out: 68 times in two minutes, once, inside its allocation (benchmarks/node_death.md)."""
    previous: dict[str, Any] | None = None
    moved = False  # a step done or a dead node found since ``previous``
    for rec in events_of(run_dir, ("attempt_end", "node_failure", "action")):
        if rec["ev"] == "attempt_end":
            previous, moved = rec, False
        elif rec["ev"] == "action" or rec.get("dead_nodes"):
            moved = True
    if previous is None or moved or previous.get("outcome") != "failed" or previous.get("failure_key") != key:
        return None
    return int(previous.get("restart_count") or 0)


def _deterministic(failures: Sequence[Mapping[str, Any]]) -> bool:
    """Every failure the ranks reported is their own error (an exception, an exit code, a
    program not found), none a signal from outside (a kill, the OOM killer)."""
    return bool(failures) and all(not f.get("signal") for f in failures)


def clean_stop_note(record: Mapping[str, Any]) -> str | None:
    """For the logs a user opens after an attempt that stopped as asked (preempted, time limit,
    every rank exited with the stop code): what srun's lines above it mean."""
    if record.get("outcome") not in ("preempted", "time_limit") or record.get("failed_ranks") \
            or record.get("stop_ignored"):  # a rank ignored the stop and was killed: not clean
        return None
    code = TERM_EXIT_CODE if record["outcome"] == "preempted" else REQUEUE_EXIT_CODE
    then = "the job was requeued and resumes from that checkpoint" if record.get("requeued") else \
        f"it was not requeued ({record.get('reason')})"
    return (f"hetrun: attempt {record.get('restart_count')} stopped cleanly ({record['outcome'].replace('_', ' ')}): "
            f"the ranks saved their checkpoint and exited {code} as asked; srun's 'forcing job termination' and "
            f"'Exited with exit code {code}' lines report that exit, not a crash; {then}")


def _describe(d: Death) -> str:
    how = f"signal {d.signal}" if d.signal else f"exit code {d.exit_code}"
    who = f"rank {d.rank}" if d.rank is not None else "a rank"
    said = f"; its last line: {d.last_line}" if d.last_line else ""
    return f"{who} ({d.component or '?'}) on {d.node or '?'} died: {how}{said}"


def _describe_reported(f: Mapping[str, Any], verb: str = " failed") -> str:
    """A rank_failure the rank wrote itself: the runtime's exception, or a command
    component's wrapper (runtime/command_rank.py: exit code and the program's last line);
    or (``verb=""``) the wrapper's stop_ignored line (runtime/command_stop.py)."""
    where = f" in action {f['action']} (iteration {f.get('iteration')})" if f.get("action") else ""
    # The command wrapper's message already quotes the last line: say it once.
    said = f"; its last line: {f['last_line']}" if f.get("last_line") and f["last_line"] not in str(
        f.get("message") or "") else ""
    return (f"rank {f.get('rank')} ({f.get('component') or '?'}) on {f.get('node') or '?'}{verb}{where}"
            f"{':' if verb else ''} {f.get('message') or 'an exception'}{said}")


LAST_LINE_MAX = 300  # characters of a rank's last line carried in events and status


def last_log_line(run_dir: Path, component: str | None, rank: int | None) -> str:
    """The last non-empty line of a rank's log (stdout and stderr together), or "".

    The launchers name the files: srun ``logs/<component>-<jobid>-<rank>.out``
    (``%t`` is the global rank of the het step), the local backend
    ``logs/<component>-local-<rank>.out``. A Python script that dies of an
    exception ends its stderr with the exception's line, which is what a user
    needs to see in place of a bare FAILED. Reads only the file's tail.
    """
    if component is None or rank is None:
        return ""
    logs = run_dir / LOGS
    try:
        # "<component>-(jobid|local)-<rank>.out" exactly: a component "a-1" must not match "a".
        mine = re.compile(rf"{re.escape(component)}-(?:\d+|local)-{rank}\.out")
        found = [p for p in logs.glob(f"{glob_escape(component)}-*-{rank}.out") if mine.fullmatch(p.name)]
        newest = max(found, key=lambda p: p.stat().st_mtime, default=None)
        if newest is None:
            return ""
        with newest.open("rb") as fh:
            fh.seek(max(0, newest.stat().st_size - 8192))
            tail = fh.read().decode(errors="replace")
    except OSError:
        return ""
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    return lines[-1][:LAST_LINE_MAX] if lines else ""


def main(argv: Sequence[str] | None = None) -> int:
    import os

    p = argparse.ArgumentParser(prog="python -m hetrun.slurm_plugin.postmortem", description=__doc__)
    p.add_argument("run_dir", type=Path)
    p.add_argument("--launcher", choices=("srun", "mpirun"), default="srun")
    p.add_argument("--exit-code", type=int, required=True, help="the launcher's exit status")
    p.add_argument("--signal", default="", help="the signal the batch shell trapped (USR1, TERM), if any")
    p.add_argument("--restart", type=int, default=0, help="SLURM_RESTART_COUNT of this attempt")
    p.add_argument("--log", type=Path, help="the launcher's stderr of this attempt")
    p.add_argument("--max-preemptions", default="none", help="preemption.max_preemptions (none: unlimited)")
    p.add_argument("--max-failures", type=int, default=0, help="preemption.max_failures")
    p.add_argument("--preemption-key", default="max_preemptions", choices=("max_preemptions", "max_restarts"),
                   help="the spec key the preemption limit came from (for messages)")
    args = p.parse_args(argv)
    limit = None if args.max_preemptions == "none" else int(args.max_preemptions)
    budgets = Budgets(limit, args.max_failures, args.preemption_key)
    text = ""
    if args.log is not None and args.log.is_file():
        text = args.log.read_text(errors="replace")
    try:
        requeue, rec = finish_attempt(args.run_dir.resolve(), restart=args.restart, exit_code=args.exit_code,
                                      launcher=args.launcher, log_text=text, trapped=args.signal or None,
                                      budgets=budgets, env=os.environ)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        sys.stderr.write(f"hetrun: post-mortem of {args.run_dir} failed: {exc}\n")
        return 1
    sys.stderr.write(f"hetrun: attempt {args.restart} ended: {rec['outcome']}: {rec['reason']}\n")
    note = clean_stop_note(rec)
    if note:  # the batch log (stderr) and the launcher's log, where srun's exit lines are
        sys.stderr.write(note + "\n")
        if args.log is not None and args.log.is_file():
            with args.log.open("a") as fh:
                fh.write(note + "\n")
    if requeue and args.launcher == "srun" and args.signal == "TERM":
        # Preempted (PreemptMode=REQUEUE): Slurm requeued this job itself; start it again
        # seconds after it ends rather than after Slurm's credential hold (requeue_hold.py).
        from .requeue_hold import release_named_nodes, shorten_own_hold

        job_id = os.environ.get("SLURM_JOB_ID", "")
        done = shorten_own_hold(job_id, args.run_dir.resolve(), restart=args.restart)
        if done:
            sys.stderr.write(f"hetrun: {done['message']}\n")
        # A start by preemption named its victims' nodes; the next start is not bound to them.
        for target in release_named_nodes(job_id, args.run_dir.resolve()):
            sys.stderr.write(f"hetrun: job {target} was placed on named nodes (a start by preemption); "
                             f"requeued, it no longer asks for them (scontrol update JobId={target} ReqNodeList=)\n")
    # "done": the attempt finished (every rank's own exit says so, outcome()), whatever srun's
    # status: a step whose srun was ended after its ranks' clean exits (stuck on a dead node's
    # slurmstepd, or on a rank's leftover child) is a completed job, and the batch script exits 0.
    print("requeue" if requeue else "done" if rec["outcome"] == "done" else "end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
