"""Configuration of the local test cluster and the Slurm/slurmdbd files rendered from it.

Pure functions: nothing here starts a process or touches /etc, so the rendering
is testable anywhere. ``hetrun.slurm_plugin.cluster`` writes the files and
starts the daemons.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path

from hetrun.errors import SlurmError

DEFAULT_DIR = Path("/var/lib/hetrun-cluster")
CLUSTER_NAME = "hetrun"
FIRST_SLURMD_PORT = 17001
SLURMCTLD_PORT = 6817
SLURMDBD_PORT = 6819
# AuthInfo=cred_expire: also what Slurm holds a requeued job for (+1 s); see render_slurm_conf.
CRED_EXPIRE_S = 15

# Environment every task on this cluster gets from the TaskProlog. Open MPI as
# root refuses to start without the first two; the emulated nodes share one
# host, so shared-memory/vader transport between "nodes" crashes and Open MPI
# must be kept on loopback (the machine's other interface is not reachable
# from every namespace). Gloo (torch.distributed) is pinned to loopback too.
TASK_ENV: dict[str, str] = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_btl": "self,tcp",
    "OMPI_MCA_btl_tcp_if_include": "lo",
    "OMPI_MCA_oob_tcp_if_include": "lo",
    "OMPI_MCA_pml": "ob1",
    "OMPI_MCA_rmaps_base_oversubscribe": "1",
    "OMPI_MCA_hwloc_base_binding_policy": "none",
    "GLOO_SOCKET_IFNAME": "lo",
    "HETRUN_LOCAL_CLUSTER": "1",
}


@dataclass(frozen=True)
class ClusterConfig:
    """Shape of the emulated cluster: ``nodes`` slurmd, each with ``cpus``, ``gpus`` and ``mem_mb``."""

    nodes: int = 4
    cpus: int = 2
    gpus: int = 2
    mem_mb: int = 4000
    directory: Path = field(default=DEFAULT_DIR)
    # Where client commands (sbatch, squeue...) look for slurm.conf; we link ours there.
    slurm_etc: Path = field(default=Path("/etc/slurm"))
    hostname: str = field(default_factory=lambda: socket.gethostname().split(".")[0])
    # Absolute path of the policy YAML the cluster runs (`hetrun cluster up --policy`):
    # its slurm.conf settings and job_submit.lua are rendered in, so a later `up`
    # keeps them instead of dropping what `policy apply` wrote.
    policy: str | None = None
    # Pool shape (`hetrun cluster up --gpu-types a100,v100 --cpu-nodes 16`): the GPU
    # nodes split evenly between these GRES types, each type with its own partition
    # gpu-<type>, and the last ``cpu_nodes`` nodes without GPUs in partition ``cpu``.
    # debug and high still hold every node. Empty and 0: every node alike.
    gpu_types: tuple[str, ...] = ()
    cpu_nodes: int = 0
    # Sockets per node (= NUMA domains for task/affinity), ``cpus`` split evenly
    # among them: 2 makes a policy's numa-aware binding visible on a 2-CPU host.
    sockets: int = 1

    def __post_init__(self) -> None:
        if self.policy is not None and not Path(self.policy).is_absolute():
            raise SlurmError(f"cluster config: policy={self.policy!r} is not an absolute path",
                             hint="pass the policy file's absolute path")
        for key, value, low, high in (
            ("nodes", self.nodes, 1, 64),
            ("cpus", self.cpus, 1, 256),
            ("gpus", self.gpus, 0, 16),
            ("mem_mb", self.mem_mb, 256, 1 << 22),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
                raise SlurmError(
                    f"cluster config: {key}={value!r} is out of range",
                    hint=f"use an integer between {low} and {high}",
                )
        check_pool_shape(self)
        if not isinstance(self.sockets, int) or isinstance(self.sockets, bool) or self.sockets < 1 \
                or self.cpus % self.sockets:
            raise SlurmError(f"cluster config: sockets={self.sockets!r} does not divide cpus={self.cpus}",
                             hint="use a number of sockets that divides the CPUs per node")
        total_mb = physical_memory_mb()
        if total_mb and self.nodes * self.mem_mb > total_mb:
            raise SlurmError(
                f"cluster config: {self.nodes} nodes x {self.mem_mb} MB = "
                f"{self.nodes * self.mem_mb} MB exceeds this machine's {total_mb} MB",
                hint=f"use --mem-mb {max(256, total_mb * 3 // 4 // self.nodes)} or fewer --nodes",
            )

    @property
    def node_names(self) -> list[str]:
        return [f"n{i}" for i in range(1, self.nodes + 1)]

    @property
    def etc(self) -> Path:
        return self.directory / "etc"

    @property
    def slurm_conf(self) -> Path:
        return self.etc / "slurm.conf"

    def to_json(self) -> str:
        data = asdict(self)
        data["directory"] = str(self.directory)
        data["slurm_etc"] = str(self.slurm_etc)
        return json.dumps(data, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ClusterConfig:
        data = json.loads(text)
        data["directory"] = Path(data["directory"])
        data["slurm_etc"] = Path(data["slurm_etc"])
        data["gpu_types"] = tuple(data.get("gpu_types", ()))
        return cls(**data)


def _check_gpu_types(types: tuple[str, ...]) -> None:
    """The one GPU (GRES) type rule, a job's ``gpu_types`` and ``--gres`` use it too
    (``dag.validators.check_gpu_type``): its characters also make a valid partition name
    (``gpu-<type>``) and gres.conf ``Type=``. Distinct ignoring case: the pool view and
    placement compare types lower-cased (``pool.py``), so A100 and a100 would be one type."""
    from hetrun.dag.validators import check_gpu_type

    for t in types:
        try:
            check_gpu_type(t)
        except ValueError as exc:
            raise SlurmError(f"cluster config: gpu_types={list(types)!r}: {exc}",
                             hint="e.g. --gpu-types a100,v100") from None
    lowered = [t.lower() for t in types]
    if len(set(lowered)) != len(lowered):
        raise SlurmError(f"cluster config: gpu_types={list(types)!r} is not a list of distinct names "
                         "(case is ignored)", hint="give each GRES type once, e.g. --gpu-types a100,v100")


def check_pool_shape(cfg: ClusterConfig) -> None:
    _check_gpu_types(cfg.gpu_types)
    if not isinstance(cfg.cpu_nodes, int) or isinstance(cfg.cpu_nodes, bool) \
            or not 0 <= cfg.cpu_nodes < cfg.nodes:
        raise SlurmError(f"cluster config: cpu_nodes={cfg.cpu_nodes!r} is out of range",
                         hint=f"use an integer between 0 and {cfg.nodes - 1} (at least one GPU node)")
    if cfg.gpu_types and (cfg.gpus == 0 or cfg.nodes - cfg.cpu_nodes < len(cfg.gpu_types)):
        raise SlurmError(f"cluster config: {len(cfg.gpu_types)} GPU types need GPUs on at least as many nodes "
                         f"(gpus={cfg.gpus}, {cfg.nodes - cfg.cpu_nodes} GPU nodes)",
                         hint="give --gpus 1 or more, and fewer --cpu-nodes or GPU types")


@dataclass(frozen=True)
class NodeGroup:
    """Nodes n<first>..n<last> alike: ``gres`` as on the NodeName line ("" = no GPU)."""

    first: int
    last: int
    gres: str
    partition: str | None  # the group's own partition, beside debug and high

    @property
    def names(self) -> str:
        return _range("n", self.first, self.last)


def node_groups(cfg: ClusterConfig) -> list[NodeGroup]:
    gpu_nodes = cfg.nodes - cfg.cpu_nodes
    gres = f"gpu:{cfg.gpus}" if cfg.gpus else ""
    groups = []
    if not cfg.gpu_types:
        groups.append(NodeGroup(1, gpu_nodes, gres, "gpu" if cfg.cpu_nodes else None))
    first = 1
    for i, gpu_type in enumerate(cfg.gpu_types):  # the first types take the remainder
        count = gpu_nodes // len(cfg.gpu_types) + (i < gpu_nodes % len(cfg.gpu_types))
        groups.append(NodeGroup(first, first + count - 1, f"gpu:{gpu_type}:{cfg.gpus}", f"gpu-{gpu_type}"))
        first += count
    if cfg.cpu_nodes:
        groups.append(NodeGroup(gpu_nodes + 1, cfg.nodes, "", "cpu"))
    return groups


def physical_memory_mb() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1 << 20)
    except (ValueError, OSError):
        return 0


# Character-device major of the fake GPUs when the devices cgroup confines them
# (a policy's cpu.isolation): one of Linux's local/experimental majors, no driver.
FAKE_GPU_MAJOR = 120


def fake_gpu_files(cfg: ClusterConfig) -> list[Path]:
    # gres.conf needs one File= per GPU; the files must live outside /tmp
    # because each slurmd has a private /tmp.
    return [cfg.directory / "fakegpu" / f"gpu{i}" for i in range(cfg.gpus)]


def _range(prefix: str, first: int, last: int) -> str:
    return f"{prefix}{first}" if first == last else f"{prefix}[{first}-{last}]"


def render_slurm_conf(cfg: ClusterConfig, shards_per_gpu: int = 0) -> str:
    """``shards_per_gpu``: GRES shards on every GPU (a policy's gpu.sharing)."""
    # One template that reads top to bottom like the slurm.conf it writes, hence its length.
    d = cfg.directory
    nodes = _range("n", 1, cfg.nodes)
    # Jobs that give no --mem get a share small enough that several fit on a node.
    def_mem_per_cpu = max(100, cfg.mem_mb // (2 * cfg.cpus))
    lines = [
        "# Written by `hetrun cluster up` (hetrun.slurm_plugin.cluster). Do not edit:",
        "# the next `hetrun cluster up` rewrites it and restarts the daemons.",
        f"ClusterName={CLUSTER_NAME}",
        f"SlurmctldHost={cfg.hostname}(127.0.0.1)",
        f"SlurmctldPort={SLURMCTLD_PORT}",
        "AuthType=auth/munge",
        # The job credential lifetime. Slurm 22.05 also holds a requeued job
        # for cred_expire + 1 s after it has ended (batch_requeue_fini in
        # job_mgr.c; default 120 s). It must outlive a step launch (credential
        # made by slurmctld, checked by slurmd): one RPC, bounded by
        # MessageTimeout=10, and no prolog here. docs/PREEMPTION.md has the
        # trade-off; hetrun shortens the hold of its own requeued jobs anyway
        # (slurm_plugin/requeue_hold.py).
        f"AuthInfo=cred_expire={CRED_EXPIRE_S}",
        "CryptoType=crypto/munge",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"StateSaveLocation={d}/state",
        f"SlurmdSpoolDir={d}/spool/%n",
        f"SlurmctldPidFile={d}/run/slurmctld.pid",
        f"SlurmdPidFile={d}/run/slurmd-%n.pid",
        f"SlurmctldLogFile={d}/log/slurmctld.log",
        f"SlurmdLogFile={d}/log/slurmd-%n.log",
        "SlurmctldDebug=info",
        # No mail on this host; an unset MailProg only logs an error at start.
        "MailProg=/bin/true",
        "SlurmdDebug=info",
        # No cgroups here: track processes by parentage and do no task binding.
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        # Nodes are emulated: trust slurm.conf instead of draining nodes whose
        # CPU/memory counts exceed what the host reports.
        "SlurmdParameters=config_overrides",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory",
        f"DefMemPerCPU={def_mem_per_cpu}",
        "GresTypes=gpu",
        # Het jobs are started only by the backfill scheduler; short intervals
        # make test jobs start in seconds.
        "SchedulerType=sched/backfill",
        "SchedulerParameters=bf_interval=2,sched_interval=2",
        "PreemptType=preempt/partition_prio",
        "PreemptMode=REQUEUE",
        "JobRequeue=1",
        "MpiDefault=pmix",
        f"TaskProlog={d}/etc/task_prolog.sh",
        # Starts a requeued het job as soon as its begin time passes instead of at the next
        # unrelated scheduling event (render_requeue_nudge; docs/PREEMPTION.md).
        f"EpilogSlurmctld={d}/etc/requeue_nudge.sh",
        "ReturnToService=2",
        "SlurmctldTimeout=30",
        "SlurmdTimeout=60",
        "InactiveLimit=0",
        "KillWait=30",
        "MessageTimeout=10",
        # Finished jobs leave squeue after 2 minutes; sacct keeps them.
        "MinJobAge=120",
        "AccountingStorageType=accounting_storage/slurmdbd",
        "AccountingStorageHost=localhost",
        f"AccountingStoragePort={SLURMDBD_PORT}",
        "AccountingStorageTRES=gres/gpu",
        "JobAcctGatherType=jobacct_gather/linux",
        "JobAcctGatherFrequency=30",
        "JobCompType=jobcomp/none",
        *(_node_line(cfg, g, shards_per_gpu) for g in node_groups(cfg)),
        *(f"PartitionName={g.partition} Nodes={g.names} PriorityTier=1 MaxTime=INFINITE State=UP"
          for g in node_groups(cfg) if g.partition),
        f"PartitionName=debug Nodes={nodes} Default=YES PriorityTier=1 MaxTime=INFINITE State=UP",
        f"PartitionName=high Nodes={nodes} PriorityTier=10 MaxTime=INFINITE State=UP",
        "",
    ]
    return "\n".join(lines)


def _node_line(cfg: ClusterConfig, g: NodeGroup, shards_per_gpu: int = 0) -> str:
    first, last = FIRST_SLURMD_PORT + g.first - 1, FIRST_SLURMD_PORT + g.last - 1
    ports = str(first) if first == last else f"[{first}-{last}]"
    shards = f",shard:{cfg.gpus * shards_per_gpu}" if g.gres and shards_per_gpu else ""
    gres = f" Gres={g.gres}{shards}" if g.gres else ""
    return (f"NodeName={g.names} NodeHostname={cfg.hostname} NodeAddr=127.0.0.1 Port={ports} "
            f"CPUs={cfg.cpus} Sockets={cfg.sockets} CoresPerSocket={cfg.cpus // cfg.sockets} ThreadsPerCore=1 "
            f"RealMemory={cfg.mem_mb}{gres} State=UNKNOWN")


def render_gres_conf(cfg: ClusterConfig, shards_per_gpu: int = 0) -> str:
    head = "# Written by `hetrun cluster up`: emulated GPUs (empty files) for scheduling only.\n"
    if not cfg.gpus:
        return head
    files = fake_gpu_files(cfg)
    file_spec = str(files[0]) if cfg.gpus == 1 else (
        f"{cfg.directory}/fakegpu/gpu[0-{cfg.gpus - 1}]"
    )
    lines = []
    for g in node_groups(cfg):
        if g.gres:
            gpu_type = g.gres.split(":")[1] if g.gres.count(":") == 2 else None
            lines.append(f"NodeName={g.names} Name=gpu" + (f" Type={gpu_type}" if gpu_type else "")
                         + f" File={file_spec}\n")
            if shards_per_gpu:  # shards on the GPUs' own files: a job's shards name its GPU
                lines.append(f"NodeName={g.names} Name=shard Count={cfg.gpus * shards_per_gpu} "
                             f"File={file_spec}\n")
    return head + "".join(lines)


def render_mpi_conf() -> str:
    """mpi/pmix settings for every job on the local cluster, not only those
    hetrun renders. Slurm 22.05's default 'mixed' fences end MPI_Init with a
    tree-collective barrier that let a het-step rank leave while a peer was
    still in its modex fence; the peer then segfaulted on the first message
    (seen in CI, about 1 start in 12 under load). Ring fences keep MPI_Init a
    real barrier. Rendered sbatch scripts also export SLURM_PMIX_FENCE=ring,
    for clusters configured otherwise."""
    return "# Written by `hetrun cluster up`.\nPMIxCollFence=ring\n"


def render_slurmdbd_conf(cfg: ClusterConfig, db_password: str) -> str:
    d = cfg.directory
    return "\n".join(
        [
            "# Written by `hetrun cluster up`.",
            "AuthType=auth/munge",
            "DbdHost=localhost",
            f"DbdPort={SLURMDBD_PORT}",
            "SlurmUser=root",
            "StorageType=accounting_storage/mysql",
            "StorageHost=localhost",
            "StorageUser=slurm",
            f"StoragePass={db_password}",
            "StorageLoc=slurm_acct_db",
            f"LogFile={d}/log/slurmdbd.log",
            f"PidFile={d}/run/slurmdbd.pid",
            "",
        ]
    )


# How long a requeue nudge's watcher waits at most: the job's completion (KillWait=30 and
# slurmd's checks) plus Slurm's hold (cred_expire + 1) or a begin time hetrun set, with room.
NUDGE_MAX_WAIT_S = 300


def render_requeue_nudge(cfg: ClusterConfig) -> str:
    """The EpilogSlurmctld that nudges the backfill scheduler when a requeued het job's begin
    time passes (slurm_plugin/templates/requeue_nudge.sh says why). Absolute paths: slurmctld
    runs its epilog with an environment of the job's variables only, no PATH."""
    template = resources.files("hetrun.slurm_plugin").joinpath("templates/requeue_nudge.sh").read_text()
    tools = {}
    for tool in ("scontrol", "setsid", "flock"):
        found = shutil.which(tool)
        if found is None:
            raise SlurmError(f"local cluster: `{tool}` is not on PATH; the requeue nudge (EpilogSlurmctld) needs it",
                             hint="install Slurm's client commands and util-linux (bash scripts/setup.sh)")
        tools[tool] = found
    fields = {"@SCONTROL@": tools["scontrol"], "@SETSID@": tools["setsid"], "@FLOCK@": tools["flock"],
              "@LOCKS@": str(cfg.directory / "run"),
              "@LOG@": str(cfg.directory / "log" / "requeue_nudge.log"), "@MAX_WAIT_S@": str(NUDGE_MAX_WAIT_S)}
    for key, value in fields.items():
        template = template.replace(key, shlex.quote(value))
    return template


def render_task_prolog(env: dict[str, str] | None = None) -> str:
    # slurmd reads "export NAME=value" lines from the TaskProlog's stdout and
    # puts them into the task's environment.
    lines = [
        "#!/bin/sh",
        "# Written by `hetrun cluster up`: loopback MPI settings for every task on the local cluster.",
    ]
    for name, value in (env or TASK_ENV).items():
        lines.append(f"echo {shlex.quote(f'export {name}={value}')}")
    return "\n".join(lines) + "\n"
