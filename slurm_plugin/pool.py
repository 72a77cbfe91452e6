"""The compute pool as Slurm sees it (``hetrun pool``), from one call each of
``sinfo --json``, ``squeue --json``, ``sacct -X -D -P`` and ``sshare -P``.

Shapes are Slurm 22.05's (OpenAPI v0.0.38 data, checked live; samples in
tests/data/pool/). sacct is read as parsable text (the sbatch backend's one
parser, backends/sbatch.py): ~0.15 s where ``--json`` took ~1 s of the command. The parsers are pure functions of that data, so the same
snapshot feeds the table, ``--json`` and placement scoring.

- capacity per partition and GRES type (a node in two partitions counts in
  both, as in sinfo): nodes idle / mixed / allocated / drained / down,
  CPUs, GPUs and memory allocated vs total;
- pending demand per partition (jobs and the TRES they ask for);
- fair share per account (sshare) and each account's share of what was
  allocated over the last hours (sacct: allocated TRES x overlap with the
  window, so long jobs count only for the part inside it);
- nodes with a failure history: down/drain reasons now, and jobs that ended
  NODE_FAIL on them inside the window.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from hetrun.errors import SlurmError

Runner = Callable[[Sequence[str]], str]
NO_GRES = "-"
_GRES_ITEM = re.compile(r"^(?P<name>[A-Za-z0-9_]+)(?::(?P<type>[A-Za-z0-9_.-]+))?:(?P<n>\d+)")


@dataclass
class PoolRow:
    partition: str
    gres: str  # "gpu:a100", "gpu" (untyped) or "-" (no GPU)
    nodes: dict[str, int] = field(default_factory=dict)  # idle/mixed/allocated/drained/down/other
    cpus_alloc: int = 0
    cpus_total: int = 0
    gpus_alloc: int = 0
    gpus_total: int = 0
    mem_alloc_mb: int = 0
    mem_total_mb: int = 0

    @property
    def node_total(self) -> int:
        return sum(self.nodes.values())


@dataclass
class Pending:
    partition: str
    jobs: int = 0
    tres: dict[str, int] = field(default_factory=dict)  # cpu, mem (MB), node, gres/gpu...


@dataclass
class AccountShare:
    account: str
    raw_shares: int | None = None
    norm_shares: float | None = None
    effective_usage: float | None = None
    fairshare: float | None = None
    cpu_seconds: float = 0.0
    gpu_seconds: float = 0.0
    cpu_share: float = 0.0  # of everything allocated in the window
    gpu_share: float = 0.0


@dataclass
class NodeTrouble:
    node: str
    state: str
    reason: str
    since: int | None  # epoch seconds of the reason
    failed_jobs: int = 0  # NODE_FAIL in the window


@dataclass
class NodeFree:
    """One node's free resources (for placement); a node in no usable state has none."""

    name: str
    partitions: tuple[str, ...]
    gres: str
    state: str
    cpus_free: int
    gpus_free: int
    mem_free_mb: int


@dataclass
class RunningUse:
    """TRES allocated to one running job (squeue), with what quotas count it under, and where
    and since when it runs (what preempting it would throw away: ``placement.preemption_loss``)."""

    account: str
    user: str
    qos: str
    tres: dict[str, int] = field(default_factory=dict)  # cpu, mem (MB), node, gres/gpu, gres/gpu:TYPE
    job_id: int = 0
    nodes: tuple[str, ...] = ()
    start: float = 0.0  # epoch seconds (0: not known)


@dataclass
class PoolSnapshot:
    taken_at: float
    hours: float
    rows: list[PoolRow]
    pending: list[Pending]
    accounts: list[AccountShare]
    troubled: list[NodeTrouble]
    running_jobs: int = 0
    nodes: list[NodeFree] = field(default_factory=list)
    running_use: list[RunningUse] = field(default_factory=list)  # for quota left (slurm_plugin.quota)
    # Nodes pending jobs name (their --nodelist: another placement's preemption, say): not free
    # for the next placement, nor its victims' (placement.preemption_plan).
    claimed: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for row, out in zip(self.rows, data["rows"], strict=True):
            out["node_total"] = row.node_total
        return data


# ------------------------------------------------------------------ helpers


def parse_gres(text: str | None) -> dict[str, int]:
    """``gpu:a100:2(S:0),shard:8`` -> ``{"gpu:a100": 2, "shard": 8}`` (``gpu:0`` -> ``{"gpu": 0}``)."""
    out: dict[str, int] = {}
    for item in (text or "").split(","):
        m = _GRES_ITEM.match(item.strip())
        if m:
            # The type as Slurm spells it: its GRES type match is case-sensitive (gpu:a100 does not
            # get a Type=A100 GPU, checked on Slurm 22.05), so the placed --gres must keep it.
            key = m.group("name") + (f":{m.group('type')}" if m.group("type") else "")
            out[key] = out.get(key, 0) + int(m.group("n"))
    return out


def tres_dict(text: str | None) -> dict[str, int]:
    """``cpu=8,mem=12000M,node=4,gres/gpu=2`` -> dict, memory in MB."""
    out: dict[str, int] = {}
    for item in (text or "").split(","):
        key, sep, value = item.partition("=")
        if not sep:
            continue
        scale = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024**2}.get(value[-1:].upper())
        try:
            out[key] = int(float(value[:-1]) * scale) if scale else int(value)
        except ValueError:
            continue
    return out


def expand_hostlist(text: str) -> list[str]:
    """``n[1-3,5],gpu2`` -> ``["n1", "n2", "n3", "n5", "gpu2"]`` (Slurm's simple hostlists)."""
    out: list[str] = []
    for m in re.finditer(r"([^,\[]+)(?:\[([^\]]+)\])?", text or ""):
        prefix, ranges = m.group(1), m.group(2)
        if not ranges:
            out.append(prefix)
            continue
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            width = len(lo)
            for i in range(int(lo), int(hi or lo) + 1):
                out.append(f"{prefix}{i:0{width}d}")
    return out


def node_state(node: dict[str, Any]) -> str:
    flags = {f.upper() for f in node.get("state_flags") or []}
    base = str(node.get("state", "")).lower()
    if "DRAIN" in flags or base.startswith("drain"):
        return "drained"
    if base in ("idle", "mixed", "allocated", "down"):
        return base
    return "other"


def _gres_key(gres: dict[str, int]) -> str:
    gpus = [k for k in gres if k.split(":")[0] == "gpu"]
    return gpus[0] if gpus else NO_GRES


def _gpu_count(gres: dict[str, int]) -> int:
    return sum(n for k, n in gres.items() if k.split(":")[0] == "gpu")


# ------------------------------------------------------------------ parsers


def rows_from_sinfo(data: dict[str, Any]) -> list[PoolRow]:
    rows: dict[tuple[str, str], PoolRow] = {}
    for node in data.get("nodes") or []:
        gres = parse_gres(node.get("gres"))
        used = parse_gres(node.get("gres_used"))
        key = _gres_key(gres)
        state = node_state(node)
        for part in node.get("partitions") or ["-"]:
            row = rows.setdefault((part, key), PoolRow(part, key))
            row.nodes[state] = row.nodes.get(state, 0) + 1
            row.cpus_total += int(node.get("cpus") or 0)
            row.cpus_alloc += int(node.get("alloc_cpus") or 0)
            row.mem_total_mb += int(node.get("real_memory") or 0)
            row.mem_alloc_mb += int(node.get("alloc_memory") or 0)
            row.gpus_total += _gpu_count(gres)
            row.gpus_alloc += _gpu_count(used)
    return [rows[k] for k in sorted(rows)]


def nodes_from_sinfo(data: dict[str, Any]) -> list[NodeFree]:
    out = []
    for node in data.get("nodes") or []:
        gres, used = parse_gres(node.get("gres")), parse_gres(node.get("gres_used"))
        state = node_state(node)
        usable = state in ("idle", "mixed")
        out.append(NodeFree(
            str(node.get("name")), tuple(node.get("partitions") or ()), _gres_key(gres), state,
            int(node.get("cpus") or 0) - int(node.get("alloc_cpus") or 0) if usable else 0,
            _gpu_count(gres) - _gpu_count(used) if usable else 0,
            int(node.get("real_memory") or 0) - int(node.get("alloc_memory") or 0) if usable else 0))
    return out


def pending_from_squeue(data: dict[str, Any]) -> tuple[list[Pending], int]:
    """Pending demand per partition (a job listing several partitions counts in each), and running jobs."""
    pend: dict[str, Pending] = {}
    running = 0
    for job in data.get("jobs") or []:
        state = str(job.get("job_state", "")).upper()
        if state == "RUNNING":
            running += 1
        if state != "PENDING":
            continue
        tres = tres_dict(job.get("tres_req_str"))
        tres.pop("billing", None)
        for part in str(job.get("partition") or "-").split(","):
            p = pend.setdefault(part, Pending(part))
            p.jobs += 1
            for k, n in tres.items():
                p.tres[k] = p.tres.get(k, 0) + n
    return [pend[k] for k in sorted(pend)], running


def claimed_from_squeue(data: dict[str, Any]) -> tuple[str, ...]:
    """The nodes pending jobs require (``--nodelist``), each once, sorted."""
    out: set[str] = set()
    for job in data.get("jobs") or []:
        if str(job.get("job_state", "")).upper() == "PENDING" and job.get("required_nodes"):
            out.update(expand_hostlist(str(job["required_nodes"])))
    return tuple(sorted(out))


def running_from_squeue(data: dict[str, Any]) -> list[RunningUse]:
    """Each running job's allocated TRES (each het component is a job of its own here)."""
    out = []
    for job in data.get("jobs") or []:
        if str(job.get("job_state", "")).upper() != "RUNNING":
            continue
        tres = tres_dict(job.get("tres_alloc_str"))
        tres.pop("billing", None)
        out.append(RunningUse(str(job.get("account") or ""), str(job.get("user_name") or ""),
                              str(job.get("qos") or ""), tres, int(job.get("job_id") or 0),
                              tuple(expand_hostlist(str(job.get("nodes") or ""))),
                              float(job.get("start_time") or 0)))
    return out


# What the pool reads of each allocation in the window: -D lists every attempt of a requeued
# job (each allocated its own time), as sacct --json does.
POOL_SACCT_FORMAT = "JobID,State,Start,End,NodeList,Account,AllocTRES"


def usage_from_sacct(text: str, now: float, hours: float) -> tuple[dict[str, list[float]], dict[str, int]]:
    """Per account [cpu-seconds, gpu-seconds] allocated inside the window, and NODE_FAIL jobs per node,
    from ``sacct -X -D -P -n --format=POOL_SACCT_FORMAT`` under SACCT_TIME_ENV."""
    from .backends.sbatch import sacct_rows, sacct_state, sacct_time

    start_w = now - hours * 3600
    usage: dict[str, list[float]] = {}
    node_fail: dict[str, int] = {}
    for row in sacct_rows(text, POOL_SACCT_FORMAT):
        start, end = sacct_time(row["Start"]) or 0, sacct_time(row["End"]) or 0
        if sacct_state(row["State"]).upper() == "NODE_FAIL":
            for node in expand_hostlist(row["NodeList"]):
                node_fail[node] = node_fail.get(node, 0) + 1
        if not start:
            continue
        overlap = max(0.0, min(end or now, now) - max(start, start_w))
        if overlap <= 0:
            continue
        tres = tres_dict(row["AllocTRES"])
        u = usage.setdefault(row["Account"] or "-", [0.0, 0.0])
        u[0] += overlap * tres.get("cpu", 0)
        u[1] += overlap * tres.get("gres/gpu", 0)
    return usage, node_fail


def shares_from_sshare(text: str) -> dict[str, dict[str, str]]:
    """Account rows (User empty) of ``sshare -a -P``; the account column is indented by depth."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        return {}
    header = [h.strip() for h in lines[0].split("|")]
    out = {}
    for line in lines[1:]:
        row = dict(zip(header, (c.strip() for c in line.split("|")), strict=False))
        if row.get("Account") and not row.get("User"):
            out[row["Account"]] = row
    return out


def _float(text: str | None) -> float | None:
    try:
        return float(text) if text not in (None, "") else None
    except ValueError:
        return None


def accounts_from(shares: dict[str, dict[str, str]], usage: dict[str, list[float]]) -> list[AccountShare]:
    total_cpu = sum(u[0] for u in usage.values()) or 1.0
    total_gpu = sum(u[1] for u in usage.values()) or 1.0
    out = []
    for name in sorted(set(shares) | set(usage)):
        row = shares.get(name, {})
        cpu, gpu = usage.get(name, [0.0, 0.0])
        raw = row.get("RawShares", "")
        out.append(AccountShare(
            account=name, raw_shares=int(raw) if raw.isdigit() else None,
            norm_shares=_float(row.get("NormShares")), effective_usage=_float(row.get("EffectvUsage")),
            fairshare=_float(row.get("FairShare")), cpu_seconds=cpu, gpu_seconds=gpu,
            cpu_share=cpu / total_cpu, gpu_share=gpu / total_gpu))
    return out


def troubled_nodes(sinfo: dict[str, Any], node_fail: dict[str, int]) -> list[NodeTrouble]:
    out = []
    seen = set()
    for node in sinfo.get("nodes") or []:
        name = str(node.get("name"))
        state = node_state(node)
        reason = str(node.get("reason") or "")
        if state in ("drained", "down") or reason or node_fail.get(name):
            seen.add(name)
            out.append(NodeTrouble(name, state, reason, int(node.get("reason_changed_at") or 0) or None,
                                   node_fail.get(name, 0)))
    out += [NodeTrouble(n, "unknown", "", None, c) for n, c in sorted(node_fail.items()) if n not in seen]
    return out


# ------------------------------------------------------------------ collect


def _json(run: Runner, argv: list[str]) -> dict[str, Any]:
    import json

    text = run(argv)
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise SlurmError(f"`{' '.join(argv)}` did not print JSON ({exc}); Slurm 21.08+ with the "
                         "JSON output plugins is needed") from None
    errors = data.get("errors") or []
    if errors:
        raise SlurmError(f"`{' '.join(argv)}` reported: {errors[0]}")
    return data


def collect(run: Runner | None = None, *, hours: float = 6.0, now: float | None = None) -> PoolSnapshot:
    """One snapshot of the pool: four Slurm calls, each once."""
    return Collector(run, hours=hours, history_s=0.0).snapshot(now)


def _default_run() -> Runner:
    import os

    from hetrun.slurm_plugin.backends.sbatch import SACCT_TIME_ENV
    from hetrun.slurm_plugin.backends.slurm_cli import run_slurm

    env = {**os.environ, **SACCT_TIME_ENV}

    def run(argv: Sequence[str]) -> str:
        return run_slurm(argv, env=env).stdout

    return run


class Collector:
    """Snapshots for placements in a row (a submitter placing job after job). sinfo and squeue,
    what placement scores on (free nodes, pending and running jobs), are read fresh for every
    snapshot; sacct and sshare (failure history and account shares over ``hours``) are reused
    for ``history_s`` seconds: they come from slurmdbd through MariaDB, took ~90% of a snapshot
    (0.18 of 0.20 s idle, more on a loaded host) and change little within seconds of a
    6-hour window. ``history_s`` 0: every snapshot reads all four (``collect``)."""

    def __init__(self, run: Runner | None = None, *, hours: float = 6.0, history_s: float = 0.0) -> None:
        self.run = run or _default_run()
        self.hours, self.history_s = hours, history_s
        self._history: tuple[float, dict[str, dict[str, str]], dict[str, list[float]], dict[str, int]] | None = None

    def snapshot(self, now: float | None = None) -> PoolSnapshot:
        now = time.time() if now is None else now
        sinfo = _json(self.run, ["sinfo", "--json"])
        squeue = _json(self.run, ["squeue", "--json"])
        if self._history is None or not 0 <= now - self._history[0] < self.history_s:
            minutes = max(1, int(self.hours * 60))
            sacct = self.run(["sacct", "-a", "-X", "-D", "-P", "-n", "-S", f"now-{minutes}minutes", "-E", "now",
                              f"--format={POOL_SACCT_FORMAT}"])
            shares = shares_from_sshare(self.run(["sshare", "-a", "-P"]))
            self._history = (now, shares, *usage_from_sacct(sacct, now, self.hours))
        _, shares, usage, node_fail = self._history
        pending, running = pending_from_squeue(squeue)
        return PoolSnapshot(now, self.hours, rows_from_sinfo(sinfo), pending, accounts_from(shares, usage),
                            troubled_nodes(sinfo, node_fail), running, nodes_from_sinfo(sinfo),
                            running_from_squeue(squeue), claimed_from_squeue(squeue))
