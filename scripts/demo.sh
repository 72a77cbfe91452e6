#!/usr/bin/env bash
# The main job end to end on the embedded default backend (local: no Slurm
# needed; components become local Open MPI process groups), ending with its
# report. Extra arguments go to `hetrun submit` (e.g. --set training.iterations=5).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

T0=$(date +%s)
section() { printf '\n==== %s  [%s UTC, +%ss] ====\n' "$*" "$(date -u +%H:%M:%S)" "$(( $(date +%s) - T0 ))"; }

section "setup (scripts/setup.sh)"
bash scripts/setup.sh
PY="$(cat .hetrun/python)"
PY_BIN="$(dirname "$PY")"
export PATH="$PY_BIN:$PATH"

# A fresh runs root, so the run this demo makes is the only one in it.
# Outside /tmp: the same directory then also works with the Slurm backends.
HETRUN_RUNS="${HETRUN_RUNS:-/var/tmp/hetrun-demo}/$(date -u +%Y%m%d-%H%M%S)-$$"
export HETRUN_RUNS
mkdir -p "$HETRUN_RUNS"

section "hetrun submit examples/ppo_cartpole.yaml --backend local --wait"
hetrun submit examples/ppo_cartpole.yaml --backend local --wait "$@"

runs=("$HETRUN_RUNS"/*/)
[ -d "${runs[0]}" ] || { echo "demo.sh: no run directory was created under $HETRUN_RUNS" >&2; exit 1; }
RUN="${runs[0]%/}"

section "hetrun report $RUN"
hetrun report "$RUN"

section "done: run directory $RUN"
