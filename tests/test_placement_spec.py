"""placement: auto, off-line: the spec keys and their errors, needs derived from the
actions' resource profiles, choosing against a pool snapshot (the real Slurm 22.05
sinfo sample, GPU types and load set per node), the choice in plan.json and the
script, and `hetrun plan --explain`'s placement lines with and without a pool.

The live choice on a real cluster with two GPU types is tests/test_placement_live.py.
"""

from __future__ import annotations

import json
import textwrap
from datetime import datetime
from pathlib import Path

import pytest
from hetrun.dag.needs import component_needs
from hetrun.dag.plan import Plan, build_plan
from hetrun.dag.spec import load_spec
from hetrun.slurm_plugin import placement_fit
from hetrun.slurm_plugin.render import render_sbatch
from test_placement import TYPES, snapshot

from hetrun.errors import HetrunError, SlurmError, SpecError

AUTO = """\
name: fit-demo
components:
  trainer:
    nodes: 1
    tasks_per_node: 2
    gpus_per_node: 2
    mem: 1000M
    placement: auto
    gpu_types: [a100, v100]
    command: [python3, train.py]
  watcher:
    nodes: 1
    mem: 500M
    command: [python3, watch.py]
slurm: {partition: debug, time: "00:10:00"}
"""

ACTIONS = """\
name: needs-demo
workload: pkg.mod:Work
workload_args: {num_experts: 8}
components:
  learner:
    nodes: 2
    tasks_per_node: 2
    cpus_per_task: 2
    gpus_per_node: 1
    mem: 4G
    gpu_mem: 8G
    placement: auto
    actions: [forward, backward, sync, optimize, checkpoint]
  evaluator:
    nodes: 1
    mem: 1G
    actions: [eval]
training: {kind: supervised, iterations: 10, eval_interval: 5}
actions:
  optimize: {gpu_memory: 6G}
  eval: {cpu: 1, memory: 600M}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def spec_error(tmp_path: Path, text: str) -> SpecError:
    with pytest.raises(SpecError) as info:
        load_spec(write(tmp_path, text), check_args=False)
    return info.value


def test_auto_keys_load_and_a_fixed_job_yaml_reads_as_before(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, AUTO))
    trainer, watcher = spec.components["trainer"], spec.components["watcher"]
    assert (trainer.placement, trainer.gpu_types, watcher.placement) == ("auto", ["a100", "v100"], "fixed")
    out = spec.to_yaml()
    assert "placement: auto" in out and out.count("placement") == 1 and out.count("partitions") == 1
    assert load_spec(write(tmp_path, out)).components["trainer"].gpu_types == ["a100", "v100"]


@pytest.mark.parametrize("old, new, key, words", [
    ("    placement: auto\n", "", "components.trainer.gpu_types", "placement: auto"),
    ("placement: auto", "placement: automatic", "components.trainer.placement", "did you mean 'auto'"),
    ("[a100, v100]", "[a100, 'v100 --wrap']", "components.trainer.gpu_types", "entry 1"),
    ("[a100, v100]", "[a100, a100]", "components.trainer.gpu_types", "listed twice: a100"),
    ("    gpu_types: [a100, v100]\n", "    partitions: [gpu, 'a,b']\n", "components.trainer.partitions", "entry 1"),
    ("    gpus_per_node: 2\n", "", "components.trainer.gpu_types", "gpus_per_node 0"),
])
def test_placement_errors_name_file_line_and_key(tmp_path: Path, old: str, new: str, key: str, words: str) -> None:
    assert old in AUTO
    err = spec_error(tmp_path, AUTO.replace(old, new))
    assert err.key_path == key and words in str(err), str(err)
    assert err.line is not None and str(err).startswith(f"{err.file}:{err.line}:")


def test_needs_come_from_the_action_profiles(tmp_path: Path) -> None:
    needs = component_needs(load_spec(write(tmp_path, ACTIONS), check_args=False))
    learner, evaluator = needs["learner"], needs["evaluator"]
    assert (learner.placement, learner.nodes, learner.cpus_per_node, learner.gpus_per_node) == ("auto", 2, 4, 1)
    assert learner.mem_mb_per_node == 4096
    # optimize holds 6G per rank and two ranks share the node's one GPU: 12G per GPU, above gpu_mem 8G.
    assert learner.gpu_mem_mb_per_gpu == 12 * 1024
    assert any("gradient allreduce over 4 ranks across 2 nodes" in n for n in learner.network)
    assert any("MoE all-to-all of 8 experts" in n for n in learner.network)
    # eval's memory: 600M per rank is above the 1G node's default share but below the node: the request wins.
    assert (evaluator.cpus_per_node, evaluator.mem_mb_per_node, evaluator.gpu_mem_mb_per_gpu) == (1, 1024, 0)
    assert evaluator.network == ("weights from the learner (between components)",)
    assert any("600 MB" in d for d in evaluator.derived)


def starts_in(seconds: dict[str, float]):
    """A stand-in for `sbatch --test-only` (named so: no Slurm here): prints Slurm's line with
    a start ``seconds[partition]`` from now, or its refusal for a partition not listed."""
    calls = []

    def test_only(argv: list[str]) -> str:
        calls.append(argv)
        part = next(a.split("=", 1)[1] for a in argv if a.startswith("--partition="))
        if part not in seconds:
            return "sbatch: error: Requested node configuration is not available"
        at = datetime.fromtimestamp(datetime.now().timestamp() + seconds[part]).strftime("%Y-%m-%dT%H:%M:%S")
        return f"sbatch: Job 7 to start at {at} using 2 processors on nodes n1 in partition {part}"

    test_only.calls = calls  # type: ignore[attr-defined]
    return test_only


def test_auto_lands_on_the_idle_gpu_type_and_goes_into_plan_and_script(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, AUTO.replace("slurm: {partition: debug,", "slurm: {")))
    snap = snapshot(TYPES, busy={"n1", "n2"})  # both a100 nodes busy
    fits = placement_fit.fit_components(component_needs(spec), snap, starts_in({"debug": 0, "high": 0}),
                                        ["trainer"])
    best = fits["trainer"].best
    assert (best.gres, best.fits_now, best.start_in_s) == ("gpu:v100", True, pytest.approx(0, abs=2))
    report = placement_fit.FitReport(fits, snap.taken_at)
    plan = placement_fit.record(build_plan(spec), report)
    plan_d = json.loads(plan.to_json())
    choice = plan_d["components"][0]["placement"]
    assert choice["gres"] == "gpu:v100" and choice["nodes"] and "placement" not in plan_d["components"][1]
    assert any("gpu:a100" in o for o in choice["others"])
    assert Plan.from_json(plan.to_json()).components[0].placement.gpu_type == "v100"
    script = render_sbatch(plan, spec, tmp_path / "run", python="/usr/bin/python3")
    trainer, watcher = script.split("#SBATCH hetjob")
    assert "#SBATCH --gres=gpu:v100:2" in trainer and f"#SBATCH --partition={best.partition}" in trainer
    assert "--partition" not in watcher and "--gres" not in watcher


def test_the_start_estimate_and_allowed_partitions_decide(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, AUTO.replace("slurm: {partition: debug,", "slurm: {")))
    snap = snapshot(TYPES, busy=set())
    test_only = starts_in({"high": 0, "debug": 3600})  # Slurm expects debug to start an hour later
    fits = placement_fit.fit_components(component_needs(spec), snap, test_only, ["trainer"])
    assert fits["trainer"].best.partition == "high"
    assert all("--gres=gpu:" in " ".join(a) for a in test_only.calls)
    lines = placement_fit.explain_lines(placement_fit.FitReport(fits, snap.taken_at))
    assert any(ln.startswith("  best high ") for ln in lines)
    assert any("lost because Slurm expects it to start 3" in ln and "s later" in ln for ln in lines), lines
    only_debug = load_spec(write(tmp_path, AUTO))  # slurm.partition: debug limits an auto component too
    fits = placement_fit.fit_components(component_needs(only_debug), snapshot(TYPES, busy=set()),
                                        starts_in({"debug": 0}), ["trainer"])
    assert {c.partition for c in fits["trainer"].candidates} == {"debug"}


def test_gpu_memory_rules_out_a_smaller_type(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, AUTO.replace("    mem: 1000M\n", "    mem: 1000M\n    gpu_mem: 24G\n", 1)))
    snap = snapshot(TYPES, busy={"n1", "n2"})  # a100 busy, v100 idle but 16G
    fits = placement_fit.fit_components(component_needs(spec), snap, starts_in({"debug": 0, "high": 0}), ["trainer"])
    assert {c.gres for c in fits["trainer"].candidates} == {"gpu:a100"}
    assert any("v100 has 16384 MB per GPU, 24576 MB needed" in x for x in fits["trainer"].excluded)


def test_two_auto_components_do_not_count_on_the_same_free_gpus(tmp_path: Path) -> None:
    two = AUTO.replace("  watcher:\n    nodes: 1\n    mem: 500M\n",
                       "  second:\n    nodes: 1\n    gpus_per_node: 2\n    mem: 500M\n    placement: auto\n")
    spec = load_spec(write(tmp_path, two.replace("slurm: {partition: debug,", "slurm: {")))
    snap = snapshot(TYPES, busy={"n1", "n2", "n3"})  # one free GPU node (n4)
    fits = placement_fit.fit_components(component_needs(spec), snap, starts_in({"debug": 0, "high": 0}))
    assert fits["trainer"].best.nodes == ["n4"]
    assert not fits["second"].best.fits_now  # n4 is counted as taken by trainer


def test_explain_without_a_pool_shows_the_needs(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, AUTO))

    def no_cluster(argv):
        raise SlurmError("`sinfo --json` failed: slurmctld unreachable")

    lines = placement_fit.explain_lines(placement_fit.explain(spec, run=no_cluster))
    assert "the pool is unavailable (`sinfo --json` failed: slurmctld unreachable)" in lines[0]
    assert "component trainer (placement auto): 1 node(s) x 2 CPUs, 2 GPUs, 1000 MB per node" in lines
    assert not any(ln.lstrip().startswith(("best", "lost")) for ln in lines)
    with pytest.raises(SlurmError, match="needs the pool"):
        placement_fit.choose(spec, run=no_cluster)


def test_nothing_can_hold_it_and_the_local_backend(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, AUTO.replace("[a100, v100]", "[h100]").replace("slurm: {partition: debug,",
                                                                                   "slurm: {")))
    sinfo = json.dumps(json.loads((Path(__file__).parent / "data" / "pool" / "sinfo.json").read_text()))

    def pool_run(argv):  # the real Slurm 22.05 samples (no GPU type h100 there)
        name = {"sinfo": "sinfo.json", "squeue": "squeue.json", "sacct": "sacct.txt"}.get(argv[0])
        if argv[0] == "sinfo":
            return sinfo
        return (Path(__file__).parent / "data" / "pool" / name).read_text() if name else ""

    with pytest.raises(SpecError, match="no partition / GPU type of the pool can ever hold component 'trainer'"):
        placement_fit.choose(spec, run=pool_run, test_only=starts_in({}))

    from hetrun.slurm_plugin.backends.local import LocalBackend

    plan = build_plan(spec)
    with pytest.raises(HetrunError, match="--fit places components"):
        placement_fit.place(spec, plan, LocalBackend(), fit_all=True)
    assert placement_fit.place(spec, plan, LocalBackend()) is plan  # auto on this one machine: nothing to choose


def test_plan_explain_without_a_cluster_shows_the_needs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cli_helpers import hetrun_cli

    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "no-slurm.conf"))  # no controller to ask
    for script in ("train.py", "watch.py"):  # plan refuses a command whose script is missing
        (tmp_path / script).write_text("")
    proc = hetrun_cli("plan", str(write(tmp_path, AUTO)), "--explain", timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "placement: the pool is unavailable (" in out and "the needs alone:" in out
    # One ping decided it (no sinfo waited out its timeout): the capacities say the ping's answer.
    assert "against the job spec (no cluster: sbatch is installed but no Slurm controller answered" in out, out
    assert "component trainer (placement auto): 1 node(s) x 2 CPUs, 2 GPUs, 1000 MB per node" in out
    assert "allowed: partitions debug; GPU types a100, v100" in out
    assert "component watcher (placement fixed)" in out
