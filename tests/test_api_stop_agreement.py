"""The run API's stop agreement over many interleavings of ranks (in-memory transport).

The real transports (gloo, MPI) are exercised by test_api_torchrun/test_api_mpi;
here an in-memory MAX all-reduce lets ranks with very different step times run
in random orders, with requests completing late, to check the one property the
agreement exists for: every rank stops after the same step, and the stride
(posting every few steps when steps are short) never breaks it.
"""

from __future__ import annotations

import random

import pytest
from hetrun.runtime.api.stop import StepAgreement


class _Bus:
    def __init__(self, ranks: int, rng: random.Random) -> None:
        self.ranks, self.rng = ranks, rng
        self.posted: dict[int, list[tuple[int, int]]] = {}


class _Pending:
    def __init__(self, bus: _Bus, index: int) -> None:
        self.bus, self.index = bus, index

    def _all_in(self) -> bool:
        return len(self.bus.posted[self.index]) == self.bus.ranks

    def done(self) -> bool:
        return self._all_in() and self.bus.rng.random() < 0.5  # results arrive late, at random

    def wait(self) -> None:
        if not self._all_in():
            raise BlockingIOError  # a real wait would block: the test runs another rank

    def value(self) -> tuple[int, int]:
        got = self.bus.posted[self.index]
        return max(v[0] for v in got), max(v[1] for v in got)


class _Transport:
    def __init__(self, bus: _Bus) -> None:
        self.bus, self.count = bus, 0

    def post(self, level: int, stride: int) -> _Pending:
        self.bus.posted.setdefault(self.count, []).append((level, stride))
        self.count += 1
        return _Pending(self.bus, self.count - 1)


@pytest.mark.parametrize("seed", range(40))
def test_every_rank_stops_after_the_same_step(seed: int) -> None:
    rng = random.Random(seed)
    ranks, start = rng.randint(2, 4), rng.randint(0, 5)
    bus = _Bus(ranks, rng)
    agreements = [StepAgreement(_Transport(bus), 2, start) for _ in range(ranks)]
    for a in agreements:  # step times from 10 us (stride ~200) to 5 ms (stride 1)
        a._step_s = rng.choice([1e-5, 1e-4, 5e-3])
        a._last_t = None
    signalled, at = rng.randrange(ranks), rng.randint(start, start + 3000)
    step, stopped = [start] * ranks, [None] * ranks
    while None in stopped:
        r = rng.randrange(ranks)
        if stopped[r] is not None:
            continue
        agreements[r]._last_t = None  # keep the chosen step time (no clock in this test)
        try:
            stop = agreements[r].check(step[r], 1 if r == signalled and step[r] >= at else 0)
        except BlockingIOError:
            continue
        if stop:
            stopped[r] = step[r]
        else:
            step[r] += 1
    assert len(set(stopped)) == 1, stopped
    assert at <= stopped[0] <= at + 3 * StepAgreement.MAX_STRIDE
    for a in agreements:
        a.close()
    # Short steps were not agreed one by one.
    if all(a._step_s < 1e-3 for a in agreements) and stopped[0] - start > 1000:
        assert len(bus.posted) < (stopped[0] - start) // 10
