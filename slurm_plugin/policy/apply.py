"""Carry a policy plan out (``hetrun policy apply``), and compute it against the live cluster.

``plan_live`` reads the live cluster and makes the plan; ``apply_plan`` runs
exactly the plan's commands (sacctmgr, scontrol update) in order and, only
when asked (``write_conf``), writes the slurm.conf settings and the
job_submit.lua next to slurm.conf, then ``scontrol reconfigure`` (or, when a
changed key needs it, names the keys that need slurmctld and slurmd restarted).

slurm.conf is rewritten in place, one ``Key=value`` line per setting (an
existing line for the key is replaced, others are added in a marked block
before the node lines), after a timestamped backup. A slurm.conf that
``hetrun cluster up`` did not write is refused unless ``foreign_conf`` is
set, and even then it is backed up first. Writing nothing new writes
nothing: a second apply changes nothing.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hetrun.slurm_plugin.backends.slurm_cli import run_slurm
from hetrun.slurm_plugin.policy.desired import desired_state
from hetrun.slurm_plugin.policy.isolation import detect_cgroup
from hetrun.slurm_plugin.policy.lua import render_job_submit_lua
from hetrun.slurm_plugin.policy.model import PolicySpec
from hetrun.slurm_plugin.policy.plan import PolicyPlan, conf_value, make_plan
from hetrun.slurm_plugin.policy.state import Runner, read_live

from hetrun.errors import HetrunError, SlurmError

HETRUN_CONF_HEADER = "# Written by `hetrun cluster up`"
BLOCK_START = "# --- hetrun policy (hetrun policy apply) ---"
# Changing these takes a restart of slurmctld and every slurmd, not a reconfigure.
RESTART_KEYS = {"PreemptType", "ProctrackType", "TaskPlugin", "SelectType", "GresTypes",
                "AccountingStorageTRES", "SlurmdParameters", "PriorityType"}


class PolicyApplyError(HetrunError):
    """apply cannot go on (a cluster mismatch or a slurm.conf it may not rewrite)."""

    exit_code = 3


@dataclass
class ApplyResult:
    commands: list[tuple[str, ...]] = field(default_factory=list)
    conf_path: Path | None = None
    backup: Path | None = None
    lua_path: Path | None = None
    reconfigured: bool = False
    restart_needed: list[str] = field(default_factory=list)
    skipped_conf: list[str] = field(default_factory=list)  # conf keys not written (no write_conf)


def slurm_runner(env: dict[str, str] | None = None) -> Runner:
    def run(argv: Sequence[str]) -> str:
        return run_slurm(argv, env=env).stdout
    return run


def conf_path_of(plan_config: dict[str, str]) -> Path | None:
    path = plan_config.get("SLURM_CONF")
    return Path(path) if path else None


def lua_path_for(conf: Path) -> Path:
    # slurmctld loads job_submit.lua from the directory of slurm.conf.
    return conf.parent / "job_submit.lua"


def plan_live(policy: PolicySpec, run: Runner | None = None) -> tuple[PolicyPlan, Path | None]:
    """The plan against the live cluster, and the slurm.conf the cluster runs from."""
    live = read_live(run or slurm_runner())
    conf = conf_path_of(live.config)
    live_lua = None
    if conf is not None:
        try:
            live_lua = lua_path_for(conf).read_text()
        except OSError:
            live_lua = None
    # The nodes' cgroup support as this host sees it (the local cluster's nodes are this host).
    plan = make_plan(desired_state(policy, detect_cgroup()), live, render_job_submit_lua(policy), live_lua)
    return plan, conf


def rewrite_conf(text: str, values: dict[str, str], partitions: dict[str, dict[str, str]]) -> str:
    """slurm.conf text with every key set to ``values`` and partition settings merged in."""
    lines = text.splitlines()
    todo = dict(values)
    for i, line in enumerate(lines):
        key = line.split("=", 1)[0].strip()
        match = next((k for k in todo if k.lower() == key.lower()), None)
        if match and not line.lstrip().startswith("#"):
            lines[i] = f"{match}={todo.pop(match)}"
            continue
        part = re.match(r"^\s*PartitionName=(\S+)", line)
        if part and part.group(1) in partitions:
            for k, val in partitions[part.group(1)].items():
                pattern = re.compile(rf"\b{k}=\S+", re.IGNORECASE)
                lines[i] = pattern.sub(f"{k}={val}", lines[i]) if pattern.search(lines[i]) \
                    else f"{lines[i]} {k}={val}"
    if todo:
        at = next((i for i, ln in enumerate(lines) if re.match(r"^\s*(NodeName|PartitionName)=", ln)),
                  len(lines))
        block = [] if BLOCK_START in lines else [BLOCK_START]
        if not block:
            at = lines.index(BLOCK_START) + 1
        lines[at:at] = block + [f"{k}={val}" for k, val in todo.items()]
    return "\n".join(lines) + "\n"


def conf_with_policy(text: str, policy: PolicySpec, where: str = "slurm.conf") -> tuple[str, str | None]:
    """A slurm.conf (``hetrun cluster up``'s rendering) with the policy's settings
    already in it, and the job_submit.lua to write next to it (None when the
    policy needs none). Off-line: what ``apply --write-conf`` would write, so a
    cluster can start with its policy instead of being restarted into it."""
    have: dict[str, str] = {}
    partitions = set()
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if not sep or line.lstrip().startswith("#"):
            continue
        if key.strip() == "PartitionName":
            partitions.add(value.split()[0])
        have[key.strip().lower()] = value.strip()
    desired = desired_state(policy)
    missing = sorted(set(desired.partitions) - partitions)
    if missing:
        raise PolicyApplyError(
            f"{where}: the policy's time_slicing.partition {', '.join(map(repr, missing))} is not a "
            f"partition of this cluster (partitions: {', '.join(sorted(partitions)) or 'none'})",
            hint="name one of those partitions in time_slicing.partition")
    values = {s.key: conf_value(s, have.get(s.key.lower())) for s in desired.conf}
    lua = render_job_submit_lua(policy) if "JobSubmitPlugins" in values else None
    return rewrite_conf(text, values, desired.partitions), lua


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def write_conf(plan: PolicyPlan, conf: Path, *, foreign_conf: bool = False) -> tuple[Path | None, Path | None]:
    """Write slurm.conf (backup first) and job_submit.lua when they differ.
    Returns (backup of slurm.conf or None, lua path or None), None = unchanged."""
    try:
        text = conf.read_text()
    except OSError as exc:
        raise PolicyApplyError(f"cannot read {conf}: {exc.strerror or exc}") from None
    if not text.startswith(HETRUN_CONF_HEADER) and not foreign_conf:
        raise PolicyApplyError(
            f"{conf} was not written by `hetrun cluster up`; apply does not rewrite it on its own",
            hint="add the settings of `hetrun policy plan` yourself, or pass --foreign-conf "
                 "(a backup is kept next to it)")
    new = rewrite_conf(text, plan.conf_values, plan.partitions)
    backup = None
    if new != text:
        backup = conf.with_name(f"{conf.name}.hetrun-bak-{time.strftime('%Y%m%d-%H%M%S')}")
        backup.write_text(text)
        _write_atomic(conf, new)
    lua_file = lua_path_for(conf)
    lua_written = None
    if "JobSubmitPlugins" in plan.conf_values:
        old_lua = lua_file.read_text() if lua_file.exists() else None
        if old_lua != plan.lua:
            _write_atomic(lua_file, plan.lua)
            lua_written = lua_file
    return backup, lua_written


def apply_plan(plan: PolicyPlan, conf: Path | None, run: Runner | None = None, *,
               write_conf_file: bool = False, foreign_conf: bool = False,
               reconfigure: bool = True) -> ApplyResult:
    """Run the plan's commands; with ``write_conf_file`` also its slurm.conf part."""
    if plan.problems:
        raise PolicyApplyError("the policy does not fit this cluster: " + "; ".join(plan.problems),
                               hint="fix the policy (or the cluster) and run `hetrun policy plan` again")
    run = run or slurm_runner()
    result = ApplyResult()
    for change in plan.changes:
        for cmd in change.commands:
            run(cmd)
            result.commands.append(cmd)
    conf_keys = [c.target for c in plan.by_kind("slurm.conf", "job_submit.lua")]
    if not conf_keys:
        return result
    if not write_conf_file:
        result.skipped_conf = conf_keys
        return result
    if conf is None:
        raise SlurmError("scontrol show config names no SLURM_CONF; cannot find slurm.conf")
    result.conf_path = conf
    result.backup, result.lua_path = write_conf(plan, conf, foreign_conf=foreign_conf)
    result.restart_needed = sorted(k for k in conf_keys if k in RESTART_KEYS)
    # A reconfigure cannot switch these; the admin restarts the daemons instead.
    if reconfigure and (result.backup or result.lua_path) and not result.restart_needed:
        try:
            run(["scontrol", "reconfigure"])
        except (SlurmError, subprocess.SubprocessError) as exc:
            raise SlurmError(f"slurm.conf written ({conf}, backup {result.backup}) but "
                             f"`scontrol reconfigure` failed: {exc}") from exc
        result.reconfigured = True
    return result
