"""Planning at scale: `hetrun plan` of a 512-node, 4096-GPU MoE job.

Measures, in one run on this machine:
- in-process phases: load spec, build plan (expand/compile/schedule/pack), unroll the
  pipeline window to rank level (>= 100,000 actions), schedule it (heap topological
  order with priorities);
- per-action scheduling overhead (schedule time / rank-level actions);
- peers on the very same rank-level graph: networkx's heap-based
  lexicographical_topological_sort with the same priority key, and the standard
  library's graphlib.TopologicalSorter (no priorities);
- the whole `hetrun plan` command, cold, as a subprocess (Python start-up included),
  next to `python -c pass`.

Published reference points (not measured here): Ray asynchronous tasks cost about
124 µs each, Dask's threaded scheduler about 200 µs per task
(https://docs.dask.org/en/stable/shared.html, "200us overhead per task").

    python benchmarks/plan_scale.py [--repeats 5] [--nodes 512] [--gpus-per-node 8]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BIG_JOB = """\
name: moe-{gpus}
workload: hetrun.examples.moe_lm:MoELMWorkload
components:
  learner:
    nodes: {nodes}
    tasks_per_node: {gpn}
    cpus_per_task: 8
    gpus_per_node: {gpn}
    gpu_mem: 80G
    mem: 1000G
    actions: [forward, backward, sync, optimize, checkpoint]
  evaluator:
    nodes: 8
    tasks_per_node: {gpn}
    cpus_per_task: 8
    gpus_per_node: {gpn}
    mem: 1000G
    actions: [eval]
training: {{kind: supervised, iterations: 100000, micro_batches: 16, pipeline_window: 2, eval_interval: 1}}
checkpoint: {{interval: 1}}
slurm: {{partition: gpu, time: "2-00:00:00"}}
"""


def median_time(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def cold(cmd: list[str], repeats: int) -> tuple[float, float]:
    """Median wall time and median CPU time (user + sys) of a fresh process.

    CPU time is what the command costs; wall time also holds waiting for a core,
    which on a shared machine can dominate.
    """
    walls, cpus = [], []
    for _ in range(repeats):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        walls.append(time.perf_counter() - t0)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr}")
    return statistics.median(walls), statistics.median(cpus)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--nodes", type=int, default=512)
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--no-peers", action="store_true")
    args = ap.parse_args()
    gpus = args.nodes * args.gpus_per_node
    with tempfile.TemporaryDirectory(prefix="hetrun-plan-scale-") as tmp:
        run(Path(tmp) / "moe_big.yaml", args, gpus)


def run(job: Path, args: argparse.Namespace, gpus: int) -> None:
    from hetrun.dag.plan import build_plan
    from hetrun.dag.spec import load_spec
    from hetrun.dag.unroll import schedule_order, unroll

    job.write_text(BIG_JOB.format(nodes=args.nodes, gpn=args.gpus_per_node, gpus=gpus))

    t_load, spec = median_time(lambda: load_spec(job), args.repeats)
    t_plan, plan = median_time(lambda: build_plan(spec), args.repeats)
    window = plan.training.pipeline_window
    t_unroll, graph = median_time(lambda: unroll(plan, window, per_rank=True), args.repeats)
    prios = [a.priority for a in plan.actions]
    t_sched, order = median_time(lambda: schedule_order(graph, prios), args.repeats)
    n, e = len(graph), graph.n_edges
    assert len(order) == n
    total = t_load + t_plan + t_unroll + t_sched

    rows = [
        ("hetrun load_spec", t_load, None),
        ("hetrun build_plan (template: expand, compile, schedule, pack)", t_plan, None),
        (f"hetrun unroll window ({window} iterations) to rank level", t_unroll, t_unroll / n),
        ("hetrun schedule (heap topological order with priorities)", t_sched, t_sched / n),
        ("hetrun total in-process", total, total / n),
    ]

    if not args.no_peers:
        import graphlib

        import networkx as nx

        edges = [(u, v) for u in range(n) for v in graph.successors(u)]  # untimed: the peers' input

        def build_nx() -> Any:
            g = nx.DiGraph()
            g.add_nodes_from(range(n))
            g.add_edges_from(edges)
            return g

        t_nx_build, g_nx = median_time(build_nx, max(1, args.repeats // 2))
        prio_of = [-prios[graph.block_tpl[b]] for b in graph.node_block]
        t_nx, nx_order = median_time(
            lambda: list(nx.lexicographical_topological_sort(g_nx, key=lambda v: (prio_of[v], v))),
            max(1, args.repeats // 2))
        assert len(nx_order) == n

        def graphlib_order() -> list[int]:
            ts: graphlib.TopologicalSorter[int] = graphlib.TopologicalSorter()
            for v in range(n):
                ts.add(v)
            for u, v in edges:
                ts.add(v, u)
            return list(ts.static_order())

        t_gl, gl_order = median_time(graphlib_order, max(1, args.repeats // 2))
        assert len(gl_order) == n
        rows += [
            ("peer: networkx DiGraph build", t_nx_build, t_nx_build / n),
            ("peer: networkx lexicographical_topological_sort (same priorities)", t_nx, t_nx / n),
            ("peer: graphlib.TopologicalSorter build + static_order (no priorities)", t_gl, t_gl / n),
        ]

    cold_repeats = max(3, args.repeats // 2)
    t_py = cold([sys.executable, "-c", "pass"], cold_repeats)
    t_cli = cold([sys.executable, "-m", "hetrun.cli", "plan", str(job), "--capacity", "spec"], cold_repeats)
    t_cli_json = cold([sys.executable, "-m", "hetrun.cli", "plan", str(job), "--capacity", "spec", "--json"],
                      cold_repeats)
    rows += [
        (f"cold: python -c pass (CPU {t_py[1] * 1e3:.0f} ms)", t_py[0], None),
        (f"cold: hetrun plan JOB: tables, rank-level window, sbatch script (CPU {t_cli[1] * 1e3:.0f} ms)",
         t_cli[0], None),
        (f"cold: hetrun plan JOB --json (CPU {t_cli_json[1] * 1e3:.0f} ms)", t_cli_json[0], None),
    ]

    print(f"job: {args.nodes} nodes x {args.gpus_per_node} GPUs = {gpus} GPUs; "
          f"{len(plan.actions)} template dispatches; rank-level window: {n} actions, {e} edges")
    print(f"median of {args.repeats} (cold: {cold_repeats}) runs; load average {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} CPUs\n")
    print("| step | time | per rank-level action |")
    print("|---|---:|---:|")
    for name, t, per in rows:
        per_text = f"{per * 1e6:.2f} µs" if per is not None else ""
        print(f"| {name} | {t * 1e3:.1f} ms | {per_text} |")
    print("| reference (published): Ray asynchronous task | | ~124 µs |")
    print("| reference (published): Dask threaded scheduler | | ~200 µs |")


if __name__ == "__main__":
    main()
