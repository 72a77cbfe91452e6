"""Polling with backoff: the one "wait until something is true" loop every layer uses.

hetrun waits for many things it cannot block on: an MPI request or probe
(a blocking MPI call busy-polls a core the peer may need), a Slurm job
reaching a state, a file appearing, a shared-memory snapshot settling. Each
wait is the same loop: ask, and if the answer is not there yet, sleep a
little longer than last time, up to a cap, until a deadline. It lives here,
beside :mod:`hetrun.errors`, so every layer can import it without depending
on another; it imports only the standard library.

What to do when the deadline passes (raise which error, naming what) stays
with the caller: :func:`poll_until` just returns ``None`` then.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

__all__ = ["Backoff", "poll_until"]


@dataclass(frozen=True)
class Backoff:
    """Sleeps of ``first`` seconds, each ``factor`` times the last, never above ``most``.

    ``factor=1`` is a fixed interval. The cap is also the most a completed wait
    can overshoot the moment its condition turned true.
    """

    first: float
    most: float
    factor: float = 2.0

    def __post_init__(self) -> None:
        if not (0 < self.first <= self.most) or self.factor < 1:
            raise ValueError(f"Backoff needs 0 < first <= most and factor >= 1, got {self}")

    def delays(self) -> Iterator[float]:
        """The endless sequence of sleeps."""
        delay = self.first
        while True:
            yield delay
            delay = min(delay * self.factor, self.most)


def poll_until(
    ready: Callable[[], T],
    backoff: Backoff,
    *,
    timeout: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> T | None:
    """Call ``ready()`` until it returns something truthy, and return that.

    Between calls sleep along ``backoff``. With ``timeout`` (seconds), return
    ``None`` once it has passed; ``ready`` is always asked once more at the
    deadline, so a condition that came true during the last sleep is not
    reported as a timeout. No sleep ends past the deadline.
    """
    deadline = None if timeout is None else clock() + timeout
    for delay in backoff.delays():
        answer = ready()
        if answer:
            return answer
        if deadline is not None:
            left = deadline - clock()
            if left <= 0:
                return None
            delay = min(delay, left)
        sleep(delay)
    raise AssertionError("unreachable: Backoff.delays() is endless")
