"""The memory tier's fast encoder (runtime/ckpt/memory_encode.py) and its tmpfs write
(runtime/ckpt/memory.py ``MemoryTier.write``): the same bytes as ``memory.encode`` whatever
the tree, however it changes between snapshots (a cache that went stale would show here), and
the same files and pruning as listing the directory each time."""

from __future__ import annotations

import enum
import os
import random
from collections import OrderedDict, defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hetrun.runtime.ckpt import memory
from hetrun.runtime.ckpt.memory_encode import KEEP_INTS_FROM, Encoder
from hetrun.runtime.ckpt.state import capture_rng

from hetrun.errors import CheckpointError


def _same(enc: Encoder, tree: Any, step: int = 7, owner: int = 1, meta: dict | None = None) -> bytearray:
    """``enc``'s blob, asserted equal to the reference's, byte for byte."""
    blob = enc.encode(step, owner, tree, meta)
    assert bytes(blob) == bytes(memory.encode(step, owner, tree, meta))
    return blob


def _example() -> tuple[dict[str, Any], Any]:
    """The DDP command example's state (examples/ddp_train_hetrun.py) and one training step."""
    import torch.nn.functional as F

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    x, y = torch.randn(16, 32), torch.randn(16, 1)

    def step() -> None:
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    return {"model": model, "optim": opt}, step


def test_the_example_state_step_after_step_is_the_reference_blob() -> None:
    objs, step = _example()
    enc = Encoder()
    for i in range(4):  # the first tree has no optimizer state yet: the leaves change after it
        tree = {"workload": {k: v.state_dict() for k, v in objs.items()}, "rng": capture_rng(), "iteration": i}
        head, back = memory.decode(_same(enc, tree, step=i))
        assert head["step"] == i and back["rng"]["python"][1] == tree["rng"]["python"][1]
        assert torch.equal(back["workload"]["model"]["0.weight"], tree["workload"]["model"]["0.weight"])
        step()  # the tensors change in place (the tree's are views of them)
        random.random()  # Python's RNG state moves: its kept JSON must not be reused
    assert enc.fast == 4 and enc.slow == 0


def test_every_kind_of_leaf_and_scalar_is_the_reference_blob() -> None:
    g = torch.Generator().manual_seed(1)
    tree = {
        "scalars": [None, True, False, 0, -3, 2**70, 1.5, -0.0, 0.0, float("nan"), float("inf"), "x\"é\n"],
        "looks_like_a_marker": '{"R":0}',  # a string's quotes are escaped: never taken for one
        "int_keys": {0: "a", 1: {"deep": (1, 2, [3, 4.0])}},
        "tensors": {"f32": torch.randn(4, 8, generator=g), "zero_d": torch.tensor(2.5), "empty": torch.empty(0, 3),
                    "noncontig": torch.randn(8, 4, generator=g).t(), "sliced": torch.arange(20)[5:15],
                    "bool": torch.tensor([True, False]), "f16": torch.randn(3, generator=g).half(),
                    "i64": torch.arange(6).reshape(2, 3), "c64": torch.randn(2, dtype=torch.complex64, generator=g)},
        "copied": {"bf16": torch.randn(5, generator=g).bfloat16(),  # numpy has no bfloat16
                   "grad": torch.randn(3, requires_grad=True), "param": torch.nn.Parameter(torch.randn(2, 2))},
        "arrays": {"u4": np.arange(7, dtype=np.uint32), "zero_d": np.array(3.0), "f_order": np.ones((3, 2), order="F"),
                   "empty": np.zeros((0,), np.int16)},
        "ints": list(range(KEEP_INTS_FROM)), "int_tuple": tuple(range(200)), "short_ints": [1, 2, 3],
    }
    enc = Encoder()
    blob = _same(enc, tree, meta={"k": [1, "two"]})
    _same(enc, tree)  # again, from what it kept
    assert enc.fast == 2 and enc.slow == 0
    _head, back = memory.decode(blob)
    assert torch.equal(back["copied"]["bf16"], tree["copied"]["bf16"])
    assert back["int_tuple"] == tree["int_tuple"] and back["looks_like_a_marker"] == '{"R":0}'
    assert np.array_equal(back["arrays"]["f_order"], tree["arrays"]["f_order"])


def test_a_changed_tree_never_reuses_what_was_kept() -> None:
    """Each change below keeps everything else the same: a stale cache would give the previous blob."""
    enc = Encoder()
    ints = list(range(1000, 1000 + 2 * KEEP_INTS_FROM))
    base = {"w": torch.zeros(4, 8), "rng": [3, ints, None], "lr": 0.1}
    _same(enc, base)
    changes = [
        {"w": torch.zeros(8, 4)},  # a shape (the same bytes)
        {"w": torch.zeros(4, 8, dtype=torch.int32)},  # a dtype of the same size
        {"w": torch.zeros(32)},
        {"v": torch.zeros(4, 8)},  # a key
        {"w": torch.ones(4, 8)},  # the bytes
        {"lr": 0.2},
        {"lr": 0},  # an int where a float was
    ]
    for change in changes:
        _same(enc, {**base, **change})
    equals = (1.0, 1, True, 0.0, -0.0, 0, False)  # each == the one before, each JSON not
    for equal in equals:
        _same(enc, {**base, "lr": equal})
    for equal in equals:
        _same(enc, {**base, "lr": [equal, "x"]})
    ints[5] += 1  # the same list object, changed in place
    _same(enc, base)
    ints[6] = True  # a bool among the ints: equal to 1, encoded as true
    ints[7] = 1
    _same(enc, base)
    ints[6] = 1
    _same(enc, base)
    _same(enc, {**base, "rng": [3, tuple(ints), None]})  # the same ints in a tuple
    _same(enc, {**base, "rng": [3, [float(i) for i in ints], None]})  # equal floats
    _same(enc, {**base, "rng": [3, [ints, list(ints)], None]})  # two lists: kept by place
    _same(enc, {**base, "rng": [3, [list(ints), ints[::-1]], None]})
    assert enc.slow == 0


def test_the_same_live_tensor_changed_in_place_is_encoded_as_it_is_now() -> None:
    """A workload's state_dict() returns its live tensors (examples/ppo.py): the encoder keeps each
    one's byte view while the object stays where it was; every in-place change must show."""
    enc = Encoder()
    w = torch.arange(16, dtype=torch.float32).reshape(4, 4)
    tree = {"w": w, "b": torch.zeros(3)}
    _same(enc, tree)
    w.add_(1)  # new values in the same memory: the kept view sees them
    _same(enc, tree)
    w.transpose_(0, 1)  # same pointer and shape, other strides
    _same(enc, tree)
    w.set_(torch.arange(16, dtype=torch.float32).reshape(2, 8))  # another storage
    _same(enc, tree)
    w.resize_(16)  # the same storage, another shape
    _same(enc, tree)
    w.data = torch.ones(16, dtype=torch.float64)  # another dtype
    _same(enc, tree)
    w.requires_grad_(True)
    _same(enc, {"w": w.detach(), "b": tree["b"]})
    tree["b"] = torch.zeros(3)  # a new object in the old one's place (its id may be reused)
    _same(enc, tree)
    assert enc.slow == 0


def _warm() -> tuple[Encoder, list[torch.Tensor], dict[str, Any], dict[str, Any]]:
    """An encoder that has walked a state_dict of 6 live tensors twice (their views kept)."""
    enc = Encoder()
    ws = [torch.arange(9.0).reshape(3, 3) + 10 * i for i in range(6)]  # every value differs
    state = {"version": 1, **{f"w{i}": w for i, w in enumerate(ws[:2])}, "betas": [0.9, 0.99],
             **{f"w{i}": w for i, w in enumerate(ws) if i >= 2}, "lr": 0.5,
             "bf16": torch.arange(4.0).bfloat16()}  # numpy has no bfloat16: its bytes are a copy
    tree = {"workload": state, "iteration": 0}
    _same(enc, tree)
    _same(enc, tree)
    return enc, ws, state, tree


def _put_first(d: dict[str, Any], key: str, value: Any) -> None:
    rest = d.copy()
    d.clear()
    d.update({key: value, **rest})


_STATE_CHANGES = {
    "values in place": lambda ws, state, tree: ws[0].add_(1),
    "a copied tensor's values in place": lambda ws, state, tree: state["bf16"].add_(1),
    "scalars": lambda ws, state, tree: state.update(version=2, lr=0.25),
    "an int where a float was": lambda ws, state, tree: state.update(lr=1),
    "a bool where a float was": lambda ws, state, tree: state.update(lr=True),
    "transpose_": lambda ws, state, tree: ws[1].transpose_(0, 1),  # same pointer and shape
    "a view of another dtype": lambda ws, state, tree: setattr(ws[5], "data", ws[5].view(torch.int32)),  # and pointer
    "set_": lambda ws, state, tree: ws[2].set_(torch.zeros(9)),
    "resize_": lambda ws, state, tree: ws[3].resize_(9),
    ".data of another dtype": lambda ws, state, tree: setattr(ws[4], "data", torch.ones(3, 3, dtype=torch.float64)),
    "a new tensor": lambda ws, state, tree: state.update(w0=torch.ones(3, 3)),
    "a list where a scalar was": lambda ws, state, tree: state.update(lr=[0.1, 0.2]),
    "a leaf where none was": lambda ws, state, tree: state.update(lr=[torch.ones(2)]),
    # a list still, now with a leaf: between the tensors' (after w0, w1)
    "a leaf in a list between tensors": lambda ws, state, tree: state.update(betas=[torch.ones(2), 0.99]),
    "a key gone": lambda ws, state, tree: state.pop("version"),
    "another key order": lambda ws, state, tree: state.update(version=state.pop("version")),
    "a leaf before the dict": lambda ws, state, tree: tree.update(workload={"extra": torch.ones(1), **state}),
    "a leaf before the tree's dicts": lambda ws, state, tree: _put_first(tree, "first", torch.ones(2)),
    "an int key": lambda ws, state, tree: tree.update(workload={1: torch.ones(1), **state}),
}


@pytest.mark.parametrize("change", list(_STATE_CHANGES))
def test_a_state_dict_walked_again_after_a_change_is_encoded_as_it_is_now(change: str) -> None:
    """The encoder keeps what it found at its last walk (each live tensor's view, strings' JSON,
    long int lists): each change to a state_dict after two walks must show."""
    enc, ws, state, tree = _warm()
    _STATE_CHANGES[change](ws, state, tree)
    _same(enc, tree)
    _same(enc, tree)  # and again, from whatever the walk before kept
    assert enc.slow == 0


def test_a_conjugate_view_where_a_complex_tensor_was_is_encoded_as_its_values() -> None:
    """A complex tensor's bytes are not kept as a view (a conjugate view shares its memory):
    they must not be taken for a conjugate view that replaced it. Stored as its values."""
    enc, _ws, state, tree = _warm()
    state["c64"] = torch.randn(3, dtype=torch.complex64)
    _same(enc, tree)
    _same(enc, tree)
    state["c64"] = state["c64"].conj()  # the same memory, dtype, shape; the conj bit set
    _head, back = memory.decode(_same(enc, tree))
    assert torch.equal(back["workload"]["c64"], state["c64"].resolve_conj())


def test_conjugate_and_negative_views_are_stored_as_their_values(tmp_path: Path) -> None:
    """Their memory holds the values before the conjugation or negation: every path stores the
    values (state.flatten resolves them; the checkpoint writer copied the memory before)."""
    from hetrun.runtime.ckpt import open_store, tiers_for
    from hetrun.runtime.ckpt.writer import CheckpointWriter

    g = torch.Generator().manual_seed(5)
    state = {"c": torch.randn(4, dtype=torch.complex64, generator=g).conj(),
             "n": torch.randn(3, generator=g)._neg_view()}
    assert state["c"].is_conj() and state["n"].is_neg()
    want = {"c": state["c"].resolve_conj(), "n": state["n"].resolve_neg()}
    _head, back = memory.decode(_same(Encoder(), state))
    assert all(torch.equal(back[k], want[k]) for k in want)
    w = CheckpointWriter(tiers_for(tmp_path), keep=1)
    w.save(1, state)
    assert w.wait().ok  # type: ignore[union-attr]
    w.close()
    got = open_store(tmp_path).restore()
    assert got is not None and all(torch.equal(got.state[k], want[k]) for k in want)


def test_a_bool_key_where_an_int_was_is_refused_as_the_reference_refuses_it() -> None:
    enc, _ws, state, tree = _warm()
    one = torch.ones(1)
    tree["workload"] = {1: one, **state}
    _same(enc, tree)
    _same(enc, tree)
    tree["workload"] = {True: one, **state}  # 1 == True: the keys compare equal
    for refuse in (enc.encode, memory.encode):
        with pytest.raises(CheckpointError, match="dict key True of type bool"):
            refuse(7, 1, tree)


class _Level(enum.IntEnum):
    LOW = 1


@pytest.mark.parametrize("odd", [np.float32(1.5), _Level.LOW, defaultdict(int, a=1), OrderedDict(a=1),
                                 torch.nn.Parameter(torch.ones(2), requires_grad=False)])
def test_odd_values_go_to_the_reference(odd: Any) -> None:
    enc = Encoder()
    _same(enc, {"odd": odd, "w": torch.ones(3)})


def test_unstorable_values_raise_the_reference_errors() -> None:
    for bad in ({True: 1}, {1.5: 1}, {"x": object()}, {"a": np.array([object()])}):
        with pytest.raises(CheckpointError) as ours:
            Encoder().encode(1, 0, bad)
        with pytest.raises(CheckpointError) as ref:
            memory.encode(1, 0, bad)
        assert str(ours.value) == str(ref.value)


def test_write_keeps_the_newest_across_restarts_restores_and_a_lost_directory(tmp_path: Path) -> None:
    blob = memory.encode(1, 0, {"w": torch.ones(2)})
    tier = memory.MemoryTier(tmp_path / "run", tmp_path / "shm", keep=3)
    for step in range(1, 7):
        tier.write(0, step, blob)
    assert tier.steps(0) == [4, 5, 6]
    # A new process (a restart) finds them, restored to step 5: its next writes go back to 6, 7.
    again = memory.MemoryTier(tmp_path / "run", tmp_path / "shm", keep=3)
    again.write(0, 6, blob)
    again.write(0, 7, blob)
    assert again.steps(0) == [5, 6, 7]
    assert sorted(os.listdir(again.owner_dir(0))) == ["slot-0", "slot-1", "slot-2"]
    # The directory goes (a finished run's cleanup): the next write makes it again.
    import shutil

    shutil.rmtree(again.dir)
    again.write(0, 8, blob)
    assert again.steps(0) == [8] and memory.verify(again.read(0, 8))["step"] == 1
