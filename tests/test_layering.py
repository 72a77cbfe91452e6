"""Layering: the import directions docs/ARCHITECTURE.md allows, and the exception types every layer shares."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

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


@pytest.mark.parametrize(("module", "may_use"), [
    ("hetrun.rundir", {"hetrun.errors"}),
    ("hetrun.planfile", {"hetrun.errors", "hetrun.rundir"}),
])
def test_the_run_directory_modules_pull_only_the_standard_library(module: str, may_use: set[str]) -> None:
    # Every layer imports them, the CLI's light commands and each rank's start-up included.
    probe = (f"import sys, {module}\n"
             "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy', 'yaml', 'pydantic',"
             " 'mpi4py', 'orjson') or (m.startswith('hetrun.') and m != " + repr(module)
             + " and m not in " + repr(sorted(may_use)) + "))\n"
             "print('BAD=' + ','.join(bad))\n")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip().endswith("BAD="), proc.stdout + proc.stderr


# docs/ARCHITECTURE.md, "Dependencies point one way": which hetrun layers each
# layer may import. hetrun.errors, hetrun.backoff, hetrun.rundir and hetrun.planfile
# (standard library only) are open to every layer; the facade package `hetrun` may
# reach the public run API.
ALLOWED: dict[str, set[str]] = {
    "cli": {"dag", "slurm_plugin", "reports", "runtime"},
    "slurm_plugin": {"dag"},
    "reports": {"dag", "runtime"},
    "runtime": {"dag", "kernels"},
    "kernels": set(),
    "dag": set(),
    "examples": {"dag", "runtime", "kernels"},
    "hetrun": {"runtime"},
}
SHARED = {"errors", "backoff", "rundir", "planfile"}


def test_every_import_between_layers_points_the_way_architecture_md_allows() -> None:
    offenders = []
    for layer, allowed in ALLOWED.items():
        for path in sorted((ROOT / layer).rglob("*.py")):
            for module in _imported_modules(path):
                parts = module.split(".")
                if parts[0] != "hetrun" or len(parts) < 2:
                    continue
                target = parts[1]
                if target in SHARED or target == layer or target in allowed:
                    continue
                offenders.append(f"{path.relative_to(ROOT)} imports {module} ({layer} -> {target})")
    assert not offenders, "\n".join(offenders)


def test_the_old_dag_errors_module_is_gone_and_nothing_imports_it() -> None:
    assert not (ROOT / "dag" / "errors.py").exists()
    users = [f"{p.relative_to(ROOT)}" for layer in (*ALLOWED, "tests", "benchmarks")
             for p in sorted((ROOT / layer).rglob("*.py")) if "hetrun.dag.errors" in _imported_modules(p)]
    assert not users, users


def test_runtime_never_imports_the_report_readers() -> None:
    # The per-rank runtime writes run directories; hetrun.reports reads them.
    offenders = [f"{p.relative_to(ROOT)}: {m}" for p in sorted((ROOT / "runtime").rglob("*.py"))
                 for m in _imported_modules(p) if m.startswith("hetrun.reports")]
    assert not offenders, offenders
