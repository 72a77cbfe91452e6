"""The reports' view of ``events.jsonl``: ``EventStream`` (the one reader, owned by
``hetrun.rundir``) and when an event happened on a timeline.
"""

from __future__ import annotations

from typing import Any

from hetrun.rundir import EventStream
from hetrun.rundir import event_time as line_time

__all__ = ["EventStream", "event_time"]


def event_time(e: dict[str, Any]) -> float | None:
    """When an event happened: ``end`` for actions, else when its line was written
    (``hetrun.rundir.event_time``: ``time``, or an old run's ``t``)."""
    v = e.get("end")
    if isinstance(v, int | float) and not isinstance(v, bool):
        return float(v)
    return line_time(e)
