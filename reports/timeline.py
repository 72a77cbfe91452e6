"""Per-rank busy time by action type in fixed-count time buckets, for a Gantt-style view.

Bounded memory whatever the run's length: at most ``BUCKETS`` buckets per
rank and action type; when an event falls past the last bucket the width
doubles and neighbouring buckets merge. Marks (start, checkpoint, restore,
error) keep their times, capped per rank.
"""

from __future__ import annotations

from array import array
from typing import Any

BUCKETS = 256
MAX_MARKS = 2000


class Timeline:
    def __init__(self, first_width_s: float = 0.01) -> None:
        self.origin: float | None = None
        self.width = first_width_s
        self.busy: dict[int, dict[str, array]] = {}
        self.marks: dict[int, list[tuple[float, str]]] = {}
        # Work finished per bucket (all ranks): env steps of rollouts, samples of any action.
        self.work: dict[str, array] = {"env_steps": array("d", [0.0] * BUCKETS), "samples": array("d", [0.0] * BUCKETS)}
        self._limit = float("-inf")  # origin + width * BUCKETS: past it the width doubles

    def _fit(self, t: float) -> None:
        if self.origin is None:
            self.origin = t
        while t - self.origin >= self.width * BUCKETS:
            self.width *= 2
            for arr in [a for kinds in self.busy.values() for a in kinds.values()] + list(self.work.values()):
                merged = [arr[2 * i] + arr[2 * i + 1] for i in range(BUCKETS // 2)]
                arr[:] = array("d", merged + [0.0] * (BUCKETS // 2))
        self._limit = self.origin + self.width * BUCKETS

    def add(self, rank: int, kind: str, start: float, end: float) -> None:
        if end < start:
            return
        if self.origin is None:
            self._fit(start)
        if end >= self._limit:
            self._fit(end)
        kinds = self.busy.get(rank)
        arr = kinds.get(kind) if kinds is not None else None
        if arr is None:
            arr = self.busy.setdefault(rank, {})[kind] = array("d", [0.0] * BUCKETS)
        w = self.width
        a = start - self.origin
        if a < 0.0:
            a = 0.0
        b = end - self.origin
        if b <= a:
            return
        i = int(a // w)
        if b < (i + 1) * w:  # the common case: inside one bucket
            arr[i] += b - a
            return
        while a < b and i < BUCKETS:
            edge = (i + 1) * w
            arr[i] += min(b, edge) - a
            a = edge
            i += 1

    def count(self, what: str, t: float, n: float) -> None:
        """``n`` units of work (``env_steps`` or ``samples``) finished at ``t``."""
        if self.origin is None or t >= self._limit:
            self._fit(t)
        self.work[what][min(BUCKETS - 1, max(0, int((t - self.origin) // self.width)))] += n  # type: ignore[operator]

    def mark(self, rank: int, kind: str, t: float | None) -> None:
        if t is None:
            return
        self._fit(t)
        marks = self.marks.setdefault(rank, [])
        if len(marks) < MAX_MARKS:
            marks.append((t, kind))

    def to_dict(self) -> dict[str, Any]:
        """{"origin", "bucket_s", "buckets", "ranks": {rank: {"busy": {type: [s...]}, "marks": [[s, kind]]}},
        "work": {"env_steps": [...], "samples": [...]}}; bucket values are busy seconds (work: units finished
        in the bucket, all ranks); mark times are seconds after ``origin``."""
        used = 0
        for kinds in self.busy.values():
            for arr in kinds.values():
                nz = [i for i, v in enumerate(arr) if v > 0]
                used = max(used, nz[-1] + 1 if nz else 0)
        if self.origin is not None:
            for marks in self.marks.values():
                for t, _ in marks:
                    used = max(used, min(BUCKETS, int((t - self.origin) // self.width) + 1))
        ranks: dict[str, Any] = {}
        for rank in sorted(set(self.busy) | set(self.marks)):
            ranks[str(rank)] = {
                "busy": {k: [round(v, 6) for v in arr[:used]] for k, arr in sorted(self.busy.get(rank, {}).items())},
                "marks": [[round(t - (self.origin or 0.0), 3), k] for t, k in self.marks.get(rank, [])],
            }
        work = {k: [round(v, 3) for v in arr[:used]] for k, arr in self.work.items()}
        return {"origin": self.origin, "bucket_s": self.width, "buckets": used, "ranks": ranks, "work": work}
