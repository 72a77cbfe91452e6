"""One set of validators: every value the job spec accepts renders, and every
value the renderer would refuse is refused by the spec first, with file:line:col.

The candidates are the spellings users write (from docs/CONTRACTS.md and the
sbatch man page) plus the ones that once disagreed between the two checkers.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from hetrun.dag import validators as v
from hetrun.dag.plan import build_plan
from hetrun.dag.spec import load_spec
from hetrun.slurm_plugin.render import render_sbatch
from hypothesis import given, settings
from hypothesis import strategies as st

from hetrun.errors import SpecError

RUN_DIR = Path("/var/tmp/hetrun-agree/RUN")

BASE = """\
name: {name}
workload: pkg.mod:Work
components:
  learner:
    nodes: 1
    mem: 1G
    actions: [forward, backward, sync, optimize, checkpoint, eval]
  rollout:
    mem: 1G
    actions: [rollout]
training: {{kind: rl, iterations: 2}}
slurm:
  time: {time}
  constraint: {constraint}
  partition: {partition}
  extra: {extra}
preemption: {{signal: {signal}, grace_seconds: 10}}
env:
  X: {env}
"""
DEFAULTS = {"name": "ok", "time": '"00:30:00"', "constraint": "null", "partition": "debug",
            "extra": "[]", "signal": "USR1", "env": '"1"'}

CANDIDATES = {
    "name": [".hidden", "-rf", "_ok", "a.b-c", "x" * 64, "x" * 65, "'a b'"],
    "time": ["Unlimited", "unlimited", "INFINITE", "30", "1-00", "99999-0", '"100000-0"', "1h",
             '"00:30:00\\n#SBATCH --wrap=id"'],
    "constraint": ["'[rack1|rack2]&ib'", "'!gpu'", "'a b'", "'gpu*2'", "'x;y'"],
    "partition": ["debug,high", "'a;b'", "'a,'", "x" * 64, "x" * 65],
    "extra": ["[--export=ALL]", "[--exclusive]", "[--open-mode=append]", "['--comment=a&b|(c)!']",
              "['--comment=50%']", "['--comment=a b']", "['--mail-type=END']", "[--no-requeue]",
              "['--exclusive\\n']", "[--gid=0]", "[--bbf=x]"],
    "signal": ["XCPU", "QUIT", "ALRM", "sigusr2", "KILL", "STOP"],
    "env": ['"\\e[31mred"', '"tab\\there"', '"a\\nb"', '"\\x7f"', "1.5", "true", '"$(id)"'],
}


def _outcome(tmp_path: Path, key: str, value: str) -> tuple[str, SpecError | None]:
    fields = dict(DEFAULTS, **{key: value})
    job = tmp_path / "job.yaml"
    job.write_text(textwrap.dedent(BASE.format(**fields)))
    try:
        spec = load_spec(job)
    except SpecError as err:
        return "spec-refused", err
    render_sbatch(build_plan(spec), spec, RUN_DIR, python="/usr/bin/python3")
    return "rendered", None


@pytest.mark.parametrize(("key", "value"), [(k, x) for k, xs in CANDIDATES.items() for x in xs])
def test_spec_and_renderer_agree(tmp_path: Path, key: str, value: str) -> None:
    """Either both accept, or the spec refuses with the file, line and column."""
    _, err = _outcome(tmp_path, key, value)
    if err is not None:
        assert err.file and err.file.endswith("job.yaml") and err.line and err.column, str(err)


@pytest.mark.parametrize(("key", "value", "expected"), [
    ("name", ".hidden", "spec-refused"), ("name", "-rf", "spec-refused"),
    ("time", "Unlimited", "rendered"), ("signal", "XCPU", "rendered"),
    ("extra", "[--export=ALL]", "spec-refused"), ("env", '"\\e[31mred"', "spec-refused"),
    ("constraint", "'!gpu'", "rendered"), ("extra", "['--comment=a&b|(c)!']", "rendered"),
])
def test_once_disagreeing_values(tmp_path: Path, key: str, value: str, expected: str) -> None:
    assert _outcome(tmp_path, key, value)[0] == expected


def test_unlimited_is_written_one_way(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(BASE.format(**dict(DEFAULTS, time="Unlimited")))
    spec = load_spec(job)
    assert spec.slurm.time == "UNLIMITED"
    assert "#SBATCH --time=UNLIMITED" in render_sbatch(build_plan(spec), spec, RUN_DIR, python="/usr/bin/python3")


_SLURM_TEXT = st.text(alphabet=st.characters(codec="ascii"), min_size=0, max_size=12)


@settings(max_examples=150, deadline=None)
@given(key=st.sampled_from(["time", "constraint", "partition", "signal", "env", "name"]), raw=_SLURM_TEXT)
def test_random_strings_never_pass_the_spec_and_fail_the_renderer(key: str, raw: str) -> None:
    import tempfile

    # A double-quoted YAML scalar carries any ASCII text through unchanged.
    quoted = '"' + raw.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if key == "env" or "\x00" in raw:
        quoted = quoted.replace("\x00", "\\0")
    with tempfile.TemporaryDirectory() as d:
        _outcome(Path(d), key, quoted)  # a SpecError from render_sbatch fails the test


def test_codec_names_match_the_registry() -> None:
    from hetrun.kernels.codecs.registry import codec_names

    assert set(codec_names()) == set(v.CODEC_NAMES)


def test_signals_match_what_the_runtime_handles() -> None:
    from hetrun.runtime import preempt

    assert set(preempt._ALLOWED) == set(v.SIGNALS)


@pytest.mark.slurm
@pytest.mark.parametrize(("key", "value"), [("signal", "XCPU"), ("signal", "QUIT"), ("signal", "ALRM"),
                                            ("time", "Unlimited"), ("extra", "['--comment=a&b|(c)!']")])
def test_sbatch_itself_accepts_what_the_spec_accepts(key: str, value: str, slurm_cluster, shared_tmp: Path) -> None:  # type: ignore[no-untyped-def]
    """Slurm's own `sbatch --test-only` is the judge of the values that once disagreed."""
    from hetrun.slurm_plugin.backends.sbatch import SbatchBackend

    fields = dict(DEFAULTS, **{key: value}, partition="debug")
    job = shared_tmp / "job.yaml"
    job.write_text(BASE.format(**fields))
    spec = load_spec(job)
    script = shared_tmp / "hetjob.sbatch"
    script.write_text(render_sbatch(build_plan(spec), spec, shared_tmp / "run", python="/usr/bin/python3"))
    verdict = SbatchBackend().test_only(script)
    assert "to start at" in verdict, verdict
