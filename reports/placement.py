"""Where each component was placed, per attempt, for `hetrun report` and `hetrun status`.

plan.json holds the placement of the run's newest job: a ``placement: auto``
/ ``ranked`` (or ``--fit``) component's ``placement`` record (partition, GRES, score,
Slurm's start estimate, reasons, the candidates that lost; ranked: ``ranked``, the
partitions handed to Slurm best first, and the GRES they share), nothing for a
fixed one. ``hetrun resume`` / ``resubmit`` place auto components again and
overwrite plan.json; the plan it replaces is kept as
``logs/plan-before-attempt-<N>.json`` (N: the restart count of the new job's
first attempt), so each range of attempts has the plan it ran with. A Slurm
requeue (preemption) keeps its job's script, so its attempts share a placement.

Whether a component is auto or fixed comes from the run's job.yaml; every key
of the record but ``partition`` may be absent (older runs, newer fields).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from hetrun.rundir import JOB_YAML, LOGS, PLAN_JSON, RunPaths


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def yaml_modes(run_dir: Path) -> dict[str, str]:
    """Component -> ``placement`` as the run's job.yaml says it ("fixed" when absent)."""
    import yaml

    try:
        spec = yaml.safe_load((run_dir / JOB_YAML).read_text())
    except (OSError, yaml.YAMLError):
        return {}
    comps = spec.get("components") if isinstance(spec, dict) else None
    if not isinstance(comps, dict):
        return {}
    return {str(n): str((c or {}).get("placement") or "fixed") if isinstance(c, dict) else "fixed"
            for n, c in comps.items()}


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def component_row(comp: dict[str, Any], yaml_mode: str | None, job_partition: str | None) -> dict[str, Any]:
    """One component's placement: ``mode`` auto (the YAML), fit (``--fit``), fixed, or
    unplaced (auto, but no choice recorded: the local backend, which has one place)."""
    name = str(comp.get("name", "?"))
    choice = comp.get("placement") if isinstance(comp.get("placement"), dict) else None
    nodes = comp.get("nodes") if isinstance(comp.get("nodes"), int) else None
    if choice is None:
        mode = "unplaced" if yaml_mode in ("auto", "ranked") else "fixed"
        return {"component": name, "mode": mode, "partition": job_partition, "gres": None, "node_count": nodes,
                "score": None, "start_in_s": None, "reasons": [], "lost": [], "pool_taken_at": None}
    gres = choice.get("gres")
    ranked = [str(p) for p in choice.get("ranked") or []]  # placement: ranked: Slurm's list, best first
    return {"component": name, "mode": yaml_mode if yaml_mode in ("auto", "ranked") else "fit",
            "partition": choice.get("partition"), "gres": gres if isinstance(gres, str) else None, "ranked": ranked,
            "nodelist": [str(n) for n in choice.get("nodelist") or []],  # a start by preemption: its victims' nodes
            "node_count": nodes, "node_count_chosen": isinstance(choice.get("node_count"), int),
            "score": _num(choice.get("score")), "start_in_s": _num(choice.get("start_in_s")),
            "reasons": [str(r) for r in choice.get("reasons") or []],
            "lost": [str(o) for o in choice.get("others") or []],
            "pool_taken_at": _num(choice.get("pool_taken_at"))}


def _plan_rows(plan: dict[str, Any], modes: dict[str, str]) -> list[dict[str, Any]]:
    part = (plan.get("slurm") or {}).get("partition") if isinstance(plan.get("slurm"), dict) else None
    return [component_row(c, modes.get(str(c.get("name"))), part)
            for c in plan.get("components") or [] if isinstance(c, dict)]


def archived_plans(run_dir: Path) -> list[tuple[int, Path]]:
    """(restart count of the job that replaced it, path) of every plan a resume replaced, oldest first."""
    return RunPaths(run_dir).archived_plans()


def ran_on(accounting_rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Where Slurm itself ran each component per attempt of the newest job (sacct's partition
    and nodes): the check on the placement, and what a multi-partition request ended up on."""
    return [{"component": r.get("component"), "job_id": r.get("job_id"), "attempt": r.get("attempt"),
             "partition": r.get("partition"), "nodes": r.get("nodes")}
            for r in accounting_rows if r.get("partition")]


def placement_section(run_dir: Path, plan: dict[str, Any], resumed_at: list[int] | None = None,
                      accounting_rows: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The report's ``placement`` section: {"attempts": [{"first_restart", "last_restart" (None:
    still the newest), "source", "components": [...]}], "ran_on", "note"}. ``resumed_at``: the
    restart counts of the run's ``resume`` events, to say which attempts' placement was not kept;
    ``accounting_rows``: sacct's rows of the newest job (``ran_on``)."""
    run_dir = Path(run_dir)
    modes = yaml_modes(run_dir)
    out, first = [], 0
    for restart, path in archived_plans(run_dir):
        out.append({"first_restart": first, "last_restart": restart - 1, "source": f"{LOGS}/{path.name}",
                    "components": _plan_rows(_read_json(path), modes)})
        first = restart
    note = None
    missing = sorted({r for r in resumed_at or () if r > first})
    if missing:  # resumed by a hetrun that did not keep the replaced plan
        note = (f"attempts before restart {missing[-1]} ran with a plan a resume replaced without keeping it; "
                "only the newest placement is known")
        first = missing[-1]
    out.append({"first_restart": first, "last_restart": None, "source": PLAN_JSON,
                "components": _plan_rows(plan, modes)})
    return {"attempts": out, "ran_on": ran_on(accounting_rows or []), "note": note}


def _where(row: dict[str, Any]) -> str:
    parts = [",".join(row["ranked"]) if row.get("ranked") else row.get("partition") or "the default partition"]
    if row.get("gres") and row["gres"] != "-":
        parts.append(row["gres"])
    if row.get("node_count"):  # "(chosen)": placement picked it from the component's node_counts:
        parts.append(f"{row['node_count']} node{'' if row['node_count'] == 1 else 's'}"
                     + (" (chosen)" if row.get("node_count_chosen") else ""))
    return " ".join(parts)


FIXED_TEXT = "fixed (from the YAML)"


def short_text(row: dict[str, Any]) -> str:
    """One cell of `hetrun status`: "auto: gpu-a100 gpu:a100 1 node", "fixed (from the YAML)"."""
    if row["mode"] == "fixed":
        return FIXED_TEXT
    if row["mode"] == "unplaced":
        return "auto: not placed (local backend)"
    return f"{'--fit' if row['mode'] == 'fit' else row['mode']}: {_where(row)}"


def row_lines(row: dict[str, Any]) -> list[str]:
    """A component's placement and, when it was chosen, why and which candidates lost."""
    name = row["component"]
    if row["mode"] == "fixed":
        return [f"{name}: fixed (from the YAML): {_where(row)}"]
    if row["mode"] == "unplaced":
        return [f"{name}: placement auto, not placed (no choice in the plan: the local backend has one place)"]
    how = {"auto": "", "ranked": " (ranked: Slurm starts it in the first that lets it start)"}.get(row["mode"],
                                                                                                  " by --fit")
    if row.get("nodelist"):
        how = f" (a start by preemption, on the named nodes {','.join(row['nodelist'])})"
    # "placed NAME on PARTITION GRES": the words `hetrun submit` has always printed (tests parse them)
    lines = [f"placed {name} on {_where(row)}{how} {why_text(row)}"]
    lines += [f"  lost: {other}" for other in row.get("lost") or []]
    return lines


def why_text(row: dict[str, Any]) -> str:
    """"(score 0.83, start in 0 s, pool at 01:02:03): reason; reason" of a placed component."""
    why = [f"score {row['score']:.2f}" if row.get("score") is not None else "score unknown",
           "no start estimate" if row.get("start_in_s") is None else f"start in {row['start_in_s']:.0f} s"]
    if row.get("pool_taken_at"):
        why.append(f"pool at {time.strftime('%H:%M:%S', time.localtime(row['pool_taken_at']))}")
    return f"({', '.join(why)})" + (f": {'; '.join(row['reasons'])}" if row.get("reasons") else "")


def _attempts_text(a: dict[str, Any]) -> str:
    first, last = a["first_restart"] + 1, a["last_restart"]
    if last is None:
        return f"attempt {first} on" if first > 1 else "every attempt"
    return f"attempt {first}" if last + 1 == first else f"attempts {first}-{last + 1}"


def placement_lines(section: dict[str, Any]) -> list[str]:
    """`hetrun report`'s placement text: per range of attempts (one range: no attempt label)."""
    ranges = section.get("attempts") or []
    rows = [r for a in ranges for r in a["components"]]
    if rows and all(r["mode"] == "fixed" for r in rows):  # the common case, in one line
        parts = sorted({f"partition {r['partition']}" if r.get("partition") else "the default partition"
                        for r in rows})
        return [f"placement: fixed (from the YAML) for every component ({', '.join(parts)})"]
    out = []
    for a in ranges:
        label = "" if len(ranges) == 1 else f" ({_attempts_text(a)}, from {a['source']})"
        out.append(f"placement{label}:")
        out += [f"  {line}" for row in a["components"] for line in row_lines(row)]
    by_comp: dict[str, list[str]] = {}
    first = ranges[-1]["first_restart"] if ranges else 0  # sacct counts the newest job's attempts from 0
    for r in section.get("ran_on") or []:
        by_comp.setdefault(str(r["component"]), []).append(
            f"attempt {first + int(r['attempt'] or 0) + 1} on {r['partition']} ({r['nodes'] or '?'})")
    out += [f"  Slurm ran {name} (sacct, job {section['ran_on'][0]['job_id']}): {', '.join(texts)}"
            for name, texts in by_comp.items()]
    if section.get("note"):
        out.append(f"note: {section['note']}")
    return out


def newest_by_component(section: dict[str, Any]) -> dict[str, str]:
    """Component -> `hetrun status`'s cell, with where an earlier attempt had it when it moved."""
    ranges = section.get("attempts") or []
    if not ranges:
        return {}
    newest = {r["component"]: r for r in ranges[-1]["components"]}
    before = {r["component"]: r for r in ranges[-2]["components"]} if len(ranges) > 1 else {}
    out = {}
    for name, row in newest.items():
        text = short_text(row)
        old = before.get(name)
        if old is not None and short_text(old) != text:
            was = _where(old) if old["mode"] in ("auto", "ranked", "fit") else short_text(old)
            text += f" (before attempt {ranges[-1]['first_restart'] + 1}: {was})"
        out[name] = text
    return out


__all__ = ["archived_plans", "component_row", "newest_by_component", "placement_lines", "placement_section",
           "ran_on", "row_lines", "short_text", "why_text", "yaml_modes"]
