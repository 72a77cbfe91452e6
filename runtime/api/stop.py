"""The agreed stop of the run API: every rank stops after the same step.

``should_stop(step)`` is called by every rank after each step. It puts this
rank's local stop level (``hetrun.runtime.preempt.stop_level``: 0 go on,
1 requeue after the warning signal or a near time limit, 2 SIGTERM) into a
non-blocking one-int MAX all-reduce and returns the answer of the
all-reduce posted ``window`` steps earlier, which had a whole step of
compute to complete in the background. If agreement j (posted after step
j - 1) says stop, every rank stops after step j + window - 1: nobody can
get past it without having seen agreement j, and every rank runs every
step below it. The same reasoning as the executor's
``hetrun.runtime.executor.StopAgreement``, over a transport that may be
torch.distributed (a torchrun script without MPI) or MPI.
"""

from __future__ import annotations

from collections import deque
from typing import Any


class SoloAgreement:
    """One rank: the local level is the agreement."""

    window = 0

    def __init__(self) -> None:
        self.stop_after: int | None = None
        self.level = 0

    def check(self, step: int, level: int) -> bool:
        if level and self.stop_after is None:
            self.stop_after, self.level = step, level
        return self.stop_after is not None and step >= self.stop_after

    def close(self) -> None:
        pass


class StepAgreement:
    def __init__(self, transport: Any, window: int, start: int) -> None:
        self.transport = transport
        self.window = max(1, int(window))
        self.pending: deque[tuple[int, Any]] = deque()
        self.completed_through = start  # agreements are numbered by the step they precede
        self.stop_after: int | None = None
        self.level = 0

    def _take(self, step: int, pending: Any) -> None:
        self.completed_through = step
        value = pending.value()
        if value and self.stop_after is None:
            self.stop_after = step + self.window - 1
            self.level = value

    def check(self, step: int, level: int) -> bool:
        """After ``step``: True when every rank agreed to stop after this step."""
        while self.pending and self.pending[0][1].done():
            self._take(*self.pending.popleft())
        # Before running step+1 the agreement posted window steps earlier must be in.
        while self.completed_through < step + 1 - self.window:
            first, pending = self.pending.popleft()
            pending.wait()
            self._take(first, pending)
        if self.stop_after is not None and step >= self.stop_after:
            return True
        self.pending.append((step + 1, self.transport.post(level)))
        return False

    def close(self) -> None:
        """Collective: every rank posted the same agreements; complete them."""
        while self.pending:
            first, pending = self.pending.popleft()
            pending.wait()
            self._take(first, pending)
