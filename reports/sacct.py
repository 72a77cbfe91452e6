"""Slurm accounting for ``hetrun report``: ``sacct --json -D`` per het component and attempt.

``-D`` (duplicates) lists every attempt of a requeued job, oldest first, so
the rows span requeues. MaxRSS is the largest step's maximum resident memory
(``steps[].tres.requested.max`` mem). Whatever goes wrong (no sacct, no
accounting storage, a job accounting forgot) becomes a one-line note, never
an exception: accounting is an extra, the run directory is the record.
Only a subprocess is run here (no Slurm library): ``runtime`` does not import
``slurm_plugin``.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Mapping, Sequence
from typing import Any

Runner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]


def _run(cmd: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=30, check=False)


def _num(v: Any) -> int | None:
    """Slurm JSON numbers: plain, or ``{"set": bool, "number": n}`` in newer versions."""
    if isinstance(v, dict):
        return int(v["number"]) if v.get("set") and "number" in v else None
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _state(v: Any) -> str:
    if isinstance(v, dict):
        return _state(v.get("current"))
    if isinstance(v, list):
        return str(v[0]) if v else "UNKNOWN"
    return str(v or "UNKNOWN")


def _exit(v: Any) -> str:
    """``code:signal`` as sacct prints it."""
    if not isinstance(v, dict):
        return "-"
    sig = (v.get("signal") or {}).get("signal_id") if isinstance(v.get("signal"), dict) else None
    return f"{_num(v.get('return_code')) or 0}:{sig or 0}"


def tres_text(items: Any) -> str:
    """AllocTRES as sacct prints it: cpu=2,mem=600M,node=2,gres/gpu=2."""
    out = []
    for t in items or []:
        if not isinstance(t, dict) or t.get("type") in ("billing", "energy"):
            continue
        key = f"{t['type']}/{t['name']}" if t.get("name") else str(t.get("type"))
        count = _num(t.get("count"))
        out.append(f"{key}={count}M" if t.get("type") == "mem" else f"{key}={count}")
    return ",".join(out)


def tres_counts(items: Any) -> dict[str, int]:
    """{"cpu": n, "node": n, "gres/gpu": n, "mem": MB} from an allocated TRES list."""
    out: dict[str, int] = {}
    for t in items or []:
        if isinstance(t, dict) and _num(t.get("count")) is not None:
            key = f"{t['type']}/{t['name']}" if t.get("name") else str(t.get("type"))
            out[key] = _num(t.get("count")) or 0
    return out


def _max_rss(steps: Any) -> int | None:
    best = None
    for s in steps or []:
        for t in ((s.get("tres") or {}).get("requested") or {}).get("max") or []:
            if isinstance(t, dict) and t.get("type") == "mem" and _num(t.get("count")) is not None:
                best = max(best or 0, _num(t.get("count")) or 0)
    return best


def accounting_rows(doc: Mapping[str, Any], leader: str, components: Sequence[str], *,
                    name: str | None = None, not_before: float | None = None) -> list[dict[str, Any]]:
    """One row per (component, attempt) of het job ``leader`` from a ``sacct --json -D`` document.

    ``name`` and ``not_before`` (the run's name and submit time) drop records of
    another job that had the same id (a cluster whose job ids started over)."""
    rows: list[dict[str, Any]] = []
    attempt_of: dict[int, int] = {}
    for job in doc.get("jobs") or []:
        het = job.get("het") or {}
        jid = _num(job.get("job_id"))
        if str(_num(het.get("job_id")) or jid) != leader:
            continue
        if name and job.get("name") not in (None, name):
            continue
        submitted = _num((job.get("time") or {}).get("submission"))
        if not_before is not None and submitted is not None and submitted < not_before - 120:
            continue
        offset = _num(het.get("job_offset")) or 0
        attempt_of[offset] = attempt_of.get(offset, -1) + 1
        t = job.get("time") or {}
        alloc = (job.get("tres") or {}).get("allocated")
        rows.append({
            "component": components[offset] if offset < len(components) else f"group{offset}",
            "job_id": str(jid), "attempt": attempt_of[offset], "state": _state(job.get("state")),
            "partition": job.get("partition"), "submit": _num(t.get("submission")),
            "start": _num(t.get("start")), "end": _num(t.get("end")), "elapsed_s": _num(t.get("elapsed")),
            "alloc_tres": tres_text(alloc), "tres": tres_counts(alloc), "nodes": str(job.get("nodes") or ""),
            "exit_code": _exit(job.get("exit_code")), "max_rss": _max_rss(job.get("steps")),
        })
    return sorted(rows, key=lambda r: (r["attempt"], components.index(r["component"])
                                       if r["component"] in components else 99))


def slurm_accounting(job_id: str | None, backend: str | None, components: Sequence[str],
                     runner: Runner = _run, *, name: str | None = None,
                     not_before: float | None = None) -> dict[str, Any]:
    """{"rows": [...], "note": str | None} for a run's het job."""
    leader = (job_id or "").split(";", 1)[0].strip()
    if backend == "local":
        return {"rows": [], "note": "local run: no Slurm accounting"}
    if not leader.isdigit():
        return {"rows": [], "note": "no Slurm job id in run.json: no accounting"}
    try:
        proc = runner(["sacct", "--json", "-D", "-j", leader])
    except FileNotFoundError:
        return {"rows": [], "note": "sacct is not installed here: no Slurm accounting"}
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"rows": [], "note": f"sacct did not answer: {exc}"}
    text = (proc.stderr or "").strip()
    if proc.returncode != 0 or not (proc.stdout or "").strip():
        if "accounting storage is disabled" in text.lower() or "slurmdbd" in text.lower():
            return {"rows": [], "note": "Slurm accounting is not configured (no slurmdbd): sacct has no records"}
        return {"rows": [], "note": f"sacct failed: {text.splitlines()[0] if text else f'exit {proc.returncode}'}"}
    try:
        doc = json.loads(proc.stdout)
    except json.JSONDecodeError:
        return {"rows": [], "note": "sacct --json printed something that is not JSON (Slurm older than 21.08?)"}
    rows = accounting_rows(doc if isinstance(doc, dict) else {}, leader, list(components),
                           name=name, not_before=not_before)
    return {"rows": rows, "note": None if rows else f"sacct has no record of job {leader}"}
