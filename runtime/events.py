"""Append-only ``events.jsonl``: one JSON object per line, one write per line.

Every rank of every component appends to the same file. Each line is written
with a single ``os.write`` on a descriptor opened with ``O_APPEND``, so lines
from different ranks never interleave and a killed run leaves at most one
truncated last line (readers skip it). This module imports nothing heavy:
``hetrun report`` reads events without torch or mpi4py.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hetrun.errors import RunDirError

EVENTS_FILE = "events.jsonl"


class EventLog:
    """Appends events for one rank. Fields common to every line go in ``base``."""

    def __init__(self, run_dir: str | os.PathLike[str], **base: Any) -> None:
        self.path = Path(run_dir) / EVENTS_FILE
        self.base = dict(base)
        try:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as exc:
            raise RunDirError(
                f"cannot open {self.path} for appending: {exc.strerror}",
                hint="check that the run directory exists and is writable from every node",
            ) from exc

    def emit(self, ev: str, **fields: Any) -> dict[str, Any]:
        """Append one ``{"ev": ev, ...}`` line; returns the record written."""
        record: dict[str, Any] = {"ev": ev, **self.base, **fields}
        record.setdefault("time", time.time())
        line = json.dumps(record, separators=(",", ":"), default=_jsonable) + "\n"
        data = line.encode()
        # One write per line: O_APPEND makes the offset update atomic, so
        # concurrent ranks cannot interleave inside a line.
        written = os.write(self._fd, data)
        if written != len(data):  # pragma: no cover - only on a full disk
            raise RunDirError(f"short write to {self.path} ({written}/{len(data)} bytes)")
        return record

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> EventLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _jsonable(value: Any) -> Any:
    # Tensors / numpy scalars in metrics: record them as plain numbers.
    item = getattr(value, "item", None)
    if callable(item):
        try:
            return item()
        except (TypeError, ValueError):
            pass
    return str(value)


def read_events(run_dir: str | os.PathLike[str], *, only: str | None = None) -> Iterator[dict[str, Any]]:
    """Yield the events of a run, skipping a truncated or corrupt line.

    Only the last line can be truncated by a kill; a corrupt line elsewhere is
    also skipped rather than failing a report on a run that is still useful.
    ``only`` keeps events of that kind and skips parsing the others, so
    ``hetrun status`` can read the few ``restore`` lines of a long run cheaply.
    """
    path = Path(run_dir) / EVENTS_FILE
    if not path.exists():
        return
    # A substring test first: most lines of a long run are actions, never parsed then.
    needle = None if only is None else json.dumps(only).encode()
    with path.open("rb") as fh:
        for raw in fh:
            if not raw.endswith(b"\n"):
                break  # truncated last line of a killed run
            if needle is not None and needle not in raw:
                continue
            try:
                record = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError):
                continue
            if isinstance(record, dict) and (only is None or record.get("ev") == only):
                yield record
