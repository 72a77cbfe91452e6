"""placement: ranked, off-line: the kept candidates' partitions handed to Slurm best first as one
--partition=a,b, the GRES typed only when every kept candidate shares the type, one node count
per request, the plan.json record and the words `hetrun submit` / `hetrun report` print.

The live run on the shared cluster is tests/test_placement_ranked_live.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hetrun.dag.needs import component_needs
from hetrun.dag.plan import Plan, build_plan
from hetrun.dag.spec import JobSpec, load_spec
from hetrun.reports.placement import component_row, row_lines, short_text
from hetrun.slurm_plugin import placement_fit
from hetrun.slurm_plugin.render import render_sbatch
from test_placement import TYPES, snapshot
from test_placement_quota import NODE_COUNTS, half_busy
from test_placement_spec import AUTO, spec_error, starts_in, write

RANKED = AUTO.replace("placement: auto", "placement: ranked").replace("slurm: {partition: debug,", "slurm: {")


def placed(tmp_path: Path, text: str, snap, seconds: dict[str, float]) -> tuple[Plan, JobSpec]:
    """The plan after submit's fit step against ``snap``, and the spec."""
    spec = load_spec(write(tmp_path, text))
    fits = placement_fit.fit_components(component_needs(spec), snap, starts_in(seconds), ["trainer"])
    return placement_fit.record(build_plan(spec), placement_fit.FitReport(fits, snap.taken_at)), spec


def first(plan: Plan) -> dict:
    """The first component as plan.json holds it."""
    return json.loads(plan.to_json())["components"][0]


def test_two_gpu_types_go_to_slurm_as_a_partition_list_with_untyped_gres(tmp_path: Path) -> None:
    # Slurm expects debug to start an hour later: high first, then debug.
    plan, spec = placed(tmp_path, RANKED, snapshot(TYPES, busy={"n1", "n2"}), {"high": 0, "debug": 3600})
    choice = first(plan)["placement"]
    assert choice["ranked"] == ["high", "debug"] and choice["partition"] == "high", choice
    assert choice["gres"] == "gpu"  # a100 and v100 both kept: the type is Slurm's to pick
    assert any(r.startswith("ranked: Slurm is handed high,debug best first") for r in choice["reasons"])
    assert all("; in the ranked list" in o for o in choice["others"]), choice["others"]
    assert Plan.from_json(plan.to_json()).components[0].placement.ranked == ["high", "debug"]
    script = render_sbatch(plan, spec, tmp_path / "run", python="/usr/bin/python3")
    trainer, watcher = script.split("#SBATCH hetjob")
    assert "#SBATCH --partition=high,debug\n" in trainer and "#SBATCH --gres=gpu:2\n" in trainer, trainer
    assert "--partition" not in watcher


def test_one_allowed_type_keeps_the_gres_typed(tmp_path: Path) -> None:
    text = RANKED.replace("gpu_types: [a100, v100]", "gpu_types: [v100]")
    plan, spec = placed(tmp_path, text, snapshot(TYPES, busy=set()), {"debug": 0, "high": 0})
    choice = first(plan)["placement"]
    assert choice["gres"] == "gpu:v100" and sorted(choice["ranked"]) == ["debug", "high"], choice
    script = render_sbatch(plan, spec, tmp_path / "run", python="/usr/bin/python3")
    assert f"#SBATCH --partition={','.join(choice['ranked'])}\n" in script and "--gres=gpu:v100:2" in script


def test_candidates_of_another_node_count_are_left_out(tmp_path: Path) -> None:
    text = NODE_COUNTS.replace("placement: auto", "placement: ranked").replace("slurm: {partition: debug,", "slurm: {")
    # Every node half busy: the two-node shape starts now, so its count is the request's.
    plan, _ = placed(tmp_path, text, half_busy({"n1", "n2", "n3", "n4"}), {"debug": 0, "high": 0})
    comp = first(plan)
    assert (comp["nodes"], comp["placement"]["node_count"], comp["placement"]["gres"]) == (2, 2, "gpu")
    assert any("candidate(s) left out" in r for r in comp["placement"]["reasons"])
    assert any(" x1 nodes: score" in o and "left out: another node count" in o for o in comp["placement"]["others"])


def test_report_and_submit_say_ranked(tmp_path: Path) -> None:
    from hetrun.cli.submit_cmd import placement_lines

    plan, _ = placed(tmp_path, RANKED, snapshot(TYPES, busy={"n1", "n2"}), {"high": 0, "debug": 3600})
    row = component_row(first(plan), "ranked", None)
    assert short_text(row) == "ranked: high,debug gpu 1 node"
    assert row_lines(row)[0].startswith("placed trainer on high,debug gpu 1 node (ranked: Slurm starts it")
    assert placement_lines(plan)[0] == row_lines(row)[0]
    spec = load_spec(write(tmp_path, RANKED))
    fits = placement_fit.fit_components(component_needs(spec), snapshot(TYPES, busy={"n1", "n2"}),
                                        starts_in({"high": 0, "debug": 3600}))
    lines = placement_fit.explain_lines(placement_fit.FitReport(fits, 0.0))
    assert "  ranked: Slurm is handed --partition=high,debug --gres=gpu:2" in lines, lines


def test_ranked_loads_survives_job_yaml_and_is_refused_where_auto_is(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, RANKED))
    assert spec.components["trainer"].placement == "ranked"
    assert load_spec(write(tmp_path, spec.to_yaml())).components["trainer"].placement == "ranked"
    err = spec_error(tmp_path, RANKED.replace("    placement: ranked\n", ""))
    assert err.key_path == "components.trainer.gpu_types" and "placement: auto / ranked" in str(err), str(err)
    assert str(err).startswith(f"{err.file}:{err.line}:")
    err = spec_error(tmp_path, RANKED.replace("placement: ranked", "placement: rank"))
    assert err.key_path == "components.trainer.placement" and "ranked" in str(err), str(err)


@pytest.mark.parametrize("bad", ["a;b", "a,b"])
def test_a_bad_partition_in_the_record_is_refused_before_the_script(tmp_path: Path, bad: str) -> None:
    from hetrun.errors import SpecError

    plan, spec = placed(tmp_path, RANKED, snapshot(TYPES, busy=set()), {"debug": 0, "high": 0})
    choice = plan.components[0].placement
    assert choice is not None
    choice.ranked = ["debug", bad]  # assigned after the fact: no model validation ran on it
    with pytest.raises(SpecError) as info:
        render_sbatch(plan, spec, tmp_path / "run", python="/usr/bin/python3")
    assert info.value.key_path == "components.trainer.placement.ranked[1]"


def test_cpu_only_work_lists_gpu_nodes_only_where_they_score_best() -> None:
    from hetrun.slurm_plugin.placement import Candidate

    cpu, gpu_first = Candidate("cpu", "-", 90.0, True), Candidate("gpu-a100", "gpu:a100", 120.0, True)
    gpu_later = Candidate("gpu-v100", "gpu:v100", 80.0, False)
    assert placement_fit.ranked_list([cpu, gpu_later], gpus=False) == placement_fit.RankedList(["cpu"], "-", 1)
    assert placement_fit.ranked_list([gpu_first, cpu, gpu_later], gpus=False).partitions == ["gpu-a100", "cpu"]
    assert placement_fit.ranked_list([gpu_first, gpu_later], gpus=True) == \
        placement_fit.RankedList(["gpu-a100", "gpu-v100"], "gpu", 0)
