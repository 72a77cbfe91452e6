#!/usr/bin/env bash
# Copy a checkout to DEST for running it where Slurm nodes can see it, without
# the source's machine state: .hetrun/python and the install stamp name the
# original's interpreter and editable install, so scripts/setup.sh in the copy
# must decide afresh (it reinstalls when hetrun imports from elsewhere).
# A virtualenv in .hetrun/venv is kept: it saves re-downloading torch.
# Usage: bash scripts/copy_checkout.sh SRC DEST   (DEST is replaced)
set -euo pipefail
SRC="$(cd "$1" && pwd -P)"
DEST="$2"
case "$DEST" in
    ""|/|"$SRC"|"$SRC"/*) echo "copy_checkout.sh: refusing destination '$DEST'" >&2; exit 2 ;;
esac
rm -rf "$DEST"
mkdir -p "$DEST"
cp -a "$SRC/." "$DEST/"
rm -f "$DEST/.hetrun/python" "$DEST/.hetrun/pyproject.sha256"
