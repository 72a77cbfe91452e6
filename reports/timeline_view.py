"""The per-rank Gantt rows of ``hetrun report``: one row per rank, one cell per time slice.

A cell shows the action type that kept the rank busiest in its slice (█ busy
at least half of it, ▄ less, · idle), coloured by type; marks override:
| start of an attempt, C checkpoint, R restore, X error. Reads the timeline
section of the report (reports/timeline.py); imports rich only.
"""

from __future__ import annotations

from typing import Any

COLOURS = {"rollout": "green", "forward": "blue", "backward": "magenta", "optimize": "cyan", "sync": "yellow",
           "checkpoint": "white", "eval": "bright_blue"}
MARKS = {"start": ("|", "bold white"), "checkpoint": ("C", "bold white"), "restore": ("R", "bold yellow"),
         "error": ("X", "bold red")}
MAX_RANKS = 64


def _cells(busy: dict[str, list[float]], lo: int, hi: int, slice_s: float) -> tuple[str, str]:
    sums = {k: sum(v[lo:hi]) for k, v in busy.items()}
    total = sum(sums.values())
    if total <= 0.1 * slice_s:
        return "·", "dim"
    kind = max(sums, key=lambda k: sums[k])
    return ("█" if total >= 0.5 * slice_s else "▄"), COLOURS.get(kind, "white")


def timeline_rows(tl: dict[str, Any], labels: dict[int, str], width: int) -> list[Any]:
    """rich Text lines: legend, one row per rank (at most MAX_RANKS), the time axis."""
    from rich.text import Text

    n = int(tl.get("buckets") or 0)
    ranks = tl.get("ranks") or {}
    if n == 0 or not ranks:
        return [Text("timeline: no actions yet")]
    label_w = max(len(v) for v in labels.values()) + 1 if labels else 8
    cols = max(10, min(n, width - label_w - 1))
    bucket_s = float(tl["bucket_s"])
    span = n / cols  # buckets per column
    kinds = sorted({k for r in ranks.values() for k in r["busy"]})
    legend = Text("timeline per rank: ")
    for k in kinds:
        legend.append("█", style=COLOURS.get(k, "white"))
        legend.append(f" {k}  ")
    legend.append("· idle  | start  C checkpoint  R restore  X error")
    out = [legend]
    for rank in sorted(ranks, key=int)[:MAX_RANKS]:
        row = Text(labels.get(int(rank), str(rank)).ljust(label_w))
        cells = [_cells(ranks[rank]["busy"], int(j * span), max(int((j + 1) * span), int(j * span) + 1),
                        bucket_s * span) for j in range(cols)]
        for t, kind in ranks[rank]["marks"]:
            j = min(cols - 1, max(0, int(t / bucket_s / span)))
            cells[j] = MARKS.get(kind, ("?", "white"))
        for ch, style in cells:
            row.append(ch, style=style)
        out.append(row)
    if len(ranks) > MAX_RANKS:
        out.append(Text(f"(first {MAX_RANKS} of {len(ranks)} ranks; --json has them all)"))
    total = n * bucket_s
    axis = Text(" " * label_w + "0s")
    end = f"{total:.1f}s"
    axis.append(" " * max(1, cols - 2 - len(end)) + end)
    out.append(axis)
    return out
