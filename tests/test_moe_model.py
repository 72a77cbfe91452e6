"""The MoE LM in one process: routing, aux loss, data, config errors, checkpoints, evaluator role."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import pytest
import torch
from hetrun.examples.moe_data import ByteCorpus, stdlib_files
from hetrun.examples.moe_lm import MoELMWorkload
from hetrun.examples.moe_model import (
    MoEConfig,
    MoEFFN,
    MoELM,
    Routing,
    expert_slice,
    hash_groups,
)
from hetrun.runtime.context import RankContext
from hetrun.runtime.plan_view import plan_from_dict

from hetrun.errors import CheckpointError, HetrunError

SMALL = {"corpus_bytes": 300_000, "batch_size": 4, "seq_len": 32}


def _ctx(component: str = "learner", plan=None, seed: int = 0) -> RankContext:
    return RankContext(
        rank=0, world_size=1, component=component, comp_rank=0, comp_size=1, group=None,
        comm=None, device="cpu", seed=seed, run_dir=Path("."), plan=plan,
    )


@pytest.fixture(scope="module")
def corpus() -> ByteCorpus:
    return ByteCorpus.from_stdlib(300_000)


def test_sorted_dispatch_equals_dense_reference() -> None:
    cfg = MoEConfig()
    torch.manual_seed(1)
    sparse = MoEFFN(cfg)  # the dispatch/permute/combine path, one rank
    torch.manual_seed(1)
    dense = MoEFFN(cfg, reference=True)
    x = torch.randn(300, cfg.d_model, requires_grad=True)
    groups = torch.randint(0, cfg.num_groups, (300,))
    y_sparse, aux_s = sparse(x, groups)
    x_ref = x.detach().clone().requires_grad_(True)
    y_dense, aux_d = dense(x_ref, groups)
    torch.testing.assert_close(y_sparse, y_dense, atol=1e-5, rtol=0)
    assert float(aux_s.detach()) == pytest.approx(float(aux_d.detach()))
    (y_sparse**2).sum().backward()
    (y_dense**2).sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad, atol=1e-5, rtol=1e-4)
    for a, b in zip(sparse.parameters(), dense.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=1e-4)


def test_gate_picks_top2_inside_the_hashed_group_only() -> None:
    cfg = MoEConfig()
    layer = MoEFFN(cfg)
    x = torch.randn(500, cfg.d_model)
    groups = torch.randint(0, cfg.num_groups, (500,))
    routing = layer.route(x, groups)
    assert routing.experts.shape == (500, 2)
    assert torch.equal(routing.experts % cfg.num_groups, groups[:, None].expand(-1, 2))
    assert bool((routing.experts[:, 0] != routing.experts[:, 1]).all())
    torch.testing.assert_close(routing.weights.sum(-1), torch.ones(500))
    outside = routing.probs[(torch.arange(cfg.num_experts)[None, :] % cfg.num_groups)
                            != groups[:, None]]
    assert bool((outside == 0).all())


def test_hash_stage_is_deterministic_and_uses_every_group() -> None:
    tokens = torch.randint(0, 256, (8, 64), generator=torch.Generator().manual_seed(0))
    g = hash_groups(tokens, 4)
    assert torch.equal(g, hash_groups(tokens.clone(), 4))
    assert set(g.unique().tolist()) == {0, 1, 2, 3}
    # The same byte at different positions may go elsewhere: position is hashed too.
    same_byte = torch.full((1, 64), ord("e"))
    assert len(hash_groups(same_byte, 4).unique()) > 1


def test_aux_loss_is_one_when_balanced_and_larger_when_not() -> None:
    cfg = MoEConfig(num_groups=1)
    layer = MoEFFN(cfg)
    n, e = 64, cfg.num_experts
    balanced = Routing(
        experts=torch.arange(2 * n).reshape(n, 2) % e,
        weights=torch.full((n, 2), 0.5),
        probs=torch.full((n, e), 1.0 / e),
    )
    assert float(layer.aux_loss(balanced)) == pytest.approx(1.0)
    skewed_probs = torch.zeros(n, e)
    skewed_probs[:, :2] = 0.5
    skewed = Routing(torch.tensor([[0, 1]] * n), torch.full((n, 2), 0.5), skewed_probs)
    assert float(layer.aux_loss(skewed)) == pytest.approx(e / 2)


def test_expert_slices_partition_the_experts() -> None:
    for size in (1, 2, 4, 8, 16):
        slices = [expert_slice(16, r, size) for r in range(size)]
        assert [lo for lo, _ in slices] == list(range(0, 16, 16 // size))
        assert slices[-1][1] == 16
    with pytest.raises(HetrunError, match="cannot be split evenly over 3"):
        expert_slice(16, 0, 3)


def test_corpus_is_stdlib_sorted_deterministic_and_heldout_disjoint(corpus: ByteCorpus) -> None:
    files = stdlib_files()
    root = Path(sysconfig.get_paths()["stdlib"])
    rel = [f.relative_to(root).as_posix() for f in files]
    assert rel == sorted(rel) and len(rel) > 100
    assert not any("site-packages" in r or "dist-packages" in r for r in rel)
    again = ByteCorpus.from_stdlib(300_000)
    assert torch.equal(corpus.train, again.train) and torch.equal(corpus.heldout, again.heldout)
    a = corpus.sample(4, 32, seed=0, iteration=5, micro=1, rank=2)
    assert a.shape == (4, 33) and a.dtype == torch.int64
    assert torch.equal(a, corpus.sample(4, 32, seed=0, iteration=5, micro=1, rank=2))
    assert not torch.equal(a, corpus.sample(4, 32, seed=0, iteration=5, micro=1, rank=3))
    # Held-out text is whole files kept out of training: a long held-out window
    # is not found in the training bytes.
    probe = bytes(corpus.heldout[1000:1064].tolist())
    assert probe not in bytes(corpus.train.tolist())
    assert torch.equal(corpus.heldout_windows(64, 32), again.heldout_windows(64, 32))


def test_bad_workload_args_are_clear_errors() -> None:
    with pytest.raises(HetrunError, match=r"workload_args\.experts: unknown key 'experts'") as err:
        MoELMWorkload(_ctx(), experts=16, **SMALL)
    assert "num_experts" in str(err.value)
    with pytest.raises(HetrunError, match="n_heads=5"):
        MoELMWorkload(_ctx(), n_heads=5, **SMALL)
    with pytest.raises(HetrunError, match="top_k=5"):
        MoELMWorkload(_ctx(), top_k=5, **SMALL)
    with pytest.raises(HetrunError, match="batch_size: input should be greater than or equal to 1"):
        MoELMWorkload(_ctx(), **{**SMALL, "batch_size": 0})
    with pytest.raises(HetrunError, match="more than seq_len=8"):
        MoELM(MoEConfig(seq_len=8))(torch.zeros(1, 20, dtype=torch.long))


def _train(work: MoELMWorkload, iterations: range) -> list[float]:
    losses = []
    for it in iterations:
        loss = work.forward(work.next_batch(it, 0), 0, 1)
        work.backward(loss)
        losses.append(work.optimize()["loss"])
    return losses


def _json_leaves_ok(value: object) -> bool:
    if isinstance(value, dict):
        return all(isinstance(k, str) and _json_leaves_ok(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_json_leaves_ok(v) for v in value)
    if isinstance(value, torch.Tensor):
        return True
    json.dumps(value)
    return True


def test_checkpoint_round_trip_resumes_bit_for_bit() -> None:
    torch.set_num_threads(1)
    first = MoELMWorkload(_ctx(), **SMALL)
    _train(first, range(3))
    state = first.state_dict()
    assert _json_leaves_ok(state)  # tensors and JSON values only: storable without pickle
    second = MoELMWorkload(_ctx(), **SMALL)
    second.load_state_dict(state)
    assert _train(first, range(3, 6)) == _train(second, range(3, 6))
    for a, b in zip(first.model.parameters(), second.model.parameters(), strict=True):
        assert torch.equal(a, b)

    other = MoELMWorkload(_ctx(), **{**SMALL, "d_model": 32})
    with pytest.raises(CheckpointError, match="model config"):
        other.load_state_dict(state)
    bad = dict(state, expert_range=[0, 8])
    with pytest.raises(CheckpointError, match="owns experts"):
        second.load_state_dict(bad)


def test_evaluator_component_evaluates_the_published_model() -> None:
    plan = plan_from_dict(
        {
            "version": 1, "name": "moe", "workload": "hetrun.examples.moe_lm:MoELMWorkload",
            "components": [
                {"name": "learner", "index": 0, "ntasks": 1, "actions": ["forward", "optimize"]},
                {"name": "evaluator", "index": 1, "ntasks": 1, "actions": ["eval"]},
            ],
            "actions": [
                {"id": "forward", "type": "forward", "component": "learner"},
                {"id": "optimize", "type": "optimize", "component": "learner",
                 "deps": [{"id": "forward", "lag": 0}]},
                {"id": "eval", "type": "eval", "component": "evaluator",
                 "deps": [{"id": "optimize", "lag": 0}]},
            ],
            "order": ["forward", "optimize", "eval"],
        }
    )
    learner = MoELMWorkload(_ctx("learner", plan), **SMALL)
    evaluator = MoELMWorkload(_ctx("evaluator", plan, seed=5), **SMALL)
    assert learner.expert_parallel and not evaluator.expert_parallel
    _train(learner, range(4))
    assert evaluator.evaluate() != learner.evaluate()  # different seed, different weights
    evaluator.load_policy(learner.policy_state(), version=4)
    assert evaluator.evaluate() == learner.evaluate()
    assert evaluator.step == 4


def test_state_through_hetruns_checkpoint_store_resumes_exactly(tmp_path: Path) -> None:
    """The real store (no pickle) keeps model, AdamW state, step and expert slice."""
    from hetrun.runtime.ckpt import open_store, tiers_for
    from hetrun.runtime.ckpt.writer import CheckpointWriter

    torch.set_num_threads(1)
    first = MoELMWorkload(_ctx(), **SMALL)
    _train(first, range(3))
    writer = CheckpointWriter(tiers_for(tmp_path / "ckpt"), keep=2)
    writer.save(3, {"learner": first.state_dict()})
    writer.wait()
    writer.close()
    expect = _train(first, range(3, 5))

    tree, _, _ = open_store(tmp_path / "ckpt").load_rank(3, 0)
    second = MoELMWorkload(_ctx(), **SMALL)
    second.load_state_dict(tree["learner"])
    assert _train(second, range(3, 5)) == expect
    assert second.step == first.step == 5


def test_fused_combine_from_kernels_matches_the_plain_path() -> None:
    cfg = MoEConfig()
    torch.manual_seed(3)
    plain = MoEFFN(cfg)
    torch.manual_seed(3)
    fused = MoEFFN(cfg, fused=True)
    x = torch.randn(200, cfg.d_model, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    groups = torch.randint(0, cfg.num_groups, (200,))
    y_plain, _ = plain(x, groups)
    y_fused, _ = fused(x2, groups)
    torch.testing.assert_close(y_fused, y_plain, atol=1e-6, rtol=0)
    (y_plain**2).sum().backward()
    (y_fused**2).sum().backward()
    torch.testing.assert_close(x2.grad, x.grad, atol=1e-6, rtol=1e-4)
    for a, b in zip(fused.parameters(), plain.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=1e-4)


def test_auto_transport_nccl_on_gpu_gloo_when_oversubscribed_else_mpi() -> None:
    import dataclasses
    import os

    from hetrun.examples.moe_lm import _auto_transport

    cores = len(os.sched_getaffinity(0))
    base = _ctx()
    assert _auto_transport(base) == "mpi"  # no torch.distributed group: MPI
    group = object()  # only its presence matters to the choice
    gpu = dataclasses.replace(base, group=group, device="cuda:0")
    assert _auto_transport(gpu) == "torch"
    spare = dataclasses.replace(base, group=group, comp_size=cores)
    assert _auto_transport(spare) == "mpi"
    crowded = dataclasses.replace(base, group=group, comp_size=cores + 1)
    assert _auto_transport(crowded) == "torch"


def _train_curve(fused: bool, corpus: ByteCorpus, steps: int) -> list[float]:
    cfg = MoEConfig(seq_len=32)
    torch.manual_seed(11)
    model = MoELM(cfg, fused=fused)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    curve = []
    for it in range(steps):
        window = corpus.sample(8, cfg.seq_len, seed=5, iteration=it, micro=0, rank=0)
        ce, aux = model(window)
        opt.zero_grad()
        (ce + cfg.aux_loss_coef * aux).backward()
        opt.step()
        curve.append(ce.item())
    return curve


def test_training_curve_with_fused_ops_matches_the_unfused_one(corpus: ByteCorpus) -> None:
    # fused: true swaps in the fused LayerNorm+Linear (attention input, LM head)
    # and the fused gate/combine; the curve must track the eager model's.
    plain = _train_curve(False, corpus, 25)
    fused = _train_curve(True, corpus, 25)
    assert plain[-1] < plain[0] - 0.5  # it learns, so the comparison means something
    for a, b in zip(plain, fused, strict=True):
        assert abs(a - b) <= 2e-3 * abs(a), (plain, fused)
