"""``hetrun report A --vs B``: the figures of two runs side by side, with B/A.

Throughput, utilization, cost, restarts and checkpoint bytes; ratio is None
where A's figure is 0 or missing. Works on two built reports (RunReport).
"""

from __future__ import annotations

from typing import Any


def _ckpt_bytes(rep: Any) -> int:
    return sum(r["stored_bytes"] or 0 for r in (rep.checkpoint_history or {}).get("rows") or [])


def _busy(rep: Any) -> float:
    life = sum(c.life_s for c in rep.components)
    return sum(c.busy_s for c in rep.components) / life if life else 0.0


def _sampled(rep: Any, key: str) -> float | None:
    """Mean over components and nodes of a resource sample field (cpu_pct, gpu_util); None unsampled."""
    vals = [r[key] for r in (rep.resources or {}).get("rows") or [] if r.get(key) is not None]
    return sum(vals) / len(vals) if vals else None


def compare(a: Any, b: Any) -> list[dict[str, Any]]:
    """[{"metric", "unit", "a", "b", "ratio"}] for two RunReports."""
    rows: list[tuple[str, str, Any]] = [
        ("wall", "s", lambda r: r.wall_s),
        ("env steps / s", "1/s", lambda r: r.steps_per_s),
        ("samples / s", "1/s", lambda r: r.samples_per_s),
        ("actions / s", "1/s", lambda r: r.actions_per_s),
        ("iterations", "", lambda r: max((c.iterations for c in r.components), default=0)),
        ("busy (all ranks)", "%", lambda r: 100 * _busy(r)),
        ("CPU (samples, mean)", "%", lambda r: _sampled(r, "cpu_pct")),
        ("GPU util (samples, mean)", "%", lambda r: _sampled(r, "gpu_util")),
    ]
    names = [c.name for c in a.components] + [c.name for c in b.components if c.name not in
                                               {x.name for x in a.components}]
    for name in names:
        def s_iter(r: Any, name: str = name) -> float | None:
            return next((c.s_per_iteration for c in r.components if c.name == name), None)

        def busy(r: Any, name: str = name) -> float | None:
            return next((100 * c.busy_fraction for c in r.components if c.name == name), None)

        rows += [(f"{name}: s / iteration", "s", s_iter), (f"{name}: busy", "%", busy)]
    rows += [
        ("cost", (a.cost or {}).get("currency", ""), lambda r: (r.cost or {}).get("total")),
        ("cost / iteration", (a.cost or {}).get("currency", ""), lambda r: (r.cost or {}).get("per_iteration")),
        ("wasted", "%", lambda r: 100 * (r.cost or {}).get("wasted_share", 0.0)),
        ("node hours", "h", lambda r: r.node_hours),
        ("GPU hours", "h", lambda r: r.gpu_hours),
        ("restarts", "", lambda r: r.restarts),
        ("work lost", "iterations", lambda r: r.work_lost),
        ("checkpoints", "", lambda r: len((r.checkpoint_history or {}).get("rows") or [])),
        ("checkpoint bytes stored", "B", _ckpt_bytes),
    ]
    out = []
    for metric, unit, get in rows:
        va, vb = get(a), get(b)
        ratio = vb / va if isinstance(va, int | float) and isinstance(vb, int | float) and va else None
        out.append({"metric": metric, "unit": unit, "a": va, "b": vb, "ratio": ratio})
    return out
