"""runtime/executor.py ``_run_iteration``: an action that does not run at an iteration
(``every`` > 1) does not wait for its dependencies; one that runs still does.

No MPI: the executor's dependency loop only needs its routes, its received state
histories and a mailbox to poll, so the test builds exactly those around a real
Executor's methods (``_run_action`` recorded instead of dispatched to a workload).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from hetrun.runtime.executor import Executor, RankFailed, evals_not_here
from hetrun.runtime.plan_view import ActionSpec, Dep
from hetrun.runtime.state_history import StateHistory

OPTIMIZE = ActionSpec("optimize", "optimize", "learner")
COLLECT = ActionSpec("collect", "rollout", "rollout", deps=(Dep("optimize", 2),), priority=2.0)
# Every 5th iteration (runs at 4, 9, ...), on the learner's weights of the same iteration.
EVAL = ActionSpec("eval", "eval", "rollout", deps=(Dep("optimize", 0),), priority=1.0,
                  extra={"every": 5})
# A same-component, same-iteration dependent of the every-5 action.
AFTER = ActionSpec("after", "eval", "rollout", deps=(Dep("eval", 0),))


class _Mailbox:
    """Delivers queued messages, one per poll, after ``delay`` empty polls."""

    def __init__(self, messages: list[Any], delay: int = 0) -> None:
        self.messages, self.delay = list(messages), delay

    def poll(self) -> Any:
        if self.delay > 0:
            self.delay -= 1
            return None
        return self.messages.pop(0) if self.messages else None


def _state(label: int) -> Any:
    return SimpleNamespace(kind="state", producer="optimize", iteration=label, tensors={}, meta={})


def _executor(history: list[int], mailbox: _Mailbox, timeout_s: float = 0.3,
              comp_rank: int = 0) -> tuple[Executor, list]:
    ex = Executor.__new__(Executor)  # no MPI world: only the dependency loop is exercised
    ex.me = "rollout"
    ex.actions = [COLLECT, EVAL, AFTER]
    ex.not_here = evals_not_here(ex.actions, comp_rank)
    ex.by_id = {a.id: a for a in (OPTIMIZE, COLLECT, EVAL, AFTER)}
    ex.lags = {("collect", "optimize"): 2, ("eval", "optimize"): 0, ("after", "eval"): 0}
    ex.in_data, ex.shared, ex.data = {}, {}, {}
    ex.in_state = {"optimize": 0}
    ex.states = {"optimize": StateHistory([(label, _state(label)) for label in history])}
    ex.mailbox, ex.timeout_s = mailbox, timeout_s
    ex.world = SimpleNamespace(rank=1, comp_ranks={"learner": [0], "rollout": [1]})
    ex.memory = ex.agreement = None
    ex.stop_level = 0
    ex.hooks = SimpleNamespace(local_stop_level=lambda ctx: 0)
    ex.ctx = None
    ran: list[tuple[str, int]] = []
    ex._run_action = lambda action, it, state: ran.append((action.id, it))  # type: ignore[method-assign]
    return ex, ran


def test_skipped_action_does_not_wait_for_its_dependency() -> None:
    # The learner has sent only its initial weights (label 0): eval's lag-0 dep at
    # iteration 2 (label 2) is not there, and no message will come. Eval does not run
    # at 2, so the iteration completes at once; its dependent runs.
    ex, ran = _executor(history=[0], mailbox=_Mailbox([]))
    ex._run_iteration(2)
    assert ran == [("collect", 2), ("after", 2)]


def test_running_action_still_waits_for_its_dependency() -> None:
    # At iteration 4 eval runs: it waits for the learner's label 4, which arrives
    # after a few polls, and then runs before its dependent.
    ex, ran = _executor(history=[2, 3], mailbox=_Mailbox([_state(4)], delay=3), timeout_s=30)
    ex._run_iteration(4)
    assert ran == [("collect", 4), ("eval", 4), ("after", 4)]
    assert ex.states["optimize"].newest == 4


def test_running_action_whose_dependency_never_comes_fails_the_rank() -> None:
    ex, ran = _executor(history=[2, 3], mailbox=_Mailbox([]), timeout_s=0.2)
    with pytest.raises(RankFailed, match="iteration 4") as err:
        ex._run_iteration(4)
    assert ran == [("collect", 4)]
    # The rank whose state never came is named: a hung peer's node is the one to replace.
    assert err.value.waiting_on == [0]
    assert "no message arrived from rank(s) 0 (learner)" in str(err.value.cause)


def test_only_the_first_rank_of_a_rolling_out_component_evaluates() -> None:
    # Rank 1 of the rollout component: iteration 4's evals (AFTER is one too) are its first
    # rank's (same weights, same seeded episodes); it passes them without waiting for the
    # label 4 that never comes (the wait would fail the rank after 0.2 s).
    ex, ran = _executor(history=[2, 3], mailbox=_Mailbox([]), timeout_s=0.2, comp_rank=1)
    ex._run_iteration(4)
    assert ran == [("collect", 4)]
    assert evals_not_here([COLLECT, EVAL], 1) == {"eval"}
    assert evals_not_here([COLLECT, EVAL], 0) == frozenset()
    # Learner-side evaluation (no rollout on the component) runs on every rank as before.
    assert evals_not_here([OPTIMIZE, ActionSpec("eval", "eval", "learner")], 1) == frozenset()
