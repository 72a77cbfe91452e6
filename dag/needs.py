"""What each het component needs from a node, derived from its actions' resource
profiles: the input of fitness-matched placement (``placement: auto``).

Pure Python (no Slurm here): ``hetrun.slurm_plugin.placement`` turns a
``ComponentNeed`` into its ``Need`` and scores it against the live pool.

- CPUs, GPUs and memory per node: the peak of the component's action profiles
  (``actions.<type>.cpu/gpu/memory``; by default the component's own request),
  times the ranks on a node, and never below what the component asks Slurm for;
- GPU memory per GPU: the largest ``gpu_memory`` an action holds per rank, times
  the ranks sharing a GPU (or ``gpu_mem``, when larger): a GPU type known to be
  smaller loses the candidate (``slurm_plugin.placement.GPU_MEMORY_MB``);
- network: what crosses node boundaries (gradient allreduce, the MoE
  all-to-all, rollouts and weights between components), as words for
  ``hetrun plan --explain`` and as ``cross_node``, a weight placement charges
  per node a component is spread over (the pool has no topology to score);
- ``node_counts:`` (auto only): the same needs at each node count the
  component may be spread over, its ranks, GPUs and memory in total fixed
  (``by_count``; ``reshaped`` is the component at such a count).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from hetrun.dag.action import ResourceProfile
from hetrun.dag.spec import ComponentSpec, JobSpec


@dataclass(frozen=True)
class ComponentNeed:
    component: str
    placement: str  # fixed | auto | ranked
    nodes: int
    cpus_per_node: int
    gpus_per_node: int
    mem_mb_per_node: int
    gpu_mem_mb_per_gpu: int  # 0: not known (no gpu_mem and no action says)
    partitions: tuple[str, ...] = ()  # allowed; empty = any
    gpu_types: tuple[str, ...] = ()  # allowed; empty = any
    network: tuple[str, ...] = ()
    derived: tuple[str, ...] = field(default=(), compare=False)  # where each number came from
    cross_node: float = 0.0  # weight of the traffic that crosses nodes (0: none depends on the node count)
    node_counts: tuple[int, ...] = ()  # counts it may be spread over (node_counts:); empty = nodes only
    by_count: tuple[ComponentNeed, ...] = field(default=(), compare=False)  # its needs at each of node_counts

    def at_each_count(self) -> tuple[ComponentNeed, ...]:
        """The shapes placement scores: one per allowed node count, or itself."""
        return self.by_count or (self,)


def _peak(profiles: list[ResourceProfile]) -> ResourceProfile | None:
    peak = None
    for p in profiles:
        peak = p if peak is None else peak.merged(p)
    return peak


# Relative weight of traffic per node a component spreads over: the MoE all-to-all
# sends every token's activations across, an allreduce the gradients once per step.
ALLREDUCE_WEIGHT = 1.0
ALLTOALL_WEIGHT = 2.0


def _network(spec: JobSpec, comp: ComponentSpec) -> tuple[tuple[str, ...], float]:
    ranks = comp.ntasks
    out, weight = [], 0.0
    across = f"across {comp.nodes} nodes" if comp.nodes > 1 else "inside one node"
    if "backward" in comp.actions and ranks > 1:
        out.append(f"gradient allreduce over {ranks} ranks {across}")
        weight += ALLREDUCE_WEIGHT
    experts = spec.workload_args.get("num_experts") if isinstance(spec.workload_args, dict) else None
    if "forward" in comp.actions and isinstance(experts, int) and experts > 1 and ranks > 1:
        out.append(f"MoE all-to-all of {experts} experts over {ranks} ranks {across} "
                   f"(codecs {spec.comms.forward_codec}/{spec.comms.backward_codec})")
        weight += ALLTOALL_WEIGHT
    if "rollout" in comp.actions:
        out.append("rollouts to the learner, policy weights back (between components)")
    if "eval" in comp.actions and "optimize" not in comp.actions:
        out.append("weights from the learner (between components)")
    return tuple(out), weight


def split_over(nodes: int, tasks_per_node: int, gpus_per_node: int, mem_mb: int, count: int) -> tuple[int, int, int]:
    """``(tasks_per_node, gpus_per_node, mem_mb)`` of a component of ``nodes`` nodes spread over
    ``count``: the same ranks, GPUs and memory in total (ranks and GPUs divide, as the spec
    checked; memory per node rounds up)."""
    return nodes * tasks_per_node // count, nodes * gpus_per_node // count, -(-mem_mb * nodes // count)


def reshaped(comp: ComponentSpec, nodes: int) -> ComponentSpec:
    """``comp`` spread over ``nodes`` nodes (``split_over``)."""
    if nodes == comp.nodes:
        return comp
    tpn, gpn, mem = split_over(comp.nodes, comp.tasks_per_node, comp.gpus_per_node, comp.mem_mb, nodes)
    return comp.model_copy(update={"nodes": nodes, "tasks_per_node": tpn, "gpus_per_node": gpn, "mem": f"{mem}M"})


def component_need(spec: JobSpec, name: str, profiles: list[ResourceProfile] | None = None) -> ComponentNeed:
    """``name``'s per-node needs; ``profiles``: its actions' (default: the spec's expanded template)."""
    comp = spec.components[name]
    if profiles is None:
        profiles = _profiles_of(spec).get(name, [])
    need = _need_of(spec, name, comp, profiles)
    if not comp.node_counts:
        return need
    by_count = tuple(_need_of(spec, name, reshaped(comp, n), profiles) for n in comp.node_counts)
    return replace(need, node_counts=tuple(comp.node_counts), by_count=by_count)


def _need_of(spec: JobSpec, name: str, comp: ComponentSpec, profiles: list[ResourceProfile]) -> ComponentNeed:
    peak = _peak(profiles)
    per_node = comp.tasks_per_node
    cpus, gpus, mem = comp.tasks_per_node * comp.cpus_per_task, comp.gpus_per_node, comp.mem_mb
    gpu_mem = comp.gpu_mem_per_task_mb or 0
    derived = [f"requested: {comp.tasks_per_node} ranks x {comp.cpus_per_task} CPUs, {gpus} GPUs, {mem} MB"]
    if peak is not None:
        cpus = max(cpus, peak.cpu * per_node)
        if peak.gpu > comp.gpus_per_task:  # gpus_per_task rounds up where ranks share a GPU: not a need
            gpus = max(gpus, peak.gpu * per_node)
        mem = max(mem, peak.memory_mb * per_node)
        ranks_per_gpu = -(-per_node // gpus) if gpus else 0
        gpu_mem = max(gpu_mem, peak.gpu_memory_mb * ranks_per_gpu)
        derived.append(f"action peak per rank: {peak.cpu} CPUs, {peak.gpu} GPUs, {peak.memory_mb} MB, "
                       f"{peak.gpu_memory_mb} MB GPU memory ({len(profiles)} actions)")
    if comp.gpu_mem is not None and gpus:
        from hetrun.dag.validators import mem_to_mb

        gpu_mem = max(gpu_mem, mem_to_mb(comp.gpu_mem))
    partitions = tuple(comp.partitions)
    if not partitions and spec.slurm.partition:
        # slurm.partition may itself be a list ("debug,high"): Slurm's own choice among several.
        partitions = tuple(spec.slurm.partition.split(","))
    network, cross = _network(spec, comp)
    return ComponentNeed(name, comp.placement, comp.nodes, cpus, gpus, mem, gpu_mem if gpus else 0,
                         partitions, tuple(comp.gpu_types), network, tuple(derived), cross)


def _profiles_of(spec: JobSpec) -> dict[str, list[ResourceProfile]]:
    if spec.training is None:  # command components: no actions, their request is the need
        return {}
    from hetrun.dag.expand import expand

    out: dict[str, list[ResourceProfile]] = {}
    for a in expand(spec):
        out.setdefault(a.component, []).append(a.resource_profile)
    return out


def component_needs(spec: JobSpec) -> dict[str, ComponentNeed]:
    """Every component's needs, in het group order."""
    profiles = _profiles_of(spec)
    return {name: component_need(spec, name, profiles.get(name, [])) for name in spec.components}
