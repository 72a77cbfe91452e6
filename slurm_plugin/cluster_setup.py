"""Set-up of the local cluster: Debian packages, config files, the /etc/slurm link, started.json.

Nothing here starts a daemon (``cluster_daemons`` does); ``cluster.up()`` calls both.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import stat
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from hetrun.slurm_plugin.cluster_conf import (
    FAKE_GPU_MAJOR,
    ClusterConfig,
    fake_gpu_files,
    render_gres_conf,
    render_mpi_conf,
    render_requeue_nudge,
    render_slurm_conf,
    render_slurmdbd_conf,
    render_task_prolog,
)
from hetrun.slurm_plugin.cluster_procs import run_checked

from hetrun.errors import SlurmError

if TYPE_CHECKING:
    from hetrun.slurm_plugin.policy.model import PolicySpec
    from hetrun.slurm_plugin.policy.nodes import NodeSetup

REQUIRED_PACKAGES = (
    "slurm-wlm",
    "munge",
    "libslurm-dev",
    "openmpi-bin",
    "libopenmpi-dev",
    "slurmdbd",
    "mariadb-server",
)


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


def write_if_changed(path: Path, text: str, mode: int = 0o644) -> bool:
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


def db_password(cfg: ClusterConfig) -> str:
    path = cfg.directory / "db_password"
    if path.exists():
        return path.read_text().strip()
    password = secrets.token_hex(16)
    write_if_changed(path, password + "\n", 0o600)
    return password


def load_cluster_policy(cfg: ClusterConfig) -> tuple[PolicySpec, NodeSetup] | None:
    """``cfg``'s policy and what it asks of the nodes (shards, cgroup.conf); None without one.
    Loaded once per config write: it reads the YAML and the host's cgroup mounts."""
    if cfg.policy is None:
        return None
    # Imported here: a cluster without a policy never loads the policy model.
    from hetrun.slurm_plugin.policy.model import load_policy
    from hetrun.slurm_plugin.policy.nodes import node_setup

    policy = load_policy(cfg.policy)
    return policy, node_setup(policy, cfg.cpus, cfg.gpus, where=f"cluster policy {cfg.policy}")


def slurm_conf_with_policy(cfg: ClusterConfig, loaded: tuple[PolicySpec, NodeSetup] | None = None
                           ) -> tuple[str, str | None]:
    """slurm.conf for ``cfg`` and, when its policy needs one, the job_submit.lua next to it.
    ``loaded``: ``load_cluster_policy(cfg)`` when the caller has it already."""
    loaded = loaded if loaded is not None else load_cluster_policy(cfg)
    if loaded is None:
        return render_slurm_conf(cfg), None
    from hetrun.slurm_plugin.policy.apply import conf_with_policy

    policy, nodes = loaded
    text = render_slurm_conf(cfg, nodes.shards_per_gpu)
    return conf_with_policy(text, policy, where=f"{cfg.policy} on {cfg.slurm_conf}")


def make_fake_gpus(cfg: ClusterConfig, devices: bool) -> None:
    """The emulated GPUs' files. ``devices``: character devices instead of empty files,
    for shards and ConstrainDevices: Slurm's gres plugin skips a File= that is not a
    device (no CUDA_VISIBLE_DEVICES, nothing to confine). Major 120 is one Linux reserves for
    local/experimental use, so no driver answers: opening an allowed one gives ENXIO,
    one the devices cgroup denies gives EPERM."""
    for index, path in enumerate(fake_gpu_files(cfg)):
        if not devices:
            path.touch(exist_ok=True)
            continue
        if path.is_char_device() and os.major(path.stat().st_rdev) == FAKE_GPU_MAJOR \
                and os.minor(path.stat().st_rdev) == index:
            continue
        path.unlink(missing_ok=True)
        try:
            os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(FAKE_GPU_MAJOR, index))
        except OSError as exc:
            raise SlurmError(f"local cluster: cannot create the fake GPU device {path}: {exc.strerror or exc}",
                             hint="cpu.isolation needs mknod (root, CAP_MKNOD); or set cpu.isolation: none") \
                from None


def write_configs(cfg: ClusterConfig) -> dict[str, bool]:
    """Write every config file; returns which ones changed (by short name)."""
    d = cfg.directory
    for sub in ("etc", "state", "run", "log", "fakegpu", *(f"spool/{n}" for n in cfg.node_names)):
        (d / sub).mkdir(parents=True, exist_ok=True)
    loaded = load_cluster_policy(cfg)
    nodes = loaded[1] if loaded else None
    make_fake_gpus(cfg, bool(nodes and nodes.gpu_devices))
    # Every slurmd reads cgroup.conf from slurm.conf's directory; a changed one restarts them (gres.conf's flag).
    shards, cgroup_conf = (nodes.shards_per_gpu, nodes.cgroup_conf) if nodes else (0, None)
    cgroup_changed = bool(cgroup_conf and write_if_changed(cfg.etc / "cgroup.conf", cgroup_conf))
    conf, lua = slurm_conf_with_policy(cfg, loaded)
    if lua is not None:
        write_if_changed(cfg.etc / "job_submit.lua", lua)  # slurmctld reloads a changed script by itself
    changed = {
        "slurm.conf": write_if_changed(cfg.etc / "slurm.conf", conf),
        "gres.conf": write_if_changed(cfg.etc / "gres.conf", render_gres_conf(cfg, shards)) or cgroup_changed,
        "mpi.conf": write_if_changed(cfg.etc / "mpi.conf", render_mpi_conf()),
        # slurmdbd refuses a config readable by others (it holds the DB password).
        "slurmdbd.conf": write_if_changed(
            cfg.etc / "slurmdbd.conf", render_slurmdbd_conf(cfg, db_password(cfg)), 0o600
        ),
        "task_prolog.sh": write_if_changed(cfg.etc / "task_prolog.sh", render_task_prolog(), 0o755),
        "requeue_nudge.sh": write_if_changed(cfg.etc / "requeue_nudge.sh", render_requeue_nudge(cfg), 0o755),
    }
    write_if_changed(d / "cluster.json", cfg.to_json() + "\n")
    return changed


# --------------------------------------------------------------- started.json


def started_daemons(cfg: ClusterConfig) -> dict[str, int]:
    path = cfg.directory / "started.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): int(v) for k, v in data.items()} if isinstance(data, dict) else {}


def record_started(cfg: ClusterConfig, name: str, pid: int | None) -> None:
    data = started_daemons(cfg)
    if pid is None:
        data.pop(name, None)
    else:
        data[name] = pid
    write_if_changed(cfg.directory / "started.json", json.dumps(data, indent=1, sort_keys=True) + "\n")
