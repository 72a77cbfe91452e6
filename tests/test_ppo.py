"""PPO workload, in process, on real gymnasium environments (fast: a few iterations each)."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import pytest
import torch
from hetrun.examples.ppo import FLAT_KEY, PPOConfig, PPOWorkload
from hetrun.runtime.context import RankContext

from hetrun.errors import CheckpointError, SpecError

SMALL = {"num_envs": 4, "num_steps": 32, "update_epochs": 2, "num_minibatches": 2, "eval_episodes": 3}


def ctx(rank: int, component: str, seed: int = 0, run_dir: Path = Path(".")) -> RankContext:
    return RankContext(rank=rank, world_size=2, component=component, comp_rank=0, comp_size=1,
                       group=None, comm=None, device="cpu", seed=seed, run_dir=run_dir,
                       mode="inprocess")


def pair(seed: int = 0, **args: object) -> tuple[PPOWorkload, PPOWorkload]:
    merged = {**SMALL, **args}
    return PPOWorkload(ctx(0, "learner", seed), **merged), PPOWorkload(ctx(1, "rollout", seed), **merged)


def learn(learner: PPOWorkload, batch: dict[str, torch.Tensor], num_micro: int = 2) -> dict[str, float]:
    """One iteration in the executor's order: forward/backward per micro-batch, then optimize."""
    for micro in range(num_micro):
        loss = learner.forward(batch, micro, num_micro)
        assert loss.dim() == 0 and torch.isfinite(loss)
        learner.backward(loss)
    return learner.optimize()


def test_rollout_is_env_major_with_behaviour_logprobs_and_version() -> None:
    _, roller = pair()
    b = roller.rollout(policy_version=7)
    n, t = SMALL["num_envs"], SMALL["num_steps"]
    assert b["obs"].shape == (n, t, 4) and b["obs"].dtype == torch.float32
    for key in ("actions", "logprobs", "rewards", "dones", "truncated"):
        assert b[key].shape == (n, t), key
    assert b["trunc_obs"].shape == (n, t, 4) and b["last_obs"].shape == (n, 4)
    assert b["policy_version"].tolist() == [7] * n
    assert int(b["env_steps"].sum()) == n * t
    assert set(b["actions"].unique().tolist()) <= {0, 1}
    assert bool((b["logprobs"] <= 0).all()) and bool((b["logprobs"] > -5).all())
    # CartPole pays 1 per step; every finished episode shows up with its return == its length.
    assert bool((b["rewards"] == 1).all())
    assert len(b["episode_returns"]) == int(b["dones"].sum())
    assert torch.equal(b["episode_returns"], b["episode_lengths"].float())
    # Consecutive rollouts continue the same episodes: the next obs is the last one returned.
    b2 = roller.rollout(policy_version=7)
    assert torch.equal(b2["obs"][:, 0], b["last_obs"])


def test_learning_step_is_finite_moves_weights_and_counts_versions() -> None:
    learner, roller = pair()
    before = [p.detach().clone() for p in learner.parameters_to_sync()]
    m = learn(learner, roller.rollout(0))
    after = learner.parameters_to_sync()
    # optimize() leaves the gradients zeroed, in place: views into the flat buffer (flat_params.py)
    assert all(p.grad is not None and not p.grad.any() for p in after)
    # ... and refuses to step past a flat gradient someone set to None (the networks left out)
    assert learner._flat is not None
    learner._flat.param.grad = None
    with pytest.raises(RuntimeError, match="set to None"):
        learn(learner, roller.rollout(learner.version))
    assert any(not torch.equal(a, b) for a, b in zip(after, before, strict=True))
    for key in ("pg_loss", "v_loss", "entropy", "approx_kl", "clipfrac", "staleness"):
        assert key in m and m[key] == m[key], key  # present and not NaN
    assert m["policy_version"] == 1.0 and learner.version == 1
    assert m["env_steps"] == SMALL["num_envs"] * SMALL["num_steps"]
    assert 0.0 < m["entropy"] <= 0.6932  # log(2): two actions
    json.dumps(m)  # metrics go to events.jsonl


def test_policy_sync_and_staleness_is_reported() -> None:
    learner, roller = pair()
    stale = roller.rollout(learner.version)  # version 0
    learn(learner, roller.rollout(0))
    learn(learner, roller.rollout(0))
    m = learn(learner, stale)  # behaviour policy 2 updates old
    assert m["staleness"] == 2.0
    roller.load_policy(learner.policy_state(), learner.version)
    assert roller.version == 3
    for a, b in zip(roller.actor.parameters(), learner.actor.parameters(), strict=True):
        assert torch.equal(a, b)
    # policy_state hands out copies: training on does not change what was sent.
    sent = learner.policy_state()
    assert list(sent) == ["actor.flat"]  # the actor's part of the flat buffer, one tensor
    assert torch.equal(sent["actor.flat"], torch.cat([v.reshape(-1) for v in learner.actor.state_dict().values()]))
    learn(learner, roller.rollout(3))
    assert not torch.equal(sent["actor.flat"], torch.cat([v.reshape(-1) for v in learner.actor.state_dict().values()]))
    critic = [v.clone() for v in roller.critic.parameters()]
    roller.load_policy(sent, 3)  # into the rollout's buffer: its actor's weights, its critic's untouched
    assert torch.equal(torch.cat([v.reshape(-1) for v in roller.actor.state_dict().values()]), sent["actor.flat"])
    assert all(torch.equal(a, b) for a, b in zip(critic, roller.critic.parameters(), strict=True))


def test_stale_samples_clip_around_the_learners_policy_weighted_by_behaviour() -> None:
    """Decoupled PPO: pi_prox is the learner's policy before the update, the weight pi_prox/pi_b."""
    learner, roller = pair()
    stale = roller.rollout(0)
    learn(learner, roller.rollout(0))  # the learner moves to version 1; ``stale`` is now 1 behind
    learner._prepare(stale)
    b = learner._prepared
    with torch.no_grad():
        logp = torch.log_softmax(learner.actor(b["obs"]), -1).gather(1, b["actions"].unsqueeze(1)).squeeze(1)
    assert torch.allclose(b["prox_logprobs"], logp, atol=1e-6)
    assert not torch.equal(b["prox_logprobs"], b["logprobs"])  # the policy did move
    assert torch.allclose(b["weights"], (logp - b["logprobs"]).exp(), atol=1e-6)
    assert learner._stats["behaviour_kl"][0] > 0 and learner._stats["weight_max"][0] > 1
    # At the update's start the ratio pi/pi_prox is 1: nothing is clipped yet.
    mb = learner._schedule[0]
    learner._loss(mb, mb)
    assert learner._stats["clipfrac"][-1] == 0.0

    plain, roller2 = pair(staleness_correction="none")
    stale2 = roller2.rollout(0)
    learn(plain, roller2.rollout(0))
    plain._prepare(stale2)
    assert torch.equal(plain._prepared["prox_logprobs"], plain._prepared["logprobs"])
    assert bool((plain._prepared["weights"] == 1).all()) and "behaviour_kl" not in plain._stats


def test_a_fresh_batch_is_plain_ppo_bit_for_bit() -> None:
    """No stale sample: the decoupled objective adds no pass and changes no number."""
    runs = []
    for correction in ("decoupled", "none"):
        learner, roller = pair(staleness_correction=correction)
        for _ in range(2):
            batch = roller.rollout(learner.version)
            m = learn(learner, batch)
            roller.load_policy(learner.policy_state(), learner.version)
        assert "behaviour_kl" not in m and m["staleness"] == 0.0
        runs.append([p.detach().clone() for p in learner.parameters_to_sync()])
    assert all(torch.equal(a, b) for a, b in zip(*runs, strict=True))


def test_micro_batches_sum_to_the_minibatch_loss() -> None:
    learner, roller = pair()
    learner._prepare(roller.rollout(0))
    mb = learner._schedule[0]
    whole = learner._loss(mb, mb).item()
    parts = [learner._loss(mb, mb[idx]).item() for idx in torch.arange(len(mb)).tensor_split(3)]
    assert sum(parts) == pytest.approx(whole, rel=1e-5, abs=1e-6)


def test_several_rollout_ranks_merge_into_one_learner_batch() -> None:
    learner = PPOWorkload(ctx(0, "learner"), **SMALL)
    rollers = [PPOWorkload(ctx(r, "rollout"), **SMALL) for r in (1, 2)]
    batches = [r.rollout(0) for r in rollers]
    assert not torch.equal(batches[0]["obs"], batches[1]["obs"])  # ranks run different envs
    merged = learner.merge_batches(batches)
    assert merged["obs"].shape[0] == 2 * SMALL["num_envs"]
    assert learner.batch_steps(merged) == 2 * SMALL["num_envs"] * SMALL["num_steps"]
    m = learn(learner, merged)
    assert m["env_steps"] == 2 * SMALL["num_envs"] * SMALL["num_steps"]


def test_same_seed_same_run_other_seed_other_run() -> None:
    def run(seed: int) -> tuple[torch.Tensor, dict[str, float]]:
        learner, roller = pair(seed)
        batch = roller.rollout(0)
        return batch["actions"], learn(learner, batch)

    a1, m1 = run(3)
    a2, m2 = run(3)
    a3, _ = run(4)
    assert torch.equal(a1, a2) and m1 == m2
    assert not torch.equal(a1, a3)


def _is_plain(value: object) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    json.dumps(value)
    return True


def test_state_round_trip_resumes_exactly(tmp_path: Path) -> None:
    learner, roller = pair(seed=1)
    learn(learner, roller.rollout(0))
    roller.load_policy(learner.policy_state(), learner.version)
    l_state, r_state = learner.state_dict(), roller.state_dict()
    assert all(_is_plain(v) for v in l_state.values())  # tensors + JSON, nothing pickled
    assert all(_is_plain(v) for v in r_state.values())
    assert "rollout.envs" in r_state and "rollout.envs" not in l_state
    # Copied as every reader does (the tensors are the live ones), JSON values through JSON and
    # back, as a store that keeps JSON values as JSON would.
    r_state = {k: v.clone() if isinstance(v, torch.Tensor) else json.loads(json.dumps(v))
               for k, v in r_state.items()}
    l_state = {k: v.clone() if isinstance(v, torch.Tensor) else json.loads(json.dumps(v))
               for k, v in l_state.items()}

    batch = roller.rollout(learner.version)
    expect = learn(learner, batch)

    learner2, roller2 = pair(seed=1)
    learner2.load_state_dict(l_state)
    roller2.load_state_dict(r_state)
    batch2 = roller2.rollout(learner2.version)
    for key in batch:
        assert torch.equal(batch[key], batch2[key]), key
    assert learn(learner2, batch2) == expect
    for a, b in zip(learner.parameters_to_sync(), learner2.parameters_to_sync(), strict=True):
        assert torch.equal(a, b)


def test_state_from_another_shape_is_a_checkpoint_error() -> None:
    learner, _ = pair()
    other = PPOWorkload(ctx(0, "learner"), **{**SMALL, "hidden": 32})
    with pytest.raises(CheckpointError, match="same workload_args"):
        other.load_state_dict(learner.state_dict())


def test_evaluate_uses_gymnasiums_threshold() -> None:
    learner, _ = pair()
    e = learner.evaluate()
    assert e["reward_threshold"] == gym.spec("CartPole-v1").reward_threshold == 475.0
    assert e["eval_episodes"] == SMALL["eval_episodes"]
    assert 8 <= e["eval_return_min"] <= e["eval_return_mean"] <= e["eval_return_max"] <= 500
    assert e["solved"] == float(e["eval_return_mean"] >= 475.0)
    assert learner.evaluate() == e  # seeded by (seed, version): repeatable


def test_acrobot_rollout_and_update() -> None:
    learner, roller = pair(env_id="Acrobot-v1")
    b = roller.rollout(0)
    assert b["obs"].shape[-1] == 6 and set(b["actions"].unique().tolist()) <= {0, 1, 2}
    assert bool((b["rewards"] <= 0).all())
    m = learn(learner, b)
    assert 0 < m["entropy"] <= 1.0987  # log(3)
    assert learner.evaluate()["reward_threshold"] == gym.spec("Acrobot-v1").reward_threshold


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ({"num_env": 4}, "did you mean 'num_envs'"),
        ({"learning_rate": "3e-4"}, "expected a number, got str"),
        ({"num_envs": 2.0}, "expected an integer, got float"),
        ({"gamma": 1.5}, "less than or equal to 1"),
        ({"num_steps": 0}, "greater than 0"),
        ({"env_id": "CartPole-v9"}, "unknown gymnasium environment"),
        ({"env_id": "Pendulum-v1"}, "Discrete action"),
    ],
)
def test_bad_workload_args_are_spec_errors(args: dict[str, object], match: str) -> None:
    with pytest.raises(SpecError, match=match) as info:
        PPOWorkload(ctx(0, "learner"), **args)
    assert "workload_args." in str(info.value)


def test_defaults_are_valid() -> None:
    cfg = PPOConfig.from_args({})
    assert cfg.env_id == "CartPole-v1" and cfg.torch_threads == 1


def test_state_through_hetruns_checkpoint_store_resumes_exactly(tmp_path: Path) -> None:
    """The real store (no pickle) keeps everything PPO needs, 128-bit env RNG states included."""
    from hetrun.runtime.ckpt import open_store, tiers_for
    from hetrun.runtime.ckpt.writer import CheckpointWriter

    learner, roller = pair(seed=2)
    learn(learner, roller.rollout(0))
    writer = CheckpointWriter(tiers_for(tmp_path / "ckpt"), keep=2)
    writer.save(1, {"learner": learner.state_dict(), "rollout": roller.state_dict()})
    writer.wait()
    writer.close()
    batch = roller.rollout(1)
    expect = learn(learner, batch)

    tree, _, _ = open_store(tmp_path / "ckpt").load_rank(1, 0)
    learner2, roller2 = pair(seed=2)
    learner2.load_state_dict(tree["learner"])
    roller2.load_state_dict(tree["rollout"])
    batch2 = roller2.rollout(1)
    assert all(torch.equal(batch[k], batch2[k]) for k in batch)
    assert learn(learner2, batch2) == expect


def test_learner_threads_apply_to_the_update_only() -> None:
    """learner_threads is the update's phase: forward..optimize, then the process's own count."""
    learner, roller = pair(learner_threads=3)
    before = torch.get_num_threads()  # torch_threads (1), which building the workload set
    seen: list[int] = []
    learner.backward = lambda loss: (seen.append(torch.get_num_threads()), loss.backward())  # type: ignore[method-assign]
    learn(learner, roller.rollout(0))
    assert seen == [3, 3] and torch.get_num_threads() == before == 1
    assert PPOConfig.from_args({"learner_threads": "auto"}).threads_for_learner() >= 1
    with pytest.raises(SpecError, match="learner_threads"):
        PPOConfig.from_args({"learner_threads": 0})


def _torch_state(wl: PPOWorkload) -> dict[str, object]:
    """The networks' and optimizer's part of state_dict() as torch's own state_dicts give it: the
    networks as one tensor (their parameters in order) where the workload keeps them flat."""
    out: dict[str, object] = {}
    nets = [(f"{prefix}.{k}", v) for prefix, net in (("actor", wl.actor), ("critic", wl.critic))
            for k, v in net.state_dict().items()]
    if wl._flat is not None:
        out[FLAT_KEY] = torch.cat([v.reshape(-1) for _, v in nets])
    else:
        out.update(nets)
    if wl._optimizer is not None:
        opt = wl._optimizer.state_dict()
        for idx, slots in opt["state"].items():
            out.update({f"optim.state.{idx}.{slot}": v for slot, v in slots.items()})
        out["optim.param_groups"] = [{k: list(v) if isinstance(v, tuple) else v for k, v in g.items()}
                                     for g in opt["param_groups"]]
    return out


def _same_state(wl: PPOWorkload) -> None:
    """``wl.state_dict()``'s networks and optimizer: ``_torch_state``'s names, order and values,
    each the live tensor (the flat one: the buffer under the networks)."""
    ours, want = wl.state_dict(), _torch_state(wl)
    mine = {k: v for k, v in ours.items() if k.startswith(("actor.", "critic.", "optim.", "params."))}
    assert list(mine) == list(want)
    for k, v in want.items():
        if isinstance(v, torch.Tensor):
            got = mine[k]
            assert isinstance(got, torch.Tensor) and not got.requires_grad
            live = wl._flat.param if k == FLAT_KEY and wl._flat is not None else v
            assert got.data_ptr() == live.data_ptr() and torch.equal(got, v), k  # the live tensor
        else:
            assert mine[k] == v, k


@pytest.mark.parametrize("layout", ["flat", "by_name"])
def test_state_dict_lists_what_torchs_state_dicts_give(layout: str) -> None:
    """state_dict() gives the networks as one flat tensor (examples/flat_params.py) or, by name (the
    Atari workload's layout), from a list made once (``_net_tensors``), and Adam's state without
    its packing pass: what torch's own state_dicts hold, the live tensors, before the first
    update, after updates, after a restore into a fresh workload, and after a network is
    replaced (flat: a new buffer under it, and a new optimizer over that)."""
    def make() -> tuple[PPOWorkload, PPOWorkload]:
        learner, roller = pair()
        if layout == "by_name":
            learner._flat = None  # (its parameters stay views into the buffer: by name all the same)
        return learner, roller

    learner, roller = make()
    _same_state(learner)  # no optimizer yet
    for _ in range(3):
        learn(learner, roller.rollout(learner.version))
        _same_state(learner)
    fresh, _ = make()
    fresh.state_dict()  # lists the fresh networks before the load writes into them
    fresh.load_state_dict(learner.state_dict())
    _same_state(fresh)
    assert torch.equal(_torch_state(fresh)["optim.state.0.exp_avg"], _torch_state(learner)["optim.state.0.exp_avg"])
    learn(fresh, roller.rollout(fresh.version))
    _same_state(fresh)
    fresh.actor = torch.nn.Sequential(torch.nn.Linear(fresh.obs_dim, 3), torch.nn.Tanh(),
                                      torch.nn.Linear(3, fresh.n_actions))
    _same_state(fresh)
    if layout == "flat":
        assert fresh._optimizer is None and fresh._flat is not None and fresh._flat.covers((fresh.actor, fresh.critic))
        learn(fresh, roller.rollout(fresh.version))  # trains the new networks through the new buffer
        _same_state(fresh)


def test_a_checkpoint_by_name_restores_into_the_flat_layout() -> None:
    """A learner's state written before the flat layout (the networks by name, Adam's moments per
    parameter) restores into it: the same weights, moments and step count, and the next update
    the same as the learner's it was taken from."""
    learner, roller = pair()
    for _ in range(2):
        learn(learner, roller.rollout(learner.version))
    flat_state = learner.state_dict()
    old: dict[str, object] = {k: v for k, v in flat_state.items()
                              if not k.startswith(("optim.", "params."))}
    old.update({f"{prefix}.{k}": v.clone() for prefix, net in (("actor", learner.actor), ("critic", learner.critic))
                for k, v in net.state_dict().items()})
    assert learner._flat is not None
    idx = 0
    for p in learner._flat.params:  # Adam's per-parameter slots, as torch numbered them
        n = p.numel()
        off = p.data_ptr() - learner._flat.param.data_ptr()
        lo = off // p.element_size()
        old[f"optim.state.{idx}.step"] = flat_state["optim.state.0.step"].clone()
        for slot in ("exp_avg", "exp_avg_sq"):
            old[f"optim.state.{idx}.{slot}"] = flat_state[f"optim.state.0.{slot}"][lo:lo + n].view_as(p).clone()
        idx += 1
    group = dict(flat_state["optim.param_groups"][0])
    group["params"] = list(range(idx))
    old["optim.param_groups"] = [group]
    fresh, _ = pair(seed=3)
    fresh.load_state_dict(old)
    got = fresh.state_dict()
    for k, v in flat_state.items():
        if isinstance(v, torch.Tensor):
            assert torch.equal(got[k], v), k
    batch = roller.rollout(learner.version)
    assert learn(fresh, batch) == learn(learner, batch)
    assert torch.equal(fresh.state_dict()[FLAT_KEY], learner.state_dict()[FLAT_KEY])
    bad = dict(old)
    bad["optim.state.3.step"] = bad["optim.state.3.step"] + 1
    with pytest.raises(CheckpointError, match="differs between parameters"):
        pair()[0].load_state_dict(bad)
