"""A throw-away 4-node cluster beside the shared test cluster whose nodes may be killed:
issue 25's node-death test and benchmarks/node_death_bench.py kill every process of one
emulated node (its slurmd, slurmstepd and tasks: its private /tmp goes with them) or set
it DOWN, which the shared cluster's other users must never see.

It is tests/second_cluster.py's SecondCluster with its own ClusterName (``hrnode``),
directory and ports (slurmctld 16877, slurmd 23001-23004). ``revive(node)`` brings a
killed node back (a new slurmd, state resume): it can be a spare again. ``stop()``
SIGKILLs every daemon and every process of every node at once rather than asking each
daemon to exit: the cluster and its state are thrown away, and a polite stop waited up
to 20 s per daemon (60 s of the node-death test's teardown in CI).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from hetrun.slurm_plugin.cluster_daemons import slurm_daemon_pid, start_slurmd
from second_cluster import SecondCluster, node_processes


class NodeCluster(SecondCluster):
    name = "hrnode"
    directory = Path("/var/lib/hetrun-hrnode")
    ctld_port = 16877
    first_node_port = 23001

    def __init__(self, nodes: int = 4, **shape: object) -> None:
        super().__init__(nodes, None, **{"gpus": 0, "mem_mb": 2000, **shape})

    def render_conf(self) -> str:
        # Slurm's default SlurmdTimeout (300 s), not the shared cluster's 60 s: when Slurm
        # marks a node of a het job down it requeues the whole het job despite --no-kill
        # if the job's first component holds one node (docs/PREEMPTION.md), as the
        # benchmarks' PPO jobs do, so hetrun's own detection must come first.
        return super().render_conf().replace("SlurmdTimeout=60", "SlurmdTimeout=300")

    def slurmd_pid(self, node: str) -> int | None:
        return slurm_daemon_pid(self.cfg, f"slurmd-{node}")

    def kill_node(self, node: str) -> list[int]:
        """SIGKILL every process of the node: all those in its slurmd's mount namespace
        (slurmd, slurmstepd and the ranks: the daemons double-fork, so not a process tree).
        The namespace and its tmpfs /tmp go with the last of them."""
        root = self.slurmd_pid(node)
        if root is None:
            return []
        pids = node_processes(root)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return pids

    def stop(self) -> None:
        """Kill, don't ask: every process of every node (slurmd, slurmstepd, batch script,
        ranks) and slurmctld with its slurmscriptd, by pid; then wait until they are gone
        and their ports are free (the next start binds them), and forget the cluster in
        slurmdbd (shared with the test cluster)."""
        pids = self.node_leftovers()
        pids.update(p for node in self.cfg.node_names if (p := self.slurmd_pid(node)) is not None)
        ctld = slurm_daemon_pid(self.cfg, "slurmctld")
        if ctld is not None:
            pids.add(ctld)
            pids.update(children(ctld))
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        ports = [self.ctld_port, *range(self.first_node_port, self.first_node_port + self.cfg.nodes)]
        while time.monotonic() < deadline:
            for pid in pids:  # daemons this process started are its children until reaped
                with contextlib.suppress(ChildProcessError, OSError):
                    os.waitpid(pid, os.WNOHANG)
            alive = [p for p in pids if _alive(p)]
            busy = [p for p in ports if not _port_free(p)]
            if not alive and not busy:
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"{self.name}: processes {alive} or ports {busy} still there after 30 s")
        subprocess.run(["sacctmgr", "-i", "delete", "cluster", self.name], capture_output=True, check=False,
                       timeout=60)
        shutil.rmtree(self.cfg.directory, ignore_errors=True)

    def revive(self, node: str, timeout: float = 90) -> None:
        """A new slurmd for a killed node, and state resume once the controller sees it."""
        if self.slurmd_pid(node) is None:
            with contextlib.suppress(OSError):
                (self.cfg.directory / "run" / f"slurmd-{node}.pid").unlink()
            start_slurmd(self.cfg, node)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.run("sinfo", "-h", "-n", node, "-o", "%T", check=False).stdout.strip()
            if state.rstrip("*") in ("idle", "mixed", "allocated"):
                return
            if state.startswith("completing"):
                # A killed node's old job stays COMPLETING until SlurmdTimeout (no slurmd confirmed
                # its end): DOWN ends that, as Slurm itself would, and then resume takes.
                self.run("scontrol", "update", f"nodename={node}", "state=down", "reason=revive", check=False)
            self.run("scontrol", "update", f"nodename={node}", "state=resume", check=False)
            time.sleep(1)
        raise AssertionError(f"{node} not back after {timeout} s: {state}")


def children(pid: int) -> list[int]:
    """The direct children of ``pid`` (slurmctld's slurmscriptd)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(entry.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie holds no socket; its parent (not us) reaps it


def _port_free(port: int) -> bool:
    """Nothing listens on ``port`` (a bind the way the daemons bind: SO_REUSEADDR)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


if __name__ == "__main__":  # python tests/node_cluster.py up|down: by hand, for the benchmark
    import sys

    c = NodeCluster()
    if sys.argv[1:] == ["down"]:
        c.stop()
    else:
        c.start()
        print(" ".join(f"{k}={v}" for k, v in c.env.items() if k == "SLURM_CONF"))
    subprocess.run(["true"], check=False)
