"""A second, throw-away Slurm cluster next to the shared test cluster, for tests that
must change slurm.conf (PreemptType=preempt/qos, JobSubmitPlugins=lua, priority
weights), which the shared cluster must never get.

It reuses hetrun's own rendering and daemon starters with another directory,
another ClusterName (``hrtest2``) and other ports (slurmctld 16817, slurmd
18001+), and shares munge and the slurmdbd of the shared cluster (one slurmdbd
serves several clusters). Nothing of the shared cluster is touched: its
slurm.conf, /etc/slurm link, daemons and ports stay as they are. ``stop()``
stops the daemons it started and removes the cluster and its hrtest objects
from slurmdbd.

From ``start()`` to ``stop()`` a process owns the cluster's name through an exclusive
flock on /var/lock/hetrun-<name>.lock: two lives of one name share a directory, ports
and QOS names, so a second process (a test beside a benchmark's replay of the same
pool) would stop the first one's daemons and read its QOS as its own. It waits for the
owner a while, then fails naming it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from hetrun.slurm_plugin.cluster import apply_policy_objects
from hetrun.slurm_plugin.cluster_conf import (
    FIRST_SLURMD_PORT,
    SLURMCTLD_PORT,
    ClusterConfig,
)
from hetrun.slurm_plugin.cluster_daemons import (
    daemon_env,
    slurm_daemon_pid,
    start_slurmctld,
    start_slurmd,
    stop_slurm_daemon,
)
from hetrun.slurm_plugin.cluster_setup import slurm_conf_with_policy, write_configs

NAME = "hrtest2"


def policy_text(gpu_quota: int, extra: str = "") -> str:
    """The policy the second cluster's tests apply: three tiers with preemption, one team
    (``hrtest2_team``, root) with a GPU quota, and ``extra`` YAML lines appended."""
    return (f"resources:\n  gpu:\n    count: 4\n    scheduling:\n"
            f"      priority: [critical, high, normal]\n      preemption: true\n"
            f"naming: {{qos_prefix: hrtest2_}}\n"
            f"accounts:\n  hrtest2_team:\n    quota: {{gpu: {gpu_quota}}}\n    users: [root]\n{extra}")
DIRECTORY = Path("/var/lib/hetrun-hrtest2")
CTLD_PORT = 16817
FIRST_NODE_PORT = 18001
_OWNED: dict[str, int] = {}  # cluster name -> the fd whose flock says this process owns it


class SecondCluster:
    """``policy``: a policy YAML the cluster starts with, as `hetrun cluster up --policy`
    does it (settings and job_submit.lua rendered in, then QOS/accounts applied).
    ``shape``: other ClusterConfig fields (cpus, gpus, mem_mb, gpu_types, cpu_nodes).
    A subclass with its own name, directory and ports is a third cluster
    (tests/big_cluster.py)."""

    name = NAME
    directory = DIRECTORY
    ctld_port = CTLD_PORT
    first_node_port = FIRST_NODE_PORT
    # False: start with the policy's slurm.conf and job_submit.lua only, and leave its
    # QOS/accounts to a test's own `hetrun policy apply`.
    apply_policy_at_start = True
    owner_wait_s = 120.0  # how long start() waits for another process's life of this name to end

    def __init__(self, nodes: int = 2, policy: Path | None = None, **shape: object) -> None:
        shape = {"cpus": 2, "gpus": 2, "mem_mb": 1000, **shape}
        self.cfg = ClusterConfig(nodes=nodes, directory=self.directory,  # type: ignore[arg-type]
                                 slurm_etc=self.directory / "etc-not-linked",
                                 policy=str(policy.resolve()) if policy else None, **shape)
        self.policy_commands: list[tuple[str, ...]] = []  # what apply_policy_objects ran at start

    @property
    def env(self) -> dict[str, str]:
        return daemon_env(self.cfg)

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(argv), env=self.env, capture_output=True, text=True, check=check,
                              timeout=60, stdin=subprocess.DEVNULL)

    def render_conf(self) -> str:
        text, _ = slurm_conf_with_policy(self.cfg)  # write_configs wrote the lua
        text = text.replace("ClusterName=hetrun", f"ClusterName={self.name}")
        text = text.replace(f"SlurmctldPort={SLURMCTLD_PORT}", f"SlurmctldPort={self.ctld_port}")
        shift = self.first_node_port - FIRST_SLURMD_PORT
        # Every NodeName line (one per node group) moves its Port=N or Port=[A-B] by `shift`.
        text, count = re.subn(r"^(NodeName=\S+ .*?Port=)(\S+)", lambda m: m.group(1) + re.sub(
            r"\d+", lambda p: str(int(p.group()) + shift), m.group(2)), text, flags=re.M)
        assert count, "the rendered slurm.conf changed shape; update tests/second_cluster.py"
        return text

    def own(self) -> None:
        """Take the name's lock (see the module's docstring), or fail naming the process that has it.
        The process owns the name, not one object: a replay starts each side's pool afresh."""
        if self.name in _OWNED:
            return
        path = Path(f"/var/lock/hetrun-{self.name}.lock")
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + self.owner_wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "unknown"
                    os.close(fd)
                    raise AssertionError(
                        f"the {self.name} cluster ({self.directory}) is in use by another process "
                        f"({holder}) for over {self.owner_wait_s:.0f} s; wait for it or end it") from None
                time.sleep(1)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}: {' '.join(sys.argv)[:300]}".encode(), 0)
        _OWNED[self.name] = fd

    def disown(self) -> None:
        fd = _OWNED.pop(self.name, None)
        if fd is not None:
            os.ftruncate(fd, 0)
            os.close(fd)  # closing the only fd drops the flock

    def start(self) -> None:
        self.own()
        self.clean_up()
        write_configs(self.cfg)  # dirs, gres.conf, mpi.conf, task prolog; slurm.conf replaced below
        self.cfg.slurm_conf.write_text(self.render_conf())
        clusters = self.run("sacctmgr", "-n", "-P", "list", "cluster", "format=cluster").stdout.split()
        if self.name not in clusters:
            self.run("sacctmgr", "-i", "add", "cluster", self.name)
        self.start_daemons()
        if self.cfg.policy and self.apply_policy_at_start:
            self.policy_commands = apply_policy_objects(self.cfg)

    def start_daemons(self) -> None:
        start_slurmctld(self.cfg)
        for node in self.cfg.node_names:
            start_slurmd(self.cfg, node)
        self.wait_idle()

    def restart(self) -> None:
        """What a change of PreemptType / PriorityType needs: every daemon restarted."""
        self.stop_daemons()
        self.start_daemons()

    def wait_idle(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        states = ""
        while time.monotonic() < deadline:
            states = self.run("sinfo", "-h", "-N", "-o", "%N %T", check=False).stdout
            lines = [ln.split() for ln in states.splitlines() if ln.strip()]
            bad = [n for n, s in lines if s.rstrip("*").startswith(("down", "drain", "inval"))]
            if bad:
                self.run("scontrol", "update", f"nodename={','.join(bad)}", "state=resume", check=False)
            if len({n for n, s in lines if s.rstrip("*") in ("idle", "mixed", "allocated")}) == self.cfg.nodes:
                return
            time.sleep(1)
        raise AssertionError(f"second cluster nodes not idle after {timeout} s: {states}")

    def stop_daemons(self) -> None:
        # TERM every slurmd first so they exit together (one by one, 64 took 5 s); the stops then reap them.
        for node in self.cfg.node_names:
            pid = slurm_daemon_pid(self.cfg, f"slurmd-{node}")
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
        for node in self.cfg.node_names:
            stop_slurm_daemon(self.cfg, f"slurmd-{node}")
        stop_slurm_daemon(self.cfg, "slurmctld")

    def stop(self) -> None:
        """Stop the daemons, remove this cluster's records from slurmdbd and give up the name."""
        self.own()  # another process's live cluster of this name is not ours to tear down
        try:
            self.clean_up()
        finally:
            self.disown()

    def node_leftovers(self) -> set[int]:
        """Every process of every node (its slurmd's mount namespace) but the slurmds."""
        pids: set[int] = set()
        for node in self.cfg.node_names:
            slurmd = slurm_daemon_pid(self.cfg, f"slurmd-{node}")
            if slurmd is not None:
                with contextlib.suppress(OSError):
                    pids.update(p for p in node_processes(slurmd) if p != slurmd)
        return pids

    def clean_up(self) -> None:
        if (self.cfg.directory / "run").exists():
            # Against a controller that is gone, scancel retries for 18 s before it gives up.
            if slurm_daemon_pid(self.cfg, "slurmctld") is not None:
                self.run("scancel", "--full", "-u", "root", check=False)
            # A job's slurmstepd outlives its stopped slurmd (orphaned to init, deaf to SIGTERM:
            # one was found alive an hour after a suite), so what is left of the nodes gets SIGKILL.
            leftovers = self.node_leftovers()
            self.stop_daemons()
            for pid in leftovers:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        # slurmdbd is shared, so the default slurm.conf reaches it; with self.env before the first
        # start (no slurm.conf of ours yet) sacctmgr spent 59 s failing to read it.
        subprocess.run(["sacctmgr", "-i", "delete", "cluster", self.name], capture_output=True, check=False,
                       timeout=60)
        shutil.rmtree(self.cfg.directory, ignore_errors=True)
        # QOS are global in slurmdbd; sacctmgr refuses to delete one while an
        # association still names it, so only now that the cluster is gone.
        names = subprocess.run(["sacctmgr", "-n", "-P", "show", "qos", "format=Name"], capture_output=True,
                               text=True, check=False, timeout=60).stdout.split()
        ours = [q for q in names if q.startswith(f"{self.name}_")]
        if ours:
            subprocess.run(["sacctmgr", "-i", "delete", "qos", ",".join(ours)], capture_output=True,
                           check=False, timeout=60)


def node_processes(slurmd: int) -> list[int]:
    """Every process sharing ``slurmd``'s mount namespace: one emulated node's (none where the
    slurmd runs in this process's own namespace: that would be every process of the host)."""
    ns = os.readlink(f"/proc/{slurmd}/ns/mnt")
    if ns == os.readlink("/proc/self/ns/mnt"):
        return []
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(entry / "ns" / "mnt") == ns:
                    out.append(int(entry.name))
    return out
