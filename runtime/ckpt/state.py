"""A training state as JSON plus raw tensors, and the RNG states that go with it.

Why not pickle: loading a checkpoint must never execute code. The state tree
(dicts with str/int keys, lists, tuples, JSON scalars, torch tensors, numpy
arrays) becomes a JSON skeleton whose tensor leaves point into a flat tensor
list; tensors travel as raw bytes with dtype/shape metadata.

Skeleton nodes: JSON scalars stand for themselves; ``{"T": i}`` tensor,
``{"N": i}`` numpy array, ``{"L": [...]}`` list, ``{"U": [...]}`` tuple,
``{"D": [[key, value], ...]}`` dict (keys keep their str/int type).
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from hetrun.runtime.tensor_dtypes import TORCH_DTYPES as _TORCH_DTYPES

from hetrun.errors import CheckpointError

from .numpy_rng import legacy_state
from .python_rng import state as python_state

_SCALARS = {type(None), bool, int, float, str}


@dataclass
class Leaf:
    """A tensor leaf: where it sits in the flat list and how to rebuild it."""

    kind: str  # "torch" | "numpy"
    dtype: str
    shape: list[int]
    nbytes: int
    itemsize: int


class _Unstorable(Exception):
    """A value ``flatten`` cannot store: the message, and the path to it, built as the
    exception rises (``flatten`` runs every memory snapshot: no path strings on the way down)."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message, self.hint, self.keys = message, hint, []


# torch.dtype -> its name in the leaf ("float32"), or None when the store cannot hold it.
_DTYPE_NAMES: dict[Any, str | None] = {}


def _dtype_name(dtype: Any) -> str | None:
    name = _DTYPE_NAMES.get(dtype, "")
    if name == "":
        name = str(dtype).removeprefix("torch.")
        name = _DTYPE_NAMES[dtype] = name if name in _TORCH_DTYPES else None
    return name


def flatten(state: Any) -> tuple[Any, list[torch.Tensor], list[Leaf]]:
    """(skeleton, tensors as contiguous CPU-or-device torch tensors, leaf metadata)."""
    tensors: list[torch.Tensor] = []
    leaves: list[Leaf] = []

    def walk(obj: Any) -> Any:
        if obj is None or isinstance(obj, (bool, int, float, str)):
            return obj
        # A list or tuple of plain scalars (Python's RNG state: 625 ints) is its own skeleton:
        # taken whole, not walked one element at a time (the walk was most of a memory
        # snapshot's encode for a small model). Exact types: a subclass (an IntEnum) walks.
        if type(obj) in (list, tuple) and set(map(type, obj)) <= _SCALARS:
            return {"L" if type(obj) is list else "U": list(obj)}
        if isinstance(obj, torch.Tensor):
            t = obj.detach()
            if t.is_conj() or t.is_neg():
                # A conjugate or negative view: its memory holds the values before the conjugation
                # or negation, and the writers copy memory. The values themselves, resolved.
                t = t.resolve_conj().resolve_neg()
            name = _dtype_name(t.dtype)
            if name is None:
                raise _Unstorable(f"tensor dtype {t.dtype} is not supported")
            size = t.element_size()
            leaves.append(Leaf("torch", name, list(t.shape), t.numel() * size, size))
            tensors.append(t)
            return {"T": len(tensors) - 1}
        if isinstance(obj, np.ndarray):
            if obj.dtype.hasobject:
                raise _Unstorable("numpy object arrays cannot be stored without pickle")
            arr = np.ascontiguousarray(obj)
            leaves.append(Leaf("numpy", arr.dtype.str, list(arr.shape), arr.nbytes, arr.dtype.itemsize))
            tensors.append(torch.from_numpy(arr.reshape(-1).view(np.uint8)) if arr.size else torch.empty(0, dtype=torch.uint8))
            return {"N": len(tensors) - 1}
        if isinstance(obj, np.generic):
            return walk(obj.item())
        if isinstance(obj, dict):
            items = []
            for k, v in obj.items():
                if isinstance(k, bool) or not isinstance(k, (str, int)):
                    raise _Unstorable(f"dict key {k!r} of type {type(k).__name__} is not supported",
                                      "use str or int keys in state_dict()")
                try:
                    items.append([k, walk(v)])
                except _Unstorable as exc:
                    exc.keys.append(k)
                    raise
            return {"D": items}
        if isinstance(obj, (list, tuple)):
            out = []
            for i, v in enumerate(obj):
                try:
                    out.append(walk(v))
                except _Unstorable as exc:
                    exc.keys.append(i)
                    raise
            return {"L" if isinstance(obj, list) else "U": out}
        raise _Unstorable(f"value of type {type(obj).__name__} cannot be stored without pickle",
                          "state_dict() may hold tensors, numpy arrays, dicts, lists, tuples and JSON scalars")

    try:
        return walk(state), tensors, leaves
    except _Unstorable as exc:
        path = "".join(f"[{k!r}]" for k in reversed(exc.keys))
        raise CheckpointError(f"state{path}: {exc.message}", hint=exc.hint) from None


def leaf_from_doc(doc: Any, where: str) -> Leaf:
    try:
        leaf = Leaf(str(doc["kind"]), str(doc["dtype"]), [int(x) for x in doc["shape"]],
                    int(doc["nbytes"]), int(doc["itemsize"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{where}: malformed tensor entry; corrupt") from exc
    if leaf.kind == "torch" and leaf.dtype not in _TORCH_DTYPES:
        raise CheckpointError(f"{where}: unknown torch dtype {leaf.dtype!r}")
    if leaf.kind == "numpy":
        dt = np.dtype(leaf.dtype)
        if dt.hasobject:
            raise CheckpointError(f"{where}: numpy object dtype rejected")
    elif leaf.kind != "torch":
        raise CheckpointError(f"{where}: unknown tensor kind {leaf.kind!r}")
    return leaf


def empty_for(leaf: Leaf) -> tuple[Any, np.ndarray]:
    """A fresh tensor/array for ``leaf`` and a uint8 numpy view of its bytes to decode into."""
    if leaf.kind == "torch":
        t = torch.empty(leaf.shape, dtype=_TORCH_DTYPES[leaf.dtype])
        if t.numel() * t.element_size() != leaf.nbytes:
            raise CheckpointError(f"tensor {leaf.shape} {leaf.dtype} does not hold {leaf.nbytes} bytes; corrupt")
        raw = t.reshape(-1).view(torch.uint8).numpy() if leaf.nbytes else np.empty(0, np.uint8)
        return t, raw
    arr = np.empty(leaf.shape, dtype=np.dtype(leaf.dtype))
    if arr.nbytes != leaf.nbytes:
        raise CheckpointError(f"array {leaf.shape} {leaf.dtype} does not hold {leaf.nbytes} bytes; corrupt")
    return arr, arr.reshape(-1).view(np.uint8)


def targets_in(skeleton: Any, into: Any) -> dict[int, Any]:
    """The leaves of a stored ``skeleton`` that ``into`` (a live state of the
    same structure, e.g. the workload's ``state_dict()``) holds at the same
    place: leaf index -> the tensor or array there. Places that differ are
    left out; :func:`view_of` then decides whether a target fits."""
    found: dict[int, Any] = {}

    def walk(node: Any, target: Any) -> None:
        if not (isinstance(node, dict) and len(node) == 1):
            return
        (tag, body), = node.items()
        if tag in ("T", "N") and isinstance(body, int):
            found[body] = target
        elif tag == "D" and isinstance(body, list) and isinstance(target, dict):
            for item in body:
                if isinstance(item, list) and len(item) == 2 and isinstance(item[0], (str, int)) and item[0] in target:
                    walk(item[1], target[item[0]])
        elif tag in ("L", "U") and isinstance(body, list) and isinstance(target, (list, tuple)) \
                and len(target) == len(body):
            for v, t in zip(body, target, strict=True):
                walk(v, t)

    walk(skeleton, into)
    return found


def view_of(leaf: Leaf, target: Any) -> tuple[Any, np.ndarray] | None:
    """``target`` and a uint8 view of its bytes, when the stored ``leaf`` can be
    decoded straight into it (a CPU, contiguous tensor or a writable C-ordered
    array of the same dtype and shape); else None (decode into fresh memory)."""
    if leaf.nbytes == 0:
        return None
    if leaf.kind == "torch" and isinstance(target, torch.Tensor):
        t = target.detach()
        if (t.device.type != "cpu" or not t.is_contiguous() or str(t.dtype).removeprefix("torch.") != leaf.dtype
                or list(t.shape) != leaf.shape or t.is_conj() or t.is_neg()
                or t.numel() * t.element_size() != leaf.nbytes):
            return None
        return target, t.reshape(-1).view(torch.uint8).numpy()
    if leaf.kind == "numpy" and isinstance(target, np.ndarray):
        if (not target.flags.c_contiguous or not target.flags.writeable or target.dtype.str != leaf.dtype
                or list(target.shape) != leaf.shape or target.nbytes != leaf.nbytes):
            return None
        return target, target.reshape(-1).view(np.uint8)
    return None


def unflatten(skeleton: Any, values: list[Any]) -> Any:
    def walk(node: Any) -> Any:
        if node is None or isinstance(node, (bool, int, float, str)):
            return node
        if isinstance(node, dict) and len(node) == 1:
            (tag, body), = node.items()
            if tag in ("T", "N") and isinstance(body, int) and 0 <= body < len(values):
                return values[body]
            if tag == "L" and isinstance(body, list):
                return [walk(v) for v in body]
            if tag == "U" and isinstance(body, list):
                return tuple(walk(v) for v in body)
            if tag == "D" and isinstance(body, list):
                out = {}
                for item in body:
                    if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], (str, int))):
                        raise CheckpointError("state skeleton: malformed dict item; corrupt")
                    out[item[0]] = walk(item[1])
                return out
        raise CheckpointError("state skeleton: unknown node; corrupt")

    return walk(skeleton)


def seed_global_rngs(seed: int) -> None:
    """Seed python's, numpy's and torch's global generators from ``seed``.

    Python and numpy seed their global generators from OS entropy at import,
    so without this two runs of the same job saved different RNG states (and
    a workload drawing from them was not reproducible). The runtime calls it
    with the rank's seed before the workload is built.
    """
    seed = int(seed) & 0xFFFF_FFFF_FFFF_FFFF
    random.seed(seed)
    np.random.seed(seed & 0xFFFF_FFFF)
    torch.manual_seed(seed)


@functools.cache
def _cuda_available() -> bool:
    """torch.cuda.is_available(), asked once per process: capture_rng runs at every memory
    snapshot (up to every step), and the question cost 0.07 ms after a step's sleep, caches cold
    (benchmarks/node_death.md, session 21); the answer does not change (torch counts the devices once)."""
    return torch.cuda.is_available()


def capture_rng() -> dict[str, Any]:
    """python, numpy and torch (CPU and CUDA) generator states."""
    state: dict[str, Any] = {
        # random.getstate() as [version, internal (a tuple), gauss], read from the generator's
        # memory, the same tuple while the state is unchanged (runtime/ckpt/python_rng.py)
        "python": python_state(),
        # np.random.get_state(legacy=True) as a list, read in ~2 us instead of its ~40 (runtime/ckpt/numpy_rng.py)
        "numpy": legacy_state(),
        "torch": torch.get_rng_state(),
    }
    if _cuda_available():
        state["cuda"] = list(torch.cuda.get_rng_state_all())
    return state


def restore_rng(state: dict[str, Any]) -> None:
    try:
        ver, internal, gauss = state["python"]
        random.setstate((ver, tuple(internal), gauss))
        name, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((name, np.asarray(keys, dtype=np.uint32), int(pos), int(has_gauss), float(cached)))
        torch.set_rng_state(state["torch"])
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(list(state["cuda"]))
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise CheckpointError(f"checkpoint RNG state is malformed ({exc})") from exc
