"""The learner's precision (examples/learner_precision.py): ``auto`` follows the CPU's bf16
flags, bf16-mixed computes the Atari learner's passes under autocast with fp32 weights and
gradients close to fp32's, and a rollout rank's behaviour log-probabilities stay fp32."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hetrun.examples import learner_precision
from hetrun.examples.atari_ppo import AtariPPOWorkload
from hetrun.runtime.context import RankContext

from hetrun.errors import SpecError

SMALL = {"env_id": "ALE/Breakout-v5", "num_envs": 2, "num_steps": 16, "impala_width": 4, "hidden": 32,
         "num_minibatches": 2, "update_epochs": 1, "eval_episodes": 2, "eval_max_steps": 50}


def ctx(rank: int, component: str) -> RankContext:
    return RankContext(rank=rank, world_size=2, component=component, comp_rank=0, comp_size=1,
                       group=None, comm=None, device="cpu", seed=3, run_dir=Path("."), mode="inprocess")


@pytest.mark.parametrize(("flags", "native"), [("fpu avx512f avx512_bf16 avx512_vnni", True),
                                               ("fpu amx_bf16 amx_tile", True),
                                               ("fpu avx2 avx512f avx512bw", False)])
def test_native_bf16_is_read_from_the_cpus_flags(tmp_path: Path, flags: str, native: bool) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text(f"processor\t: 0\nmodel name\t: x\nflags\t\t: {flags}\n\nprocessor\t: 1\n")
    assert learner_precision.cpu_has_native_bf16(str(info)) is native


def test_auto_is_bf16_mixed_only_where_bf16_is_native(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = torch.device("cpu")
    assert learner_precision.resolve("32", cpu) == "32"
    assert learner_precision.resolve("bf16-mixed", cpu) == "bf16-mixed"
    monkeypatch.setattr(learner_precision, "cpu_has_native_bf16", lambda: False)
    assert learner_precision.resolve("auto", cpu) == "32"
    monkeypatch.setattr(learner_precision, "cpu_has_native_bf16", lambda: True)
    assert learner_precision.resolve("auto", cpu) == "bf16-mixed"
    assert learner_precision.resolve("auto", torch.device("cuda")) == "bf16-mixed"


def test_a_misspelt_precision_is_refused_naming_the_key() -> None:
    with pytest.raises(SpecError) as err:
        AtariPPOWorkload(ctx(0, "learner"), **{**SMALL, "precision": "bf16"})
    assert "precision" in str(err.value)


def _gradient(precision: str) -> tuple[list[torch.Tensor], list[torch.Tensor], dict[str, torch.Tensor]]:
    args = {**SMALL, "precision": precision}
    learner, roller = AtariPPOWorkload(ctx(0, "learner"), **args), AtariPPOWorkload(ctx(1, "rollout"), **args)
    roller.load_policy(learner.policy_state(), 0)
    batch = roller.rollout(0)
    for micro in range(2):
        learner.backward(learner.forward(batch, micro, 2))
    params = learner.parameters_to_sync()
    return [p.detach() for p in params], [p.grad.detach().clone() for p in params], batch  # type: ignore[union-attr]


def test_bf16_mixed_keeps_fp32_weights_and_a_gradient_close_to_fp32s() -> None:
    _, g32, b32 = _gradient("32")
    pbf, gbf, bbf = _gradient("bf16-mixed")
    # The same rollout either way: its policy runs in fp32 whatever the learner's precision.
    assert torch.equal(b32["logprobs"], bbf["logprobs"]) and torch.equal(b32["obs"], bbf["obs"])
    assert all(p.dtype == torch.float32 for p in pbf) and all(g.dtype == torch.float32 for g in gbf)
    flat32, flatbf = torch.cat([g.reshape(-1) for g in g32]), torch.cat([g.reshape(-1) for g in gbf])
    assert not torch.equal(flat32, flatbf)  # bf16 did compute something
    cos = torch.nn.functional.cosine_similarity(flat32, flatbf, dim=0)
    rel = (flat32 - flatbf).norm() / flat32.norm()
    assert cos > 0.98 and rel < 0.25, (float(cos), float(rel))  # measured: 0.994 and 0.15
