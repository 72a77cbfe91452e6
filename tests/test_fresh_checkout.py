"""The README's two commands from a clone under /tmp, in either order (issue 12).

scripts/test.sh runs a checkout under /tmp from a copy in /var/tmp (Slurm nodes
have their own /tmp). The copy must not carry the original's install stamp, and
scripts/setup.sh must reinstall whenever hetrun imports from another checkout,
so whichever script ran last, the editable install points where it runs.
A whole fresh-machine run is too heavy for a test; these check the two pieces.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = REPO / "scripts"


def _fake_checkout(root: Path) -> Path:
    src = root / "clone"
    (src / ".hetrun" / "venv" / "bin").mkdir(parents=True)
    (src / ".hetrun" / "python").write_text("/tmp/clone/.hetrun/venv/bin/python\n")
    (src / ".hetrun" / "pyproject.sha256").write_text("abc\n")
    (src / ".hetrun" / "venv" / "bin" / "python").write_text("")
    (src / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    return src


def test_copy_drops_the_install_state_and_keeps_the_rest(tmp_path: Path) -> None:
    src = _fake_checkout(tmp_path)
    dest = tmp_path / "copy"
    subprocess.run(["bash", str(SCRIPTS / "copy_checkout.sh"), str(src), str(dest)], check=True)
    assert (dest / "pyproject.toml").read_text() == (src / "pyproject.toml").read_text()
    assert (dest / ".hetrun" / "venv" / "bin" / "python").exists()
    assert not (dest / ".hetrun" / "pyproject.sha256").exists()
    assert not (dest / ".hetrun" / "python").exists()
    assert (src / ".hetrun" / "pyproject.sha256").exists()  # the original is untouched


def test_copy_refuses_a_destination_inside_the_source(tmp_path: Path) -> None:
    src = _fake_checkout(tmp_path)
    for dest in (src, src / "sub", Path("/")):
        proc = subprocess.run(["bash", str(SCRIPTS / "copy_checkout.sh"), str(src), str(dest)],
                              capture_output=True, text=True, check=False)
        assert proc.returncode == 2 and "refusing" in proc.stderr
    assert (src / "pyproject.toml").exists()


def test_install_counts_as_current_only_for_the_checkout_it_points_at(tmp_path: Path) -> None:
    here = subprocess.run([sys.executable, str(SCRIPTS / "installed_from.py"), str(REPO)],
                          capture_output=True, text=True, check=False)
    assert here.returncode == 0, here.stderr
    # A copy of this checkout (same stamp, same files): hetrun still imports from REPO.
    elsewhere = subprocess.run([sys.executable, str(SCRIPTS / "installed_from.py"), str(tmp_path)],
                               capture_output=True, text=True, check=False)
    assert elsewhere.returncode == 1
    assert f"imports from {REPO}" in elsewhere.stderr and str(tmp_path) in elsewhere.stderr


def test_setup_skips_the_install_only_when_it_is_current() -> None:
    setup = (SCRIPTS / "setup.sh").read_text()
    skip = next(line for line in setup.splitlines() if line.startswith('if [ "$want" = "$have" ]'))
    assert "installed_from.py" in skip, skip
    test_sh = (SCRIPTS / "test.sh").read_text()
    assert "copy_checkout.sh" in test_sh and "cp -a" not in test_sh
