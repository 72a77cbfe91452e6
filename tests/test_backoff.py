"""hetrun.backoff: the one poll-with-backoff loop (driven by a manual clock: no real sleeps)."""

from __future__ import annotations

import itertools

import pytest

from hetrun.backoff import Backoff, poll_until


class ManualClock:
    """A clock that moves only when the code under test sleeps."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def __call__(self) -> float:
        return self.now


def test_delays_grow_by_the_factor_up_to_the_cap() -> None:
    assert list(itertools.islice(Backoff(first=0.01, most=0.05).delays(), 5)) == [0.01, 0.02, 0.04, 0.05, 0.05]
    assert list(itertools.islice(Backoff(first=0.5, most=0.5, factor=1).delays(), 3)) == [0.5, 0.5, 0.5]


@pytest.mark.parametrize("bad", [dict(first=0, most=1), dict(first=2, most=1), dict(first=1, most=1, factor=0.5)])
def test_nonsense_backoff_is_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="Backoff needs"):
        Backoff(**bad)


def test_returns_the_first_truthy_answer_after_backing_off() -> None:
    clock = ManualClock()
    answers = iter([None, 0, "", "ready"])
    got = poll_until(lambda: next(answers), Backoff(first=1, most=3), sleep=clock.sleep, clock=clock)
    assert got == "ready"
    assert clock.sleeps == [1, 2, 3]


def test_timeout_returns_none_without_sleeping_past_the_deadline() -> None:
    clock = ManualClock()
    asked: list[float] = []

    def never() -> bool:
        asked.append(clock.now)
        return False

    assert poll_until(never, Backoff(first=1, most=4), timeout=6, sleep=clock.sleep, clock=clock) is None
    assert clock.sleeps == [1, 2, 3]  # the last sleep is cut to end at the deadline
    assert asked[-1] == 106  # asked once more at the deadline itself


def test_a_condition_true_at_the_deadline_is_not_a_timeout() -> None:
    clock = ManualClock()
    got = poll_until(lambda: clock.now >= 105, Backoff(first=5, most=5), timeout=5,
                     sleep=clock.sleep, clock=clock)
    assert got is True


def test_an_exception_from_the_condition_propagates() -> None:
    def broken() -> bool:
        raise RuntimeError("peer died")

    with pytest.raises(RuntimeError, match="peer died"):
        poll_until(broken, Backoff(first=1, most=1), timeout=10, sleep=lambda _s: None)
