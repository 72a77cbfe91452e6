"""A finished run's `hetrun status` answer, kept in its run directory (issue 24).

Once a run's job has left squeue and sacct gives every component an end state, nothing
the scheduler says about it can change (Slurm can requeue an ended job only while the
controller still lists it), and what the table reads from the run directory (events,
plan, job file, archived plans) changes only if a file does. So the first status that
sees it so writes the row's figures to ``status-cache.json`` (``hetrun.rundir.STATUS_CACHE``),
keyed by the size, mtime and inode of every file they came from (a file replaced by a
rename, as run.json is rewritten, has a new inode even within one timestamp tick); a later
status reads that instead of asking sacct (~0.1 s per call) and scanning the events: a
stat per file. A key that no longer matches (a resubmit rewrote run.json, a line was
appended, a resume archived a plan) or a record that does not parse is ignored and the
run read afresh. Plain JSON, never pickle. A run directory status cannot write to is
shown all the same.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any

from hetrun.rundir import EVENTS, JOB_YAML, LOGS, PLAN_JSON, RUN_JSON, STATUS_CACHE

VERSION = 1
# Every file or directory the cached figures derive from: run.json (job id, components),
# the events (counts, work lost, failure, node failures), the plan and job file and the
# plans archived under logs/ (placements).
_SOURCES = (RUN_JSON, EVENTS, PLAN_JSON, JOB_YAML, LOGS)
# Not an end state, though not active either: these say the scheduler does not know (yet).
_NOT_FINAL = frozenset({"UNKNOWN", "ERROR", "NOT_SUBMITTED"})


def fingerprint(run_dir: str) -> list[list[Any]]:
    """[name, size, mtime_ns, inode] of each source file (Nones: absent). Taken before the
    files are read, so a change while status reads them shows as a stale key next time."""
    out: list[list[Any]] = []
    for name in _SOURCES:
        try:
            st = os.stat(os.path.join(run_dir, name))
            out.append([name, st.st_size, st.st_mtime_ns, st.st_ino])
        except OSError:
            out.append([name, None, None, None])
    return out


def read(run_dir: str, key: list[list[Any]]) -> dict[str, Any] | None:
    """The cached record (``components``: the scheduler's final view, ``local``: the table's
    figures from the run directory) when its key is ``key``; else None."""
    try:
        with open(os.path.join(run_dir, STATUS_CACHE), "rb") as fh:
            record = json.loads(fh.read())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("version") != VERSION or record.get("key") != key:
        return None
    if not isinstance(record.get("components"), list) or not isinstance(record.get("local"), dict):
        return None
    return record


def is_final(components: list[Any], names: list[str], source: str, active: frozenset[str]) -> bool:
    """Whether the scheduler's answer can no longer change: it came from sacct (the job has
    left squeue) and every one of the run's components has an end state."""
    return (source == "sacct" and sorted(c.name for c in components) == sorted(names)
            and all(c.state not in active and c.state not in _NOT_FINAL for c in components))


def write(run_dir: str, key: list[list[Any]], components: list[dict[str, Any]], local: dict[str, Any]) -> None:
    """Write the record atomically (a reader sees the old one or the new one); a run
    directory that cannot be written (another user's runs) is left as it is."""
    path = os.path.join(run_dir, STATUS_CACHE)
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w") as fh:
            json.dump({"version": VERSION, "key": key, "components": components, "local": local}, fh)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
