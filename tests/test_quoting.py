"""quoting: per-field validation for #SBATCH lines, shell quoting, path containment."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from hetrun.slurm_plugin import quoting
from hypothesis import given, settings
from hypothesis import strategies as st

from hetrun.errors import RunDirError, SpecError


@pytest.mark.parametrize("value", ["00:30:00", "30", "1-00", "1-00:00", "2-12:30:00", "10:00", "UNLIMITED"])
def test_time_accepts_slurm_formats(value: str) -> None:
    assert quoting.time_limit(value) == value


@pytest.mark.parametrize("value", ["", "1h", "00:30:00;id", "$(id)", "1 2", "00:30:00\n#SBATCH --wrap=id"])
def test_time_rejects_everything_else(value: str) -> None:
    with pytest.raises(SpecError, match=r"slurm\.time"):
        quoting.time_limit(value)


def test_names_and_partitions() -> None:
    assert quoting.partition("debug,high") == "debug,high"
    assert quoting.job_name("ppo-cartpole_1.2") == "ppo-cartpole_1.2"
    for bad in ("-rf", ".x", "a b", "a/b", "x" * 65, "", "a\nb"):
        with pytest.raises(SpecError):
            quoting.job_name(bad)
    for bad in ("a;b", "a b", "a,", ",a", "$x"):
        with pytest.raises(SpecError):
            quoting.partition(bad)
    with pytest.raises(SpecError):
        quoting.component_name("Learner")
    assert quoting.constraint("[rack1|rack2]&ib") == "[rack1|rack2]&ib"
    with pytest.raises(SpecError):
        quoting.constraint("a b")


def test_env_keys_and_values() -> None:
    assert quoting.env_key("OMP_NUM_THREADS", "env") == "OMP_NUM_THREADS"
    for bad in ("1X", "A-B", "A B", "A=B", "", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        with pytest.raises(SpecError):
            quoting.env_key(bad, "env")
    assert quoting.env_value(4, "env.X") == "4"
    assert quoting.env_value("tab\there", "env.X") == "tab\there"
    for bad in ("a\nb", "a\x00b", "a\rb", True, None, ["x"]):
        with pytest.raises(SpecError):
            quoting.env_value(bad, "env.X")


def test_extra_options() -> None:
    assert quoting.extra_option("--exclusive", "x") == ("exclusive", None)
    assert quoting.extra_option("--mail-user=me@example.org", "x") == ("mail-user", "me@example.org")
    for bad, why in (("--export=NONE", "env"), ("--wrap=id", "set by hetrun"), ("--output=/x", "set by hetrun"),
                     ("--uid=0", "runs as you"), ("-N2", "long sbatch option"), ("--nodez=2", "unknown")):
        with pytest.raises(SpecError, match=why):
            quoting.extra_option(bad, "slurm.extra[0]")


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40))
def test_sh_quoting_round_trips_through_bash(value: str) -> None:
    out = subprocess.run(["bash", "-c", f"printf %s {quoting.sh(value)}"], capture_output=True, check=True)
    assert out.stdout == value.encode()


def test_sbatch_path() -> None:
    assert quoting.sbatch_path(Path("/var/tmp/runs/a-1"), "run directory") == "/var/tmp/runs/a-1"
    for bad in ("/a b", "/a%j", "/a#b", "/a'b", '/a"b', "/a\nb", "relative"):
        with pytest.raises(RunDirError):
            quoting.sbatch_path(Path(bad), "run directory")


def test_inside_and_safe_join(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    assert quoting.safe_join(root, "sub/ckpt", "checkpoint.directory") == (root / "sub" / "ckpt").resolve()
    for bad in ("../x", "sub/../../x", "/etc", "a\x00b", "a\nb"):
        with pytest.raises(RunDirError):
            quoting.safe_join(root, bad, "checkpoint.directory")
    # A symlink inside the root that points out of it does not let a path escape.
    os.symlink(tmp_path, root / "link")
    with pytest.raises(RunDirError, match="outside"):
        quoting.safe_join(root, "link/elsewhere", "checkpoint.directory")
    for bad in ("..", ".", "a/b", ""):
        with pytest.raises(SpecError):
            quoting.check_relative_part(bad, "name")
