"""hetrun.kernels: codecs, fused ops and MoE routing (depends on torch and numpy only).

- ``codec`` / ``codecs`` / ``codec_registry``: the ``Codec`` interface, the
  1-bit (plain, error feedback, stochastic), int8 and fp8 codecs, ``get_codec``.
- ``codec_reference`` (PyTorch), ``codec_native`` (single-pass C, built at
  first use), ``codec_cpu`` (dispatch + cache-blocked numpy fallback),
  ``triton_codecs`` (GPU): the same wire format three ways.
- ``fused_ln_linear``: LayerNorm + Linear (+ GELU) with a hand-written backward;
  ``fused_native`` is its single-pass C GELU forward / backward+bias-sum
  (built at first use like the codec library).
- ``native_build``: compile-at-first-use and loading of the C kernels above
  (and ``byteplanes``, the checkpoint store's byte-plane split/merge).
- ``moe_dispatch``: gate + top-k + permute, and the weighted combine.

Modules are imported on use; importing the package loads nothing heavy.
"""
