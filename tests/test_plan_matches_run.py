"""What `hetrun plan --unroll` shows is what the runtime runs.

A real small PPO job (gymnasium CartPole, in-process runtime) against the
real `hetrun plan --unroll` output: per component and iteration the same
actions in the same order, and every rollout uses the policy version the
plan's lagged edge names (the pipeline_window cap and the coarse mode
included, which only the runtime applied before).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from hetrun.cli.app import main
from hetrun.dag.plan import build_plan
from hetrun.dag.spec import load_spec
from hetrun.runtime.events import read_events
from hetrun.runtime.inprocess import run_inprocess

ROOT = Path(__file__).resolve().parent.parent
ITERATIONS = 5
ROW = re.compile(r"^\s*\d+\s+i(\d+)/(\S+)\s+<- (.*)$")

pytestmark = pytest.mark.usefixtures("clean_resume_hooks")


def _job(tmp_path: Path, training: dict[str, object], tolerance: int) -> Path:
    spec = yaml.safe_load((ROOT / "examples" / "ppo_cartpole.yaml").read_text())
    spec["workload_args"].update(num_envs=4, num_steps=16)
    spec["training"].update(iterations=ITERATIONS, eval_interval=2, **training)
    spec["actions"]["rollout"]["tolerance_window"] = tolerance
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _unrolled(job: Path, capsys: pytest.CaptureFixture[str]) -> list[tuple[int, str, list[str]]]:
    """(iteration, action id, its predecessors) in the order `hetrun plan --unroll` prints."""
    try:
        main(["plan", str(job), "--unroll", str(ITERATIONS), "--capacity", "spec"])
    except SystemExit as exc:
        assert not exc.code, capsys.readouterr().err
    rows = []
    for line in capsys.readouterr().out.splitlines():
        m = ROW.match(line)
        if m:
            deps = [] if m.group(3).strip() == "-" else [d.strip() for d in m.group(3).split(",")]
            rows.append((int(m.group(1)), m.group(2), deps))
    return rows


def _run(job: Path, run_dir: Path) -> list[dict[str, object]]:
    run_dir.mkdir()
    (run_dir / "plan.json").write_text(build_plan(load_spec(job)).to_json())
    res = run_inprocess(run_dir)
    assert res.exit_code == 0 and res.iterations_done == ITERATIONS
    return [e for e in read_events(run_dir) if e["ev"] == "action"]


@pytest.mark.parametrize(("training", "tolerance", "lag"), [
    ({"pipeline_window": 2}, 1, 2),  # tolerance 1: rollout i uses the policy of i - 2
    ({"pipeline_window": 1}, 3, 2),  # tolerance 3 capped by the window: lag 1 + 1
    ({"mode": "coarse"}, 1, 1),  # the synchronous loop: the policy of i - 1
], ids=["pipelined", "window-capped", "coarse"])
def test_unrolled_plan_is_the_order_and_versions_the_run_has(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        training: dict[str, object], tolerance: int, lag: int) -> None:
    job = _job(tmp_path, training, tolerance)
    plan = json.loads(build_plan(load_spec(job)).to_json())
    component = {a["id"]: a["component"] for a in plan["actions"]}
    rows = _unrolled(job, capsys)
    assert rows, "hetrun plan --unroll printed no rows"
    planned: dict[tuple[str, int], list[str]] = {}
    for it, aid, _ in rows:
        planned.setdefault((component[aid], it), []).append(aid)

    events = _run(job, tmp_path / "run")
    ran: dict[tuple[str, int], list[str]] = {}
    for e in events:
        ran.setdefault((str(e["component"]), int(e["iteration"])), []).append(str(e["id"]))  # type: ignore[call-overload]
    assert ran == planned

    # The rollout's weight edge in the plan names the version the run used.
    used = {int(e["iteration"]): e["policy_version"] for e in events if e["type"] == "rollout"}  # type: ignore[call-overload]
    for it, aid, deps in rows:
        if aid != "rollout":
            continue
        weights = [int(d[1:].split("/")[0]) for d in deps if d.endswith("/sync.policy")]
        assert weights == ([it - lag] if it >= lag else []), (it, deps)
        assert used[it] == (weights[0] + 1 if weights else 0), (it, used)
