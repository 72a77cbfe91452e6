"""What a policy wants the cluster to look like, in Slurm's own objects.

- one QOS per tier: Priority spaced by rank (first = highest), and with
  ``preemption: true`` a ``Preempt`` list of every lower tier and
  ``PreemptMode=requeue``; ``DenyOnLimit`` so a job over a Max* limit is
  refused at submission instead of pending forever; with ``checkpointed`` a
  second QOS ``<tier>_ckpt`` per tier, just below it, with an optional
  ``GraceTime`` (preemption by work lost: ``ckpt_priority``), and with its
  ``spare_plain`` the ``Preempt`` lists name only the lower tiers' ``_ckpt`` QOS
  (``preempt_list``: plain jobs are never preempted);
- one account per team with its association limits (GrpTRES = quota,
  MaxWall, Fairshare, allowed QOS, DefaultQOS = the default
  tier) and one user association per listed user, whose own GrpTRES is
  the account's per-user cap (associations have no MaxTRESPerUser);
- the slurm.conf settings the policy needs (``ConfSetting``), partition
  settings for time slicing, and fragments ``apply`` does not write because
  they describe hardware (gres.conf shards, cgroup.conf for the nodes' cgroup
  version); ``hetrun cluster up --policy`` writes them for the local cluster.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hetrun.dag import validators as v
from hetrun.slurm_plugin.policy.isolation import (
    CgroupSupport,
    isolation_problem,
    render_cgroup_conf,
)
from hetrun.slurm_plugin.policy.model import PolicySpec, TierLimits
from hetrun.slurm_plugin.policy.state import AssocState, QosState

# Priority distance between adjacent tiers: large enough that with
# PriorityWeightQOS dominating the other weights a higher tier always wins.
TIER_PRIORITY_STEP = 1000
# How far below its tier a ``<tier>_ckpt`` QOS sits (scheduling.checkpointed): a tenth of a step,
# so the tiers' order is untouched and checkpointing jobs are the first preemption candidates.
CKPT_PRIORITY_GAP = TIER_PRIORITY_STEP // 10


@dataclass(frozen=True)
class ConfSetting:
    """A slurm.conf key. ``contains``: a comma list that must include these items
    (others already there stay, e.g. SlurmdParameters=config_overrides)."""

    key: str
    value: str
    why: str
    contains: bool = False


@dataclass
class DesiredState:
    qos: dict[str, QosState]
    assocs: dict[tuple[str, str], AssocState]
    conf: list[ConfSetting]
    partitions: dict[str, dict[str, str]]
    manual: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # the policy cannot run on these nodes


def tier_priority(policy: PolicySpec, rank: int, tier: str) -> int:
    limits = policy.tiers.get(tier)
    if limits is not None and limits.priority is not None:
        return limits.priority
    return (len(policy.tier_names) - rank) * TIER_PRIORITY_STEP


def tier_qos_names(policy: PolicySpec, tiers: list[str]) -> tuple[str, ...]:
    """The QOS of ``tiers``: each tier's own, and its ``<tier>_ckpt`` with ``checkpointed``."""
    names = [policy.qos_name(t) for t in tiers]
    if policy.checkpointed is not None:
        names += [policy.ckpt_qos_name(t) for t in tiers]
    return tuple(sorted(names))


def preempt_list(policy: PolicySpec, rank: int) -> tuple[str, ...]:
    """The ``Preempt=`` list of the QOS of the tier at ``rank`` (both of its QOS): with
    ``preemption`` every lower tier's QOS; with ``checkpointed.spare_plain`` only their
    ``<tier>_ckpt`` QOS (plain jobs are never preempted)."""
    if not policy.preemption:
        return ()
    lower = policy.tier_names[rank + 1:]
    ckpt = policy.checkpointed
    if ckpt is not None and ckpt.spare_plain:
        return tuple(sorted(policy.ckpt_qos_name(t) for t in lower))
    return tier_qos_names(policy, lower)


def preemption_sets(policy: PolicySpec, tier: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """For a job of ``tier`` (either of its QOS): the QOS its QOS may preempt (``preempt_list``,
    as rendered) and, of those, the ``<tier>_ckpt`` ones whose jobs stop at an agreed step:
    ``placement.Need.preempts`` / ``stops_clean``."""
    names = policy.tier_names
    lower = preempt_list(policy, names.index(tier))
    clean = tuple(q for q in lower if policy.checkpointed is not None
                  and q in {policy.ckpt_qos_name(t) for t in names})
    return lower, clean


def ckpt_priority(policy: PolicySpec, rank: int, tier: str) -> int:
    """The ``<tier>_ckpt`` QOS Priority: below the tier's own (preempt/qos takes candidates in
    rising QOS priority, so checkpointing jobs go first), above the next tier down (the tiers'
    scheduling order holds): CKPT_PRIORITY_GAP below, or half way to the next tier when closer."""
    names = policy.tier_names
    own = tier_priority(policy, rank, tier)
    below = tier_priority(policy, rank + 1, names[rank + 1]) if rank + 1 < len(names) else 0
    return own - min(CKPT_PRIORITY_GAP, (own - below) // 2)


def _qos_for_tier(policy: PolicySpec, rank: int, tier: str, ckpt: bool = False) -> QosState:
    limits = policy.tiers.get(tier) or TierLimits.model_validate({})
    lower = preempt_list(policy, rank)
    priority = ckpt_priority(policy, rank, tier) if ckpt else tier_priority(policy, rank, tier)
    wall = v.time_seconds(str(limits.max_wall)) if limits.max_wall is not None else None
    grace = (policy.checkpointed.grace_time or 0) if ckpt and policy.checkpointed else 0
    return QosState(
        name=policy.ckpt_qos_name(tier) if ckpt else policy.qos_name(tier),
        priority=priority,
        preempt=lower,
        preempt_mode="requeue" if policy.preemption else "cluster",
        max_wall=wall,
        grp_tres=limits.grp_tres.as_slurm() if limits.grp_tres else {},
        max_tres_per_user=limits.max_tres_per_user.as_slurm() if limits.max_tres_per_user else {},
        flags=("DenyOnLimit",),
        grace_time=grace,
    )


def _ckpt_problems(policy: PolicySpec) -> list[str]:
    out = []
    for i, tier in enumerate(policy.tier_names):
        own, ckpt = tier_priority(policy, i, tier), ckpt_priority(policy, i, tier)
        if ckpt >= own:
            out.append(f"scheduling.checkpointed: tier {tier!r} (priority {own}) has no room below it for "
                       f"{policy.ckpt_qos_name(tier)}; space the tiers' priorities at least 2 apart")
    return out


def _assocs(policy: PolicySpec) -> dict[tuple[str, str], AssocState]:
    out: dict[tuple[str, str], AssocState] = {}
    for name, acct in policy.accounts.items():
        tiers = acct.tiers if acct.tiers is not None else policy.tier_names
        qos = tier_qos_names(policy, tiers)
        default = policy.default_tier if policy.default_tier in tiers else (tiers[-1] if tiers else None)
        state = AssocState(
            account=name,
            fairshare=acct.fairshare,
            grp_tres=acct.quota.as_slurm() if acct.quota else {},
            max_wall=v.time_seconds(str(acct.max_wall)) if acct.max_wall is not None else None,
            qos=qos,
            default_qos=policy.qos_name(default) if default else "",
            parent=acct.parent or "root",
        )
        out[(name, "")] = state
        per_user = acct.max_per_user.as_slurm() if acct.max_per_user else {}
        for user in acct.users:
            # A user association inherits the account's QOS (sacctmgr copies it,
            # checked live); its own GrpTRES is the per-user cap in this account.
            out[(name, user)] = AssocState(account=name, user=user, grp_tres=per_user, qos=qos,
                                           default_qos=state.default_qos)
    return out


def _conf(policy: PolicySpec, reserve: int | None = None) -> list[ConfSetting]:
    conf: list[ConfSetting] = []
    if policy.tier_names or policy.accounts:
        w = policy.priority_weights
        conf += [
            ConfSetting("PriorityType", "priority/multifactor", "tiers order jobs by QOS priority"),
            ConfSetting("PriorityWeightQOS", str(w.qos), "priority_weights.qos"),
            ConfSetting("PriorityWeightFairshare", str(w.fairshare), "priority_weights.fairshare"),
            ConfSetting("PriorityWeightAge", str(w.age), "priority_weights.age"),
            ConfSetting("PriorityWeightJobSize", str(w.job_size), "priority_weights.job_size"),
            ConfSetting("AccountingStorageEnforce", "associations,limits,qos,safe",
                        "quotas (GrpTRES, MaxTRESPerUser, MaxWall) are enforced only with limits,qos", True),
            ConfSetting("JobSubmitPlugins", "lua", "job_submit.lua: default tier, quota refusal, hetrun classes"),
        ]
    if policy.preemption:
        mode = "REQUEUE,GANG" if policy.time_slicing else "REQUEUE"
        conf += [
            ConfSetting("PreemptType", "preempt/qos", "tiers preempt through their QOS Preempt lists"),
            ConfSetting("PreemptMode", mode, "preempted jobs are requeued (hetrun resumes them)"),
            ConfSetting("JobRequeue", "1", "batch jobs are requeueable by default"),
        ]
    elif policy.time_slicing:
        conf.append(ConfSetting("PreemptMode", "GANG", "gang scheduling for time slicing"))
    if policy.time_slicing:
        conf.append(ConfSetting("SchedulerTimeSlice", str(policy.time_slicing.slice_seconds),
                                "time_slicing.slice_seconds"))
    conf += _isolation_conf(policy)
    conf += _gres_conf(policy)
    conf += _backfill_conf(policy, reserve)
    if policy.power:
        conf += [
            ConfSetting("SuspendTime", str(v.time_seconds(str(policy.power.idle_after))), "power.idle_after"),
            ConfSetting("SuspendProgram", policy.power.suspend_program, "power.suspend_program"),
            ConfSetting("ResumeProgram", policy.power.resume_program, "power.resume_program"),
        ]
    return conf


def _isolation_conf(policy: PolicySpec) -> list[ConfSetting]:
    iso = isolation_of(policy)
    if iso == "none":
        return []
    conf = [
        ConfSetting("ProctrackType", "proctrack/cgroup", "cpu.isolation: track tasks in cgroups"),
        ConfSetting("TaskPlugin", "task/cgroup,task/affinity" if iso == "numa-aware" else "task/cgroup",
                    "cpu.isolation: confine (cgroup) and bind (affinity) tasks"),
    ]
    if iso == "numa-aware":
        conf += [
            ConfSetting("TaskPluginParam", "autobind=sockets", "bind each task to one socket (= NUMA domain)"),
            ConfSetting("SlurmdParameters", "numa_node_as_socket",
                        "count NUMA nodes as sockets where a socket holds several", True),
        ]
    return conf


def _gres_conf(policy: PolicySpec) -> list[ConfSetting]:
    gpu = policy.resources.gpu
    if gpu is None:
        return []
    tres = ["gres/gpu", *(f"gres/gpu:{t.lower()}" for t in gpu.type)]
    if gpu.sharing:
        tres.append("gres/shard")
    conf = [ConfSetting("AccountingStorageTRES", ",".join(tres), "quotas per GPU type need these TRES", True)]
    if gpu.sharing:
        conf.append(ConfSetting("GresTypes", "gpu,shard", "GPU sharing through GRES shards", True))
    return conf


def min_reserve_priority(policy: PolicySpec, tier: str) -> tuple[int, str | None]:
    """bf_min_prio_reserve for ``scheduling.backfill.min_reserve_tier: tier``: one more than
    the highest priority a job of a lower tier can have (its QOS share of PriorityWeightQOS,
    plus full age, fairshare and job-size factors), and a problem when a job of ``tier`` could
    fall below it. Slurm normalizes QOS priority by the highest QOS Priority in slurmdbd: this
    assumes the policy's own top tier is that one (apply sees the live QOS; plan warns nowhere)."""
    names, w = policy.tier_names, policy.priority_weights
    prios = [tier_priority(policy, i, t) for i, t in enumerate(names)]
    top, rank = max(prios) or 1, names.index(tier)
    below = [w.qos * p // top + w.age + w.fairshare + w.job_size for p in prios[rank + 1:]]
    if not below:
        return 0, None  # the lowest tier: every job reserves, Slurm's default
    threshold = max(below) + 1
    lowest_reserving = min(w.qos * p // top for p in prios[:rank + 1])
    if lowest_reserving >= threshold:
        return threshold, None
    return threshold, (f"scheduling.backfill.min_reserve_tier {tier!r}: a job of a lower tier can reach priority "
                       f"{threshold - 1} (QOS + age + fairshare + job_size weights), a {tier} job can be as low as "
                       f"{lowest_reserving}; raise priority_weights.qos or space the tiers' priorities further")


def _backfill_conf(policy: PolicySpec, reserve: int | None) -> list[ConfSetting]:
    """``reserve``: bf_min_prio_reserve (``min_reserve_priority``, computed once by ``desired_state``)."""
    sched = policy.resources.gpu.scheduling if policy.resources.gpu else None
    backfill = sched.backfill if sched else None
    if backfill is None:
        return []
    items = []
    if reserve is not None:
        items.append(f"bf_min_prio_reserve={reserve}")
    if backfill.busy_nodes:
        items.append("bf_busy_nodes")
    why = "scheduling.backfill: fewer idle nodes held for pending jobs"
    return [ConfSetting("SchedulerParameters", ",".join(items), why, True)] if items else []


def _manual(policy: PolicySpec, cgroup: CgroupSupport | None) -> list[str]:
    out = []
    gpu = policy.resources.gpu
    if gpu and gpu.sharing:
        k = gpu.sharing.shards_per_gpu
        out.append(f"# gres.conf, per node with N GPUs: {k} shards per GPU, on the GPUs' own files\n"
                   f"NodeName=<nodes> Name=shard Count=<N*{k}> File=<the GPU device files>\n"
                   f"# slurm.conf node lines: Gres=gpu:<type>:<N>,shard:<N*{k}>")
    if isolation_of(policy) != "none":
        out.append("# cgroup.conf, next to slurm.conf on every node\n" + render_cgroup_conf(cgroup).rstrip())
    return out


def isolation_of(policy: PolicySpec) -> str:
    return policy.resources.cpu.isolation if policy.resources.cpu else "none"


def desired_state(policy: PolicySpec, cgroup: CgroupSupport | None = None) -> DesiredState:
    """``cgroup``: the nodes' cgroup support (``isolation.detect_cgroup``); None = not
    checked (an off-line plan): cgroup.conf then lets Slurm autodetect the version."""
    qos = {policy.qos_name(t): _qos_for_tier(policy, i, t) for i, t in enumerate(policy.tier_names)}
    if policy.checkpointed is not None:
        qos.update({policy.ckpt_qos_name(t): _qos_for_tier(policy, i, t, ckpt=True)
                    for i, t in enumerate(policy.tier_names)})
    parts: dict[str, dict[str, str]] = {}
    if policy.time_slicing:
        parts[policy.time_slicing.partition] = {
            "OverSubscribe": f"FORCE:{policy.time_slicing.jobs_per_core}"}
    problems = [isolation_problem(isolation_of(policy), cgroup) if cgroup else None]
    if policy.checkpointed is not None:
        problems += _ckpt_problems(policy)
    sched = policy.resources.gpu.scheduling if policy.resources.gpu else None
    reserve = None
    if sched and sched.backfill and sched.backfill.min_reserve_tier is not None:
        reserve, problem = min_reserve_priority(policy, sched.backfill.min_reserve_tier)
        problems.append(problem)
    return DesiredState(qos, _assocs(policy), _conf(policy, reserve), parts, _manual(policy, cgroup),
                        [p for p in problems if p])
