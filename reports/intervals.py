"""A union of time intervals built one interval at a time, in compact arrays.

Reports add every action's [start, end) as the events stream past; keeping
the union (not the intervals) bounds memory by the number of idle gaps, and
two float arrays cost 16 bytes per gap where a list of tuples costs ~100.
Events arrive nearly in time order, so most additions extend or append at the end.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right


class IntervalSet:
    def __init__(self) -> None:
        self.lo = array("d")
        self.hi = array("d")

    def add(self, a: float, b: float) -> None:
        if b < a:
            return
        n = len(self.lo)
        if n and a >= self.lo[-1]:  # the common case: at or after the last interval
            if a <= self.hi[-1]:
                if b > self.hi[-1]:
                    self.hi[-1] = b
                return
            self.lo.append(a)
            self.hi.append(b)
            return
        # i: first interval that may touch [a, b]; j: one past the last that does
        i = bisect_left(self.hi, a)
        j = bisect_right(self.lo, b)
        if i == j:
            self.lo.insert(i, a)
            self.hi.insert(i, b)
            return
        new_lo, new_hi = min(a, self.lo[i]), max(b, self.hi[j - 1])
        del self.lo[i + 1:j]
        del self.hi[i + 1:j]
        self.lo[i], self.hi[i] = new_lo, new_hi

    def __len__(self) -> int:
        return len(self.lo)

    def first(self) -> float | None:
        return self.lo[0] if self.lo else None

    def last(self) -> float | None:
        return self.hi[-1] if self.hi else None

    def length(self) -> float:
        return sum(self.hi) - sum(self.lo)

    def intersection(self, other: IntervalSet) -> float:
        """Seconds covered by both sets."""
        i = j = 0
        total = 0.0
        while i < len(self.lo) and j < len(other.lo):
            lo, hi = max(self.lo[i], other.lo[j]), min(self.hi[i], other.hi[j])
            if hi > lo:
                total += hi - lo
            if self.hi[i] < other.hi[j]:
                i += 1
            else:
                j += 1
        return total
