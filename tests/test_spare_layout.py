"""dag/spare_layout.py: the warning for a het job whose leader holds one node while another
component has spares (Slurm requeues such a job once it marks the dead node down; the
layout that holds is run for real in tests/test_node_death_slurm.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml
from hetrun.dag.spare_layout import spare_layout_warnings
from hetrun.dag.spec import spec_from_dict

REPO = Path(__file__).resolve().parents[1]


def _doc(learner_spares: int = 0, rollout_spares: int = 1, learner_nodes: int = 1) -> dict:
    doc = yaml.safe_load((REPO / "examples" / "ppo_cartpole.yaml").read_text())
    doc.setdefault("preemption", {})["max_failures"] = 2
    doc["components"]["rollout"]["spare_nodes"] = rollout_spares
    doc["components"]["learner"]["spare_nodes"] = learner_spares
    doc["components"]["learner"]["nodes"] = learner_nodes
    return doc


def test_a_one_node_leader_beside_spares_is_named_with_the_fix() -> None:
    (line,) = spare_layout_warnings(spec_from_dict(_doc()))
    assert line.startswith("components.learner leads the het job with one node")
    assert "rollout" in line and "give components.learner spare_nodes: 1" in line


def test_two_nodes_on_the_leader_or_no_spares_say_nothing() -> None:
    assert spare_layout_warnings(spec_from_dict(_doc(learner_spares=1))) == []
    assert spare_layout_warnings(spec_from_dict(_doc(learner_nodes=2))) == []
    assert spare_layout_warnings(spec_from_dict(_doc(rollout_spares=0))) == []


def test_hetrun_plan_prints_it_on_stderr(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(_doc(), sort_keys=False))
    out = subprocess.run([sys.executable, "-m", "hetrun.cli", "plan", str(job), "--capacity", "spec"],
                         capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert "hetrun: warning: components.learner leads the het job with one node" in out.stderr
    assert "warning" not in out.stdout
