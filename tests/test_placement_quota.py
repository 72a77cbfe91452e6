"""Placement's quota left, node count as a candidate dimension and fixed siblings, off-line:
pool snapshots from the real Slurm 22.05 sinfo sample (GPU types and load set per node),
running jobs in squeue --json's shape, and limits as sacctmgr -n -P printed them on
Slurm 22.05 (tests/test_policy_plan.py's LIVE_* samples, in hetrun's policy formats)."""

from __future__ import annotations

import copy
import json
import textwrap
from pathlib import Path

import pytest
from hetrun.dag.needs import component_needs
from hetrun.dag.plan import Plan, build_plan
from hetrun.dag.spec import load_spec
from hetrun.slurm_plugin import placement, placement_fit, pool, quota
from hetrun.slurm_plugin.render import render_sbatch
from test_placement import DATA, TYPES, snapshot
from test_placement_spec import AUTO, spec_error, starts_in, write
from test_policy_plan import LIVE_ASSOC, LIVE_QOS

from hetrun.errors import SlurmError, SpecError


def running(*jobs: tuple[str, str, str, str]) -> list[pool.RunningUse]:
    """Running jobs (account, user, qos, tres_alloc_str) read through squeue --json's parser."""
    data = {"jobs": [{"job_state": "RUNNING", "account": a, "user_name": u, "qos": q, "tres_alloc_str": t}
                     for a, u, q, t in jobs] + [{"job_state": "PENDING", "account": "vision", "user_name": "alice",
                                                 "qos": "pool_normal", "tres_alloc_str": "gres/gpu=8"}]}
    return pool.running_from_squeue(data)


def alice_quotas(uses: list[pool.RunningUse], qos: str | None = None, assoc: str = LIVE_ASSOC) -> quota.Quotas:
    limits, qos = quota.limits_for(assoc, LIVE_QOS, uses, "alice", "vision", qos)
    return quota.Quotas("alice", "vision", qos, limits)


def test_limits_bind_the_user_the_account_and_the_qos() -> None:
    uses = running(("vision", "alice", "pool_normal", "cpu=1,mem=100M,node=1,billing=1,gres/gpu=1"),
                   ("vision", "bob", "pool_normal", "cpu=2,mem=2G,node=1,gres/gpu=2"),
                   ("root", "root", "normal", "cpu=1,node=1,gres/gpu=2"))
    q = alice_quotas(uses)
    assert q.qos == "pool_normal"  # the association's DefaultQOS
    by_scope = {lim.scope: lim for lim in q.limits}
    assert by_scope["user alice in account vision"].used == {"cpu": 1, "mem": 100, "node": 1, "gres/gpu": 1}
    assert by_scope["account vision"].limits == {"cpu": 6, "gres/gpu": 4, "mem": 8192}
    assert by_scope["account vision"].used["gres/gpu"] == 3  # alice's and bob's, not root's; pending not
    # Two GPUs more would pass alice's own cap (1 + 2 > 2? yes: out) -- the first limit that breaks names itself.
    why, _, _ = quota.check(q, {"gres/gpu": 2})
    assert why == "over quota: user alice in account vision has 1 of 2 GPUs in use, this needs 2"
    why, share, reasons = quota.check(q, {"gres/gpu": 1, "cpu": 1})
    assert why is None and share == 1.0 and reasons == ["quota: user alice in account vision at 2 of 2 GPUs "
                                                        "with it (100%)"]
    critical = alice_quotas(uses, qos="pool_critical")  # the job's own slurm.qos: MaxTRESPerUser 4 GPUs
    assert critical.limits[-1].scope == "QOS pool_critical per user alice" and critical.limits[-1].used == {}


def test_a_parent_accounts_limit_counts_its_sub_accounts() -> None:
    assoc = LIVE_ASSOC + "vision_a|||1|||pool_normal|pool_normal|vision\nvision_a|carol||1|||pool_normal|pool_normal|\n"
    uses = running(("vision_a", "carol", "pool_normal", "cpu=4,node=1,gres/gpu=3"))
    limits, _ = quota.limits_for(assoc, LIVE_QOS, uses, "carol", "vision_a", None)
    [parent] = limits
    assert (parent.scope, parent.used["gres/gpu"]) == ("account vision", 3)
    why, _, _ = quota.check(quota.Quotas("carol", "vision_a", None, limits), {"gres/gpu": 2})
    assert why == "over quota: account vision has 3 of 4 GPUs in use, this needs 2"


def test_over_quota_is_out_and_close_to_quota_scores_lower() -> None:
    snap = snapshot(TYPES, busy=set())
    need = placement.Need(1, 1, 1, 500)
    free = placement.score(need, snap)
    uses = running(("vision", "bob", "pool_normal", "cpu=2,node=1,gres/gpu=2"))
    near = placement.score(need, snap, alice_quotas(uses))  # 3 of 4 account GPUs with it
    assert [c.label for c in near] == [c.label for c in free]
    assert all(n.score == pytest.approx(f.score - placement.QUOTA_NEAR_PENALTY * 0.5) for n, f in zip(near, free, strict=True))
    assert "quota: account vision at 3 of 4 GPUs with it (75%)" in near[0].reasons
    full = alice_quotas(running(("vision", "bob", "pool_normal", "cpu=2,node=1,gres/gpu=4")))
    assert placement.score(need, snap, full) == []
    out = placement.excluded(need, snap, full)
    assert "debug gpu:a100: over quota: account vision has 4 of 4 GPUs in use, this needs 1" in out, out


def test_over_quota_only_with_what_runs_waits_and_over_alone_is_refused(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, AUTO.replace("slurm: {partition: debug,", "slurm: {")))
    full = alice_quotas(running(("vision", "bob", "pool_normal", "cpu=2,node=1,gres/gpu=4")))  # vision 4 of 4
    fits = placement_fit.fit_components(component_needs(spec), snapshot(TYPES, busy=set()),
                                        starts_in({"debug": 0, "high": 0}), ["trainer"], full)
    best = fits["trainer"].best
    # Slurm would queue it until bob's GPUs are back (AssocGrpGRES): it still goes, waiting, last resort.
    assert best is not None and not best.fits_now and best.nodes == []
    assert "over quota: account vision has 4 of 4 GPUs in use, this needs 2: Slurm holds it until the quota " \
           "frees" in best.reasons, best.reasons
    assert all(c.score < placement.FITS_NOW_BONUS - placement_fit.QUOTA_WAIT_PENALTY + 50 for c in
               fits["trainer"].candidates)
    big = load_spec(write(tmp_path, AUTO.replace("slurm: {partition: debug,", "slurm: {").replace(
        "gpus_per_node: 2", "gpus_per_node: 2\n    node_counts: [1, 2]").replace("nodes: 1\n    tasks_per_node: 2",
                                                                             "nodes: 2\n    tasks_per_node: 1")))
    full = alice_quotas(running(("vision", "bob", "pool_normal", "cpu=2,node=1,gres/gpu=4")))  # not taken yet
    fits = placement_fit.fit_components(component_needs(big), snapshot(TYPES, busy=set()),
                                        starts_in({"debug": 0, "high": 0}), ["trainer"], full)
    assert fits["trainer"].best is None  # 4 GPUs: over alice's own cap of 2 even with nothing else running
    assert any("over quota: user alice in account vision allows 2 GPUs, this needs 4" in x
               for x in fits["trainer"].excluded), fits["trainer"].excluded


def test_a_typed_gpu_quota_sends_the_job_to_the_other_type(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, AUTO.replace("slurm: {partition: debug,", "slurm: {")))
    assoc = LIVE_ASSOC.replace("cpu=6,gres/gpu=4,mem=8G", "gres/gpu:a100=2,gres/gpu=8")
    uses = running(("vision", "bob", "pool_normal", "cpu=1,node=1,gres/gpu=1,gres/gpu:a100=1"))
    fits = placement_fit.fit_components(component_needs(spec), snapshot(TYPES, busy={"n3"}),
                                        starts_in({"debug": 0, "high": 0}), ["trainer"],
                                        alice_quotas(uses, assoc=assoc))
    trainer = fits["trainer"]
    # a100 is idler (n3 of v100 is busy), but account vision has 1 of its 2 a100s in use and this needs 2.
    assert {c.gres for c in trainer.candidates} == {"gpu:v100"}
    assert any("over quota: account vision has 1 of 2 a100 GPUs in use, this needs 2" in x for x in trainer.excluded)


def test_siblings_share_the_quota_and_choose_names_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    two = AUTO.replace("  watcher:\n    nodes: 1\n    mem: 500M\n",
                       "  second:\n    nodes: 1\n    gpus_per_node: 2\n    mem: 500M\n    placement: auto\n")
    spec = load_spec(write(tmp_path, two.replace("slurm: {partition: debug,", "slurm: {")))
    q = alice_quotas(running())  # vision: 4 GPUs, alice: 2 GPUs; nothing running
    fits = placement_fit.fit_components(component_needs(spec), snapshot(TYPES, busy=set()),
                                        starts_in({"debug": 0, "high": 0}), None, q)
    assert fits["trainer"].best is not None and fits["second"].best is None
    assert any("user alice in account vision has 2 of 2 GPUs in use (2 by this job's other components), "
               "this needs 2" in x
               for x in fits["second"].excluded)
    sinfo = (DATA / "sinfo.json").read_text()
    texts = {"sinfo": sinfo, "squeue": (DATA / "squeue.json").read_text(), "sacct": (DATA / "sacct.txt").read_text(),
             "scontrol": ENFORCING}

    def recorded_slurm(argv):  # the real 22.05 samples; sacctmgr as it printed the policy's limits
        if argv[0] == "sacctmgr":
            return {"assoc": LIVE_ASSOC, "qos": LIVE_QOS}[argv[4]]
        if argv[:3] == ["scontrol", "show", "assoc_mgr"]:
            return ALICE_ASSOC_MGR
        return texts.get(argv[0], "")

    monkeypatch.setattr(quota, "submitter", lambda: "alice")  # the test runs as root; the sample's user is alice
    untyped = load_spec(write(tmp_path, two.replace("slurm: {partition: debug,", "slurm: {").replace(
        "    gpu_types: [a100, v100]\n", "")))  # the sample's GPUs have no type
    with pytest.raises(SpecError, match=r"component 'second' .* over quota: user alice in account vision"):
        placement_fit.choose(untyped, run=recorded_slurm, test_only=starts_in({"debug": 0, "high": 0}))


# scontrol show config lines as Slurm 22.05 prints them; the shared test cluster's says "none".
ENFORCING = "ClusterName             = hetrun\nAccountingStorageEnforce = associations,limits,qos,safe\n"
# scontrol show assoc_mgr flags=assoc users=root as the shared cluster printed it, made alice's in vision.
ALICE_ASSOC_MGR = (DATA / "assoc_mgr.txt").read_text().replace("Account=root UserName=root(0)",
                                                               "Account=vision UserName=alice(1000)")


def test_the_default_account_is_slurmctlds() -> None:
    real = (DATA / "assoc_mgr.txt").read_text()
    assert "DefAssoc=Yes" in real and quota.default_account(real) == "root"
    assert quota.default_account(ALICE_ASSOC_MGR) == "vision"
    assert quota.default_account(real.replace("DefAssoc=Yes", "DefAssoc=No")) is None


def test_read_quotas_asks_slurm_and_says_when_it_cannot() -> None:
    calls = []
    config = [ENFORCING]

    def recorded_slurm(argv: list[str]) -> str:
        calls.append(argv)
        if argv[0] == "scontrol":
            return config[0] if argv[2] == "config" else ALICE_ASSOC_MGR
        return {"assoc": LIVE_ASSOC, "qos": LIVE_QOS}[argv[4]]

    q = quota.read_quotas(recorded_slurm, [], user="alice")
    assert (q.account, q.qos, len(q.limits)) == ("vision", "pool_normal", 2)
    assert calls[1] == ["scontrol", "show", "assoc_mgr", "flags=assoc", "users=alice"]
    assert next(c for c in calls if "assoc" in c)[5:7] == ["where", "cluster=hetrun"]
    calls.clear()
    assert quota.read_quotas(recorded_slurm, [], user="alice", account="vision").account == "vision"
    assert not any("assoc_mgr" in c for c in calls)  # the job named its account: no default asked
    calls.clear()
    config[0] = "ClusterName             = hetrun\nAccountingStorageEnforce = none\n"
    off = quota.read_quotas(recorded_slurm, [], user="alice", account="vision")
    assert off.unavailable == "Slurm does not enforce limits (AccountingStorageEnforce=none)" and not off.limits
    assert len(calls) == 1  # nothing more is read where nothing is enforced

    def no_accounting(argv: list[str]) -> str:
        raise SlurmError("sacctmgr: error: Problem talking to the database: Connection refused")

    off = quota.read_quotas(no_accounting, [], user="alice", account="vision")
    assert off.unavailable and "Connection refused" in off.unavailable and off.limits == []
    assert placement_fit.quota_lines(off) == ["quota: user alice, account vision, QOS ?: not read (sacctmgr: "
                                              "error: Problem talking to the database: Connection refused); "
                                              "not checked"]


def test_fixed_siblings_are_taken_before_auto_ones_are_scored(tmp_path: Path) -> None:
    # The auto component comes first in het order, the fixed one (2 GPUs, any partition) second.
    job = AUTO.replace("  watcher:\n    nodes: 1\n    mem: 500M\n",
                       "  fixedgpu:\n    nodes: 1\n    gpus_per_node: 2\n    mem: 500M\n")
    spec = load_spec(write(tmp_path, job.replace("slurm: {partition: debug,", "slurm: {")))
    snap = snapshot(TYPES, busy={"n1", "n2", "n3"})  # one free GPU node: n4
    fits = placement_fit.fit_components(component_needs(spec), snap, starts_in({"debug": 0, "high": 0}),
                                        ["trainer"])
    assert list(fits) == ["trainer"]
    assert not fits["trainer"].best.fits_now  # n4 is the fixed sibling's: the auto one must wait
    assert next(n for n in snap.nodes if n.name == "n4").gpus_free == 0
    shown = placement_fit.fit_components(component_needs(spec), snapshot(TYPES, busy={"n1", "n2", "n3"}),
                                         starts_in({"debug": 0, "high": 0}))  # explain: both, fixed too
    assert shown["fixedgpu"].best.nodes == ["n4"] and not shown["trainer"].best.fits_now


NODE_COUNTS = AUTO.replace("    gpu_types: [a100, v100]\n", "    gpu_types: [a100, v100]\n    node_counts: [1, 2]\n")


def half_busy(names: set[str]) -> pool.PoolSnapshot:
    """``snapshot`` with one CPU, one GPU and half the memory of each node in ``names`` in use."""
    snap = snapshot(TYPES, busy=set())
    data = copy.deepcopy(json.loads((DATA / "sinfo.json").read_text()))
    for node in data["nodes"]:
        gtype = TYPES[node["name"]]
        half = node["name"] in names
        node.update(gres=f"gpu:{gtype}:2", gres_used=f"gpu:{gtype}:{1 if half else 0}", state="mixed" if half else
                    "idle", alloc_cpus=1 if half else 0, alloc_memory=node["real_memory"] // 2 if half else 0,
                    state_flags=[], reason="")
    snap.rows, snap.nodes = pool.rows_from_sinfo(data), pool.nodes_from_sinfo(data)
    return snap


def test_node_count_is_a_dimension_and_goes_into_the_het_block(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, NODE_COUNTS.replace("slurm: {partition: debug,", "slurm: {")))
    need = component_needs(spec)["trainer"]
    assert need.node_counts == (1, 2)
    assert [(n.nodes, n.cpus_per_node, n.gpus_per_node, n.mem_mb_per_node) for n in need.by_count] == \
        [(1, 2, 2, 1000), (2, 1, 1, 500)]
    # On an idle pool the fewest nodes win (the wider shape keeps more whole nodes from others).
    idle = placement_fit.fit_components(component_needs(spec), half_busy(set()), starts_in({"debug": 0, "high": 0}),
                                        ["trainer"])
    assert idle["trainer"].best.node_count == 1
    assert any(c.node_count == 2 and "2 nodes, 1 more than the fewest allowed" in c.reasons
               for c in idle["trainer"].candidates)
    # Every node half busy: no node has 2 GPUs free, but two nodes of 1 free GPU each start now.
    fits = placement_fit.fit_components(component_needs(spec), half_busy({"n1", "n2", "n3", "n4"}),
                                        starts_in({"debug": 0, "high": 0}), ["trainer"])
    best = fits["trainer"].best
    assert (best.node_count, best.fits_now, len(best.nodes)) == (2, True, 2)
    plan = placement_fit.record(build_plan(spec), placement_fit.FitReport(fits, 0.0))
    comp = json.loads(plan.to_json())["components"][0]
    assert (comp["nodes"], comp["tasks_per_node"], comp["ntasks"], comp["gpus_per_node"], comp["mem_mb"]) == \
        (2, 1, 2, 1, 500)
    assert comp["placement"]["node_count"] == 2 and any(" x1 nodes: score" in o for o in comp["placement"]["others"])
    assert Plan.from_json(plan.to_json()).components[0].placement.node_count == 2
    script = render_sbatch(plan, spec, tmp_path / "run", python="/usr/bin/python3")
    trainer = script.split("#SBATCH hetjob")[0]
    assert "#SBATCH --nodes=2" in trainer and "#SBATCH --ntasks-per-node=1" in trainer, trainer
    assert f"#SBATCH --gres=gpu:{best.gres.split(':')[1]}:1" in trainer
    lines = placement_fit.explain_lines(placement_fit.FitReport(fits, 0.0))
    assert any("node counts 1, 2" in ln for ln in lines) and any(ln.startswith("  best ") and " x2 nodes:" in ln
                                                                 for ln in lines), lines


def test_cross_node_traffic_costs_more_per_extra_node(tmp_path: Path) -> None:
    moe = textwrap.dedent("""\
        name: moe
        workload: pkg.mod:Work
        workload_args: {num_experts: 8}
        components:
          learner:
            nodes: 1
            tasks_per_node: 2
            gpus_per_node: 2
            mem: 2G
            placement: auto
            node_counts: [1, 2]
            actions: [forward, backward, sync, optimize, checkpoint]
        training: {kind: supervised, iterations: 10}
        """)
    need = component_needs(load_spec(write(tmp_path, moe), check_args=False))["learner"]
    assert need.cross_node == 3.0  # allreduce + MoE all-to-all
    cands = placement.score(placement.Need.shapes(need)[1], snapshot(TYPES, busy=set()))
    plain = placement.score(placement.Need(2, 1, 1, 1024, fewest_nodes=1), snapshot(TYPES, busy=set()))
    assert cands[0].score == pytest.approx(plain[0].score - placement.CROSS_NODE_PENALTY * 3.0)
    assert "2 nodes, 1 more than the fewest allowed (its traffic crosses more nodes)" in cands[0].reasons


@pytest.mark.parametrize("old, new, key, words", [
    ("    placement: auto\n", "", "components.trainer.gpu_types", "placement: auto"),
    ("node_counts: [1, 2]", "node_counts: [1, 3]", "components.trainer.node_counts", "do not split evenly over 3"),
    ("node_counts: [1, 2]", "node_counts: [0, 2]", "components.trainer.node_counts", "entry 0"),
    ("node_counts: [1, 2]", "node_counts: [2, 2]", "components.trainer.node_counts", "listed twice: 2"),
    ("node_counts: [1, 2]", "node_counts: [1, '2']", "components.trainer.node_counts[1]", "expected an integer"),
])
def test_node_counts_errors_name_file_line_and_key(tmp_path: Path, old: str, new: str, key: str, words: str) -> None:
    text = NODE_COUNTS.replace(old, new)
    if old.startswith("    placement"):  # on a fixed component (gpu_types removed too: node_counts is refused)
        text = text.replace("    gpu_types: [a100, v100]\n", "")
        key = "components.trainer.node_counts"
    err = spec_error(tmp_path, text)
    assert err.key_path == key and words in str(err), str(err)
    assert err.line is not None and str(err).startswith(f"{err.file}:{err.line}:")


def test_node_counts_survive_job_yaml(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, NODE_COUNTS))
    out = spec.to_yaml()
    assert load_spec(write(tmp_path, out)).components["trainer"].node_counts == [1, 2]
    assert out.count("node_counts") == 1  # the fixed watcher's job.yaml reads as before


def test_the_node_check_accepts_a_component_one_of_whose_counts_fits(tmp_path: Path) -> None:
    from hetrun.dag.action import NodeCapacity
    from hetrun.dag.schedule import check_fits_nodes

    from hetrun.errors import GraphError

    caps = [NodeCapacity(f"n{i}", cpus=2, gpus=2, mem_mb=4000) for i in range(1, 5)]
    wide = NODE_COUNTS.replace("tasks_per_node: 2", "tasks_per_node: 4").replace("gpus_per_node: 2",
                                                                                 "gpus_per_node: 4")
    spec = load_spec(write(tmp_path, wide))  # 4 ranks: 1 node x 4 CPUs never fits, 2 nodes x 2 do
    check_fits_nodes([], spec, caps)  # command components: no actions to check
    one = load_spec(write(tmp_path, wide.replace("node_counts: [1, 2]", "node_counts: [1]")))
    with pytest.raises(GraphError, match=r"needs 4 CPUs per node \(max 2\), 4 GPUs per node"):
        check_fits_nodes([], one, caps)


def test_typed_tres_match_whatever_the_case_of_the_gres_type() -> None:
    # Slurm keeps a GRES type's spelling (gpu:A100); a limit may be written gres/gpu:a100.
    uses = running(("vision", "bob", "pool_normal", "gres/gpu=1,gres/gpu:A100=1"))
    q = alice_quotas(uses, assoc=LIVE_ASSOC.replace("cpu=6,gres/gpu=4,mem=8G", "gres/gpu:a100=2"))
    assert quota.check(q, quota.job_tres(1, 1, 2, 0, "gpu:A100"))[0] == \
        "over quota: account vision has 1 of 2 a100 GPUs in use, this needs 2"
