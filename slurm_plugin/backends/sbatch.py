"""The Slurm command-line backend: sbatch, squeue, sacct, scancel, scontrol.

Every call goes through ``run_slurm`` (timeout, retry with backoff while the
controller is unreachable). ``status`` asks squeue once for any number of
runs, and sacct once more for runs squeue has already forgotten (finished
jobs leave squeue after MinJobAge).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hetrun.errors import SlurmError

from ..rundir import SCRIPT, RunInfo
from .base import Backend, ComponentStatus, DryRun, RunStatus
from .slurm_cli import RetryPolicy, run_slurm

if TYPE_CHECKING:
    from hetrun.dag.plan import Plan


def _leader(job_id: str | None) -> str | None:
    """The het-job leader id from what sbatch printed (``123`` or ``123;cluster``)."""
    if not job_id:
        return None
    return job_id.split(";", 1)[0].strip() or None


def _int(value: Any) -> int | None:
    """Slurm JSON numbers: plain ints, or ``{"set": bool, "number": n}`` in newer versions."""
    if isinstance(value, dict):
        return int(value["number"]) if value.get("set") and "number" in value else None
    if isinstance(value, bool) or value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _state(value: Any) -> str:
    if isinstance(value, list):  # 23.02+: a list of flags, the first is the base state
        return str(value[0]) if value else "UNKNOWN"
    if isinstance(value, dict):
        return _state(value.get("current"))
    return str(value or "UNKNOWN")


def _parse_elapsed(text: str) -> int | None:
    """sacct's [D-]HH:MM:SS (or MM:SS) -> seconds (dag.validators' one duration parser)."""
    from hetrun.dag.validators import duration_seconds

    return duration_seconds(text)


def _component_name(run: RunInfo, offset: int) -> str:
    return run.components[offset] if 0 <= offset < len(run.components) else f"group{offset}"


class SbatchBackend(Backend):
    name = "sbatch"

    def __init__(self, policy: RetryPolicy | None = None, env: Mapping[str, str] | None = None):
        self.policy = policy or RetryPolicy.from_env()
        self.env = env

    @staticmethod
    def available() -> bool:
        return shutil.which("sbatch") is not None

    def _run(self, cmd: Sequence[str]) -> str:
        return run_slurm(cmd, self.policy, env=self.env).stdout

    def submit_command(self, run: RunInfo) -> list[str]:
        return ["sbatch", "--parsable", str(run.path / SCRIPT)]

    def dry_run(self, run: RunInfo, script: str, plan: Plan) -> DryRun:
        return DryRun(self.name, self.submit_command(run), script)

    def test_only(self, script_path: Path) -> str:
        """``sbatch --test-only``: Slurm's own verdict on a script, nothing submitted."""
        proc = run_slurm(["sbatch", "--test-only", str(script_path)], self.policy, env=self.env)
        return (proc.stderr + proc.stdout).strip()

    def submit(self, run: RunInfo) -> str:
        out = self._run(self.submit_command(run)).strip()
        job_id = _leader(out.splitlines()[-1] if out else "")
        if not job_id or not job_id.isdigit():
            raise SlurmError(f"sbatch printed {out!r}, expected a job id",
                             hint="is sbatch wrapped by a site script that changes its output?")
        return job_id

    def cluster_name(self) -> str | None:
        """The cluster's ClusterName (for run.json); None when it cannot be read."""
        try:
            out = run_slurm(["scontrol", "show", "config"], RetryPolicy(attempts=1, timeout_s=10),
                            env=self.env).stdout
        except SlurmError:
            return None
        for line in out.splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "ClusterName":
                return value.strip() or None
        return None

    # -- status -------------------------------------------------------------
    def _squeue(self) -> list[dict[str, Any]]:
        # 22.05's squeue ignores job filters with --json, so one call serves every run.
        raw = self._run(["squeue", "--json"])
        try:
            return list(json.loads(raw).get("jobs") or [])
        except (json.JSONDecodeError, AttributeError) as exc:
            raise SlurmError(f"`squeue --json` printed something that is not JSON: {raw[:200]!r}") from exc

    def _from_squeue(self, run: RunInfo, jobs: Iterable[dict[str, Any]], now: float) -> list[ComponentStatus]:
        leader = _leader(run.job_id)
        comps = []
        for job in jobs:
            het = _int(job.get("het_job_id"))
            jid = _int(job.get("job_id"))
            if str(het if het else jid) != leader:
                continue
            offset = _int(job.get("het_job_offset")) or 0
            state = _state(job.get("job_state"))
            start = _int(job.get("start_time"))
            end = _int(job.get("end_time"))
            elapsed = None
            if start and state != "PENDING":
                stop = end if end and end <= now else now
                elapsed = max(0, int(stop - start))
            comps.append(ComponentStatus(
                name=_component_name(run, offset), state=state, job_id=str(jid),
                nodes=str(job.get("nodes") or ""), elapsed_s=elapsed,
                restarts=_int(job.get("restart_cnt")) or 0,
                reason=str(job.get("state_reason") or "").replace("None", ""),
                exit_code=_exit_code(job.get("exit_code")),
            ))
        return sorted(comps, key=lambda c: run.components.index(c.name) if c.name in run.components else 99)

    def status(self, runs: Sequence[RunInfo]) -> dict[str, RunStatus]:
        result: dict[str, RunStatus] = {}
        pending = [r for r in runs if _leader(r.job_id)]
        for r in runs:
            if not _leader(r.job_id):
                result[r.run_dir] = RunStatus(r, [ComponentStatus(c, "NOT_SUBMITTED") for c in r.components],
                                              "run.json")
        if not pending:
            return result
        jobs = self._squeue()
        now = time.time()
        missing = []
        for r in pending:
            comps = self._from_squeue(r, jobs, now)
            if comps:
                result[r.run_dir] = RunStatus(r, comps, "squeue")
            else:
                missing.append(r)
        if missing:
            records = self._sacct([_leader(r.job_id) or "" for r in missing])
            for r in missing:
                comps = _from_sacct(r, records)
                if not comps:
                    comps = [ComponentStatus(c, "UNKNOWN", reason="gone from squeue and sacct")
                             for c in r.components]
                result[r.run_dir] = RunStatus(r, comps, "sacct")
        return result

    # -- accounting -----------------------------------------------------------
    def _sacct(self, job_ids: Sequence[str]) -> list[dict[str, Any]]:
        """Job-level records (no steps), one per het component, for the het jobs ``job_ids``:
        one ``sacct -X -D -P`` call. Parsable text, not ``--json``: the same fields, ~0.1 s
        against ~0.45 s for --json on 22.05 (issue 24: the first status after runs end)."""
        ids = ",".join(j for j in job_ids if j)
        if not ids:
            return []
        # Submit orders the attempts: ISO times whatever SLURM_TIME_FORMAT the user set.
        env = {**(os.environ if self.env is None else self.env), **SACCT_TIME_ENV}
        raw = run_slurm(["sacct", "-X", "-D", "-P", "-n", "-j", ids, f"--format={SACCT_FORMAT}"], self.policy,
                        env=env).stdout
        return _latest_attempts(_parse_sacct_parsable(raw))

    def accounting(self, run: RunInfo) -> list[dict[str, Any]]:
        leader = _leader(run.job_id)
        if not leader:
            return []
        return [r for r in self._sacct([leader]) if str(r["het_job_id"]) == leader]

    # -- control ----------------------------------------------------------------
    def cancel(self, run: RunInfo) -> None:
        leader = _leader(run.job_id)
        if not leader:
            raise SlurmError(f"run {run.run_dir} has no Slurm job id (never submitted?)")
        # Cancelling the leader ends every component of the het job.
        self._run(["scancel", leader])

    def requeue(self, run: RunInfo) -> None:
        leader = _leader(run.job_id)
        if not leader:
            raise SlurmError(f"run {run.run_dir} has no Slurm job id (never submitted?)")
        self._run(["scontrol", "requeue", leader])

    def preempt(self, run: RunInfo, signal_name: str) -> str:
        leader = _leader(run.job_id)
        if not leader:
            raise SlurmError(f"run {run.run_dir} has no Slurm job id (never submitted?)")
        # What --signal=B:USR1@N does before the time limit: the signal to the batch shell
        # alone, whose trap forwards it to srun and so to every rank of every component.
        self._run(["scancel", "--batch", f"--signal={signal_name}", leader])
        return f"the batch shell of Slurm job {leader}"


def _exit_code(value: Any) -> int | None:
    """An exit code; squeue reports a raw wait status (code << 8 | signal)."""
    if isinstance(value, dict):
        return _int(value.get("return_code"))
    code = _int(value)
    if code is None or code < 256:
        return code
    return code >> 8 if code & 0x7F == 0 else 128 + (code & 0x7F)


def _latest_attempts(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per het component: sacct -D lists every attempt of a requeued
    job (oldest first); keep the last and count the earlier ones as restarts."""
    latest: dict[tuple[str, int], dict[str, Any]] = {}
    attempts: dict[tuple[str, int], int] = {}
    for rec in records:
        key = (str(rec["het_job_id"]), int(rec["het_offset"]))
        latest[key] = rec
        attempts[key] = attempts.get(key, 0) + 1
    out = []
    for key, rec in latest.items():
        rec = dict(rec)
        rec["restarts"] = max(int(rec.get("restarts") or 0), attempts[key] - 1)
        out.append(rec)
    return out


# What status reads of each allocation. JobName last: the one free-text field, so a name
# holding the delimiter cannot shift the others. ElapsedRaw: seconds; Submit orders attempts.
SACCT_FORMAT = "JobID,JobIDRaw,State,ElapsedRaw,NodeList,ExitCode,Submit,JobName"
# sacct prints times in the caller's SLURM_TIME_FORMAT: every text call sets ISO 8601
# (a user's relative or custom format would neither sort nor parse).
SACCT_TIME_ENV = {"SLURM_TIME_FORMAT": "standard"}


def sacct_rows(raw: str, fmt: str) -> list[dict[str, str]]:
    """``sacct -P -n --format=fmt`` lines (fmt starting with JobID) -> one dict per allocation
    (and attempt, with ``-D``) keyed by fmt's field names, in sacct's order. Steps (``J+0.batch``,
    ``J.0``) are left out; the last field takes any further "|" (put a free-text field last)."""
    names = fmt.split(",")
    out = []
    for line in raw.splitlines():
        fields = line.split("|")
        if len(fields) < len(names) or "." in fields[0]:
            continue
        row = dict(zip(names[:-1], fields, strict=False))
        row[names[-1]] = "|".join(fields[len(names) - 1:])
        out.append(row)
    return out


def sacct_state(text: str) -> str:
    """sacct's State: "CANCELLED by 0" is CANCELLED; an empty one UNKNOWN."""
    return text.split()[0] if text.strip() else "UNKNOWN"


def sacct_time(text: str) -> float | None:
    """A time sacct printed under SACCT_TIME_ENV (ISO 8601 in the local time zone) -> epoch
    seconds; "Unknown"/"None" (not started yet, still running) -> None."""
    from datetime import datetime

    text = text.strip()
    if text in ("", "Unknown", "None"):
        return None
    if text.isdigit():
        return float(text)
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise SlurmError(f"sacct printed the time {text!r}, not ISO 8601",
                         hint="call sacct with SLURM_TIME_FORMAT=standard (hetrun's own callers do)") from None


def _parse_sacct_parsable(raw: str) -> list[dict[str, Any]]:
    """``sacct -P -n --format=SACCT_FORMAT`` lines -> one record per allocation and attempt
    (``-D``: a requeued job's attempts, oldest first), steps (``J+0.batch``, ``J+1.0``) left
    out. The het leader and offset come from JobID (``J+1``), the component's own id from
    JobIDRaw; "CANCELLED by 0" is CANCELLED; ExitCode ``code:signal`` keeps the code."""
    out = []
    for row in sacct_rows(raw, SACCT_FORMAT):
        het, _, offset = row["JobID"].partition("+")
        code = row["ExitCode"].split(":")[0]
        elapsed = row["ElapsedRaw"]
        out.append({
            "job_id": row["JobIDRaw"] or row["JobID"], "het_job_id": het,
            "het_offset": int(offset) if offset.isdigit() else 0,
            "name": row["JobName"], "state": sacct_state(row["State"]),
            "elapsed_s": int(elapsed) if elapsed.isdigit() else None, "nodes": row["NodeList"],
            "exit_code": int(code) if code.isdigit() else None, "restarts": 0, "submit": row["Submit"],
        })
    # Attempts in submit order (ISO times sort as text; a tie keeps sacct's order).
    return sorted(out, key=lambda r: r["submit"])


def _from_sacct(run: RunInfo, records: Sequence[Mapping[str, Any]]) -> list[ComponentStatus]:
    leader = _leader(run.job_id)
    comps = [
        ComponentStatus(
            name=_component_name(run, int(r["het_offset"])), state=str(r["state"]),
            job_id=str(r["job_id"]), nodes=str(r["nodes"]), elapsed_s=r["elapsed_s"],
            restarts=int(r["restarts"] or 0), exit_code=r["exit_code"],
        )
        for r in records if str(r["het_job_id"]) == leader
    ]
    return sorted(comps, key=lambda c: run.components.index(c.name) if c.name in run.components else 99)
