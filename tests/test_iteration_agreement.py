"""The executor's stop agreement is the run API's (IterationAgreement = StepAgreement
with stride 1), driven the way runtime/executor.py drives it: poll without
blocking, start iteration k once agreement k - D is in, post when it starts.

Over random interleavings (in-memory MAX all-reduce whose results arrive late):
every rank starts exactly the iterations below the same stop iteration, which is
the stopping agreement's iteration + D, whichever rank saw the signal.
"""

from __future__ import annotations

import random

import pytest
from hetrun.runtime.api.stop import IterationAgreement
from test_api_stop_agreement import _Bus, _Transport


def _drive(seed: int) -> tuple[list[int], list[IterationAgreement], int, int]:
    rng = random.Random(seed)
    ranks, start, window = rng.randint(2, 4), rng.randint(0, 5), rng.randint(1, 3)
    signalled, signal_at = rng.randrange(ranks), start + rng.randint(0, 12)
    bus = _Bus(ranks, rng)
    agreements = [IterationAgreement(_Transport(bus), window, start) for _ in range(ranks)]
    next_it = [start] * ranks
    stopped = [False] * ranks
    for _ in range(100_000):
        if all(stopped):
            break
        r = rng.choice([i for i in range(ranks) if not stopped[i]])
        a, it = agreements[r], next_it[r]
        a.poll()
        if not a.may_start(it):
            continue  # the executor pumps messages and polls again
        if a.should_stop_before(it):
            stopped[r] = True
            continue
        a.contribute(it, 1 if r == signalled and it >= signal_at else 0)
        next_it[r] = it + 1  # the iteration runs
    assert all(stopped), "a rank never stopped"
    return next_it, agreements, signal_at, window


@pytest.mark.parametrize("seed", range(60))
def test_every_rank_stops_before_the_same_iteration(seed: int) -> None:
    next_it, agreements, signal_at, window = _drive(seed)
    assert len(set(next_it)) == 1, next_it  # every rank ran exactly the same iterations
    for a in agreements:
        assert a.stop_at == next_it[0]
        assert a.stopped_at_iteration is not None and a.stopped_at_iteration >= signal_at
        assert a.stop_at == a.stopped_at_iteration + window
        assert a.level == 1
