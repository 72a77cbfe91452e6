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
script starts the next step at once ("restart"), else it requeues ("requeue")
as before. Each decision is a ``node_failure`` event: the dead nodes, each
component's old and new node list, the spares left, the action and why.

Like the post-mortem, this imports no runtime code and no torch (it runs in the
batch shell between steps). CLI:

    python -m hetrun.slurm_plugin.node_recovery nodes RUN_DIR --dead-file F --need N0 [N1 ...]
    python -m hetrun.slurm_plugin.node_recovery failed RUN_DIR --dead-file F --restart R \\
        --need N0 [N1 ...] --used LIST0 [LIST1 ...]
    python -m hetrun.slurm_plugin.node_recovery stale RUN_DIR --dead-file F --restart R --need N0 \\
        --node X --age S --timeout T

``stale``: the batch script's heartbeat monitor found node X silent (every
rank's node touches ``logs/alive/<node>`` each 0.5 s, runtime/recovery.py):
its ranks get ``rank_failure`` lines (``detected_by: heartbeat``) and X goes into
the dead-node file; the script then SIGKILLs the step.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from .rundir import append_event, events_of

_NODE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
# Node states after which a node gets no more steps of this job (scontrol's State=, flags joined by +).
DEAD_STATES = ("DOWN", "NOT_RESPONDING", "FAIL", "DRAIN")


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


def pick(allocated: Sequence[Sequence[str]], need: Sequence[int], dead: Sequence[str]) -> list[list[str]] | str:
    """The first ``need[g]`` live nodes of each group; or why there are not enough."""
    out = []
    for g, (nodes, n) in enumerate(zip(allocated, need, strict=True)):
        live = [x for x in nodes if x not in dead]
        if len(live) < n:
            return (f"het group {g}: {len(live)} live node(s) of {len(nodes)} allocated, {n} needed "
                    f"(dead: {', '.join(x for x in nodes if x in dead) or 'none'}); no spare node left")
        out.append(live[:n])
    return out


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


def dead_after(run_dir: Path, restart: int, allocated: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """(nodes to exclude after attempt ``restart``, why each)."""
    why: dict[str, str] = {}
    for f in events_of(run_dir, ("rank_failure",)):
        node = f.get("node")
        if f.get("restart_count") == restart and isinstance(node, str) and node in allocated:
            why.setdefault(node, f"rank {f.get('rank')} ({f.get('component') or '?'}) died there")
    for node, state in node_states(allocated).items():
        if any(s in state.split("+") or state.startswith(s) for s in DEAD_STATES):
            why.setdefault(node, f"Slurm reports it {state}")
    return list(why), why


def name_stale(run_dir: Path, restart: int, node: str, age: float, timeout: float) -> list[dict[str, object]]:
    """``rank_failure`` lines (``detected_by: heartbeat``) for every rank of this attempt on
    ``node``, whose heartbeat stopped: the node (or every rank on it) is presumed dead."""
    message = (f"node {node} silent for {age:.0f} s (no heartbeat within HETRUN_NODE_TIMEOUT={timeout:g} s): "
               "presumed dead")
    out = []
    for rec in events_of(run_dir, ("start",)):
        if rec.get("restart_count", 0) == restart and rec.get("node") == node:
            out.append(append_event(run_dir, "rank_failure", rank=rec.get("rank"), component=rec.get("component"),
                                    node=node, signal=None, exit_code=None, message=message,
                                    detected_by="heartbeat", restart_count=restart))
    return out


def _components(run_dir: Path) -> list[str]:
    import json

    try:
        plan = json.loads((run_dir / "plan.json").read_text())
        return [str(c["name"]) for c in plan.get("components") or []]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hetrun.slurm_plugin.node_recovery", description=__doc__)
    p.add_argument("mode", choices=("nodes", "failed", "stale"))
    p.add_argument("run_dir", type=Path)
    p.add_argument("--dead-file", type=Path, required=True)
    p.add_argument("--need", type=int, nargs="+", required=True, help="nodes each het group's step runs on")
    p.add_argument("--restart", type=int, default=0, help="the attempt that failed (failed)")
    p.add_argument("--used", nargs="*", default=[], help="the node list each group's failed step ran on")
    p.add_argument("--node", default="", help="stale: the node whose heartbeat stopped")
    p.add_argument("--age", type=float, default=0.0, help="stale: seconds since its last heartbeat")
    p.add_argument("--timeout", type=float, default=0.0, help="stale: HETRUN_NODE_TIMEOUT")
    args = p.parse_args(argv)
    if args.mode == "stale":
        if not _NODE_RE.fullmatch(args.node):
            sys.stderr.write(f"hetrun: node_recovery stale: bad node name {args.node!r}\n")
            return 2
        named = name_stale(args.run_dir.resolve(), args.restart, args.node, args.age, args.timeout)
        with args.dead_file.open("a") as fh:
            fh.write(f"{args.node}\n")
        sys.stderr.write(f"hetrun: node {args.node} silent for {args.age:.0f} s: presumed dead "
                         f"(ranks {', '.join(str(r['rank']) for r in named) or 'none started'})\n")
        return 0
    allocated = group_nodes(os.environ, len(args.need))
    dead = read_dead(args.dead_file)
    if args.mode == "nodes":
        chosen = pick(allocated, args.need, dead)
        if isinstance(chosen, str):
            sys.stderr.write(f"hetrun: {chosen}\n")
            return 1
        print("\n".join(",".join(nodes) for nodes in chosen))
        return 0
    flat = [n for nodes in allocated for n in nodes]
    new_dead, why = dead_after(args.run_dir.resolve(), args.restart, flat)
    dead = list(dict.fromkeys([*dead, *new_dead]))
    args.dead_file.parent.mkdir(parents=True, exist_ok=True)
    args.dead_file.write_text("".join(f"{n}\n" for n in dead))
    chosen = pick(allocated, args.need, dead)
    names = _components(args.run_dir)
    comps = []
    for g, nodes in enumerate(allocated):
        used = args.used[g].split(",") if g < len(args.used) else []
        new = chosen[g] if not isinstance(chosen, str) else []
        comps.append({"component": names[g] if g < len(names) else str(g), "old": used, "new": new,
                      "replaced": [{"dead": d, "by": b} for d, b in zip(
                          [x for x in used if x not in new], [x for x in new if x not in used], strict=False)],
                      "spares_left": len([x for x in nodes if x not in dead]) - args.need[g]})
    action = "requeue" if isinstance(chosen, str) else "restart"
    if not new_dead:
        reason = "no dead node identified: restarting on the same nodes" if action == "restart" else chosen
    else:
        reason = "; ".join(f"{n}: {w}" for n, w in why.items())
        reason += "" if action == "restart" else f"; {chosen}: requeue"
    append_event(args.run_dir.resolve(), "node_failure", restart_count=args.restart, dead_nodes=new_dead,
                 excluded=dead, components=comps, action=action, reason=reason)
    sys.stderr.write(f"hetrun: attempt {args.restart} failed; {reason}; {action}\n")
    print(action)
    return 0


if __name__ == "__main__":
    sys.exit(main())
