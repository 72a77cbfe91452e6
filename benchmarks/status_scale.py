"""`hetrun status` over 100 runs: wall time next to a bare `squeue` (and `squeue --json`) in the
same run, interleaved, and the number of Slurm commands status ran (counted through a PATH shim
that logs each call).

The run directories are written here (Slurm backend, 2,000 events each with a restart), twice:
- "finished": the job ids of two-component het jobs of this cluster that have ended and left
  squeue (taken from sacct; a few reused when there are fewer than 100), what a user's runs
  directory mostly holds. The warm-up status sees them end and writes each run's status cache
  (cli/status_cache.py); ``status`` is then answered from it. ``status_first_sight`` (the same
  runs in a directory of their own) removes the caches before each call: the status that first
  sees the runs ended (squeue + sacct, every events file scanned, the caches written);
- "unknown": job ids of jobs that never existed, so every status asks squeue and then sacct
  (nothing final to cache).
Issue 24's target: `hetrun status` (its default: the newest 20 runs) within squeue + 0.3 s with
100 runs in the directory; `--last 0` (all of them) is measured too.

    python3 benchmarks/status_scale.py [--runs 100] [--repeat 7] [--before GIT_REF]

``--before REF`` adds ``status_before``: cli/status_show.py as it was at REF (from git), run
over the "finished" runs beside the rest, for a before/after in the same minutes; and
``status_first_sight_before``: today's status with the sbatch backend's sacct call as it was at
REF (``SbatchBackend._sacct``: ``sacct --json`` before 4 December), the first-sight case again.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def finished_het_jobs(limit: int = 100) -> list[str]:
    """Leader ids of two-component het jobs that ended and left squeue (newest first), from
    this cluster's accounting: status finds them in sacct, with an end state for both."""
    from hetrun.slurm_plugin.backends.base import ACTIVE_STATES

    acct = subprocess.run(["sacct", "-X", "-n", "-P", "-S", "2000-01-01", "--format=JobID,State"],
                          capture_output=True, text=True, check=True).stdout
    states: dict[str, dict[str, str]] = {}
    for line in acct.splitlines():  # a requeued job lists every attempt: the last one counts
        jobid, _, state = line.partition("|")
        leader, plus, offset = jobid.partition("+")
        if plus and leader.isdigit():
            states.setdefault(leader, {})[offset] = state.split()[0] if state else "UNKNOWN"
    # --json: the jobs the controller still holds, ended ones too (status asks the same)
    jobs = json.loads(subprocess.run(["squeue", "--json"], capture_output=True, text=True, check=True).stdout)["jobs"]
    queued = {str(j.get("het_job_id") or j.get("job_id")) for j in jobs}
    ended = [j for j, by in states.items() if sorted(by) == ["0", "1"] and j not in queued
             and all(s not in ACTIVE_STATES and s != "UNKNOWN" for s in by.values())]
    return sorted(ended, key=int, reverse=True)[:limit]


def ended_het_job(work: Path, timeout_s: float = 400) -> str:
    """Submit a two-component het job that ends at once and wait until the controller has
    purged it (MinJobAge, then its purge pass: 2-3 minutes here): for a cluster whose
    accounting has no ended het job yet. Its leader id."""
    script = work / "ends-at-once.sh"
    script.write_text("#!/bin/sh\ntrue\n")
    leader = subprocess.run(["sbatch", "--parsable", "-o", "/dev/null", "-n1", ":", "-n1", str(script)],
                            capture_output=True, text=True, check=True).stdout.strip().split(";")[0]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if leader in finished_het_jobs(limit=10**6):
            return leader
        time.sleep(5)
    raise TimeoutError(f"het job {leader} still held by the controller after {timeout_s:g} s")


def make_runs(root: Path, n: int, job_ids: list[str] | None = None) -> None:
    """``n`` run directories; job ids ``job_ids`` (reused in turn), else of jobs that never existed."""
    for i in range(n):
        d = root / f"bench-{i:03d}-20260101-000000-{i:04x}"
        d.mkdir(parents=True)
        job_id = job_ids[i % len(job_ids)] if job_ids else str(900000 + i)
        (d / "run.json").write_text(json.dumps({"name": f"bench-{i:03d}", "run_dir": str(d), "backend": "sbatch",
                                                "job_id": job_id, "components": ["learner", "rollout"],
                                                "submitted_at": "2026-01-01T00:00:00Z"}))
        with (d / "events.jsonl").open("w") as fh:
            for k in range(1000):
                fh.write(json.dumps({"ev": "action", "type": "rollout", "iteration": k, "rank": 1,
                                     "component": "rollout", "node": "n2", "start": k, "end": k + 0.5}) + "\n")
            fh.write(json.dumps({"ev": "attempt_end", "restart_count": 0, "outcome": "preempted",
                                 "requeued": True, "exit_code": 0, "reason": "bench", "t": 1000}) + "\n")
            fh.write(json.dumps({"ev": "restore", "rank": 1, "component": "rollout", "restart_count": 1,
                                 "step": 990, "iteration": 990, "restored_state": True, "work_lost": 9}) + "\n")
            for k in range(990, 1990):
                fh.write(json.dumps({"ev": "action", "type": "rollout", "iteration": k, "rank": 1,
                                     "component": "rollout", "node": "n2", "start": k, "end": k + 0.5}) + "\n")


def shim(bin_dir: Path, log: Path) -> None:
    for cmd in ("squeue", "sacct"):
        real = shutil.which(cmd)
        p = bin_dir / cmd
        p.write_text(f'#!/bin/sh\necho {cmd} >> "{log}"\nexec "{real}" "$@"\n')
        p.chmod(0o755)


def timed(cmd: list[str], env: dict[str, str], times: list[float], cpu: list[float]) -> None:
    """Wall time, and CPU time (user + system of the command and the processes it waited for:
    what the load does not inflate, unlike the wall time on a shared machine)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, capture_output=True, check=True)
    times.append(time.perf_counter() - t0)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)


def drop_caches(root: Path) -> None:
    from hetrun.rundir import STATUS_CACHE

    for cache in root.glob(f"*/{STATUS_CACHE}"):
        cache.unlink()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--before", metavar="GIT_REF", help="also time cli/status_show.py as it was at this commit")
    args = ap.parse_args()
    ended = finished_het_jobs()
    if not ended:
        sys.exit("no ended two-component het job in this cluster's sacct: run one (e.g. the test suite's "
                 "Slurm tests) and wait until it leaves squeue (MinJobAge)")
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        finished, first, unknown = Path(tmp) / "finished", Path(tmp) / "first", Path(tmp) / "unknown"
        first_before = Path(tmp) / "first_before"
        bin_dir, log = Path(tmp) / "bin", Path(tmp) / "calls.log"
        bin_dir.mkdir()
        make_runs(finished, args.runs, ended)
        make_runs(first, args.runs, ended)
        make_runs(unknown, args.runs)
        if args.before:
            make_runs(first_before, args.runs, ended)
        shim(bin_dir, log)
        env = {**os.environ, "HETRUN_RUNS": str(finished), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
        hetrun = [sys.executable, "-m", "hetrun.cli"]
        cmds = {"squeue": ["squeue"], "squeue_json": ["squeue", "--json"],
                "python_floor": [sys.executable, "-c", "pass"],  # the interpreter alone: the load's share
                "status": [*hetrun, "status"], "status_all": [*hetrun, "status", "--last", "0"],
                "status_first_sight": [*hetrun, "status", "--runs-dir", str(first)],
                "status_unknown": [*hetrun, "status", "--runs-dir", str(unknown)]}
        if args.before:  # the old module beside the new package: show_status(runs, runs_dir, last, as_json)
            old = Path(tmp) / "before"
            old.mkdir()
            (old / "status_show_before.py").write_text(subprocess.run(
                ["git", "show", f"{args.before}:cli/status_show.py"], cwd=Path(__file__).resolve().parents[1],
                capture_output=True, text=True, check=True).stdout)
            cmds["status_before"] = [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(old)!r}); "
                                     "from status_show_before import show_status; show_status([], None, 20, False)"]
            # The backend module as it was, its package-relative imports made absolute.
            backend = subprocess.run(["git", "show", f"{args.before}:slurm_plugin/backends/sbatch.py"],
                                     cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True,
                                     check=True).stdout
            backend = backend.replace("from ..rundir ", "from hetrun.slurm_plugin.rundir ").replace(
                "from .base ", "from hetrun.slurm_plugin.backends.base ").replace(
                "from .slurm_cli ", "from hetrun.slurm_plugin.backends.slurm_cli ")
            (old / "sbatch_before.py").write_text(backend)
            cmds["status_first_sight_before"] = [
                sys.executable, "-c", f"import sys; sys.path.insert(0, {str(old)!r}); import sbatch_before; "
                "from hetrun.slurm_plugin.backends import sbatch; "
                "sbatch.SbatchBackend._sacct = sbatch_before.SbatchBackend._sacct; "
                "from hetrun.cli.status_show import show_status; "
                f"show_status([], {str(first_before)!r}, 20, False)"]
        times: dict[str, list[float]] = {k: [] for k in cmds}
        cpu: dict[str, list[float]] = {k: [] for k in cmds}
        for cmd in cmds.values():  # warm-up: page cache, the controller's connection, the status caches
            subprocess.run(cmd, env=env, capture_output=True, check=True)
        calls: dict[str, list[str]] = {k: [] for k in cmds if k.startswith("status")}
        for _ in range(args.repeat):  # interleaved: every command sees the same load
            for key, cmd in cmds.items():
                if key == "status_first_sight":
                    drop_caches(first)
                if key == "status_first_sight_before":
                    drop_caches(first_before)
                log.write_text("")
                timed(cmd, env, times[key], cpu[key])
                if key in calls:
                    calls[key] += log.read_text().split()
        med = {k: statistics.median(v) for k, v in times.items()}
        over = med["status"] - med["squeue"]
        print(json.dumps({
            "runs": args.runs, "repeat": args.repeat, "load_average_1m": round(os.getloadavg()[0], 2),
            "ended_jobs_used": len(ended),
            **{f"{k}_median_s": round(v, 3) for k, v in med.items()},
            "cpu_median_s": {k: round(statistics.median(v), 3) for k, v in cpu.items()},
            "status_spread_s": [round(min(times["status"]), 3), round(max(times["status"]), 3)],
            "status_minus_squeue_s": round(over, 3), "target_s": 0.3, "met": over <= 0.3,
            "first_sight_minus_squeue_s": round(med["status_first_sight"] - med["squeue"], 3),
            "first_sight_met": med["status_first_sight"] - med["squeue"] <= 0.3,
            "unknown_minus_squeue_s": round(med["status_unknown"] - med["squeue"], 3),
            "slurm_calls_per_status": {k: {c: v.count(c) / args.repeat for c in sorted(set(v))}
                                       for k, v in calls.items()},
        }))


if __name__ == "__main__":
    main()
