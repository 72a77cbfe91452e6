"""Codecs: the fast CPU path against the PyTorch reference, error bounds, registry."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hetrun.kernels.codecs import cpu as codec_cpu
from hetrun.kernels.codecs import native as codec_native
from hetrun.kernels.codecs import reference as codec_reference
from hetrun.kernels.codecs.base import CodecError
from hetrun.kernels.codecs.registry import codec_names, get_codec
from setup_tools import C_COMPILER, require

from hetrun.errors import SpecError


@pytest.fixture(params=["native", "numpy"], autouse=True)
def cpu_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test runs on both CPU paths: the C kernels and the numpy fallback."""
    if request.param == "numpy":
        monkeypatch.setenv("HETRUN_NATIVE_CODECS", "0")
    elif codec_native.lib() is None:
        require(False, C_COMPILER)  # native codecs not built
    return request.param


# Sizes around block, byte and piece boundaries (CHUNK = one cache-sized piece).
SIZES = [1, 7, 8, 255, 256, 257, 1000, codec_cpu.CHUNK, codec_cpu.CHUNK + 13, 3 * codec_cpu.CHUNK + 517]


def _x(n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * torch.rand(n, generator=g).pow(3) * 10
    if n > 600:
        x[256:512] = 0.0  # an all-zero block: scale 0 must not divide by zero
    return x


@pytest.mark.parametrize("block", [256, 64])
@pytest.mark.parametrize("n", SIZES)
def test_onebit_cpu_matches_reference(n: int, block: int) -> None:
    codec = get_codec("onebit", block_size=block)
    x = _x(n)
    enc = codec.encode(x)
    ref = codec_reference.onebit_encode(x, block)
    nb = codec.num_blocks(n)
    assert enc.payload.numel() == ref.numel() == codec.wire_bytes(n)
    assert torch.equal(enc.payload[4 * nb :], ref[4 * nb :]), "sign bits differ"
    # Block sums may round differently (summation order); 1e-6 relative is that.
    torch.testing.assert_close(
        enc.payload[: 4 * nb].view(torch.float32), ref[: 4 * nb].view(torch.float32), rtol=1e-6, atol=0
    )
    dec = codec.decode(enc)
    assert torch.equal(dec, codec_reference.onebit_decode(enc.payload, n, block))
    # the decoded value keeps the sign and has the block's mean magnitude
    assert torch.equal(torch.signbit(dec), torch.signbit(x) & (dec != 0) | torch.signbit(dec))
    assert bool(((dec >= 0) == (x >= 0)).logical_or(x == 0).all())


@pytest.mark.parametrize("n", SIZES)
def test_int8_cpu_matches_reference_bit_for_bit(n: int) -> None:
    codec = get_codec("int8")
    x = _x(n, seed=1)
    enc = codec.encode(x)
    assert torch.equal(enc.payload, codec_reference.int8_encode(x, 256))
    dec = codec.decode(enc)
    assert torch.equal(dec, codec_reference.int8_decode(enc.payload, n, 256))
    # error at most half a quantisation step of its block
    nb = codec.num_blocks(n)
    step = enc.payload[: 4 * nb].view(torch.float32).repeat_interleave(256)[:n]
    assert bool(((dec - x).abs() <= step / 2 * (1 + 1e-5) + 1e-30).all())


@pytest.mark.parametrize("n", [1, 255, 257, 70000])
def test_fp8_matches_reference(n: int) -> None:
    codec = get_codec("fp8")
    x = _x(n, seed=2)
    enc = codec.encode(x)
    assert torch.equal(enc.payload, codec_reference.fp8_encode(x, 256))
    dec = codec.decode(enc)
    assert torch.equal(dec, codec_reference.fp8_decode(enc.payload, n, 256))
    # e4m3 keeps 3 mantissa bits: relative error <= 2^-4 for normal values
    big = x.abs() > x.abs().max() / 64
    assert bool(((dec - x).abs()[big] <= x.abs()[big] * 2**-4 + 1e-6).all())


def test_error_feedback_carries_the_residual() -> None:
    codec = get_codec("onebit_ef", block_size=128)
    state = codec.new_state()
    g = torch.Generator().manual_seed(3)
    n = 5000
    total_in = torch.zeros(n)
    total_out = torch.zeros(n)
    for _ in range(50):
        x = torch.randn(n, generator=g)
        enc = codec.encode(x, state)
        total_in += x
        total_out += codec.decode(enc)
    # sum(decoded) = sum(inputs) - final residual, exactly up to rounding
    assert state.residual is not None
    torch.testing.assert_close(total_out + state.residual, total_in, rtol=1e-4, atol=1e-3)
    # and the residual stays bounded instead of growing with the number of steps
    assert float(state.residual.abs().max()) < 10.0
    # without feedback the same stream drifts much further
    plain = get_codec("onebit", block_size=128)
    g = torch.Generator().manual_seed(3)
    drift = torch.zeros(n)
    for _ in range(50):
        x = torch.randn(n, generator=g)
        drift += x - plain.decode(plain.encode(x))
    assert float(drift.abs().mean()) > 3 * float(state.residual.abs().mean())


@pytest.mark.parametrize("block", [256, 8192])  # 8192: too big for the C kernel's stack buffer
def test_error_feedback_matches_reference_step(block: int) -> None:
    codec = get_codec("onebit_ef", block_size=block)
    state = codec.new_state()
    x0, x1 = _x(3000, 4), _x(3000, 5)
    codec.encode(x0, state)
    r0 = state.residual.clone()
    enc = codec.encode(x1, state)
    c = x1 + r0
    ref = codec_reference.onebit_encode(c, block)
    nb = codec.num_blocks(3000)
    assert torch.equal(enc.payload[4 * nb :], ref[4 * nb :])
    torch.testing.assert_close(state.residual, c - codec.decode(enc), rtol=0, atol=1e-6)


def test_error_feedback_state_survives_size_change() -> None:
    codec = get_codec("onebit_ef")
    state = codec.new_state()
    codec.encode(_x(1000), state)
    kept = state.residual[:600].clone()
    codec.encode(torch.zeros(600), state)  # zeros + residual: what is encoded is the residual
    assert state.residual.numel() == 600
    codec.encode(_x(2000), state)
    assert state.residual.numel() == 2000
    assert kept.abs().sum() > 0


@pytest.mark.parametrize("block", [64, 256])
@pytest.mark.parametrize("n", SIZES)
def test_bf16_scales_match_reference(n: int, block: int) -> None:
    """bf16 block scales: int8 bit for bit; 1-bit signs exact, scales within one bf16 ulp
    (block sums in another order), and decode/error feedback consistent with the payload."""
    x = _x(n, seed=8)
    nb = -(-n // block)
    i8 = get_codec("int8", block_size=block, scale_dtype="bf16")
    enc = i8.encode(x)
    assert enc.nbytes == 2 * nb + n == i8.wire_bytes(n)
    assert torch.equal(enc.payload, codec_reference.int8_encode(x, block, bf16=True))
    dec = i8.decode(enc)
    assert torch.equal(dec, codec_reference.int8_decode(enc.payload, n, block, bf16=True))
    step = enc.payload[: 2 * nb].view(torch.int16).int().__lshift__(16).view(torch.float32)
    step = step.repeat_interleave(block)[:n]
    assert bool(((dec - x).abs() <= step / 2 * (1 + 1e-5) + 1e-30).all()), "half a step at most"

    ob = get_codec("onebit_ef", block_size=block, scale_dtype="bf16")
    state = ob.new_state()
    r0 = _x(n, seed=9) * 0.1
    state.residual = r0.clone()
    enc = ob.encode(x, state)
    c = x + r0
    expect = codec_reference.onebit_encode(c, block, bf16=True)
    assert enc.nbytes == 2 * nb + (n + 7) // 8
    assert torch.equal(enc.payload[2 * nb :], expect[2 * nb :]), "sign bits differ"
    got_s = enc.payload[: 2 * nb].view(torch.int16).int()
    assert bool(((got_s - expect[: 2 * nb].view(torch.int16).int()).abs() <= 1).all())
    decoded = ob.decode(enc)
    assert torch.equal(decoded, codec_reference.onebit_decode(enc.payload, n, block, bf16=True))
    torch.testing.assert_close(state.residual, c - decoded, rtol=0, atol=1e-5)


@pytest.mark.parametrize("scale_dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("n", [1, 7, 64, 1001, 70001])
def test_int4_round_trip(n: int, scale_dtype: str) -> None:
    """Two values per byte, -7..7 around a block scale: at most half a step off, sizes exact."""
    codec = get_codec("int4", block_size=64, scale_dtype=scale_dtype)
    x = _x(n, seed=12)
    enc = codec.encode(x)
    nb = -(-n // 64)
    sb = 2 if scale_dtype == "bf16" else 4
    assert enc.nbytes == codec.wire_bytes(n) == sb * nb + (n + 1) // 2
    dec = codec.decode(enc)
    if scale_dtype == "bf16":
        sc = (enc.payload[: 2 * nb].view(torch.int16).int() << 16).view(torch.float32)
    else:
        sc = enc.payload[: 4 * nb].view(torch.float32)
    step = sc.repeat_interleave(64)[:n]
    assert bool(((dec - x).abs() <= step / 2 * (1 + 1e-5) + 1e-30).all())
    nib = enc.payload[sb * nb :]
    q = torch.stack([nib & 15, nib >> 4], dim=1).reshape(-1)[:n]
    assert int(q.min()) >= 1 and int(q.max()) <= 15, "stored as q + 8 with q in -7..7"
    if n > 600:
        assert bool((dec[256:512] == 0).all()), "an all-zero block decodes to zeros"
    # the C kernel (native) and the PyTorch path (numpy param) write the reference's bytes
    assert torch.equal(enc.payload, codec_reference.int4_encode(x, 64, bf16=scale_dtype == "bf16"))
    assert torch.equal(dec, codec_reference.int4_decode(enc.payload, n, 64, bf16=scale_dtype == "bf16"))
    ties = torch.tensor([0.5, -1.5, 2.5, 7.0, -7.0, 3.5, 0.0, -0.0] * 8)  # rint ties to even
    te = codec.encode(ties)
    assert torch.equal(te.payload, codec_reference.int4_encode(ties, 64, bf16=scale_dtype == "bf16"))


def test_scale_dtype_is_checked() -> None:
    with pytest.raises(CodecError, match="scale_dtype 'fp16'"):
        get_codec("int8", scale_dtype="fp16")
    assert get_codec("onebit", block_size=64, scale_dtype="bf16").wire_bytes(640) == 20 + 80


def _native_only(cpu_path: str) -> None:
    if cpu_path != "native":
        pytest.skip("tests the C kernel's cast on its own")


def _fp8_cast_equal(bits: np.ndarray) -> None:
    """The C cast (vector body and scalar tail) of these float32 bit patterns vs torch's."""
    x = bits.astype(np.uint32).view(np.float32)
    got = np.empty(x.size, dtype=np.uint8)
    codec_native.fp8_e4m3_saturate(x, got)
    ref = torch.from_numpy(x).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    bad = np.nonzero(got != ref)[0]
    assert bad.size == 0, [(hex(int(bits[i])), int(got[i]), int(ref[i])) for i in bad[:5]]


def test_fp8_cast_is_torchs_on_a_dense_sample(cpu_path: str) -> None:
    """Round to nearest even, subnormals, +-0, inf, NaN and the saturation edge, bit for bit."""
    _native_only(cpu_path)
    every_4096th = np.arange(0, 1 << 32, 4093, dtype=np.uint64)  # odd stride: all low-bit mixes
    # every pattern whose magnitude lies in fp8's range and its rounding neighbourhood
    # (2^-11 .. 512: subnormals, ties, the 448/464/480 edges), both signs
    near = np.arange(0x3A000000, 0x44000001, 61, dtype=np.uint64)
    ties = (np.arange(0x3A0, 0x440, dtype=np.uint64) << 20)[:, None] + np.array(
        [0x7FFFF, 0x80000, 0x80001, 0xFFFFF, 0x100000], dtype=np.uint64
    )
    special = np.array([0, 0x7F800000, 0x7FC00000, 0x7F800001, 0x00000001, 0x007FFFFF,
                        0x43E00000, 0x43E80000, 0x43F00000, 0x43EFFFFF], dtype=np.uint64)
    pos = np.concatenate([every_4096th, near, ties.reshape(-1), special])
    _fp8_cast_equal(np.concatenate([pos, pos ^ np.uint64(0x80000000)]))


@pytest.mark.slow
def test_fp8_cast_is_torchs_on_every_float_of_its_range(cpu_path: str) -> None:
    """Every float32 pattern of magnitude 2^-11 .. 512, both signs (outside it the cast
    is constant: 0, the +-448 saturation or NaN, which the dense sample covers).
    ``HETRUN_FP8_FULL_SWEEP=1`` sweeps all 2^32 patterns instead (about 2 minutes)."""
    import os

    _native_only(cpu_path)
    chunk = 1 << 24
    if os.environ.get("HETRUN_FP8_FULL_SWEEP") == "1":
        ranges = [(0, 1 << 32)]
    else:
        ranges = [(0x3A000000, 0x44000000), (0xBA000000, 0xC4000000)]
    for lo, hi in ranges:
        for start in range(lo, hi, chunk):
            _fp8_cast_equal(np.arange(start, min(hi, start + chunk), dtype=np.uint64))


@pytest.mark.parametrize("block", [256, 64])
@pytest.mark.parametrize("n", SIZES)
def test_stochastic_matches_reference_bit_for_bit(n: int, block: int) -> None:
    """C, numpy and torch draw the same counter-based numbers: the same payload per seed and call."""
    x = _x(n, seed=5)
    codec = get_codec("onebit_stochastic", block_size=block, seed=3)
    first, second = codec.encode(x).payload, codec.encode(x).payload
    from hetrun.kernels.codecs.lossy import stochastic_keys

    assert torch.equal(first, codec_reference.onebit_stochastic_encode(x, block, *stochastic_keys(3, 0)))
    assert torch.equal(second, codec_reference.onebit_stochastic_encode(x, block, *stochastic_keys(3, 1)))
    again = get_codec("onebit_stochastic", block_size=block, seed=3)
    assert torch.equal(again.encode(x).payload, first), "same seed, same call: same draws"
    if n >= 1000:
        nb = codec.num_blocks(n)
        assert not torch.equal(first[4 * nb :], second[4 * nb :]), "each call draws anew"


def test_stochastic_uniform24_is_uniform() -> None:
    u = codec_reference.stochastic_uniform24(1 << 16, 123, 456).numpy()
    assert u.min() >= 0 and u.max() < 1 << 24
    hist = np.bincount(u >> 20, minlength=16)  # 16 buckets of 4096 expected
    assert hist.min() > 3600 and hist.max() < 4600
    # consecutive draws uncorrelated
    f = u.astype(np.float64) / (1 << 24) - 0.5
    assert abs(float(np.mean(f[1:] * f[:-1]))) < 0.005


def test_stochastic_is_unbiased() -> None:
    codec = get_codec("onebit_stochastic", seed=11)
    x = _x(512, seed=6)
    acc = torch.zeros_like(x)
    reps = 4000
    for _ in range(reps):
        acc += codec.decode(codec.encode(x))
    mean = acc / reps
    amax = x.abs().reshape(2, 256).amax(dim=1).repeat_interleave(256)
    # std of one draw <= M, so the mean of 4000 is within ~5 sigma = 5 M / sqrt(4000)
    assert bool(((mean - x).abs() <= 5 * amax / reps**0.5).all())
    one = codec.decode(codec.encode(x))
    assert torch.equal(one.abs(), amax), "each decoded value is +-block absmax"


def test_bf16_input_and_shapes() -> None:
    for name in codec_names():
        codec = get_codec(name, **({"itemsize": 2} if name == "none" else {}))
        x = torch.randn(3, 700, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16)
        dec = codec.decode(codec.encode(x))
        assert dec.shape == x.shape and dec.dtype == torch.bfloat16
        if codec.exact:
            assert torch.equal(dec, x)
        else:
            # gaussian data: sign codes lose ~0.6 of the norm (stochastic ~3x more), 8-bit ~1%
            bound = {"onebit_stochastic": 5.0, "int8": 0.02, "fp8": 0.05}.get(name, 0.7)
            assert float((dec.float() - x.float()).norm() / x.float().norm()) < bound, name


def test_wire_sizes() -> None:
    n = 1 << 20
    assert get_codec("none").wire_bytes(n) == 4 * n
    assert get_codec("onebit").ratio(n) == pytest.approx(32 / (1 + 32 / 256), rel=1e-3)  # 28.4x
    assert get_codec("int8").ratio(n) == pytest.approx(4 / (1 + 4 / 256), rel=1e-3)
    assert get_codec("onebit", block_size=1024).wire_bytes(n) == n // 8 + 4 * n // 1024
    assert get_codec("int8").wire_bytes(0) == 0


def test_registry_errors_name_the_key_and_the_fix() -> None:
    with pytest.raises(SpecError) as err:
        get_codec("int9", key_path="comms.forward_codec")
    msg = str(err.value)
    assert "comms.forward_codec" in msg and "'int9'" in msg and "int8" in msg
    assert "onebit_ef" in msg  # the valid list
    with pytest.raises(CodecError, match="multiple of 8"):
        get_codec("onebit", block_size=100)


def test_bad_payload_size_is_a_clear_error() -> None:
    codec = get_codec("int8")
    enc = codec.encode(torch.ones(100))
    enc.payload = enc.payload[:-1]
    with pytest.raises(CodecError, match="payload has 103 bytes, 104 expected"):
        codec.decode(enc)
    with pytest.raises(CodecError, match="cannot encode"):
        codec.encode(torch.ones(4, dtype=torch.int32))


def test_cpu_path_never_allocates_full_size_temporaries(monkeypatch: pytest.MonkeyPatch) -> None:
    """The numpy path works in place: its scratch stays one piece long whatever the input."""
    monkeypatch.setenv("HETRUN_NATIVE_CODECS", "0")
    n = 4 * codec_cpu.CHUNK
    x = np.random.default_rng(0).standard_normal(n, dtype=np.float32)
    out = np.empty(get_codec("onebit").wire_bytes(n), dtype=np.uint8)
    codec_cpu.onebit_encode(x, out, 256)
    assert codec_cpu._scratch.f32a.size == codec_cpu.CHUNK


def test_native_build_falls_back_without_a_compiler(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    monkeypatch.setattr(codec_native, "_native", codec_native._native.fresh())  # try the build again
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("HETRUN_KERNEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("HETRUN_NATIVE_CODECS", raising=False)
    assert codec_native.lib() is None
    assert list((tmp_path / "cache").iterdir()) == []  # no half-built library left behind
    codec = get_codec("onebit")  # still works, on the numpy path
    enc = codec.encode(_x(1000))
    assert torch.equal(codec.decode(enc), codec_reference.onebit_decode(enc.payload, 1000, 256))
