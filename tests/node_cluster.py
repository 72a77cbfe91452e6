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
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

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

    def end_trial(self, job: str) -> None:
        """After one death trial: cancel ``job`` and bring every node back (a killed node's slurmd
        restarted, a DOWN one resumed), so the next trial finds the whole cluster idle."""
        self.run("scancel", job, check=False)
        time.sleep(2)
        for n in self.cfg.node_names:
            self.revive(n)

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


@contextlib.contextmanager
def job_beside_reference(spec_for: Callable[[str], dict[str, Any]], name: str) -> Iterator[dict[str, Any]]:
    """The node-death tests' shared part: ``spec_for(memory_dir)``'s plan run uninterrupted
    under mpirun on this host (the reference), started before a throw-away NodeCluster boots
    and done before the job is submitted there (a node's heartbeat must not be slowed by the
    reference's ranks); then the same spec submitted to that cluster with the memory tier in
    each node's own /tmp (it dies with its node). Yields ``cluster``, ``ref`` (the reference's
    run directory), ``res`` (the submission), ``run_dir`` and ``started(it)`` (the learner has
    begun iteration ``it``). On exit SLURM_CONF is put back first (the shared cluster's tests
    after this one must not talk to a deleted cluster), the cluster stopped and, unless
    HETRUN_KEEP_TEST_DIRS, the directories removed."""
    from hetrun.dag.spec import spec_from_dict
    from hetrun.slurm_plugin.submit import submit_spec
    from resume_compare import plan_dict
    from test_resume_exact import events, mpirun

    root = Path("/var/tmp/hetrun-tests") / f"{name}-{os.getpid()}"
    root.mkdir(parents=True, exist_ok=True)
    ref = root / "reference"
    ref.mkdir()
    (ref / "plan.json").write_text(json.dumps(plan_dict(spec_for(str(root / "ref-mem")))))
    old_mem = os.environ.get("HETRUN_MEMORY_DIR")
    os.environ["HETRUN_MEMORY_DIR"] = str(root / "ref-mem")  # read when mpirun starts: the job never sees it
    try:
        reference = mpirun(ref, 0)
    finally:
        os.environ.pop("HETRUN_MEMORY_DIR") if old_mem is None else os.environ.update(HETRUN_MEMORY_DIR=old_mem)
    cluster = NodeCluster()
    old_conf = os.environ.get("SLURM_CONF")
    try:
        cluster.start()
        try:
            assert reference.wait(timeout=300) == 0, (ref / "mpirun-0.log").read_text()[-3000:]
        finally:
            if reference.poll() is None:
                os.killpg(reference.pid, signal.SIGKILL)
        os.environ["SLURM_CONF"] = cluster.env["SLURM_CONF"]
        res = submit_spec(spec_from_dict(spec_for("/tmp")), backend="sbatch", runs_dir=root / "runs")
        run_dir = Path(res.run.run_dir)

        def started(it: int) -> bool:
            return any(e.get("ev") == "action" and e.get("component") == "learner"
                       and e.get("iteration", -1) >= it for e in events(run_dir))

        yield {"cluster": cluster, "ref": ref, "res": res, "run_dir": run_dir, "started": started}
    finally:
        os.environ.pop("SLURM_CONF", None) if old_conf is None else os.environ.update(SLURM_CONF=old_conf)
        cluster.stop()  # kills every process of the cluster, the job's included
    if not os.environ.get("HETRUN_KEEP_TEST_DIRS"):  # as shared_tmp (tests/conftest.py)
        shutil.rmtree(root, ignore_errors=True)
