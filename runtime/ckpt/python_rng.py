"""Python's global ``random`` state as ``random.getstate()`` gives it, read from the generator's memory.

Why: ``capture_rng`` runs at every memory snapshot (up to every iteration, on the training
thread). ``random.getstate()`` builds 625 new int objects, and the snapshot's encoder then compares
them one by one with its last copy to reuse their JSON (runtime/ckpt/memory_encode.py). After the
DDP example's step, caches cold, the two took ~0.2 ms of a ~0.9 ms snapshot (benchmarks/node_death.md,
session 34), where most training never draws from ``random`` and the state does not change.

How: ``_random.Random``'s C struct is ``PyObject_HEAD; int index; uint32_t state[624]``. Its 2,500
bytes after the head are copied as one bytes object and compared with the last read (a memcmp);
unchanged, the last tuple is returned again (the same object: the encoder's comparison is then one
of identity), else a new one is built in C (``array.tolist``). ``gauss_next`` is the Python
instance's attribute, as ``random.Random.getstate`` reads it. Before it is used, the reader is
checked against ``getstate()`` on a private generator (fresh, after draws, reseeded, with a Gaussian
cached) and once on the global one; any difference, another layout, or a module whose ``getstate``
is no longer the checked instance's, and ``state`` is ``random.getstate()``.

The state is ``[version, internal, gauss_next]`` with ``internal`` a tuple of 625 ints (the 624
words, then the index), as ``getstate()``'s: immutable, so one object can stand for every capture
that saw the same state.
"""

from __future__ import annotations

import _random
import ctypes
import functools
import random
import struct
import sys
from array import array
from collections.abc import Callable
from typing import Any

_WORDS = 624  # MT19937's uint32 state[624], after an int index
_HEAD = object.__basicsize__  # PyObject_HEAD: the struct's fields start here
_SPAN = 4 + 4 * _WORDS  # int index + the words


def state() -> list[Any]:
    """``random.getstate()`` as ``[version, internal (tuple of 625 ints), gauss_next]``."""
    checked = _global_reader()
    if checked is None or getattr(random.getstate, "__self__", None) is not checked[1]:
        ver, internal, gauss = random.getstate()  # no reader, or the module's functions rebound
        return [ver, internal, gauss]
    return checked[0]()


@functools.cache
def _global_reader() -> tuple[Callable[[], list[Any]], Any] | None:
    """The global generator's reader, checked, and the instance it reads; None: use getstate()."""
    inst = getattr(random.getstate, "__self__", None)
    if not getattr(sys, "_is_gil_enabled", lambda: True)():
        return None  # a free-threaded build: a draw on another thread could tear the copy
    try:
        if inst is None or not _agrees(random.Random(12345)):
            return None
        read = _reader(inst)
        if not _same(read(), inst.getstate()):
            return None
    except Exception:  # any surprise: Python's own getter
        return None
    return read, inst


def _layout_known(inst: Any) -> bool:
    return (isinstance(inst, _random.Random) and _random.Random.__basicsize__ >= _HEAD + _SPAN
            and array("I").itemsize == 4 and struct.calcsize("i") == 4)


def _reader(inst: Any) -> Callable[[], list[Any]]:
    if not _layout_known(inst):
        raise TypeError("not a CPython _random.Random of the known layout")
    raw = (ctypes.c_char * _SPAN).from_address(id(inst) + _HEAD)  # a live view of the struct
    version = inst.VERSION
    last: list[Any] = [None, None]  # the last read's bytes and its tuple

    def read(_alive: Any = inst) -> list[Any]:
        # ``_alive``: the view points into inst, held as long as the reader is. The copy runs
        # under the GIL, as every draw does: no draw tears it.
        now = raw.raw
        if now != last[0]:
            words = array("I", now[4:]).tolist()
            words.append(struct.unpack_from("i", now)[0])
            last[0], last[1] = now, tuple(words)
        return [version, last[1], inst.gauss_next]

    return read


def _same(got: list[Any], want: tuple[Any, ...]) -> bool:
    return (len(got) == len(want) == 3 and got[0] == want[0] and type(got[1]) is tuple
            and got[1] == want[1] and type(got[2]) is type(want[2]) and got[2] == want[2])


def _agrees(rs: random.Random) -> bool:
    """The reader equals getstate() on ``rs``: fresh, after draws, reseeded, with a cached
    Gaussian and after it is used."""
    read = _reader(rs)
    checks = []
    for change in (lambda: None, lambda: [rs.random() for _ in range(700)], lambda: rs.seed(2**40 + 7),
                   lambda: rs.gauss(0.0, 1.0), lambda: rs.gauss(0.0, 1.0), lambda: rs.getrandbits(32 * 625)):
        change()
        checks.append(_same(read(), rs.getstate()))
    return all(checks)
