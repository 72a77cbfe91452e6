"""``cpu.isolation`` on the nodes: which cgroup version they run, and the cgroup.conf
Slurm's task/cgroup and proctrack/cgroup need on it.

Slurm 22.05 confines tasks through ``cgroup/v1`` or ``cgroup/v2``; the version
must match what the node's kernel mounts at /sys/fs/cgroup. A cgroup2 file system
there is v2; a tmpfs with the v1 controllers mounted under it is v1 (a hybrid host
with an extra ``unified`` cgroup2 mount below it is still v1 for Slurm). Without
either, task/cgroup cannot start and slurmd refuses to run: the policy plan then
reports the isolation as unsupported instead of writing settings that break the
nodes.

Detection reads this host's mount table: right for the local cluster (its nodes
are this host) and for a plan run on a node; for a real cluster planned from a
login host, check the nodes (docs/POLICY.md).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
MOUNTS = Path("/proc/self/mounts")
# v1 hierarchies task/cgroup + proctrack/cgroup use: cores, memory, devices, and
# freezer (proctrack signals a whole step through it).
V1_CONTROLLERS = ("cpuset", "memory", "devices", "freezer")
# v2 controllers the same constraints need (devices are an eBPF program in v2).
V2_CONTROLLERS = ("cpuset", "memory")


@dataclass(frozen=True)
class CgroupSupport:
    """What this host offers: ``version`` "v1" / "v2" / None, and why not when it
    cannot confine tasks (``missing``: controllers absent or not writable)."""

    version: str | None
    missing: tuple[str, ...] = ()
    detail: str = ""

    @property
    def usable(self) -> bool:
        return self.version is not None and not self.missing


def _mounts(table: Path) -> list[tuple[str, str, str]]:
    """(mount point, fs type, options) of every line of a /proc/mounts-style table."""
    out = []
    for line in table.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 4:
            out.append((parts[1], parts[2], parts[3]))
    return out


def detect_cgroup(root: Path = CGROUP_ROOT, mounts: Path = MOUNTS) -> CgroupSupport:
    try:
        table = _mounts(mounts)
    except OSError as exc:
        return CgroupSupport(None, detail=f"cannot read {mounts}: {exc.strerror or exc}")
    at_root = [fs for point, fs, _ in table if point == str(root)]
    if "cgroup2" in at_root:
        try:
            have = set((root / "cgroup.controllers").read_text().split())
        except OSError:
            have = set()
        missing = tuple(c for c in V2_CONTROLLERS if c not in have)
        return CgroupSupport("v2", missing, f"cgroup2 at {root}, controllers: {' '.join(sorted(have))}")
    v1 = {}
    for point, fs, options in table:
        if fs == "cgroup" and os.path.dirname(point) == str(root):
            for ctrl in options.split(","):
                v1[ctrl] = Path(point)
    if not v1:
        return CgroupSupport(None, detail=f"neither cgroup2 nor cgroup v1 controllers are mounted at {root}")
    missing = tuple(c for c in V1_CONTROLLERS if c not in v1 or not os.access(v1[c], os.W_OK))
    return CgroupSupport("v1", missing, f"cgroup v1 at {root}, controllers: {' '.join(sorted(v1))}")


def render_cgroup_conf(support: CgroupSupport | None) -> str:
    """cgroup.conf for the nodes: the plugin of their version (Slurm's own autodetect
    when unknown) and the three constraints cpu.isolation stands for."""
    version = support.version if support else None
    plugin = f"cgroup/{version}" if version else "autodetect"
    lines = [
        f"# cpu.isolation on cgroup {version} nodes" if version
        else "# cpu.isolation (the nodes' cgroup version was not checked: Slurm detects it)",
        f"CgroupPlugin={plugin}",
        # Tasks see only their allocated cores, memory and GRES devices.
        "ConstrainCores=yes",
        "ConstrainRAMSpace=yes",
        "ConstrainDevices=yes",
    ]
    if version == "v2":
        lines.append("# v2 without systemd (slurmd not started by systemd): add IgnoreSystemd=yes")
    return "\n".join(lines) + "\n"


def isolation_problem(isolation: str, support: CgroupSupport) -> str | None:
    """Why ``isolation`` cannot run on these nodes, or None when it can."""
    if isolation == "none" or support.usable:
        return None
    if support.version is None:
        what = support.detail
    else:
        what = f"{support.detail}; missing or not writable: {', '.join(support.missing)}"
    return (f"cpu.isolation: {isolation} needs task/cgroup, which cannot run on these nodes ({what}); "
            "slurmd would not start with it. Mount cgroup v2 (or the v1 controllers "
            f"{', '.join(V1_CONTROLLERS)}) on the nodes, or set cpu.isolation: none")
