"""Real hetrun jobs inside benchmarks/pool_trace_replay.py's trace (issue 14: "a mix of hetrun's
examples and plain sbatch jobs ... hetrun jobs must lose none beyond their last checkpoint").

Each is examples/ppo_cartpole.yaml (PPO on gymnasium CartPole, learner + rollout as one Slurm
heterogeneous job) made small: one node per component, every node whole (4 CPUs, so the
replay's "every job takes whole nodes" still holds), little memory (the pool's nodes have
360 MB), a checkpoint every ``CKPT_EVERY`` iterations. It is submitted with ``hetrun submit``
(SLURM_CONF: the pool's) in the ``normal`` tier on the policy side, so critical/high jobs
preempt it through preempt/qos (PreemptMode=REQUEUE); on the default side it is queued FIFO
like the rest. Every other job of ``PLACEMENT_AUTO_EVERY`` has ``placement: auto`` on its rollout.
Run directories live under /var/tmp/hetrun-replay-<prefix>/ (the emulated nodes have a
private /tmp).

After the replay, :func:`measure_run` reads each run directory with hetrun's own readers
(``EventStream`` + ``AttemptTracker``, what ``hetrun report`` uses) and reports per
preemption: the last iteration each component completed before it, the newest checkpoint
durably written before it (the writer's ``checkpoint`` line with ``ok: true``), the step
the next attempt restored, and

- ``lost_beyond_checkpoint``: checkpoint iterations gone = newest checkpoint before the
  preemption - restored step (must be 0: resume restores exactly the newest checkpoint);
- ``lost_since_checkpoint``: iterations redone = last completed + 1 - restored step, and the
  seconds from the first redone iteration's start to the attempt's last event.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "ppo_cartpole.yaml"
ITERATIONS = 500  # ~0.08 s each on the pool (150 took ~12 s): 40-90 s of work, by the load
CKPT_EVERY = 25
# every checkpoint kept: the store's manifests (commit times) say which was durable before a preemption
KEEP = 40
PLACEMENT_AUTO_EVERY = 2
NODES = 2  # learner 1 + rollout 1, whole nodes
EST_SECONDS = 45  # the work a job stands for in the replay's ``work_node_s``
HETRUN_TIER = "normal"
# The most contended partition of the trace (its scripts name a100 three times in four): where
# critical/high jobs preempt normal ones. CPU work on a GPU node, as a learner without a GPU
# would be; a placement: auto rollout may go elsewhere.
PARTITION = "gpu-a100"
DEFAULT_JOBS = 4  # in the plain command: 4 jobs of 2 ranks, ~15-60 s of work each (benchmarks/pool.md)


def job_spec(name: str, *, partition: str, cpus: int = 4, mem: str = "300M",
             placement_auto: bool = False, iterations: int = ITERATIONS) -> dict[str, Any]:
    """examples/ppo_cartpole.yaml, small: one node per component, a checkpoint every CKPT_EVERY."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["name"] = name
    doc["workload_args"].update(num_envs=4, num_steps=64)
    for comp in doc["components"].values():
        comp.update(nodes=1, tasks_per_node=1, cpus_per_task=cpus, mem=mem)
    if placement_auto:  # hetrun submit scores the pool's partitions for it (docs/CONTRACTS.md, placement)
        doc["components"]["rollout"].update(placement="auto", partitions=["cpu", "gpu-v100", "gpu-a100"])
    doc["training"].update(iterations=iterations, eval_interval=iterations)
    doc["checkpoint"] = {"interval": CKPT_EVERY, "keep": KEEP}
    doc["slurm"] = {"partition": partition, "time": "00:10:00"}
    return doc


def arrivals(seed: int, window: float, n: int) -> list[float]:
    """When the ``n`` hetrun jobs arrive: spread over the first two thirds of the window
    (so critical/high arrivals after them can preempt them), seeded apart from the trace."""
    rng = random.Random(seed * 1000 + 14)
    return sorted(round(rng.uniform(0.05, 0.67) * window, 2) for _ in range(n))


def add_to_trace(trace: list[Any], seed: int, window: float, n: int) -> list[Any]:
    """The trace plus ``n`` hetrun jobs (``TraceJob`` rows with ``hetrun=True``, numbered after
    the sleeps so those keep their names), in arrival order. ``dataclasses.replace`` on a row of
    the trace makes them without importing pool_trace_replay (which imports this module)."""
    if not n or not trace:
        return trace
    extra = [replace(trace[0], i=len(trace) + k, at=at, tier=HETRUN_TIER, nodes=NODES, seconds=EST_SECONDS,
                     gpu_types=(), script_partition=PARTITION, hetrun=True)
             for k, at in enumerate(arrivals(seed, window, n))]
    return sorted([*trace, *extra], key=lambda j: j.at)


class Submitter:
    """Submits the replay's hetrun jobs without blocking its clock (one ``hetrun submit``
    process each: a Python start on the shared cores), then measures their run directories."""

    def __init__(self, slurm_conf: Path, prefix: str, account: str | None) -> None:
        self.base = Path(f"/var/tmp/hetrun-replay-{prefix.rstrip('-')}")
        self.env = {**os.environ, "SLURM_CONF": str(slurm_conf)}
        self.account = account
        self.procs: dict[str, subprocess.Popen[str]] = {}
        self._done: dict[str, dict[str, Any]] = {}
        self.k = 0

    def submit(self, name: str, partition: str, tiers: bool, qos: str = HETRUN_TIER) -> None:
        """``qos``: the tier (``normal``) or, on the policy side with ``scheduling.checkpointed``,
        its checkpointing QOS (``normal_ckpt``): a hetrun job stops at an agreed step on SIGTERM."""
        auto = self.k % PLACEMENT_AUTO_EVERY == 1
        self.k += 1
        job_dir = self.base / "jobs"
        job_dir.mkdir(parents=True, exist_ok=True)
        path = job_dir / f"{name}.yaml"
        path.write_text(yaml.safe_dump(job_spec(name, partition=partition, placement_auto=auto)))
        argv = [sys.executable, "-m", "hetrun.cli", "submit", str(path), "--backend", "sbatch",
                "--runs-dir", str(self.base / "runs")]
        if tiers and self.account:
            argv += ["-A", self.account, "-q", qos]  # the pool's lua maps the tier onto its QOS
        self.procs[name] = subprocess.Popen(argv, env=self.env, stdout=subprocess.PIPE,
                                            stderr=subprocess.STDOUT, text=True)

    def submitted(self) -> dict[str, dict[str, Any]]:
        """name -> {run_dir, rc, output} once every ``hetrun submit`` has returned."""
        for name, proc in self.procs.items():
            if name in self._done:
                continue
            try:
                text, _ = proc.communicate(timeout=300)
            except subprocess.TimeoutExpired:  # never hang the replay on one submission
                proc.kill()
                text = "hetrun submit did not return within 300 s\n" + (proc.communicate()[0] or "")
            run_dir = next((ln.split(": ", 1)[1].strip() for ln in text.splitlines()
                            if ln.startswith("run directory: ")), None)
            self._done[name] = {"run_dir": run_dir, "rc": proc.returncode,
                                "output": None if proc.returncode == 0 else text[-2000:]}
        return self._done

    def refused(self) -> int:
        """Submissions that failed (the replay must not wait for their names in sacct)."""
        return sum(s["rc"] != 0 for s in self.submitted().values())

    def measure(self, runs: dict[str, list[dict[str, Any]]] | None = None) -> dict[str, Any]:
        """Each job's run directory (:func:`measure_run`) and, from the replay's sacct records
        (``runs``: name -> records, one per het component and run), its queue wait and states."""
        jobs = {}
        for name, sub in self.submitted().items():
            jobs[name] = {**sub, **sacct_view((runs or {}).get(name, [])),
                          **(measure_run(Path(sub["run_dir"])) if sub["run_dir"] else {})}
        return {"jobs": jobs, "summary": summarize(jobs)}


def sacct_view(records: list[dict[str, Any]]) -> dict[str, Any]:
    """First start - submit (the wait the replay's metrics count for it) and every record's state."""
    starts = [r["start"] for r in records if r.get("start")]
    submits = [r["submit"] for r in records if r.get("submit")]
    return {"queue_wait_s": round(min(starts) - min(submits), 1) if starts and submits else None,
            "sacct_states": [r["state"] for r in records]}


@dataclass
class _Ckpt:
    component: str
    step: int
    t: float  # when it was durable: the manifest's commit (``created``), else the ok line's time


def durable_checkpoints(run_dir: Path, events: list[dict[str, Any]],
                        history: list[dict[str, Any]]) -> list[_Ckpt]:
    """Checkpoints known to be complete, per (component, step): those the store lists (its
    manifest is written last, atomically: ``created`` is the commit time; read through
    ``hetrun report``'s checkpoint history) and those a ``checkpoint`` line says were saved
    with ``ok: true`` (a waited-for save: the end of a run, the stop on preemption). A step
    only in the events without ``ok`` (pruned by ``keep``, or cut short) is not counted."""
    from hetrun.reports.ckpt import checkpoint_history

    plan = json.loads((run_dir / "plan.json").read_text())
    out: dict[tuple[str, int], float] = {}
    for row in checkpoint_history(run_dir, plan, events, history)["rows"]:
        if row["in_store"] and isinstance(row["created"], int | float):
            out[(row["component"], row["step"])] = float(row["created"])
    for e in events:
        info = e.get("info") if isinstance(e.get("info"), dict) else {}
        step = info.get("step", e.get("step"))
        if e.get("ev") == "checkpoint" and info.get("ok") is True and isinstance(step, int):
            key = (str(e.get("component")), step)
            out[key] = min(out.get(key, float("inf")), float(e.get("time") or 0.0))
    return sorted((_Ckpt(c, st, t) for (c, st), t in out.items()), key=lambda c: c.t)


def measure_run(run_dir: Path) -> dict[str, Any]:
    """Attempts, preemptions and the work each preemption lost, from a run directory."""
    from hetrun.reports.attempts import AttemptTracker
    from hetrun.reports.reader import EventStream

    tracker, events = AttemptTracker(), []
    for e in EventStream(run_dir):
        tracker.feed(e)
        if e.get("ev") == "checkpoint":
            events.append(e)
    counts, history, outcome = tracker.counts(), tracker.history(), tracker.outcome()
    ckpts = durable_checkpoints(run_dir, events, history)
    restarts = [restart_loss(tracker.attempts.get(row["restart"] - 1), row, ckpts) for row in history]
    return {
        "attempts": counts.attempts, "preemptions": counts.preemptions, "restarts": counts.restarts,
        "finished": outcome.get("outcome") == "done", "outcome": outcome.get("outcome"),
        "last_iteration": max((a.last_iteration.get(c, -1) for a in tracker.attempts.values()
                               for c in a.last_iteration), default=None),
        "checkpoints_written": len(ckpts), "restarts_detail": restarts,
        "lost_beyond_checkpoint_max": max((r["lost_beyond_checkpoint"] for r in restarts
                                           if r["lost_beyond_checkpoint"] is not None), default=0),
        "lost_since_checkpoint_iterations": sum(r["lost_since_checkpoint_iterations"] or 0 for r in restarts),
        "lost_since_checkpoint_s": round(sum(r["lost_since_checkpoint_s"] or 0.0 for r in restarts), 3),
    }


def restart_loss(prev: Any, row: dict[str, Any], ckpts: list[_Ckpt]) -> dict[str, Any]:
    """One restart: per component, what the previous attempt completed, the newest checkpoint
    durable before it ended, what the restart restored, and the difference."""
    end_t = prev.ended_at() if prev is not None else None
    comps = {}
    for comp, info in row["components"].items():
        restored = info["step"] if info["state"] == "restored" else (0 if info["state"] == "fresh" else None)
        before = [c.step for c in ckpts if c.component == comp and end_t is not None and c.t <= end_t]
        newest = max(before) if before else None
        last = prev.last_iteration.get(comp) if prev is not None else None
        comps[comp] = {
            "last_completed_iteration": last, "newest_checkpoint_before": newest, "restored_step": restored,
            "restore_state": info["state"],
            "lost_beyond_checkpoint": None if restored is None else max(0, (newest or 0) - restored),
        }
    beyond = [c["lost_beyond_checkpoint"] for c in comps.values()]
    no_actions = prev is not None and not prev.last_iteration  # cut before its first iteration
    start = prev.start_t or prev.first_t if prev is not None else None
    return {
        "restart": row["restart"], "cause": row["cause"], "queue_wait_s": row["queue_wait_s"],
        "components": comps,
        "lost_beyond_checkpoint": None if None in beyond or not beyond else max(beyond),
        # hetrun report's own figures: iterations redone (from the actions) and their seconds
        "lost_since_checkpoint_iterations": 0 if no_actions else row["work_lost_from_actions"],
        "lost_since_checkpoint_s": 0.0 if no_actions else row["work_lost_s"],
        # the attempt the preemption cut, start to end (start-up included)
        "previous_attempt_s": round(end_t - start, 1) if end_t is not None and start is not None else None,
    }


def summarize(jobs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    measured = [j for j in jobs.values() if "attempts" in j]
    rows = [r for j in measured for r in j["restarts_detail"]]
    beyond = [r["lost_beyond_checkpoint"] for r in rows]
    return {
        "jobs": len(jobs), "submitted_ok": sum(j["rc"] == 0 for j in jobs.values()),
        "finished": sum(j["finished"] for j in measured),
        "preemptions": sum(j["preemptions"] for j in measured),
        "restarts": len(rows),
        "restarts_unmeasured": sum(b is None for b in beyond),
        "lost_beyond_checkpoint_max": max((b for b in beyond if b is not None), default=0),
        "lost_since_checkpoint_iterations": sum(j["lost_since_checkpoint_iterations"] for j in measured),
        "lost_since_checkpoint_s": round(sum(j["lost_since_checkpoint_s"] for j in measured), 1),
    }


def summary_lines(side: str, result: dict[str, Any]) -> list[str]:
    s = result["summary"]
    lines = [f"{side}: hetrun jobs {s['jobs']} (submitted {s['submitted_ok']}, finished {s['finished']}), "
             f"preemptions {s['preemptions']}, restarts {s['restarts']}; work lost beyond the last "
             f"checkpoint: max {s['lost_beyond_checkpoint_max']} iteration(s)"
             f"{' (' + str(s['restarts_unmeasured']) + ' restart(s) unmeasured)' if s['restarts_unmeasured'] else ''}; "
             f"since the last checkpoint: {s['lost_since_checkpoint_iterations']} iteration(s), "
             f"{s['lost_since_checkpoint_s']} s"]
    for name, j in result["jobs"].items():
        lines.append(f"  {name}: submit rc {j.get('rc')}, queue wait {j.get('queue_wait_s')} s, attempts "
                     f"{j.get('attempts')}, preemptions {j.get('preemptions')}, outcome {j.get('outcome')}, "
                     f"last iteration {j.get('last_iteration')}, sacct {j.get('sacct_states')}")
        for r in j.get("restarts_detail", []):
            per = ", ".join(f"{c} last {v['last_completed_iteration']} ckpt {v['newest_checkpoint_before']} "
                            f"restored {v['restored_step']}" for c, v in r["components"].items())
            lines.append(f"    {name} restart {r['restart']} ({r['cause']}): {per}; beyond checkpoint "
                         f"{r['lost_beyond_checkpoint']}, since {r['lost_since_checkpoint_iterations']} it "
                         f"/ {r['lost_since_checkpoint_s']} s (attempt cut after {r['previous_attempt_s']} s)")
    return lines
