"""The exact-version rule's bookkeeping: which state a consumer loads, what is kept.

StateHistory (received / sent state messages) and SharedRing (the same for
node-shared windows, with real MPI shared memory over COMM_SELF).
"""

from __future__ import annotations

import pytest
import torch
from hetrun.runtime.state_history import StateHistory, pick_for

from hetrun.errors import RuntimeFailure


def test_pick_is_the_newest_label_at_or_before_the_source_iteration() -> None:
    h = StateHistory()
    for label in (-1, 0, 1, 2):
        h.add(label, f"v{label + 1}")
    # Rollout i with lag 2 loads the state sent at i - 2, whatever arrived since.
    assert [pick_for(h, i - 2)[1] for i in range(4)] == ["v0", "v0", "v1", "v2"]
    assert h.covers(2) and not h.covers(3)


def test_prune_keeps_exactly_what_later_iterations_can_load() -> None:
    h = StateHistory([(label, label) for label in range(-1, 8)])
    h.prune(5 - 2)  # before iteration 5 with lag 2
    assert [x[0] for x in h.items] == [3, 4, 5, 6, 7]
    h.prune(3)  # idempotent
    assert h.oldest() == (3, 3)


def test_a_producer_that_runs_every_k_iterations() -> None:
    h = StateHistory([(-1, "init"), (3, "after 4"), (7, "after 8")])
    assert pick_for(h, 6)[1] == "after 4"
    h.prune(6)
    assert [x[0] for x in h.items] == [3, 7]


def test_a_resend_replaces_the_same_label() -> None:
    h = StateHistory([(4, "a")])
    h.add(4, "b")
    assert h.items == [(4, "b")]


def test_history_that_starts_later_falls_back_to_its_oldest() -> None:
    # A restore from a checkpoint without pipeline history: the first state is labelled start-1.
    h = StateHistory([(9, "current")])
    assert h.pick(7) is None and pick_for(h, 7) == (9, "current")


def test_shared_ring_keeps_one_window_per_version_the_rule_needs() -> None:
    from hetrun.runtime.shared_ring import SharedRing
    from hetrun.runtime.shared_weights import SharedWeights
    from mpi4py import MPI

    def state(label: int) -> dict[str, torch.Tensor]:
        return {"w": torch.full((4,), float(label))}

    ring = SharedRing([SharedWeights.create(MPI.COMM_SELF, state(-1)) for _ in range(3)])
    try:
        for label in range(-1, 4):
            ring.publish(state(label), label)
        assert sorted(ring.labels()) == [1, 2, 3] and ring.newest() == 3
        assert ring.pick(2) == 2 and ring.pick(0) is None
        assert torch.equal(ring.read(2, 1.0)["w"], state(2)["w"])
        with pytest.raises(RuntimeFailure, match="overwritten"):
            ring.read(-1, 1.0)  # label -1 shared window 0 with label 2
    finally:
        ring.free()
