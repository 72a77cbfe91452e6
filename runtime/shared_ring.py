"""Node-shared weights that keep what the exact-version rule needs: a ring of windows.

With ``HETRUN_SHARED_WEIGHTS=1`` the consumer ranks of a node read a
producer's states from MPI shared memory (runtime/shared_weights.py) instead
of each receiving them. One window holds one version, but consumers at
different iterations need different versions (runtime/state_history.py): a
consumer of lag L at iteration i needs the state labelled
``last_run_at_or_before(i - L)``. So a producer gets K = L + D + 1 windows
(D: the stop agreement's window); the state labelled m lives in window
``(m + 1) % K`` (window version m + 1).

Why that is enough: the producer sends m while running iteration m, which it
may start only once every rank started m - D; a reader there needs a label
>= m - D - L, and the label m overwrites, m - K, is older. A reader that
finds its label overwritten anyway raises instead of loading another version.
"""

from __future__ import annotations

import time
from typing import Any

from hetrun.errors import RuntimeFailure


class SharedRing:
    """K shared windows of one producer on one node (the node leader publishes)."""

    def __init__(self, windows: list[Any]) -> None:
        self.windows = windows

    @property
    def nbytes(self) -> int:
        return sum(w.nbytes for w in self.windows)

    def labels(self) -> list[int]:
        return [w.version - 1 for w in self.windows]

    def newest(self) -> int:
        return max(self.labels())

    def publish(self, tensors: dict[str, Any], label: int) -> None:
        """Node leader: put the state labelled ``label`` in its window (once)."""
        window = self.windows[(label + 1) % len(self.windows)]
        if window.version < label + 1:
            window.publish(tensors, label + 1)

    def pick(self, src_iteration: int) -> int | None:
        """The newest label <= ``src_iteration`` held now (None: none)."""
        held = [x for x in self.labels() if x <= src_iteration]
        return max(held) if held else None

    def read(self, label: int, timeout_s: float) -> dict[str, Any]:
        """A private copy of the state labelled ``label``."""
        window = self.windows[(label + 1) % len(self.windows)]
        deadline = time.monotonic() + timeout_s
        while True:
            version, snapshot = window.read_consistent(timeout_s)
            if version == label + 1:
                return snapshot
            if version > label + 1 or time.monotonic() > deadline:
                raise RuntimeFailure(
                    f"shared weights: the state labelled {label} was overwritten (window holds "
                    f"{version - 1}) before this rank read it",
                    hint="unset HETRUN_SHARED_WEIGHTS for this job: a consumer fell further behind "
                         "its producer than the shared window ring allows")
            time.sleep(0.0005)

    def free(self) -> None:
        for w in self.windows:
            w.free()
