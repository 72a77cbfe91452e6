"""Render the policy's job_submit.lua (template: slurm_plugin/templates/job_submit.lua).

The template holds the logic; the policy becomes one Lua table literal
(``POLICY``) spliced into it: tier -> QOS, hetrun QoS class -> QOS, the
default QOS, per-account quotas (GrpTRES the filter can check for one job:
cpu, node, mem in MB, gres/*) and time slicing. How the script reads a request
(Slurm's unset markers, partition and slurm.conf defaults, het components) is
documented in the template and docs/POLICY.md. Every string in the table went through the policy's name checks;
``_lua_str`` still escapes, so the rendering never depends on that.
"""

from __future__ import annotations

from importlib import resources

from hetrun.dag import validators as v
from hetrun.slurm_plugin.policy.model import CKPT_SUFFIX, PolicySpec

PLACEHOLDER = "--@POLICY@--"
HETRUN_CLASSES = ("low", "normal", "high", "critical")  # hetrun.dag.spec.QosClass
LUA_QUOTA_KEYS = ("cpu", "node", "mem")  # plus every gres/...


def _lua_str(text: str) -> str:
    out = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    return '"' + out.replace("\x00", "") + '"'


def _lua_table(items: dict[str, object], indent: str = "   ") -> str:
    if not items:
        return "{}"
    lines = []
    for key, value in sorted(items.items()):
        if isinstance(value, dict):
            rendered = _lua_table(value, indent + "   ")
        elif isinstance(value, bool):
            rendered = "true" if value else "false"
        elif isinstance(value, int):
            rendered = str(value)
        else:
            rendered = _lua_str(str(value))
        lines.append(f"{indent}[{_lua_str(key)}] = {rendered},")
    return "{\n" + "\n".join(lines) + "\n" + indent[:-3] + "}"


def class_to_tier(policy: PolicySpec) -> dict[str, str]:
    """hetrun's action QoS classes onto the tiers: a class named like a tier is that
    tier; otherwise critical -> the highest, high -> the second of three or more
    (else the highest), low -> the lowest, normal -> the default tier."""
    tiers = policy.tier_names
    if not tiers:
        return {}
    fallback = {"critical": tiers[0], "high": tiers[1] if len(tiers) >= 3 else tiers[0],
                "normal": policy.default_tier or tiers[-1], "low": tiers[-1]}
    return {c: (c if c in tiers else fallback[c]) for c in HETRUN_CLASSES}


def _quotas(policy: PolicySpec) -> dict[str, object]:
    out: dict[str, object] = {}
    for name, acct in policy.accounts.items():
        if acct.quota is None:
            continue
        checkable = {k: n for k, n in acct.quota.as_slurm().items()
                     if k in LUA_QUOTA_KEYS or k.startswith("gres/")}
        if checkable:
            out[name] = checkable
    return out


def policy_table(policy: PolicySpec) -> dict[str, object]:
    table: dict[str, object] = {
        # ``--qos=<tier>`` and, with scheduling.checkpointed, ``--qos=<tier>_ckpt``
        "tiers": {t: policy.qos_name(t) for t in policy.tier_names}
        | ({f"{t}{CKPT_SUFFIX}": policy.ckpt_qos_name(t) for t in policy.tier_names}
           if policy.checkpointed is not None else {}),
        "classes": {c: policy.qos_name(t) for c, t in class_to_tier(policy).items()},
        "quotas": _quotas(policy),
        "accounts": {name: True for name in policy.accounts},
    }
    if policy.default_tier:
        table["default_qos"] = policy.qos_name(policy.default_tier)
    if policy.time_slicing:
        seconds = v.time_seconds(str(policy.time_slicing.max_wall)) or 0
        table["slicing"] = {"partition": policy.time_slicing.partition, "max_minutes": max(1, seconds // 60)}
    return table


def render_job_submit_lua(policy: PolicySpec) -> str:
    template = resources.files("hetrun.slurm_plugin").joinpath("templates/job_submit.lua").read_text()
    return template.replace(PLACEHOLDER, _lua_table(policy_table(policy)), 1)
