"""Policy -> the exact changes against the live cluster (``hetrun policy plan``).

``make_plan`` diffs the desired state (``desired.py``) against the live one
(``state.read_live``) and returns every change with the command ``apply``
will run for it: ``sacctmgr -i add|modify ...`` for QOS, accounts and users,
slurm.conf settings (with the value the file gets), partition settings, and
the rendered job_submit.lua. ``plan`` is a dry run of ``apply``: apply runs
these very commands, nothing else. A plan computed right after ``apply`` is
empty. The policy never deletes Slurm objects; ones it does not name are
left alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from hetrun.slurm_plugin.policy.desired import ConfSetting, DesiredState
from hetrun.slurm_plugin.policy.state import (
    AssocState,
    LiveState,
    QosState,
    format_tres,
    format_wall,
)

SACCTMGR = ("sacctmgr", "-i")

# Dataclass field -> sacctmgr option, for QOS and associations.
_OPTION = {
    "priority": "Priority", "preempt": "Preempt", "preempt_mode": "PreemptMode",
    "max_wall": "MaxWall", "grp_tres": "GrpTRES", "max_tres_per_user": "MaxTRESPerUser",
    "flags": "Flags", "fairshare": "Fairshare", "qos": "QOS", "default_qos": "DefaultQOS",
    "parent": "Parent", "grace_time": "GraceTime",
}
_IDENTITY = {"name", "account", "user"}
# scontrol prints these with units or placeholders; compare what they mean.
_EMPTY = {"(null)", "(null type)", "none", "n/a", "infinite", "unlimited", ""}


@dataclass(frozen=True)
class FieldChange:
    option: str  # Slurm's name (Priority, GrpTRES, PreemptType...)
    live: str
    wanted: str


@dataclass(frozen=True)
class Change:
    kind: str  # qos | account | user | slurm.conf | partition | job_submit.lua
    target: str
    action: str  # add | modify
    fields: tuple[FieldChange, ...]
    commands: tuple[tuple[str, ...], ...] = ()  # what apply runs (sacctmgr, scontrol update)
    why: str = ""


@dataclass
class PolicyPlan:
    changes: list[Change]
    conf_values: dict[str, str]  # slurm.conf key -> the full value the file must hold
    partitions: dict[str, dict[str, str]]
    lua: str
    manual: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def in_sync(self) -> bool:
        return not self.changes and not self.problems

    def by_kind(self, *kinds: str) -> list[Change]:
        return [c for c in self.changes if c.kind in kinds]

    @property
    def conf_fragment(self) -> str:
        """The slurm.conf lines the policy needs, as apply writes them."""
        lines = [f"{k}={val}" for k, val in self.conf_values.items()]
        lines += [f"# PartitionName={p} ... " + " ".join(f"{k}={val}" for k, val in s.items())
                  for p, s in self.partitions.items()]
        return "\n".join(lines) + "\n"


def _show(option: str, value: object) -> str:
    if isinstance(value, dict):
        return format_tres(value)
    if isinstance(value, tuple):
        return ",".join(value)
    if option == "MaxWall":
        return format_wall(value) if value is not None else ""
    return "" if value is None else str(value)


def _set_value(option: str, live: object, wanted: object) -> str:
    """The sacctmgr value that turns ``live`` into ``wanted`` (-1 clears a limit)."""
    if isinstance(wanted, dict):
        cleared = {k: -1 for k in live if k not in wanted} if isinstance(live, dict) else {}
        merged = {**cleared, **wanted}
        return ",".join(f"{k}={n}" for k, n in sorted(merged.items()))
    if option == "MaxWall":
        return format_wall(wanted)
    return _show(option, wanted)


def _diff_objects(live: object | None, wanted: object, blank: object) -> list[tuple[str, object, object]]:
    base = live if live is not None else blank
    out = []
    for f in fields(wanted):  # type: ignore[arg-type]
        if f.name in _IDENTITY:
            continue
        old, new = getattr(base, f.name), getattr(wanted, f.name)
        if f.name == "parent" and live is not None and isinstance(live, AssocState) and live.user:
            continue
        if old != new:
            out.append((_OPTION[f.name], old, new))
    return out


def _object_change(kind: str, target: str, live: object | None, wanted: object, blank: object,
                   add: list[str], modify: list[str]) -> Change | None:
    diffs = _diff_objects(live, wanted, blank)
    if live is not None and not diffs:
        return None
    shown = tuple(FieldChange(opt, "(absent)" if live is None else _show(opt, old), _show(opt, new))
                  for opt, old, new in diffs)
    sets = [f"{opt}={_set_value(opt, old, new)}" for opt, old, new in diffs]
    commands: list[tuple[str, ...]] = []
    if live is None:
        commands.append((*SACCTMGR, *add))
    if sets:
        commands.append((*SACCTMGR, *modify, "set", *sets))
    return Change(kind, target, "add" if live is None else "modify", shown, tuple(commands))


def _qos_changes(desired: DesiredState, live: LiveState) -> list[Change]:
    adds, sets = [], []
    for name, want in desired.qos.items():
        ch = _object_change("qos", name, live.qos.get(name), want, QosState(name),
                            ["add", "qos", name], ["modify", "qos", "where", f"name={name}"])
        if ch is None:
            continue
        if ch.action == "add":
            # A Preempt list may name a QOS added by this same plan: every add
            # runs first, its settings after all of them.
            adds.append(replace(ch, commands=ch.commands[:1]))
            if ch.commands[1:]:
                sets.append(Change("qos", name, "set", (), ch.commands[1:]))
        else:
            sets.append(ch)
    return adds + sets


def _assoc_changes(desired: DesiredState, live: LiveState) -> list[Change]:
    changes = []
    accounts = [(k, a) for k, a in desired.assocs.items() if not k[1]]
    users = [(k, a) for k, a in desired.assocs.items() if k[1]]
    on = [f"Cluster={live.cluster}"] if live.cluster else []
    where_on = [f"cluster={live.cluster}"] if live.cluster else []
    for (acct, _), want in accounts:
        old = live.assocs.get((acct, ""))
        ch = _object_change("account", acct, old, want, AssocState(acct, parent="root"),
                            ["add", "account", acct, f"Parent={want.parent}", *on],
                            ["modify", "account", "where", f"name={acct}", *where_on])
        if ch:
            changes.append(ch)
    for (acct, user), want in users:
        old = live.assocs.get((acct, user))
        target = f"{user}@{acct}"
        where = ["modify", "user", "where", f"name={user}", f"account={acct}", *where_on]
        # Only what the policy sets on a user association; the rest is inherited.
        diffs = [(opt, a, b) for opt, a, b in _diff_objects(old, want, AssocState(acct, user))
                 if opt in ("GrpTRES", "QOS", "DefaultQOS")]
        commands: list[tuple[str, ...]] = []
        if old is None:
            # The new association inherits the account's QOS (checked live).
            commands.append((*SACCTMGR, "add", "user", user, f"Account={acct}", *on))
            diffs = [d for d in diffs if d[0] == "GrpTRES"]
        if diffs:
            commands.append((*SACCTMGR, *where, "set", *(f"{o}={_set_value(o, a, b)}" for o, a, b in diffs)))
        if commands:
            shown = tuple(FieldChange(o, "(absent)" if old is None else _show(o, a), _show(o, b))
                          for o, a, b in diffs) or (FieldChange("Account", "(absent)", acct),)
            changes.append(Change("user", target, "add" if old is None else "modify", shown, tuple(commands)))
    return changes


def _items(value: str) -> list[str]:
    return [t.strip() for t in value.split(",") if t.strip() and t.strip().lower() not in _EMPTY]


def _norm(key: str, value: str) -> set[str]:
    text = value.strip()
    if text.endswith(" sec"):
        text = text[:-4]
    return {t.lower().removeprefix("job_submit/") for t in _items(text)}


def conf_value(setting: ConfSetting, live: str | None) -> str:
    """The value slurm.conf must hold: ``contains`` keeps what is there and adds the rest."""
    if not setting.contains or not live:
        return setting.value
    # Items compare by key: the policy's bf_min_prio_reserve=N replaces a live bf_min_prio_reserve=M.
    want = {w.split("=", 1)[0].lower(): w for w in _items(setting.value)}
    have = [want.pop(h.split("=", 1)[0].lower(), h) for h in _items(live)]
    return ",".join(have + list(want.values()))


def _conf_changes(desired: DesiredState, live: LiveState) -> tuple[list[Change], dict[str, str]]:
    changes, values = [], {}
    # scontrol spells some keys its own way (PriorityWeightFairShare).
    config = {k.lower(): val for k, val in live.config.items()}
    for s in desired.conf:
        have = config.get(s.key.lower())
        values[s.key] = conf_value(s, have)
        want_set, have_set = _norm(s.key, s.value), _norm(s.key, have or "")
        ok = want_set <= have_set if s.contains else want_set == have_set
        if not ok:
            changes.append(Change("slurm.conf", s.key, "modify",
                                  (FieldChange(s.key, have or "(unset)", values[s.key]),), why=s.why))
    return changes, values


def _partition_changes(desired: DesiredState, live: LiveState) -> tuple[list[Change], list[str]]:
    changes, problems = [], []
    for name, settings in desired.partitions.items():
        have = live.partitions.get(name)
        if have is None:
            problems.append(f"partition {name!r} (time_slicing.partition) does not exist; "
                            f"partitions: {', '.join(live.partitions) or 'none'}")
            continue
        diffs = tuple(FieldChange(k, have.get(k, ""), val) for k, val in settings.items()
                      if have.get(k, "").upper() != val.upper())
        if diffs:
            cmd = ("scontrol", "update", f"PartitionName={name}", *(f"{f.option}={f.wanted}" for f in diffs))
            changes.append(Change("partition", name, "modify", diffs, (cmd,), why="time slicing"))
    return changes, problems


def make_plan(desired: DesiredState, live: LiveState, lua: str, live_lua: str | None) -> PolicyPlan:
    """Every change ``apply`` would make, in the order it makes them."""
    changes = _qos_changes(desired, live) + _assoc_changes(desired, live)
    conf_changes, values = _conf_changes(desired, live)
    part_changes, problems = _partition_changes(desired, live)
    changes += conf_changes + part_changes
    if "JobSubmitPlugins" in values and live_lua != lua:
        changes.append(Change("job_submit.lua", "job_submit.lua", "add" if live_lua is None else "modify",
                              (FieldChange("content", "(absent)" if live_lua is None else "differs",
                                           f"{len(lua.splitlines())} lines"),),
                              why="enforces tiers and quotas at submission"))
    return PolicyPlan(changes, values, desired.partitions, lua, desired.manual, desired.problems + problems)
