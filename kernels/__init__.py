"""hetrun.kernels: codecs, fused ops and MoE routing (depends on torch and numpy only).

- ``codecs``: the compression codecs of ``comms:`` in one package: the
  ``Codec`` interface (``codecs.base``), the 1-bit, int8, int4 and fp8 codecs
  (``codecs.lossy``), ``codecs.registry.get_codec``, and their PyTorch
  reference, C, numpy and Triton paths (``codecs.reference``, ``.native``,
  ``.cpu``, ``.triton_gpu``).
- ``fused_ln_linear``: LayerNorm + Linear (+ GELU) with a hand-written backward;
  ``fused_native`` is its single-pass C GELU forward / backward+bias-sum
  (built at first use like the codec library).
- ``native_build``: compile-at-first-use and loading of the C kernels above
  (and ``byteplanes``, the checkpoint store's byte-plane split/merge).
- ``moe_dispatch``: gate + top-k + permute, and the weighted combine.

Modules are imported on use; importing the package loads nothing heavy.
"""
