"""``min_nodes``: with no spare left, a component's ranks packed onto its surviving nodes.

The spec's checks, the node choice (slurm_plugin/node_recovery.py ``pick`` and its
``failed`` verdict), and the rendered batch script run by bash with stand-in Slurm
commands: the step it starts after a node death has the group's ranks on the survivors
(``--nodes`` one fewer, ``--overcommit``, the ranks per node it takes). The real cluster's
run is tests/test_node_pack_slurm.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hetrun.dag.plan import build_plan
from hetrun.dag.spare_layout import spare_layout_warnings
from hetrun.dag.spec import JobSpec, spec_from_dict
from hetrun.slurm_plugin.node_recovery import main as node_recovery_main
from hetrun.slurm_plugin.node_recovery import pick
from hetrun.slurm_plugin.render import render_sbatch

from hetrun.errors import SpecError
from hetrun.rundir import DEAD_NODES_PREFIX

PYTHON = "/usr/bin/python3"


def _spec_dict(rollout: dict[str, Any] | None = None, learner: dict[str, Any] | None = None,
               max_failures: int = 2) -> dict[str, Any]:
    return {
        "name": "pack",
        "workload": "hetrun.examples.ppo:PPOWorkload",
        "components": {
            "learner": {"nodes": 1, "spare_nodes": 1, "mem": "1G",
                        "actions": ["forward", "backward", "optimize", "sync"], **(learner or {})},
            "rollout": {"nodes": 2, "min_nodes": 1, "mem": "1G", "actions": ["rollout"], **(rollout or {})},
        },
        "training": {"kind": "rl", "iterations": 2},
        "preemption": {"max_failures": max_failures},
    }


def _spec(**kw: Any) -> JobSpec:
    return spec_from_dict(_spec_dict(**kw))


@pytest.mark.parametrize(("change", "kw", "words"), [
    ("more than its nodes", {"rollout": {"min_nodes": 3}}, ["min_nodes 3", "more than its nodes 2"]),
    ("GPUs", {"rollout": {"gpus_per_node": 1}}, ["gpus_per_node 1", "no GPUs of their own"]),
    ("no failure budget", {"max_failures": 0, "learner": {"spare_nodes": 0}}, ["max_failures 0", "retried failure"]),
])
def test_the_spec_refuses_what_cannot_be_packed_and_names_the_key(change: str, kw: dict[str, Any],
                                                                  words: list[str]) -> None:
    with pytest.raises(SpecError) as err:
        _spec(**kw)
    text = str(err.value)
    assert "components.rollout.min_nodes" in text, text
    assert all(w in text for w in words), text


def test_a_command_component_cannot_be_packed() -> None:
    data = _spec_dict()
    data["components"] = {"trainer": {"nodes": 2, "min_nodes": 1, "command": "python train.py"}}
    data.pop("workload")
    data.pop("training")
    with pytest.raises(SpecError, match=r"components\.trainer\.min_nodes.*command component"):
        spec_from_dict(data)


def test_the_plan_carries_min_nodes_only_where_it_packs() -> None:
    plan = build_plan(_spec())
    by = {c.name: c for c in plan.components}
    assert by["rollout"].min_nodes == 1 and by["rollout"].packs
    assert by["learner"].min_nodes is None and not by["learner"].packs
    assert "min_nodes" not in json.loads(plan.to_json())["components"][0]
    same = build_plan(_spec(rollout={"min_nodes": 2}))  # min_nodes == nodes: no packing
    assert not any(c.packs for c in same.components)


def test_a_one_node_leader_is_warned_about_as_for_spares() -> None:
    [line] = spare_layout_warnings(_spec(learner={"spare_nodes": 0}, max_failures=1))
    assert "components.learner leads the het job with one node" in line and "rollout" in line, line
    assert spare_layout_warnings(_spec()) == []  # the learner holds two nodes with its spare


def test_pick_uses_spares_first_then_packs_down_to_min_nodes() -> None:
    allocated = [["n1", "n2"], ["n3", "n4", "n5"]]
    need = [1, 2]
    assert pick(allocated, need, ["n3"], [1, 1]) == [["n1"], ["n4", "n5"]]  # the spare n5 first
    assert pick(allocated, need, ["n3", "n4"], [1, 1]) == [["n1"], ["n5"]]  # packed onto n5
    assert isinstance(pick(allocated, need, ["n3", "n4"]), str)  # without min_nodes: requeue
    why = pick(allocated, need, ["n3", "n4", "n5"], [1, 1])
    assert isinstance(why, str) and "0 live node(s) of 3 allocated, 2 needed, 1 at the least" in why


def test_the_failed_verdict_packs_and_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """A rank named dead on n3 (the post-mortem's rank_failure), no rollout spare: the verdict is
    a restart with the rollout's ranks packed onto n4, in the event and its reason."""
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "plan.json").write_text(build_plan(_spec()).to_json())
    (run_dir / "events.jsonl").write_text(json.dumps(
        {"ev": "rank_failure", "restart_count": 0, "node": "n3", "rank": 1, "signal": "SIGKILL"}) + "\n")
    monkeypatch.setenv("SLURM_JOB_NODELIST_HET_GROUP_0", "n1,n2")
    monkeypatch.setenv("SLURM_JOB_NODELIST_HET_GROUP_1", "n3,n4")
    monkeypatch.setattr("hetrun.slurm_plugin.node_recovery.hostnames", lambda nl: nl.split(","))
    monkeypatch.setattr("hetrun.slurm_plugin.node_recovery.dead_after",
                        lambda *a, **k: (["n3"], {"n3": "a rank died there (SIGKILL)"}))
    dead = run_dir / "logs" / "dead"
    rc = node_recovery_main(["failed", str(run_dir), "--dead-file", str(dead), "--need", "1", "2",
                             "--fewest", "1", "1", "--used", "n1", "n3,n4"])
    assert rc == 0 and capsys.readouterr().out.strip() == "restart"
    [ev] = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()[1:]]
    rollout = next(c for c in ev["components"] if c["component"] == "rollout")
    assert rollout["new"] == ["n4"] and rollout["packed"] == {"nodes": 1, "of": 2}, ev
    assert "ranks packed (min_nodes): rollout on 1 of its 2 nodes" in ev["reason"], ev
    from hetrun.reports.node_failures import failure_lines

    [line] = failure_lines([ev])
    assert "rollout: ranks packed onto 1 of 2 nodes (n4)" in line, line
    # Without --fewest (no min_nodes) the same death requeues.
    dead.unlink()
    rc = node_recovery_main(["failed", str(run_dir), "--dead-file", str(dead), "--need", "1", "2",
                             "--used", "n1", "n3,n4"])
    assert rc == 0 and capsys.readouterr().out.strip() == "requeue"


FAKE_SRUN = """#!/bin/bash
# stand-in srun: the ranks' step records its words and succeeds; the warm servers' step is not run
case "$*" in *warm*) exit 0 ;; esac
printf '%s\\n' "$*" >> "$HETRUN_RUN_DIR/fake-srun.argv"
exit 0
"""
FAKE_SCONTROL = """#!/bin/bash
# stand-in scontrol: "show hostnames a,b" prints them one a line; anything else is recorded
if [ "$1 $2" = "show hostnames" ]; then tr , '\\n' <<< "$3"; exit 0; fi
printf '%s\\n' "$*" >> "$HETRUN_RUN_DIR/fake-scontrol.argv"
"""


def test_the_script_starts_the_step_packed_once_a_node_is_dead(tmp_path: Path) -> None:
    """The batch script run by bash, n3 already in the job's dead-node file: the step's rollout
    group runs on n4 alone, both its ranks (--ntasks=2 --nodes=1 --overcommit
    --ntasks-per-node=2); the learner group as written."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL), ("squeue", "#!/bin/bash\n"),
                       ("scancel", "#!/bin/bash\n")):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    spec = _spec()
    plan = build_plan(spec)
    (run_dir / "plan.json").write_text(plan.to_json())
    (run_dir / "logs" / f"{DEAD_NODES_PREFIX}4242").write_text("n3\n")
    script = render_sbatch(plan, spec, run_dir, python=PYTHON, hetrun_python=sys.executable)
    (run_dir / "hetjob.sbatch").write_text(script)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_ID": "4242", "SLURM_RESTART_COUNT": "0",
           "SLURM_JOB_ID_HET_GROUP_0": "4242", "SLURM_JOB_ID_HET_GROUP_1": "4243", "TMPDIR": str(tmp_path),
           "SLURM_JOB_NODELIST_HET_GROUP_0": "n1,n2", "SLURM_JOB_NODELIST_HET_GROUP_1": "n3,n4",
           "HETRUN_WARM_START": "0", "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(["bash", str(run_dir / "hetjob.sbatch")], cwd=run_dir, env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    argv = (run_dir / "fake-srun.argv").read_text()
    learner, rollout = argv.split(" : ")
    assert "--nodes=1 --ntasks=1 --nodelist=n1 " in learner and "--overcommit" not in learner, (argv, proc.stderr)
    assert "--nodes=1 --ntasks=2 --nodelist=n4 --overcommit --ntasks-per-node=2 " in rollout, (argv, proc.stderr)


def test_a_job_that_only_packs_still_beats_and_snapshots(tmp_path: Path) -> None:
    """No spare anywhere, a component with min_nodes: the ranks must beat (the batch script's
    monitor sees a node die in seconds, not after HETRUN_COLLECTIVE_TIMEOUT or SlurmdTimeout)
    and the memory tier is on by default, as with spares."""
    from hetrun.runtime import heartbeat, recovery

    from hetrun.planfile import PlanView, read_plan

    def view(spec: JobSpec, where: Path) -> PlanView:
        where.mkdir()
        (where / "plan.json").write_text(build_plan(spec).to_json())
        return read_plan(where)

    packs = view(_spec(learner={"spare_nodes": 0}), tmp_path / "packs")
    assert heartbeat.restarts_in_allocation(packs) and recovery.memory_every(packs) is None  # adaptive
    plain = view(_spec(learner={"spare_nodes": 0}, rollout={"min_nodes": None}), tmp_path / "plain")
    assert not heartbeat.restarts_in_allocation(plain) and recovery.memory_every(plain) == 0
