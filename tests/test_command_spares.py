"""spare_nodes on a command component (issue 25): what the spec accepts and refuses, and the
step the batch script restarts (no Slurm; the restart itself runs on a real cluster in
tests/test_node_death_command_slurm.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from hetrun.dag.plan import build_plan
from hetrun.dag.spec import spec_from_dict
from hetrun.slurm_plugin.render import render_sbatch

from hetrun.errors import SpecError


def _doc(**components: Any) -> dict[str, Any]:
    return {"name": "cmd-spares", "components": components or {
        "trainer": {"nodes": 2, "spare_nodes": 1, "command": ["python3", "train.py", "--lr", "1e-3"]}},
        "preemption": {"max_failures": 1}, "slurm": {"partition": "debug", "time": "00:10:00"}}


def test_one_command_component_may_hold_spares() -> None:
    assert spec_from_dict(_doc()).components["trainer"].spare_nodes == 1


def test_spares_in_a_job_of_several_steps_are_refused_with_the_key_and_the_fix() -> None:
    doc = _doc(trainer={"command": ["python3", "t.py"], "spare_nodes": 1}, evaler={"command": ["python3", "e.py"]})
    with pytest.raises(SpecError) as err:
        spec_from_dict(doc)
    text = str(err.value)
    assert "components.trainer.spare_nodes" in text and "one command component" in text, text
    assert "fix:" in text and "job of its own" in text, text
    # max_failures 0 is still refused for a command component (the spares would never be used).
    doc = _doc()
    doc["preemption"]["max_failures"] = 0
    with pytest.raises(SpecError, match=r"components\.trainer\.spare_nodes.*max_failures 0"):
        spec_from_dict(doc)


def _script(tmp_path: Path) -> str:
    spec = spec_from_dict(_doc())
    return render_sbatch(build_plan(spec), spec, tmp_path / "run", python="/py", hetrun_python="/hpy")


def test_the_command_step_runs_on_the_live_node_list_and_overlaps_after_a_restart(tmp_path: Path) -> None:
    script = _script(tmp_path)
    assert "#SBATCH --nodes=3" in script and "#SBATCH --no-kill" in script
    step = next(ln.strip() for ln in script.splitlines() if "hetrun.runtime.command_rank" in ln)
    assert step.startswith('srun --no-kill --nodes=2 --ntasks=2 --nodelist="${_hetrun_nl[0]}" '
                           "${_hetrun_overlap:+--overlap} --mpi=none "), step
    assert step.endswith("-- python3 train.py --lr 1e-3 2>\"$_hetrun_fifo\" &"), step
    # The node monitor and the node_recovery loop are the action path's (one home).
    assert "_hetrun_heartbeats " in script and "hetrun.slurm_plugin.node_recovery failed" in script
    # --overlap only after a restart, and as one word or none (bash, not by eye).
    words = 'for w in "$@"; do printf "<%s>" "$w"; done'
    for value, want in (("", "<a><b>"), ("1", "<a><--overlap><b>")):
        out = subprocess.run(["bash", "-c", f"_hetrun_overlap={value!r}; set -- a ${{_hetrun_overlap:+--overlap}} b; "
                              + words], capture_output=True, text=True, check=True).stdout
        assert out == want, (value, out)
    loop = script[script.index("_hetrun_overlap=''"):]
    assert loop.index("_hetrun_overlap=1") > loop.index("restarting inside the allocation")
