"""The peer of issue 25's DDP node-death figure: torchrun elastic (TorchElastic), as a DDP user
would run it on a Slurm allocation to survive a node loss, on the same throw-away cluster as
hetrun's side, with the same script and the same kill (benchmarks/node_death_command_bench.py
``--torchrun-kills``; results beside hetrun's in benchmarks/node_death.md).

The job: ``sbatch -N 2 --no-kill``, one ``srun --no-kill`` task per node, each a torchrun agent
(``--nnodes=1:2 --nproc-per-node=1 --max-restarts``, the c10d rendezvous on the first node)
running examples/ddp_train.py: hetrun's DDP example without the run API, which saves
``torch.save`` every ``--save-every`` steps (rank 0, onto the shared file system) and resumes from
it; ``--step-time 0.05`` as on hetrun's side; ``--progress`` has rank 0 append each step's end.

Why ``1:2`` and not a spare node: torchrun's way to keep a spare is a third agent beyond
``--nnodes`` max, which waits in the rendezvous's redundancy list; tried here (torch 2.13,
``--nnodes=2`` with 3 agents, session 33): the agents re-ran the rendezvous over and over before
any kill, and after a kill with the defaults the new round never completed (the store reads
timed out after 60 s). Shrinking is how TorchElastic's docs present surviving a lost node; the
job goes on with one rank (half the global batch) where hetrun's goes on with two.

The first node runs the batch script and hosts the rendezvous store (``is_host`` set by node:
on a real cluster the agent on the endpoint's host is the one; here every emulated node is
127.0.0.1, so each agent is told), so it is never the one killed, as on hetrun's side.

Rendezvous settings (``--rdzv-conf``), both measured:
- ``torchrun``: its defaults. A node is dropped from the rendezvous when its agent's keep-alive
  is older than ``keep_alive_interval`` (5 s) x ``keep_alive_max_attempt`` (3); with fewer than
  ``max`` nodes the round then waits ``last_call_timeout`` (30 s) for more.
- ``torchrun-tuned``: the same knobs as low as a user would dare: keep-alive 1 s x 2, last call
  1 s (a slow agent under load is then dropped after 2 s).

Per death: kill -> the first step rank 0 logs after the restart ends (``first_step_s``); work
lost: the steps done before the kill that the resumed run does again (from its snapshot).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from node_death_bench import wait  # the benchmarks' folder is on sys.path (run as a script)

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "ddp_train.py"
CONFS = {"torchrun": "", "torchrun-tuned": "last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=2"}
FIRST_PORT = 29600  # the rendezvous port of the first trial; each trial takes the next


def job_script(out: Path, conf: str, save_every: int, port: int) -> str:
    """The sbatch script (module docstring)."""
    extra = f",{conf}" if conf else ""
    agent = (f"exec {shlex.quote(sys.executable)} -m torch.distributed.run"
             f' --rdzv-conf is_host=$([ "$SLURM_NODEID" = 0 ] && echo 1 || echo 0){extra}'
             f" --nnodes=1:2 --nproc-per-node=1 --max-restarts=10 --rdzv-backend=c10d"
             f" --rdzv-endpoint=127.0.0.1:{port} --rdzv-id=$SLURM_JOB_ID --local-addr=127.0.0.1"
             f" {shlex.quote(str(SCRIPT))} --steps 1000000 --step-time 0.05 --save-every {save_every}"
             f" --out {shlex.quote(str(out))} --progress {shlex.quote(str(out / 'progress.txt'))}")
    return "\n".join([
        "#!/bin/bash",
        f"#SBATCH -N 2 --ntasks-per-node=1 -p debug --time=00:30:00 --no-kill -o {out}/slurm-%j.out",
        "export OMP_NUM_THREADS=1",
        f"srun --no-kill --kill-on-bad-exit=0 bash -c {shlex.quote(agent)}",
        "",
    ])


def progress(out: Path) -> list[tuple[int, float, int]]:
    """Rank 0's lines: (step, end time, the step its process started at)."""
    try:
        text = (out / "progress.txt").read_text()
    except OSError:
        return []
    rows = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3:
            rows.append((int(parts[0]), float(parts[1]), int(parts[2])))
    return rows


def one_death(cluster: Any, out: Path, job: str, kill_after: int, wait_s: float) -> dict[str, Any]:
    """Kill the second node once rank 0 has logged ``kill_after`` steps; time the first resumed step."""
    if not wait(lambda: len(progress(out)) > kill_after, 200):
        return {"error": "no progress before the kill", "log": _tail(out, job)}
    nodelist = cluster.run("squeue", "-h", "-j", job, "-o", "%N").stdout.strip()
    node = cluster.run("scontrol", "show", "hostnames", nodelist).stdout.split()[1]
    t0 = time.time()
    cluster.kill_node(node)
    trial: dict[str, Any] = {"mode": "kill", "node": node, "killed_at": t0, "load": os.getloadavg()[0]}
    first = wait(lambda: next((r for r in progress(out) if r[1] > t0 and r[2] > 0), None), wait_s)
    if first is None:
        trial.update(error=f"no resumed step within {wait_s:g} s", log=_tail(out, job))
        return trial
    before = [r[0] for r in progress(out) if r[1] <= t0]
    trial.update(first_step_s=round(first[1] - t0, 3), resumed_at=first[2], last_before=max(before),
                 work_lost=max(before) + 1 - first[2])
    return trial


def _tail(out: Path, job: str) -> str:
    try:
        return (out / f"slurm-{job}.out").read_text()[-2000:]
    except OSError:
        return ""


def trials(cluster: Any, conf_name: str, kills: int, kill_after: int, save_every: int, wait_s: float,
           base: Path) -> list[dict[str, Any]]:
    """``kills`` jobs, one death each (module docstring); every node revived after each."""
    out_all = []
    for i in range(kills):
        out = base / f"{conf_name}-{os.getpid()}-{i}"
        subprocess.run(["rm", "-rf", str(out)], check=False)
        out.mkdir(parents=True)
        (out / "job.sh").write_text(job_script(out, CONFS[conf_name], save_every, FIRST_PORT + i))
        job = cluster.run("sbatch", "--parsable", str(out / "job.sh")).stdout.strip().split(";")[0]
        t = one_death(cluster, out, job, kill_after, wait_s)
        t.update(path=conf_name, out=str(out))
        print(json.dumps({k: v for k, v in t.items() if k != "log"}), flush=True)
        out_all.append(t)
        cluster.end_trial(job)
    return out_all
