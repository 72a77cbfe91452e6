"""Exit 0 when this interpreter imports hetrun from the checkout given as argv[1]
(an editable install of it) and the test tools import; 1, saying why, otherwise.

scripts/setup.sh skips `pip install -e .` only then. An install stamp alone goes
stale: a checkout copied elsewhere (scripts/test.sh copies one out of /tmp)
carries the original's stamp while the editable install still points at the
original, which Slurm nodes may not see. Where the modules resolve is the truth.
Finds the modules without importing them (no torch), so it costs milliseconds.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path


def why_not_current(root: Path) -> str | None:
    for name in ("pytest", "mpi4py"):
        if importlib.util.find_spec(name) is None:
            return f"{name} is not installed"
    for name in ("hetrun.cli", "hetrun.dag", "hetrun.runtime", "hetrun.slurm_plugin"):
        try:
            spec = importlib.util.find_spec(name)
        except ImportError as exc:
            return f"{name}: {exc}"
        if spec is None or spec.origin is None:
            return f"{name} is not installed"
        where = Path(spec.origin).resolve()
        if root not in where.parents:
            return f"{name} imports from {where.parent}, not from {root}"
    return None


def main() -> int:
    reason = why_not_current(Path(sys.argv[1]).resolve())
    if reason:
        print(f"[setup] reinstalling: {reason}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
