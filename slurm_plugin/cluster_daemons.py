"""Start, find and stop the local cluster's daemons: munged, MariaDB, slurmdbd, slurmctld, slurmd.

Each ``start_*`` is a no-op when its daemon already runs, so ``cluster.up()``
restarts only what is down. Slurm daemons are found through the pid files in
the cluster directory; munged and MariaDB may have been started by someone
else, and are then used but never stopped (``started.json`` says what we started).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from hetrun.slurm_plugin.cluster_conf import CLUSTER_NAME, ClusterConfig
from hetrun.slurm_plugin.cluster_procs import (
    find_pids,
    process_matches,
    read_pid,
    run_checked,
    spawn_detached,
    stop_pid,
    wait_for,
)
from hetrun.slurm_plugin.cluster_setup import db_password, record_started

from hetrun.errors import SlurmError

MUNGED = "/usr/sbin/munged"
MARIADBD = "/usr/sbin/mariadbd"
SLURMDBD = "/usr/sbin/slurmdbd"
SLURMCTLD = "/usr/sbin/slurmctld"
SLURMD = "/usr/sbin/slurmd"
MUNGE_PID = Path("/run/munge/munged.pid")
MUNGE_SOCKET = Path("/run/munge/munge.socket.2")
MYSQL_SOCKET = Path("/run/mysqld/mysqld.sock")
MYSQL_DATADIR = Path("/var/lib/mysql")


def daemon_env(cfg: ClusterConfig) -> dict[str, str]:
    # Daemons get a clean environment: whatever the caller (a pytest run, a
    # shell with a job's variables) has set must not leak into slurmd.
    return {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "LANG": "C.UTF-8",
        "SLURM_CONF": str(cfg.slurm_conf),
    }


def munge_pid() -> int | None:
    pid = read_pid(MUNGE_PID)
    if process_matches(pid, MUNGED):
        return pid
    pids = find_pids(MUNGED)
    return pids[0] if pids else None


def start_munge(cfg: ClusterConfig) -> None:
    if munge_pid():
        return
    run_dir = MUNGE_PID.parent
    run_dir.mkdir(parents=True, exist_ok=True)
    shutil.chown(run_dir, "munge", "munge")
    if not Path("/etc/munge/munge.key").exists():
        run_checked(["runuser", "-u", "munge", "--", "mungekey", "--create"], what="creating the munge key")
    run_checked(["runuser", "-u", "munge", "--", MUNGED, "--force"], what="starting munged")
    wait_for(lambda: munge_pid() is not None and MUNGE_SOCKET.exists(), 15, "munged",
             Path("/var/log/munge/munged.log"))
    record_started(cfg, "munged", munge_pid())


def mariadb_pid() -> int | None:
    pids = find_pids(MARIADBD)
    return pids[0] if pids else None


def _mysql_ping() -> bool:
    proc = subprocess.run(
        ["mysqladmin", "--protocol=socket", f"--socket={MYSQL_SOCKET}", "ping"],
        capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL,
    )
    return proc.returncode == 0


def start_mariadb(cfg: ClusterConfig) -> None:
    if mariadb_pid() and _mysql_ping():
        return
    if not mariadb_pid():
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
            env=daemon_env(cfg), log=cfg.directory / "log" / "mariadb.out",
        )
        record_started(cfg, "mariadb", pid)
    wait_for(_mysql_ping, 60, "MariaDB", cfg.directory / "log" / "mariadb.log")


def _ensure_database(cfg: ClusterConfig) -> None:
    password = db_password(cfg)
    if not password.isalnum():
        # It is pasted into SQL below; ours is always hex.
        raise SlurmError(
            f"local cluster: {cfg.directory}/db_password holds characters other than letters and digits",
            hint=f"delete {cfg.directory}/db_password; the next `hetrun cluster up` writes a new one",
        )
    sql = (
        "CREATE DATABASE IF NOT EXISTS slurm_acct_db; "
        f"CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '{password}'; "
        f"ALTER USER 'slurm'@'localhost' IDENTIFIED BY '{password}'; "
        "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; FLUSH PRIVILEGES;"
    )
    run_checked(["mysql", f"--socket={MYSQL_SOCKET}", "-e", sql], what="creating the accounting database")


def pidfile_daemon(cfg: ClusterConfig, name: str) -> tuple[Path, str, str | None]:
    """(pid file, executable, argv marker) of one of our Slurm daemons."""
    run = cfg.directory / "run"
    if name == "slurmdbd":
        return run / "slurmdbd.pid", SLURMDBD, None
    if name == "slurmctld":
        return run / "slurmctld.pid", SLURMCTLD, None
    node = name.removeprefix("slurmd-")
    return run / f"slurmd-{node}.pid", SLURMD, node


def slurm_daemon_pid(cfg: ClusterConfig, name: str) -> int | None:
    pid_file, exe, marker = pidfile_daemon(cfg, name)
    pid = read_pid(pid_file)
    return pid if process_matches(pid, exe, marker) else None


def start_slurmdbd(cfg: ClusterConfig, restart: bool) -> None:
    if restart:
        stop_slurm_daemon(cfg, "slurmdbd")
    if slurm_daemon_pid(cfg, "slurmdbd") is None:
        _ensure_database(cfg)
        run_checked([SLURMDBD], env=daemon_env(cfg), what="starting slurmdbd")
        wait_for(lambda: slurm_daemon_pid(cfg, "slurmdbd") is not None, 20, "slurmdbd",
                 cfg.directory / "log" / "slurmdbd.log")
        record_started(cfg, "slurmdbd", slurm_daemon_pid(cfg, "slurmdbd"))
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
            env=daemon_env(cfg), capture_output=True, text=True, check=False,
            stdin=subprocess.DEVNULL,
        )
        if proc.returncode == 0:
            if CLUSTER_NAME not in proc.stdout.split():
                run_checked(["sacctmgr", "-i", "add", "cluster", CLUSTER_NAME],
                            env=daemon_env(cfg), what="registering the cluster with slurmdbd")
            registered.touch()
            return
        last = (proc.stderr or proc.stdout).strip()
        time.sleep(0.5)
    raise SlurmError(
        f"local cluster: slurmdbd does not answer sacctmgr: {last}",
        hint=f"read {cfg.directory}/log/slurmdbd.log",
    )


def scontrol_ping(cfg: ClusterConfig) -> bool:
    proc = subprocess.run(
        ["scontrol", "ping"], env=daemon_env(cfg), capture_output=True, text=True,
        check=False, stdin=subprocess.DEVNULL,
    )
    return proc.returncode == 0 and "UP" in proc.stdout


def start_slurmctld(cfg: ClusterConfig) -> None:
    if slurm_daemon_pid(cfg, "slurmctld") is not None:
        return
    run_checked([SLURMCTLD], env=daemon_env(cfg), what="starting slurmctld")
    log = cfg.directory / "log" / "slurmctld.log"
    wait_for(lambda: slurm_daemon_pid(cfg, "slurmctld") is not None, 20, "slurmctld", log)
    wait_for(lambda: scontrol_ping(cfg), 30, "slurmctld (scontrol ping)", log)
    record_started(cfg, "slurmctld", slurm_daemon_pid(cfg, "slurmctld"))


def start_slurmd(cfg: ClusterConfig, node: str) -> None:
    name = f"slurmd-{node}"
    if slurm_daemon_pid(cfg, name) is not None:
        return
    # Own mount namespace with a private /tmp per node: pmix creates per-job
    # directories under /tmp whose names collide between nodes of one host.
    script = f"mount -t tmpfs -o mode=1777 tmpfs /tmp && exec {SLURMD} -N {node}"
    try:
        run_checked(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                    env=daemon_env(cfg), what=f"starting slurmd for node {node}")
    except SlurmError as exc:
        raise SlurmError(
            str(exc.message),
            hint="each emulated node needs its own mount namespace (unshare -m, CAP_SYS_ADMIN): "
            "run as root on a VM or a privileged container",
        ) from exc
    wait_for(lambda: slurm_daemon_pid(cfg, name) is not None, 20, f"slurmd {node}",
             cfg.directory / "log" / f"slurmd-{node}.log")
    record_started(cfg, name, slurm_daemon_pid(cfg, name))


def stop_slurm_daemon(cfg: ClusterConfig, name: str) -> bool:
    pid_file, exe, marker = pidfile_daemon(cfg, name)
    pid = read_pid(pid_file)
    stopped = pid is not None and stop_pid(pid, exe, marker)
    record_started(cfg, name, None)
    return stopped


def running_slurmd_nodes(cfg: ClusterConfig) -> list[str]:
    run = cfg.directory / "run"
    nodes = [p.name.removeprefix("slurmd-").removesuffix(".pid") for p in run.glob("slurmd-*.pid")]
    return sorted(n for n in nodes if slurm_daemon_pid(cfg, f"slurmd-{n}") is not None)
