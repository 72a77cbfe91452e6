"""A node dies mid-run (issue 25): time to the first resumed step, work lost, and the
memory tier's steady cost. Results: benchmarks/node_death.md, raw trials in
benchmarks/results/node_death.json.

    flock /var/lock/hetrun-heavy.lock python3 benchmarks/node_death_bench.py --kills 4 --requeue-kills 1 --pairs 0
    flock /var/lock/hetrun-heavy.lock python3 benchmarks/node_death_bench.py --overhead-only --shared-cluster --pairs 3

Cluster: tests/node_cluster.py's throw-away 4-node cluster (hrnode; its nodes may be
killed). Job: examples/ppo_cartpole.yaml made small and endless (learner on one
node, the rollout on one node + ``spare_nodes: 2``, memory tier every iteration
(``--memory-every N|auto``; with auto, ``--kill-after 24`` lets N settle first),
interval checkpoint every 10, ``max_failures`` high, ``HETRUN_NODE_TIMEOUT`` the
product's default unless ``--node-timeout``). Each job takes two node deaths:
``kill`` (SIGKILL to every process of the rollout's emulated node: slurmd,
slurmstepd, the rank; its tmpfs goes with them) twice, or with ``--down`` a kill
and then ``scontrol update NodeName=X State=DOWN`` (Slurm 22.05 then requeues the
whole het job, whose first component, the learner, holds one node: docs/PREEMPTION.md;
``--leader-spare`` gives the learner a spare and the rollout one, one death per job,
alternating kill and DOWN with ``--down``; ``--pack``: the rollout on two nodes, no spare,
``min_nodes: 1``, the learner with a spare, one kill per job: the restart packs both
rollout ranks onto the surviving rollout node); then it is cancelled and the nodes
revived for the next job. Per death: kill -> node_failure event (the batch
script's decision), -> every rank restored, -> the first action of the resumed
step ends; work lost (the restore lines' ``work_lost``, the largest over the
ranks, and per component) and the state's source; and ``stages``: seconds from
the kill to each step on the way (the monitor's verdict, srun ended, step
ended, post-mortem, the new ranks' srun start / MPI ready / torch imported /
executor ready, memory agreed, state loaded), from the batch script's own
timestamped lines and the ranks' startup and restore events. The restarted ranks fork
from the job's warm servers (runtime/warm_start.py; the first kill waits until the 4
are up, as they are in any job that has run a few seconds): ``--starts cold`` runs
the jobs with ``HETRUN_WARM_START=0``, ``--starts both`` alternates (warm first), and
each trial says which (``starts``, and the ranks' own ``warm_start``).

The requeue path, in the same run: the same job without spare nodes (no
``--no-kill``, no heartbeat monitor; ``max_failures`` requeues it through the
queue), one ``kill`` each, up to ``--requeue-wait`` s (a survivor gives up on its
dead peer after ``HETRUN_COLLECTIVE_TIMEOUT``, 120 s, and the requeued job waits
until Slurm has ended the old one, which needs the dead node marked down:
``SlurmdTimeout``, 300 s on this cluster as by Slurm's default); the same times.

Steady overhead: the same job (no spare, no kill) on the cluster, learner and
rollout on two nodes (the replica crosses nodes), memory tier off
(``checkpoint.memory_every: 0``), every iteration (1) and adaptive (``auto``),
interleaved, ``--pairs`` rounds; seconds per learner iteration over iterations
``--skip``..N (median of each setting), and each run's own share: the tier's
measured seconds over the rank's training time.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from node_cluster import NodeCluster  # noqa: E402
from resume_compare import example_spec  # noqa: E402
from test_resume_exact import events  # noqa: E402

BASE = Path("/var/tmp/hetrun-bench/node_death")


# Which example, and the component whose node dies: PPO's rollout (one rank; the learner survives)
# or the MoE LM's learner (4 ranks on 2 nodes exchanging experts: half of them die at once; its second
# node, since the first holds the batch script).
EXAMPLES = {"ppo": ("rollout", 2), "moe": ("learner", 1)}  # example -> (victim component, spare nodes)
RANKS = {"ppo": 2, "moe": 5}  # ranks that restore after a death (every rank of the job)
NODES = 4  # the spare-node jobs' allocation: the cluster's 4 nodes, one warm server each


def spec(spares: int, memory_every: int | str, iterations: int, memory_dir: str,
         node_timeout: int | None = None, example: str = "ppo", leader_spare: bool = False,
         cold: bool = False, pack: bool = False, env: dict[str, str] | None = None) -> dict[str, Any]:
    # node_timeout None: the product's default HETRUN_NODE_TIMEOUT (hetrun/rundir.py).
    timeout = {} if node_timeout is None else {"HETRUN_NODE_TIMEOUT": str(node_timeout)}
    timeout.update(env or {})
    if cold:  # no warm servers (runtime/warm_start.py): every restarted rank imports torch itself
        timeout["HETRUN_WARM_START"] = "0"
    if example == "moe":  # learner 2 nodes + 1 spare, evaluator 1: the cluster's 4 nodes
        return example_spec(
            "moe_lm",
            components={"learner": {"spare_nodes": spares, "mem": "1G"}, "evaluator": {"mem": "500M"}},
            training={"iterations": iterations, "eval_interval": 1000000},
            checkpoint={"interval": 10, "keep": 3, "memory_every": memory_every},
            preemption={"max_failures": 100},
            slurm={"partition": "debug", "time": "01:00:00"},
            env={"OMP_NUM_THREADS": "1", "HETRUN_MEMORY_DIR": memory_dir, **timeout},
        )
    return example_spec(
        "ppo_cartpole",
        workload_args={"num_envs": 4, "num_steps": 32, "eval_episodes": 2},
        # leader_spare: the learner (the het job's first component) holds a spare too, so Slurm
        # marking a dead rollout node down leaves the job running (docs/PREEMPTION.md).
        # pack: the rollout's two nodes, no spare; its ranks packed onto the survivor (min_nodes).
        components={"rollout": ({"nodes": 2, "min_nodes": 1, "mem": "500M"} if pack
                                else {"nodes": 1, "spare_nodes": spares, "mem": "500M"}),
                    "learner": {"mem": "1G", **({"spare_nodes": 1} if leader_spare or pack else {})}},
        training={"iterations": iterations, "eval_interval": 1000000},
        checkpoint={"interval": 10, "keep": 3, "memory_every": memory_every},
        preemption={"max_failures": 100},
        slurm={"partition": "debug", "time": "01:00:00"},
        env={"OMP_NUM_THREADS": "1", "HETRUN_MEMORY_DIR": memory_dir, **timeout},
    )


def wait(cond: Any, timeout: float, poll: float = 0.2) -> Any:
    end = time.time() + timeout
    while time.time() < end:
        got = cond()
        if got:
            return got
        time.sleep(poll)
    return None


def learner_iter(run_dir: Path, after: float = 0.0) -> int:
    its = [e["iteration"] for e in events(run_dir) if e.get("ev") == "action" and e.get("component") == "learner"
           and isinstance(e.get("iteration"), int) and e.get("end", 0) > after]
    return max(its, default=-1)


def victim_node(run_dir: Path, restart: int, component: str = "rollout") -> str | None:
    """The node of ``component``'s last rank in attempt ``restart``: the one to kill. Never the batch
    script's own node (the first of the first component): the script dies with it and Slurm requeues
    the job, a documented limit (docs/PREEMPTION.md), not the in-allocation path measured here."""
    starts = [e for e in events(run_dir) if e.get("ev") == "start" and e.get("component") == component
              and e.get("restart_count", 0) == restart]
    return max(starts, key=lambda e: e.get("comp_rank", 0))["node"] if starts else None


def batch_marks(run_dir: Path) -> list[tuple[float, str]]:
    """(time, what) of the batch script's timestamped lines ("hetrun: <EPOCHREALTIME> ...")."""
    out = []
    for log in sorted((run_dir / "logs").glob("batch-*.out")):
        for line in log.read_text(errors="replace").splitlines():
            words = line.split(" ", 2)
            if len(words) == 3 and words[0] == "hetrun:":
                try:
                    out.append((float(words[1]), words[2]))
                except ValueError:
                    continue
    return out


def stages(run_dir: Path, t0: float, restart: int) -> dict[str, float | None]:
    """Seconds from the kill to each stage of the recovery of attempt ``restart`` (the failed
    one): the batch script's own timestamps, then the new ranks' startup and restore events."""
    after = [(t, what) for t, what in batch_marks(run_dir) if t >= t0]

    def mark(prefix: str) -> float | None:
        return next((round(t - t0, 3) for t, what in after if what.startswith(prefix)), None)

    evs = events(run_dir)
    nxt = restart + 1
    ups = [e for e in evs if e.get("ev") == "startup" and e.get("restart_count") == nxt]
    mem = [e for e in evs if e.get("ev") == "memory_restore" and e.get("time", 0) > t0]
    rs = [e for e in evs if e.get("ev") == "restore" and e.get("restart_count") == nxt]
    end = next((e for e in evs if e.get("ev") == "attempt_end" and e.get("restart_count") == restart), None)

    def rel(values: list[float]) -> float | None:
        return round(max(values) - t0, 3) if values else None

    return {
        "silent_node_killed_s": mark("node "),  # the heartbeat monitor's verdict and SIGKILL
        "srun_ended_by_monitor_s": mark("srun still waits"),
        "step_ended_s": mark("step ended"),
        "postmortem_s": mark("post-mortem"),
        "attempt_end_s": rel([end["time"]]) if end else None,
        "ranks_srun_start_s": rel([e["srun_start"] for e in ups if e.get("srun_start")]),
        # srun -> the ranks' processes: the step's creation (waited "Requested nodes are busy"
        # for the failed step's resources before srun --overlap)
        "ranks_proc_start_s": rel([e["proc_start"] for e in ups if e.get("proc_start")]),
        "ranks_mpi_ready_s": rel([e["mpi_ready"] for e in ups if e.get("mpi_ready")]),
        "ranks_torch_imported_s": rel([e["torch_imported"] for e in ups if e.get("torch_imported")]),
        "ranks_executor_ready_s": rel([e["executor_ready"] for e in ups if e.get("executor_ready")]),
        "memory_agreed_s": rel([e["time"] for e in mem]),
        "state_loaded_s": rel([e["loaded"] for e in rs if e.get("loaded")]),
        "slowest_load_s": max((round(e["loaded"] - e["agreed"], 3) for e in rs if e.get("loaded")
                               and e.get("agreed")), default=None),
    }


def warm_servers(run_dir: Path) -> int:
    """The job's warm servers that are up (runtime/warm_start.py: each logs one "serves" line)."""
    return sum("serves" in p.read_text(errors="replace") for p in (run_dir / "logs").glob("hetrun-warm-*.out"))


def one_death(cluster: NodeCluster, run_dir: Path, restart: int, mode: str, wait_s: float = 300,
              after: int = 4, example: str = "ppo", warm: bool = True, ranks: int | None = None) -> dict[str, Any]:
    """Kill the victim component's node of attempt ``restart`` once it has run a few steps (PPO's
    rollout, the MoE LM's first learner node: EXAMPLES); time the recovery."""
    victim, _ = EXAMPLES[example]
    assert wait(lambda: learner_iter(run_dir) >= 0 and victim_node(run_dir, restart, victim), 150), "no start"
    if restart == 0 and warm:  # a long job's servers are up long before a node dies: wait for them
        assert wait(lambda: warm_servers(run_dir) >= NODES, 120), "the warm servers did not start"
    base = learner_iter(run_dir)
    assert wait(lambda: learner_iter(run_dir) >= base + after, 200 + 5 * after), "no progress"
    time.sleep(0.5 * (restart % 3))  # a different moment of the iteration each time
    node = victim_node(run_dir, restart, victim)
    assert node is not None
    t0 = time.time()
    if mode == "kill":
        cluster.kill_node(node)
    else:
        cluster.run("scontrol", "update", f"NodeName={node}", "State=DOWN", "Reason=node_death_bench")
    nxt = restart + 1

    def restored() -> list[dict[str, Any]] | None:
        rs = [e for e in events(run_dir) if e.get("ev") == "restore" and e.get("restart_count") == nxt]
        return rs if len(rs) == (ranks or RANKS[example]) else None

    rs = wait(restored, wait_s, poll=0.5)
    trial: dict[str, Any] = {"example": example, "mode": mode, "node": node, "restart": nxt, "killed_at": t0,
                             "load": os.getloadavg()[0]}
    if not rs:
        trial["error"] = f"no restore within {wait_s:g} s"
        trial["stages"] = stages(run_dir, t0, restart)
        print(json.dumps(trial), flush=True)
        return trial
    t_restored = max(e["time"] for e in rs)
    first = wait(lambda: min((e["end"] for e in events(run_dir) if e.get("ev") == "action"
                              and e.get("end", 0) > t_restored), default=None), 120)
    nf = next((e for e in events(run_dir) if e.get("ev") == "node_failure" and e.get("restart_count") == restart),
              None)
    starts = [e for e in events(run_dir) if e.get("ev") == "startup" and e.get("restart_count") == nxt]
    trial.update(
        decided_s=None if nf is None else round(nf.get("time", nf.get("t", 0)) - t0, 3),
        srun_start_s=round(min(e["srun_start"] for e in starts) - t0, 3) if starts else None,
        restored_s=round(t_restored - t0, 3),
        first_step_s=None if first is None else round(first - t0, 3),
        work_lost=max((e.get("work_lost") or 0) for e in rs),
        work_lost_by_component={e.get("component"): e.get("work_lost") for e in rs},
        # Iterations of the JOB done again: the slowest component's (every rank restores the
        # same step, so the smallest loss is the least advanced component's); a component
        # running ahead also redoes its lead (work_lost above): benchmarks/node_death.md.
        work_lost_job=min((e.get("work_lost") or 0) for e in rs),
        source=sorted({e.get("source") or "store" for e in rs}), step=rs[0].get("step"),
        # runtime/warm_start.py: each restarted rank forked from its node's warm server, or cold
        warm_start=sorted({bool(e.get("warm_start")) for e in starts}),
        action=None if nf is None else nf.get("action"), reason=None if nf is None else nf.get("reason"),
        stages=stages(run_dir, t0, restart))
    print(json.dumps(trial), flush=True)
    return trial


def submit(cluster: NodeCluster, spares: int, tag: str, node_timeout: int | None = None,
           memory_every: int | str = 1, example: str = "ppo", leader_spare: bool = False,
           cold: bool = False, pack: bool = False) -> tuple[Path, str]:
    from hetrun.dag.spec import spec_from_dict
    from hetrun.slurm_plugin.submit import submit_spec

    os.environ["SLURM_CONF"] = cluster.env["SLURM_CONF"]
    job = spec(spares, memory_every, 100000, "/tmp", node_timeout, example, leader_spare, cold, pack)
    res = submit_spec(spec_from_dict(job), backend="sbatch", runs_dir=BASE / tag)
    return Path(res.run.run_dir), str(res.run.job_id)


def deaths(cluster: NodeCluster, kills: int, down: bool, node_timeout: int | None,
           memory_every: int | str = 1, kill_after: int = 4, example: str = "ppo",
           leader_spare: bool = False, starts: str = "warm", pack: bool = False) -> list[dict[str, Any]]:
    """One death per spare node of the job (PPO: two, kill then kill, or with ``down`` kill then
    down; the MoE LM: one). ``leader_spare`` (PPO): learner and rollout one spare each, one death
    per job, with ``down`` the jobs alternate kill and down. ``starts``: warm (the product's
    default: runtime/warm_start.py), cold (``HETRUN_WARM_START=0``), or both (alternate jobs,
    warm first)."""
    trials: list[dict[str, Any]] = []
    spares = 1 if leader_spare else EXAMPLES[example][1]
    jobs = 0
    while len(trials) < kills:
        cold = starts == "cold" or (starts == "both" and jobs % 2 == 1)
        run_dir, job = submit(cluster, spares, "pack" if pack else "spare", node_timeout, memory_every, example,
                              leader_spare, cold, pack)
        if pack:  # one kill per job: the rollout then runs packed on its one node left
            modes: tuple[str, ...] = ("kill",)
        elif leader_spare:  # one death per job: kill, or with down every other job a DOWN
            modes = ("down" if down and jobs % 2 else "kill",)
        else:
            modes = ("kill", "down" if down else "kill")[:spares]
        jobs += 1
        try:
            for restart, mode in enumerate(modes):
                if len(trials) < kills:
                    try:
                        trials.append(one_death(cluster, run_dir, restart, mode, after=kill_after,
                                                example=example, warm=not cold, ranks=3 if pack else None))
                        trials[-1]["starts"] = "cold" if cold else "warm"
                        trials[-1]["packed"] = pack
                    except AssertionError as exc:  # recorded, not hidden: the job failed before the kill
                        trials.append({"mode": mode, "restart": restart + 1, "run_dir": str(run_dir),
                                       "error": f"before the kill: {exc}"})
                        print(json.dumps(trials[-1]), flush=True)
                        break
        finally:
            cluster.end_trial(job)
    return trials


def requeues(cluster: NodeCluster, kills: int, wait_s: float) -> list[dict[str, Any]]:
    """The peer: no spare nodes, so no --no-kill and no heartbeat monitor; the job goes through
    the queue (max_failures requeues it) once a survivor gives up on the dead peer
    (HETRUN_COLLECTIVE_TIMEOUT) and once Slurm has ended the old job (SlurmdTimeout)."""
    trials = []
    for _ in range(kills):
        run_dir, job = submit(cluster, 0, "requeue")
        try:
            t = one_death(cluster, run_dir, 0, "kill", wait_s, warm=False)  # no spares: no warm servers
            t["path"] = "requeue"
            trials.append(t)
        finally:
            cluster.end_trial(job)
    return trials


MODES = (("off", 0), ("every-1", 1), ("every-4", 4), ("auto", "auto"), ("ab", "auto"))
# "ab": the tier as "auto", paused every other block of AB_BLOCK steps (runtime/memory_tier.py
# PAUSE_ENV): its cost read inside each run (``block_ratios``), not across runs, whose iteration
# swung 2x between runs of the same mode on this VM (benchmarks/node_death.md, session 43).
AB_BLOCK = 20
MODE_ENV = {"ab": {"HETRUN_MEMORY_PAUSE_BLOCKS": str(AB_BLOCK)}}  # a mode's environment beyond spec()'s


def gap_ms(acts: list[dict[str, Any]], skip: int) -> float:
    """Median ms an iteration the first rank of ``acts`` spent outside its actions (iterations from
    ``skip``): from one iteration's first action start to the next's, less the actions' own time.
    The learner's: its snapshot and the executor's own work, on the critical path; a rollout
    rank's: the same plus its wait for the learner's weights (its slack)."""
    first: dict[int, float] = {}
    busy: dict[int, float] = {}
    for e in acts:
        if e.get("rank") != acts[0].get("rank"):
            continue
        it = e["iteration"]
        first[it] = min(first.get(it, e["start"]), e["start"])
        busy[it] = busy.get(it, 0.0) + e["end"] - e["start"]
    gaps = [first[i + 1] - first[i] - busy[i] for i in sorted(first) if i >= skip and i + 1 in first]
    return round(1e3 * statistics.median(gaps), 3) if gaps else 0.0


def block_ratios(acts: list[dict[str, Any]], skip: int, block: int = AB_BLOCK, drop: int = 2) -> list[float]:
    """Inside one "ab" run: each block of ``block`` iterations with the tier on (even blocks: the
    paused are odd) over the mean of its two neighbours with it off, by the learner's mean
    iteration (one iteration's first action start to the next's), iterations from ``skip``.
    Left out of every block: its first ``drop`` iterations (the helpers' work of the previous
    block's last snapshot, and the rollout, a step ahead, switching a step early) and its last
    (its length includes the next iteration's snapshot, taken before its first action). The
    neighbours on both sides cancel a drift that is linear across three blocks."""
    first: dict[int, float] = {}
    for e in acts:
        if e.get("rank") == acts[0].get("rank"):
            first[e["iteration"]] = min(first.get(e["iteration"], e["start"]), e["start"])
    per: dict[int, list[float]] = {}
    for i in sorted(first):
        if i >= skip and i + 1 in first and drop <= i % block < block - 1:
            per.setdefault(i // block, []).append(first[i + 1] - first[i])
    mean = {b: statistics.mean(v) for b, v in per.items() if len(v) >= 2}
    return [mean[b] / ((mean[b - 1] + mean[b + 1]) / 2) for b in sorted(mean)
            if b % 2 == 0 and b - 1 in mean and b + 1 in mean]


# Student's t, 97.5th percentile, for 1..20 degrees of freedom (about 2.0 beyond).
_T975 = (12.71, 4.30, 3.18, 2.78, 2.57, 2.45, 2.36, 2.31, 2.26, 2.23,
         2.20, 2.18, 2.16, 2.14, 2.13, 2.12, 2.11, 2.10, 2.09, 2.09)


def paired_ratio(runs: list[dict[str, Any]], label: str, key: str = "s_per_iter") -> dict[str, Any] | None:
    """``label``'s ``key`` (seconds per iteration or step) over ``off``'s in the same round (the
    rounds are interleaved: a round's runs follow each other, one per mode), as the geometric mean
    over the rounds with a ~95 % interval (t for n - 1 degrees of freedom), the median, and how
    many rounds ``label`` was slower in. Pairs within a round: the VM's speed drifts between
    rounds (1.8x within minutes in session 41), far less between neighbours. Reads a saved
    result's ``runs`` as well (node_death_command_bench.py's too, ``key="s_per_step"``)."""
    rounds: list[dict[str, Any]] = []
    for r in runs:
        if not rounds or r["overhead_run"] in rounds[-1]:
            rounds.append({})
        rounds[-1][r["overhead_run"]] = r.get(key)  # None: a run that failed (its row says why)
    ratios = [x[label] / x["off"] for x in rounds if x.get(label) and x.get("off")]
    got = geo_interval(ratios)
    return None if got is None else {"rounds": got.pop("n"), **got}


def geo_interval(ratios: list[float]) -> dict[str, Any] | None:
    """Ratios' geometric mean with a ~95 % interval (t for n - 1 degrees of freedom), the median,
    and how many are over 1; None for fewer than two."""
    if len(ratios) < 2:
        return None
    logs = [math.log(x) for x in ratios]
    mean, se = statistics.mean(logs), statistics.stdev(logs) / math.sqrt(len(logs))
    df = len(logs) - 1
    t = _T975[df - 1] if df <= len(_T975) else 2.0
    return {"n": len(ratios), "geo_mean": round(math.exp(mean), 4),
            "ci95": [round(math.exp(mean - t * se), 4), round(math.exp(mean + t * se), 4)],
            "median": round(statistics.median(ratios), 4), "slower_in": sum(x > 1 for x in ratios)}


def overhead(cluster: NodeCluster | None, pairs: int, iterations: int, skip: int,
             example: str = "ppo", modes: tuple[str, ...] = ()) -> dict[str, Any]:
    """Seconds per learner iteration, memory tier off / every iteration / adaptive (``auto``),
    as Slurm jobs on the cluster (PPO: learner and rollout on two nodes; the MoE LM
    (``example="moe"``): the learner's two nodes and the evaluator's; the replicas cross
    nodes), interleaved (the order rotates each round); iterations ``skip``..N, so the
    adaptive N (agreed from iteration 4, applied from 8; memory_tier.AGREE_EVERY) is settled in the window. Beside
    the A/B, each run's own share: the tier's seconds per rank (``memory_tier`` events,
    every snapshot's encode + checksum + tmpfs write + send) over the rank's training time.
    ``modes``: the labels to run (default all of MODES; "off" always, the A/B's reference)."""
    from hetrun.dag.spec import spec_from_dict
    from hetrun.slurm_plugin.backends.sbatch import SbatchBackend
    from hetrun.slurm_plugin.submit import submit_spec, wait_for_end

    if cluster is not None:
        os.environ["SLURM_CONF"] = cluster.env["SLURM_CONF"]
    chosen_modes = tuple(m for m in MODES if not modes or m[0] in modes or m[0] == "off")
    out: dict[str, list[float]] = {label: [] for label, _ in chosen_modes}
    share: dict[str, list[float]] = {label: [] for label, _ in chosen_modes}
    chosen: dict[str, list[Any]] = {label: [] for label, _ in chosen_modes}
    runs = []
    for i in range(pairs):
        k = i % len(chosen_modes)
        for label, every in chosen_modes[k:] + chosen_modes[:k]:
            res = submit_spec(spec_from_dict(spec(0, every, iterations, "/tmp", example=example,
                                                  env=MODE_ENV.get(label))), backend="sbatch",
                              runs_dir=BASE / "overhead")
            wait_for_end(res.run, SbatchBackend(), timeout_s=900, poll_s=1)
            d = Path(res.run.run_dir)
            evs = events(d)
            acts = [e for e in evs if e.get("ev") == "action" and e.get("component") == "learner"]
            t_skip = min(e["start"] for e in acts if e["iteration"] == skip)
            tn = max(e["end"] for e in acts)
            per = (tn - t_skip) / (iterations - skip)
            t0 = min(e["start"] for e in acts)
            tier = [e for e in evs if e.get("ev") == "memory_tier"]
            # The tier's share of the training time, per rank (the slowest rank's figure).
            pct = max((100 * e["seconds"] / (tn - t0) for e in tier), default=0.0)
            # ... and at the N the run ended with, over the iterations it was in effect.
            at_n = [(e.get("by_every") or {}).get(str(e.get("every"))) for e in tier]
            steady = max((100 * b["seconds"] / b["wall_s"] for b in at_n if b and b["wall_s"] > 0), default=None)
            out[label].append(per)
            share[label].append(round(pct, 3))
            chosen[label].append(sorted({e.get("every") for e in tier}))
            row = {"overhead_run": label, "s_per_iter": round(per, 5), "load": os.getloadavg()[0],
                   "tier_pct": round(pct, 3), "every": chosen[label][-1],
                   "tier_pct_at_final_n": None if steady is None else round(steady, 3),
                   "iterations_at_final_n": [b and b["iterations"] for b in at_n],
                   "snapshots": [e.get("snapshots") for e in tier], "tier_s": [e.get("seconds") for e in tier],
                   "bytes": [e.get("bytes") for e in tier],
                   # ms per snapshot by phase, per rank (runtime/memory_tier.py PHASES), and the CPU its
                   # replica threads spent per snapshot (off the training thread, on the node)
                   "phase_ms": [{k: round(1e3 * v / max(1, e.get("snapshots") or 1), 3)
                                 for k, v in {**(e.get("phase_s") or {}),
                                              "cpu_after_capture": e.get("phase_cpu_s") or 0,
                                              "replica_thread_cpu": e.get("replica_thread_cpu_s") or 0}.items()}
                                for e in tier],
                   # The learner's time outside its actions an iteration (median over the window): the
                   # executor's own between actions, and the tier's snapshot on the training thread. Its
                   # difference to `off` is the tier's cost on the critical path (the learner is the
                   # slower rank), with less of the machine's noise than the whole iteration's.
                   "learner_gap_ms": gap_ms(acts, skip),
                   "run_dir": str(d)}
            # ... as a share of the run's own iteration: the VM's speed swung 1.8x between runs
            # (benchmarks/node_death.md, session 41), which the gap's ms follow and this does not.
            row["learner_gap_pct"] = round(100 * row["learner_gap_ms"] / (1e3 * per), 3)
            # Each rank's share apart (the slowest rank's is ``tier_pct``): the PPO learner's
            # update got a third faster on the flat layout (session 42) and the rollout's snapshot,
            # env physics and RNG states, became the larger share, in a rank that waits for weights
            # each iteration (``rollout_gap_pct``: its time outside its actions, the wait included).
            row["tier_pct_by_rank"] = {f"{e.get('component')}:{e.get('rank')}": round(100 * e["seconds"] / (tn - t0), 3)
                                            for e in sorted(tier, key=lambda e: e.get("rank", 0))}
            roll = [e for e in evs if e.get("ev") == "action" and e.get("component") == "rollout"]
            row["rollout_gap_pct"] = round(100 * gap_ms(roll, skip) / (1e3 * per), 3) if roll else None
            if label == "ab":
                row["block_ratios"] = [round(x, 4) for x in block_ratios(acts, skip)]
            runs.append(row)
            print(json.dumps(row), flush=True)
    med = {label: statistics.median(v) for label, v in out.items()}
    gap_pct = {label: statistics.median(r["learner_gap_pct"] for r in runs if r["overhead_run"] == label)
               for label in out}
    return {"runs": runs, "s_per_iter": out, "median_s_per_iter": med, "tier_pct": share, "every": chosen,
            "overhead_pct_vs_off": {label: round(100 * (med[label] - med["off"]) / med["off"], 2)
                                    for label in med if label != "off"},
            "median_tier_pct": {label: statistics.median(v) for label, v in share.items() if label != "off"},
            "median_tier_pct_by_rank": {
                label: {c: statistics.median(r["tier_pct_by_rank"][c] for r in runs if r["overhead_run"] == label)
                        for c in next(r for r in runs if r["overhead_run"] == label)["tier_pct_by_rank"]}
                for label in out if label != "off"},
            "median_rollout_gap_pct": {label: statistics.median(r["rollout_gap_pct"] for r in runs
                                                                if r["overhead_run"] == label and r["rollout_gap_pct"] is not None)
                                       for label in out if any(r["rollout_gap_pct"] is not None for r in runs)},
            "median_learner_gap_ms": {label: statistics.median(r["learner_gap_ms"] for r in runs
                                                               if r["overhead_run"] == label) for label in out},
            # "ab": the whole iteration with the tier on over off inside each run, every block pair
            # of every run (block_ratios).
            **({"within_run": geo_interval([x for r in runs for x in r.get("block_ratios", [])])}
               if "ab" in out else {}),
            # The whole iteration against off, round by round (paired_ratio).
            "paired_vs_off": {label: paired_ratio(runs, label) for label in out if label != "off"},
            # The tier's snapshot on the learner's critical path, in points of its iteration.
            "learner_gap_pct_vs_off": {label: round(gap_pct[label] - gap_pct["off"], 3) for label in out if label != "off"}}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--kills", type=int, default=10)
    p.add_argument("--requeue-kills", type=int, default=2)
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--iterations", type=int, default=80)
    p.add_argument("--skip", type=int, default=20, help="overhead: iterations before the measured window")
    p.add_argument("--overhead-only", action="store_true")
    p.add_argument("--modes", nargs="*", default=[], choices=[m for m, _ in MODES],
                   help="overhead: the settings to run (default all; off always)")
    p.add_argument("--down", action="store_true", help="every job's second death: scontrol ... State=DOWN")
    p.add_argument("--pack", action="store_true",
                   help="PPO: the rollout on two nodes with min_nodes 1 and no spare (the learner with one); "
                        "one kill per job, the restart packs the rollout's ranks onto its surviving node")
    p.add_argument("--leader-spare", action="store_true",
                   help="PPO: the learner (first component) holds a spare too; one death per job")
    p.add_argument("--node-timeout", type=int, default=None,
                   help="HETRUN_NODE_TIMEOUT for the spare-node jobs (default: the product's)")
    p.add_argument("--memory-every", type=lambda x: x if x == "auto" else int(x), default=1,
                   help="checkpoint.memory_every of the spare-node jobs: N or auto (default 1)")
    p.add_argument("--kill-after", type=int, default=4,
                   help="learner iterations each attempt runs before its kill (auto settles its N from 8)")
    p.add_argument("--requeue-wait", type=float, default=600, help="seconds the requeue path may take")
    p.add_argument("--shared-cluster", action="store_true", help="--overhead-only on the shared test cluster")
    p.add_argument("--example", choices=sorted(EXAMPLES), default="ppo",
                   help="ppo: the rollout's node dies; moe: one of the MoE LM learner's two nodes (spare-node "
                        "deaths only)")
    p.add_argument("--starts", choices=("warm", "cold", "both"), default="warm",
                   help="restarted ranks: forked from the warm servers (the default), cold "
                        "(HETRUN_WARM_START=0), or both, alternating jobs")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "node_death.json")
    args = p.parse_args()
    if args.pack and (args.example != "ppo" or args.leader_spare or args.down):
        p.error("--pack is a PPO job of its own (the learner holds a spare): without --example moe, "
                "--leader-spare or --down")
    if args.example != "ppo" and args.requeue_kills:
        p.error("--example moe measures the spare-node path and the overhead only: add --requeue-kills 0")
    result: dict[str, Any] = {"load_before": os.getloadavg(), "started": time.strftime("%H:%M:%S", time.gmtime())}
    if args.overhead_only and args.shared_cluster:
        # No node is killed: the shared test cluster (2 of its nodes) will do.
        result["overhead"] = overhead(None, args.pairs, args.iterations, args.skip, args.example, tuple(args.modes))
        _save(args.out, result)
        return
    # Stopped by a signal (kill, pkill), the benchmark still stops its throw-away cluster (finally).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    cluster = NodeCluster()
    cluster.start()
    try:
        if not args.overhead_only:
            result["node_timeout"] = args.node_timeout
            result["memory_every"] = args.memory_every
            result["example"] = args.example
            result["leader_spare"] = args.leader_spare
            result["pack"] = args.pack
            result["starts"] = args.starts
            result["spare"] = deaths(cluster, args.kills, args.down, args.node_timeout, args.memory_every,
                                    args.kill_after, args.example, args.leader_spare, args.starts, args.pack)
            result["requeue"] = requeues(cluster, args.requeue_kills, args.requeue_wait)
            for key in ("spare", "requeue"):
                ok = [t for t in result[key] if t.get("first_step_s") is not None]
                if ok:
                    result[f"{key}_median_first_step_s"] = statistics.median(t["first_step_s"] for t in ok)
                    result[f"{key}_max_work_lost"] = max(t["work_lost"] for t in ok)
            for kind in ("warm", "cold"):
                ok = [t for t in result["spare"] if t.get("first_step_s") is not None and t.get("starts") == kind]
                if ok and args.starts == "both":
                    result[f"spare_median_first_step_s_{kind}"] = statistics.median(t["first_step_s"] for t in ok)
        if args.pairs:
            result["overhead"] = overhead(cluster, args.pairs, args.iterations, args.skip, args.example, tuple(args.modes))
    finally:
        cluster.stop()
    _save(args.out, result)


def _save(out: Path, result: dict[str, Any]) -> None:
    result["load_after"] = os.getloadavg()
    result["ended"] = time.strftime("%H:%M:%S", time.gmtime())
    out.parent.mkdir(parents=True, exist_ok=True)
    prev = json.loads(out.read_text()) if out.exists() else []
    out.write_text(json.dumps([*prev, result], indent=1))
    print(json.dumps({k: v for k, v in result.items() if k not in ("spare", "requeue")}, indent=1))


if __name__ == "__main__":
    main()
