"""Run directories: create them, write their files atomically, find and list them.

A run directory is ``<runs_root>/<name>-<YYYYmmdd-HHMMSS>-<4 hex>/`` and is
the contract between submit, the runtime and the reports (docs/CONTRACTS.md).
``run.json`` is the record this module owns; it is rewritten atomically
(temp file, fsync, rename) so a reader never sees half of it.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from hetrun.backoff import Backoff, poll_until
from hetrun.errors import RunDirError

from . import quoting

RUN_JSON = "run.json"
JOB_YAML = "job.yaml"
PLAN_JSON = "plan.json"
SCRIPT = "hetjob.sbatch"
LOGS = "logs"
RUNS_ENV = "HETRUN_RUNS"
EVENTS = "events.jsonl"
# `hetrun resume` sets it in the job's env: the restart count of the new job's first
# attempt, so a resumed run's attempts count on from the old job's (docs/CONTRACTS.md).
RESTART_BASE_ENV = "HETRUN_RESTART_BASE"


def restart_base(plan: Mapping[str, Any]) -> int:
    """The first attempt's restart count of a job (0 unless ``hetrun resume`` submitted it)."""
    value = str((plan.get("env") or {}).get(RESTART_BASE_ENV, "0"))
    return int(value) if value.isdigit() else 0



def runs_root(cli_value: str | Path | None = None, env: Mapping[str, str] | None = None) -> Path:
    """``--runs-dir``, else ``$HETRUN_RUNS``, else ``./runs``; absolute, not created."""
    env = os.environ if env is None else env
    raw = cli_value if cli_value not in (None, "") else env.get(RUNS_ENV) or "runs"
    text = str(raw)
    if "\x00" in text or "\n" in text:
        raise RunDirError(f"runs directory {text!r} contains NUL or a newline",
                          hint="give a plain directory path with --runs-dir or $HETRUN_RUNS")
    return Path(os.path.abspath(os.path.expanduser(text)))


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write ``path`` so readers see the old or the new content, never a mix."""
    payload = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    # fsync the directory so the rename itself survives a crash.
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


@dataclass
class RunInfo:
    """The content of ``run.json``."""

    name: str
    run_dir: str
    backend: str
    job_id: str | None = None
    submitted_at: str | None = None
    components: list[str] = field(default_factory=list)
    cluster: str | None = None
    # Local backend: the supervisor's pid (= its process group) and start time,
    # so status/cancel never signal an unrelated process that reused the pid.
    pids: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def path(self) -> Path:
        return Path(self.run_dir)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any], source: Path) -> RunInfo:
        try:
            return cls(
                name=str(data["name"]),
                run_dir=str(data.get("run_dir") or source.parent),
                backend=str(data["backend"]),
                job_id=None if data.get("job_id") in (None, "") else str(data["job_id"]),
                submitted_at=data.get("submitted_at"),
                components=[str(c) for c in data.get("components") or []],
                cluster=data.get("cluster"),
                pids=dict(data.get("pids") or {}),
                extra=dict(data.get("extra") or {}),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise RunDirError(f"{source}: not a valid run record ({exc})",
                              hint="the file is written by `hetrun submit`; do not edit it") from exc


def write_run(info: RunInfo) -> None:
    write_atomic(info.path / RUN_JSON, json.dumps(info.to_json(), indent=2, sort_keys=True) + "\n")


def read_run(run_dir: Path) -> RunInfo:
    path = run_dir / RUN_JSON
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise RunDirError(f"{run_dir} is not a hetrun run directory (no {RUN_JSON})",
                          hint="give a directory created by `hetrun submit`") from exc
    except (OSError, json.JSONDecodeError) as exc:
        raise RunDirError(f"{path}: cannot read run record ({exc})") from exc
    if not isinstance(data, dict):
        raise RunDirError(f"{path}: not a JSON object")
    info = RunInfo.from_json(data, path)
    # The directory may have moved since submit; where it is now wins.
    info.run_dir = str(run_dir.resolve())
    return info


def new_run_name(name: str, now: datetime | None = None, suffix: str | None = None) -> str:
    quoting.job_name(name)
    now = now or datetime.now(timezone.utc)
    suffix = suffix or secrets.token_hex(2)
    return f"{name}-{now.strftime('%Y%m%d-%H%M%S')}-{suffix}"


def create_run_dir(root: Path, name: str) -> Path:
    """Make a fresh ``<root>/<name>-<stamp>-<hex>/`` (and its logs/); never reuses one."""
    root = root if root.is_absolute() else root.resolve()
    quoting.sbatch_path(root, "runs directory")
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RunDirError(f"cannot create runs directory {root}: {exc.strerror}",
                          hint="choose a writable --runs-dir") from exc
    for _ in range(16):
        leaf = quoting.check_relative_part(new_run_name(name), "name")
        run_dir = quoting.inside(root, Path(leaf), "run directory")
        try:
            run_dir.mkdir()
        except FileExistsError:
            continue
        (run_dir / LOGS).mkdir()
        return run_dir
    raise RunDirError(f"could not find a free run directory name for {name!r} in {root}")


def _iter_run_dirs(root: Path) -> Iterator[Path]:
    if not root.is_dir():
        return
    for child in root.iterdir():
        if child.is_dir() and (child / RUN_JSON).is_file():
            yield child


def _sort_key(info: RunInfo) -> tuple[str, str]:
    return (info.submitted_at or "", Path(info.run_dir).name)


def list_runs(root: Path) -> list[RunInfo]:
    """All runs under ``root``, oldest first; unreadable records are skipped."""
    runs = []
    for d in _iter_run_dirs(root):
        try:
            runs.append(read_run(d))
        except RunDirError:
            continue
    return sorted(runs, key=_sort_key)


def find_run(ref: str, root: Path) -> RunInfo:
    """A run by path, by directory-name prefix under ``root``, or by Slurm job id.

    An ambiguous prefix is an error listing the candidates: ``cancel`` must
    never guess which run to end.
    """
    if not ref or "\x00" in ref or "\n" in ref:
        raise RunDirError(f"{ref!r} is not a run reference",
                          hint="give a run directory, a run name (prefix) or a Slurm job id")
    as_path = Path(ref).expanduser()
    if (as_path / RUN_JSON).is_file():
        return read_run(as_path)
    runs = list_runs(root)
    same_id = [r for r in runs if r.job_id == ref]
    if same_id:
        return same_id[-1]
    job_id = ref.split("+", 1)[0].split(".", 1)[0]
    if job_id.isdigit():
        hits = [r for r in runs if r.job_id is not None and r.job_id.split(";")[0] == job_id]
        if hits:
            return hits[-1]
    exact = [r for r in runs if Path(r.run_dir).name == ref]
    if exact:
        return exact[0]
    hits = [r for r in runs if Path(r.run_dir).name.startswith(ref)]
    if len(hits) == 1:
        return hits[0]
    if not hits:
        known = ", ".join(Path(r.run_dir).name for r in runs[-5:]) or "none"
        raise RunDirError(f"no run matches {ref!r} under {root}",
                          hint=f"recent runs: {known}; or pass --runs-dir / $HETRUN_RUNS")
    names = ", ".join(Path(r.run_dir).name for r in hits)
    raise RunDirError(f"{ref!r} matches {len(hits)} runs: {names}",
                      hint="give more of the name, the full directory, or the job id")


def utc_now_iso() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def wait_for(predicate: Any, timeout: float, interval: float = 0.5) -> bool:
    """Poll ``predicate()`` every ``interval`` seconds until true (True) or ``timeout`` passes (False)."""
    return bool(poll_until(predicate, Backoff(first=interval, most=interval, factor=1), timeout=timeout))


def append_event(run_dir: Path, ev: str, **fields: Any) -> dict[str, Any]:
    """Append one ``{"ev": ev, ..., "t": now}`` line to events.jsonl, the way the
    runtime's EventLog does (one O_APPEND write, so lines never interleave).

    The Slurm side (batch script post-mortem, local supervisor) writes
    ``rank_failure`` and ``attempt_end`` with it without importing the runtime.
    """
    record = {"ev": ev, **fields}
    record.setdefault("t", time.time())
    data = (json.dumps(record, separators=(",", ":"), default=str) + "\n").encode()
    fd = os.open(run_dir / EVENTS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    return record


def events_of(run_dir: Path, kinds: tuple[str, ...]) -> list[dict[str, Any]]:
    """The events.jsonl records whose ``ev`` is one of ``kinds`` (a truncated or
    corrupt line is skipped, as every reader of the file does)."""
    needles = [json.dumps(k).encode() for k in kinds]
    out = []
    try:
        with (run_dir / EVENTS).open("rb") as fh:
            for raw in fh:
                if not any(n in raw for n in needles):
                    continue
                with contextlib.suppress(ValueError):
                    rec = json.loads(raw)
                    if isinstance(rec, dict) and rec.get("ev") in kinds:
                        out.append(rec)
    except FileNotFoundError:
        pass
    return out
