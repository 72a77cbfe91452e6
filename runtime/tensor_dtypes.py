"""The tensor dtypes hetrun writes by name, in checkpoints and in p2p messages.

One table, so a checkpoint and a message agree on what ``"bfloat16"`` means
and on which dtypes travel at all. Names are torch's without the ``torch.``
prefix; the float8 and wide unsigned types exist only in newer torch builds.
"""

from __future__ import annotations

import torch

TORCH_DTYPES: dict[str, torch.dtype] = {
    str(dt).removeprefix("torch."): dt
    for dt in (
        torch.float64, torch.float32, torch.float16, torch.bfloat16,
        torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool,
        torch.complex64, torch.complex128,
    )
}
for _name in ("float8_e4m3fn", "float8_e5m2", "uint16", "uint32", "uint64"):
    if hasattr(torch, _name):
        TORCH_DTYPES[_name] = getattr(torch, _name)


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"`` (the key of :data:`TORCH_DTYPES`)."""
    return str(dtype).removeprefix("torch.")
