"""Which weights a consumer loads: the exact-version rule, and the few versions it needs.

The rule (docs/CONTRACTS.md, "Runtime hooks"): a consumer action at iteration
i with a state dependency of effective lag L on producer action P loads
EXACTLY the state P sent at iteration ``P.last_run_at_or_before(i - L)``, never
"the newest it happens to have". Timing then no longer decides which policy a
rollout uses, so a resumed run sees the versions an uninterrupted one saw.

A state message is labelled with the iteration that sent it; the first one of a
run is labelled ``start - 1`` (the weights a run starts from). Messages from
one producer arrive in order, so "the newest message labelled <= i - L" is
the one the rule names as soon as a message labelled >= that iteration has
arrived. ``StateHistory`` keeps those messages, on the consumer (received) and
on the producer (sent: they go into its checkpoint and are sent again on
restore, with their original labels).
"""

from __future__ import annotations

from typing import Any


class StateHistory:
    """State messages of one producer, oldest first: ``(iteration, payload)``."""

    def __init__(self, items: list[tuple[int, Any]] | None = None) -> None:
        self.items: list[tuple[int, Any]] = sorted(items or [], key=lambda x: x[0])

    def add(self, iteration: int, payload: Any) -> None:
        """Record a message; one of the same label replaces it (a re-send after restore)."""
        self.items = [x for x in self.items if x[0] != iteration]
        self.items.append((iteration, payload))
        self.items.sort(key=lambda x: x[0])

    @property
    def newest(self) -> int | None:
        return self.items[-1][0] if self.items else None

    def covers(self, need: int) -> bool:
        """A message labelled >= ``need`` arrived (so every older one did too)."""
        return bool(self.items) and self.items[-1][0] >= need

    def pick(self, src_iteration: int) -> tuple[int, Any] | None:
        """The newest message labelled <= ``src_iteration``.

        None if there is none: only when a run restored from a checkpoint
        without pipeline history starts later than ``src_iteration`` (then
        :meth:`oldest` is the best there is).
        """
        best = None
        for item in self.items:
            if item[0] > src_iteration:
                break
            best = item
        return best

    def oldest(self) -> tuple[int, Any] | None:
        return self.items[0] if self.items else None

    def prune(self, src_iteration: int) -> None:
        """Forget what no iteration whose rule reads ``>= src_iteration`` can load."""
        keep = self.pick(src_iteration)
        if keep is not None:
            self.items = [x for x in self.items if x[0] >= keep[0]]


def pick_for(history: StateHistory, src_iteration: int) -> tuple[int, Any] | None:
    """The rule's message for ``src_iteration``, or the oldest one when the
    history starts later (a restore from a checkpoint written before the
    history was saved: not exact, as before)."""
    return history.pick(src_iteration) or history.oldest()
