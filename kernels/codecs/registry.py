"""Codecs by name, as the job YAML names them (``comms.forward_codec: int8``)."""

from __future__ import annotations

from collections.abc import Callable

from hetrun.errors import SpecError, closest

from .base import DEFAULT_BLOCK, Codec, NoneCodec
from .lossy import (
    Fp8Codec,
    Int4Codec,
    Int8Codec,
    OneBitCodec,
    OneBitEFCodec,
    OneBitStochasticCodec,
)

__all__ = ["DEFAULT_BACKWARD_CODEC", "DEFAULT_FORWARD_CODEC", "SCALED_CODECS", "codec_names", "get_codec"]

#: Forward activations tolerate 8 bits; backward gradients go 1-bit with error feedback.
DEFAULT_FORWARD_CODEC = "int8"
DEFAULT_BACKWARD_CODEC = "onebit_ef"

_CODECS: dict[str, Callable[..., Codec]] = {
    "none": NoneCodec,
    "onebit": OneBitCodec,
    "onebit_ef": OneBitEFCodec,
    "onebit_stochastic": OneBitStochasticCodec,
    "int8": Int8Codec,
    "int4": Int4Codec,
    "fp8": Fp8Codec,
}


#: Codecs whose block scales can travel as bf16 (``scale_dtype="bf16"``).
SCALED_CODECS = ("onebit", "onebit_ef", "int8", "int4")


def codec_names() -> list[str]:
    return list(_CODECS)


def get_codec(
    name: str, *, block_size: int = DEFAULT_BLOCK, key_path: str | None = None, **options: object
) -> Codec:
    """A new codec instance (error-feedback state lives in the states you pass it).

    ``key_path`` (e.g. ``comms.forward_codec``) only makes the error message
    point at the YAML key the name came from.
    """
    factory = _CODECS.get(name)
    if factory is None:
        guess = closest(str(name), _CODECS)
        hint = f"valid codecs: {', '.join(_CODECS)}"
        if guess:
            hint = f"did you mean {guess!r}? " + hint
        raise SpecError(f"unknown codec {name!r}", key_path=key_path, value=name, hint=hint)
    if name not in SCALED_CODECS and options.pop("scale_dtype", "fp32") != "fp32":
        raise SpecError(
            f"codec {name!r} has no bf16 scale option",
            key_path=key_path, value=name,
            hint=f"bf16 block scales exist for {', '.join(SCALED_CODECS)}; use scale_dtype fp32",
        )
    return factory(block_size=block_size, **options)
