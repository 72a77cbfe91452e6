#!/usr/bin/env bash
# THE test command: set up the machine, bring up the local Slurm cluster, run
# the whole pytest suite (every marker, Slurm included). Extra arguments go to
# pytest, e.g. `bash scripts/test.sh tests/test_cluster*.py -x`.
# Exit code = pytest's; "no tests collected" (5) counts as a failure.
set -euo pipefail

# -P: the physical path, so a symlink into /tmp is seen for what it is.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
cd "$ROOT"

T0=$(date +%s)
section() { printf '\n==== %s  [%s UTC, +%ss] ====\n' "$*" "$(date -u +%H:%M:%S)" "$(( $(date +%s) - T0 ))"; }

case "$ROOT/" in
    /tmp/*|/dev/shm/*|/run/*)
        # Each Slurm node has its own /tmp (the emulated ones too): jobs could not
        # see this checkout, nor an editable install pointing into it. Run from a
        # copy; its setup re-points the editable install there (scripts/setup.sh).
        COPY="/var/tmp/hetrun-src"
        section "repository is under a node-private directory, invisible to Slurm jobs: running from a copy in $COPY"
        bash "$ROOT/scripts/copy_checkout.sh" "$ROOT" "$COPY"
        exec bash "$COPY/scripts/test.sh" "$@"
        ;;
esac

section "setup (scripts/setup.sh)"
bash scripts/setup.sh
PY="$(cat .hetrun/python)"
# The interpreter's bin (a venv's, where setup made one) first: `hetrun`, `pytest`.
PY_BIN="$(dirname "$PY")"
export PATH="$PY_BIN:$PATH"

section "local Slurm cluster (hetrun cluster up)"
"$PY" -m hetrun.cli cluster up

section "pytest ${*:-(whole suite)}"
# Two pytest-xdist workers (HETRUN_TEST_WORKERS; 1 = one process, no xdist): the Slurm
# tests run one after another on one of them (they share one cluster: tests/conftest.py
# puts them in one xdist group), everything else spreads over both. Most Slurm-test time
# is waiting on the scheduler, which leaves a core to the other worker.
WORKERS="${HETRUN_TEST_WORKERS:-2}"
XDIST=()
if [ "$WORKERS" -gt 1 ]; then
    XDIST=(-n "$WORKERS" --dist loadgroup)
fi
set +e
# --durations=40: the slowest tests, for the suite-time budget (<= 30 min on 2 cores);
# tests/conftest.py adds the slowest files.
"$PY" -m pytest -p no:cacheprovider -p no:benchmark --timeout=600 --durations=40 "${XDIST[@]}" "$@"
rc=$?
set -e

if [ "$rc" -eq 5 ]; then
    echo "test.sh: pytest collected no tests: that is a failure" >&2
fi
section "done: pytest exit code $rc"
exit "$rc"
