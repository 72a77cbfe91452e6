"""In-allocation restart after a node or rank death: which nodes the next job step runs on.

A job whose components hold ``spare_nodes`` is allocated ``nodes + spare_nodes``
per component and submitted with ``--no-kill`` (a failed node does not end the
allocation). Its batch script (slurm_plugin/render.py) starts each step on the
first ``nodes`` live nodes of each het group (``nodes``) and, when a step
failed and the post-mortem would requeue it (a failure within
``preemption.max_failures``), asks ``failed``: the nodes to exclude from now on
(the nodes of the ranks the post-mortem named, and the allocation's nodes
Slurm reports DOWN / NOT_RESPONDING / FAIL / DRAIN) are added to the job's
dead-node file, and when every component still has enough live nodes the
script starts the next step at once ("restart"). With no spare left, an
excluded node that answers a probe step again is taken back, once per node
(``taken_back``); still short, a group whose component has ``min_nodes`` goes on with
its ranks packed onto its surviving nodes (``--fewest``: the script runs the group's
ranks there with ``--overcommit``); else the job requeues ("requeue") as before. Each decision is a ``node_failure`` event: the dead nodes, each
component's old and new node list, the spares left, the action and why.

Like the post-mortem, this imports no runtime code and no torch (it runs in the
batch shell between steps). CLI:

    python -m hetrun.slurm_plugin.node_recovery nodes RUN_DIR --dead-file F --need N0 [N1 ...]
    python -m hetrun.slurm_plugin.node_recovery failed RUN_DIR --dead-file F --restart R \\
        --need N0 [N1 ...] --used LIST0 [LIST1 ...]
        [--silent X ...]

Which node died (``dead_after``): the step's nodes are probed with a one-task
step each (a dead node's slurmd never answers; Slurm marks it down only after
SlurmdTimeout), and Slurm's node states are read; ``--silent`` names the nodes
whose heartbeat (``logs/alive/<node>``, runtime/heartbeat.py) the script's
monitor saw stop. When the step ended before the monitor's verdict (a survivor
failed on the broken connection first), the probe does not wait out its timeout
for a node whose heartbeat file has been silent for ``$HETRUN_NODE_TIMEOUT`` s
once every other node has answered (``await_probes``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import secrets
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hetrun.errors import RunDirError
from hetrun.planfile import read_plan
from hetrun.rundir import NODE_TIMEOUT_DEFAULT_S, NODE_TIMEOUT_ENV, RETURNED_SUFFIX, RunPaths

from .rundir import append_event, events_of

_NODE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
# Node states after which a node gets no more steps of this job (scontrol's State=, flags joined by +).
DEAD_STATES = ("DOWN", "NOT_RESPONDING", "FAIL", "DRAIN")


def slurm_says_dead(state: str) -> bool:
    """Whether scontrol's State= (flags joined by +) is one of DEAD_STATES."""
    return any(s in state.split("+") or state.startswith(s) for s in DEAD_STATES)


def hostnames(nodelist: str) -> list[str]:
    """``scontrol show hostnames`` of a Slurm node list (n[1-3] -> n1 n2 n3)."""
    if not nodelist:
        return []
    out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                         timeout=20, check=False).stdout.split()
    return [n for n in out if _NODE_RE.fullmatch(n)]


def group_nodes(env: Mapping[str, str], groups: int) -> list[list[str]]:
    """Each het group's allocated nodes, in Slurm's order."""
    if groups == 1 and not env.get("SLURM_JOB_NODELIST_HET_GROUP_0"):
        return [hostnames(env.get("SLURM_JOB_NODELIST", ""))]
    return [hostnames(env.get(f"SLURM_JOB_NODELIST_HET_GROUP_{g}", "")) for g in range(groups)]


def read_dead(path: Path) -> list[str]:
    try:
        lines = path.read_text().split()
    except OSError:
        return []
    return [n for n in dict.fromkeys(lines) if _NODE_RE.fullmatch(n)]


def pick(allocated: Sequence[Sequence[str]], need: Sequence[int], dead: Sequence[str],
         fewest: Sequence[int] | None = None) -> list[list[str]] | str:
    """The first ``need[g]`` live nodes of each group; or why there are not enough.
    ``fewest``: a group with fewer live nodes than it needs but at least ``fewest[g]``
    (its ``min_nodes``) gets them all, its ranks to be packed onto them."""
    out = []
    for g, (nodes, n) in enumerate(zip(allocated, need, strict=True)):
        live = [x for x in nodes if x not in dead]
        least = n if fewest is None else min(n, fewest[g])
        if len(live) < least:
            packed = f", {least} at the least (min_nodes)" if least < n else ""
            return (f"het group {g}: {len(live)} live node(s) of {len(nodes)} allocated, {n} needed{packed} "
                    f"(dead: {', '.join(x for x in nodes if x in dead) or 'none'}); no spare node left")
        out.append(live[:n])
    return out


def taken_back(allocated: Sequence[Sequence[str]], dead: Sequence[str], keep_out: Sequence[str],
               het: bool) -> dict[str, str]:
    """The excluded nodes that may serve again, and why: a node this job's batch script
    excluded (a rank died there, its heartbeat stopped, a probe failed) that Slurm still
    reports usable and that runs a probe step inside the allocation now, so it is still
    the job's and its slurmd answers (a node Slurm marked down has left a ``--no-kill``
    job's allocation: its probe fails). ``keep_out``: nodes never taken back (those that
    failed in the attempt that just ended, and those taken back once before: a node that
    fails again after its return stays out). Asked only when no spare is left, so a fresh
    spare always goes first and a job with spares pays no probe for it."""
    candidates = {n for nodes in allocated for n in nodes if n in dead and n not in keep_out}
    if not candidates:
        return {}
    states = node_states(sorted(candidates))
    candidates = {n for n in candidates if states.get(n) and not slurm_says_dead(states[n])}
    if not candidates:
        return {}
    groups = [[n for n in nodes if n in candidates] for nodes in allocated]
    failed = probe(groups, het)
    return {n: f"answered a probe step again (Slurm: {states[n]})" for nodes in groups for n in nodes
            if n not in failed}


def node_states(nodes: Sequence[str]) -> dict[str, str]:
    """scontrol's State= of each node ('' where it cannot be read)."""
    if not nodes:
        return {}
    text = subprocess.run(["scontrol", "show", "node", "-o", ",".join(nodes)], capture_output=True, text=True,
                          timeout=20, check=False).stdout
    out = dict.fromkeys(nodes, "")
    for line in text.splitlines():
        name = re.search(r"NodeName=(\S+)", line)
        state = re.search(r"State=(\S+)", line)
        if name and state:
            out[name.group(1)] = state.group(1)
    return out


def dead_after(run_dir: Path, restart: int, used: Sequence[Sequence[str]], het: bool,
               silent: Sequence[str] = ()) -> tuple[list[str], dict[str, str]]:
    """(nodes to exclude after attempt ``restart``, why each).

    First the nodes that are gone: those Slurm reports down, those whose heartbeat the
    script's monitor saw stop while the step ran (``silent``), and, with neither, those
    that fail a probe step. A dead node takes its peers' MPI connections with it, so
    survivors fail too (their rank_failure lines name their own, healthy node): with a
    node gone, only it is excluded. With none gone, where srun saw a rank die, else the
    nodes of the ranks a rank timed out waiting for (``waiting_on``: a rank that hangs
    keeps its process and heartbeat; its peers' wait names it), else where a rank raised."""
    flat = [n for nodes in used for n in nodes]
    why: dict[str, str] = {}
    for node, state in node_states(flat).items():
        if slurm_says_dead(state):
            why[node] = f"Slurm reports it {state}"
    for node in silent:
        if node in flat:
            # The monitor saw it stop first, while the step still ran: no probe needed (it
            # would wait out its timeout on a dead node).
            why.setdefault(node, "its heartbeat stopped while the step ran")
    failures = [f for f in events_of(run_dir, ("rank_failure",)) if f.get("restart_count") == restart
                and isinstance(f.get("node"), str) and f["node"] in flat]
    if not why:
        # A rank of this step failed (a survivor's collective broke): the probe's verdict needs
        # a heartbeat silent for CORROBORATED_SILENCE_S, not the monitor's whole timeout.
        why.update(probe(used, het, heartbeats=RunPaths(str(run_dir)).heartbeats, corroborated=bool(failures)))
    if why:
        return list(why), why
    for detected in ("srun", "hung", "runtime"):
        if why:
            break
        if detected == "hung":
            why.update(_hung(run_dir, restart, failures, flat))
            continue
        for f in failures:
            if f.get("detected_by") == detected:
                why.setdefault(f["node"], f"rank {f.get('rank')} ({f.get('component') or '?'}) "
                                          f"{'died' if detected == 'srun' else 'failed'} there")
    return list(why), why


def _hung(run_dir: Path, restart: int, failures: Sequence[Mapping[str, Any]],
          flat: Sequence[str]) -> dict[str, str]:
    """The nodes of the ranks that ranks of attempt ``restart`` timed out waiting for (their
    ``rank_failure`` lines' ``waiting_on``), and why: such a rank's process and heartbeat live
    on, so only its peers' wait names it (HETRUN_COLLECTIVE_TIMEOUT)."""
    waited: dict[int, list[str]] = {}
    for f in failures:
        for r in f.get("waiting_on") or []:
            if isinstance(r, int):
                waited.setdefault(r, []).append(f"rank {f.get('rank')} ({f.get('component') or '?'})")
    if not waited:
        return {}
    where = {e.get("rank"): (e.get("node"), e.get("component")) for e in events_of(run_dir, ("start",))
             if e.get("restart_count") == restart}
    out: dict[str, str] = {}
    for r, by in sorted(waited.items()):
        node, comp = where.get(r, (None, None))
        if isinstance(node, str) and node in flat:
            text = f"rank {r} ({comp or '?'}) hung there: {', '.join(by)} timed out waiting for it"
            out[node] = f"{out[node]}; {text}" if node in out else text
    return out


PROBE_TIMEOUT_S = 5.0  # a live node answers a one-task step in well under a second
PROBE_GRACE_S = 1.0  # the least a node's probe is given before its stale heartbeat decides
# The heartbeat silence that, with a probe not answered, names a node dead once a rank of the
# step has failed (its rank_failure line: a survivor's collective broke on the dead node's
# connections). Two beats at the default period. Without that failure the monitor's own rule,
# $HETRUN_NODE_TIMEOUT. After the step's kill every node's beat has stopped (the beat is a
# process of the step), so once the post-mortem runs the age alone tells little: the probe
# decides, and the age keeps a node whose beat stopped only just now (killed a moment ago with
# the step, its probe slow to start) from a verdict. At the whole timeout, a dead node's verdict
# waited until 3 s after the kill though the survivor had failed within 0.1 s of it
# (benchmarks/node_death.md, session 33).
CORROBORATED_SILENCE_S = 1.0


def node_timeout_s(env: Mapping[str, str] | None = None) -> float:
    """``$HETRUN_NODE_TIMEOUT`` as the batch script reads it: a whole number of seconds > 0,
    else the default (the script has already said so on stderr)."""
    raw = (os.environ if env is None else env).get(NODE_TIMEOUT_ENV, "")
    return float(raw) if raw.isdigit() and not raw.startswith("0") else float(NODE_TIMEOUT_DEFAULT_S)


def heartbeat_ages(heartbeats: Path, nodes: Sequence[str]) -> dict[str, float | None]:
    """Seconds since each node's heartbeat file (``logs/alive/<node>``) was last written;
    None where there is none (never beating, or removed by its rank's orderly end). Ages
    are on the file system's clock alone: each file's mtime beside that of a file written
    here now (no clock skew between the nodes and this one). The file is opened and read
    before its fstat: opening revalidates an NFS client's attribute cache."""
    out: dict[str, float | None] = dict.fromkeys(nodes)
    ref = heartbeats / f".now-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        with open(ref, "w") as f:
            f.write("now\n")
            f.flush()
            now = os.fstat(f.fileno()).st_mtime_ns
    except OSError:
        return out  # no heartbeat directory: nothing beat
    finally:
        with contextlib.suppress(OSError):
            ref.unlink()
    for node in nodes:
        try:
            with open(heartbeats / node) as f:
                f.read()
                out[node] = max(0.0, (now - os.fstat(f.fileno()).st_mtime_ns) / 1e9)
        except OSError:
            continue
    return out


def probe(nodes_by_group: Sequence[Sequence[str]], het: bool, timeout: float = PROBE_TIMEOUT_S,
          heartbeats: Path | None = None, corroborated: bool = False) -> dict[str, str]:
    """The nodes that do not run a one-task step (``srun --overlap ... true``) within
    ``timeout`` s, and why: a dead node's slurmd never answers, while Slurm itself marks
    it down only after SlurmdTimeout. All probes run at once; ``await_probes`` may decide
    before the timeout from the nodes' heartbeat files."""
    procs = []
    for g, nodes in enumerate(nodes_by_group):
        for node in nodes:
            argv = ["srun", "--overlap", "--mpi=none", "-N1", "-n1", f"--nodelist={node}", "--quiet",
                    *([f"--het-group={g}"] if het else []), "true"]
            procs.append((node, subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                                 stderr=subprocess.PIPE, text=True)))
    return await_probes(procs, timeout, heartbeats, corroborated=corroborated)


def await_probes(procs: Sequence[tuple[str, subprocess.Popen[str]]], timeout: float = PROBE_TIMEOUT_S,
                 heartbeats: Path | None = None, node_timeout: float | None = None,
                 corroborated: bool = False) -> dict[str, str]:
    """Wait for the probe steps ``procs`` (node, process); the nodes whose probe failed or
    did not answer within ``timeout`` s, and why.

    The faster verdict (the step ended before the script's monitor judged the node): once
    every other node's probe has ended (Slurm and the probes work; a live slurmd answers
    in well under a second) and the node's own has had twice as long as the slowest of
    them and ``PROBE_GRACE_S`` at least, a node whose probe has not answered and whose heartbeat file
    has been silent for ``node_timeout`` s (``$HETRUN_NODE_TIMEOUT``, the monitor's rule)
    is dead: its probe is not waited out. Both are needed: a heartbeat merely late (a
    younger file) is never a verdict, and a live node whose rank was SIGKILLed (its file
    left behind, stale) answers its probe. Without a heartbeat file (never beating, or
    removed by an orderly end) or with a fresh one, the probe's timeout decides as before.
    ``corroborated`` (a rank of the step failed): the silence needed is at most
    ``CORROBORATED_SILENCE_S``."""
    limit = node_timeout_s() if node_timeout is None else node_timeout
    rule = f"{NODE_TIMEOUT_ENV}={limit:g}"
    if corroborated and limit > CORROBORATED_SILENCE_S:
        limit, rule = CORROBORATED_SILENCE_S, f"{CORROBORATED_SILENCE_S:g} s: a rank of the step failed"
    start = time.monotonic()
    deadline = start + timeout
    pending = dict(procs)
    out: dict[str, str] = {}
    slowest = 0.0  # seconds the slowest probe that ended took
    while pending:
        for node, proc in list(pending.items()):
            if proc.poll() is None:
                continue
            del pending[node]
            slowest = time.monotonic() - start
            _, err = proc.communicate()
            if proc.returncode != 0:
                out[node] = f"a probe step failed there (exit {proc.returncode}: {(err or '').strip()[-200:]})"
        if not pending:
            break
        waited = time.monotonic() - start
        # A live node's probe gets the time the others took twice over, and 1 s at least
        # (srun's start-up varies with the load): a stale file alone is no verdict.
        if heartbeats is not None and len(pending) < len(procs) and waited >= max(PROBE_GRACE_S, 2 * slowest):
            ages = heartbeat_ages(heartbeats, list(pending))
            if all(a is not None and a >= limit for a in ages.values()):
                for node, proc in pending.items():
                    proc.kill()
                    proc.communicate()
                    out[node] = (f"its heartbeat has been silent for {ages[node]:.1f} s ({rule}) and it "
                                 f"did not answer a probe step in {waited:.1f} s while the others did")
                break
        if time.monotonic() >= deadline:
            for node, proc in pending.items():
                proc.kill()
                proc.communicate()
                out[node] = f"did not answer a probe step within {timeout:g} s"
            break
        time.sleep(0.05)
    return out


def _components(run_dir: Path) -> list[str]:
    try:
        return [c.name for c in read_plan(run_dir).components]
    except RunDirError:
        return []


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hetrun.slurm_plugin.node_recovery", description=__doc__)
    p.add_argument("mode", choices=("nodes", "failed"))
    p.add_argument("run_dir", type=Path)
    p.add_argument("--dead-file", type=Path, required=True)
    p.add_argument("--need", type=int, nargs="+", required=True, help="nodes each het group's step runs on")
    p.add_argument("--fewest", type=int, nargs="*", default=None,
                   help="with no spare left, the fewest nodes each group's ranks may be packed onto (min_nodes)")
    p.add_argument("--restart", type=int, default=0, help="the attempt that failed (failed)")
    p.add_argument("--used", nargs="*", default=[], help="the node list each group's failed step ran on")
    p.add_argument("--silent", nargs="*", default=[], help="failed: nodes whose heartbeat stopped")
    args = p.parse_args(argv)
    allocated = group_nodes(os.environ, len(args.need))
    dead = read_dead(args.dead_file)
    fewest = args.fewest if args.fewest and len(args.fewest) == len(args.need) else None
    if args.mode == "nodes":
        chosen = pick(allocated, args.need, dead, fewest)
        if isinstance(chosen, str):
            sys.stderr.write(f"hetrun: {chosen}\n")
            return 1
        print("\n".join(",".join(nodes) for nodes in chosen))
        return 0
    used_lists = [u.split(",") for u in args.used]
    het = bool(os.environ.get("SLURM_JOB_NODELIST_HET_GROUP_0"))
    silent = [n for n in args.silent if _NODE_RE.fullmatch(n)]
    new_dead, why = dead_after(args.run_dir.resolve(), args.restart, used_lists, het, silent)
    dead = list(dict.fromkeys([*dead, *new_dead]))
    args.dead_file.parent.mkdir(parents=True, exist_ok=True)
    chosen = pick(allocated, args.need, dead)
    returned: dict[str, str] = {}
    if isinstance(chosen, str):
        # No spare left: an excluded node that answers again serves once more, before the queue.
        once = args.dead_file.with_name(args.dead_file.name + RETURNED_SUFFIX)
        returned = taken_back(allocated, dead, [*new_dead, *read_dead(once)], het)
        if returned:
            with once.open("a") as f:
                f.write("".join(f"{n}\n" for n in returned))
            dead = [n for n in dead if n not in returned]
            chosen = pick(allocated, args.need, dead)
        if isinstance(chosen, str) and fewest is not None:
            # Still short: the groups that may (min_nodes) go on packed onto their survivors.
            chosen = pick(allocated, args.need, dead, fewest)
    args.dead_file.write_text("".join(f"{n}\n" for n in dead))
    names = _components(args.run_dir)
    comps = []
    for g, nodes in enumerate(allocated):
        used = args.used[g].split(",") if g < len(args.used) else []
        new = chosen[g] if not isinstance(chosen, str) else []
        comps.append({"component": names[g] if g < len(names) else str(g), "old": used, "new": new,
                      "replaced": [{"dead": d, "by": b} for d, b in zip(
                          [x for x in used if x not in new], [x for x in new if x not in used], strict=False)],
                      "spares_left": max(0, len([x for x in nodes if x not in dead]) - args.need[g]),
                      **({"packed": {"nodes": len(new), "of": args.need[g]}} if 0 < len(new) < args.need[g] else {})})
    action = "requeue" if isinstance(chosen, str) else "restart"
    if not new_dead:
        reason = "no dead node identified: restarting on the same nodes" if action == "restart" else str(chosen)
    else:
        reason = "; ".join(f"{n}: {w}" for n, w in why.items())
        reason += "" if action == "restart" else f"; {chosen}: requeue"
    packed = [f"{c['component']} on {c['packed']['nodes']} of its {c['packed']['of']} nodes" for c in comps
              if "packed" in c]
    if packed and action == "restart":
        reason += "; no spare left, ranks packed (min_nodes): " + ", ".join(packed)
    if returned:
        reason += "; no spare left, taken back: " + "; ".join(f"{n} {w}" for n, w in returned.items())
    append_event(args.run_dir.resolve(), "node_failure", restart_count=args.restart, dead_nodes=new_dead,
                 excluded=dead, components=comps, action=action, reason=reason, returned=sorted(returned))
    sys.stderr.write(f"hetrun: attempt {args.restart} failed; {reason}; {action}\n")
    print(action)
    return 0


if __name__ == "__main__":
    sys.exit(main())
