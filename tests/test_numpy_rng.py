"""runtime/ckpt/numpy_rng.py: numpy's global generator state read from its memory equals
``np.random.get_state(legacy=True)`` in every state it can be in, and falls back to it where
its reader does not apply."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hetrun.runtime.ckpt.numpy_rng import _same


@pytest.fixture
def saved_global_state():
    state = np.random.get_state(legacy=True)
    yield
    np.random.set_state(state)


def test_the_read_state_is_numpys_in_every_state(saved_global_state) -> None:
    from hetrun.runtime.ckpt import numpy_rng

    assert numpy_rng._global_reader() is not None  # this numpy's layout is the one checked
    np.random.seed(7)
    states = []
    for change in (lambda: None, lambda: np.random.random_sample(1000),
                   lambda: np.random.standard_normal(),  # a Gaussian cached (has_gauss 1)
                   lambda: np.random.standard_normal(),  # ... and used (has_gauss 0, pos unchanged)
                   lambda: np.random.standard_normal(3), lambda: np.random.seed(2**32 - 1),
                   lambda: np.random.randint(0, 10, size=624 * 3)):
        change()
        got = numpy_rng.legacy_state()
        assert _same(got, np.random.get_state(legacy=True))
        states.append(got)
    assert [s[3] for s in states[:4]] == [0, 0, 1, 0]
    # A state set with a cached Gaussian and the same key and position as the current one: only
    # has_gauss and gauss differ, and the read sees them.
    name, key, pos, _, _ = np.random.get_state(legacy=True)
    np.random.set_state((name, key, pos, 1, 0.25))
    got = numpy_rng.legacy_state()
    assert got[3:] == [1, 0.25] and _same(got, np.random.get_state(legacy=True))
    # The copy is the state then, not a view of the generator: draws that regenerate the key
    # leave it as it was.
    np.random.random_sample(1000)
    assert np.array_equal(got[1], key) and not np.array_equal(np.random.get_state(legacy=True)[1], key)


def test_capture_and_restore_round_trip_through_the_fast_read(saved_global_state) -> None:
    from hetrun.runtime.ckpt.state import capture_rng, restore_rng

    np.random.seed(3)
    np.random.standard_normal()  # a cached Gaussian is part of the state
    saved = capture_rng()
    want = np.random.standard_normal(5)
    np.random.random_sample(100)
    restore_rng(saved)
    assert np.array_equal(np.random.standard_normal(5), want)


def test_reads_under_the_generators_lock(saved_global_state) -> None:
    """numpy's getter holds the bit generator's lock (a draw on another thread cannot tear the
    copy); the read holds it too: it waits while another thread holds it."""
    from hetrun.runtime.ckpt import numpy_rng

    lock = np.random.mtrand._rand._bit_generator.lock
    done = threading.Event()
    out: list = []

    def read() -> None:
        out.append(numpy_rng.legacy_state())
        done.set()

    with lock:
        t = threading.Thread(target=read)
        t.start()
        assert not done.wait(0.3)  # blocked on the lock
    assert done.wait(10)
    t.join()
    assert _same(out[0], np.random.get_state(legacy=True))


def test_falls_back_to_numpys_getter_where_the_reader_does_not_apply(saved_global_state, monkeypatch) -> None:
    from hetrun.runtime.ckpt import numpy_rng

    # Another bit generator than MT19937: no offsets, no reader.
    assert numpy_rng._gauss_offsets(np.random.RandomState(np.random.PCG64(1))) is None
    # The global RandomState's generator swapped for another than the one checked: numpy's getter.
    rs = np.random.mtrand._rand
    checked = rs._bit_generator
    monkeypatch.setattr(rs, "_bit_generator", np.random.MT19937(9))
    calls = []
    real = np.random.get_state
    monkeypatch.setattr(np.random, "get_state", lambda legacy=True: calls.append(1) or real(legacy=legacy))
    assert _same(numpy_rng.legacy_state(), real(legacy=True)) and calls == [1]
    rs._bit_generator = checked  # (monkeypatch restores it too)
    assert _same(numpy_rng.legacy_state(), real(legacy=True)) and calls == [1]  # the reader again
