"""numpy's global generator state as ``np.random.get_state(legacy=True)`` gives it, read in ~2 us.

Why: ``capture_rng`` runs at every memory snapshot (up to every iteration, on the training
thread) and ``get_state`` was 41-47 us of its 55 us on this machine: MT19937's state getter copies
its 624 words into a new array one element at a time. After a step, caches cold, that is
~0.1 ms of an iteration the memory tier has 2 % of (benchmarks/node_death.md, session 30).

How: the generator's state struct (``uint32 key[624]; int pos``) through numpy's public ctypes
interface (``BitGenerator.ctypes.state_address``), and the legacy Gaussian cache (``has_gauss``,
``gauss``: the half of a Box-Muller pair ``standard_normal`` keeps) from the RandomState's own
``aug_bitgen_t``, found once per process as the word that points at the RandomState's
``bitgen_t`` (whose first word is the state's address). Before it is used, the reader is
checked against ``get_state(legacy=True)`` on a private RandomState with and without a cached
Gaussian, and once on the global one: any difference, a bit generator other than MT19937, or
a numpy that lays these out otherwise, and ``legacy_state`` is ``get_state``, as before.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from typing import Any

import numpy as np

_KEY_WORDS = 624  # MT19937's state: uint32 key[624], then int pos


def legacy_state() -> list[Any]:
    """``list(np.random.get_state(legacy=True))``: [name, key (uint32[624]), pos, has_gauss, gauss]."""
    checked = _global_reader()
    if checked is None or np.random.mtrand._rand._bit_generator is not checked[1]:
        return list(np.random.get_state(legacy=True))  # no reader, or not the generator it was checked on
    return checked[0]()


@functools.cache
def _global_reader() -> tuple[Callable[[], list[Any]], Any] | None:
    """The global RandomState's reader, checked, and the bit generator it reads; None: use numpy's getter."""
    rs = np.random.mtrand._rand
    try:
        private = np.random.RandomState(12345)
        offsets = _gauss_offsets(private)
        if offsets is None or not _agrees(private, offsets):
            return None
        read = _reader(rs, offsets)
        if read is None or not _same(read(), rs.get_state(legacy=True)):
            return None
    except Exception:  # any surprise: numpy's own getter
        return None
    return read, rs._bit_generator


def _gauss_offsets(rs: Any) -> tuple[int, int] | None:
    """Byte offsets of ``has_gauss`` and ``gauss`` in ``rs``: the aug_bitgen_t is the word that
    points at rs's bitgen_t, the word that holds the state's address; the two follow it."""
    if type(rs._bit_generator).__name__ != "MT19937":
        return None
    size = type(rs).__basicsize__
    words = (ctypes.c_uint64 * (size // 8)).from_address(id(rs))  # within the object only
    state = rs._bit_generator.ctypes.state_address
    for i in range(len(words)):
        if words[i] == state:
            bitgen = id(rs) + 8 * i
            for j in range(len(words) - 2):
                if words[j] == bitgen:
                    return 8 * j + 8, 8 * j + 16  # int has_gauss (padded to 8), double gauss
    return None


def _reader(rs: Any, offsets: tuple[int, int]) -> Callable[[], list[Any]] | None:
    bg = rs._bit_generator
    if type(bg).__name__ != "MT19937":
        return None
    address = bg.ctypes.state_address
    key = np.ctypeslib.as_array((ctypes.c_uint32 * _KEY_WORDS).from_address(address))  # a live view
    pos = ctypes.c_int.from_address(address + 4 * _KEY_WORDS)
    has_gauss = ctypes.c_int.from_address(id(rs) + offsets[0])
    gauss = ctypes.c_double.from_address(id(rs) + offsets[1])

    def read(lock: Any = bg.lock, _alive: tuple[Any, ...] = (rs, bg)) -> list[Any]:
        # ``_alive``: the views above point into rs and bg, held as long as the reader is.
        with lock:  # numpy's own getter holds it too: no draw on another thread tears the copy
            return ["MT19937", key.copy(), pos.value, has_gauss.value, gauss.value]

    return read


def _same(got: list[Any], want: tuple[Any, ...]) -> bool:
    return (len(got) == len(want) == 5 and got[0] == want[0] and got[1].dtype == want[1].dtype
            and np.array_equal(got[1], want[1]) and got[2:] == list(want[2:])
            and all(type(a) is type(b) for a, b in zip(got[2:], want[2:], strict=True)))


def _agrees(rs: Any, offsets: tuple[int, int]) -> bool:
    """The reader equals get_state(legacy=True) on ``rs``: fresh, after draws, with a cached
    Gaussian and without."""
    read = _reader(rs, offsets)
    if read is None:
        return False
    checks = []
    for draw in (lambda: None, lambda: rs.random_sample(700), lambda: rs.standard_normal(),
                 lambda: rs.standard_normal()):
        draw()
        checks.append(_same(read(), rs.get_state(legacy=True)))
    return all(checks)
