"""The run directory: one owner for its layout, its events file, its variables and defaults.

Standard library only (like ``hetrun.errors``): every layer imports it. Submit
creates a run directory and writes ``run.json``/``job.yaml``/``plan.json``/the
batch script; every rank (action executor, command wrapper, public run API) and
the batch script's post-mortem append to ``events.jsonl``; the reports and the
CLI read it all back. The names, the events line format and the settings'
defaults below are the contract (docs/CONTRACTS.md, "Run directory"); nothing
else spells a file name, opens ``events.jsonl`` by hand or repeats a default.

``RunPaths`` (submitit's ``JobPaths`` is the model) names every path::

    <runs root>/<name>-<YYYYmmdd-HHMMSS>-<4 hex>/
        run.json  job.yaml  plan.json  hetjob.sbatch  events.jsonl  status-cache.json
        logs/                 batch and rank logs, plan-before-attempt-N.json
        ckpt/<component>/     one checkpoint store per component (checkpoint.directory)
"""

from __future__ import annotations

import functools
import json
import os
import re
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hetrun.errors import RunDirError

# -- file names ---------------------------------------------------------------------
RUN_JSON = "run.json"
JOB_YAML = "job.yaml"
PLAN_JSON = "plan.json"
SCRIPT = "hetjob.sbatch"
EVENTS = "events.jsonl"
LOGS = "logs"
CKPT = "ckpt"  # the checkpoint stores' place when the job sets no checkpoint.directory
# `hetrun status`'s answer for a run whose job has ended (cli/status_cache.py): written by
# status, keyed by the files it derives from, so a changed run is read again, never shown stale
STATUS_CACHE = "status-cache.json"

# -- environment variables ------------------------------------------------------------
RUNS_ENV = "HETRUN_RUNS"  # where run directories are created (the CLI's --runs-dir; attach()'s default)
OLD_RUNS_ENV = "HETRUN_RUNS_DIR"  # the run API's old name for it: still read, with a warning
RUN_DIR_ENV = "HETRUN_RUN_DIR"  # this process's run directory (set on every rank hetrun starts)
CKPT_LOCAL_ENV = "HETRUN_CKPT_LOCAL"  # a node-local fast checkpoint tier, drained to the shared one
# `hetrun resume` sets it in the job's env: the restart count of the new job's first
# attempt, so a resumed run's attempts count on from the old job's.
RESTART_BASE_ENV = "HETRUN_RESTART_BASE"
# Spare nodes (docs/PREEMPTION.md): seconds without a heartbeat change after which the batch
# script's monitor takes a node for dead; how often each node's heartbeat file is touched.
NODE_TIMEOUT_ENV = "HETRUN_NODE_TIMEOUT"
HEARTBEAT_ENV = "HETRUN_HEARTBEAT_S"
# Warm starts (runtime/warm_start.py): the node-local socket of the node's warm server, the
# switch ("0": none), and the name of the servers' job step (the batch script's step lists
# leave it out: it is not the ranks' step).
WARM_SOCKET_ENV = "HETRUN_WARM_SOCKET"
WARM_SWITCH_ENV = "HETRUN_WARM_START"
WARM_FORKED_ENV = "HETRUN_WARM_FORKED"  # set in a forked rank or program: when it was forked (epoch s)
WARM_STEP_NAME = "hetrun-warm"
MEMORY_DIR_ENV = "HETRUN_MEMORY_DIR"  # the memory tier's node-local root (default /dev/shm)
# Judged by change on the batch node's own clock (never by comparing a shared file's mtime
# with it). 3 s: at load average 20-28 on 2 cores a healthy rank's heartbeat (every 0.5 s, a
# process beside the rank) looked silent to the monitor for at most 0.99 s, 3x below it
# (benchmarks/heartbeat_gaps.py, benchmarks/node_death.md; a thread in the rank: 5.7 s);
# each second less is a second off every node-death restart. A shared file system that
# stalls for seconds needs more (the env variable; docs/PREEMPTION.md: the trade-off).
NODE_TIMEOUT_DEFAULT_S = 3
HEARTBEAT_DEFAULT_S = 0.5

# -- spare nodes' files under logs/ (the batch script and runtime/recovery.py) -----------------
HEARTBEATS = "alive"  # logs/alive/<node>: touched by the node's lowest rank while it runs
IN_ALLOCATION_RESTARTS = "in-allocation-restarts"  # one "<job id> <restart count>" line per restart
DEAD_NODES_PREFIX = ".dead-nodes-"  # + job id: nodes found dead in this job, not used again ...
RETURNED_SUFFIX = ".returned"  # ... unless taken back once (this file beside it: the nodes that were)
SILENT_NODES_PREFIX = ".silent-nodes-"  # + job id: nodes the monitor found silent this step
# logs/cpu-phase/<node>/<component>-<rank>: one byte, "1" while that rank computes, "0" while it
# waits; a learner's update takes the node's cores its rollout ranks leave idle (examples/cpu_share.py)
CPU_PHASE = "cpu-phase"

# Directories every compute node has its own copy of: what one node (or the submit host)
# writes there, the other nodes and a requeued job cannot see (the local cluster's slurmd
# run with a private /tmp exactly like real nodes).
NODE_LOCAL_ROOTS = ("/tmp", "/dev/shm", "/run")


# -- the job file's defaults ------------------------------------------------------------
# The spec (dag/spec.py), the typed plan view, the run API and the batch script take
# these: a default is written here once.
@dataclass(frozen=True)
class Defaults:
    checkpoint_interval: int = 10  # checkpoint.interval: every N iterations (steps); 0 = never
    checkpoint_keep: int = 3  # checkpoint.keep
    max_delta_chain: int = 4  # checkpoint.max_delta_chain
    optimizer_encoding: str = "exact"  # checkpoint.optimizer_encoding
    preemption_signal: str = "USR1"  # preemption.signal
    grace_seconds: int = 60  # preemption.grace_seconds
    max_failures: int = 0  # preemption.max_failures
    object_upload_threads: int = 8  # checkpoint.object_store.upload_threads: parallel requests per rank
    object_shard_wait_s: float = 600.0  # checkpoint.object_store.shard_wait_s: rank 0's wait for every shard
    # checkpoint.memory_every: None = adaptive with spare_nodes (runtime/memory_tier.py), else off
    memory_every: int | None = None
    # checkpoint.memory_every_max: the adaptive N's largest (a power of two). 1: a snapshot every
    # iteration, so a node death costs at most the iteration it interrupted (issue 25's bound);
    # the tier's cost at N = 1 is measured and `hetrun report` says when it passes the budget.
    memory_every_max: int = 1
    memory_budget: float = 0.02  # the adaptive N's share of training (runtime/memory_tier.py, the report's line)
    memory_replicas: int = 1  # checkpoint.memory_replicas


DEFAULTS = Defaults()
# preemption.grace_seconds' range: Slurm's --signal=<sig>@<seconds> takes at most 65535,
# and a zero grace leaves no time to checkpoint. The spec and the batch script's last gate.
GRACE_SECONDS_RANGE = (1, 65535)


# -- the "every N iterations" rule --------------------------------------------------------
def runs_at(every: int, iteration: int) -> bool:
    """Whether something done every ``every`` iterations runs at ``iteration`` (0-based):
    at i with (i + 1) % every == 0, i.e. after every ``every``-th iteration. One rule for
    an action's ``every``, checkpoint.interval and the run API's ``checkpoint_due``."""
    return every > 0 and (iteration + 1) % every == 0


def last_run_at_or_before(every: int, iteration: int) -> int:
    """The newest iteration <= ``iteration`` at which ``runs_at(every, .)`` holds (-1: none)."""
    if iteration < 0 or every <= 0:
        return -1
    return ((iteration + 1) // every) * every - 1


# -- paths --------------------------------------------------------------------------------
def node_local_root(path: str | os.PathLike[str]) -> str | None:
    """The node-local root (``NODE_LOCAL_ROOTS``) ``path`` lies under, or None."""
    resolved = Path(os.path.abspath(os.path.expanduser(str(path))))
    with_links = Path(os.path.realpath(resolved))
    for p in (resolved, with_links):
        for root in NODE_LOCAL_ROOTS:
            if p == Path(root) or Path(root) in p.parents:
                return root
    return None


def checkpoint_root(run_dir: str | os.PathLike[str], directory: str | None) -> Path:
    """Where a run's checkpoint stores live: ``checkpoint.directory`` (a relative one is
    relative to the run directory), else ``<run_dir>/ckpt``."""
    root = Path(directory) if directory else Path(CKPT)
    return root if root.is_absolute() else Path(run_dir) / root


_ARCHIVED_PLAN = re.compile(r"plan-before-attempt-(\d+)\.json")


@dataclass(frozen=True)
class RunPaths:
    """Every path in one run directory."""

    root: Path

    def __init__(self, root: str | os.PathLike[str]) -> None:
        object.__setattr__(self, "root", Path(root))

    @property
    def run_json(self) -> Path:
        return self.root / RUN_JSON

    @property
    def job_yaml(self) -> Path:
        return self.root / JOB_YAML

    @property
    def plan(self) -> Path:
        return self.root / PLAN_JSON

    @property
    def script(self) -> Path:
        return self.root / SCRIPT

    @property
    def events(self) -> Path:
        return self.root / EVENTS

    @property
    def logs(self) -> Path:
        return self.root / LOGS

    @property
    def status_cache(self) -> Path:
        return self.root / STATUS_CACHE

    @property
    def heartbeats(self) -> Path:
        return self.logs / HEARTBEATS

    def cpu_phase(self, node: str) -> Path:
        return self.logs / CPU_PHASE / node

    @property
    def in_allocation_restarts(self) -> Path:
        return self.logs / IN_ALLOCATION_RESTARTS

    def dead_nodes(self, job_id: str) -> Path:
        return self.logs / f"{DEAD_NODES_PREFIX}{job_id}"

    def silent_nodes(self, job_id: str) -> Path:
        return self.logs / f"{SILENT_NODES_PREFIX}{job_id}"

    def plan_before_attempt(self, restart: int) -> Path:
        """The plan a resume replaced, kept for the reports of the attempts it ran
        (``restart``: the restart count of the job that replaced it)."""
        return self.logs / f"plan-before-attempt-{restart}.json"

    def archived_plans(self) -> list[tuple[int, Path]]:
        """(restart, path) of every ``plan_before_attempt`` file, oldest first."""
        found = []
        if self.logs.is_dir():
            for p in self.logs.iterdir():
                m = _ARCHIVED_PLAN.fullmatch(p.name)
                if m:
                    found.append((int(m.group(1)), p))
        return sorted(found)

    def checkpoint_root(self, directory: str | None = None) -> Path:
        return checkpoint_root(self.root, directory)

    def store(self, component: str, directory: str | None = None) -> Path:
        """One component's checkpoint store."""
        return checkpoint_root(self.root, directory) / component

    def local_store(self, base: str | os.PathLike[str], component: str) -> Path:
        """One component's node-local tier under ``base`` (``$HETRUN_CKPT_LOCAL``)."""
        return Path(base) / self.root.name / component


def runs_root(cli_value: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None) -> Path:
    """Where run directories go: ``--runs-dir``, else ``$HETRUN_RUNS``, else ``./runs``;
    absolute, not created. ``$HETRUN_RUNS_DIR`` (the run API's old name) is read when
    ``$HETRUN_RUNS`` is not set, with a warning; both set to different places is an error."""
    env = os.environ if env is None else env
    if cli_value not in (None, ""):
        raw = str(cli_value)
    else:
        new, old = env.get(RUNS_ENV) or "", env.get(OLD_RUNS_ENV) or ""
        if old and new and os.path.abspath(os.path.expanduser(old)) != os.path.abspath(os.path.expanduser(new)):
            raise RunDirError(f"${RUNS_ENV}={new!r} and ${OLD_RUNS_ENV}={old!r} disagree",
                              hint=f"unset {OLD_RUNS_ENV} (the old name); {RUNS_ENV} is the one runs directory")
        if old and not new:
            warnings.warn(f"${OLD_RUNS_ENV} is the old name of ${RUNS_ENV}; set {RUNS_ENV} instead",
                          FutureWarning, stacklevel=2)
        raw = new or old or "runs"
    if "\x00" in raw or "\n" in raw:
        raise RunDirError(f"runs directory {raw!r} contains NUL or a newline",
                          hint=f"give a plain directory path with --runs-dir or ${RUNS_ENV}")
    return Path(os.path.abspath(os.path.expanduser(raw)))


# -- events.jsonl ---------------------------------------------------------------------------
# One JSON object per line, one O_APPEND write per line: lines from different ranks never
# interleave, and a killed run leaves at most one truncated last line (readers skip it).
TIME_KEY = "time"  # when the line was written (epoch seconds)
_OLD_TIME_KEY = "t"  # what the batch script's post-mortem wrote before one key


def _jsonable(value: Any) -> Any:
    # Tensors / numpy scalars in metrics: record them as plain numbers.
    item = getattr(value, "item", None)
    if callable(item):
        try:
            return item()
        except (TypeError, ValueError):
            pass
    return str(value)


def _line(ev: str, base: Mapping[str, Any], fields: Mapping[str, Any]) -> tuple[dict[str, Any], bytes]:
    record: dict[str, Any] = {"ev": ev, **base, **fields}
    record.setdefault(TIME_KEY, time.time())
    return record, (json.dumps(record, separators=(",", ":"), default=_jsonable) + "\n").encode()


class EventLog:
    """Appends events for one writer (a rank, the post-mortem); ``base`` goes on every line."""

    def __init__(self, run_dir: str | os.PathLike[str], **base: Any) -> None:
        self.path = Path(run_dir) / EVENTS
        self.base = dict(base)
        try:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as exc:
            raise RunDirError(
                f"cannot open {self.path} for appending: {exc.strerror}",
                hint="check that the run directory exists and is writable from every node",
            ) from exc

    def emit(self, ev: str, **fields: Any) -> dict[str, Any]:
        """Append one ``{"ev": ev, ..., "time": now}`` line; returns the record written."""
        record, data = _line(ev, self.base, fields)
        written = os.write(self._fd, data)  # one write: O_APPEND makes the offset update atomic
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


def append_event(run_dir: str | os.PathLike[str], ev: str, **fields: Any) -> dict[str, Any]:
    """Append one line and close (the post-mortem and the local supervisor's few lines)."""
    with EventLog(run_dir) as log:
        return log.emit(ev, **fields)


def event_time(record: Mapping[str, Any]) -> float | None:
    """When a line was written: ``time``; ``t`` in run directories from before one key."""
    for key in (TIME_KEY, _OLD_TIME_KEY):
        value = record.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    return None


@functools.cache
def _line_parser() -> Callable[[bytes], Any]:
    """orjson's loads (~4x json's speed on event lines) where installed, else the stdlib's,
    which reads the same lines. Imported when events are first read, not with this module:
    importing hetrun.rundir pulls the standard library only (tests/test_layering.py)."""
    try:
        from orjson import loads
    except ImportError:  # pragma: no cover - orjson is a dependency; the stdlib stays enough
        return json.loads
    return loads  # type: ignore[no-any-return]


def _dated(record: dict[str, Any]) -> dict[str, Any]:
    """A line from before one time key gets ``time`` from its ``t``."""
    if TIME_KEY not in record and _OLD_TIME_KEY in record:
        record[TIME_KEY] = record[_OLD_TIME_KEY]
    return record


class EventStream:
    """The one reader of ``events.jsonl``: iterate a run's events once, oldest first.

    Lines are parsed one at a time, so a run of 10^6 events is read in bounded memory.
    A killed run leaves at most one truncated last line; it and any corrupt line are
    counted in ``skipped`` instead of failing a report on a run that is still useful.
    ``kinds`` keeps only those event kinds and does not split or parse the other lines
    (one regular-expression scan per 8 MiB block), which keeps ``hetrun status`` cheap
    on a long run. A line from before one time key gets ``time`` from its ``t``.
    ``skipped`` and ``lines`` are known after the loop.
    """

    def __init__(self, run_dir: str | os.PathLike[str], kinds: str | Iterable[str] | None = None) -> None:
        self.path = Path(run_dir) / EVENTS
        self.kinds = None if kinds is None else frozenset([kinds] if isinstance(kinds, str) else kinds)
        # '"ev":"x"' as EventLog writes it, or '"ev": "x"' as json.dumps' default spacing;
        # a bare '"start"' would also match every action's key.
        self._needle = None if self.kinds is None else re.compile(
            b'"ev": ?"(?:' + b"|".join(re.escape(json.dumps(k)[1:-1].encode()) for k in sorted(self.kinds)) + b')"')
        self.skipped = 0
        self.lines = 0

    def __iter__(self) -> Iterator[dict[str, Any]]:
        try:
            fh = self.path.open("rb")
        except OSError:
            return
        parse = _line_parser()
        with fh:
            for raw in fh if self._needle is None else self._kept_lines(fh, self._needle):
                self.lines += self._needle is None
                if not raw.endswith(b"\n"):
                    self.skipped += 1  # the torn last line of a killed run
                    break
                try:
                    record = parse(raw)
                except (ValueError, UnicodeDecodeError):
                    self.skipped += 1
                    continue
                if not isinstance(record, dict):
                    self.skipped += 1
                elif self.kinds is None or record.get("ev") in self.kinds:
                    yield _dated(record)

    def _kept_lines(self, fh: Any, needle: re.Pattern[bytes]) -> Iterator[bytes]:
        """The lines holding one of the kinds, found by one regular-expression scan per 8 MiB
        block (C speed: the other lines are neither split nor parsed); counts every line."""
        rest = b""
        while chunk := fh.read(1 << 23):
            block = rest + chunk
            cut = block.rfind(b"\n") + 1
            block, rest = block[:cut], block[cut:]
            self.lines += block.count(b"\n")
            end = 0
            for m in needle.finditer(block):
                if m.start() < end:
                    continue  # a second match on a line already kept
                start = block.rfind(b"\n", 0, m.start()) + 1
                end = block.index(b"\n", m.end()) + 1
                yield block[start:end]
        if rest:
            self.lines += 1
            yield rest  # the torn last line: skipped by the caller


def read_events(run_dir: str | os.PathLike[str], *, only: str | Iterable[str] | None = None
                ) -> Iterator[dict[str, Any]]:
    """The events of a run, oldest first (``EventStream`` without its counters).

    ``only`` (one kind or several) keeps those kinds and skips parsing the others.
    """
    return iter(EventStream(run_dir, only))


def events_after(run_dir: str | os.PathLike[str], offset: int) -> tuple[list[dict[str, Any]], int]:
    """The complete lines appended since byte ``offset``, and the offset to read from next.

    ``hetrun status --watch`` follows a run with it: each refresh costs what the run
    wrote since the last one; a line still being written waits for the next refresh.
    """
    try:
        with (Path(run_dir) / EVENTS).open("rb") as fh:
            fh.seek(offset)
            data = fh.read()
    except OSError:
        return [], offset
    end = data.rfind(b"\n") + 1
    records = []
    parse = _line_parser()
    for raw in data[:end].splitlines():
        try:
            record = parse(raw)
        except (ValueError, UnicodeDecodeError):
            continue
        if isinstance(record, dict):
            records.append(_dated(record))
    return records, offset + end


def events_of(run_dir: str | os.PathLike[str], kinds: Iterable[str]) -> list[dict[str, Any]]:
    """The lines whose ``ev`` is one of ``kinds``, as a list."""
    return list(read_events(run_dir, only=kinds))
