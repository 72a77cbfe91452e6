"""Fixes from the review of placement: ranked and its quota / report paths, off-line: pool
snapshots from the real Slurm 22.05 sinfo sample with partitions, GPU types and load set per node."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from hetrun.dag.needs import component_needs
from hetrun.dag.plan import build_plan
from hetrun.dag.spec import load_spec
from hetrun.slurm_plugin import placement_fit, pool
from test_placement import DATA
from test_placement_quota import NODE_COUNTS, half_busy
from test_placement_spec import AUTO, starts_in, write

RANKED = AUTO.replace("placement: auto", "placement: ranked").replace("slurm: {partition: debug,", "slurm: {")


def split_pool(layout: dict[str, tuple[str, str]], busy: set[str] = frozenset()) -> pool.PoolSnapshot:
    """A snapshot where node -> (its one partition, its GPU type); ``busy`` nodes fully allocated."""
    data = copy.deepcopy(json.loads((DATA / "sinfo.json").read_text()))
    for node in data["nodes"]:
        part, gtype = layout[node["name"]]
        full = node["name"] in busy
        node.update(partitions=[part], gres=f"gpu:{gtype}:2", gres_used=f"gpu:{gtype}:{2 if full else 0}",
                    alloc_cpus=node["cpus"] if full else 0, alloc_memory=node["real_memory"] if full else 0,
                    state="allocated" if full else "idle", state_flags=[], reason="")
    return pool.PoolSnapshot(0.0, 1.0, pool.rows_from_sinfo(data), [], [], pool.troubled_nodes(data, {}), [],
                             pool.nodes_from_sinfo(data))


# high holds a100 and v100 (both accepted); debug holds a100 and t4 (t4 is not in gpu_types).
LAYOUT = {"n1": ("high", "a100"), "n2": ("high", "v100"), "n3": ("debug", "a100"), "n4": ("debug", "t4")}


def ranked_choice(tmp_path: Path, text: str, snap: pool.PoolSnapshot, seconds: dict[str, float]) -> dict:
    spec = load_spec(write(tmp_path, text))
    fits = placement_fit.fit_components(component_needs(spec), snap, starts_in(seconds), ["trainer"])
    plan = placement_fit.record(build_plan(spec), placement_fit.FitReport(fits, snap.taken_at))
    return json.loads(plan.to_json())["components"][0]


def test_untyped_gres_leaves_out_a_partition_that_also_holds_a_refused_type(tmp_path: Path) -> None:
    choice = ranked_choice(tmp_path, RANKED, split_pool(LAYOUT), {"high": 0, "debug": 3600})["placement"]
    # Untyped gpu:2 on debug could start the job on n4's t4, which gpu_types rules out.
    assert (choice["partition"], choice["ranked"], choice["gres"]) == ("high", ["high"], "gpu"), choice
    assert any("debug gpu:a100" in o and "left out: debug also holds t4, which the component does not accept" in o
               for o in choice["others"]), choice["others"]


def test_best_partition_not_safe_for_untyped_keeps_the_best_type_typed(tmp_path: Path) -> None:
    # high's nodes busy: debug's a100 is best, and debug also holds t4: the request stays gpu:a100.
    choice = ranked_choice(tmp_path, RANKED, split_pool(LAYOUT, busy={"n1", "n2"}),
                           {"high": 3600, "debug": 0})["placement"]
    assert (choice["partition"], choice["ranked"], choice["gres"]) == ("debug", ["debug", "high"], "gpu:a100"), choice
    assert any("high gpu:v100" in o and "left out: another GPU type than the best's gpu:a100" in o
               for o in choice["others"]), choice["others"]


def test_every_type_of_each_partition_accepted_still_goes_untyped(tmp_path: Path) -> None:
    layout = {**LAYOUT, "n4": ("debug", "v100")}
    choice = ranked_choice(tmp_path, RANKED, split_pool(layout), {"high": 0, "debug": 3600})["placement"]
    assert (choice["ranked"], choice["gres"]) == (["high", "debug"], "gpu"), choice


def test_gpu_memory_rules_out_a_type_the_partition_holds() -> None:
    from hetrun.slurm_plugin.placement import Candidate

    a100, v100_elsewhere = Candidate("big", "gpu:a100", 120.0, True), Candidate("mixed", "gpu:h100", 90.0, True)
    pool_gres = {"big": {"gpu:a100"}, "mixed": {"gpu:h100", "gpu:v100"}}  # v100: too little memory, no candidate
    ranked = placement_fit.ranked_list([a100, v100_elsewhere], True, pool_gres)
    assert (ranked.partitions, ranked.gres) == (["big"], "gpu:a100")
    assert "mixed also holds v100" in ranked.left["mixed gpu:h100"]


def test_explain_ranked_line_uses_the_chosen_node_counts_gpus(tmp_path: Path) -> None:
    text = NODE_COUNTS.replace("placement: auto", "placement: ranked").replace("slurm: {partition: debug,", "slurm: {")
    spec = load_spec(write(tmp_path, text))
    snap = half_busy({"n1", "n2", "n3", "n4"})  # one GPU free per node: the two-node shape (1 GPU each) wins
    fits = placement_fit.fit_components(component_needs(spec), snap, starts_in({"debug": 0, "high": 0}), ["trainer"])
    assert fits["trainer"].best.node_count == 2
    line = next(s for s in placement_fit.explain_lines(placement_fit.FitReport(fits, snap.taken_at))
                if s.strip().startswith("ranked:"))
    assert line.endswith(" --gres=gpu:1"), line  # the two-node shape's GPUs per node, as the script asks


def ranked_row(tmp_path: Path) -> dict:
    from hetrun.reports.placement import component_row

    comp = ranked_choice(tmp_path, RANKED, split_pool({**LAYOUT, "n4": ("debug", "v100")}), {"high": 0, "debug": 60})
    return component_row(comp, "ranked", None)


def test_report_json_schema_takes_a_ranked_row(tmp_path: Path) -> None:
    import jsonschema
    import pytest
    from hetrun.reports.schema import REPORT_SCHEMA

    section = REPORT_SCHEMA["properties"]["placement"]
    row = ranked_row(tmp_path)
    assert row["mode"] == "ranked" and row["ranked"] == ["high", "debug"], row
    doc = {"note": None, "attempts": [{"first_restart": 0, "last_restart": None, "source": "plan.json",
                                       "components": [row]}]}
    jsonschema.validate(doc, section)
    doc["attempts"][0]["components"][0] = {**row, "ranked": "high,debug"}  # the list is an array of names
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, section)


def test_html_report_says_why_for_a_ranked_row(tmp_path: Path) -> None:
    from hetrun.reports.html import _placement_table
    from hetrun.reports.placement import why_text

    row = ranked_row(tmp_path)
    page = _placement_table({"attempts": [{"first_restart": 0, "last_restart": None, "components": [row]}]})
    assert why_text(row) and "score " in why_text(row)
    assert "<td>(score " in page, page


def test_submit_says_by_fit_for_a_fixed_component_placed_by_fit(tmp_path: Path) -> None:
    from hetrun.cli.submit_cmd import placement_lines

    fixed = AUTO.replace("    placement: auto\n", "").replace("    gpu_types: [a100, v100]\n", "") \
        .replace("slurm: {partition: debug,", "slurm: {")
    spec = load_spec(write(tmp_path, fixed))
    snap = split_pool({**LAYOUT, "n4": ("debug", "v100")})
    fits = placement_fit.fit_components(component_needs(spec), snap, starts_in({"debug": 0, "high": 0}), ["trainer"])
    plan = placement_fit.record(build_plan(spec), placement_fit.FitReport(fits, snap.taken_at))
    line = placement_lines(plan, spec)[0]
    assert line.startswith("placed trainer on ") and " by --fit (score " in line, line
    assert " by --fit" not in placement_lines(plan)[0]  # without the spec: no way to tell (as before)


def test_a_second_resume_keeps_the_plan_the_attempts_ran_with(tmp_path: Path) -> None:
    from hetrun.slurm_plugin.resume_run import keep_replaced_plan

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "plan.json").write_text('{"ran": true}\n')
    keep_replaced_plan(run_dir, 1)
    # That resume's submit failed after writing its own plan.json; the next resume must not archive it.
    (run_dir / "plan.json").write_text('{"ran": false}\n')
    keep_replaced_plan(run_dir, 1)
    assert json.loads((run_dir / "logs" / "plan-before-attempt-1.json").read_text()) == {"ran": True}


def test_a_qos_sacctmgr_does_not_know_is_named_in_the_quota_reasons() -> None:
    from hetrun.slurm_plugin import placement, quota
    from test_placement import TYPES, snapshot
    from test_placement_quota import ALICE_ASSOC_MGR, ENFORCING
    from test_policy_plan import LIVE_ASSOC, LIVE_QOS

    def recorded_slurm(argv: list[str]) -> str:
        if argv[0] == "scontrol":
            return ENFORCING if argv[2] == "config" else ALICE_ASSOC_MGR
        return {"assoc": LIVE_ASSOC, "qos": LIVE_QOS}[argv[4]]

    # slurm.qos: critical, a hetrun class: job_submit.lua maps it onto pool_critical (MaxTRESPerUser
    # gres/gpu=4) at submission; that QOS's limits are not read here, and the reasons say so.
    q = quota.read_quotas(recorded_slurm, [], user="alice", account="vision", qos="critical")
    why = "QOS critical unknown to sacctmgr: its limits not checked"
    assert q.qos == "critical" and q.notes and q.notes[0].startswith(why), q.notes
    assert not any(lim.scope.startswith("QOS") for lim in q.limits)
    assert any(line.strip().startswith(why) for line in placement_fit.quota_lines(q))
    cands = placement.score(placement.Need(1, 1, 1, 500), snapshot(TYPES, busy=set()), q)
    assert cands and all(any(r.startswith(why) for r in c.reasons) for c in cands)
    known = quota.read_quotas(recorded_slurm, [], user="alice", account="vision", qos="pool_critical")
    assert known.notes == [] and known.limits[-1].scope == "QOS pool_critical per user alice"
