"""The exception types live where every layer can import them without depending on dag."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _imported_modules(path: Path) -> set[str]:
    """Every module a file imports (absolute names; relative imports are left out)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_import_hetrun_errors_pulls_only_the_standard_library() -> None:
    probe = ("import sys, hetrun.errors\n"
             "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy', 'yaml', 'pydantic')"
             " or (m.startswith('hetrun.') and m != 'hetrun.errors'))\n"
             "print('BAD=' + ','.join(bad))\n")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip().endswith("BAD="), proc.stdout + proc.stderr


def test_dag_errors_re_exports_the_same_classes() -> None:
    import hetrun.dag.errors as old

    import hetrun.errors as new

    for name in old.__all__:
        assert getattr(old, name) is getattr(new, name), name
    assert issubclass(new.CheckpointError, new.HetrunError)


def test_kernels_do_not_import_dag_and_runtime_takes_errors_from_hetrun_errors() -> None:
    offenders = []
    for path in sorted((ROOT / "kernels").rglob("*.py")):
        offenders += [f"{path.relative_to(ROOT)}: {m}" for m in _imported_modules(path)
                      if m == "hetrun.dag" or m.startswith("hetrun.dag.")]
    for path in sorted((ROOT / "runtime").rglob("*.py")):
        offenders += [f"{path.relative_to(ROOT)}: {m}" for m in _imported_modules(path)
                      if m == "hetrun.dag.errors"]
    assert not offenders, offenders
