"""One-shot zstd decompression into a caller's buffer (libzstd through ctypes).

Frames come from python-zstandard, the library the checkpoint writer uses, so
these check that the two libraries agree byte for byte, and that a damaged or
oversized frame is refused rather than decoded into a wrong or overrun buffer.
"""

from __future__ import annotations

import numpy as np
import pytest
import zstandard
from hetrun.runtime.ckpt import codec, zstd_direct
from setup_tools import LIBZSTD, needs

pytestmark = needs(zstd_direct.available(), LIBZSTD)


def _plane(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    # An exponent-like plane: a few values, skewed, plus runs.
    vals = rng.choice(np.arange(118, 128, dtype=np.uint8), size=n, p=np.linspace(1, 10, 10) / 55)
    vals[n // 3 : n // 3 + 5000] = 0
    return vals


@pytest.mark.parametrize("n", [1, 4096, 1 << 20, (1 << 20) + 7])
def test_decodes_what_python_zstandard_encoded(n: int) -> None:
    src = _plane(n, n)
    frame = codec.new_compressor().compress(src.data)
    out = np.full(n, 0xAA, dtype=np.uint8)
    got = zstd_direct.DirectDecompressor().decompress_into(memoryview(frame), out)
    assert got == n
    assert np.array_equal(out, src)


def test_reads_from_a_read_only_mapping_like_view(tmp_path) -> None:
    import mmap

    src = _plane(300_000)
    f = tmp_path / "obj"
    f.write_bytes(b"HEAD" + zstandard.ZstdCompressor(level=3).compress(src.data))
    with open(f, "rb") as fh:
        m = mmap.mmap(fh.fileno(), 0, prot=mmap.PROT_READ)
        view = memoryview(m)[4:]
        out = np.empty(src.size, dtype=np.uint8)
        assert zstd_direct.DirectDecompressor().decompress_into(view, out) == src.size
        del view
        m.close()
    assert np.array_equal(out, src)


def test_refuses_a_frame_larger_than_the_buffer() -> None:
    src = _plane(100_000)
    frame = codec.new_compressor().compress(src.data)
    out = np.zeros(src.size + 64, dtype=np.uint8)
    guard = out[src.size - 10 :].copy()
    with pytest.raises(ValueError, match=r"(?i)too small|dst"):
        zstd_direct.DirectDecompressor().decompress_into(memoryview(frame), out[: src.size - 10])
    assert np.array_equal(out[src.size - 10 :], guard)  # nothing written past the end


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_refuses_a_damaged_frame(damage: str) -> None:
    src = _plane(200_000)
    frame = bytearray(zstandard.ZstdCompressor(level=3, write_checksum=True).compress(src.data))
    if damage == "flip":
        frame[len(frame) // 2] ^= 0x40
    else:
        del frame[-20:]
    out = np.empty(src.size, dtype=np.uint8)
    with pytest.raises(ValueError):
        zstd_direct.DirectDecompressor().decompress_into(memoryview(bytes(frame)), out)


def test_codec_decode_plane_uses_it_and_checks_the_length() -> None:
    from hetrun.errors import CheckpointError

    src = _plane(50_000)
    z = codec.new_compressor().compress(src.data)
    direct = zstd_direct.DirectDecompressor()
    target = np.empty(src.size, dtype=np.uint8)
    plane = codec.decode_plane(memoryview(z), "z", len(z), src.size, None,
                               decompressor=zstandard.ZstdDecompressor(), target=target, direct=direct)
    assert np.array_equal(plane, src)
    short = codec.new_compressor().compress(src[:-1].data)
    with pytest.raises(CheckpointError, match="corrupt"):
        codec.decode_plane(memoryview(short), "z", len(short), src.size, None,
                           decompressor=zstandard.ZstdDecompressor(), target=target, direct=direct)


def test_direct_compressor_frames_decode_with_python_zstandard_too() -> None:
    """Objects written through libzstd must restore where only python-zstandard is there."""
    for n, seed in ((1, 0), (70_000, 1), (1 << 20, 2)):
        src = _plane(n, seed)
        for acc in (1, 1024):
            frame = zstd_direct.DirectCompressor(acceleration=acc).compress(src.data)
            assert zstandard.ZstdDecompressor().decompress(frame) == src.tobytes()
            out = np.empty(n, dtype=np.uint8)
            assert zstd_direct.DirectDecompressor().decompress_into(memoryview(frame), out) == n
            assert np.array_equal(out, src)


def test_direct_compressor_keeps_huffman_literals_with_acceleration() -> None:
    """zstd drops literal compression once the fast strategy accelerates, unless
    told not to: an exponent-like plane must still shrink to its entropy."""
    src = _plane(1 << 20)
    accelerated = len(zstd_direct.DirectCompressor(acceleration=1024).compress(src.data))
    assert accelerated < 0.5 * src.size, accelerated  # ~3.2 bits of entropy per byte


def test_compress_into_a_buffer_gives_the_same_frame() -> None:
    rng = np.random.default_rng(3)
    plane = np.minimum(rng.geometric(0.4, 200_000), 255).astype(np.uint8)
    c = zstd_direct.DirectCompressor()
    buf = np.empty(c.bound(plane.size), np.uint8)
    n = c.compress_into(plane.data, buf)
    assert buf[:n].tobytes() == c.compress(plane.data)
    assert zstandard.ZstdDecompressor().decompress(buf[:n].tobytes()) == plane.tobytes()
    with pytest.raises(ValueError, match="bound"):
        c.compress_into(plane.data, np.empty(10, np.uint8))


def test_a_delta_the_sample_overrated_is_stored_as_the_plain_plane(monkeypatch: pytest.MonkeyPatch) -> None:
    """When the sampled estimate chose a delta that then does not shrink, the
    plane is stored plain and raw: restore then needs no base for it."""
    from hetrun.kernels import byteplanes

    rng = np.random.default_rng(8)
    raw = rng.integers(0, 256, 1 << 16, dtype=np.uint8)
    base = rng.integers(0, 256, 1 << 16, dtype=np.uint8)
    monkeypatch.setattr(byteplanes, "estimate", lambda plane, **kw: 0.5 * plane.size)  # an optimistic sample
    enc = codec.encode(raw, 4, base, compressor=codec.new_compressor())
    assert {m for m, _ in enc.planes} == {"r"} and not enc.uses_base
    lay = codec.layout_of(4, raw.size, enc.xf)
    planes = codec.decode_planes(memoryview(b"".join(bytes(p) for p in enc.parts)), lay, enc.planes, None)
    out = np.empty_like(raw)
    lay.merge(planes, out)
    assert out.tobytes() == raw.tobytes()
