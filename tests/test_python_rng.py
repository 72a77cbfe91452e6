"""runtime/ckpt/python_rng.py: Python's global random state read from its memory equals
``random.getstate()`` in every state it can be in, is one object while unchanged, and falls back
to ``getstate()`` where its reader does not apply."""

from __future__ import annotations

import random

import pytest


@pytest.fixture
def saved_global_state():
    state = random.getstate()
    yield
    random.setstate(state)


def _as_getstate(got: list) -> tuple:
    return (got[0], got[1], got[2])


def test_the_read_state_is_getstates_in_every_state(saved_global_state) -> None:
    from hetrun.runtime.ckpt import python_rng

    assert python_rng._global_reader() is not None  # this CPython's layout is the one checked
    random.seed(7)
    for change in (lambda: None, lambda: [random.random() for _ in range(1000)],
                   lambda: random.gauss(0.0, 1.0),  # a Gaussian cached (gauss_next a float)
                   lambda: random.gauss(0.0, 1.0),  # ... and used (None again)
                   lambda: random.seed(2**64 + 3), lambda: random.getrandbits(32 * 700),
                   lambda: random.shuffle(list(range(100)))):
        change()
        got = python_rng.state()
        assert _as_getstate(got) == random.getstate()
        assert type(got[1]) is tuple and len(got[1]) == 625


def test_one_object_while_unchanged_a_new_one_after_a_draw(saved_global_state) -> None:
    from hetrun.runtime.ckpt import python_rng

    a, b = python_rng.state(), python_rng.state()
    assert a[1] is b[1]  # the snapshot encoder's comparison is one of identity
    before = a[1]
    random.random()
    c = python_rng.state()
    assert c[1] is not before and c[1] != before
    assert before == a[1] and _as_getstate(c) == random.getstate()  # the old tuple is as it was


def test_capture_and_restore_round_trip(saved_global_state) -> None:
    from hetrun.runtime.ckpt.state import capture_rng, restore_rng

    random.seed(11)
    random.gauss(0.0, 1.0)  # a cached Gaussian is part of the state
    saved = capture_rng()
    want = [random.gauss(0.0, 1.0), random.random(), random.randrange(10**12)]
    [random.random() for _ in range(50)]
    restore_rng(saved)
    assert [random.gauss(0.0, 1.0), random.random(), random.randrange(10**12)] == want


def test_rebound_module_functions_fall_back_to_getstate(saved_global_state, monkeypatch) -> None:
    """A module whose getstate is another generator's (someone rebound it): that generator's
    state, by its own getstate, not the checked instance's memory."""
    from hetrun.runtime.ckpt import python_rng

    other = random.Random(99)
    monkeypatch.setattr(random, "getstate", other.getstate)
    assert _as_getstate(python_rng.state()) == other.getstate()


def test_a_layout_it_does_not_know_is_refused() -> None:
    from hetrun.runtime.ckpt import python_rng

    class NotCPythons:
        VERSION = 3

    with pytest.raises(TypeError):
        python_rng._reader(NotCPythons())


def test_the_snapshot_blob_is_the_reference_encoders_with_the_rng_tuple(saved_global_state) -> None:
    """The memory tier's fast encoder writes memory.encode's bytes for a tree holding the tuple, the
    second time too (its kept JSON reused by identity), and a changed state is re-encoded."""
    from hetrun.runtime.ckpt import memory
    from hetrun.runtime.ckpt.memory_encode import Encoder
    from hetrun.runtime.ckpt.state import capture_rng

    enc = Encoder()
    for step in range(3):
        tree = {"rng": capture_rng(), "iteration": step}
        assert bytes(enc.encode(step, 0, tree)) == bytes(memory.encode(step, 0, tree))
        if step == 1:
            random.random()
    _, decoded = memory.decode(enc.encode(5, 0, {"rng": capture_rng()}), "test")
    assert tuple(decoded["rng"]["python"][1]) == random.getstate()[1]
