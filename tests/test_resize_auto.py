"""`hetrun resubmit RUN --resize auto` applies exactly what `hetrun tune RUN` proposes.

Fast: a run directory as submit writes it, with hand-written demand in which
the learner is the bottleneck (2 s per iteration against 0.1 s per rollout
rank), so tune's proposal moves a rank from rollout to learner and cuts memory
to the measured peaks; the dry run must render those sizes and say so.
mpi/slow: a real CartPole PPO run on the local backend (Open MPI ranks, real
gymnasium), cancelled after its first checkpoint, resubmitted with `auto`:
the new attempt runs with the proposed rank counts and memory, restores the
checkpoint into them and finishes.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from hetrun.slurm_plugin.rundir import append_event, events_of

from tests.test_resume_cmd import (
    INTERVAL,
    cancelled_run,
    cli,
    hand_made_run,
    job_file,
    needs_mpirun,
    store_steps,
)

MIB = 1024 * 1024


def record_demand(run_dir: Path, iterations: int = 12) -> None:
    """Action lines of a run whose learner (2 s/iteration) starves its 2 rollout ranks (0.1 s)."""
    for rank, comp in ((0, "learner"), (1, "rollout"), (2, "rollout")):
        append_event(run_dir, "start", rank=rank, component=comp, restart_count=0)
    t = 1000.0
    for it in range(iterations):
        for rank in (1, 2):
            append_event(run_dir, "action", rank=rank, component="rollout", type="rollout", iteration=it,
                         start=t, end=t + 0.1, steps=128, peak_mem=300 * MIB)
        append_event(run_dir, "action", rank=0, component="learner", type="sync", iteration=it,
                     start=t + 0.1, end=t + 2.1, peak_mem=500 * MIB)
        t += 2.1


def tune_json(run_dir: Path) -> dict[str, Any]:
    res = cli("tune", str(run_dir), "--json")
    assert res.returncode == 0, res.stderr
    return dict(json.loads(res.stdout))


def components_of(script: str) -> list[dict[str, str]]:
    """The #SBATCH options of each het component of a rendered script, in order."""
    comps: list[dict[str, str]] = [{}]
    for line in script.splitlines():
        if line.strip() == "#SBATCH hetjob":
            comps.append({})
        elif m := re.match(r"#SBATCH --([a-z-]+)=(\S+)", line):
            comps[-1][m.group(1)] = m.group(2)
    return comps


def test_auto_dry_run_renders_exactly_the_proposal_and_says_what_changes(tmp_path: Path) -> None:
    run_dir = hand_made_run(tmp_path)
    record_demand(run_dir)
    proposal = tune_json(run_dir)
    proposed = {c["name"]: c for c in proposal["proposed"]}
    # 2 s of learner work against 2 x 0.1 s of rollout work in 3 cores: balance wants 2 learners.
    assert {n: c["ranks"] for n, c in proposed.items()} == {"learner": 2, "rollout": 1}
    assert {n: c["mem_mb"] for n, c in proposed.items()} == {"learner": 640, "rollout": 384}  # peak + 25%

    res = cli("resubmit", str(run_dir), "--resize", "auto", "--dry-run")
    assert res.returncode == 0, res.stderr
    assert "tune proposes learner=2 (640M a rank), rollout=1 (384M a rank)" in res.stderr
    for said in ("learner: 1 -> 2 ranks", "rollout: 2 -> 1 ranks", "learner: mem 2048M -> 640M",
                 "rollout: mem 1024M -> 384M"):
        assert said in res.stderr, res.stderr
    learner, rollout = components_of(res.stdout)
    assert (learner["nodes"], learner["ntasks-per-node"], learner["mem"]) == ("2", "1", "640M")
    assert (rollout["nodes"], rollout["ntasks-per-node"], rollout["mem"]) == ("1", "1", "384M")


def test_a_set_given_with_auto_wins_over_the_proposal(tmp_path: Path) -> None:
    run_dir = hand_made_run(tmp_path)
    record_demand(run_dir)
    res = cli("resubmit", str(run_dir), "--resize", "auto", "--dry-run", "--set", "components.rollout.mem=1G")
    assert res.returncode == 0, res.stderr
    assert "rollout: mem" not in res.stderr and components_of(res.stdout)[1]["mem"] == "1024M"


def test_auto_on_a_run_without_demand_says_so(tmp_path: Path) -> None:
    res = cli("resubmit", str(hand_made_run(tmp_path)), "--resize", "auto", "--dry-run")
    assert res.returncode != 0 and "no action events yet" in res.stderr and "Traceback" not in res.stderr


# 32 epochs x 4 minibatches per update: the learner's busy seconds per env step are several
# times the rollout ranks' (4 epochs measured 1.26x here), so tune's cheapest mix in the
# job's 3 cores is 2 learners + 1 rollout rank (it is whenever the ratio exceeds 1.5). With 16
# epochs one suite run measured 1.47x (learner 0.38 ms, rollout 0.26 ms an env step) and tune
# rightly kept 1 + 2.
LEARNER_HEAVY = {"env_id": "CartPole-v1", "num_envs": 4, "num_steps": 32, "hidden": 16, "update_epochs": 32,
                 "num_minibatches": 4, "eval_episodes": 1}


@pytest.mark.mpi
@pytest.mark.slow
@needs_mpirun
def test_auto_resumes_a_real_run_with_the_proposed_sizes(tmp_path: Path) -> None:
    # 40 iterations: the cancel (after the first checkpoint, step 8) landed at step 16 at load 9;
    # cancelled_run asserts it lands before the end.
    job = job_file(tmp_path, workload_args=LEARNER_HEAVY, training={"iterations": 40, "pipeline_window": 1})
    run_dir = cancelled_run(tmp_path, job)
    proposed = {c["name"]: c for c in tune_json(run_dir)["proposed"]}
    assert {n: c["ranks"] for n, c in proposed.items()} == {"learner": 2, "rollout": 1}, proposed
    # The resized attempt goes on two checkpoint intervals past the checkpoint it restores, not
    # to the 40th iteration: enough to train with the new sizes and checkpoint them.
    restored = max(set(store_steps(run_dir, "learner")) & set(store_steps(run_dir, "rollout")))
    end = min(40, (restored // INTERVAL + 2) * INTERVAL)
    res = cli("resubmit", str(run_dir), "--resize", "auto", "--set", f"training.iterations={end}", "--wait")
    assert res.returncode == 0, res.stdout + res.stderr
    assert end in store_steps(run_dir, "learner")  # trained on to the end with the new sizes
    assert "as attempt 1" in res.stdout and "learner: 1 -> 2 ranks; rollout: 2 -> 1 ranks" in res.stdout
    plan = json.loads((run_dir / "plan.json").read_text())
    assert {c["name"]: (c["ntasks"], c["mem_mb"]) for c in plan["components"]} == \
        {n: (c["ranks"], c["mem_mb"]) for n, c in proposed.items()}
    starts = [e for e in events_of(run_dir, ("start",)) if e.get("restart_count") == 1]
    assert sorted(e["component"] for e in starts) == ["learner", "learner", "rollout"]
    restores = [e for e in events_of(run_dir, ("restore",)) if e.get("restart_count") == 1]
    assert len(restores) == 3 and all(e["restored_state"] for e in restores), restores
    assert len({e["step"] for e in restores}) == 1
    resized = sorted((e["component"], e["resize"]["saved_ranks"], e["resize"]["ranks"], e["resize"]["base_rank"],
                      e["resize"]["dropped_envs"]) for e in restores)
    assert resized == [("learner", 1, 2, 0, 0), ("learner", 1, 2, 0, 0), ("rollout", 2, 1, 0, 4)]
    ends = events_of(run_dir, ("attempt_end",))
    assert [(e["restart_count"], e["outcome"]) for e in ends] == [(0, "cancelled"), (1, "done")]
