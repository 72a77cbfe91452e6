"""A tiny real workload and plan for the runtime tests (imported by ranks from the run dir).

Linear regression as "RL": rollout ranks sample (x, y = x @ w_true + noise)
and report the loss of the policy weights they currently hold; the learner
fits w by SGD. The loss must fall, both on the learner and as seen by the
rollout ranks (which proves weights flow back).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from hetrun.runtime.mpi_launch import loopback_mpi_env
from hetrun.runtime.workload import Workload

DIM = 8


def _w_true() -> torch.Tensor:
    g = torch.Generator().manual_seed(1234)
    return torch.randn(DIM, 1, generator=g)


class ToyRegression(Workload):
    def __init__(self, ctx: Any, batch: int = 64, lr: float = 0.1, fail_at: int = -1,
                 fail_component: str = "", sleep: float = 0.0) -> None:
        super().__init__(ctx)
        torch.manual_seed(ctx.seed)
        self.w = torch.zeros(DIM, 1, requires_grad=True)
        self.opt = torch.optim.SGD([self.w], lr=lr)
        self.gen = torch.Generator().manual_seed(ctx.rank_seed)
        self.batch = batch
        self.fail_at = fail_at
        self.fail_component = fail_component
        self.sleep = sleep
        self.version = -1
        self.w_true = _w_true()

    def _sample(self, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(n, DIM, generator=gen)
        return x, x @ self.w_true + 0.01 * torch.randn(n, 1, generator=gen)

    def _maybe_fail(self) -> None:
        if self.ctx.iteration == self.fail_at and self.ctx.component == self.fail_component \
                and self.ctx.comp_rank == 0:
            raise ValueError(f"toy failure injected at iteration {self.fail_at}")

    def rollout(self, policy_version: int) -> dict[str, torch.Tensor]:
        self._maybe_fail()
        if self.sleep:
            import time
            time.sleep(self.sleep)
        x, y = self._sample(self.batch, self.gen)
        with torch.no_grad():
            seen = torch.mean((x @ self.w - y) ** 2)
        return {"x": x, "y": y, "seen_loss": seen, "version": torch.tensor(policy_version)}

    def policy_state(self) -> dict[str, torch.Tensor]:
        return {"w": self.w.detach().clone()}

    def load_policy(self, state: dict[str, torch.Tensor], version: int) -> None:
        with torch.no_grad():
            self.w.copy_(state["w"])
        self.version = version

    def next_batch(self, iteration: int, micro: int) -> dict[str, torch.Tensor]:
        x, y = self._sample(self.batch, self.gen)
        return {"x": x, "y": y}

    def forward(self, batch: dict[str, torch.Tensor], micro: int, num_micro: int) -> torch.Tensor:
        self._maybe_fail()
        x = batch["x"].chunk(num_micro)[micro]
        y = batch["y"].chunk(num_micro)[micro]
        return torch.mean((x @ self.w - y) ** 2) / num_micro

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def parameters_to_sync(self) -> list[torch.Tensor]:
        return [self.w]

    def optimize(self) -> dict[str, float]:
        self.opt.step()
        self.opt.zero_grad()
        return {"w0": float(self.w.detach()[0, 0])}

    def evaluate(self) -> dict[str, float]:
        x, y = self._sample(256, torch.Generator().manual_seed(99))
        with torch.no_grad():
            return {"loss": float(torch.mean((x @ self.w - y) ** 2))}

    def state_dict(self) -> dict[str, Any]:
        return {"w": self.w.detach().clone(), "version": self.version}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with torch.no_grad():
            self.w.copy_(state["w"])


def toy_job_yaml(iterations: int = 12, pipeline_window: int = 2, tolerance: int = 1,
                 learners: int = 2, rollouts: int = 2, micro: int = 2, mode: str = "pipelined",
                 workload_args: dict[str, Any] | None = None, env: dict[str, str] | None = None,
                 eval_interval: int = 3, learner_nodes: int = 1, rollout_nodes: int = 1) -> str:
    """A job YAML for the toy workload (planned by the real planner)."""
    doc = {
        "name": "toy",
        "workload": "runtime_toy:ToyRegression",
        "workload_args": workload_args or {},
        "components": {
            "learner": {"nodes": learner_nodes, "tasks_per_node": learners // learner_nodes,
                        "cpus_per_task": 1, "mem": "1G",
                        "actions": ["forward", "backward", "sync", "optimize", "eval"]},
            "rollout": {"nodes": rollout_nodes, "tasks_per_node": rollouts // rollout_nodes,
                        "cpus_per_task": 1, "mem": "1G", "actions": ["rollout"]},
        },
        "training": {"kind": "rl", "iterations": iterations, "micro_batches": micro,
                     "pipeline_window": pipeline_window, "seed": 0,
                     "eval_interval": eval_interval, "mode": mode},
        "actions": {"rollout": {"tolerance_window": tolerance}},
        "checkpoint": {"interval": 0},
        "env": env or {"OMP_NUM_THREADS": "1"},
    }
    return json.dumps(doc)  # JSON is YAML


def toy_plan(**kwargs: Any) -> dict[str, Any]:
    """plan.json (as a dict) of the toy job, from hetrun.dag's planner."""
    import tempfile

    from hetrun.dag.plan import build_plan
    from hetrun.dag.spec import load_spec

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "toy.yaml"
        path.write_text(toy_job_yaml(**kwargs))
        plan = build_plan(load_spec(path))
    return json.loads(plan.to_json())


def write_run_dir(run_dir: Path, plan: dict[str, Any]) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "plan.json").write_text(json.dumps(plan, indent=1))
    src = Path(__file__).read_text()
    (run_dir / "runtime_toy.py").write_text(src)
    return run_dir


def mpirun_cmd(run_dir: Path, plan: dict[str, Any]) -> list[str]:
    """One mpirun app context per component, as the local backend does."""
    import sys

    cmd = ["mpirun", "--oversubscribe"]
    for i, comp in enumerate(plan["components"]):
        if i:
            cmd.append(":")
        cmd += ["-np", str(comp["ntasks"]), "-x", f"HETRUN_COMPONENT={comp['name']}",
                sys.executable, "-m", "hetrun.runtime", str(run_dir)]
    return cmd


def mpi_env() -> dict[str, str]:
    return loopback_mpi_env(OMPI_MCA_rmaps_base_oversubscribe="1")
