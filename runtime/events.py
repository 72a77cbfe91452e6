"""The runtime's names for ``hetrun.rundir``'s events writer and reader.

``events.jsonl`` has one owner, ``hetrun.rundir`` (one line format, one time key
``time``, the reader that also reads old runs' ``t``); the runtime's modules
import these names from here so a rank's start-up path stays as it was.
"""

from __future__ import annotations

from hetrun.rundir import EVENTS as EVENTS_FILE
from hetrun.rundir import EventLog, read_events

__all__ = ["EVENTS_FILE", "EventLog", "read_events"]
