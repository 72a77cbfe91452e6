"""The memory tier's encoder: ``memory.encode``'s blob, byte for byte, for less of the training
thread's time.

Why: the run API takes a snapshot on the training thread (runtime/api/run.py ``snapshot``), up to
every step. For the DDP command example (a 43 KB state, a 54 ms step) ``memory.encode`` was most
of the ~1.4 ms a snapshot cost after each step's sleep, caches cold (benchmarks/node_death.md,
session 21): the tree's walk, five torch calls per tensor for its bytes, and a JSON header of
9.6 KB, three quarters of it Python's RNG state (625 ints) encoded again every step.

What ``Encoder`` does instead, the blob unchanged (format 2, ``memory.encode``'s bytes exactly:
tests/test_memory_encode.py compares them):

- one walk of the tree writes the skeleton's JSON text as it goes (json's own encoders for
  strings and floats' repr, as json.dumps; no skeleton objects built and encoded again after)
  and takes each CPU tensor's bytes as a view (``Tensor.numpy()``, one call); a tensor that has
  none (a device tensor, one that needs grad, a dtype numpy lacks) is copied as
  ``memory._raw_bytes`` does; a CPU tensor over the memory of one of the last blob's, with the
  same dtype, shape and layout, reuses that view;
- the leaves' JSON is kept and reused while every tensor's dtype and shape stay the same (the
  leaves compared in C, as tuples of str and int: equal means the same JSON);
- a long list of plain ints (Python's RNG state) is JSON-encoded once per place in the tree and
  reused while a copy of it compares equal;
- strings' JSON (the state_dicts' keys) is kept, the digests' JSON written as text (hex);
- anything else (a tensor subclass other than Parameter, a numpy scalar, an int subclass, a dict
  key that is not exactly str or int, a dtype the store cannot hold) goes to ``memory.encode``
  whole: its blob and its errors are the reference's.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any

import numpy as np
import torch

from . import memory
from .state import _dtype_name
from .store import fast_digest

_JSON = json.JSONEncoder(separators=(",", ":"))  # json.dumps(..., separators=(",", ":")), built once
_HEAD_START = '{"format":' + _JSON.encode(memory.FORMAT) + ',"step":'
# json's own string encoder (C): a key's or a string value's JSON, exactly as json.dumps writes it.
_encode_str = json.encoder.encode_basestring_ascii
_MAX_STRS = 4096  # strings whose JSON is kept (keys, mostly)
_Q = '"'
_DICTS = (dict, OrderedDict)  # exact types: a state_dict() is an OrderedDict
_TENSORS = (torch.Tensor, torch.nn.Parameter)
_INTS = {int}
_SCALARS = frozenset({type(None), bool, int, float, str})  # exact types, as state.flatten's
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
        self._strs: dict[str, str] = {}  # a string -> its JSON
        self._refs: dict[str, list[str]] = {"T": [], "N": []}  # tag -> i -> '{"T":i}' (made once)
        # data_ptr -> (dtype, shape, leaf, byte view): the last blob's CPU tensors (their memory)
        self._tensors: dict[int, tuple[Any, ...]] = {}
        self.fast = 0  # blobs encoded here, and ...
        self.slow = 0  # ... by memory.encode (the reference path)

    def encode(self, step: int, owner: int, tree: Any, meta: dict[str, Any] | None = None) -> bytearray:
        """``memory.encode(step, owner, tree, meta)``."""
        got = self.parts(step, owner, tree, meta)
        return got if isinstance(got, bytearray) else memory.assemble(step, owner, *got)

    def parts(self, step: int, owner: int, tree: Any,
              meta: dict[str, Any] | None = None) -> tuple[bytes, list[memoryview]] | bytearray:
        """The blob's header and its tensors' bytes (``memory.assemble``'s ``head`` and ``raws``:
        the tensors' own memory, to be framed before they change), or, outside the fast path,
        the whole blob."""
        try:
            text, raws, leaves = self._walk(tree)
        except _Slow:
            self.slow += 1
            return memory.encode(step, owner, tree, meta)
        self.fast += 1
        if leaves != self._leaves:
            self._leaves = leaves
            self._leaves_json = _JSON.encode([{"kind": k, "dtype": d, "shape": s, "nbytes": n, "itemsize": i}
                                              for k, d, s, n, i in leaves])
        # The digests are hex strings: their JSON is their text in quotes.
        digests = '","'.join([fast_digest(r) for r in raws])
        head = (f'{_HEAD_START}{int(step)},"owner":{int(owner)},"meta":{_JSON.encode(meta or {})},'
                f'"skeleton":{text},"leaves":{self._leaves_json},'
                f'"digests":{f"[{_Q}{digests}{_Q}]" if raws else "[]"}}}').encode()
        return head, raws

    def _walk(self, tree: Any) -> tuple[str, list[memoryview], list[tuple[Any, ...]]]:
        """``state.flatten``'s skeleton as its JSON text (written as the walk goes: no skeleton
        objects and no second pass over them), each tensor's bytes (a flat uint8 view), the
        leaves as (kind, dtype, shape, nbytes, itemsize)."""
        raws: list[memoryview] = []
        leaves: list[tuple[Any, ...]] = []
        ints = self._ints
        spliced = 0  # the long int lists seen so far this walk (their place in the tree)
        tensors = self._tensors
        strs = self._strs
        if len(strs) > _MAX_STRS:  # a tree whose keys change every step: not kept for ever
            strs.clear()
        refs = self._refs
        # This walk's tensors only: one no longer in the tree is let go (with its memory).
        seen: dict[int, tuple[Any, ...]] = {}

        def ref(tag: str) -> str:
            """The node of the leaf just added, ``{"T":i}`` or ``{"N":i}``."""
            i, made = len(raws) - 1, refs[tag]
            while len(made) <= i:
                made.append(f'{{"{tag}":{len(made)}}}')
            return made[i]

        def tensor(obj: Any) -> tuple[tuple[Any, ...], memoryview]:
            """A tensor's leaf and flat bytes; a view of its own memory is kept (``seen``)."""
            # A tensor over the same memory as one of the last blob's (a workload's state_dict()
            # returns its parameters and optimizer state themselves, or detached views of them):
            # the same bytes, while the shape, dtype and layout are the same, so the leaf and byte
            # view kept then (numpy() alone is 1 us a tensor). Exact: the kept view holds that
            # memory, so no other tensor can have been allocated there.
            ptr = obj.data_ptr()
            have = tensors.get(ptr)
            if (have is not None and obj.dtype is have[0] and obj.shape == have[1] and obj.is_cpu
                    and obj.is_contiguous() and not obj.is_neg()):  # (a square transpose_ keeps pointer and shape)
                seen[ptr] = have
                return have[2], have[3]
            name = _dtype_name(obj.dtype)
            if name is None:
                raise _Slow
            try:
                arr = obj.numpy()  # a view: CPU, no grad, a dtype numpy has, no conj/neg bit
            except Exception:  # a device tensor, one that needs grad, bfloat16...: the reference's copy
                flat = memory._raw_bytes(obj)
                return ("torch", name, list(obj.shape), flat.nbytes, obj.element_size()), memoryview(flat)
            leaf = ("torch", name, list(arr.shape), arr.nbytes, arr.itemsize)
            try:
                raw = memoryview(arr).cast("B")
            except TypeError:  # not C-contiguous, or empty: a contiguous copy, flat bytes
                return leaf, memoryview(np.ascontiguousarray(arr).reshape(-1).view(np.uint8))
            # a view of the tensor's own memory (not a copy): kept for the next blob
            if raw.nbytes and not obj.dtype.is_complex:  # (a conjugate view shares memory)
                seen[ptr] = (obj.dtype, obj.shape, leaf, raw)
            return leaf, raw

        def jstr(value: str) -> str:
            """A string's JSON (a key, mostly), kept."""
            j = strs.get(value)
            if j is None:
                j = strs[value] = _encode_str(value)
            return j

        def walk(obj: Any) -> str:
            nonlocal spliced
            t = type(obj)
            if t is str:
                return jstr(obj)
            if t is int:
                return int.__repr__(obj)
            if t is float:
                return float.__repr__(obj) if obj - obj == 0.0 else _JSON.encode(obj)  # NaN, +-Infinity
            if obj is None:
                return "null"
            if t is bool:
                return "true" if obj else "false"
            if t in _DICTS:
                parts = []
                made = refs["T"]
                for key, v in obj.items():
                    tk = type(key)
                    if tk is str:
                        kj = strs.get(key)
                        if kj is None:
                            kj = jstr(key)
                    elif tk is int:
                        kj = int.__repr__(key)
                    else:
                        raise _Slow
                    if type(v) in _TENSORS:
                        # A state_dict's tensors, inline: walk(), tensor() and ref() as calls were
                        # two thirds of the PPO learner's walk (49 tensors of 53 entries; session 28).
                        ptr = v.data_ptr()
                        have = tensors.get(ptr)
                        if (have is not None and v.dtype is have[0] and v.shape == have[1] and v.is_cpu
                                and v.is_contiguous() and not v.is_neg()):  # as tensor()'s kept view
                            seen[ptr] = have
                            leaves.append(have[2])
                            raws.append(have[3])
                        else:
                            leaf, raw = tensor(v)
                            leaves.append(leaf)
                            raws.append(raw)
                        i = len(raws) - 1
                        parts.append(f"[{kj},{made[i] if i < len(made) else ref('T')}]")
                    else:
                        parts.append(f"[{kj},{walk(v)}]")
                return '{"D":[' + ",".join(parts) + "]}"
            if t in _TENSORS:
                leaf, raw = tensor(obj)
                leaves.append(leaf)
                raws.append(raw)
                return ref("T")
            if t is list or t is tuple:
                tag = "L" if t is list else "U"
                types = set(map(type, obj))
                if not types <= _SCALARS:
                    return '{"' + tag + '":[' + ",".join([walk(v) for v in obj]) + "]}"
                if len(obj) < KEEP_INTS_FROM or types != _INTS:
                    # Plain scalars only (a run's recent returns, a param group's betas): json's
                    # C encoder writes them as the walk would, one call instead of one per value.
                    return '{"' + tag + '":' + _JSON.encode(obj) + "}"
                # Python's RNG state (625 ints): its JSON kept by its place among the long int
                # lists, reused while a copy of it compares equal (every element an exact int,
                # just checked: equal means the same text).
                k, spliced = spliced, spliced + 1
                have = ints.get(k)
                # an equal list (or tuple) of ints encodes the same; the same tuple (Python's RNG
                # state while unchanged: runtime/ckpt/python_rng.py) without comparing its ints
                if have is None or (have[0] is not obj and have[0] != obj):
                    # A copy of a list (the caller may change it in place); a tuple cannot change.
                    have = ints[k] = (list(obj) if t is list else obj, _JSON.encode({tag: obj}))
                return have[1]
            if t is np.ndarray:
                if obj.dtype.hasobject:
                    raise _Slow
                arr = np.ascontiguousarray(obj)  # as state.flatten: a 0-d array becomes (1,)
                raws.append(memoryview(arr.reshape(-1).view(np.uint8)) if arr.size else memoryview(b""))
                leaves.append(("numpy", arr.dtype.str, list(arr.shape), arr.nbytes, arr.dtype.itemsize))
                return ref("N")
            raise _Slow

        text = walk(tree)
        self._tensors = seen
        return text, raws, leaves


