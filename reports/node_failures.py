"""What `hetrun status` and `hetrun report` say about node failures (issue 25): per failed
attempt, the dead node, the node that replaced it, where every rank's state came from
(peer memory on which node, or the store, and why) and the work lost.

Read from events.jsonl: ``node_failure`` (the batch script's decision,
slurm_plugin/node_recovery.py), then the next attempt's ``restore`` and
``memory_restore`` lines (runtime/recovery.py) and its ranks' ``startup`` lines
(``warm_start``: forked from the node's warm server, runtime/warm_start.py). And the memory tier's
cost from its ranks' ``memory_tier`` lines (``memory_tier_summary``: `hetrun report` only).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from hetrun.rundir import DEFAULTS

from .reader import EventStream


def _state_text(restores: list[Mapping[str, Any]], memory: list[Mapping[str, Any]]) -> str:
    if not restores:
        return "state: no restore seen yet"
    by_source = {e.get("source") or "store" for e in restores}
    step = sorted({e.get("step") for e in restores if e.get("step") is not None})
    if by_source == {"memory"}:
        copies = ", ".join(f"rank {e.get('rank')} {'own copy' if e.get('from_kind') == 'own' else 'replica'} "
                           f"on {e.get('from_node')}" for e in sorted(restores, key=lambda e: e.get("rank") or 0))
        text = f"state from peer memory, step {step[0] if step else '?'} ({copies})"
    else:
        why = next((m.get("reason") for m in memory if not m.get("used") and m.get("reason")), None)
        text = f"state from the store, step {step[0] if step else '?'}" + (f" (memory: {why})" if why else "")
    rejected = {(r.get("owner"), r.get("node")) for m in memory for r in m.get("rejected") or []}
    if rejected:
        text += "; copies that failed their checksum (not used): " + ", ".join(
            f"rank {o} on {n}" for o, n in sorted(rejected, key=str))
    return text


def _when(e: Mapping[str, Any]) -> float:
    t = e.get("time", e.get("t"))
    return float(t) if isinstance(t, (int, float)) else 0.0


def failure_lines(records: Iterable[Mapping[str, Any]]) -> list[str]:
    """One line per node_failure event."""
    evs = list(records)
    out = []
    fails = [e for e in evs if e.get("ev") == "node_failure"]
    for i, f in enumerate(fails):
        start = _when(f)
        end = _when(fails[i + 1]) if i + 1 < len(fails) else float("inf")
        r = f.get("restart_count")
        nxt = r + 1 if isinstance(r, int) else None
        dead = ", ".join(f.get("dead_nodes") or []) or "none identified"
        moves = []
        for c in f.get("components") or []:
            for rep in c.get("replaced") or []:
                moves.append(f"{c.get('component')}: {rep.get('dead')} -> {rep.get('by')}")
            packed = c.get("packed")
            if isinstance(packed, Mapping):  # no spare left: its ranks on fewer nodes (min_nodes)
                moves.append(f"{c.get('component')}: ranks packed onto {packed.get('nodes')} of "
                             f"{packed.get('of')} nodes ({', '.join(c.get('new') or [])})")
        spares = ", ".join(f"{c.get('component')} {max(0, c.get('spares_left') or 0)}"
                           for c in f.get("components") or [])
        if f.get("action") == "restart":
            restores = [e for e in evs if e.get("ev") == "restore" and e.get("restart_count") == nxt]
            memory = [e for e in evs if e.get("ev") == "memory_restore" and start <= _when(e) < end]
            lost = [e["work_lost"] for e in restores if isinstance(e.get("work_lost"), int)]
            ups = [e for e in evs if e.get("ev") == "startup" and e.get("restart_count") == nxt]
            warm = sum(bool(e.get("warm_start")) for e in ups)
            # runtime/warm_start.py: how many new ranks forked from their node's warm server
            started = f"; ranks started warm: {warm} of {len(ups)}" if ups else ""
            tail = (f"restarted inside the allocation ({'; '.join(moves) or 'same nodes'}; spares left: {spares}); "
                    f"{_state_text(restores, memory)}; work lost: "
                    + (f"{max(lost)} iteration(s)" if lost else "unknown") + started)
        else:
            tail = f"requeued: {f.get('reason')}"
        out.append(f"attempt {r}: node(s) {dead} failed ({f.get('reason')}); {tail}")
    return out


BUDGET = DEFAULTS.memory_budget  # the adaptive N's (runtime/memory_tier.py pulls torch: not imported)


def memory_tier_line(records: Iterable[Mapping[str, Any]]) -> str | None:
    """The memory tier's cost as its ranks' ``memory_tier`` events (at their close) last said: the
    N in effect, the share of the training thread, and whether ``checkpoint.memory_every_max`` held
    the adaptive N below what the 2 % budget asked for (runtime/memory_tier.py)."""
    newest: dict[Any, Mapping[str, Any]] = {}
    for e in records:
        if e.get("ev") == "memory_tier":
            key = (e.get("component"), e.get("rank"))
            if key not in newest or _when(e) >= _when(newest[key]):
                newest[key] = e
    if not newest:
        return None
    ranks = list(newest.values())

    def share(e: Mapping[str, Any]) -> float:
        wall = sum(float(v.get("wall_s") or 0.0) for v in (e.get("by_every") or {}).values())
        return float(e.get("seconds") or 0.0) / wall if wall > 0 else 0.0

    top = max(ranks, key=share)
    every = sorted({e.get("every") for e in ranks if isinstance(e.get("every"), int)})
    caps = {e.get("every_max") for e in ranks if isinstance(e.get("every_max"), int)}
    how = f"auto, at most {max(caps)}" if caps else "fixed"
    text = (f"memory tier: a snapshot every {'/'.join(map(str, every)) or '?'} iteration(s) ({how}); "
            f"{max(int(e.get('snapshots') or 0) for e in ranks)} snapshots, "
            f"{max(int(e.get('bytes') or 0) for e in ranks) / 1024:.0f} KiB a rank; "
            f"{100 * share(top):.2f} % of the training thread at most (rank {top.get('rank')}"
            + (f", {top.get('component')}" if top.get("component") else "") + ")")
    wanted = max((int(e.get("wanted_most") or 1) for e in ranks), default=1)
    # Said only where the cap cost the budget: a run whose N wanted more for a while but whose
    # tier stayed within 2 % over the run has nothing to trade.
    if caps and wanted > max(caps) and share(top) > BUDGET:
        text += (f"; over the 2 % budget: it asked for N = {wanted} at its most, held at {max(caps)} by "
                 f"checkpoint.memory_every_max (a node death costs at most about N iterations: raise it "
                 f"to {wanted} to trade those for speed)")
    return text


def node_failure_lines(run_dir: str | Path) -> list[str]:
    try:  # only the kinds failure_lines reads: the other lines are not parsed (`hetrun status` calls this per run)
        return failure_lines(EventStream(run_dir, kinds=("node_failure", "restore", "memory_restore", "startup")))
    except OSError:
        return []


def memory_tier_summary(run_dir: str | Path) -> str | None:
    """``memory_tier_line`` of a run directory (`hetrun report`), None without a memory tier."""
    try:
        return memory_tier_line(EventStream(run_dir, kinds=("memory_tier",)))
    except OSError:
        return None
