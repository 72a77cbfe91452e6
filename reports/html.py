"""``hetrun report RUN --html FILE``: one self-contained HTML file with inline SVG, no scripts.

Sections: summary, placement (per range of attempts), per-rank timeline (busy time per action type per slice),
busy actions over time (all ranks), throughput over time, utilization per
component and node (resource samples), checkpoint sizes, restarts. Everything
user-controlled is escaped; the page loads nothing from anywhere.
"""

from __future__ import annotations

from html import escape
from typing import Any

from hetrun.reports.timeline_view import COLOURS

_CSS = {"green": "#2ca02c", "blue": "#1f77b4", "magenta": "#c837ab", "cyan": "#17becf", "yellow": "#d6a700",
        "white": "#7f7f7f", "bright_blue": "#6baed6"}
_W, _ROW = 900, 14


def _colour(kind: str) -> str:
    return _CSS.get(COLOURS.get(kind, "white"), "#7f7f7f")


def _timeline_svg(tl: dict[str, Any], labels: dict[int, str]) -> str:
    n, ranks = int(tl.get("buckets") or 0), tl.get("ranks") or {}
    if not n or not ranks:
        return "<p>no actions yet</p>"
    w = _W / n
    bucket_s = float(tl["bucket_s"])
    parts = []
    for y, rank in enumerate(sorted(ranks, key=int)):
        parts.append(f'<text x="0" y="{y * _ROW + 11}" font-size="11">{escape(labels.get(int(rank), rank))}</text>')
        for kind, values in ranks[rank]["busy"].items():
            for i, v in enumerate(values):
                if v > 0:
                    h = max(1.0, min(1.0, v / bucket_s) * (_ROW - 2))
                    parts.append(f'<rect x="{120 + i * w:.2f}" y="{y * _ROW + _ROW - 1 - h:.2f}" width="{w:.2f}" '
                                 f'height="{h:.2f}" fill="{_colour(kind)}"><title>{escape(kind)}</title></rect>')
        for t, kind in ranks[rank]["marks"]:
            x = 120 + min(_W, t / bucket_s * w)
            parts.append(f'<line x1="{x:.2f}" x2="{x:.2f}" y1="{y * _ROW}" y2="{y * _ROW + _ROW}" stroke="black">'
                         f'<title>{escape(kind)} at {t:.1f}s</title></line>')
    height = len(ranks) * _ROW + 16
    parts.append(f'<text x="120" y="{height - 2}" font-size="10">0 s</text>'
                 f'<text x="{120 + _W - 40}" y="{height - 2}" font-size="10">{n * bucket_s:.0f} s</text>')
    legend = " ".join(f'<span style="color:{_colour(k)}">■ {escape(k)}</span>'
                      for k in sorted({k for r in ranks.values() for k in r["busy"]}))
    return (f'<p>{legend}; lines: start, checkpoint, restore, error</p>'
            f'<svg xmlns="http://www.w3.org/2000/svg" class="timeline" width="{_W + 130}" height="{height}">'
            f'{"".join(parts)}</svg>')


def _busy_svg(tl: dict[str, Any]) -> str:
    """Busy ranks over time (sum over ranks of busy seconds per slice / slice length)."""
    n, ranks = int(tl.get("buckets") or 0), tl.get("ranks") or {}
    if not n:
        return ""
    bucket_s = float(tl["bucket_s"])
    totals = [sum(sum(v[i] for v in r["busy"].values() if i < len(v)) for r in ranks.values()) / bucket_s
              for i in range(n)]
    return _line_svg("busy", totals, "#1f77b4", "busy ranks")


def _line_svg(css: str, values: list[float], colour: str, unit: str) -> str:
    """One line over the run's time buckets, scaled to its own maximum (labelled)."""
    n, top = len(values), max(max(values), 1e-9)
    pts = " ".join(f"{i * _W / n:.1f},{100 - 95 * v / top:.1f}" for i, v in enumerate(values))
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="{css}" width="{_W}" height="110">'
            f'<polyline points="{pts}" fill="none" stroke="{colour}"/>'
            f'<text x="2" y="10" font-size="10">{top:.1f} {unit}</text></svg>')


def _throughput_svg(tl: dict[str, Any]) -> str:
    """Env steps per second over time (samples per second when the run has no rollouts)."""
    n, work = int(tl.get("buckets") or 0), tl.get("work") or {}
    unit = next((k for k in ("env_steps", "samples") if any(work.get(k) or [])), None)
    if not n or unit is None:
        return "<p>no env steps or samples recorded</p>"
    bucket_s = float(tl["bucket_s"])
    rates = [v / bucket_s for v in work[unit][:n]]
    return _line_svg("throughput", rates, "#2ca02c", f'{unit.replace("_", " ")}/s')


def _util_svg(res: dict[str, Any]) -> str:
    """Mean CPU % (and GPU utilization when NVML saw a GPU) per component and node, from the samples."""
    rows = [r for r in res.get("rows") or [] if r.get("cpu_pct") is not None or r.get("gpu_util") is not None]
    if not rows:
        return f"<p>{escape(str(res.get('note') or 'no resource samples'))}</p>"
    bars, top = [], max(100.0, *(max(r.get("cpu_pct") or 0, r.get("gpu_util") or 0) for r in rows))
    for y, r in enumerate(rows):
        label = f'{r["component"]} @ {r["node"]}'
        bars.append(f'<text x="0" y="{y * 30 + 12}" font-size="11">{escape(label)}</text>')
        for j, (key, colour) in enumerate((("cpu_pct", "#1f77b4"), ("gpu_util", "#d6a700"))):
            if r.get(key) is not None:
                w = (_W - 200) * float(r[key]) / top
                bars.append(f'<rect x="200" y="{y * 30 + j * 12 + 2:.1f}" width="{w:.1f}" height="10" '
                            f'fill="{colour}"><title>{key} {float(r[key]):.1f}%</title></rect>')
    note = f"<p>{escape(res['note'])}</p>" if res.get("note") else ""
    return (f'<p><span style="color:#1f77b4">■ CPU %</span> <span style="color:#d6a700">■ GPU util %</span>'
            f' (means over the run; full width = {top:.0f}%)</p>{note}<svg xmlns="http://www.w3.org/2000/svg" '
            f'class="utilization" width="{_W}" height="{len(rows) * 30}">{"".join(bars)}</svg>')


def _ckpt_svg(rows: list[dict[str, Any]]) -> str:
    rows = [r for r in rows if r.get("stored_bytes")]
    if not rows:
        return "<p>no checkpoints in the store</p>"
    top = max(r["state_bytes"] or r["stored_bytes"] for r in rows)
    bw = min(40.0, _W / len(rows))
    bars = []
    for i, r in enumerate(rows):
        h = 100 * r["stored_bytes"] / top
        bars.append(f'<rect x="{i * bw:.1f}" y="{110 - h:.1f}" width="{bw - 2:.1f}" height="{h:.1f}" fill="#2ca02c">'
                    f'<title>{escape(r["component"])} step {r["step"]}: {r["stored_bytes"]} bytes added</title></rect>')
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="checkpoints" width="{_W}" height="112">'
            f'{"".join(bars)}</svg>')


def _restored(comps: dict[str, Any]) -> str:
    return ", ".join(f"{c}: {v['state']}" + (f" at step {v['step']}" if v["step"] is not None else "")
                     for c, v in comps.items())


def _placement_table(section: dict[str, Any]) -> str:
    """Per range of attempts and component: where it was placed, why, and what lost."""
    from hetrun.reports.placement import short_text, why_text

    rows = []
    for a in section.get("attempts") or []:
        first, last = a["first_restart"] + 1, a["last_restart"]
        span = f"{first}-" if last is None else f"{first}-{last + 1}"
        for r in a["components"]:
            why = why_text(r) if r["mode"] in ("auto", "ranked", "fit") else ""
            rows.append(f"<tr><td>{escape(span)}</td><td>{escape(r['component'])}</td><td>{escape(short_text(r))}"
                        f"</td><td>{escape(why)}</td><td>{'<br>'.join(escape(x) for x in r.get('lost') or [])}</td></tr>")
    if not rows:
        return "<p>no plan.json: placement unknown</p>"
    note = f"<p>{escape(section['note'])}</p>" if section.get("note") else ""
    return ("<table><tr><th>attempts</th><th>component</th><th>placement</th><th>why</th><th>lost</th></tr>"
            f"{''.join(rows)}</table>{note}")


def render_html(rep: Any) -> str:
    d = rep.to_dict()
    labels = {r.rank: f"{r.rank} {r.component}" for r in rep.ranks}
    restarts = "".join(
        f"<tr><td>{r['restart']}</td><td>{escape(r['cause_text'])}</td><td>{r['queue_wait_s']}</td>"
        f"<td>{escape(_restored(r['components']))}</td><td>{r['work_lost_iterations']}</td></tr>"
        for r in d["restart_history"])
    outcome = d["outcome"].get("outcome", "-")
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>hetrun report {escape(rep.name)}</title>
<style>body{{font-family:sans-serif;margin:1em}} td,th{{padding:2px 8px;text-align:left}}</style></head>
<body><h1>hetrun report: {escape(rep.name)}</h1>
<p>job {escape(str(rep.job_id))}, backend {escape(str(rep.backend))}, wall {rep.wall_s:.1f} s,
{rep.actions} actions, {rep.env_steps} env steps ({rep.steps_per_s:.1f}/s), outcome <b>{escape(outcome)}</b>,
restarts {d['counts'].get('restarts', 0)}, work lost {escape(str(rep.work_lost))} iteration(s),
cost {d['cost'].get('total', 0):.4f} {escape(str(d['cost'].get('currency', '')))}</p>
<h2>Placement</h2>{_placement_table(d.get("placement") or {})}
<h2>Timeline per rank</h2>{_timeline_svg(d["timeline"], labels)}
<h2>Busy ranks over time</h2>{_busy_svg(d["timeline"])}
<h2>Throughput over time</h2>{_throughput_svg(d["timeline"])}
<h2>Utilization (resource samples)</h2>{_util_svg(d.get("resources") or {})}
<h2>Checkpoint bytes added</h2>{_ckpt_svg(d["checkpoint_history"]["rows"])}
<h2>Restarts</h2><table><tr><th>restart</th><th>cause</th><th>queue wait s</th><th>restored</th>
<th>iterations lost</th></tr>{restarts}</table>
</body></html>
"""
