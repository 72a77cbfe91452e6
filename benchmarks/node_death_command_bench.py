"""A node dies under a command component (issue 25, the run API): node death -> first
resumed step of examples/ddp_train_hetrun.py, work lost, with a spare node (the batch
script restarts the step inside the allocation) and, in the same run, without one (the
requeue path through the queue). Results: benchmarks/node_death.md, raw trials in
benchmarks/results/node_death_command.json.

    flock /var/lock/hetrun-heavy.lock python3 benchmarks/node_death_command_bench.py --kills 4 --downs 2 --requeue-kills 1

Cluster: tests/node_cluster.py's throw-away 4-node cluster (its nodes may be killed).
Job: the DDP example as a 2-node command component (1 task per node, gloo),
``--step-time 0.05`` (20 steps/s), ``run.save`` every ``--save-every`` steps (async,
incremental, into the store on the shared file system), ``spare_nodes: 1``,
``max_failures`` high, the product's ``HETRUN_NODE_TIMEOUT``. Per job one death: after
``--kill-after`` steps every process of rank 1's emulated node is SIGKILLed (slurmd,
slurmstepd, the rank; rank 0's node runs the batch script and cannot be lost); then the
job is cancelled and the node revived for the next one; with ``--downs`` further jobs lose
the node by ``scontrol update NodeName=X State=DOWN`` instead (a one-component job is no het
job: Slurm kills the node's tasks and removes the node from the allocation, the job goes
on). Per death: kill -> the batch
script's ``node_failure`` decision, -> both ranks restored (``restore`` events), -> the
first step the resumed script logs (``run.log``) ends; work lost (the restore lines'
``work_lost``, steps); and ``stages``: seconds from the kill to the batch script's own
timestamped lines (step ended, post-mortem) and to the new ranks' wrapper start.

Where each rank's state came from (``restore`` events: ``source`` memory or the store,
``from_kind`` own copy or replica, ``from_node``). The memory tier is on by default with
``spare_nodes`` (``run.snapshot`` each step, adaptive N); ``--memory-every N`` pins it.

Steady overhead (``--overhead-pairs K``): the same job without a kill and without spares,
``--overhead-steps`` steps, memory tier off / every step / adaptive, interleaved (the order
rotates each round), seconds per step from rank 0's ``run.log`` lines after the first
``--overhead-skip`` (the adaptive N settled), and each run's own share: the tier's seconds
on the training thread (``memory_tier`` events: encode, checksums, tmpfs write; the replica
moves on the tier's thread) over the rank's training time.

The requeue path: the same job with ``spare_nodes: 0`` (no ``--no-kill``, no monitor;
``max_failures`` requeues it): the survivor's gloo call fails at once, the post-mortem
requeues, and the requeued job starts only once Slurm has ended the old one, which needs
the dead node marked down (``SlurmdTimeout``, 300 s here as by Slurm's default).
"""

from __future__ import annotations

import argparse
import json
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

import torchrun_elastic_peer as peer  # noqa: E402
from node_cluster import NodeCluster  # noqa: E402
from node_death_bench import batch_marks, paired_ratio, wait  # noqa: E402
from test_resume_exact import events  # noqa: E402

BASE = Path("/var/tmp/hetrun-bench/node_death_command")
EXAMPLE = ROOT / "examples" / "ddp_train_hetrun.py"


def spec(spares: int, save_every: int, out: Path, *, steps: int = 1000000,
         memory_every: int | str | None = None) -> dict[str, Any]:
    argv = [sys.executable, str(EXAMPLE), "--steps", str(steps), "--out", str(out), "--step-time", "0.05",
            "--save-every", str(save_every)]
    return {"name": "ddp-node-death", "components": {"trainer": {
                "nodes": 2, "spare_nodes": spares, "tasks_per_node": 1, "mem": "500M", "command": argv}},
            **({"checkpoint": {"memory_every": memory_every}} if memory_every is not None else {}),
            "preemption": {"max_failures": 100}, "slurm": {"partition": "debug", "time": "01:00:00"},
            # /tmp is each emulated node's own tmpfs: the memory tier dies with its node.
            "env": {"OMP_NUM_THREADS": "1", "HETRUN_MEMORY_DIR": "/tmp/hetrun-mem-bench"}}


def last_step(run_dir: Path, after: float = 0.0) -> int:
    its = [e["iteration"] for e in events(run_dir) if e.get("ev") == "action" and e.get("rank") == 0
           and isinstance(e.get("iteration"), int) and e.get("end", 0) > after]
    return max(its, default=-1)


def one_death(cluster: NodeCluster, run_dir: Path, kill_after: int, wait_s: float, mode: str) -> dict[str, Any]:
    assert wait(lambda: last_step(run_dir) >= kill_after, 200), "no progress before the kill"
    node = next(e["node"] for e in events(run_dir) if e.get("ev") == "start" and e.get("command")
                and e.get("comp_rank") == 1 and e.get("restart_count", 0) == 0)
    t0 = time.time()
    if mode == "kill":
        cluster.kill_node(node)
    else:
        cluster.run("scontrol", "update", f"NodeName={node}", "State=DOWN", "Reason=node_death_command_bench")

    def restored() -> list[dict[str, Any]] | None:
        rs = [e for e in events(run_dir) if e.get("ev") == "restore" and e.get("restart_count") == 1]
        return rs if len(rs) == 2 else None

    rs = wait(restored, wait_s, poll=0.5)
    trial: dict[str, Any] = {"mode": mode, "node": node, "killed_at": t0, "load": os.getloadavg()[0]}
    if not rs:
        trial["error"] = f"no restore within {wait_s:g} s"
        print(json.dumps(trial), flush=True)
        return trial
    t_restored = max(e["time"] for e in rs)
    first = wait(lambda: min((e["end"] for e in events(run_dir) if e.get("ev") == "action"
                              and e.get("end", 0) > t_restored), default=None), 120)
    evs = events(run_dir)
    nf = next((e for e in evs if e.get("ev") == "node_failure"), None)
    starts = [e["time"] for e in evs if e.get("ev") == "start" and e.get("command") and e.get("restart_count") == 1]
    marks = [(t, what) for t, what in batch_marks(run_dir) if t >= t0]

    def mark(prefix: str) -> float | None:
        return next((round(t - t0, 3) for t, what in marks if what.startswith(prefix)), None)

    trial.update(
        decided_s=None if nf is None else round(nf["time"] - t0, 3),
        restored_s=round(t_restored - t0, 3),
        first_step_s=None if first is None else round(first - t0, 3),
        work_lost=max((e.get("work_lost") or 0) for e in rs), step=rs[0].get("step"),
        sources=[{"rank": e.get("rank"), "source": e.get("source") or "store", "kind": e.get("from_kind"),
                  "node": e.get("from_node")} for e in sorted(rs, key=lambda e: e.get("rank") or 0)],
        store_step=next((m.get("store_step") for m in evs if m.get("ev") == "memory_restore" and m.get("used")
                         and m.get("time", 0) > t0), None),
        action=None if nf is None else nf.get("action"), reason=None if nf is None else nf.get("reason"),
        stages={"silent_node_killed_s": mark("node "), "step_ended_s": mark("step ended"),
                "postmortem_s": mark("post-mortem"),
                "wrappers_started_s": round(max(starts) - t0, 3) if len(starts) == 2 else None})
    print(json.dumps(trial), flush=True)
    return trial


def trials(cluster: NodeCluster, spares: int, modes: list[str], args: argparse.Namespace) -> list[dict[str, Any]]:
    from hetrun.dag.spec import spec_from_dict
    from hetrun.slurm_plugin.submit import submit_spec

    os.environ["SLURM_CONF"] = cluster.env["SLURM_CONF"]
    out = []
    for i, mode in enumerate(modes):
        tag = f"{'spare' if spares else 'requeue'}-{os.getpid()}-{i}"
        res = submit_spec(spec_from_dict(spec(spares, args.save_every, BASE / tag / "out",
                                              memory_every=args.memory_every)),
                          backend="sbatch", runs_dir=BASE / tag)
        run_dir, job = Path(res.run.run_dir), str(res.run.job_id)
        try:
            t = one_death(cluster, run_dir, args.kill_after, args.wait if spares else args.requeue_wait, mode)
        except AssertionError as exc:  # recorded, not hidden: the job failed before the kill
            t = {"mode": mode, "error": f"before the kill: {exc}", "run_dir": str(run_dir)}
            print(json.dumps(t), flush=True)
        t["path"] = "spare" if spares else "requeue"
        out.append(t)
        cluster.end_trial(job)
    return out


MODES = (("off", 0), ("every-1", 1), ("auto", "auto"))


def overhead(cluster: NodeCluster, pairs: int, steps: int, skip: int) -> dict[str, Any]:
    """Seconds per step, memory tier off / every step / adaptive (module docstring)."""
    from hetrun.dag.spec import spec_from_dict
    from hetrun.slurm_plugin.backends.sbatch import SbatchBackend
    from hetrun.slurm_plugin.submit import submit_spec, wait_for_end

    os.environ["SLURM_CONF"] = cluster.env["SLURM_CONF"]
    per: dict[str, list[float]] = {label: [] for label, _ in MODES}
    share: dict[str, list[float]] = {label: [] for label, _ in MODES}
    runs = []
    for i in range(pairs):
        for label, every in MODES[i % len(MODES):] + MODES[:i % len(MODES)]:
            tag = f"overhead-{os.getpid()}-{i}-{label}"
            res = submit_spec(spec_from_dict(spec(0, 1000000, BASE / tag / "out", steps=steps, memory_every=every)),
                              backend="sbatch", runs_dir=BASE / tag)
            wait_for_end(res.run, SbatchBackend(), timeout_s=600, poll_s=1)
            evs = events(Path(res.run.run_dir))
            ends = sorted(e["end"] for e in evs if e.get("ev") == "action" and e.get("rank") == 0
                          and isinstance(e.get("iteration"), int) and e["iteration"] >= skip)
            t0 = min((e["start"] for e in evs if e.get("ev") == "action" and e.get("rank") == 0), default=None)
            if len(ends) < 2 or t0 is None:
                runs.append({"overhead_run": label, "error": "the job logged too few steps", "run_dir": res.run.run_dir})
                print(json.dumps(runs[-1]), flush=True)
                continue
            s_step = (ends[-1] - ends[0]) / (len(ends) - 1)
            tier = [e for e in evs if e.get("ev") == "memory_tier"]
            pct = max((100 * e["seconds"] / (ends[-1] - t0) for e in tier), default=0.0)
            per[label].append(s_step)
            share[label].append(round(pct, 3))
            row = {"overhead_run": label, "s_per_step": round(s_step, 5), "load": os.getloadavg()[0],
                   "tier_pct": round(pct, 3), "every": sorted({e.get("every") for e in tier}),
                   "snapshots": [e.get("snapshots") for e in tier], "tier_s": [e.get("seconds") for e in tier],
                   "bytes": [e.get("bytes") for e in tier], "by_every": [e.get("by_every") for e in tier],
                   "replication_errors": [e["replication_error"] for e in tier if e.get("replication_error")],
                   "run_dir": res.run.run_dir}
            runs.append(row)
            print(json.dumps(row), flush=True)
    med = {label: statistics.median(v) for label, v in per.items() if v}
    return {"runs": runs, "s_per_step": per, "median_s_per_step": med, "tier_pct": share,
            "overhead_pct_vs_off": {label: round(100 * (med[label] - med["off"]) / med["off"], 2)
                                    for label in med if label != "off" and "off" in med},
            "median_tier_pct": {label: statistics.median(v) for label, v in share.items() if label != "off" and v},
            # The whole step against off, round by round (node_death_bench.paired_ratio).
            "paired_vs_off": {label: paired_ratio(runs, label, "s_per_step") for label, _ in MODES if label != "off"}}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--kills", type=int, default=5)
    p.add_argument("--downs", type=int, default=0,
                   help="spare-path deaths by scontrol update NodeName=X State=DOWN instead of a kill")
    p.add_argument("--requeue-kills", type=int, default=1)
    p.add_argument("--kill-after", type=int, default=40, help="steps rank 0 has logged before the kill")
    p.add_argument("--save-every", type=int, default=10)
    p.add_argument("--wait", type=float, default=120, help="seconds the spare path may take")
    p.add_argument("--requeue-wait", type=float, default=480, help="seconds the requeue path may take")
    p.add_argument("--memory-every", default=None,
                   help="checkpoint.memory_every of the kill jobs (default: unset, adaptive with spares)")
    p.add_argument("--overhead-pairs", type=int, default=0, help="rounds of off / every-1 / auto (no kill)")
    p.add_argument("--overhead-steps", type=int, default=300)
    p.add_argument("--overhead-skip", type=int, default=20, help="steps before the measured window")
    p.add_argument("--torchrun-kills", type=int, default=0,
                   help="the peer (benchmarks/torchrun_elastic_peer.py): deaths per rendezvous setting")
    p.add_argument("--torchrun-confs", nargs="+", default=list(peer.CONFS), choices=list(peer.CONFS))
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "node_death_command.json")
    args = p.parse_args()
    if args.memory_every is not None and args.memory_every != "auto":
        args.memory_every = int(args.memory_every)
    result: dict[str, Any] = {"load_before": os.getloadavg(), "started": time.strftime("%H:%M:%S", time.gmtime()),
                              "save_every": args.save_every, "kill_after": args.kill_after,
                              "memory_every": args.memory_every}
    # Stopped by a signal (kill, pkill), the benchmark still stops its throw-away cluster (finally).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    cluster = NodeCluster()
    cluster.start()
    try:
        result["spare"] = trials(cluster, 1, ["kill"] * args.kills + ["down"] * args.downs, args)
        result["requeue"] = trials(cluster, 0, ["kill"] * args.requeue_kills, args)
        for conf in args.torchrun_confs if args.torchrun_kills else []:
            result[conf] = peer.trials(cluster, conf, args.torchrun_kills, args.kill_after, args.save_every,
                                       args.wait, BASE)
        if args.overhead_pairs:
            try:
                result["overhead"] = overhead(cluster, args.overhead_pairs, args.overhead_steps, args.overhead_skip)
            except Exception as exc:  # recorded, not hidden; the kill trials above are kept
                result["overhead"] = {"error": repr(exc)}
    finally:
        cluster.stop()
    for key in ("spare", "requeue", *(c for c in peer.CONFS if c in result)):
        ok = [t for t in result[key] if t.get("first_step_s") is not None]
        if ok:
            result[f"{key}_median_first_step_s"] = statistics.median(t["first_step_s"] for t in ok)
            for mode in ("kill", "down"):
                mine = [t["first_step_s"] for t in ok if t["mode"] == mode]
                if mine and key == "spare":
                    result[f"spare_{mode}_median_first_step_s"] = statistics.median(mine)
            result[f"{key}_max_work_lost"] = max(t["work_lost"] for t in ok)
            result[f"{key}_work_lost"] = [t["work_lost"] for t in ok]
            if key in ("spare", "requeue"):
                result[f"{key}_state_from"] = [sorted({s["source"] for s in t.get("sources") or []}) for t in ok]
        result[f"{key}_errors"] = len(result[key]) - len(ok)
    result["load_after"] = os.getloadavg()
    result["ended"] = time.strftime("%H:%M:%S", time.gmtime())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    prev = json.loads(args.out.read_text()) if args.out.exists() else []
    args.out.write_text(json.dumps([*prev, result], indent=1))
    summary = {k: v for k, v in result.items() if k not in ("spare", "requeue", "overhead", *peer.CONFS)}
    if "overhead" in result:
        summary["overhead"] = {k: v for k, v in result["overhead"].items() if k != "runs"}
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
