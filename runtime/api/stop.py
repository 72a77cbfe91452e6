"""The agreed stop of the run API: every rank stops after the same step.

``should_stop(step)`` is called by every rank after each step. It puts this
rank's local stop level (``hetrun.runtime.preempt.stop_level``: 0 go on,
1 requeue after the warning signal or a near time limit, 2 SIGTERM) into a
non-blocking MAX all-reduce (level, stride) posted every ``stride`` steps
(``StepAgreement``: 1 for steps of 2 ms or more, more for shorter steps, so
the round trip never makes a step wait) and needs the answer of the
agreement posted ``window`` agreements earlier before it posts the next.
If agreement m says stop, every rank stops after the step before the one
agreement m + window precedes: nobody can get past it without having seen
agreement m, and every rank runs every step below it. The transport may be
torch.distributed (a torchrun script without MPI) or MPI.

The action executor uses the same agreement (``IterationAgreement``: one
agreement per iteration, posted when the iteration starts, waited on without
blocking so a rank keeps accepting messages meanwhile).
"""

from __future__ import annotations

import time
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
    """The agreement, posted every ``stride`` steps rather than after every step.

    A script's step can be shorter than one all-reduce round trip (~0.1 ms
    over gloo on 2 CPU ranks): posting after every step would then make every
    step wait. Agreement n is posted before step ``q[n]``; ``q[n+1] = q[n] +
    s[n]``, where ``s[n]`` is 1 for the first ``window`` agreements and after
    that the MAX over ranks of the stride each rank asked for in agreement
    n - window (enough steps to span ``TARGET_S`` at its own step time). So
    every rank computes the same posting steps, and before posting n it must
    hold agreement n - window: if agreement m says stop, every rank stops
    after step q[m + window] - 1 — nobody can pass it without agreement m, and
    every rank runs every step below it. For steps of TARGET_S or more the
    stride stays 1 (the per-step agreement of the executor's StopAgreement).
    """

    TARGET_S = 0.002  # one agreement per ~2 ms of steps: its cost vanishes per step
    MAX_STRIDE = 256  # bounds how many steps a stop may take to be agreed

    def __init__(self, transport: Any, window: int, start: int, *, max_stride: int = MAX_STRIDE) -> None:
        self.transport = transport
        self.window = max(1, int(window))
        self.max_stride = max(1, int(max_stride))
        # q[n], the step agreement n precedes (posted after step q[n] - 1; the
        # first after step ``start``), kept for the agreements still in play.
        self.posts: dict[int, int] = {0: start + 1}
        self.next = 0  # the next agreement to post
        self.pending: deque[tuple[int, Any]] = deque()  # (n, request) in posting order
        self.results: dict[int, tuple[int, int]] = {}
        self.completed = -1  # newest agreement whose result is in
        self.stop_after: int | None = None
        self.stopped_by: int | None = None  # the agreement that said stop
        self.level = 0
        self._last_t: float | None = None
        self._step_s = self.TARGET_S  # this rank's step time (EWMA)

    def _take(self, n: int, pending: Any) -> None:
        level, stride = pending.value()
        self.completed = n
        self.results[n] = (level, stride)
        if level and self.stop_after is None:
            self.level = level
            self.stopped_by = n
            self.stop_after = self._post_step(n + self.window) - 1

    def _post_step(self, n: int) -> int:
        """q[n]; needs the results up to n - 1 - window (every caller has them)."""
        m = max(self.posts)
        while m < n:  # q[m + 1] = q[m] + s[m]
            stride = 1 if m < self.window else max(1, min(self.max_stride, self.results.pop(m - self.window)[1]))
            self.posts[m + 1] = self.posts[m] + stride
            self.posts.pop(m - 2 * self.window - 2, None)  # no caller looks that far back
            m += 1
        return self.posts[n]

    def _wanted_stride(self) -> int:
        return max(1, min(self.max_stride, int(self.TARGET_S / max(self._step_s, 1e-7)) + 1))

    def check(self, step: int, level: int) -> bool:
        """After ``step``: True when every rank agreed to stop after this step."""
        now = time.perf_counter()
        if self._last_t is not None:
            self._step_s += 0.1 * ((now - self._last_t) - self._step_s)
        self._last_t = now
        if self.stop_after is not None and step >= self.stop_after:
            return True
        n = self.next
        if step + 1 < self.posts[n]:
            return False  # not a posting step: no collective work at all
        # Before posting n (and running step q[n]) agreement n - window must be in.
        while self.pending and (self.pending[0][0] <= n - self.window or self.pending[0][1].done()):
            first, pending = self.pending[0]
            pending.wait()
            self.pending.popleft()
            self._take(first, pending)
        if self.stop_after is not None and step >= self.stop_after:
            return True
        self._post(level, self._wanted_stride())
        return False

    def _post(self, level: int, stride: int) -> None:
        n = self.next
        self.pending.append((n, self.transport.post(level, stride)))
        self.next = n + 1
        self._post_step(n + 1)

    def close(self) -> None:
        """Collective: every rank posted the same agreements; complete them."""
        while self.pending:
            first, pending = self.pending.popleft()
            pending.wait()
            self._take(first, pending)


class IterationAgreement(StepAgreement):
    """The action executor's stop agreement: ``StepAgreement`` with stride 1,
    agreement n posted when iteration ``start + n`` starts.

    A rank starts iteration k only once the agreement of k - window is in
    (``may_start``), polling instead of waiting, so it keeps accepting the
    messages its peers need to get there. If the agreement of iteration j
    says stop, every rank stops before iteration j + window (``stop_at``).
    """

    def __init__(self, transport: Any, window: int, start: int) -> None:
        super().__init__(transport, window, start - 1, max_stride=1)
        self.first = start

    def contribute(self, iteration: int, level: int) -> None:
        """At the start of ``iteration`` (after ``may_start``): post its agreement."""
        self._post(level, 1)

    def poll(self) -> bool:
        """Take in every completed agreement, without blocking; True when one completed."""
        progressed = False
        while self.pending and self.pending[0][1].done():
            n, pending = self.pending.popleft()
            self._take(n, pending)
            progressed = True
        return progressed

    def may_start(self, iteration: int) -> bool:
        return iteration - self.first - self.window <= self.completed

    @property
    def stop_at(self) -> int | None:
        """The first iteration no rank starts (None: no stop agreed)."""
        return None if self.stop_after is None else self.stop_after + 1

    @property
    def stopped_at_iteration(self) -> int | None:
        """The iteration whose agreement said stop."""
        return None if self.stopped_by is None else self.first + self.stopped_by

    def should_stop_before(self, iteration: int) -> bool:
        return self.stop_at is not None and iteration >= self.stop_at

    def close(self) -> None:
        """Collective: complete every agreement posted, free the transport."""
        super().close()
        free = getattr(self.transport, "free", None)
        if free is not None:
            free()
