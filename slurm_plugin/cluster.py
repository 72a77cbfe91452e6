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
import json
import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from hetrun.dag.errors import SlurmError
from hetrun.slurm_plugin.cluster_conf import (
    CLUSTER_NAME,
    DEFAULT_DIR,
    ClusterConfig,
    fake_gpu_files,
    render_gres_conf,
    render_slurm_conf,
    render_slurmdbd_conf,
    render_task_prolog,
)
from hetrun.slurm_plugin.cluster_procs import (
    find_pids,
    process_matches,
    read_pid,
    run_checked,
    spawn_detached,
    stop_pid,
    wait_for,
)

__all__ = [
    "REQUIRED_PACKAGES",
    "ClusterConfig",
    "ClusterStatus",
    "DaemonStatus",
    "NodeStatus",
    "down",
    "ensure_packages",
    "load_config",
    "slurm_env",
    "status",
    "up",
]

REQUIRED_PACKAGES = (
    "slurm-wlm",
    "munge",
    "libslurm-dev",
    "openmpi-bin",
    "libopenmpi-dev",
    "slurmdbd",
    "mariadb-server",
)

MUNGED = "/usr/sbin/munged"
MARIADBD = "/usr/sbin/mariadbd"
SLURMDBD = "/usr/sbin/slurmdbd"
SLURMCTLD = "/usr/sbin/slurmctld"
SLURMD = "/usr/sbin/slurmd"
MUNGE_PID = Path("/run/munge/munged.pid")
MUNGE_SOCKET = Path("/run/munge/munge.socket.2")
MYSQL_SOCKET = Path("/run/mysqld/mysqld.sock")
MYSQL_DATADIR = Path("/var/lib/mysql")

# Node states in which a node can take work (sinfo %T, with flags like "*" stripped).
USABLE_STATES = {"idle", "mixed", "allocated", "completing"}


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


def _daemon_env(cfg: ClusterConfig) -> dict[str, str]:
    # Daemons get a clean environment: whatever the caller (a pytest run, a
    # shell with a job's variables) has set must not leak into slurmd.
    return {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "LANG": "C.UTF-8",
        "SLURM_CONF": str(cfg.slurm_conf),
    }


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


# ------------------------------------------------------------------ packages


def missing_packages(packages: tuple[str, ...] = REQUIRED_PACKAGES) -> list[str]:
    missing = []
    for pkg in packages:
        proc = subprocess.run(
            ["dpkg-query", "-W", "-f=${Status}", pkg], capture_output=True, text=True, check=False
        )
        if "install ok installed" not in proc.stdout:
            missing.append(pkg)
    return missing


def ensure_packages(packages: tuple[str, ...] = REQUIRED_PACKAGES) -> list[str]:
    """Install the Debian packages the cluster needs when missing; returns what was installed."""
    if shutil.which("dpkg-query") is None:
        if all(shutil.which(b) for b in ("slurmctld", "slurmd", "munged")):
            return []
        raise SlurmError(
            "local cluster: needs Debian/Ubuntu (dpkg/apt) to install Slurm, or the packages "
            + ", ".join(packages) + " installed by hand"
        )
    missing = missing_packages(packages)
    if not missing:
        return []
    if os.geteuid() != 0:
        raise SlurmError(
            f"local cluster: packages missing: {' '.join(missing)}",
            hint=f"as root: apt-get update && apt-get install -y {' '.join(missing)}",
        )
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    run_checked(["apt-get", "update", "-q"], env=env, timeout=600, what="apt-get update")
    run_checked(
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing],
        env=env, timeout=1200, what="installing Slurm packages",
    )
    return missing


# -------------------------------------------------------------- config files


def _write_if_changed(path: Path, text: str, mode: int = 0o644) -> bool:
    old = path.read_text() if path.exists() else None
    if old == text:
        if path.stat().st_mode & 0o777 != mode:
            path.chmod(mode)
        return False
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.chmod(tmp, mode)
    os.replace(tmp, path)
    return True


def link_slurm_conf(cfg: ClusterConfig) -> None:
    """Make ``<slurm_etc>/slurm.conf`` a symlink to ours; refuse to replace anyone else's."""
    link = cfg.slurm_etc / "slurm.conf"
    if link.is_symlink():
        target = Path(os.readlink(link))
        if target == cfg.slurm_conf:
            return
        if not str(target).startswith(str(cfg.directory) + "/"):
            raise SlurmError(
                f"local cluster: {link} is a link to {target}, not to hetrun's {cfg.slurm_conf}; "
                "refusing to replace another Slurm configuration",
                hint=f"if that cluster is not needed, `rm {link}` and run `hetrun cluster up` again",
            )
        link.unlink()
    elif link.exists():
        raise SlurmError(
            f"local cluster: {link} already exists and is not hetrun's; "
            "refusing to replace another Slurm configuration",
            hint=f"move it away (`mv {link} {link}.orig`) and run `hetrun cluster up` again",
        )
    cfg.slurm_etc.mkdir(parents=True, exist_ok=True)
    link.symlink_to(cfg.slurm_conf)


def _db_password(cfg: ClusterConfig) -> str:
    path = cfg.directory / "db_password"
    if path.exists():
        return path.read_text().strip()
    password = secrets.token_hex(16)
    _write_if_changed(path, password + "\n", 0o600)
    return password


def write_configs(cfg: ClusterConfig) -> dict[str, bool]:
    """Write every config file; returns which ones changed (by short name)."""
    d = cfg.directory
    for sub in ("etc", "state", "run", "log", "fakegpu", *(f"spool/{n}" for n in cfg.node_names)):
        (d / sub).mkdir(parents=True, exist_ok=True)
    for gpu in fake_gpu_files(cfg):
        gpu.touch(exist_ok=True)
    changed = {
        "slurm.conf": _write_if_changed(cfg.etc / "slurm.conf", render_slurm_conf(cfg)),
        "gres.conf": _write_if_changed(cfg.etc / "gres.conf", render_gres_conf(cfg)),
        # slurmdbd refuses a config readable by others (it holds the DB password).
        "slurmdbd.conf": _write_if_changed(
            cfg.etc / "slurmdbd.conf", render_slurmdbd_conf(cfg, _db_password(cfg)), 0o600
        ),
        "task_prolog.sh": _write_if_changed(cfg.etc / "task_prolog.sh", render_task_prolog(), 0o755),
    }
    _write_if_changed(d / "cluster.json", cfg.to_json() + "\n")
    return changed


# --------------------------------------------------------------- started.json


def _started(cfg: ClusterConfig) -> dict[str, int]:
    path = cfg.directory / "started.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): int(v) for k, v in data.items()} if isinstance(data, dict) else {}


def _record_started(cfg: ClusterConfig, name: str, pid: int | None) -> None:
    data = _started(cfg)
    if pid is None:
        data.pop(name, None)
    else:
        data[name] = pid
    _write_if_changed(cfg.directory / "started.json", json.dumps(data, indent=1, sort_keys=True) + "\n")


# ------------------------------------------------------------------- daemons


def _munge_pid() -> int | None:
    pid = read_pid(MUNGE_PID)
    if process_matches(pid, MUNGED):
        return pid
    pids = find_pids(MUNGED)
    return pids[0] if pids else None


def _start_munge(cfg: ClusterConfig) -> None:
    if _munge_pid():
        return
    run_dir = MUNGE_PID.parent
    run_dir.mkdir(parents=True, exist_ok=True)
    shutil.chown(run_dir, "munge", "munge")
    if not Path("/etc/munge/munge.key").exists():
        run_checked(["runuser", "-u", "munge", "--", "mungekey", "--create"], what="creating the munge key")
    run_checked(["runuser", "-u", "munge", "--", MUNGED, "--force"], what="starting munged")
    wait_for(lambda: _munge_pid() is not None and MUNGE_SOCKET.exists(), 15, "munged",
             Path("/var/log/munge/munged.log"))
    _record_started(cfg, "munged", _munge_pid())


def _mariadb_pid() -> int | None:
    pids = find_pids(MARIADBD)
    return pids[0] if pids else None


def _mysql_ping() -> bool:
    proc = subprocess.run(
        ["mysqladmin", "--protocol=socket", f"--socket={MYSQL_SOCKET}", "ping"],
        capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL,
    )
    return proc.returncode == 0


def _start_mariadb(cfg: ClusterConfig) -> None:
    if _mariadb_pid() and _mysql_ping():
        return
    if not _mariadb_pid():
        run_dir = MYSQL_SOCKET.parent
        run_dir.mkdir(parents=True, exist_ok=True)
        shutil.chown(run_dir, "mysql", "mysql")
        if not (MYSQL_DATADIR / "mysql").is_dir():
            run_checked(
                ["mariadb-install-db", "--user=mysql", f"--datadir={MYSQL_DATADIR}"],
                timeout=300, what="initialising the MariaDB data directory",
            )
        pid = spawn_detached(
            [MARIADBD, "--user=mysql", f"--socket={MYSQL_SOCKET}",
             f"--log-error={cfg.directory}/log/mariadb.log"],
            env=_daemon_env(cfg), log=cfg.directory / "log" / "mariadb.out",
        )
        _record_started(cfg, "mariadb", pid)
    wait_for(_mysql_ping, 60, "MariaDB", cfg.directory / "log" / "mariadb.log")


def _ensure_database(cfg: ClusterConfig) -> None:
    password = _db_password(cfg)  # hex only, safe inside SQL quotes
    sql = (
        "CREATE DATABASE IF NOT EXISTS slurm_acct_db; "
        f"CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '{password}'; "
        f"ALTER USER 'slurm'@'localhost' IDENTIFIED BY '{password}'; "
        "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; FLUSH PRIVILEGES;"
    )
    run_checked(["mysql", f"--socket={MYSQL_SOCKET}", "-e", sql], what="creating the accounting database")


def _pidfile_daemon(cfg: ClusterConfig, name: str) -> tuple[Path, str, str | None]:
    """(pid file, executable, argv marker) of one of our Slurm daemons."""
    run = cfg.directory / "run"
    if name == "slurmdbd":
        return run / "slurmdbd.pid", SLURMDBD, None
    if name == "slurmctld":
        return run / "slurmctld.pid", SLURMCTLD, None
    node = name.removeprefix("slurmd-")
    return run / f"slurmd-{node}.pid", SLURMD, node


def _slurm_daemon_pid(cfg: ClusterConfig, name: str) -> int | None:
    pid_file, exe, marker = _pidfile_daemon(cfg, name)
    pid = read_pid(pid_file)
    return pid if process_matches(pid, exe, marker) else None


def _start_slurmdbd(cfg: ClusterConfig, restart: bool) -> None:
    if restart:
        _stop_slurm_daemon(cfg, "slurmdbd")
    if _slurm_daemon_pid(cfg, "slurmdbd") is None:
        _ensure_database(cfg)
        run_checked([SLURMDBD], env=_daemon_env(cfg), what="starting slurmdbd")
        wait_for(lambda: _slurm_daemon_pid(cfg, "slurmdbd") is not None, 20, "slurmdbd",
                 cfg.directory / "log" / "slurmdbd.log")
        _record_started(cfg, "slurmdbd", _slurm_daemon_pid(cfg, "slurmdbd"))
    _ensure_cluster_registered(cfg)


def _ensure_cluster_registered(cfg: ClusterConfig) -> None:
    # slurmdbd listens a moment after its pid file appears: retry sacctmgr briefly.
    registered = cfg.directory / "state" / ".registered-in-slurmdbd"
    if registered.exists():
        return
    deadline = time.monotonic() + 30
    last = ""
    while time.monotonic() < deadline:
        proc = subprocess.run(
            ["sacctmgr", "-n", "-P", "list", "cluster", "format=cluster"],
            env=_daemon_env(cfg), capture_output=True, text=True, check=False,
            stdin=subprocess.DEVNULL,
        )
        if proc.returncode == 0:
            if CLUSTER_NAME not in proc.stdout.split():
                run_checked(["sacctmgr", "-i", "add", "cluster", CLUSTER_NAME],
                            env=_daemon_env(cfg), what="registering the cluster with slurmdbd")
            registered.touch()
            return
        last = (proc.stderr or proc.stdout).strip()
        time.sleep(0.5)
    raise SlurmError(
        f"local cluster: slurmdbd does not answer sacctmgr: {last}",
        hint=f"read {cfg.directory}/log/slurmdbd.log",
    )


def _scontrol_ping(cfg: ClusterConfig) -> bool:
    proc = subprocess.run(
        ["scontrol", "ping"], env=_daemon_env(cfg), capture_output=True, text=True,
        check=False, stdin=subprocess.DEVNULL,
    )
    return proc.returncode == 0 and "UP" in proc.stdout


def _start_slurmctld(cfg: ClusterConfig) -> None:
    if _slurm_daemon_pid(cfg, "slurmctld") is not None:
        return
    run_checked([SLURMCTLD], env=_daemon_env(cfg), what="starting slurmctld")
    log = cfg.directory / "log" / "slurmctld.log"
    wait_for(lambda: _slurm_daemon_pid(cfg, "slurmctld") is not None, 20, "slurmctld", log)
    wait_for(lambda: _scontrol_ping(cfg), 30, "slurmctld (scontrol ping)", log)
    _record_started(cfg, "slurmctld", _slurm_daemon_pid(cfg, "slurmctld"))


def _start_slurmd(cfg: ClusterConfig, node: str) -> None:
    name = f"slurmd-{node}"
    if _slurm_daemon_pid(cfg, name) is not None:
        return
    # Own mount namespace with a private /tmp per node: pmix creates per-job
    # directories under /tmp whose names collide between nodes of one host.
    script = f"mount -t tmpfs -o mode=1777 tmpfs /tmp && exec {SLURMD} -N {node}"
    run_checked(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                env=_daemon_env(cfg), what=f"starting slurmd for node {node}")
    wait_for(lambda: _slurm_daemon_pid(cfg, name) is not None, 20, f"slurmd {node}",
             cfg.directory / "log" / f"slurmd-{node}.log")
    _record_started(cfg, name, _slurm_daemon_pid(cfg, name))


def _stop_slurm_daemon(cfg: ClusterConfig, name: str) -> bool:
    pid_file, exe, marker = _pidfile_daemon(cfg, name)
    pid = read_pid(pid_file)
    stopped = pid is not None and stop_pid(pid, exe, marker)
    _record_started(cfg, name, None)
    return stopped


def _running_slurmd_nodes(cfg: ClusterConfig) -> list[str]:
    run = cfg.directory / "run"
    nodes = [p.name.removeprefix("slurmd-").removesuffix(".pid") for p in run.glob("slurmd-*.pid")]
    return sorted(n for n in nodes if _slurm_daemon_pid(cfg, f"slurmd-{n}") is not None)


# --------------------------------------------------------------------- nodes


def _list_nodes(cfg: ClusterConfig) -> list[NodeStatus]:
    proc = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%N|%T|%c|%m|%G|%P"], env=_daemon_env(cfg),
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
                env=_daemon_env(cfg), capture_output=True, check=False, stdin=subprocess.DEVNULL,
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
    of slurm.conf/gres.conf restarts slurmctld and every slurmd together.
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
        _start_munge(cfg)
        _start_mariadb(cfg)
        _start_slurmdbd(cfg, restart=changed["slurmdbd.conf"])
        running_nodes = _running_slurmd_nodes(cfg)
        ctld_running = _slurm_daemon_pid(cfg, "slurmctld") is not None
        if (changed["slurm.conf"] or changed["gres.conf"]) and (ctld_running or running_nodes):
            # A controller and nodes with different configs leave nodes INVAL:
            # restart them all together.
            for node in running_nodes:
                _stop_slurm_daemon(cfg, f"slurmd-{node}")
            _stop_slurm_daemon(cfg, "slurmctld")
        else:
            for node in set(running_nodes) - set(cfg.node_names):
                _stop_slurm_daemon(cfg, f"slurmd-{node}")
        _start_slurmctld(cfg)
        for node in cfg.node_names:
            _start_slurmd(cfg, node)
        _wait_nodes_usable(cfg)
    return status(cfg)


def status(cfg: ClusterConfig | None = None) -> ClusterStatus:
    """Daemons (pid, alive, started by us) and nodes (sinfo) of the local cluster."""
    cfg = cfg or load_config()
    if not (cfg.directory / "cluster.json").exists():
        return ClusterStatus(config=None, error=f"no local cluster configured in {cfg.directory}")
    started = _started(cfg)
    daemons = []
    munge_pid = _munge_pid()
    daemons.append(DaemonStatus("munged", munge_pid, munge_pid is not None,
                                started.get("munged") == munge_pid and munge_pid is not None))
    db_pid = _mariadb_pid()
    daemons.append(DaemonStatus("mariadb", db_pid, db_pid is not None,
                                started.get("mariadb") == db_pid and db_pid is not None))
    for name in ("slurmdbd", "slurmctld", *(f"slurmd-{n}" for n in cfg.node_names)):
        pid_file, _, _ = _pidfile_daemon(cfg, name)
        pid = _slurm_daemon_pid(cfg, name)
        daemons.append(DaemonStatus(name, pid if pid else read_pid(pid_file), pid is not None, True))
    link = cfg.slurm_etc / "slurm.conf"
    linked = link.is_symlink() and Path(os.readlink(link)) == cfg.slurm_conf
    nodes: list[NodeStatus] = []
    error = None
    if _slurm_daemon_pid(cfg, "slurmctld") is not None:
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
        started = _started(cfg)
        for node in _running_slurmd_nodes(cfg):
            if _stop_slurm_daemon(cfg, f"slurmd-{node}"):
                stopped.append(f"slurmd-{node}")
        for name in ("slurmctld", "slurmdbd"):
            if _stop_slurm_daemon(cfg, name):
                stopped.append(name)
        db_pid = started.get("mariadb")
        if db_pid and stop_pid(db_pid, MARIADBD, timeout=60):
            stopped.append("mariadb")
        _record_started(cfg, "mariadb", None)
        munge_pid = started.get("munged")
        if munge_pid and stop_pid(munge_pid, MUNGED):
            stopped.append("munged")
        _record_started(cfg, "munged", None)
    return stopped
