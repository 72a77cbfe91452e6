"""Quota left for the submitting user, as Slurm holds it: the limits of placement.

Limits are read from Slurm, not from a policy YAML, so they hold for a pool set
up with plain ``sacctmgr`` too: ``scontrol show config`` first (the cluster's
name, and whether ``AccountingStorageEnforce`` enforces limits at all: if not,
nothing is read or checked), then one ``sacctmgr show assoc`` and one ``sacctmgr
show qos`` (at once), and the default account from slurmctld's ``scontrol show
assoc_mgr`` only when the job names none. What is in use now comes from the pool
snapshot's running jobs (``squeue --json``: each job's allocated TRES with its
account, user and QOS).

The limits that bind one job of user U in account A under QOS Q, as Slurm
enforces them with ``AccountingStorageEnforce=limits``:

- ``GrpTRES`` of A's association and of every parent account (all their jobs);
- ``GrpTRES`` of U's association under A (the policy's per-user cap);
- ``GrpTRES`` of Q (all jobs in the QOS) and ``MaxTRESPerUser`` of Q (U's jobs in it).

Partition QOS and ``MaxTRESPerAccount`` are not read (not modelled). A QOS name
sacctmgr does not know (a policy tier or hetrun class, which job_submit.lua maps onto
its QOS only at submission) is not checked, and ``Quotas.notes`` says so.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from hetrun.slurm_plugin.policy.state import (
    ASSOC_FORMAT,
    QOS_FORMAT,
    parse_assocs,
    parse_config,
    parse_qos,
)
from hetrun.slurm_plugin.pool import RunningUse

from hetrun.errors import SlurmError

Runner = Callable[[Sequence[str]], str]
NEAR_FROM = 0.5  # a candidate that would bring a limit past this share of it starts to lose points
_LABELS = {"cpu": "CPUs", "mem": "MB of memory", "node": "nodes", "gres/gpu": "GPUs"}


@dataclass
class QuotaLimit:
    """One binding limit (``scope`` in words) and what the jobs it counts use now."""

    scope: str  # "account physics", "user alice in account physics", "QOS normal", "QOS normal per user alice"
    limits: dict[str, int]  # TRES -> maximum (mem in MB), as sacctmgr prints GrpTRES / MaxTRESPU
    used: dict[str, int] = field(default_factory=dict)  # by the running jobs
    taken: dict[str, int] = field(default_factory=dict)  # by this job's components placed before


@dataclass
class Quotas:
    user: str
    account: str | None
    qos: str | None
    limits: list[QuotaLimit] = field(default_factory=list)
    unavailable: str | None = None  # why no limit could be read (then nothing is checked)
    notes: list[str] = field(default_factory=list)  # limits read but not checked, and why (each candidate says so)
    # The QOS the job's QOS may preempt (its Preempt= list) and those of them whose jobs stop
    # clean at an agreed step: placement's Need.preempts / stops_clean (preemption_of).
    preempts: tuple[str, ...] = ()
    stops_clean: tuple[str, ...] = ()

    def alone(self) -> Quotas:
        """The same limits with nothing else running: what this job (its components placed
        so far included) could ever get once the others' jobs end."""
        return Quotas(self.user, self.account, self.qos,
                      [QuotaLimit(lim.scope, lim.limits, {}, dict(lim.taken)) for lim in self.limits], notes=self.notes,
                      preempts=self.preempts, stops_clean=self.stops_clean)

    def take(self, tres: Mapping[str, int]) -> None:
        """Count ``tres`` as in use under every limit (a sibling component placed before)."""
        for lim in self.limits:
            for key, n in tres.items():
                lim.taken[key] = lim.taken.get(key, 0) + n


def label(key: str) -> str:
    if key.startswith("gres/gpu:"):
        return f"{key.split(':', 1)[1]} GPUs"
    return _LABELS.get(key, key)


def job_tres(nodes: int, cpus_per_node: int, gpus_per_node: int, mem_mb_per_node: int, gres: str) -> dict[str, int]:
    """The TRES Slurm counts for a job of this shape on GRES group ``gres`` (``gpu:a100``, ``gpu`` or ``-``)."""
    out = {"node": nodes, "cpu": nodes * cpus_per_node, "mem": nodes * mem_mb_per_node}
    if gpus_per_node:
        out["gres/gpu"] = nodes * gpus_per_node
        gtype = gres.partition(":")[2]
        if gtype:
            out[f"gres/gpu:{gtype.lower()}"] = nodes * gpus_per_node
    return out


def check(quotas: Quotas | None, need: Mapping[str, int]) -> tuple[str | None, float, list[str]]:
    """``(why it is out, fullest share after it, reasons)`` for a job needing ``need``.
    Out: some limit would be exceeded ("over quota: ..."). The share is the largest
    (in use + need) / limit over every TRES a limit names (0.0 without limits)."""
    if quotas is None or not quotas.limits:
        return None, 0.0, list(quotas.notes) if quotas else []
    fullest, reasons = 0.0, []
    for lim in quotas.limits:
        for key, cap in sorted(lim.limits.items()):
            want = need.get(key, 0)
            if not want:
                continue
            mine = lim.taken.get(key, 0)
            used = lim.used.get(key, 0) + mine
            if used + want > cap:
                ours = f" ({mine} by this job's other components)" if mine else ""
                what = (f"has {used} of {cap} {label(key)} in use{ours}, this needs {want}" if used else
                        f"allows {cap} {label(key)}, this needs {want}")
                return f"over quota: {lim.scope} {what}", (used + want) / max(cap, 1), []
            share = (used + want) / max(cap, 1)
            if share > fullest:
                fullest = share
                reasons = [f"quota: {lim.scope} at {used + want} of {cap} {label(key)} with it ({100 * share:.0f}%)"]
    return None, fullest, reasons + quotas.notes


# ------------------------------------------------------------------ reading Slurm


def running_in(uses: Iterable[RunningUse], *, accounts: set[str] | None = None, user: str | None = None,
               qos: str | None = None) -> dict[str, int]:
    """TRES allocated to the running jobs that match (None: any)."""
    out: dict[str, int] = {}
    for u in uses:
        if (accounts is not None and u.account not in accounts) or (user is not None and u.user != user) \
                or (qos is not None and u.qos != qos):
            continue
        for key, n in _lower(u.tres).items():
            out[key] = out.get(key, 0) + n
    return out


def _lower(tres: Mapping[str, int]) -> dict[str, int]:
    """TRES names compared ignoring case (Slurm keeps a GRES type's spelling: gres/gpu:A100)."""
    return {k.lower(): n for k, n in tres.items()}


def limits_for(assoc_text: str, qos_text: str, uses: Sequence[RunningUse], user: str, account: str | None,
               qos: str | None) -> tuple[list[QuotaLimit], str | None]:
    """Every limit binding ``user`` in ``account`` under ``qos`` (None: the association's default QOS),
    from ``sacctmgr -n -P show assoc|qos`` text in hetrun's policy formats; and the QOS it used."""
    assocs = parse_assocs(assoc_text)
    qoses = parse_qos(qos_text)
    out: list[QuotaLimit] = []
    if account is not None:
        own = assocs.get((account, user))
        qos = qos or (own.default_qos if own else "") or ("normal" if "normal" in qoses else None)
        children: dict[str, set[str]] = {}
        for (acct, u), a in assocs.items():
            if not u and a.parent:
                children.setdefault(a.parent, set()).add(acct)
        if own and own.grp_tres:
            out.append(QuotaLimit(f"user {user} in account {account}", _lower(own.grp_tres),
                                  running_in(uses, accounts={account}, user=user)))
        acct, seen = account, set()
        while acct and acct not in seen:  # the account, then each parent: each GrpTRES counts its subtree
            seen.add(acct)
            row = assocs.get((acct, ""))
            if row is None:
                break
            if row.grp_tres:
                out.append(QuotaLimit(f"account {acct}", _lower(row.grp_tres),
                                      running_in(uses, accounts=_subtree(acct, children))))
            acct = row.parent
    q = qoses.get(qos or "")
    if q is not None and q.grp_tres:
        out.append(QuotaLimit(f"QOS {q.name}", _lower(q.grp_tres), running_in(uses, qos=q.name)))
    if q is not None and q.max_tres_per_user:
        out.append(QuotaLimit(f"QOS {q.name} per user {user}", _lower(q.max_tres_per_user),
                              running_in(uses, user=user, qos=q.name)))
    return out, qos


def unknown_qos(qos_text: str, qos: str | None) -> str | None:
    """The reason when the job's QOS is not one sacctmgr knows: no QOS limit of it is checked.
    A tier or hetrun class name (``slurm.qos: high``) reads so: the policy's job_submit.lua maps
    it onto the tier's QOS at submission, and that mapping is not known here."""
    if not qos or qos in parse_qos(qos_text):
        return None
    return (f"QOS {qos} unknown to sacctmgr: its limits not checked (a tier or class name is mapped onto "
            "its QOS only at submission, by the policy's job_submit.lua)")


def _subtree(root: str, children: Mapping[str, set[str]]) -> set[str]:
    out, todo = set(), [root]
    while todo:
        acct = todo.pop()
        if acct not in out:
            out.add(acct)
            todo += sorted(children.get(acct, ()))
    return out


def submitter() -> str:
    """The user Slurm will account the job to (sbatch's uid)."""
    return pwd.getpwuid(os.getuid()).pw_name


def default_account(assoc_mgr_text: str) -> str | None:
    """The account of the association ``scontrol show assoc_mgr flags=assoc users=U`` marks
    ``DefAssoc=Yes`` (slurmctld's own copy: no slurmdbd round trip)."""
    account = None
    for line in assoc_mgr_text.splitlines():
        fields = dict(tok.split("=", 1) for tok in line.split() if "=" in tok)
        if "ClusterName" in fields:
            account = fields.get("Account") or None
        elif fields.get("DefAssoc") == "Yes":
            return account
    return None


def enforced(config: Mapping[str, str]) -> bool:
    """Whether slurmctld enforces association / QOS limits (``AccountingStorageEnforce``
    with ``limits``, which ``safe`` implies); without it no limit holds a job back."""
    words = set(config.get("AccountingStorageEnforce", "").lower().split(","))
    return bool(words & {"limits", "safe"})


def read_quotas(run: Runner, uses: Sequence[RunningUse], *, account: str | None = None, qos: str | None = None,
                user: str | None = None) -> Quotas:
    """The submitter's limits and what counts against them now; ``run(argv) -> stdout``.
    ``Quotas.unavailable`` says why nothing is checked: a cluster without accounting, or
    one that does not enforce limits. The two sacctmgr calls (slurmdbd round trips) run at once."""
    user = user or submitter()
    try:
        config = parse_config(run(["scontrol", "show", "config"]))
        if not enforced(config):
            why = f"Slurm does not enforce limits (AccountingStorageEnforce={config.get('AccountingStorageEnforce')})"
            return Quotas(user, account, qos, unavailable=why)
        if account is None:
            account = default_account(run(["scontrol", "show", "assoc_mgr", "flags=assoc", f"users={user}"]))
        # One slurmdbd may serve several clusters: only this cluster's associations (as policy reads them).
        cluster = config.get("ClusterName")
        where = ["where", f"cluster={cluster}"] if cluster else []
        with ThreadPoolExecutor(2) as pool:
            assoc = pool.submit(run, ["sacctmgr", "-n", "-P", "show", "assoc", *where, f"format={ASSOC_FORMAT}"])
            qos_text = run(["sacctmgr", "-n", "-P", "show", "qos", f"format={QOS_FORMAT}"])
            assoc_text = assoc.result()
        limits, qos = limits_for(assoc_text, qos_text, uses, user, account, qos)
    except SlurmError as exc:
        return Quotas(user, account, qos, unavailable=str(exc).splitlines()[0])
    note = unknown_qos(qos_text, qos)
    preempts, stops_clean = preemption_of(qos_text, qos)
    return Quotas(user, account, qos, limits, notes=[note] if note else [], preempts=preempts,
                  stops_clean=stops_clean)


def preemption_of(qos_text: str, qos: str | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """What a job under ``qos`` may preempt, from ``sacctmgr -n -P show qos`` text: its QOS's
    ``Preempt=`` list, and those of them whose jobs stop clean at an agreed step: the policy's
    ``<tier>_ckpt`` QOS (policy.desired.preemption_sets, the same answer from the policy file):
    hetrun jobs that checkpoint. With or without a GraceTime: without one a preempted job still
    gets SIGTERM and KillWait (30 s as ``hetrun cluster up`` renders it) before SIGKILL, and the run
    API stops within 20 s (the issue-21 replays: such jobs lost ~0 with ``checkpointed: {}``)."""
    from hetrun.slurm_plugin.policy.model import CKPT_SUFFIX

    qoses = parse_qos(qos_text)
    own = qoses.get(qos or "")
    if own is None:
        return (), ()
    clean = tuple(n for n in own.preempt if n.endswith(CKPT_SUFFIX) and n in qoses)
    return own.preempt, clean


__all__ = ["QuotaLimit", "Quotas", "check", "default_account", "enforced", "job_tres", "label", "limits_for",
           "preemption_of", "read_quotas", "running_in", "submitter", "unknown_qos"]
