"""A preemption storm on the real local Slurm cluster, for both examples.

Each example (shrunk: PPO pipelined with a learner and 2 rollout ranks
running ahead on their own nodes; the MoE LM with 2 expert-parallel learner
ranks and an evaluator) is submitted to partition ``debug`` and preempted 3
times, at random iterations and random moments within them, by short jobs in
partition ``high`` (PreemptMode=REQUEUE: Slurm's SIGTERM to every task, then
SIGKILL after KillWait). Each time Slurm requeues the job; it resumes and
finally completes. Every component's final checkpoint must then equal an
uninterrupted run's (the same plan run by mpirun, at another speed), tensor by
tensor and RNG state by RNG state; at each stop every rank of every component
checkpointed the same iteration, and each restore lost nothing.

This is the one exact-resume check of the two examples with their own weight
transports (tests/test_resume_exact_examples.py keeps the shared-weights one:
its docstring lists which test carries which claim).

Slurm holds a requeued job (cred_expire + 1 s) before it may start again; the
test makes it eligible at once (``scontrol update ... StartTime=now``) to keep
CI short, and runs the uninterrupted reference beside the storm (its plan is
written at submit; the ranks under Slurm mostly sleep in their pauses), not
after it. ``HETRUN_STORM_SEED`` replays the moments of a failed run (printed).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from hetrun.dag.spec import spec_from_dict
from hetrun.slurm_plugin.backends.sbatch import SbatchBackend
from hetrun.slurm_plugin.rundir import wait_for
from hetrun.slurm_plugin.submit import submit_spec, wait_for_end
from resume_compare import assert_same_checkpoints, example_spec
from test_resume_exact import events, logs_of, run_to_end

HERE = Path(__file__).parent
PREEMPTIONS = 3
# A stop lands 6-8 iterations (of 0.35 s) after its preempting job is submitted (Slurm schedules
# it, signals the tasks, the ranks agree on a step), and each next target is aimed past the last
# restore: three stops need ~35 iterations. With 25 the third preemption of one run found the
# job finished (stops at 9 and 18, the third aimed at 20: session 26).
ITERATIONS = 40

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

PPO = {"workload": "resume_slow_workloads:SlowPPO",
       "workload_args": {"env_id": "CartPole-v1", "num_envs": 4, "num_steps": 32, "hidden": 16,
                         "update_epochs": 2, "num_minibatches": 2, "eval_episodes": 2, "pause": 0.3},
       "training": {"iterations": ITERATIONS, "eval_interval": 8},
       "checkpoint": {"interval": 5, "keep": 10}}
MOE = {"workload": "resume_slow_workloads:SlowMoE",
       "workload_args": {"d_model": 16, "n_layers": 1, "num_experts": 4, "num_groups": 2, "top_k": 2,
                         "seq_len": 16, "batch_size": 2, "corpus_bytes": 400000, "pause": 0.3},
       "components": {"learner": {"nodes": 1, "tasks_per_node": 2}},
       "training": {"iterations": ITERATIONS, "micro_batches": 2, "eval_interval": 6},
       "checkpoint": {"interval": 5, "keep": 10},
       "comms": {"forward_codec": "none", "backward_codec": "none"}}
CASES = {"ppo": ("ppo_cartpole", PPO), "moe": ("moe_lm", MOE)}


def _scontrol(job: str) -> dict[str, str]:
    out = subprocess.run(["scontrol", "-o", "show", "job", job], capture_output=True, text=True).stdout
    first = out.splitlines()[0] if out.strip() else ""
    return dict(w.split("=", 1) for w in first.split() if "=" in w)


def _preempt(node: str, shared: Path) -> None:
    """A job in ``high`` that wants the whole node: Slurm preempts (requeues) ours."""
    subprocess.run(["sbatch", "--parsable", "-p", "high", "-w", node, "--exclusive", "-t", "00:02:00",
                    "-J", "hetrun-storm", f"--output={shared}/storm-%j.out", "--wrap", "sleep 1"],
                   capture_output=True, text=True, check=True)


def _newest(run_dir: Path, restart: int) -> int:
    """The newest iteration any rank started in attempt ``restart``."""
    starts = [e["time"] for e in events(run_dir) if e.get("ev") == "start" and e.get("restart_count") == restart]
    if not starts:
        return -1
    return max((e["iteration"] for e in events(run_dir)
                if e.get("ev") == "action" and e.get("start", 0) >= min(starts)), default=-1)


def _make_eligible(job: str, restarts: int) -> bool:
    """Once Slurm requeued the job (pending, Restarts=restarts): let it start now."""
    info = _scontrol(job)
    if info.get("JobState") != "PENDING" or int(info.get("Restarts", "0")) < restarts:
        return False
    for jid in (job, *(f"{job}+{i}" for i in range(4))):
        subprocess.run(["scontrol", "update", f"JobId={jid}", "StartTime=now"], capture_output=True, text=True)
    return True


def _restored(run_dir: Path, restart: int) -> int:
    """The iteration attempt ``restart`` resumed from (-1 before it restored; every rank restores the same)."""
    its = [e["iteration"] for e in events(run_dir) if e.get("ev") == "restore" and e.get("restart_count") == restart]
    return max(its, default=-1)


def _storm(job: str, run_dir: Path, targets: list[int], rng: random.Random, shared: Path) -> None:
    for n, target in enumerate(targets):
        if n:
            # A late preemption can leave the next attempt resuming at or past its target; aimed
            # there, it would stop again at the iteration it restored (two stops at one
            # iteration, nothing run between them). Aim past the restore point instead.
            assert wait_for(lambda n=n: _restored(run_dir, n) >= 0, 240, 0.2), (
                n, _scontrol(job).get("JobState"), events(run_dir)[-5:])
            target = max(target, _restored(run_dir, n) + 2)
        assert wait_for(lambda n=n, target=target: _newest(run_dir, n) >= target, 240, 0.2), (
            n, target, _scontrol(job).get("JobState"), events(run_dir)[-5:])
        time.sleep(rng.uniform(0.0, 0.6))  # a random moment within the iteration
        nodes = _scontrol(job).get("NodeList", "")
        assert nodes and nodes != "(null)", _scontrol(job)
        hosts = subprocess.run(["scontrol", "show", "hostnames", nodes], capture_output=True,
                               text=True, check=True).stdout.split()
        _preempt(hosts[0], shared)
        assert wait_for(lambda n=n: _make_eligible(job, n + 1), 120, 0.5), _scontrol(job)


def _reference(root: Path, plan: dict[str, Any]) -> Path:
    """The same plan, uninterrupted, under mpirun (no pause: timing must not matter)."""
    plan = json.loads(json.dumps(plan))
    plan["workload_args"]["pause"] = 0.0
    root.mkdir()
    (root / "plan.json").write_text(json.dumps(plan))
    shutil.copy(HERE / "resume_slow_workloads.py", root / "resume_slow_workloads.py")
    assert run_to_end(root, [], timeout=300) == [0], logs_of(root)
    return root


@pytest.mark.parametrize("case", sorted(CASES))
def test_preemption_storm_ends_bit_identical(slurm_cluster, shared_tmp: Path, case: str) -> None:  # type: ignore[no-untyped-def]
    name, overrides = CASES[case]
    seed = int(os.environ.get("HETRUN_STORM_SEED", time.time_ns() % 1_000_000))
    rng = random.Random(seed)
    its = overrides["training"]["iterations"]
    targets = [2 + k * 6 + rng.randrange(4) for k in range(PREEMPTIONS)]
    print(f"storm {case}: HETRUN_STORM_SEED={seed}, preempt at iterations {targets}")
    assert targets[-1] < its - 3
    job_dir = shared_tmp / "job"
    job_dir.mkdir()
    shutil.copy(HERE / "resume_slow_workloads.py", job_dir / "resume_slow_workloads.py")
    doc = example_spec(name, **overrides)
    doc["slurm"] = {"partition": "debug", "time": "00:15:00"}
    doc["preemption"] = {"signal": "USR1", "grace_seconds": 60, "max_restarts": 10}
    doc["env"] = {"OMP_NUM_THREADS": "1", "HETRUN_JOB_DIR": str(job_dir)}
    res = submit_spec(spec_from_dict(doc), backend="sbatch", runs_dir=shared_tmp / "runs")
    run_dir, job = Path(res.run.run_dir), str(res.run.job_id)
    plan = json.loads((run_dir / "plan.json").read_text())
    with ThreadPoolExecutor(1) as pool:
        uninterrupted = pool.submit(_reference, shared_tmp / "reference", plan)
        try:
            _storm(job, run_dir, targets, rng, shared_tmp)
            final = wait_for_end(res.run, SbatchBackend(), timeout_s=420, poll_s=1)
        finally:
            subprocess.run(["scancel", job], check=False, capture_output=True)
        reference = uninterrupted.result()
    assert {c.state for c in final.components} == {"COMPLETED"}, final
    assert json.loads((run_dir / "plan.json").read_text()) == plan  # the reference ran the plan the job ended with
    ranks = {c["name"]: c["ntasks"] for c in plan["components"]}
    assert_same_checkpoints(reference, run_dir, ranks, its)
    restores = [e for e in events(run_dir) if e.get("ev") == "restore"]
    assert sorted({e["restart_count"] for e in restores}) == list(range(1, PREEMPTIONS + 1)), restores
    assert len(restores) == PREEMPTIONS * sum(ranks.values()), restores
    assert all(e["restored_state"] and e["work_lost"] == 0 for e in restores), restores
    # Each stop: every rank of every component checkpointed the same iteration.
    stops: dict[int, set[int]] = {}
    for e in events(run_dir):
        if e.get("ev") == "checkpoint" and e.get("reason") == "preempt":
            stops.setdefault(e["iteration"], set()).add(e["rank"])
    assert len(stops) == PREEMPTIONS, stops
    assert all(r == set(range(sum(ranks.values()))) for r in stops.values()), stops
    print(f"storm {case}: restored steps {sorted({e['step'] for e in restores})}, "
          f"work lost {[e['work_lost'] for e in restores]}")
