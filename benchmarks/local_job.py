"""A benchmark driver's local-backend job is never left running behind the driver.

A local-backend job outlives the process that submitted it: one left behind by a failed or
killed driver shared the cores with the next run and halved its throughput (benchmarks/atari.md,
session 37). The drivers that submit one (atari_ppo_throughput.py, ppo_pipeline.py,
cost_tuning.py, demand_prediction.py) call ``cancel_on_sigterm`` once and wait inside
``cancelled_on_failure``.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from typing import Any


def cancel_on_sigterm() -> None:
    """SIGTERM (a kill, `timeout`) raises KeyboardInterrupt, as Ctrl-C does, so the job is cancelled too."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)


@contextlib.contextmanager
def cancelled_on_failure(backend: Any, run: Any) -> Iterator[None]:
    """Cancel ``run`` if the block raises a HetrunError (a timeout, a failed poll) or is interrupted."""
    from hetrun.errors import HetrunError

    try:
        yield
    except (HetrunError, KeyboardInterrupt):
        backend.cancel(run)
        raise
