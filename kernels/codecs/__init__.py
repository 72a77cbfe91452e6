"""The compression codecs of ``comms:`` (1-bit, int8, int4, fp8), one wire format per codec.

- ``base``: the ``Codec`` interface, ``Encoded``, ``ErrorFeedbackState``,
  ``NoneCodec`` and ``DEFAULT_BLOCK``.
- ``lossy``: the 1-bit (plain, error feedback, stochastic), int8, int4 and fp8
  codecs; each dispatches on where the tensor lives.
- ``registry``: codecs by the names the job YAML uses (``get_codec``,
  ``codec_names``, ``SCALED_CODECS``).
- ``reference`` (plain PyTorch), ``native`` (single-pass C from
  ``kernels/csrc/codec_simd.c``, built at first use), ``cpu`` (dispatch to C,
  else a cache-blocked numpy path), ``triton_gpu`` (Triton, CUDA): the same
  payload written four ways and tested against each other.

Not to be confused with ``hetrun.runtime.ckpt.codec``, the checkpoint store's
exact chunk encoding. Modules are imported on use; importing this package
loads nothing heavy.
"""
