"""An experiment of the trace replay (``pool_trace_replay.py --spare-plain --young-plain T``, issue 21,
session 37): plain jobs spared unless they are young.

With ``spare_plain`` a tier preempts only checkpointing jobs and waits where plain jobs hold the
nodes it needs. Here each tier with tiers below it gets one more QOS, ``<tier QOS>_young``: the
tier's priority, ``Preempt=`` every lower QOS (plain, ``_ckpt`` and ``_young``). Placement asks for
it where the job cannot start without preempting a plain job, and every plain job it would take
has run at most T s (``placement.Need.young_s``); it then names their nodes (``--nodelist``) so that
Slurm takes those. Otherwise the job asks for its tier's own QOS and waits, as under spare_plain.

Not a product setting: the QOS are added with sacctmgr after ``hetrun policy apply``, and a user
could ask for a ``_young`` QOS by hand (preempting old plain jobs too). It runs to learn whether
the middle ground holds both issue-21 figures (benchmarks/pool.md, session 37).
"""

from __future__ import annotations

from typing import Any

import yaml
from hetrun.slurm_plugin.policy.desired import tier_priority, tier_qos_names
from hetrun.slurm_plugin.policy.model import validate_policy_data

SUFFIX = "_young"


def _spec(policy_text: str) -> Any:
    return validate_policy_data(yaml.safe_load(policy_text))


def young_qos(policy_text: str) -> dict[str, tuple[str, int, tuple[str, ...]]]:
    """tier -> (its ``_young`` QOS, priority, Preempt list), for every tier with tiers below it,
    the lowest first (a QOS's Preempt list may only name QOS that exist)."""
    spec = _spec(policy_text)
    names = spec.tier_names
    out: dict[str, tuple[str, int, tuple[str, ...]]] = {}
    for rank in range(len(names) - 2, -1, -1):
        tier, lower = names[rank], names[rank + 1:]
        preempt = tier_qos_names(spec, lower) + tuple(out[t][0] for t in lower if t in out)
        out[tier] = (spec.qos_name(tier) + SUFFIX, tier_priority(spec, rank, tier), tuple(sorted(preempt)))
    return out


def young_sets(policy_text: str, tiers: tuple[str, ...] = ()) -> dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]]:
    """tier -> (its ``_young`` QOS, what that may preempt, those of them that stop clean: the ``_ckpt``
    ones), for ``tiers`` (empty: every tier with tiers below it); the other tiers wait as under spare_plain."""
    spec = _spec(policy_text)
    ckpt = {spec.ckpt_qos_name(t) for t in spec.tier_names}
    return {tier: (name, pre, tuple(q for q in pre if q in ckpt))
            for tier, (name, _p, pre) in young_qos(policy_text).items() if not tiers or tier in tiers}


def sacctmgr_argvs(policy_text: str, account: str, user: str = "root") -> list[list[str]]:
    """The sacctmgr calls that add the ``_young`` QOS and allow them to ``account`` (and its user)."""
    qos = young_qos(policy_text)
    out = [["sacctmgr", "-i", "add", "qos", name, f"priority={prio}", f"preempt={','.join(pre)}",
            "preemptmode=requeue", "flags=DenyOnLimit"] for name, prio, pre in qos.values()]
    names = ",".join(name for name, _p, _pre in qos.values())
    out.append(["sacctmgr", "-i", "modify", "account", "where", f"name={account}", "set", f"qos+={names}"])
    out.append(["sacctmgr", "-i", "modify", "user", "where", f"name={user}", f"account={account}", "set",
                f"qos+={names}"])
    return out
