"""`hetrun policy check|plan|apply|status FILE`: the pool policy, inside Slurm.

Thin: validation is ``hetrun.slurm_plugin.policy.model``, the diff against
the live cluster ``policy.plan``/``policy.apply``. ``plan`` prints exactly the
commands ``apply`` runs; slurm.conf and job_submit.lua are written only with
``apply --write-conf``.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from hetrun.slurm_plugin.policy.model import PolicySpec
    from hetrun.slurm_plugin.policy.plan import PolicyPlan

policy_app = typer.Typer(
    name="policy",
    help="Pool policy (tiers, preemption, quotas, sharing) as Slurm QOS, associations, "
         "slurm.conf settings and a job_submit.lua.",
    no_args_is_help=True,
    rich_markup_mode=None,
)

FileArg = Annotated[Path, typer.Argument(help="Policy YAML (see docs/POLICY.md).")]
SECTIONS = (
    (("qos", "account", "user"), "sacctmgr (apply runs these)"),
    (("partition",), "partitions (apply runs these)"),
    (("slurm.conf", "job_submit.lua"), "slurm.conf + job_submit.lua (apply --write-conf writes these, "
                                       "then scontrol reconfigure)"),
)


def _plan(file: Path, offline: bool = False) -> tuple[PolicySpec, PolicyPlan, Path | None]:
    from hetrun.slurm_plugin.policy.apply import plan_live
    from hetrun.slurm_plugin.policy.model import load_policy

    policy = load_policy(file)
    if offline:
        from hetrun.slurm_plugin.policy.desired import desired_state
        from hetrun.slurm_plugin.policy.lua import render_job_submit_lua
        from hetrun.slurm_plugin.policy.plan import make_plan
        from hetrun.slurm_plugin.policy.state import LiveState

        empty = LiveState({}, {}, {}, {})
        return policy, make_plan(desired_state(policy), empty, render_job_submit_lua(policy), None), None
    plan, conf = plan_live(policy)
    return policy, plan, conf


def _print_plan(plan: PolicyPlan) -> None:
    if plan.in_sync:
        typer.echo("in sync: the live cluster already matches the policy")
    for kinds, title in SECTIONS:
        changes = plan.by_kind(*kinds)
        if not changes:
            continue
        typer.echo(f"\n== {title}")
        for c in changes:
            why = f"   # {c.why}" if c.why else ""
            typer.echo(f"{c.action} {c.kind} {c.target}{why}")
            for f in c.fields:
                typer.echo(f"    {f.option}: {f.live or '(empty)'} -> {f.wanted or '(empty)'}")
            for cmd in c.commands:
                typer.echo(f"  $ {shlex.join(cmd)}")
    for problem in plan.problems:
        typer.echo(f"\nproblem: {problem}")
    if plan.conf_values or plan.partitions:
        typer.echo("\n== slurm.conf fragment the policy needs (full values)")
        typer.echo(plan.conf_fragment.rstrip())
    for frag in plan.manual:
        typer.echo("\n== not written by apply (hardware-specific; add by hand)")
        typer.echo(frag)


def _plan_json(plan: PolicyPlan) -> dict[str, Any]:
    return {
        "in_sync": plan.in_sync,
        "changes": [{"kind": c.kind, "target": c.target, "action": c.action, "why": c.why,
                     "fields": [{"option": f.option, "live": f.live, "wanted": f.wanted} for f in c.fields],
                     "commands": [list(cmd) for cmd in c.commands]} for c in plan.changes],
        "slurm_conf": plan.conf_values,
        "partitions": plan.partitions,
        "manual": plan.manual,
        "problems": plan.problems,
    }


@policy_app.command("check")
def check_cmd(file: FileArg) -> None:
    """Validate the policy file (file:line:col errors, like job specs)."""
    from hetrun.slurm_plugin.policy.model import load_policy

    p = load_policy(file)
    typer.echo(f"{file}: ok: tiers {', '.join(p.tier_names) or '(none)'}"
               f" (default {p.default_tier or '-'}, preemption {'on' if p.preemption else 'off'}), "
               f"{len(p.accounts)} accounts, {sum(len(a.users) for a in p.accounts.values())} users")


@policy_app.command("plan")
def plan_cmd(
    file: FileArg,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as JSON.")] = False,
    offline: Annotated[bool, typer.Option(help="Plan against an empty cluster (no Slurm calls).")] = False,
    lua_out: Annotated[Path | None, typer.Option("--lua-out", help="Also write the job_submit.lua here.")] = None,
) -> None:
    """Exactly what apply would change: commands, config fragments, diff against the live cluster."""
    _, plan, _ = _plan(file, offline)
    if lua_out is not None:
        lua_out.write_text(plan.lua)
    if as_json:
        typer.echo(json.dumps(_plan_json(plan), indent=1))
    else:
        _print_plan(plan)


@policy_app.command("apply")
def apply_cmd(
    file: FileArg,
    write_conf: Annotated[bool, typer.Option("--write-conf", help="Also write slurm.conf settings and "
                                             "job_submit.lua, then scontrol reconfigure.")] = False,
    foreign_conf: Annotated[bool, typer.Option("--foreign-conf", help="Allow rewriting a slurm.conf "
                                               "hetrun did not create (a backup is kept).")] = False,
    no_reconfigure: Annotated[bool, typer.Option("--no-reconfigure", help="Write slurm.conf but do not "
                                                 "run scontrol reconfigure.")] = False,
) -> None:
    """Apply the policy (idempotent: a second apply changes nothing)."""
    from hetrun.slurm_plugin.policy.apply import apply_plan

    _, plan, conf = _plan(file)
    result = apply_plan(plan, conf, write_conf_file=write_conf, foreign_conf=foreign_conf,
                        reconfigure=not no_reconfigure)
    for cmd in result.commands:
        typer.echo(f"ran: {shlex.join(cmd)}")
    if result.backup:
        typer.echo(f"wrote {result.conf_path} (backup: {result.backup})")
    if result.lua_path:
        typer.echo(f"wrote {result.lua_path}")
    if result.reconfigured:
        typer.echo("ran: scontrol reconfigure")
    if result.restart_needed:
        typer.echo(f"not reconfigured: restart slurmctld and every slurmd for {', '.join(result.restart_needed)}")
    if result.skipped_conf:
        typer.echo(f"not written (pass --write-conf): {', '.join(result.skipped_conf)}")
    if not result.commands and not result.backup and not result.lua_path:
        typer.echo("nothing to change" + (" in accounting" if result.skipped_conf else ""))


@policy_app.command("status")
def status_cmd(file: FileArg) -> None:
    """Is the live cluster in sync with the policy, and what runs / waits in each tier."""
    from hetrun.slurm_plugin.backends.slurm_cli import run_slurm

    policy, plan, _ = _plan(file)
    drift = [c for c in plan.changes]
    typer.echo("in sync" if not drift and not plan.problems else
               f"drift: {len(drift)} change(s) pending; `hetrun policy plan {file}` shows them")
    for c in drift:
        typer.echo(f"  {c.action} {c.kind} {c.target}")
    jobs = json.loads(run_slurm(["squeue", "--json"]).stdout).get("jobs") or []
    rows = [(tier, policy.qos_name(tier)) for tier in policy.tier_names]
    if policy.checkpointed is not None:  # each tier's checkpointing QOS, after the plain ones
        rows += [(f"{tier}_ckpt", policy.ckpt_qos_name(tier)) for tier in policy.tier_names]
    width = max([9, *(len(label) for label, _ in rows)])
    typer.echo(f"{'tier':<{width}} {'QOS':<19} running  pending")
    for label, qos in rows:
        states = [str(j.get("job_state", "")).upper() for j in jobs if j.get("qos") == qos]
        typer.echo(f"{label:<{width}} {qos:<19} {states.count('RUNNING'):>7}  {states.count('PENDING'):>7}")


def register(app: typer.Typer) -> None:
    app.add_typer(policy_app, name="policy")
