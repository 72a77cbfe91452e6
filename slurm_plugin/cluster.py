"""A real multi-node Slurm cluster on this one host, for tests, demos and laptops.

``up()`` brings up munge, MariaDB + slurmdbd (accounting, so ``sacct`` works),
slurmctld and N slurmd ("nodes" n1..nN, each with its own port, spool, log and
emulated GPUs), writing every config into its own directory
(``/var/lib/hetrun-cluster`` by default) and linking ``/etc/slurm/slurm.conf``
to it so plain ``sbatch``/``squeue``/``sacct`` talk to this cluster.
``status()`` reports nodes and daemons; ``down()`` stops what ``up()`` started.

Note for everyone writing jobs or tests against this cluster: **each slurmd
runs in its own mount namespace with a private /tmp** (that is what lets
``srun --mpi=pmix`` run ranks of one job on several emulated nodes of the same
host). Anything a job reads or writes must therefore live outside /tmp — use
e.g. /var/tmp or the run directory (the pytest fixture ``shared_tmp`` in
tests/conftest.py gives a fresh directory under /var/tmp/hetrun-tests/).

Every task on this cluster gets the loopback Open MPI settings
(``OMPI_ALLOW_RUN_AS_ROOT``, ``OMPI_MCA_btl=self,tcp``, ``..._if_include=lo``...)
from the cluster's TaskProlog, so job scripts need not repeat them; srun uses
``--mpi=pmix`` by default (``MpiDefault=pmix``).

Partitions: ``debug`` (default, PriorityTier=1) and ``high`` (PriorityTier=10);
a job in ``high`` preempts ``--requeue`` jobs in ``debug`` (PreemptMode=REQUEUE).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from hetrun.slurm_plugin.cluster_conf import CLUSTER_NAME, DEFAULT_DIR, ClusterConfig
from hetrun.slurm_plugin.cluster_daemons import (
    MARIADBD,
    MUNGED,
    daemon_env,
    mariadb_pid,
    munge_pid,
    pidfile_daemon,
    running_slurmd_nodes,
    slurm_daemon_pid,
    start_mariadb,
    start_munge,
    start_slurmctld,
    start_slurmd,
    start_slurmdbd,
    stop_slurm_daemon,
)
from hetrun.slurm_plugin.cluster_procs import read_pid, stop_pid, wait_for
from hetrun.slurm_plugin.cluster_setup import (
    REQUIRED_PACKAGES,
    ensure_packages,
    link_slurm_conf,
    missing_packages,
    record_started,
    started_daemons,
    write_configs,
)

from hetrun.errors import SlurmError

__all__ = [
    "CLUSTER_NAME",
    "REQUIRED_PACKAGES",
    "USABLE_STATES",
    "ClusterConfig",
    "ClusterStatus",
    "DaemonStatus",
    "NodeStatus",
    "apply_policy_objects",
    "down",
    "ensure_packages",
    "link_slurm_conf",
    "load_config",
    "slurm_env",
    "status",
    "up",
    "write_configs",
]

# Node states in which a node can take work (sinfo %T, with flags like "*" stripped).
USABLE_STATES = {"idle", "mixed", "allocated", "completing", "planned", "reserved"}


@dataclass(frozen=True)
class DaemonStatus:
    name: str
    pid: int | None
    alive: bool
    ours: bool  # started by `hetrun cluster up` (and so stopped by `down`)


@dataclass(frozen=True)
class NodeStatus:
    name: str
    state: str
    cpus: int
    memory_mb: int
    gres: str
    partitions: tuple[str, ...]


@dataclass(frozen=True)
class ClusterStatus:
    config: ClusterConfig | None
    daemons: list[DaemonStatus] = field(default_factory=list)
    nodes: list[NodeStatus] = field(default_factory=list)
    slurm_conf_linked: bool = False
    error: str | None = None  # why nodes could not be listed, if they could not

    @property
    def healthy(self) -> bool:
        return (
            self.config is not None
            and self.slurm_conf_linked
            and all(d.alive for d in self.daemons)
            and len(self.nodes) == self.config.nodes
            and all(n.state in USABLE_STATES for n in self.nodes)
        )


# ---------------------------------------------------------------- environment


def slurm_env(cfg: ClusterConfig | None = None) -> dict[str, str]:
    """The caller's environment with ``SLURM_CONF`` pointing at the local cluster's slurm.conf."""
    cfg = cfg or load_config()
    env = dict(os.environ)
    env["SLURM_CONF"] = str(cfg.slurm_conf)
    return env


def load_config(directory: Path = DEFAULT_DIR) -> ClusterConfig:
    """The config of the last ``up()`` in ``directory``, or the defaults if there was none."""
    saved = directory / "cluster.json"
    if saved.exists():
        try:
            return ClusterConfig.from_json(saved.read_text())
        except (ValueError, KeyError, TypeError) as exc:
            raise SlurmError(
                f"local cluster: {saved} is unreadable ({exc})",
                hint=f"delete {saved}; the next `hetrun cluster up` rewrites it",
            ) from exc
    return ClusterConfig(directory=directory)


@contextlib.contextmanager
def _locked(cfg: ClusterConfig) -> Iterator[None]:
    # Several test sessions call up() at once; only one may start daemons.
    cfg.directory.mkdir(parents=True, exist_ok=True)
    with open(cfg.directory / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


# --------------------------------------------------------------------- nodes


def _list_nodes(cfg: ClusterConfig) -> list[NodeStatus]:
    proc = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%N|%T|%c|%m|%G|%P"], env=daemon_env(cfg),
        capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL, timeout=30,
    )
    if proc.returncode != 0:
        raise SlurmError(f"local cluster: sinfo failed: {proc.stderr.strip()}")
    merged: dict[str, NodeStatus] = {}
    for line in proc.stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 6:
            continue
        name, state, cpus, mem, gres, part = parts
        state = state.rstrip("*~#!%$@^-+")
        prev = merged.get(name)
        partitions = tuple(sorted({*(prev.partitions if prev else ()), part.rstrip("*")}))
        merged[name] = NodeStatus(name, state, int(cpus), int(mem), gres, partitions)
    return [merged[k] for k in sorted(merged, key=lambda n: (len(n), n))]


def _wait_nodes_usable(cfg: ClusterConfig, timeout: float = 60) -> None:
    resumed: set[str] = set()

    def ready() -> bool:
        nodes = _list_nodes(cfg)
        stuck = [n.name for n in nodes if n.state.startswith(("drain", "down", "inval", "fail"))
                 and n.name not in resumed]
        if stuck:
            # Left over from a restart ("Not responding", "Kill task failed"):
            # the daemons are fresh, so the nodes are fine.
            subprocess.run(
                ["scontrol", "update", f"nodename={','.join(stuck)}", "state=resume"],
                env=daemon_env(cfg), capture_output=True, check=False, stdin=subprocess.DEVNULL,
            )
            resumed.update(stuck)
        names = {n.name for n in nodes if n.state in USABLE_STATES}
        return names >= set(cfg.node_names)

    wait_for(ready, timeout, f"nodes {','.join(cfg.node_names)} (sinfo)",
             cfg.directory / "log" / "slurmctld.log")


# ----------------------------------------------------------------------- API


def up(cfg: ClusterConfig | None = None, *, install: bool = True) -> ClusterStatus:
    """Bring the local cluster up (idempotent) and return its status once all nodes are usable.

    ``cfg=None`` keeps the shape of the last ``up()`` (4 nodes x 2 CPUs x 2 GPUs
    x 4000 MB the first time). Only daemons that are down are started; a change
    of slurm.conf/gres.conf/mpi.conf restarts slurmctld and every slurmd together.
    Raises SlurmError (with the log tail) when a daemon does not come up.
    """
    cfg = cfg or load_config()
    if os.geteuid() != 0:
        raise SlurmError(
            "local cluster: `hetrun cluster up` must run as root (it starts munge, MariaDB and Slurm daemons)",
            hint="run it as root, e.g. in the CI container",
        )
    if install:
        ensure_packages()
    elif shutil.which("dpkg-query") and (missing := missing_packages()):
        raise SlurmError(
            f"local cluster: packages missing: {' '.join(missing)}",
            hint="run scripts/setup.sh, or `hetrun cluster up` without --no-install",
        )
    with _locked(cfg):
        link_slurm_conf(cfg)
        changed = write_configs(cfg)
        start_munge(cfg)
        start_mariadb(cfg)
        start_slurmdbd(cfg, restart=changed["slurmdbd.conf"])
        running_nodes = running_slurmd_nodes(cfg)
        ctld_running = slurm_daemon_pid(cfg, "slurmctld") is not None
        if (changed["slurm.conf"] or changed["gres.conf"] or changed["mpi.conf"]) and (ctld_running or running_nodes):
            # A controller and nodes with different configs leave nodes INVAL:
            # restart them all together.
            for node in running_nodes:
                stop_slurm_daemon(cfg, f"slurmd-{node}")
            stop_slurm_daemon(cfg, "slurmctld")
        else:
            for node in set(running_nodes) - set(cfg.node_names):
                stop_slurm_daemon(cfg, f"slurmd-{node}")
        start_slurmctld(cfg)
        for node in cfg.node_names:
            start_slurmd(cfg, node)
        _wait_nodes_usable(cfg)
        if cfg.policy is not None:
            apply_policy_objects(cfg)
    return status(cfg)


def apply_policy_objects(cfg: ClusterConfig) -> list[tuple[str, ...]]:
    """The sacctmgr half of ``cfg.policy`` (QOS, accounts, associations) on the
    running cluster; its slurm.conf half and job_submit.lua were rendered in by
    ``write_configs``. Idempotent: returns the commands it ran (none the second time)."""
    from hetrun.slurm_plugin.policy.apply import apply_plan, plan_live, slurm_runner
    from hetrun.slurm_plugin.policy.model import load_policy

    assert cfg.policy is not None
    run = slurm_runner(daemon_env(cfg))
    plan, conf = plan_live(load_policy(cfg.policy), run)
    result = apply_plan(plan, conf, run, write_conf_file=False, reconfigure=False)
    if result.skipped_conf:
        # The rendered slurm.conf should already hold every setting: a key the
        # running slurmctld shows otherwise is a rendering bug, not something to hide.
        raise SlurmError(
            f"local cluster: slurmctld does not show the policy's settings {', '.join(result.skipped_conf)} "
            f"from {cfg.slurm_conf}",
            hint=f"compare `hetrun policy plan {cfg.policy}` with {cfg.slurm_conf}")
    return result.commands


def status(cfg: ClusterConfig | None = None) -> ClusterStatus:
    """Daemons (pid, alive, started by us) and nodes (sinfo) of the local cluster."""
    cfg = cfg or load_config()
    if not (cfg.directory / "cluster.json").exists():
        return ClusterStatus(config=None, error=f"no local cluster configured in {cfg.directory}")
    started = started_daemons(cfg)
    daemons = []
    mpid = munge_pid()
    daemons.append(DaemonStatus("munged", mpid, mpid is not None,
                                started.get("munged") == mpid and mpid is not None))
    db_pid = mariadb_pid()
    daemons.append(DaemonStatus("mariadb", db_pid, db_pid is not None,
                                started.get("mariadb") == db_pid and db_pid is not None))
    for name in ("slurmdbd", "slurmctld", *(f"slurmd-{n}" for n in cfg.node_names)):
        pid_file, _, _ = pidfile_daemon(cfg, name)
        pid = slurm_daemon_pid(cfg, name)
        daemons.append(DaemonStatus(name, pid if pid else read_pid(pid_file), pid is not None, True))
    link = cfg.slurm_etc / "slurm.conf"
    linked = link.is_symlink() and Path(os.readlink(link)) == cfg.slurm_conf
    nodes: list[NodeStatus] = []
    error = None
    if slurm_daemon_pid(cfg, "slurmctld") is not None:
        try:
            nodes = _list_nodes(cfg)
        except (SlurmError, subprocess.TimeoutExpired) as exc:
            error = str(exc)
    else:
        error = "slurmctld is not running"
    return ClusterStatus(cfg, daemons, nodes, linked, error)


def down(cfg: ClusterConfig | None = None) -> list[str]:
    """Stop the daemons ``up()`` started (never a munged/MariaDB someone else started).

    Returns the names of the daemons it stopped. Configs, accounting data and
    the /etc/slurm/slurm.conf link stay, so the next ``up()`` is quick.
    """
    cfg = cfg or load_config()
    if not cfg.directory.exists():
        return []
    stopped = []
    with _locked(cfg):
        started = started_daemons(cfg)
        for node in running_slurmd_nodes(cfg):
            if stop_slurm_daemon(cfg, f"slurmd-{node}"):
                stopped.append(f"slurmd-{node}")
        for name in ("slurmctld", "slurmdbd"):
            if stop_slurm_daemon(cfg, name):
                stopped.append(name)
        db_pid = started.get("mariadb")
        if db_pid and stop_pid(db_pid, MARIADBD, timeout=60):
            stopped.append("mariadb")
        record_started(cfg, "mariadb", None)
        mpid = started.get("munged")
        if mpid and stop_pid(mpid, MUNGED):
            stopped.append("munged")
        record_started(cfg, "munged", None)
    return stopped
