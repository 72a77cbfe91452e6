"""The memory tier's encoder: ``memory.encode``'s blob, byte for byte, for less of the training
thread's time.

Why: the run API takes a snapshot on the training thread (runtime/api/run.py ``snapshot``), up to
every step. For the DDP command example (a 43 KB state, a 54 ms step) ``memory.encode`` was most
of the ~1.4 ms a snapshot cost after each step's sleep, caches cold (benchmarks/node_death.md,
session 21): the tree's walk, five torch calls per tensor for its bytes, and a JSON header of
9.6 KB, three quarters of it Python's RNG state (625 ints) encoded again every step.

What ``Encoder`` does instead, the blob unchanged (format 2, ``memory.encode``'s bytes exactly:
tests/test_memory_encode.py compares them):

- one walk of the tree builds the skeleton and takes each CPU tensor's bytes as a view
  (``Tensor.numpy()``, one call); a tensor that has none (a device tensor, one that needs grad,
  a dtype numpy lacks) is copied as ``memory._raw_bytes`` does;
- the leaves' JSON is kept and reused while every tensor's dtype and shape stay the same (the
  leaves compared in C, as tuples of str and int: equal means the same JSON);
- a long list of plain ints (Python's RNG state) is JSON-encoded once per place in the tree and
  reused while a copy of it compares equal; the skeleton is encoded with a marker there
  (``{"R":k}``: the skeleton's only object keys are its tags, and a string's quotes are escaped,
  so nothing else encodes to it) that the kept text replaces;
- a tree that is a dict (the snapshot's: workload, RNG, iteration): each top-level entry's
  skeleton JSON is kept while the entry's ``marshal`` bytes stay the same (``_skeleton_json``);
- anything else (a tensor subclass other than Parameter, a numpy scalar, an int subclass, a dict
  key that is not exactly str or int, a dtype the store cannot hold) goes to ``memory.encode``
  whole: its blob and its errors are the reference's.
"""

from __future__ import annotations

import json
import marshal
from collections import OrderedDict
from typing import Any

import numpy as np
import torch

from . import memory
from .state import _dtype_name
from .store import fast_digest

_JSON = json.JSONEncoder(separators=(",", ":"))  # json.dumps(..., separators=(",", ":")), built once
_HEAD_START = '{"format":' + _JSON.encode(memory.FORMAT) + ',"step":'
_PLAIN = frozenset({type(None), bool, int, float, str})
_DICTS = (dict, OrderedDict)  # exact types: a state_dict() is an OrderedDict
_TENSORS = (torch.Tensor, torch.nn.Parameter)
_INTS = {int}
# Lists of plain ints at least this long have their JSON kept (shorter ones cost less to encode
# than to compare and type-check).
KEEP_INTS_FROM = 64


class _Slow(Exception):
    """Outside the fast path: ``memory.encode`` takes the tree (and names any error)."""


class Encoder:
    """One rank's snapshot encoder; keeps what did not change since its last blob.
    Not thread-safe: one per ``MemorySnapshots``, called on its snapshot's thread."""

    def __init__(self) -> None:
        self._leaves: list[tuple[Any, ...]] | None = None  # the last blob's leaves ...
        self._leaves_json = ""  # ... and their JSON
        self._ints: dict[int, tuple[list[int], str]] = {}  # k-th long int list: (a copy, its node's JSON)
        self._entries: dict[int, tuple[bytes, str]] = {}  # i-th top-level entry: (its marshal, its JSON)
        # data_ptr -> (dtype, shape, leaf, byte view): the last blob's CPU tensors (their memory)
        self._tensors: dict[int, tuple[Any, ...]] = {}
        self.fast = 0  # blobs encoded here, and ...
        self.slow = 0  # ... by memory.encode (the reference path)

    def encode(self, step: int, owner: int, tree: Any, meta: dict[str, Any] | None = None) -> bytearray:
        """``memory.encode(step, owner, tree, meta)``."""
        try:
            skeleton, raws, leaves, spliced = self._flatten(tree)
        except _Slow:
            self.slow += 1
            return memory.encode(step, owner, tree, meta)
        self.fast += 1
        if leaves != self._leaves:
            self._leaves = leaves
            self._leaves_json = _JSON.encode([{"kind": k, "dtype": d, "shape": s, "nbytes": n, "itemsize": i}
                                              for k, d, s, n, i in leaves])
        text = self._skeleton_json(skeleton)
        for k, node in spliced:
            text = text.replace(f'{{"R":{k}}}', node, 1)
        head = (f'{_HEAD_START}{int(step)},"owner":{int(owner)},"meta":{_JSON.encode(meta or {})},'
                f'"skeleton":{text},"leaves":{self._leaves_json},'
                f'"digests":{_JSON.encode([fast_digest(r) for r in raws])}}}').encode()
        return memory.assemble(step, owner, head, raws)

    def _skeleton_json(self, skeleton: Any) -> str:
        """The skeleton's JSON. A tree that is a dict: each top-level entry's JSON kept while the
        entry's ``marshal`` is the same bytes (the workload's and the RNG's do not change from step
        to step; the iteration does). ``marshal`` rather than ``==``: it tells True from 1, 1.0
        from 1 and -0.0 from 0.0, as JSON does, and costs a sixth of encoding the JSON again
        (0.012 against 0.079 ms for the example's, caches cold). Version 2: no back-references,
        so the bytes depend on the values alone (an interned string and an equal one that is not
        differ by a flag: a miss, never a wrong hit)."""
        if type(skeleton) is not dict or "D" not in skeleton:
            return _JSON.encode(skeleton)
        kept, parts = self._entries, []
        for i, entry in enumerate(skeleton["D"]):
            try:
                exact = marshal.dumps(entry, 2)
            except ValueError:  # nested too deep for marshal: encoded each time
                parts.append(_JSON.encode(entry))
                continue
            have = kept.get(i)
            if have is None or have[0] != exact:
                have = kept[i] = (exact, _JSON.encode(entry))
            parts.append(have[1])
        return '{"D":[' + ",".join(parts) + "]}"

    def _flatten(self, tree: Any) -> tuple[Any, list[memoryview], list[tuple[Any, ...]], list[tuple[int, str]]]:
        """``state.flatten``'s skeleton (long int lists as markers), each tensor's bytes (a flat
        uint8 view), the leaves as (kind, dtype, shape, nbytes, itemsize), the markers' JSON."""
        raws: list[memoryview] = []
        leaves: list[tuple[Any, ...]] = []
        spliced: list[tuple[int, str]] = []
        kept = self._ints
        tensors = self._tensors
        # This walk's tensors only: one no longer in the tree is let go (with its memory).
        seen: dict[int, tuple[Any, ...]] = {}

        def walk(obj: Any) -> Any:
            t = type(obj)
            if t in _PLAIN:
                return obj
            if t in _DICTS:
                items = []
                for k, v in obj.items():
                    if type(k) is not str and type(k) is not int:
                        raise _Slow
                    items.append([k, walk(v)])
                return {"D": items}
            if t in _TENSORS:
                # A tensor over the same memory as one of the last blob's (a workload's
                # state_dict() returns its parameters and optimizer state themselves, or detached
                # views of them): the same bytes, while the shape, dtype and layout are the same,
                # so the leaf and byte view kept then (numpy() alone is 1 us a tensor). Exact: the
                # kept view holds that memory, so no other tensor can have been allocated there.
                ptr = obj.data_ptr()
                have = tensors.get(ptr)
                if (have is not None and obj.dtype is have[0] and obj.shape == have[1] and obj.is_cpu
                        and obj.is_contiguous() and not obj.is_neg()):  # (a square transpose_ keeps pointer and shape)
                    seen[ptr] = have
                    leaves.append(have[2])
                    raws.append(have[3])
                    return {"T": len(raws) - 1}
                name = _dtype_name(obj.dtype)
                if name is None:
                    raise _Slow
                try:
                    arr = obj.numpy()  # a view: CPU, no grad, a dtype numpy has, no conj/neg bit
                except Exception:  # a device tensor, one that needs grad, bfloat16...: the reference's copy
                    flat = memory._raw_bytes(obj)
                    leaves.append(("torch", name, list(obj.shape), flat.nbytes, obj.element_size()))
                    raws.append(memoryview(flat))
                else:
                    leaves.append(("torch", name, list(arr.shape), arr.nbytes, arr.itemsize))
                    try:
                        raws.append(memoryview(arr).cast("B"))
                    except TypeError:  # not C-contiguous, or empty: a contiguous copy, flat bytes
                        raws.append(memoryview(np.ascontiguousarray(arr).reshape(-1).view(np.uint8)))
                    else:  # a view of the tensor's own memory (not a copy): kept for the next blob
                        if raws[-1].nbytes and not obj.dtype.is_complex:  # (a conjugate view shares memory)
                            seen[ptr] = (obj.dtype, obj.shape, leaves[-1], raws[-1])
                return {"T": len(raws) - 1}
            if t is list or t is tuple:
                tag = "L" if t is list else "U"
                if len(obj) >= KEEP_INTS_FROM and set(map(type, obj)) == _INTS:
                    k = len(spliced)
                    have = kept.get(k)
                    if have is None or have[0] != obj:  # an equal list (or tuple) of ints encodes the same
                        # A copy of a list (the caller may change it in place); a tuple cannot change.
                        have = kept[k] = (list(obj) if t is list else obj, _JSON.encode({tag: obj}))
                    spliced.append((k, have[1]))
                    return {"R": k}
                return {tag: [walk(v) for v in obj]}
            if t is np.ndarray:
                if obj.dtype.hasobject:
                    raise _Slow
                arr = np.ascontiguousarray(obj)  # as state.flatten: a 0-d array becomes (1,)
                raws.append(memoryview(arr.reshape(-1).view(np.uint8)) if arr.size else memoryview(b""))
                leaves.append(("numpy", arr.dtype.str, list(arr.shape), arr.nbytes, arr.dtype.itemsize))
                return {"N": len(raws) - 1}
            raise _Slow

        skeleton = walk(tree)
        self._tensors = seen
        return skeleton, raws, leaves, spliced
