"""The byte-plane kernel: C path and numpy fallback give the same bytes, and
merge inverts split, with and without the rotation and the XOR base."""

from __future__ import annotations

import numpy as np
import pytest
from hetrun.kernels import byteplanes
from setup_tools import C_COMPILER, needs

native = needs(byteplanes.native() is not None, C_COMPILER)  # without: only the numpy path exists


def _planes(flat: np.ndarray, itemsize: int) -> list[np.ndarray]:
    n = flat.size // itemsize
    return [flat[i * n : (i + 1) * n] for i in range(itemsize)]


@pytest.mark.parametrize("itemsize", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("items", [0, 1, 31, 32, 33, 1000, 4099])
def test_split_merge_round_trip_and_paths_agree(itemsize: int, items: int) -> None:
    rng = np.random.default_rng(items * 10 + itemsize)
    raw = rng.integers(0, 256, items * itemsize, dtype=np.uint8)
    base = rng.integers(0, 256, items * itemsize, dtype=np.uint8)
    for rot in ([False, True] if itemsize in byteplanes.ROTATABLE else [False]):
        for sub in (False, True):
            results = []
            for use_native in ([True, False] if byteplanes.native() else [False]):
                planes = np.empty(raw.size, np.uint8)
                xplanes = np.empty(raw.size, np.uint8)
                byteplanes.split(raw, itemsize, planes, rot=rot, base=base, xplanes=xplanes, sub=sub,
                                 use_native=use_native)
                out = np.empty_like(raw)
                byteplanes.merge(_planes(planes, itemsize), out, rot=rot, use_native=use_native)
                assert out.tobytes() == raw.tobytes()
                if not sub:
                    byteplanes.merge(_planes(xplanes, itemsize), out, rot=rot, use_native=use_native)
                    assert out.tobytes() == (raw ^ base).tobytes()
                else:  # base planes + delta planes (mod 256) give the planes back
                    bplanes = np.empty(raw.size, np.uint8)
                    byteplanes.split(base, itemsize, bplanes, rot=rot, use_native=use_native)
                    assert (bplanes + xplanes).tobytes() == planes.tobytes()
                results.append((planes.tobytes(), xplanes.tobytes()))
            assert all(r == results[0] for r in results)


def test_planes_are_byte_positions_and_rotation_moves_the_exponent() -> None:
    x = np.array([1.0, -2.0, 0.5, -0.25], dtype=np.float32)
    raw = x.view(np.uint8)
    planes = np.empty(raw.size, np.uint8)
    byteplanes.split(raw, 4, planes)
    assert planes[12:].tolist() == [b[3] for b in raw.reshape(4, 4)]  # top byte plane
    byteplanes.split(raw, 4, planes, rot=True)
    exponents = ((x.view(np.uint32) >> 23) & 0xFF).astype(np.uint8)
    signs = (x.view(np.uint32) >> 31).astype(np.uint8)
    assert planes[12:].tolist() == exponents.tolist()
    assert (planes[:4] & 1).tolist() == signs.tolist()


@native
def test_native_kernel_on_large_unaligned_views() -> None:
    rng = np.random.default_rng(7)
    big = rng.integers(0, 256, (1 << 20) + 13, dtype=np.uint8)
    raw = big[1 : 1 + (1 << 20)]  # an odd address: unaligned loads
    a, b = np.empty(raw.size, np.uint8), np.empty(raw.size, np.uint8)
    byteplanes.split(raw, 4, a, rot=True)
    byteplanes.split(raw, 4, b, rot=True, use_native=False)
    assert a.tobytes() == b.tobytes()


def test_bad_arguments_are_rejected() -> None:
    raw = np.zeros(10, np.uint8)
    with pytest.raises(ValueError, match="not splittable"):
        byteplanes.split(raw, 4, np.empty(10, np.uint8))
    with pytest.raises(ValueError, match="not splittable"):
        byteplanes.split(np.zeros(9, np.uint8), 3, np.empty(9, np.uint8), rot=True)
    with pytest.raises(ValueError, match="at least"):
        byteplanes.split(np.zeros(8, np.uint8), 4, np.empty(4, np.uint8))


@pytest.mark.parametrize("itemsize", [1, 2, 4, 8])
@pytest.mark.parametrize("items", [0, 1, 31, 33, 4099])
def test_split_select_writes_each_plane_in_its_chosen_form(itemsize: int, items: int) -> None:
    rng = np.random.default_rng(items + itemsize)
    raw = rng.integers(0, 256, items * itemsize, dtype=np.uint8)
    base = rng.integers(0, 256, items * itemsize, dtype=np.uint8)
    for rot in ([False, True] if itemsize in byteplanes.ROTATABLE else [False]):
        for sub in (False, True):
            plain = np.empty(raw.size, np.uint8)
            delta = np.empty(raw.size, np.uint8)
            byteplanes.split(raw, itemsize, plain, rot=rot, base=base, xplanes=delta, sub=sub, use_native=False)
            for mask in range(1 << itemsize):
                want = np.concatenate([(delta if (mask >> i) & 1 else plain)[i * items : (i + 1) * items]
                                       for i in range(itemsize)]) if items else plain
                for use_native in ([True, False] if byteplanes.native() else [False]):
                    got = np.full(raw.size, 7, np.uint8)
                    byteplanes.split_select(raw, itemsize, base, mask, got, rot=rot, sub=sub, use_native=use_native)
                    assert got.tobytes() == want.tobytes(), (mask, use_native)


def test_estimate_tracks_what_zstd_stores() -> None:
    from hetrun.runtime.ckpt import codec

    rng = np.random.default_rng(5)
    n = 1 << 17
    exponents = np.clip(np.round(rng.normal(120, 2, n)), 0, 255).astype(np.uint8)  # a weight exponent plane
    sparse = np.where(rng.random(n) < 0.08, rng.integers(1, 4, n), 0).astype(np.uint8)  # a delta a few steps later
    seven_bits = (rng.integers(0, 128, n) << 1).astype(np.uint8)  # one bit always zero (a sign)
    noise = rng.integers(0, 256, n, dtype=np.uint8)
    cctx = codec.new_compressor()
    for plane in (exponents, sparse, seven_bits, noise):
        est = byteplanes.estimate(plane)
        stored = min(len(cctx.compress(plane.data)), plane.size)
        assert abs(est - stored) <= 0.15 * plane.size, (est / n, stored / n)
        assert est == pytest.approx(byteplanes.estimate(plane, use_native=False), rel=1e-9)
    assert byteplanes.estimate(noise) == noise.size  # a flat histogram: zstd keeps it raw
    assert byteplanes.estimate(np.zeros(n, np.uint8)) < 16  # one value: an RLE block
    assert byteplanes.estimate(seven_bits) < 0.9 * n


@pytest.mark.parametrize("items", [0, 8, 56, 64, 72, 128, 4104])
def test_sign_split_paths_agree_and_merge_inverts_it(items: int) -> None:
    rng = np.random.default_rng(items)
    raw = rng.integers(0, 256, items * 4, dtype=np.uint8)
    base = rng.integers(0, 256, items * 4, dtype=np.uint8)
    lengths = byteplanes.sign_split_lengths(items)
    assert sum(lengths) == raw.size
    offs = np.cumsum([0, *lengths])
    for mask in (0, 1, 0b00110, 0b10000, 0b11111):
        for sub in (False, True):
            outs = []
            for use_native in ([True, False] if byteplanes.native() else [False]):
                out = np.full(raw.size, 9, np.uint8)
                byteplanes.split_signs(raw, out, base=base, mask=mask, sub=sub, use_native=use_native)
                outs.append(out.tobytes())
            assert all(o == outs[0] for o in outs), (mask, sub)
    plain = np.empty(raw.size, np.uint8)
    byteplanes.split_signs(raw, plain)
    planes = [plain[offs[i] : offs[i + 1]].copy() for i in range(5)]
    for use_native in ([True, False] if byteplanes.native() else [False]):
        back = np.empty_like(raw)
        byteplanes.merge_signs(planes, back, use_native=use_native)
        assert back.tobytes() == raw.tobytes()


def test_sign_split_puts_signs_and_low_bits_where_the_layout_says() -> None:
    x = np.array([1.0, -2.0, 0.5, -0.25, 3.0, -0.0, 7.5, -9.0], dtype=np.float32)
    out = np.empty(32, np.uint8)
    byteplanes.split_signs(x.view(np.uint8), out)
    words = x.view(np.uint32)
    assert out[31] == sum(int(w >> 31) << j for j, w in enumerate(words))  # signs, item j at bit j
    assert out[23:31].tolist() == ((words >> 23) & 0xFF).astype(np.uint8).tolist()  # exponents
    low7 = sum(int(w & 0x7F) << (7 * j) for j, w in enumerate(words))
    assert int.from_bytes(out[:7].tobytes(), "little") == low7
    with pytest.raises(ValueError, match="multiple of 8"):
        byteplanes.split_signs(np.zeros(12, np.uint8), np.empty(12, np.uint8))
