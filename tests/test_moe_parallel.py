"""The MoE LM expert-parallel on real Open MPI ranks, against a one-rank reference.

pytest starts ``mpirun`` on this file; run as a script it is the rank body
(``python tests/test_moe_parallel.py equivalence|train OUT_DIR``). Each rank
writes what it found as JSON into OUT_DIR, and the pytest side checks it.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
from pathlib import Path

import pytest
from hetrun.runtime.mpi_launch import init_loopback_gloo
from mpi_helpers import needs_mpirun, run_ranks

SMALL = {"corpus_bytes": 400_000, "batch_size": 8, "seq_len": 32}


def _context(comm, seed: int = 0):
    from hetrun.runtime.context import RankContext

    return RankContext(
        rank=comm.Get_rank(), world_size=comm.Get_size(), component="learner",
        comp_rank=comm.Get_rank(), comp_size=comm.Get_size(), group=None, comm=comm,
        device="cpu", seed=seed, run_dir=Path("."), comms={"forward_codec": "none"},
    )


def _sync(workload, comm) -> None:
    """What the runtime's ``sync`` does: average the replicated gradients over the component."""
    import torch
    from mpi4py import MPI

    for p in workload.parameters_to_sync():
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        buf = p.grad.detach().numpy()
        comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
        p.grad.div_(comm.Get_size())


def _maxabs(t) -> float:
    return float(t.detach().abs().max()) if t.numel() else 0.0


def _equivalence(out_dir: Path) -> dict[str, object]:
    import torch
    from hetrun.examples.moe_lm import MoELMWorkload
    from hetrun.examples.moe_model import MoELM
    from mpi4py import MPI

    torch.set_num_threads(1)
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    ctx = _context(comm)
    transport = os.environ.get("MOE_TEST_TRANSPORT", "mpi")
    if transport == "torch":
        init_loopback_gloo(comm)
    work = MoELMWorkload(ctx, transport=transport, **SMALL)
    assert work.transport == transport and work.comm is not None
    cfg = work.cfg
    torch.manual_seed(ctx.seed)
    ref = MoELM(cfg, reference=True)
    lo, hi = work.expert_range

    def ref_param(name: str) -> torch.Tensor:
        return dict(ref.named_parameters())[name]

    # Same weights: replicated ones equal, experts equal to the reference's slice.
    expert_names = {n for n, p in work.model.named_parameters()
                    if any(p is q for q in work.model.expert_parameters())}
    weight_err = 0.0
    for name, p in work.model.named_parameters():
        want = ref_param(name)[lo:hi] if name in expert_names else ref_param(name)
        weight_err = max(weight_err, float((p.detach() - want.detach()).abs().max()))

    # One MoE layer on its own, on random activations: y and aux.
    gen = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(57 + 13 * rank, cfg.d_model, generator=gen)
    groups = torch.randint(0, cfg.num_groups, (x.shape[0],), generator=gen)
    y_ep, aux_ep = work.model.moe_layers()[0](x, groups)
    y_ref, aux_ref = ref.moe_layers()[0](x, groups)
    layer_err = _maxabs(y_ep - y_ref)
    layer_scale = _maxabs(y_ref)
    # The last rank has no tokens at all: it sends nothing and still serves its experts.
    n_empty = 0 if rank == size - 1 else 20
    x0 = torch.randn(n_empty, cfg.d_model, generator=gen, requires_grad=True)
    g0 = torch.randint(0, cfg.num_groups, (n_empty,), generator=gen)
    y0_ep, _ = work.model.moe_layers()[1](x0, g0)
    y0_ep.sum().backward()
    x0_ref = x0.detach().clone().requires_grad_(True)
    y0_ref, _ = ref.moe_layers()[1](x0_ref, g0)
    y0_ref.sum().backward()
    empty_err = max(_maxabs(y0_ep - y0_ref), _maxabs(x0.grad - x0_ref.grad))
    work.model.zero_grad()
    ref.zero_grad()

    # The whole model: losses and gradients, every rank on its own batch.
    batches = [
        work.corpus.sample(work.batch_size, cfg.seq_len, seed=0, iteration=3, micro=0, rank=r)
        for r in range(size)
    ]
    mine = work.next_batch(3, 0)["tokens"]
    same_batch = bool(torch.equal(mine, batches[rank]))
    loss = work.forward({"tokens": mine}, 0, 1)
    work.backward(loss)

    ref.zero_grad()
    ce, aux = ref(batches[rank])
    ref_loss = ce + cfg.aux_loss_coef * aux
    ref_loss.backward()
    replicated_err = 0.0
    replicated_scale = 0.0
    for name, p in work.model.named_parameters():
        if name not in expert_names:
            g_ref = ref_param(name).grad
            replicated_err = max(replicated_err, float((p.grad - g_ref).abs().max()))
            replicated_scale = max(replicated_scale, float(g_ref.abs().max()))
    # Expert gradients collect every rank's loss: add the other ranks' backward passes.
    for r in range(size):
        if r != rank:
            ce_r, aux_r = ref(batches[r])
            (ce_r + cfg.aux_loss_coef * aux_r).backward()
    expert_err = 0.0
    expert_scale = 0.0
    for name in expert_names:
        g_ref = ref_param(name).grad[lo:hi]
        g_ep = dict(work.model.named_parameters())[name].grad
        expert_err = max(expert_err, float((g_ep - g_ref).abs().max()))
        expert_scale = max(expert_scale, float(g_ref.abs().max()))
    return {
        "rank": rank, "size": size, "weight_err": weight_err, "layer_err": layer_err,
        "layer_scale": layer_scale, "aux_err": abs(float(aux_ep.detach() - aux_ref.detach())),
        "loss": float(loss), "loss_err": abs(float(loss) - float(ref_loss)),
        "replicated_grad_err": replicated_err, "replicated_grad_scale": replicated_scale,
        "empty_rank_err": empty_err, "expert_grad_err": expert_err,
        "expert_grad_scale": expert_scale, "same_batch": same_batch,
        "a2a_calls": work.comm.stats["calls"] if work.comm else 0,
    }


def _train(out_dir: Path, steps: int = 60) -> dict[str, object]:
    import torch
    from hetrun.examples.moe_lm import MoELMWorkload
    from mpi4py import MPI

    torch.set_num_threads(1)
    comm = MPI.COMM_WORLD
    work = MoELMWorkload(_context(comm), **SMALL)
    eval_before = work.evaluate()["eval_loss"]
    losses = []
    for it in range(steps):
        for micro in range(2):
            loss = work.forward(work.next_batch(it, micro), micro, 2)
            work.backward(loss)
        _sync(work, comm)
        losses.append(work.optimize()["loss"])
    eval_after = work.evaluate()["eval_loss"]
    # Replicated weights must still agree bit for bit across ranks.
    flat = torch.cat([p.detach().reshape(-1) for p in work.parameters_to_sync()])
    spread = comm.allreduce(float(flat.sum()), op=MPI.MAX) - comm.allreduce(
        float(flat.sum()), op=MPI.MIN
    )
    return {
        "rank": comm.Get_rank(), "losses": losses, "eval_before": eval_before,
        "eval_after": eval_after, "replicated_spread": spread,
    }


def _publish(out_dir: Path) -> dict[str, object]:
    """Learners publish the whole model to an evaluator component (executor's protocol)."""
    import torch
    from hetrun.examples.moe_lm import MoELMWorkload
    from hetrun.runtime.plan_view import plan_from_dict
    from mpi4py import MPI

    from hetrun.errors import HetrunError

    torch.set_num_threads(1)
    comm = MPI.COMM_WORLD
    size = comm.Get_size()
    plan = plan_from_dict({
        "version": 1, "name": "moe", "workload": "hetrun.examples.moe_lm:MoELMWorkload",
        "components": [
            {"name": "learner", "index": 0, "ntasks": size,
             "actions": ["forward", "backward", "sync", "optimize"]},
            {"name": "evaluator", "index": 1, "ntasks": 1, "actions": ["eval"]},
        ],
        "actions": [
            {"id": "forward", "type": "forward", "component": "learner"},
            {"id": "optimize", "type": "optimize", "component": "learner",
             "deps": [{"id": "forward", "lag": 0}]},
            {"id": "sync.policy", "type": "sync", "component": "learner", "every": 2,
             "deps": [{"id": "optimize", "lag": 0}]},
            {"id": "eval", "type": "eval", "component": "evaluator", "every": 2,
             "deps": [{"id": "sync.policy", "lag": 0}]},
        ],
        "order": ["forward", "optimize", "sync.policy", "eval"],
    })
    ctx = _context(comm)
    ctx.plan = plan
    work = MoELMWorkload(ctx, **SMALL)
    # The evaluator is built here on every rank only to check the leader's state.
    judge = MoELMWorkload(
        type(ctx)(**{**ctx.__dict__, "component": "evaluator", "comp_size": 1, "comp_rank": 0,
                     "comm": MPI.COMM_SELF}), **SMALL)
    leader = comm.Get_rank() == 0
    checks: list[bool] = []
    refused: list[int] = []

    def check_published() -> None:
        ep_eval = work.evaluate()["eval_loss"]  # collective
        if leader:
            judge.load_policy(work.policy_state(), version=work.step)
            checks.append(abs(judge.evaluate()["eval_loss"] - ep_eval) <= 1e-5)

    check_published()  # initial weights, rebuilt from the seed on the leader
    for it in range(4):
        ctx.iteration = it
        loss = work.forward(work.next_batch(it, 0), 0, 1)
        work.backward(loss)
        _sync(work, comm)
        work.optimize()
        if plan.action("sync.policy").runs_at(it):
            check_published()
        elif leader:
            try:
                work.policy_state()
            except HetrunError:
                refused.append(it)
    return {"rank": comm.Get_rank(), "checks": checks, "refused": refused}


def mpirun(np_: int, mode: str, out_dir: Path, timeout: float = 240,
           transport: str = "mpi") -> list[dict]:
    proc = run_ranks(np_, str(Path(__file__).resolve()), mode, str(out_dir), timeout=timeout,
                     env={"MOE_TEST_TRANSPORT": transport})
    results = [json.loads(p.read_text()) for p in sorted(out_dir.glob("rank-*.json"))]
    assert len(results) == np_, proc.stdout + proc.stderr
    return results


@pytest.mark.mpi
@needs_mpirun
@pytest.mark.parametrize(("np_", "transport"), [(2, "mpi"), (4, "mpi"), (2, "torch")])
def test_expert_parallel_equals_single_rank_reference(
    np_: int, transport: str, tmp_path: Path
) -> None:
    for res in mpirun(np_, "equivalence", tmp_path, transport=transport):
        assert res["same_batch"]
        assert res["a2a_calls"] > 0  # the exchange really ran
        assert res["weight_err"] == 0.0
        assert res["layer_err"] <= 1e-5 * max(1.0, res["layer_scale"]), res
        assert res["aux_err"] <= 1e-5, res
        assert res["loss_err"] <= 1e-5, res
        assert res["empty_rank_err"] <= 1e-5, res
        # Gradients: within 1e-5 of the largest gradient entry (they are ~1e-2 here).
        assert res["replicated_grad_err"] <= 1e-5 * res["replicated_grad_scale"], res
        assert res["expert_grad_err"] <= 1e-5 * res["expert_grad_scale"], res
        assert res["expert_grad_scale"] > 0


@pytest.mark.mpi
@needs_mpirun
def test_loss_falls_steadily_expert_parallel(tmp_path: Path) -> None:
    results = mpirun(2, "train", tmp_path)
    for res in results:
        losses = res["losses"]
        chunks = [sum(losses[i : i + 15]) / 15 for i in range(0, 60, 15)]
        # Each quarter of the run ends lower on average than the one before.
        assert all(b < a for a, b in itertools.pairwise(chunks)), chunks
        assert chunks[-1] < chunks[0] - 1.0, chunks
        assert res["eval_after"] < res["eval_before"] - 1.0, res
        assert res["replicated_spread"] == 0.0
    assert results[0]["eval_after"] == results[1]["eval_after"]


@pytest.mark.mpi
@needs_mpirun
def test_learners_publish_the_whole_model_to_an_evaluator(tmp_path: Path) -> None:
    leader = mpirun(4, "publish", tmp_path)[0]
    assert leader["checks"] == [True, True, True]  # initial, after iterations 1 and 3
    assert leader["refused"] == [0, 2]  # stale whole-model state is never handed out


if __name__ == "__main__":
    mode, out = sys.argv[1], Path(sys.argv[2])
    result = {"equivalence": _equivalence, "train": _train, "publish": _publish}[mode](out)
    (out / f"rank-{result['rank']}.json").write_text(json.dumps(result))
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()  # a live gloo group at exit aborts the process
