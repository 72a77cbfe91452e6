"""Jobs whose ranks run a small shell script instead of ``hetrun.runtime``.

Several Slurm and local-backend tests check what the batch script and the
supervisor do (signals, exit 85 -> requeue, inert payloads) without paying for
torch start-ups; they share the two-component PPO-shaped job built here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hetrun.dag.spec import JobSpec, spec_from_dict


def fake_runtime(directory: Path, filename: str, script: str) -> Path:
    """Write ``script`` as an executable to stand in for the ranks' Python."""
    path = directory / filename
    path.write_text(script)
    path.chmod(0o755)
    return path


def two_component_spec(name: str, *, mem: str = "500M", rollout_nodes: int = 1,
                       **sections: Any) -> JobSpec:
    """A learner + rollout RL job of one iteration; ``sections`` adds or replaces top-level keys."""
    return spec_from_dict({
        "name": name, "workload": "hetrun.examples.ppo:PPOWorkload",
        "components": {
            "learner": {"nodes": 1, "tasks_per_node": 1, "mem": mem,
                        "actions": ["forward", "backward", "optimize", "sync"]},
            "rollout": {"nodes": rollout_nodes, "tasks_per_node": 1, "mem": mem,
                        "actions": ["rollout"]},
        },
        "training": {"kind": "rl", "iterations": 1},
        **sections,
    })
