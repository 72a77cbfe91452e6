"""Demand series, predictors and `hetrun tune` on recorded runs.

Recorded runs are real: short in-process PPO CartPole jobs (the runtime's own
events.jsonl). Two cases use a hand-written events.jsonl (the documented
format) where the answer must be known exactly: the restart rule and the
balance of the rank search.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hetrun.dag.overrides import Overrides
from hetrun.dag.plan import build_plan, build_plan_explained
from hetrun.dag.spec import load_spec, spec_from_dict
from hetrun.reports.cost import DEFAULT_PRICES
from hetrun.reports.demand.predictors import EWMA, Chooser, LastValue, evaluate
from hetrun.reports.demand.series import DemandSeries, peak_memory, read_demand
from hetrun.reports.demand.sizing import propose
from hetrun.runtime.inprocess import run_inprocess

from hetrun.errors import HetrunError, SpecError

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def record_cartpole(run_dir: Path, iterations: int = 8) -> Path:
    spec = load_spec(EXAMPLES / "ppo_cartpole.yaml", Overrides(sets=[
        f"training.iterations={iterations}", "training.eval_interval=4", "checkpoint.interval=0",
        "workload_args={env_id: CartPole-v1, num_envs: 4, num_steps: 64, eval_episodes: 2}"]))
    plan = build_plan(spec)
    run_dir.mkdir(parents=True)
    (run_dir / "plan.json").write_text(plan.to_json())
    assert run_inprocess(json.loads(plan.to_json()), run_dir=run_dir).exit_code == 0
    return run_dir


@pytest.fixture(scope="module")
def cartpole_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return record_cartpole(tmp_path_factory.mktemp("demand") / "run")


def test_series_of_a_recorded_run(cartpole_run: Path) -> None:
    d = read_demand(cartpole_run)
    assert d.ranks == {"learner": 1, "rollout": 1}
    assert d.steps_per_iteration == {i: 4 * 64 for i in range(8)}
    rollout_busy = d.get("rollout", "rollout", "busy_s")
    assert rollout_busy is not None and rollout_busy.iterations == list(range(8))
    assert all(v > 0 for v in rollout_busy.values)
    rollout_bytes = d.get("rollout", "rollout", "bytes")
    assert rollout_bytes is not None and min(rollout_bytes.values) > 4 * 64 * 4  # obs alone are 4 floats
    eval_busy = d.get("rollout", "eval", "busy_s")  # the example evaluates on its rollout rank
    assert eval_busy is not None and eval_busy.iterations == [3, 7]  # eval_interval 4
    peak = d.get("learner", "forward", "peak_mem")
    assert peak is not None and min(peak.values) > 10 * 2**20
    assert sum(d.steps_per_iteration.values()) == 8 * 4 * 64


def write_events(run_dir: Path, lines: list[dict]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))


def action(rank: int, comp: str, kind: str, it: int, start: float, secs: float, **extra: object) -> dict:
    return {"ev": "action", "rank": rank, "component": comp, "type": kind, "id": kind, "iteration": it,
            "start": start, "end": start + secs, "bytes": 10, "peak_mem": 2**20, **extra}


def test_an_iteration_redone_after_a_restart_counts_once(tmp_path: Path) -> None:
    write_events(tmp_path, [
        {"ev": "start", "rank": 0, "component": "learner", "restart_count": 0},
        action(0, "learner", "forward", 0, 0.0, 1.0),
        action(0, "learner", "forward", 1, 1.0, 5.0),  # lost: the job was preempted in it
        {"ev": "start", "rank": 0, "component": "learner", "restart_count": 1},
        action(0, "learner", "forward", 1, 10.0, 2.0),
    ])
    s = read_demand(tmp_path).get("learner", "forward", "busy_s")
    assert s is not None and s.values == [1.0, 2.0]


def series(values: list[float], kind: str = "rollout") -> DemandSeries:
    return DemandSeries("c", kind, "busy_s", values, list(range(len(values))))


def test_last_value_and_ewma_errors_are_exact() -> None:
    step = series([1.0, 1.0, 1.0, 3.0, 3.0])
    last = evaluate(LastValue(), [step], warmup=1)
    assert last.n == 4 and last.mae == pytest.approx(2.0 / 4)  # only the jump is missed
    assert last.relative == pytest.approx(2.0 / (1 + 1 + 3 + 3))
    assert EWMA(0.5).predict([1.0, 3.0], step) == pytest.approx(2.0)
    assert evaluate(EWMA(), [series([2.0] * 6)]).mae == 0.0


def test_lstm_learns_a_pattern_ewma_cannot_and_survives_json(tmp_path: Path) -> None:
    from hetrun.reports.demand.lstm import LSTMPredictor, load_chooser, save_chooser

    def periodic(phase: int) -> DemandSeries:  # e.g. an action that is heavy every third iteration
        return series([3.0 if (i + phase) % 3 == 0 else 1.0 for i in range(30)])

    lstm = LSTMPredictor(seed=0)
    lstm.fit([periodic(0), periodic(1)], steps=400)
    held_out = [periodic(2)]
    lstm_err, ewma_err = evaluate(lstm, held_out), evaluate(EWMA(), held_out)
    assert lstm_err.mae < 0.5 * ewma_err.mae, (lstm_err.mae, ewma_err.mae)

    chooser = Chooser(EWMA(), lstm)
    flat = DemandSeries("c", "optimize", "busy_s", [2.0] * 30, list(range(30)))
    assert chooser.choose([*held_out, flat]) == {("busy_s", "rollout"): True, ("busy_s", "optimize"): False}
    save_chooser(chooser, tmp_path / "model.json")
    again = load_chooser(tmp_path / "model.json")
    assert again.use_lstm == {("busy_s", "rollout"): True}
    history = held_out[0].values[:10]
    assert again.predict(history, held_out[0]) == pytest.approx(chooser.predict(history, held_out[0]))
    assert again.predict(history, flat) == EWMA().predict(history, flat)  # EWMA where it won


def test_a_broken_model_file_is_a_spec_error(tmp_path: Path) -> None:
    from hetrun.reports.demand.lstm import load_chooser

    bad = tmp_path / "model.json"
    bad.write_text('{"lstm": {"kind": "something else"}, "alpha": 0.3, "use_lstm": []}')
    with pytest.raises(SpecError, match="cannot load the demand model") as err:
        load_chooser(bad)
    assert str(bad) in str(err.value)


def plan_json(run_dir: Path, comps: list[tuple[str, int]]) -> None:
    (run_dir / "plan.json").write_text(json.dumps({"components": [
        {"name": n, "ntasks": k, "nodes": k, "cpus_per_task": 1, "gpus_per_node": 0, "mem_mb": 4096}
        for n, k in comps], "slurm": {"partition": "debug"}}))


def test_the_search_balances_a_pipeline_whose_rollouts_cost_three_times_more(tmp_path: Path) -> None:
    lines = [{"ev": "start", "rank": 0, "component": "learner"},
             {"ev": "start", "rank": 1, "component": "rollout"}]
    for it in range(6):  # rollout 3 s, learner 1 s for the same 100 steps, 1 rank each
        lines += [action(1, "rollout", "rollout", it, 4.0 * it, 3.0, steps=100),
                  action(0, "learner", "forward", it, 4.0 * it + 3.0, 1.0)]
    write_events(tmp_path, lines)
    plan_json(tmp_path, [("learner", 1), ("rollout", 1)])
    p = propose(tmp_path, DEFAULT_PRICES, max_cores=4)
    assert [(c.name, c.ranks) for c in p.proposed] == [("learner", 1), ("rollout", 3)]
    assert p.current_steps_per_s == pytest.approx(100 / 3)
    assert p.proposed_steps_per_s == pytest.approx(100.0)  # both sides busy all the time
    assert [c.utilization for c in p.proposed] == pytest.approx([1.0, 1.0])
    # 2 cores at 33 steps/s -> 4 cores at 100 steps/s: a step costs 2/3 of what it did
    assert p.cost_cut == pytest.approx(1 - (4 / 100) / (2 / (100 / 3)))
    assert all(c.mem_mb == 64 for c in p.proposed)  # 1 MiB peak + 25%, rounded up to 64 MiB
    assert "components.rollout.nodes=3" in p.overrides()


def test_tune_a_recorded_run_from_the_command_line(cartpole_run: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "hetrun.cli", "tune", str(cartpole_run), "--json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert [c["name"] for c in doc["proposed"]] == ["learner", "rollout"]
    assert doc["proposed_cost_per_m"] <= doc["current_cost_per_m"]
    peak_mb = max(max(s.values) for k, s in read_demand(cartpole_run).series.items() if k[2] == "peak_mem")
    assert all(c["mem_mb"] >= peak_mb / 2**20 for c in doc["proposed"])
    text = subprocess.run([sys.executable, "-m", "hetrun.cli", "tune", str(cartpole_run)],
                          capture_output=True, text=True, timeout=120)
    assert text.returncode == 0 and "cost per 1M env steps" in text.stdout


def test_tune_without_a_plan_names_the_file(tmp_path: Path) -> None:
    write_events(tmp_path, [action(0, "learner", "forward", 0, 0.0, 1.0)])
    out = subprocess.run([sys.executable, "-m", "hetrun.cli", "tune", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "plan.json" in out.stderr and "Traceback" not in out.stderr


def test_large_budgets_are_searched_by_growing_the_bottleneck() -> None:
    from hetrun.reports.demand.sizing import _search

    # 600 cores, 3 components: 216M mixes is too many to try; the greedy path balances 3:1:2.
    assert _search([0.03, 0.01, 0.02], [0.05] * 3, [1, 1, 1], max_cores=600, max_ranks=600) == (300, 100, 200)
    # the exhaustive path agrees with it where both run
    assert _search([0.03, 0.01, 0.02], [0.05] * 3, [1, 1, 1], max_cores=12, max_ranks=12) == (6, 2, 4)
    with pytest.raises(SpecError, match="no rank mix fits in 2 cores"):
        _search([0.03, 0.01, 0.02], [0.05] * 3, [1, 1, 1], max_cores=2, max_ranks=2)


def test_overrides_keep_the_jobs_tasks_per_node_where_it_divides_the_ranks() -> None:
    from hetrun.reports.demand.sizing import ComponentSize, Proposal

    # mem_mb is per rank; a YAML's mem is per node (Slurm's --mem): the rank's times its tasks there.
    sizes = [ComponentSize("learner", 4, 1, 0.0, 832, tasks_per_node=2),
             ComponentSize("rollout", 3, 1, 0.0, 448, tasks_per_node=2)]
    p = Proposal("run", 1.0, 1.0, sizes, sizes, 1.0, 1.0, 1.0, 1.0, "USD", "ewma")
    assert p.overrides() == [
        "components.learner.nodes=2", "components.learner.tasks_per_node=2", "components.learner.mem=1664M",
        "components.rollout.nodes=3", "components.rollout.tasks_per_node=1", "components.rollout.mem=448M"]


def test_tune_never_proposes_less_memory_than_a_rank_was_measured_to_use(tmp_path: Path) -> None:
    # The CI failure's shape: an in-process run (both components in one process, whose peak
    # is the process's) inside a test process that already peaked at 1.5 GiB, sized at
    # 1 GiB / 256 MiB, already balanced (the model keeps the rank counts). Before the fix the
    # "keep" proposal handed back the configured memory, below the measured peak.
    gib = 2**30
    proc = {"pid": 4242, "host": "n1", "restart_count": 0}
    lines = [{"ev": "start", "rank": 0, "component": "learner", **proc},
             {"ev": "start", "rank": 1, "component": "rollout", **proc}]
    for it in range(6):  # 1 s each for the same 100 steps: nothing to balance
        lines += [action(1, "rollout", "rollout", it, 2.0 * it, 1.0, steps=100, peak_mem=gib),
                  action(0, "learner", "forward", it, 2.0 * it + 1.0, 1.0, peak_mem=gib if it < 5 else 1.5 * gib)]
    write_events(tmp_path, lines)
    (tmp_path / "plan.json").write_text(json.dumps({"components": [
        {"name": n, "ntasks": 1, "nodes": 1, "cpus_per_task": 1, "gpus_per_node": 0, "mem_mb": mem}
        for n, mem in (("learner", 1024), ("rollout", 256))], "slurm": {"partition": "debug"}}))
    p = propose(tmp_path, DEFAULT_PRICES, max_cores=2)
    assert p.decision == "keep" and [c.ranks for c in p.proposed] == [1, 1]
    # 1.5 GiB + 25% = 1920 MiB for both: the rollout's last report (1 GiB) came before the
    # process's peak, which the learner's rank reported.
    assert [c.mem_mb for c in p.proposed] == [1920, 1920]
    assert "memory raised" in p.reason and "rollout 256 -> 1920 MB" in p.reason
    assert "components.rollout.mem=1920M" in p.overrides()


def test_memory_is_sized_from_every_attempt_not_only_the_fitted_one(tmp_path: Path) -> None:
    # Attempt 0 (preempted in iteration 2) peaked at 900 MiB; attempt 1, the one the model is
    # fitted on and which redid iteration 2, reported 300 MiB. Both were used: size for 900.
    mib = 2**20
    lines = [{"ev": "start", "rank": 0, "component": "learner", "pid": 1, "host": "a", "restart_count": 0}]
    lines += [action(0, "learner", "forward", it, float(it), 1.0, samples=10, peak_mem=900 * mib) for it in range(3)]
    lines += [{"ev": "start", "rank": 0, "component": "learner", "pid": 7, "host": "b", "restart_count": 1}]
    lines += [action(0, "learner", "forward", it, 10.0 + it, 1.0, samples=10, peak_mem=300 * mib)
              for it in range(2, 9)]
    write_events(tmp_path, lines)
    assert read_demand(tmp_path, attempt=1).get("learner", "forward", "peak_mem").values == [300 * mib] * 7
    assert peak_memory(tmp_path) == {"learner": 900 * mib}
    (tmp_path / "plan.json").write_text(json.dumps({"components": [
        {"name": "learner", "ntasks": 1, "nodes": 1, "cpus_per_task": 1, "gpus_per_node": 0, "mem_mb": 64}]}))
    p = propose(tmp_path, DEFAULT_PRICES)
    assert [c.mem_mb for c in p.proposed] == [1152]  # 900 MiB + 25% = 1125, rounded up to 64 MiB


def moe_shaped_run(run_dir: Path, peak_mb: float) -> None:
    """A run of a MoE-LM-shaped job (one component, 2 ranks on a node, ``mem`` 2G a node,
    ``actions.forward.memory: 256M``): its real job.yaml and plan.json, and events whose ranks
    peaked at ``peak_mb``."""
    spec = spec_from_dict({
        "name": "moe-shaped", "workload": "hetrun.examples.moe_lm:MoELMWorkload",
        "components": {"learner": {"nodes": 1, "tasks_per_node": 2, "cpus_per_task": 1, "mem": "2G",
                                   "actions": ["forward", "backward", "sync", "optimize", "checkpoint"]}},
        "training": {"kind": "supervised", "iterations": 8, "micro_batches": 4},
        "actions": {"forward": {"memory": "256M"}}})
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "job.yaml").write_text(spec.to_yaml())
    (run_dir / "plan.json").write_text(build_plan(spec).to_json())
    lines: list[dict] = [{"ev": "start", "rank": r, "component": "learner"} for r in (0, 1)]
    for it in range(6):
        lines += [action(r, "learner", "forward", it, float(it), 1.0, samples=64, peak_mem=peak_mb * 2**20)
                  for r in (0, 1)]
    write_events(run_dir, lines)


def test_tune_gives_a_node_the_memory_of_all_its_ranks_and_never_less_than_the_plan_needs(tmp_path: Path) -> None:
    # The MoE LM's failure: each rank peaked at ~460 MB, tune wrote the rank's 576M as the
    # node's mem (two ranks: 288 MB each), below the 256 MB micro-batch plus model state the
    # plan needs, and the proposed job did not plan.
    priced = {**DEFAULT_PRICES, "mem_gb_hour": 0.005}  # memory priced: a cut to propose
    moe_shaped_run(tmp_path, peak_mb=460)
    p = propose(tmp_path, priced)
    (learner,) = p.proposed
    assert learner.mem_mb == 576 and learner.mem_per_node_mb == 1152  # 460 + 25%, to 64 MB; 2 a node
    assert "components.learner.mem=1152M" in p.overrides()
    built = build_plan_explained(load_spec(tmp_path / "job.yaml", Overrides(sets=p.overrides()), check_args=False))
    assert built.memory is not None and built.memory.budget_mb == 576

    # A peak so small that its memory would not hold one micro-batch and the model state:
    # raised to the least memory with which the job plans as it ran (the same micro-batches
    # in flight), found by the planner itself.
    small = tmp_path / "small"
    moe_shaped_run(small, peak_mb=40)
    measured = build_plan_explained(load_spec(small / "job.yaml", check_args=False)).memory
    (learner,) = propose(small, priced).proposed
    assert 64 < learner.mem_mb < 1024
    at = build_plan_explained(load_spec(small / "job.yaml", Overrides(sets=[learner.mem_set()]),
                                        check_args=False)).memory
    assert at is not None and measured is not None and at.inflight_after == measured.inflight_after
    below = Overrides(sets=[f"components.learner.mem={(learner.mem_mb - 64) * 2}M"])
    with pytest.raises(HetrunError):  # 64 MB less would not plan
        build_plan_explained(load_spec(small / "job.yaml", below, check_args=False))


def balanced_run(run_dir: Path, seconds_per_iteration: float, iterations: int = 20) -> None:
    lines: list[dict] = [{"ev": "start", "rank": 0, "component": "learner"},
                         {"ev": "start", "rank": 1, "component": "rollout"}]
    for it in range(iterations):
        t = seconds_per_iteration * it
        lines += [action(1, "rollout", "rollout", it, t, seconds_per_iteration / 2, steps=100),
                  action(0, "learner", "forward", it, t + seconds_per_iteration / 2, seconds_per_iteration / 2)]
    write_events(run_dir, lines)
    plan_json(run_dir, [("learner", 1), ("rollout", 1)])


def test_tune_says_when_the_run_it_fitted_is_too_short_to_trust(tmp_path: Path) -> None:
    # Session 23's finding (benchmarks/cost_tuning.md): runs of one job with ~2.5 s of steady
    # iterations differed by up to 18 %, whatever their windows' spread; ~10 s by 0-6 %.
    from hetrun.reports.demand.sizing import SHORT_STEADY_S

    balanced_run(tmp_path / "short", 0.1)  # ~1.8 s steady
    balanced_run(tmp_path / "long", 1.0)  # ~18 s steady
    short = [n for n in propose(tmp_path / "short", DEFAULT_PRICES).notes if "steady part lasted" in n]
    assert len(short) == 1 and f"{SHORT_STEADY_S:.0f} s or more" in short[0], short
    assert not [n for n in propose(tmp_path / "long", DEFAULT_PRICES).notes if "steady part lasted" in n]
