"""Placement by the work a preemption would lose (placement.preemption_loss), off-line on pool
snapshots built from the real Slurm 22.05 sinfo sample: where a job that may preempt has to,
the group whose preemption loses least ranks first (idle > checkpointing jobs > the youngest
plain job > older ones); a job that may preempt nothing is ranked as before."""

from __future__ import annotations

from dataclasses import replace

from hetrun.dag.needs import ComponentNeed
from hetrun.slurm_plugin import placement, placement_fit, pool, quota
from test_placement import TYPES, snapshot

NOW = 10_000.0
PREEMPTS, CLEAN = ("normal", "normal_ckpt"), ("normal_ckpt",)
PAIR = placement.Need(nodes=2, cpus_per_node=1, gpus_per_node=2, preempts=PREEMPTS, stops_clean=CLEAN)


def busy_with(*jobs: tuple[str, tuple[str, ...], float]) -> pool.PoolSnapshot:
    """Every GPU node full; ``jobs``: (qos, nodes, seconds it has run) of the running jobs."""
    snap = snapshot(TYPES, busy=set(TYPES))
    snap.taken_at = NOW
    snap.running_use = [pool.RunningUse("team", "u", qos, {"node": len(nodes)}, i + 1, nodes, NOW - ran)
                        for i, (qos, nodes, ran) in enumerate(jobs)]
    return snap


def best_gres(need: placement.Need, snap: pool.PoolSnapshot) -> str:
    return placement.score(need, snap)[0].gres


def test_checkpointing_jobs_are_preempted_before_plain_ones_whatever_their_age() -> None:
    snap = busy_with(("normal", ("n1", "n2"), 5), ("normal_ckpt", ("n3", "n4"), 600))
    assert best_gres(PAIR, snap) == "gpu:v100"
    v100 = placement.score(PAIR, snap)[0]
    assert "a start by preemption loses ~0 node-s of work" in v100.reasons
    snap = busy_with(("normal_ckpt", ("n1", "n2"), 600), ("normal", ("n3", "n4"), 5))
    assert best_gres(PAIR, snap) == "gpu:a100"


def test_the_youngest_plain_job_goes_first_and_the_loss_is_its_node_seconds() -> None:
    snap = busy_with(("normal", ("n1", "n2"), 30), ("normal", ("n3", "n4"), 300))
    assert best_gres(PAIR, snap) == "gpu:a100"
    assert placement.preemption_loss(PAIR, [n for n in snap.nodes if n.gres == "gpu:a100"], snap) == 60.0
    snap = busy_with(("normal", ("n1",), 30), ("normal", ("n2",), 40), ("normal", ("n3", "n4"), 20))
    assert placement.preemption_loss(PAIR, [n for n in snap.nodes if n.gres == "gpu:a100"], snap) == 70.0
    assert best_gres(PAIR, snap) == "gpu:v100"  # 40 node-s against 70


def test_a_group_preemption_cannot_free_ranks_below_one_it_can() -> None:
    # n1 + n2 run a job of a QOS this one may not preempt: only v100 can be freed
    snap = busy_with(("high", ("n1", "n2"), 5), ("normal", ("n3", "n4"), 3000))
    assert placement.preemption_loss(PAIR, [n for n in snap.nodes if n.gres == "gpu:a100"], snap) is None
    assert best_gres(PAIR, snap) == "gpu:v100"
    a100 = next(c for c in placement.score(PAIR, snap) if c.gres == "gpu:a100")
    assert "preemption cannot free enough nodes" in a100.reasons


def test_an_age_bound_takes_young_plain_jobs_and_checkpointing_ones_but_no_older_plain_job() -> None:
    """``Need.young_s``: a plain job that has run past it is no victim; a young one and a
    checkpointing one of any age are. The candidate carries the start's loss."""
    young = replace(PAIR, young_s=20.0)
    snap = busy_with(("normal", ("n1", "n2"), 30), ("normal", ("n3",), 10), ("normal_ckpt", ("n4",), 900))
    a100 = [n for n in snap.nodes if n.gres == "gpu:a100"]
    v100 = [n for n in snap.nodes if n.gres == "gpu:v100"]
    assert placement.preemption_loss(PAIR, a100, snap) == 60.0  # no bound: the 30 s job is taken
    assert placement.preemption_loss(young, a100, snap) is None  # bound: it is spared
    assert placement.preemption_loss(young, v100, snap) == 10.0  # the 10 s job and the _ckpt one
    best = placement.score(young, snap)[0]
    assert (best.gres, best.preempt_loss, best.preempt_nodes) == ("gpu:v100", 10.0, ["n4", "n3"])
    a100_cand = next(c for c in placement.score(young, snap) if c.gres == "gpu:a100")
    assert a100_cand.preempt_loss is None and "preemption cannot free enough nodes" in a100_cand.reasons
    snap.running_use[1].start = 0.0  # a start time not known: not known to be young
    assert placement.preemption_loss(young, v100, snap) is None


def test_a_job_that_may_preempt_nothing_is_scored_as_before() -> None:
    plain = placement.Need(nodes=2, cpus_per_node=1, gpus_per_node=2)
    for jobs in ((("normal", ("n1", "n2"), 5), ("normal_ckpt", ("n3", "n4"), 600)),
                 (("normal_ckpt", ("n1", "n2"), 600), ("normal", ("n3", "n4"), 5))):
        snap = busy_with(*jobs)
        assert [(c.partition, c.gres, c.score) for c in placement.score(plain, snap)] == \
               [(c.partition, c.gres, c.score) for c in placement.score(plain, snapshot(TYPES, busy=set(TYPES)))]
    # and a group that fits now keeps its lead: no preemption is needed there
    snap = snapshot(TYPES, busy={"n1", "n2"})
    assert best_gres(PAIR, snap) == "gpu:v100" and placement.score(PAIR, snap)[0].fits_now


def test_squeue_running_jobs_carry_their_nodes_and_start() -> None:
    data = {"jobs": [{"job_state": "RUNNING", "job_id": 7, "account": "a", "user_name": "u", "qos": "normal",
                      "tres_alloc_str": "cpu=8,node=2", "nodes": "n[1-2]", "start_time": 1234},
                     {"job_state": "PENDING", "job_id": 8, "nodes": "", "start_time": 0}]}
    (job,) = pool.running_from_squeue(data)
    assert (job.job_id, job.nodes, job.start, job.tres["cpu"]) == (7, ("n1", "n2"), 1234.0, 8)


# sacctmgr -n -P show qos format=Name,Priority,Preempt,PreemptMode,MaxWall,GrpTRES,MaxTRESPU,Flags,GraceTime
# as the policy renders its tiers with scheduling.checkpointed (a _ckpt QOS per tier, with a GraceTime).
SACCTMGR_QOS = """\
normal|0||cluster|||||00:00:00
pool_critical|3000|pool_high,pool_high_ckpt,pool_normal,pool_normal_ckpt|requeue||||DenyOnLimit|00:00:00
pool_high|2000|pool_normal,pool_normal_ckpt|requeue||||DenyOnLimit|00:00:00
pool_high_ckpt|1950|pool_normal,pool_normal_ckpt|requeue||||DenyOnLimit|00:00:00
pool_normal|1000||requeue||||DenyOnLimit|00:00:00
pool_normal_ckpt|950||requeue||||DenyOnLimit|00:02:00
"""


def test_the_jobs_qos_says_what_it_may_preempt_and_which_of_those_stop_clean() -> None:
    preempts, clean = quota.preemption_of(SACCTMGR_QOS, "pool_critical")
    assert set(preempts) == {"pool_high", "pool_high_ckpt", "pool_normal", "pool_normal_ckpt"}
    # pool_high_ckpt has no GraceTime here: KillWait is its grace (SIGTERM first), still clean.
    assert clean == ("pool_high_ckpt", "pool_normal_ckpt")
    assert quota.preemption_of(SACCTMGR_QOS, "pool_normal") == ((), ())
    assert quota.preemption_of(SACCTMGR_QOS, "tier-name-the-lua-maps") == ((), ())
    assert quota.preemption_of(SACCTMGR_QOS, None) == ((), ())


def test_submits_placement_counts_the_work_a_preemption_loses() -> None:
    """placement: auto / submit --fit: the QOS read with the quotas fills each shape's Need."""
    needs = {"learner": ComponentNeed("learner", "auto", 2, 1, 2, 0, 0)}
    snap = busy_with(("pool_normal", ("n1", "n2"), 5), ("pool_normal_ckpt", ("n3", "n4"), 600))
    preempts, clean = quota.preemption_of(SACCTMGR_QOS, "pool_critical")
    critical = quota.Quotas("alice", "vision", "pool_critical", preempts=preempts, stops_clean=clean)
    best = placement_fit.fit_components(needs, snap, None, quotas=critical)["learner"].best
    assert best is not None and best.gres == "gpu:v100"  # the checkpointing job's nodes
    assert "a start by preemption loses ~0 node-s of work" in best.reasons
    # The plain young job's nodes when the checkpointing one would not stop clean.
    plain = quota.Quotas("alice", "vision", "pool_critical", preempts=preempts)
    assert placement_fit.fit_components(needs, snap, None, quotas=plain)["learner"].best.gres == "gpu:a100"
    # A QOS that may preempt nothing: no preemption term at all.
    none = placement_fit.fit_components(needs, snap, None, quotas=quota.Quotas("alice", "vision", "pool_normal"))
    assert not any("preemption" in r for r in none["learner"].best.reasons)


def busy_three(*jobs: tuple[str, tuple[str, ...], float]) -> pool.PoolSnapshot:
    """Three a100 nodes (n1-n3) and one v100 (n4), every one full; ``jobs`` as ``busy_with``'s."""
    types = {"n1": "a100", "n2": "a100", "n3": "a100", "n4": "v100"}
    snap = snapshot(types, busy=set(types))
    snap.taken_at = NOW
    snap.running_use = [pool.RunningUse("team", "u", qos, {"node": len(nodes)}, i + 1, nodes, NOW - ran)
                        for i, (qos, nodes, ran) in enumerate(jobs)]
    return snap


A100 = placement.Need(nodes=1, cpus_per_node=1, gpus_per_node=2, gpu_types=("a100",), partitions=("debug",),
                      preempts=PREEMPTS, stops_clean=CLEAN)


def test_the_victims_nodes_are_named_where_slurm_would_take_the_smallest_oldest_job() -> None:
    # Slurm's preempt/qos takes the smallest job of the lowest QOS (ties: the first), here the
    # 1-node job that has run 10 minutes; the 1-node job started 5 s ago loses least.
    snap = busy_three(("normal", ("n1",), 600), ("normal", ("n2",), 5), ("normal", ("n3",), 300),
                      ("normal", ("n4",), 900))
    plan = placement.preemption_plan(A100, [n for n in snap.nodes if n.gres == "gpu:a100"], snap)
    assert plan == placement.Preemption(5.0, ("n2",))
    (best,) = placement.score(A100, snap)
    assert (best.fits_now, best.preempt_nodes) == (False, ["n2"])
    ranked = placement_fit.ranked_list([best], gpus=True)
    assert (ranked.partitions, ranked.gres, ranked.nodelist) == (["debug"], "gpu:a100", ["n2"])


def test_a_cheap_victim_a_larger_one_makes_unneeded_is_given_back() -> None:
    # two nodes: the 1-node job on n1 (10 node-s) is taken first, then the 2-node one on n2+n3
    # (20 node-s) is needed anyway and frees both: n1's job runs on
    two = placement.Need(nodes=2, cpus_per_node=1, gpus_per_node=2, gpu_types=("a100",), partitions=("debug",),
                         preempts=PREEMPTS, stops_clean=CLEAN)
    snap = busy_three(("normal", ("n1",), 10), ("normal", ("n2", "n3"), 10), ("normal", ("n4",), 5))
    plan = placement.preemption_plan(two, [n for n in snap.nodes if n.gres == "gpu:a100"], snap)
    assert plan == placement.Preemption(20.0, ("n2", "n3"))


def test_idle_nodes_go_first_and_only_the_rest_are_named() -> None:
    two = placement.Need(nodes=2, cpus_per_node=1, gpus_per_node=2, gpu_types=("a100",), partitions=("debug",),
                         preempts=PREEMPTS, stops_clean=CLEAN)
    types = {"n1": "a100", "n2": "a100", "n3": "a100", "n4": "v100"}
    snap = snapshot(types, busy={"n2", "n3", "n4"})  # n1 idle
    snap.taken_at = NOW
    snap.running_use = [pool.RunningUse("team", "u", "normal", {"node": 1}, 1, ("n2",), NOW - 50),
                        pool.RunningUse("team", "u", "normal_ckpt", {"node": 1}, 2, ("n3",), NOW - 900)]
    plan = placement.preemption_plan(two, [n for n in snap.nodes if n.gres == "gpu:a100"], snap)
    assert plan == placement.Preemption(0.0, ("n3",))  # n1 idle, n3's job stops clean


def test_nodes_a_pending_job_names_are_neither_idle_nor_anyones_victims() -> None:
    snap = busy_three(("normal", ("n1",), 600), ("normal", ("n2",), 5), ("normal", ("n3",), 300),
                      ("normal", ("n4",), 900))
    snap.claimed = ("n2",)  # another placement's victim, its preemptor pending
    plan = placement.preemption_plan(A100, [n for n in snap.nodes if n.gres == "gpu:a100"], snap)
    assert plan == placement.Preemption(300.0, ("n3",))
    snap.claimed = ("n1", "n2", "n3")
    assert placement.preemption_plan(A100, [n for n in snap.nodes if n.gres == "gpu:a100"], snap) is None
    data = {"jobs": [{"job_state": "PENDING", "required_nodes": "n[2-3]"},
                     {"job_state": "PENDING", "required_nodes": ""},
                     {"job_state": "RUNNING", "required_nodes": "n4"}]}
    assert pool.claimed_from_squeue(data) == ("n2", "n3")


def test_a_group_that_fits_now_names_no_nodes() -> None:
    snap = snapshot(TYPES, busy={"n1", "n2"})
    best = placement.score(PAIR, snap)[0]
    assert best.fits_now and best.preempt_nodes == []
    assert placement_fit.ranked_list(placement.score(PAIR, snap), gpus=True).nodelist == []


def critical_fit(tmp_path, mode: str = "auto"):  # type: ignore[no-untyped-def]
    """``placement: MODE`` of a critical job against a pool whose every GPU node is full: a
    plain job that started 5 s ago on the a100 nodes, one that has run 10 minutes on the v100
    ones (the spec, and the fit ``hetrun submit`` records)."""
    from hetrun.dag.needs import component_needs
    from hetrun.dag.spec import load_spec
    from test_placement_spec import AUTO, write

    text = AUTO.replace("slurm: {partition: debug,", "slurm: {").replace("placement: auto", f"placement: {mode}")
    spec = load_spec(write(tmp_path, text))
    snap = busy_with(("pool_normal", ("n1", "n2"), 5), ("pool_normal", ("n3", "n4"), 600))
    preempts, clean = quota.preemption_of(SACCTMGR_QOS, "pool_critical")
    critical = quota.Quotas("alice", "vision", "pool_critical", preempts=preempts, stops_clean=clean)
    fits = placement_fit.fit_components(component_needs(spec), snap, None, ["trainer"], quotas=critical)
    return spec, placement_fit.FitReport(fits, snap.taken_at)


def critical_plan(tmp_path):  # type: ignore[no-untyped-def]
    """``critical_fit``'s spec and the plan as ``hetrun submit`` records it."""
    from hetrun.dag.plan import build_plan

    spec, report = critical_fit(tmp_path)
    return spec, placement_fit.record(build_plan(spec), report)


def test_explain_shows_ranked_handing_slurm_the_named_nodes(tmp_path) -> None:
    """`hetrun plan --explain` of a ranked component that must preempt: its partition alone and
    the victims' node, as the het block will ask."""
    _, report = critical_fit(tmp_path, "ranked")
    lines = placement_fit.explain_lines(report)
    assert "  ranked: Slurm is handed --partition=debug --gres=gpu:a100:2 --nodelist=n1" in lines, lines


def test_submit_records_the_victims_nodes_and_the_script_names_them(tmp_path) -> None:
    """The young plain job on the a100 nodes loses least: plan.json records its node, the het
    block asks Slurm for it, and `hetrun submit` says so."""
    from hetrun.cli.submit_cmd import placement_lines
    from hetrun.dag.plan import Plan
    from hetrun.slurm_plugin.render import render_sbatch

    spec, plan = critical_plan(tmp_path)
    choice = Plan.from_json(plan.to_json()).components[0].placement
    assert choice is not None and choice.gres == "gpu:a100" and choice.nodelist == ["n1"], choice
    assert any(r.startswith("starts by preemption on n1: the jobs there lose least") for r in choice.reasons)
    trainer, watcher = render_sbatch(plan, spec, tmp_path / "run", python="/usr/bin/python3").split("#SBATCH hetjob")
    assert "#SBATCH --nodelist=n1\n" in trainer and f"#SBATCH --partition={choice.partition}\n" in trainer, trainer
    assert "--nodelist" not in watcher
    assert placement_lines(plan)[0].startswith(
        f"placed trainer on {choice.partition} gpu:a100 1 node (a start by preemption, on the named nodes n1)")


def test_a_named_node_that_is_no_slurm_name_is_refused(tmp_path) -> None:
    """plan.json is a file a user can edit before `hetrun submit --plan`: a node name is checked
    before it reaches the script."""
    import pytest
    from hetrun.slurm_plugin.render import render_sbatch

    from hetrun.errors import SpecError

    spec, plan = critical_plan(tmp_path)
    bad = plan.components[0].placement.model_copy(update={"nodelist": ["n1; rm -rf /"]})
    plan = plan.model_copy(update={"components": [plan.components[0].model_copy(update={"placement": bad}),
                                                  *plan.components[1:]]})
    with pytest.raises(SpecError) as info:
        render_sbatch(plan, spec, tmp_path / "run", python="/usr/bin/python3")
    assert info.value.key_path == "components.trainer.placement.nodelist[0]"


def test_two_components_that_start_by_preemption_name_different_nodes() -> None:
    """A het job's components are placed one after another on the same snapshot: the nodes the
    first names are claimed for the second, which preempts elsewhere rather than name them too."""
    needs = {"a": ComponentNeed("a", "auto", 1, 1, 2, 0, 0), "b": ComponentNeed("b", "auto", 1, 1, 2, 0, 0)}
    snap = busy_with(("pool_normal", ("n1",), 5), ("pool_normal", ("n2",), 50), ("pool_normal", ("n3", "n4"), 600))
    preempts, clean = quota.preemption_of(SACCTMGR_QOS, "pool_critical")
    critical = quota.Quotas("alice", "vision", "pool_critical", preempts=preempts, stops_clean=clean)
    fits = placement_fit.fit_components(needs, snap, None, quotas=critical)
    assert (fits["a"].best.preempt_nodes, fits["b"].best.preempt_nodes) == (["n1"], ["n2"])
    assert snap.claimed == ("n1", "n2")
