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
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from hetrun.backoff import Backoff, poll_until
from hetrun.errors import RunDirError

# The names, the events writer/reader and the runs-directory variable are hetrun.rundir's.
from hetrun.rundir import (  # noqa: F401  (re-exported: the Slurm side's import path)
    EVENTS,
    JOB_YAML,
    LOGS,
    PLAN_JSON,
    RESTART_BASE_ENV,
    RUN_JSON,
    RUNS_ENV,
    SCRIPT,
    append_event,
    events_of,
    runs_root,
)

from . import quoting


def restart_base(plan: Mapping[str, Any]) -> int:
    """The first attempt's restart count of a job (0 unless ``hetrun resume`` submitted it)."""
    return restart_base_of_env(plan.get("env") or {})


def restart_base_of_env(env: Mapping[str, str]) -> int:
    """``restart_base`` from the job's environment (``hetrun resume`` sets the variable)."""
    value = str(env.get(RESTART_BASE_ENV, "0"))
    return int(value) if value.isdigit() else 0



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


