#!/usr/bin/env bash
# Set up a machine to build, test and run hetrun. Idempotent; quick when done.
#
# For a fresh Debian 12 as root (CI), or a developer machine that already has
# most of it. It:
#   1. apt-get installs the Slurm/MPI/accounting packages that are missing;
#   2. picks a Python: $HETRUN_PYTHON, else python3 on PATH (an active venv,
#      pyenv...), unless that is Debian's "externally managed" system python:
#      then a venv in .hetrun/venv (created once);
#   3. installs torch==2.13.0 FIRST (an unpinned torch pulls a multi-GB CUDA
#      build; set HETRUN_TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
#      where that index is reachable to get the CPU-only wheel);
#   4. pip install -e ".[dev,gpu,lightning,s3]" from the repository root (gpu = triton, whose
#      interpreter runs the Triton kernel tests on CPU; skipped when
#      pyproject.toml is unchanged since the last install and hetrun imports).
# The chosen interpreter is written to .hetrun/python for scripts/test.sh.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
STATE="$ROOT/.hetrun"
mkdir -p "$STATE"

log() { printf '[setup] %s\n' "$*"; }
# pip chatters (build-backend warnings) even with -q: keep its output in a log, show it on failure.
pip_install() {
    "$PY" -m pip install -q --root-user-action=ignore "$@" >"$STATE/pip.log" 2>&1 \
        || { tail -60 "$STATE/pip.log" >&2; die "pip install $* failed (full log: $STATE/pip.log)"; }
}
die() { printf '[setup] ERROR: %s\n' "$*" >&2; exit 1; }

# Besides Slurm/MPI/accounting: the tools tests need, which fail (not skip) in CI without them
# (tests/setup_tools.py): lua5.1 (job_submit.lua), chromium (report screenshots), tmux
# (status --watch), gcc + libc6-dev (hetrun's C kernels, built on first use), libzstd1.
APT_PACKAGES=(slurm-wlm munge libslurm-dev openmpi-bin libopenmpi-dev slurmdbd mariadb-server lua5.1 chromium tmux gcc libc6-dev libzstd1)

missing_apt() {
    local pkg
    for pkg in "$@"; do
        if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed'; then
            printf '%s\n' "$pkg"
        fi
    done
}

apt_install() {
    local missing
    mapfile -t missing < <(missing_apt "$@")
    [ "${#missing[@]}" -eq 0 ] && return 0
    [ "$(id -u)" -eq 0 ] || die "packages missing: ${missing[*]} (run as root, or apt-get install them)"
    log "apt-get install ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >"$STATE/apt-update.log" 2>&1 || { cat "$STATE/apt-update.log" >&2; die "apt-get update failed"; }
    apt-get install -y -q --no-install-recommends "${missing[@]}" >"$STATE/apt-install.log" 2>&1 \
        || { tail -40 "$STATE/apt-install.log" >&2; die "apt-get install ${missing[*]} failed"; }
}

command -v dpkg-query >/dev/null || die "this script needs Debian/Ubuntu (dpkg/apt)"
apt_install "${APT_PACKAGES[@]}"

# --- Python -------------------------------------------------------------------
externally_managed() {
    # PEP 668: Debian's system python refuses pip installs outside a venv.
    "$1" - <<'EOF'
import os, sys, sysconfig
in_venv = sys.prefix != sys.base_prefix
marker = os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")
sys.exit(0 if (not in_venv and os.path.exists(marker)) else 1)
EOF
}

if [ -n "${HETRUN_PYTHON:-}" ]; then
    PY="$HETRUN_PYTHON"
else
    # python3 on PATH (an active venv, pyenv...) unless it is Debian's
    # externally managed system python; then our own venv in .hetrun/venv.
    PY="$(command -v python3 || true)"
    [ -n "$PY" ] || { apt_install python3; PY="$(command -v python3)"; }
    if externally_managed "$PY"; then
        if [ ! -x "$STATE/venv/bin/python" ]; then
            apt_install python3-venv python3-dev build-essential
            log "creating a virtualenv in .hetrun/venv (system python is externally managed)"
            "$PY" -m venv "$STATE/venv"
            "$STATE/venv/bin/python" -m pip install -q --root-user-action=ignore --upgrade pip
        fi
        PY="$STATE/venv/bin/python"
    fi
fi
PY="$("$PY" -c 'import sys; print(sys.executable)')"
"$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' \
    || die "$PY is older than Python 3.10"
printf '%s\n' "$PY" >"$STATE/python"
log "python: $PY ($("$PY" -c 'import platform; print(platform.python_version())'))"

# --- torch first, pinned --------------------------------------------------------
if "$PY" -c 'import torch, sys; sys.exit(0 if torch.__version__.split("+")[0] == "2.13.0" else 1)' 2>/dev/null; then
    log "torch 2.13.0 already installed"
else
    log "pip install torch==2.13.0"
    if [ -n "${HETRUN_TORCH_INDEX_URL:-}" ]; then
        pip_install --index-url "$HETRUN_TORCH_INDEX_URL" torch==2.13.0
    else
        pip_install torch==2.13.0
    fi
fi

# --- hetrun itself, editable, with dev tools ---------------------------------
want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
have="$(cat "$STATE/pyproject.sha256" 2>/dev/null || true)"
# The stamp alone can be stale (a copied checkout carries it): also require that
# hetrun imports from this very checkout (scripts/installed_from.py).
if [ "$want" = "$have" ] && "$PY" scripts/installed_from.py "$ROOT"; then
    log "hetrun already installed (editable, pyproject.toml unchanged)"
else
    log "pip install -e .[dev,gpu,lightning,s3]"
    pip_install -e ".[dev,gpu,lightning,s3]"
    printf '%s\n' "$want" >"$STATE/pyproject.sha256"
fi
"$PY" -c 'import hetrun.cli.app' || die "hetrun does not import after installation"
log "done"
