"""``hetrun report RUN --html FILE``: one self-contained HTML file with inline SVG, no scripts.

Sections: summary (the outcome first), the return / loss curves over time (the ``curves`` the
report collects: an evaluation's return, the learner's or a command's logged loss), placement
(per range of attempts), per-rank timeline (busy time per action type per slice), busy ranks over
time, throughput over time, utilization per component and node (resource samples), checkpoint
sizes, restarts. Every chart has both axes drawn, ticked and titled with their units
(``_axes``). Everything user-controlled is escaped; the page loads nothing from anywhere.
"""

from __future__ import annotations

import re
from html import escape
from typing import Any

from hetrun.reports.timeline_view import COLOURS

_CSS = {"green": "#2ca02c", "blue": "#1f77b4", "magenta": "#c837ab", "cyan": "#17becf", "yellow": "#d6a700",
        "white": "#7f7f7f", "bright_blue": "#6baed6"}
_W, _ROW = 900, 14


def _colour(kind: str) -> str:
    return _CSS.get(COLOURS.get(kind, "white"), "#7f7f7f")


_LEFT, _TOP, _BOTTOM = 70, 8, 34  # room for the y tick labels, and the x ticks and title
_TIME_AXIS = "time since the run's first event (s)"


def _num(v: float) -> str:
    """A tick label: 3 significant digits, thousands as k / M."""
    a = abs(v)
    if a >= 1e6:
        return f"{v / 1e6:.3g}M"
    if a >= 1e4:
        return f"{v / 1e3:.3g}k"
    return f"{v:.3g}"


def _bytes(v: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(v) < 1024 or unit == "GiB":
            return f"{v:.0f} {unit}" if unit == "B" else f"{v:.1f} {unit}"
        v /= 1024
    return f"{v:.1f} GiB"


def _axes(w: float, h: float, x: tuple[float, float, str], y: tuple[float, float, str] | str,
          xfmt: Any = _num, yfmt: Any = _num, left: float = _LEFT) -> str:
    """Both axes of a plot area ``w`` x ``h`` at (``left``, _TOP): lines, 3 ticks each with their
    values, and the titles (with units); ``y`` a title alone: a categorical y axis (its labels
    drawn by the plot, e.g. one per rank)."""
    x0, x1, xt = x
    b = _TOP + h
    out = [f'<line x1="{left}" y1="{b}" x2="{left + w}" y2="{b}" stroke="black"/>',
           f'<line x1="{left}" y1="{_TOP}" x2="{left}" y2="{b}" stroke="black"/>']
    for f in (0.0, 0.5, 1.0):
        px = left + f * w
        out.append(f'<line x1="{px:.1f}" y1="{b}" x2="{px:.1f}" y2="{b + 4}" stroke="black"/>'
                   f'<text x="{px:.1f}" y="{b + 14}" font-size="10" text-anchor="middle">'
                   f'{escape(xfmt(x0 + f * (x1 - x0)))}</text>')
    out.append(f'<text class="axis-x" x="{left + w / 2:.1f}" y="{b + 28}" font-size="11" '
               f'text-anchor="middle">{escape(xt)}</text>')
    if not isinstance(y, str):
        y0, y1, yt = y
        for f in (0.0, 0.5, 1.0):
            py = b - f * h
            out.append(f'<line x1="{left - 4}" y1="{py:.1f}" x2="{left}" y2="{py:.1f}" stroke="black"/>'
                       f'<text x="{left - 6}" y="{py + 3:.1f}" font-size="10" text-anchor="end">'
                       f'{escape(yfmt(y0 + f * (y1 - y0)))}</text>')
        yt_text = escape(yt)
    else:
        yt_text = escape(y)
    out.append(f'<text class="axis-y" x="12" y="{_TOP + h / 2:.1f}" font-size="11" text-anchor="middle" '
               f'transform="rotate(-90 12 {_TOP + h / 2:.1f})">{yt_text}</text>')
    return "".join(out)


def _svg(css: str, w: float, h: float, body: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="{css}" width="{_LEFT + w + 20:.0f}" '
            f'height="{_TOP + h + _BOTTOM:.0f}">{body}</svg>')


def _curve_svg(key: str, curve: dict[str, Any]) -> str:
    """One metric over time (seconds from the first event), its own value range on the y axis."""
    pts = [(float(t), float(v)) for t, _, v in curve.get("points") or []]
    if not pts:
        return ""
    t1 = max(max(t for t, _ in pts), 1e-9)
    lo, hi = min(v for _, v in pts), max(v for _, v in pts)
    if hi - lo < 1e-12:
        lo, hi = lo - 1, hi + 1
    w, h = float(_W - _LEFT), 160.0
    line = " ".join(f"{_LEFT + w * t / t1:.1f},{_TOP + h - h * (v - lo) / (hi - lo):.1f}" for t, v in pts)
    dots = "".join(f'<circle cx="{_LEFT + w * t / t1:.1f}" cy="{_TOP + h - h * (v - lo) / (hi - lo):.1f}" r="2" '
                   f'fill="#c837ab"/>' for t, v in pts) if len(pts) <= 60 else ""
    where = "a command's logged step" if curve["kind"] == "step" else f"action {curve['kind']}"
    ytitle = f"{curve['name']} ({where})"
    css = "result_" + re.sub(r"\W", "_", key)  # one word: reports/png.py names the PNG after it
    return _svg(css, w, h,
                _axes(w, h, (0.0, t1, _TIME_AXIS), (lo, hi, ytitle))
                + f'<polyline points="{line}" fill="none" stroke="#c837ab"/>{dots}')


def _curves_html(curves: dict[str, Any]) -> str:
    """The return curves first (what an RL user looks for), then the losses."""
    from hetrun.reports.run_report import _RETURN_KEYS

    order = sorted(curves, key=lambda k: (curves[k]["name"] not in _RETURN_KEYS, k))
    charts = [_curve_svg(k, curves[k]) for k in order]
    return "".join(charts) or "<p>no return or loss was logged (an eval action, or run.log(step, loss=...))</p>"


def _timeline_svg(tl: dict[str, Any], labels: dict[int, str]) -> str:
    n, ranks = int(tl.get("buckets") or 0), tl.get("ranks") or {}
    if not n or not ranks:
        return "<p>no actions yet</p>"
    left = 120  # rank labels
    w = (_W - left) / n
    bucket_s = float(tl["bucket_s"])
    parts = []
    for y, rank in enumerate(sorted(ranks, key=int)):
        top = _TOP + y * _ROW
        parts.append(f'<text x="24" y="{top + 11}" font-size="11">{escape(labels.get(int(rank), rank))}</text>')
        for kind, values in ranks[rank]["busy"].items():
            for i, v in enumerate(values):
                if v > 0:
                    h = max(1.0, min(1.0, v / bucket_s) * (_ROW - 2))
                    parts.append(f'<rect x="{left + i * w:.2f}" y="{top + _ROW - 1 - h:.2f}" width="{w:.2f}" '
                                 f'height="{h:.2f}" fill="{_colour(kind)}"><title>{escape(kind)}</title></rect>')
        for t, kind in ranks[rank]["marks"]:
            x = left + min(_W - left, t / bucket_s * w)
            parts.append(f'<line x1="{x:.2f}" x2="{x:.2f}" y1="{top}" y2="{top + _ROW}" stroke="black">'
                         f'<title>{escape(kind)} at {t:.1f}s</title></line>')
    height = len(ranks) * _ROW
    legend = " ".join(f'<span style="color:{_colour(k)}">■ {escape(k)}</span>'
                      for k in sorted({k for r in ranks.values() for k in r["busy"]}))
    axes = _axes(_W - left, height, (0.0, n * bucket_s, _TIME_AXIS), "rank", left=left)
    return (f'<p>{legend}; lines: start, checkpoint, restore, error</p>'
            f'<svg xmlns="http://www.w3.org/2000/svg" class="timeline" width="{_W + 20}" '
            f'height="{_TOP + height + _BOTTOM}">{axes}{"".join(parts)}</svg>')


def _busy_svg(tl: dict[str, Any]) -> str:
    """Busy ranks over time (sum over ranks of busy seconds per slice / slice length)."""
    n, ranks = int(tl.get("buckets") or 0), tl.get("ranks") or {}
    if not n:
        return ""
    bucket_s = float(tl["bucket_s"])
    totals = [sum(sum(v[i] for v in r["busy"].values() if i < len(v)) for r in ranks.values()) / bucket_s
              for i in range(n)]
    return _line_svg("busy", totals, "#1f77b4", "busy ranks", bucket_s)


def _line_svg(css: str, values: list[float], colour: str, unit: str, bucket_s: float) -> str:
    """One value per time slice of the run, on axes from 0 to its maximum (titled with ``unit``)."""
    n, top = len(values), max(max(values), 1e-9)
    w, h = float(_W - _LEFT), 100.0
    pts = " ".join(f"{_LEFT + (i + 0.5) * w / n:.1f},{_TOP + h - h * v / top:.1f}" for i, v in enumerate(values))
    return _svg(css, w, h, _axes(w, h, (0.0, n * bucket_s, _TIME_AXIS), (0.0, top, unit))
                + f'<polyline points="{pts}" fill="none" stroke="{colour}"/>')


def _throughput_svg(tl: dict[str, Any]) -> str:
    """Env steps per second over time (samples per second when the run has no rollouts)."""
    n, work = int(tl.get("buckets") or 0), tl.get("work") or {}
    unit = next((k for k in ("env_steps", "samples") if any(work.get(k) or [])), None)
    if not n or unit is None:
        return "<p>no env steps or samples recorded</p>"
    bucket_s = float(tl["bucket_s"])
    rates = [v / bucket_s for v in work[unit][:n]]
    return _line_svg("throughput", rates, "#2ca02c", f'{unit.replace("_", " ")}/s', bucket_s)


def _util_svg(res: dict[str, Any]) -> str:
    """Mean CPU % (and GPU utilization when NVML saw a GPU) per component and node, from the samples."""
    rows = [r for r in res.get("rows") or [] if r.get("cpu_pct") is not None or r.get("gpu_util") is not None]
    if not rows:
        return f"<p>{escape(str(res.get('note') or 'no resource samples'))}</p>"
    left = 200
    bars, top = [], max(100.0, *(max(r.get("cpu_pct") or 0, r.get("gpu_util") or 0) for r in rows))
    for y, r in enumerate(rows):
        label = f'{r["component"]} @ {r["node"]}'
        bars.append(f'<text x="24" y="{_TOP + y * 30 + 12}" font-size="11">{escape(label)}</text>')
        for j, (key, colour) in enumerate((("cpu_pct", "#1f77b4"), ("gpu_util", "#d6a700"))):
            if r.get(key) is not None:
                w = (_W - left) * float(r[key]) / top
                bars.append(f'<rect x="{left}" y="{_TOP + y * 30 + j * 12 + 2:.1f}" width="{w:.1f}" height="10" '
                            f'fill="{colour}"><title>{key} {float(r[key]):.1f}%</title></rect>')
    note = f"<p>{escape(res['note'])}</p>" if res.get("note") else ""
    h = len(rows) * 30
    axes = _axes(_W - left, h, (0.0, top, "mean utilization over the run (% of one core / GPU)"),
                 "node", left=left)
    return (f'<p><span style="color:#1f77b4">■ CPU %</span> <span style="color:#d6a700">■ GPU util %</span>'
            f' (means over the run)</p>{note}<svg xmlns="http://www.w3.org/2000/svg" '
            f'class="utilization" width="{_W + 20}" height="{_TOP + h + _BOTTOM}">{axes}{"".join(bars)}</svg>')


def _ckpt_svg(rows: list[dict[str, Any]]) -> str:
    rows = [r for r in rows if r.get("stored_bytes")]
    if not rows:
        return "<p>no checkpoints in the store</p>"
    top = max(r["state_bytes"] or r["stored_bytes"] for r in rows)
    w, h = float(_W - _LEFT), 100.0
    bw = min(40.0, w / len(rows))
    bars = []
    for i, r in enumerate(rows):
        bh = h * r["stored_bytes"] / top
        bars.append(f'<rect x="{_LEFT + i * bw:.1f}" y="{_TOP + h - bh:.1f}" width="{bw - 2:.1f}" height="{bh:.1f}" '
                    f'fill="#2ca02c"><title>{escape(r["component"])} step {r["step"]}: {r["stored_bytes"]} bytes '
                    f'added</title></rect>')
    steps = [int(r["step"]) for r in rows]
    return _svg("checkpoints", w, h, _axes(w, h, (0.0, float(len(rows)),
                                                  f"checkpoints in order (steps {min(steps)} to {max(steps)})"),
                                           (0.0, float(top), "bytes added"),
                                           xfmt=lambda v: f"{v:.0f}", yfmt=_bytes) + "".join(bars))


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
    h = d.get("headline") or {}
    res = h.get("result")
    result = (f"{escape(res['name'])} {res['value']:.4g}" + (f" at {res['iteration']}" if res.get("iteration")
                                                             is not None else "")) if res else "none logged"
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>hetrun report {escape(rep.name)}</title>
<style>body{{font-family:sans-serif;margin:1em}} td,th{{padding:2px 8px;text-align:left}}</style></head>
<body><h1>hetrun report: {escape(rep.name)}</h1>
<p class="headline">outcome <b>{escape(str(h.get("status") or outcome))}</b>; result {result};
throughput {escape(str(h.get("throughput") or "-"))}; wasted {100 * (h.get("wasted_share") or 0):.1f}%;
restarts {h.get("restarts", 0)} (preempted {h.get("preemptions", 0)})</p>
<h2>Result over time</h2>{_curves_html(d.get("curves") or {})}
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
