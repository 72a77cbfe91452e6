"""Fuzzing the job spec loader: whatever the input, only SpecError comes out (never a traceback)."""

from __future__ import annotations

import atexit
import contextlib
import copy
import shutil
import tempfile
from pathlib import Path
from typing import Any

import yaml
from hetrun.dag.overrides import Overrides
from hetrun.dag.plan import build_plan
from hetrun.dag.spec import JobSpec, load_spec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hetrun.errors import HetrunError, SpecError

_DIR = Path(tempfile.mkdtemp(prefix="hetrun-spec-fuzz-"))
atexit.register(shutil.rmtree, _DIR, ignore_errors=True)
_SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))

VALID: dict[str, Any] = {
    "name": "fuzz",
    "workload": "pkg.mod:Work",
    "components": {
        "learner": {"nodes": 1, "tasks_per_node": 2, "mem": "2G",
                    "actions": ["forward", "backward", "sync", "optimize", "checkpoint", "eval"]},
        "rollout": {"nodes": 2, "mem": "1G", "actions": ["rollout"]},
    },
    "training": {"kind": "rl", "iterations": 10, "micro_batches": 2, "pipeline_window": 2,
                 "eval_interval": 5},
    "actions": {"rollout": {"tolerance_window": 1, "qos": "normal"}},
    "slurm": {"partition": "debug", "time": "00:30:00", "extra": ["--exclusive"]},
    "checkpoint": {"interval": 5}, "preemption": {"grace_seconds": 60},
    "env": {"OMP_NUM_THREADS": "1"}, "comms": {"forward_codec": "int8"},
}

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=30),
    st.sampled_from(["2G", "00:30:00", "rl", "forward", "gpu:2", "$(id)", "a\nb", "", "-1", "1e400"]),
)
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)), max_leaves=20)


def _write(data: bytes | str) -> Path:
    with tempfile.NamedTemporaryFile(dir=_DIR, suffix=".yaml", delete=False) as fh:
        fh.write(data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data)
        return Path(fh.name)


def _only_spec_errors(path: Path, overrides: Overrides | None = None) -> None:
    try:
        spec = load_spec(path, overrides)
    except SpecError as exc:
        assert exc.exit_code == 2 and str(exc)
        return
    finally:
        path.unlink(missing_ok=True)
    assert isinstance(spec, JobSpec)
    # A spec that validates must also plan, or fail with a hetrun error (no other exception).
    with contextlib.suppress(HetrunError):
        build_plan(spec)


def _key_paths(data: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(data, dict):
        for k, v in data.items():
            out += _key_paths(v, (*prefix, k))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            out += _key_paths(v, (*prefix, i))
    return out


PATHS = [p for p in _key_paths(VALID) if p]


@_SETTINGS
@given(values)
def test_random_yaml_documents(doc: Any) -> None:
    try:
        text = yaml.safe_dump(doc)
    except yaml.YAMLError:
        return
    _only_spec_errors(_write(text))


@_SETTINGS
@given(st.sampled_from(PATHS), values, st.booleans())
def test_valid_spec_with_one_value_replaced(path: tuple[Any, ...], value: Any, as_key: bool) -> None:
    data = copy.deepcopy(VALID)
    node: Any = data
    for part in path[:-1]:
        node = node[part]
    if as_key and isinstance(node, dict) and isinstance(value, str):
        node[value] = node.pop(path[-1])
    else:
        node[path[-1]] = value
    _only_spec_errors(_write(yaml.safe_dump(data)))


@_SETTINGS
@given(st.text(max_size=400))
def test_random_text(text: str) -> None:
    _only_spec_errors(_write(text))


@_SETTINGS
@given(st.binary(max_size=400))
def test_binary_junk_and_non_utf8(data: bytes) -> None:
    _only_spec_errors(_write(data))


@_SETTINGS
@given(st.integers(min_value=1, max_value=3000), st.sampled_from(["[", "{a: ", "- "]))
def test_deep_nesting(depth: int, opener: str) -> None:
    closer = {"[": "]", "{a: ": "}", "- ": ""}[opener]
    if opener == "- ":
        text = "".join("  " * i + "- \n" for i in range(depth)) + "  " * depth + "x\n"
    else:
        text = "workload_args: " + opener * depth + "1" + closer * depth + "\n"
    _only_spec_errors(_write(text))


@_SETTINGS
@given(st.integers(min_value=0, max_value=5000))
def test_huge_numbers(digits: int) -> None:
    data = copy.deepcopy(VALID)
    text = yaml.safe_dump(data).replace("iterations: 10", "iterations: 1" + "0" * digits)
    _only_spec_errors(_write(text))


_opt_text = st.one_of(st.none(), st.text(max_size=20), st.sampled_from(["debug", "a;b", "$(id)", "x\ny"]))


@_SETTINGS
@given(st.lists(st.text(max_size=40), max_size=4), st.lists(st.text(max_size=12), max_size=3),
       st.lists(st.text(max_size=12), max_size=3), _opt_text, _opt_text, _opt_text, _opt_text, _opt_text)
def test_random_overrides(sets: list[str], nodes: list[str], gres: list[str], time: str | None,
                          partition: str | None, account: str | None, qos: str | None,
                          constraint: str | None) -> None:
    ov = Overrides(time=time, partition=partition, account=account, qos=qos, constraint=constraint,
                   nodes=nodes, gres=gres, sets=sets)
    _only_spec_errors(_write(yaml.safe_dump(VALID)), ov)


_EXAMPLE_TEXT = (Path(__file__).resolve().parent.parent / "examples" / "ppo_cartpole.yaml").read_text()


@_SETTINGS
@given(st.lists(st.tuples(st.integers(min_value=0, max_value=10_000), st.sampled_from(["del", "dup", "ins"]),
                          st.text(max_size=8)), min_size=1, max_size=5))
def test_text_mutations_of_an_example(edits: list[tuple[int, str, str]]) -> None:
    """Typos as people make them: lines lost, repeated, characters slipped in."""
    lines = _EXAMPLE_TEXT.splitlines(keepends=True)
    for pos, kind, chars in edits:
        i = pos % len(lines)
        if kind == "del":
            del lines[i]
        elif kind == "dup":
            lines.insert(i, lines[i])
        else:
            col = pos % max(1, len(lines[i]))
            lines[i] = lines[i][:col] + chars + lines[i][col:]
        if not lines:
            break
    _only_spec_errors(_write("".join(lines)))
