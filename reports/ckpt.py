"""Checkpoint history for ``hetrun report``: every checkpoint of every component.

Sizes and times come from the store's own listing (``CheckpointStore.info``:
the manifests, read by the store, never parsed here); the ``checkpoint``
events add checkpoints the store no longer holds (pruned by ``keep``, or a
write that failed). ``ratio`` is the bytes a checkpoint added to the store
over the bytes of the full state (what a ``torch.save`` of it would write,
less pickle framing). ``verified``: ``restored`` when a restart restored that
step on every rank of the component (restore checks every chunk's digest),
``ok``/``CORRUPT`` after ``verify=True`` (decodes every chunk: slow), else ``-``.
The store is imported only here, when a report asks for it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hetrun.runtime.plan_view import checkpoint_root

from hetrun.errors import HetrunError

_NOT_IN_STORE = "not in the store (pruned by checkpoint.keep, or never completed)"


def store_root(run_dir: Path, plan: dict[str, Any]) -> Path:
    """``checkpoint.directory`` from plan.json (relative to the run directory), else ``<run_dir>/ckpt``."""
    return checkpoint_root(run_dir, (plan.get("checkpoint") or {}).get("directory"))


def _restored_steps(history: list[dict[str, Any]]) -> set[tuple[str, Any]]:
    return {(comp, c["step"]) for r in history for comp, c in r["components"].items() if c["state"] == "restored"}


def checkpoint_history(run_dir: Path, plan: dict[str, Any], events: list[dict[str, Any]],
                       restarts: list[dict[str, Any]], *, verify: bool = False) -> dict[str, Any]:
    """{"rows": [...], "notes": [...]}: one row per (component, step), oldest first."""
    root = store_root(run_dir, plan)
    notes: list[str] = []
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    stores = sorted(p for p in root.iterdir() if (p / "manifests").is_dir()) if root.is_dir() else []
    if not stores:
        notes.append(f"no checkpoint store under {root}")
    restored = _restored_steps(restarts)
    for path in stores:
        try:
            _from_store(path, rows, restored, verify)
        except (HetrunError, OSError, ValueError) as exc:
            notes.append(f"checkpoint store {path}: {str(exc).splitlines()[0]}")
    for e in events:
        _from_event(e, rows)
    for (comp, step), row in rows.items():  # restored, then pruned by keep: still restored
        if not row["in_store"] and (comp, step) in restored:
            row["verified"] = "restored"
    ordered = [rows[k] for k in sorted(rows, key=lambda k: (k[1], k[0]))]
    return {"rows": ordered, "notes": notes, "summary": summarize(ordered)}


def summarize(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per component, what a one-line summary says: checkpoints written, how many the store
    still holds, the newest (step, time, full state bytes), the bytes the store holds, writes
    that failed, steps a restart restored."""
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        s = out.setdefault(r["component"], {"count": 0, "in_store": 0, "newest_step": None, "newest_created": None,
                                            "newest_state_bytes": None, "stored_bytes": 0, "failed": 0,
                                            "restored": 0})
        s["count"] += 1
        if r["in_store"]:
            s["in_store"] += 1
            s["stored_bytes"] += r["stored_bytes"] or 0
        if r.get("error") and not r["in_store"] and r["error"] != _NOT_IN_STORE:
            s["failed"] += 1
        if r["verified"] == "restored":
            s["restored"] += 1
        if s["newest_step"] is None or r["step"] >= s["newest_step"]:
            s["newest_step"], s["newest_created"] = r["step"], r.get("created")
            if r["state_bytes"] is not None:
                s["newest_state_bytes"] = r["state_bytes"]
    return out


def _from_store(path: Path, rows: dict[tuple[str, int], dict[str, Any]], restored: set[tuple[str, Any]],
                verify: bool) -> None:
    from hetrun.runtime.ckpt import open_store

    store = open_store(path)
    comp = path.name
    for info in store.info():
        verified = "restored" if (comp, info.step) in restored else "-"
        if verify:
            problems = store.verify(info.step)
            verified = "ok" if not problems else "CORRUPT: " + problems[0]
        rows[(comp, info.step)] = {
            "component": comp, "step": info.step, "created": info.created, "in_store": True,
            "reason": info.meta.get("reason"), "ranks": info.world_size,
            "state_bytes": info.raw_bytes, "stored_bytes": info.stored_bytes,
            "ratio": round(info.delta_ratio, 4), "stall_s": info.stall_s, "write_s": info.write_s,
            "save_s": round(info.stall_s + info.write_s, 6), "tiers": info.tiers, "verified": verified,
            "error": None,
        }


def _from_event(e: dict[str, Any], rows: dict[tuple[str, int], dict[str, Any]]) -> None:
    """A checkpoint event (one per rank) the store does not list: pruned, or its write failed."""
    info = e.get("info") if isinstance(e.get("info"), dict) else {}
    step = info.get("step", e.get("iteration"))
    comp = str(e.get("component", "?"))
    if not isinstance(step, int) or info.get("skipped"):
        return
    row = rows.get((comp, step))
    error = info.get("error")
    if row is None:
        rows[(comp, step)] = {
            "component": comp, "step": step, "created": e.get("time"), "in_store": False,
            "reason": e.get("reason"), "ranks": 1, "state_bytes": None, "stored_bytes": None,
            "ratio": None, "stall_s": info.get("stall_s"), "write_s": None, "save_s": None,
            "tiers": [], "verified": "-",
            "error": error or _NOT_IN_STORE,
        }
    elif not row["in_store"]:
        row["ranks"] += 1
        if isinstance(info.get("stall_s"), int | float):
            row["stall_s"] = max(row["stall_s"] or 0.0, float(info["stall_s"]))
    if error and row is not None:
        row["error"] = error
