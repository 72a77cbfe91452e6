"""The product owns its documents: no pointer outside the repository, and the
architecture page names only files and modules that exist."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def test_no_document_points_outside_the_repository() -> None:
    for doc in DOCS:
        text = doc.read_text()
        assert "../shared" not in text and "/work/" not in text, doc.name
    assert (REPO / "docs" / "ARCHITECTURE.md").is_file()
    assert "docs/ARCHITECTURE.md" in (REPO / "README.md").read_text()


def test_architecture_names_only_what_exists() -> None:
    text = (REPO / "docs" / "ARCHITECTURE.md").read_text()
    paths = set(re.findall(r"`((?:cli|dag|slurm_plugin|runtime|kernels|examples|scripts|tests|docs)/[\w./]+)`", text))
    paths |= set(re.findall(r"\b((?:dag|slurm_plugin|runtime|kernels|tests|scripts)/\w+\.(?:py|sh))\b", text))
    missing = sorted(p for p in paths if not (REPO / p.rstrip("/")).exists())
    assert not missing, f"docs/ARCHITECTURE.md names files that do not exist: {missing}"
    modules = set(re.findall(r"`(?:hetrun\.)?((?:dag|slurm_plugin|runtime|kernels)(?:\.\w+)+)", text))
    gone = sorted(m for m in modules if importlib.util.find_spec("hetrun." + m.rsplit(".", 1)[0]) is None)
    assert not gone, gone
    assert paths and modules


def test_readme_diff_of_the_ddp_example_is_exact() -> None:
    """README's "Bring your own script" shows `diff -u` of examples/ddp_train.py ->
    ddp_train_hetrun.py; it must stay what diff prints for the files as they are."""
    import subprocess

    a, b = "examples/ddp_train.py", "examples/ddp_train_hetrun.py"
    # GNU diff (diffutils is Essential on Debian); difflib places hunks differently.
    want = subprocess.run(["diff", "-u", "--label", a, "--label", b, a, b], cwd=REPO,
                          capture_output=True, text=True, check=False).stdout
    readme = (REPO / "README.md").read_text()
    start = readme.index(f"```diff\n--- {a}\n") + len("```diff\n")
    shown = readme[start:readme.index("```\n", start)]
    assert shown == want, "README's diff is stale: regenerate it with " \
        f"diff -u --label {a} --label {b} {a} {b}"
