"""How long a HEALTHY node's heartbeat can look silent under load (issue 25): the
false-positive side of ``HETRUN_NODE_TIMEOUT``. Results: benchmarks/node_death.md.

    flock /var/lock/hetrun-heavy.lock python3 benchmarks/heartbeat_gaps.py --hogs 0 12 --seconds 60

Per setting: ``--hogs`` busy-loop processes load the machine (on top of whatever
else runs); a "rank" process beats with the runtime's own heartbeat
(runtime/recovery.py ``start_heartbeat``, ``HETRUN_HEARTBEAT_S`` default) while its
main thread trains a small torch MLP and runs pure-Python work between steps (the
heartbeat thread competes for the GIL, as in a real rank); a bash loop judges it
with the batch script's rule (slurm_plugin/render.py ``_hetrun_heartbeats``: read
the counter every 0.5 s, the age is the time since the value last changed on
bash's clock). Reported: the largest age any poll saw (a timeout at or below it
would have killed this healthy job), the longest time between two changes the
monitor saw (an upper bound of the silence, the monitor's own delays included),
and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

RANK = r"""
import sys, time
import torch
from hetrun.runtime import recovery
torch.set_num_threads(1)
recovery.start_heartbeat(sys.argv[1], "n1")
net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(), torch.nn.Linear(256, 64))
opt = torch.optim.Adam(net.parameters())
end = time.time() + float(sys.argv[2])
while time.time() < end:
    x = torch.randn(256, 64)
    loss = (net(x) - x).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    sum(i * i for i in range(20000))  # pure Python: holds the GIL between switch intervals
recovery.stop_heartbeat()
"""

# The monitor's rule (render.py _hetrun_heartbeats), printing each poll's age in microseconds.
MONITOR = r"""
set -u
f="$1/logs/alive/n1"; seen=''; changed=0
while [ "$SECONDS" -lt "$2" ]; do  # $2: a deadline; the rank's stop removes the file
    sleep 0.5
    if ! { read -r v < "$f"; } 2>/dev/null; then
        # gone after it was seen: the rank ended (stop_heartbeat); else a torn read, skipped
        if [ -n "$seen" ] && [ ! -e "$f" ]; then break; fi
        continue
    fi
    now=${EPOCHREALTIME//[!0-9]/}
    if [ "$seen" != "$v" ]; then
        if [ "$changed" -gt 0 ]; then echo "gap $(( now - changed ))"; fi
        seen=$v; changed=$now; continue
    fi
    echo "age $(( now - changed ))"
done
"""


def measure(hogs: int, seconds: float) -> dict[str, object]:
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(hogs)]
    try:
        time.sleep(3 if hogs else 0)
        with tempfile.TemporaryDirectory(dir="/var/tmp") as run_dir:
            rank = subprocess.Popen([sys.executable, "-c", RANK, run_dir, str(seconds)])
            mon = subprocess.run(["bash", "-c", MONITOR, "monitor", run_dir, str(int(3 * seconds + 120))],
                                 capture_output=True, text=True, check=True)
            rank.wait()
        load = os.getloadavg()
    finally:
        for b in burners:
            b.kill()
            b.wait()
    rows = [line.split() for line in mon.stdout.splitlines()]
    ages = sorted(int(v) / 1e6 for k, v in rows if k == "age")
    gaps = sorted(int(v) / 1e6 for k, v in rows if k == "gap")
    return {"hogs": hogs, "seconds": seconds, "load_avg_1m": round(load[0], 2), "changes_seen": len(gaps),
            # the longest a healthy node looked silent to the monitor (0: never unchanged at a poll)
            "polls_unchanged": len(ages), "max_age_s": round(ages[-1], 3) if ages else 0.0,
            # the longest time between two changes the monitor saw (its own poll delays included)
            "max_change_gap_s": round(gaps[-1], 3) if gaps else None,
            "p99_change_gap_s": round(gaps[int(0.99 * (len(gaps) - 1))], 3) if gaps else None,
            "rank_exit": rank.returncode}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--hogs", type=int, nargs="+", default=[0, 12])
    p.add_argument("--seconds", type=float, default=60)
    args = p.parse_args()
    for h in args.hogs:
        print(json.dumps(measure(h, args.seconds)), flush=True)


if __name__ == "__main__":
    main()
