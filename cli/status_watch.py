"""``hetrun status --watch``: a live view of runs until they end or Ctrl-C.

Each refresh makes ONE scheduler query per backend for every watched run
(the backends' ``status`` batch them: one squeue for all Slurm runs) and
reads only what each run appended to events.jsonl (reports/live.py).
On a terminal: a rich Live table with a progress bar per run; otherwise one
plain line per run whenever it changes.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from hetrun.cli.report_cmd import _bytes
from hetrun.reports.live import LiveRun


def _dur(s: float | None) -> str:
    if s is None:
        return "-"
    m, sec = divmod(int(s), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{sec:02d}"


def _bar(fraction: float | None, width: int = 20) -> str:
    if fraction is None:
        return "?" * width
    full = round(min(1.0, max(0.0, fraction)) * width)
    return "█" * full + "░" * (width - full)


def _metrics(m: dict[str, Any]) -> str:
    return " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in m.items()
                    if k not in ("type", "iteration"))[:60]


def _ckpt(p: dict[str, Any]) -> str:
    """``STEP (AGE ago, SIZE)``: the last checkpoint; its size once the store lists it."""
    size = f", {_bytes(p['checkpoint_bytes'])}" if p.get("checkpoint_bytes") is not None else ""
    return f"{p['checkpoint_step']} ({_dur(p['checkpoint_age_s'])} ago{size})"


def _rate(p: dict[str, Any], short: bool) -> str:
    """The steady rate (reports/throughput.py: the definition `hetrun report` and `tune` use), labelled,
    with the attempt and its sizes once a restart or resize started another; it/s before it is steady."""
    unit = "st" if short and p.get("throughput_unit") == "env steps" else (
        "samples" if p.get("throughput_unit") == "samples" else "steps")
    if p.get("steps_per_s"):
        out = f"{p['steps_per_s']:.1f} {unit}/s steady"
        if p.get("attempt"):
            out += f" (attempt {p['attempt']}: " + " ".join(f"{c}={n}" for c, n in p["sizes"].items()) + ")"
        return out
    return f"{p['iterations_per_s']:.2f} it/s" if p.get("iterations_per_s") else ("-" if short else "- it/s")


def run_line(name: str, state: str, comps: str, p: dict[str, Any]) -> str:
    """One plain line per run (also the non-TTY output)."""
    total = p["total"] or "?"
    rate = _rate(p, short=False)
    ck = f"ckpt {_ckpt(p)}" if p["checkpoint_step"] is not None else "no ckpt"
    return (f"{name} {state} [{comps}] it {p['iterations_done']}/{total} {rate} ETA {_dur(p['eta_s'])} "
            f"{ck} restarts {p['restarts']} {_metrics(p['metrics'])}").rstrip()


def _table(rows: list[tuple[str, str, str, dict[str, Any]]]) -> Any:
    from rich.table import Table
    from rich.text import Text

    t = Table(show_edge=False, pad_edge=False)
    for col in ("RUN", "STATE", "COMPONENTS", "PROGRESS", "ITER", "RATE", "ETA", "LAST CKPT", "RESTARTS",
                "METRICS"):
        t.add_column(col, no_wrap=True)
    for name, state, comps, p in rows:
        rate = _rate(p, short=True)
        ck = _ckpt(p) if p["checkpoint_step"] is not None else "-"
        cells = (name, state, comps, _bar(p["fraction"]), f"{p['iterations_done']}/{p['total'] or '?'}", rate,
                 _dur(p["eta_s"]), ck, str(p["restarts"]), _metrics(p["metrics"]))
        t.add_row(*(Text(c) for c in cells))  # plain text: no markup or :emoji: codes in names/states
    return t


def watch(chosen: list[Any], query: Any, interval: float, is_tty: bool, echo: Any) -> None:
    """Refresh until every run has ended (or Ctrl-C). ``query(runs) -> {run_dir: RunStatus}``."""
    from hetrun.slurm_plugin.backends.base import ACTIVE_STATES

    live = {r.run_dir: LiveRun.open(r.run_dir) for r in chosen}
    last: dict[str, tuple[Any, ...]] = {}

    def snapshot() -> tuple[list[tuple[str, str, str, dict[str, Any]]], bool]:
        results = query(chosen)
        rows, active = [], False
        for r in chosen:
            st = results.get(r.run_dir)
            live[r.run_dir].poll()
            state = st.state if st is not None else "UNKNOWN"
            active = active or state in ACTIVE_STATES
            comps = ", ".join(f"{c.name} {c.state} {_dur(c.elapsed_s)}" for c in (st.components if st else []))
            rows.append((Path(r.run_dir).name, state, comps, live[r.run_dir].progress()))
        return rows, active

    try:
        if is_tty:
            from rich.live import Live

            rows, active = snapshot()
            with Live(_table(rows), auto_refresh=False) as view:
                while active:
                    time.sleep(interval)
                    rows, active = snapshot()
                    view.update(_table(rows), refresh=True)
            return
        while True:
            rows, active = snapshot()
            for row in rows:
                line = run_line(*row)
                # print when progress, state or the last checkpoint changed, not every tick
                key = (line.split(" ETA ")[0], row[3]["checkpoint_step"], row[3]["checkpoint_bytes"])
                if last.get(row[0]) != key:
                    last[row[0]] = key
                    echo(line)
            if not active:
                return
            time.sleep(interval)
    except KeyboardInterrupt:
        echo("watch stopped (the runs go on; `hetrun status` shows them)")
