/* Byte-plane split and merge for checkpoint chunks (AVX2 for 4-byte items,
 * portable C otherwise).
 *
 * split: planes[p * n + i] = byte p of xf(src[i]).
 * split_select: with a base, plane p is the delta plane where bit p of mask
 *        is set (that byte OP the same byte of xf(base[i]), OP XOR (op 0) or
 *        subtraction mod 256 (op 1)), else the plain plane, in one pass: the
 *        encoder picks each plane's form from a sample first, then writes
 *        only that.
 * merge: the inverse, from one pointer per plane (planes need not be adjacent).
 * estimate: the bytes a Huffman coder (zstd's literals) would need for a
 *        plane, from its byte histogram: what the encoder's choices use.
 * xf:    rot != 0 rotates each little-endian word left by one bit, which moves
 *        the sign bit to bit 0 and makes the top byte exactly the float
 *        exponent. XOR commutes with the rotation, so deltas stay exact.
 * Built at first use by kernels/byteplanes.py with the system C compiler.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif

int hr_bp_has_avx2(void) {
#ifdef __AVX2__
    return 1;
#else
    return 0;
#endif
}

static inline uint64_t rotl_w(uint64_t w, int size) {
    int bits = size * 8;
    uint64_t mask = bits == 64 ? ~0ull : ((1ull << bits) - 1);
    return ((w << 1) | (w >> (bits - 1))) & mask;
}
static inline uint64_t rotr_w(uint64_t w, int size) {
    int bits = size * 8;
    uint64_t mask = bits == 64 ? ~0ull : ((1ull << bits) - 1);
    return ((w >> 1) | (w << (bits - 1))) & mask;
}
static inline uint64_t load_w(const uint8_t *p, int size) {
    uint64_t w = 0;
    memcpy(&w, p, (size_t)size); /* little-endian hosts only (x86_64, aarch64) */
    return w;
}

/* Portable path; rotation only for 2/4/8-byte items (callers pass rot=0 otherwise). */
static inline uint8_t delta(uint8_t a, uint8_t b, int op) { return op ? (uint8_t)(a - b) : (uint8_t)(a ^ b); }

static void split_scalar(const uint8_t *src, int64_t lo, int64_t n, int size, int rot, uint8_t *planes) {
    for (int64_t i = lo; i < n; i++) {
        if (rot) {
            uint64_t w = rotl_w(load_w(src + i * size, size), size);
            for (int p = 0; p < size; p++) planes[(int64_t)p * n + i] = (uint8_t)(w >> (8 * p));
        } else {
            for (int p = 0; p < size; p++) planes[(int64_t)p * n + i] = src[i * size + p];
        }
    }
}

static void merge_scalar(uint8_t *const *planes, int64_t lo, int64_t n, int size, int rot, uint8_t *out) {
    for (int64_t i = lo; i < n; i++) {
        if (rot) {
            uint64_t w = 0;
            for (int p = 0; p < size; p++) w |= (uint64_t)planes[p][i] << (8 * p);
            w = rotr_w(w, size);
            memcpy(out + i * size, &w, (size_t)size);
        } else {
            for (int p = 0; p < size; p++) out[i * size + p] = planes[p][i];
        }
    }
}

#ifdef __AVX2__
/* 8 words -> [byte0 x8 | byte1 x8 | byte2 x8 | byte3 x8] as four 64-bit lanes. */
static inline __m256i group4(__m256i v, int rot) {
    const __m256i shuf = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15,
                                          0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    if (rot) v = _mm256_or_si256(_mm256_slli_epi32(v, 1), _mm256_srli_epi32(v, 31));
    return _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(v, shuf), perm);
}

/* 4x4 transpose of 64-bit lanes: a_k lane p -> out_p lane k. */
static inline void transpose4(__m256i a0, __m256i a1, __m256i a2, __m256i a3, __m256i *o) {
    __m256i t0 = _mm256_unpacklo_epi64(a0, a1), t1 = _mm256_unpackhi_epi64(a0, a1);
    __m256i t2 = _mm256_unpacklo_epi64(a2, a3), t3 = _mm256_unpackhi_epi64(a2, a3);
    o[0] = _mm256_permute2x128_si256(t0, t2, 0x20);
    o[1] = _mm256_permute2x128_si256(t1, t3, 0x20);
    o[2] = _mm256_permute2x128_si256(t0, t2, 0x31);
    o[3] = _mm256_permute2x128_si256(t1, t3, 0x31);
}

static int64_t split4_avx2(const uint8_t *src, int64_t n, int rot, uint8_t *planes) {
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256i a[4], o[4];
        for (int k = 0; k < 4; k++)
            a[k] = group4(_mm256_loadu_si256((const __m256i *)(src + 4 * (i + 8 * k))), rot);
        transpose4(a[0], a[1], a[2], a[3], o);
        for (int p = 0; p < 4; p++) _mm256_storeu_si256((__m256i *)(planes + p * n + i), o[p]);
    }
    return i;
}

/* Four plane vectors of 32 items -> the 32 interleaved words at out (undoing rot). */
static inline void interleave4_store(__m256i p0, __m256i p1, __m256i p2, __m256i p3, int rot, uint8_t *out) {
    /* Inverses of group4's shuffle (a 4x4 byte transpose is its own inverse) and permute. */
    const __m256i shuf = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15,
                                          0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    const __m256i iperm = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    __m256i t0 = _mm256_permute2x128_si256(p0, p2, 0x20), t2 = _mm256_permute2x128_si256(p0, p2, 0x31);
    __m256i t1 = _mm256_permute2x128_si256(p1, p3, 0x20), t3 = _mm256_permute2x128_si256(p1, p3, 0x31);
    __m256i a[4] = {_mm256_unpacklo_epi64(t0, t1), _mm256_unpackhi_epi64(t0, t1),
                    _mm256_unpacklo_epi64(t2, t3), _mm256_unpackhi_epi64(t2, t3)};
    for (int k = 0; k < 4; k++) {
        __m256i v = _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(a[k], iperm), shuf);
        if (rot) v = _mm256_or_si256(_mm256_srli_epi32(v, 1), _mm256_slli_epi32(v, 31));
        _mm256_storeu_si256((__m256i *)(out + 32 * k), v);
    }
}

static int64_t merge4_avx2(uint8_t *const *planes, int64_t n, int rot, uint8_t *out) {
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
        interleave4_store(_mm256_loadu_si256((const __m256i *)(planes[0] + i)),
                          _mm256_loadu_si256((const __m256i *)(planes[1] + i)),
                          _mm256_loadu_si256((const __m256i *)(planes[2] + i)),
                          _mm256_loadu_si256((const __m256i *)(planes[3] + i)), rot, out + 4 * i);
    return i;
}
#endif

void hr_bp_split(const uint8_t *src, int64_t n, int32_t size, int32_t rot, uint8_t *planes) {
    int64_t done = 0;
#ifdef __AVX2__
    if (size == 4) done = split4_avx2(src, n, rot, planes);
#endif
    split_scalar(src, done, n, size, rot, planes);
}

void hr_bp_merge(uint8_t *const *planes, int64_t n, int32_t size, int32_t rot, uint8_t *out) {
    int64_t done = 0;
#ifdef __AVX2__
    if (size == 4) done = merge4_avx2(planes, n, rot, out);
#endif
    merge_scalar(planes, done, n, size, rot, out);
}

/* ---- split with a per-plane choice ---------------------------------------- */

static void split_select_scalar(const uint8_t *src, const uint8_t *base, int64_t lo, int64_t n, int size,
                                int rot, int op, uint32_t mask, uint8_t *planes) {
    for (int64_t i = lo; i < n; i++) {
        uint64_t w = load_w(src + i * size, size), b = load_w(base + i * size, size);
        if (rot) { w = rotl_w(w, size); b = rotl_w(b, size); }
        for (int p = 0; p < size; p++) {
            uint8_t v = (uint8_t)(w >> (8 * p));
            planes[(int64_t)p * n + i] = (mask >> p) & 1u ? delta(v, (uint8_t)(b >> (8 * p)), op) : v;
        }
    }
}

#ifdef __AVX2__
static int64_t split4_select_avx2(const uint8_t *src, const uint8_t *base, int64_t n, int rot, int op,
                                  uint32_t mask, uint8_t *planes) {
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256i a[4], o[4], b[4], x[4];
        for (int k = 0; k < 4; k++)
            a[k] = group4(_mm256_loadu_si256((const __m256i *)(src + 4 * (i + 8 * k))), rot);
        transpose4(a[0], a[1], a[2], a[3], o);
        for (int k = 0; k < 4; k++)
            b[k] = group4(_mm256_loadu_si256((const __m256i *)(base + 4 * (i + 8 * k))), rot);
        transpose4(b[0], b[1], b[2], b[3], x);
        for (int p = 0; p < 4; p++) {
            __m256i v = o[p];
            if ((mask >> p) & 1u) v = op ? _mm256_sub_epi8(o[p], x[p]) : _mm256_xor_si256(o[p], x[p]);
            _mm256_storeu_si256((__m256i *)(planes + p * n + i), v);
        }
    }
    return i;
}
#endif

void hr_bp_split_select(const uint8_t *src, const uint8_t *base, int64_t n, int32_t size, int32_t rot,
                        int32_t op, uint32_t mask, uint8_t *planes) {
    int64_t done = 0;
#ifdef __AVX2__
    if (size == 4) done = split4_select_avx2(src, base, n, rot, op, mask, planes);
#endif
    split_select_scalar(src, base, done, n, size, rot, op, mask, planes);
}

/* ---- size estimate ---------------------------------------------------------
 * Huffman code lengths lie between 1 bit and zstd's limit of 11 bits; a
 * symbol of frequency f costs about -log2(f) bits within those bounds, plus
 * each block's table and headers. A plane of one repeated byte is an RLE
 * block (a few bytes); a flat histogram stays raw, as zstd decides. Four histograms
 * break the store-to-load dependency of runs of equal bytes. */
double hr_bp_estimate(const uint8_t *p, int64_t n) {
    if (n <= 0) return 0.0;
    uint32_t h[4][256];
    memset(h, 0, sizeof h);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        h[0][p[i]]++; h[1][p[i + 1]]++; h[2][p[i + 2]]++; h[3][p[i + 3]]++;
    }
    for (; i < n; i++) h[0][p[i]]++;
    double bits = 0.0;
    int distinct = 0;
    uint64_t largest = 0;
    for (int s = 0; s < 256; s++) {
        uint64_t c = (uint64_t)h[0][s] + h[1][s] + h[2][s] + h[3][s];
        if (!c) continue;
        distinct++;
        if (c > largest) largest = c;
        double len = log2((double)n / (double)c);
        if (len < 1.0) len = 1.0;
        if (len > 11.0) len = 11.0;
        bits += (double)c * len;
    }
    if (distinct == 1) return 8.0;
    /* zstd's own test (HUF_compress): no value above 1/128 of the bytes means
     * the literals stay raw, whatever a smaller alphabet would have saved. */
    if (largest <= (uint64_t)(n >> 7) + 4) return (double)n;
    /* Every block of up to 128 KiB carries its own Huffman table (about half
     * a byte per used value) and headers: what makes small planes incompressible. */
    int64_t blocks = (n + (1 << 17) - 1) >> 17;
    return bits / 8.0 + (double)blocks * (16.0 + 0.5 * distinct);
}

/* ---- the sign split for 4-byte items ----------------------------------------
 * Layout "rotl1s" (n items, n % 8 == 0): the rotated words' byte planes, but
 * plane 0 (the sign in bit 0 under 7 low mantissa bits) becomes two: the 7
 * mantissa bits of every item packed (7n/8 bytes, item j of each group of 8
 * at bits 7j..7j+6) and the signs packed (n/8 bytes, item j at bit j). Out:
 * [low7 | byte 1 | byte 2 | exponent | signs]. The low mantissa bits are
 * noise, stored raw; the sign is what made plane 0 worth a Huffman pass (Adam's
 * second moment is never negative, a weight's sign rarely flips between
 * checkpoints), and the sign plane is an eighth of its size. */

static inline uint64_t pack7(uint64_t x) {
    uint64_t m = (x >> 1) & 0x7F7F7F7F7F7F7F7FULL;
    m = (m & 0x007F007F007F007FULL) | ((m >> 1) & 0x3F803F803F803F80ULL);
    m = (m & 0x00003FFF00003FFFULL) | ((m >> 2) & 0x0FFFC0000FFFC000ULL);
    return (m & 0x000000000FFFFFFFULL) | ((m >> 4) & 0x00FFFFFFF0000000ULL);
}
static inline uint64_t unpack7(uint64_t m) {
    m = (m & 0x000000000FFFFFFFULL) | ((m << 4) & 0x0FFFFFFF00000000ULL);
    m = (m & 0x00003FFF00003FFFULL) | ((m << 2) & 0x3FFF00003FFF0000ULL);
    m = (m & 0x007F007F007F007FULL) | ((m << 1) & 0x7F007F007F007F00ULL);
    return m << 1;
}
static inline uint8_t pack_signs(uint64_t x) {
    return (uint8_t)(((x & 0x0101010101010101ULL) * 0x0102040810204080ULL) >> 56);
}
static inline uint64_t spread_signs(uint8_t s) {
    uint64_t v = 0;
    for (int j = 0; j < 8; j++) v |= (uint64_t)((s >> j) & 1) << (8 * j);
    return v;
}
static inline uint64_t delta64(uint64_t a, uint64_t b, int op) {
    if (!op) return a ^ b;
    uint64_t r = 0; /* bytewise a - b mod 256 */
    for (int k = 0; k < 8; k++) r |= (uint64_t)(uint8_t)((a >> (8 * k)) - (b >> (8 * k))) << (8 * k);
    return r;
}

/* Items [lo, n) one group of 8 at a time. mask bit 0: low7 as a delta,
 * bits 1-3: byte planes, bit 4: signs; base NULL when mask is 0. */
static void split_s_scalar(const uint8_t *src, const uint8_t *base, int64_t lo, int64_t n, int op, uint32_t mask,
                           uint8_t *low, uint8_t *const *pl, uint8_t *signs) {
    for (int64_t g = lo; g < n; g += 8) {
        uint64_t x = 0, y = 0;
        for (int j = 0; j < 8; j++) {
            uint32_t w = (uint32_t)rotl_w(load_w(src + 4 * (g + j), 4), 4), b = 0;
            if (mask) b = (uint32_t)rotl_w(load_w(base + 4 * (g + j), 4), 4);
            x |= (uint64_t)(w & 0xFF) << (8 * j);
            y |= (uint64_t)(b & 0xFF) << (8 * j);
            for (int p = 1; p < 4; p++) {
                uint8_t v = (uint8_t)(w >> (8 * p));
                pl[p - 1][g + j] = (mask >> p) & 1u ? delta(v, (uint8_t)(b >> (8 * p)), op) : v;
            }
        }
        uint64_t l7 = pack7(x);
        if (mask & 1u) l7 = delta64(l7, pack7(y), op) & 0x00FFFFFFFFFFFFFFULL;
        memcpy(low + g / 8 * 7, &l7, 7);
        uint8_t s = pack_signs(x);
        signs[g / 8] = (mask >> 4) & 1u ? delta(s, pack_signs(y), op) : s;
    }
}

static void merge_s_scalar(uint8_t *const *planes, int64_t lo, int64_t n, uint8_t *out) {
    for (int64_t g = lo; g < n; g += 8) {
        uint64_t v = 0;
        memcpy(&v, planes[0] + g / 8 * 7, 7);
        uint64_t x = unpack7(v) | spread_signs(planes[4][g / 8]);
        for (int j = 0; j < 8; j++) {
            uint64_t w = ((x >> (8 * j)) & 0xFF) | (uint64_t)planes[1][g + j] << 8 | (uint64_t)planes[2][g + j] << 16
                         | (uint64_t)planes[3][g + j] << 24;
            uint32_t r = (uint32_t)rotr_w(w, 4);
            memcpy(out + 4 * (g + j), &r, 4);
        }
    }
}

#ifdef __AVX2__
/* 32 bytes of plane 0 -> four 7-byte groups, one per 64-bit lane (byte 7 zero). */
static inline __m256i pack7_x4(__m256i o0) {
    __m256i m = _mm256_and_si256(_mm256_srli_epi64(o0, 1), _mm256_set1_epi64x(0x7F7F7F7F7F7F7F7FLL));
    m = _mm256_or_si256(_mm256_and_si256(m, _mm256_set1_epi64x(0x007F007F007F007FLL)),
                        _mm256_and_si256(_mm256_srli_epi64(m, 1), _mm256_set1_epi64x(0x3F803F803F803F80LL)));
    m = _mm256_or_si256(_mm256_and_si256(m, _mm256_set1_epi64x(0x00003FFF00003FFFLL)),
                        _mm256_and_si256(_mm256_srli_epi64(m, 2), _mm256_set1_epi64x(0x0FFFC0000FFFC000LL)));
    return _mm256_or_si256(_mm256_and_si256(m, _mm256_set1_epi64x(0x000000000FFFFFFFLL)),
                           _mm256_and_si256(_mm256_srli_epi64(m, 4), _mm256_set1_epi64x(0x00FFFFFFF0000000LL)));
}
/* Four 7-byte groups (one per 64-bit lane) -> 28 bytes at dst, plus 2 bytes
 * of garbage after them that the next group overwrites. */
static inline void store28(uint8_t *dst, __m256i v) {
    const __m256i sq = _mm256_setr_epi8(0, 1, 2, 3, 4, 5, 6, 8, 9, 10, 11, 12, 13, 14, -1, -1,
                                        0, 1, 2, 3, 4, 5, 6, 8, 9, 10, 11, 12, 13, 14, -1, -1);
    v = _mm256_shuffle_epi8(v, sq);
    _mm_storeu_si128((__m128i *)dst, _mm256_castsi256_si128(v));
    _mm_storeu_si128((__m128i *)(dst + 14), _mm256_extracti128_si256(v, 1));
}
static inline __m256i load28(const uint8_t *src) { /* reads 30 bytes */
    const __m256i sp = _mm256_setr_epi8(0, 1, 2, 3, 4, 5, 6, -1, 7, 8, 9, 10, 11, 12, 13, -1,
                                        0, 1, 2, 3, 4, 5, 6, -1, 7, 8, 9, 10, 11, 12, 13, -1);
    __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)src)),
                                        _mm_loadu_si128((const __m128i *)(src + 14)), 1);
    return _mm256_shuffle_epi8(v, sp);
}
static inline __m256i unpack7_x4(__m256i m) {
    m = _mm256_or_si256(_mm256_and_si256(m, _mm256_set1_epi64x(0x000000000FFFFFFFLL)),
                        _mm256_and_si256(_mm256_slli_epi64(m, 4), _mm256_set1_epi64x(0x0FFFFFFF00000000LL)));
    m = _mm256_or_si256(_mm256_and_si256(m, _mm256_set1_epi64x(0x00003FFF00003FFFLL)),
                        _mm256_and_si256(_mm256_slli_epi64(m, 2), _mm256_set1_epi64x(0x3FFF00003FFF0000LL)));
    m = _mm256_or_si256(_mm256_and_si256(m, _mm256_set1_epi64x(0x007F007F007F007FLL)),
                        _mm256_and_si256(_mm256_slli_epi64(m, 1), _mm256_set1_epi64x(0x7F007F007F007F00LL)));
    return _mm256_slli_epi64(m, 1);
}
static inline __m256i spread32(uint32_t s) {
    const __m256i idx = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                         2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x(0x8040201008040201LL);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)s), idx);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit), _mm256_set1_epi8(1));
}
static inline __m256i dop(__m256i a, __m256i b, int op) { return op ? _mm256_sub_epi8(a, b) : _mm256_xor_si256(a, b); }

static int64_t split_s_avx2(const uint8_t *src, const uint8_t *base, int64_t n, int op, uint32_t mask,
                            uint8_t *low, uint8_t *const *pl, uint8_t *signs) {
    int64_t i = 0;
    for (; i + 64 <= n; i += 32) { /* the last group is left to the scalar path: store28 writes 2 bytes on */
        __m256i a[4], o[4], b[4], x[4];
        for (int k = 0; k < 4; k++) a[k] = group4(_mm256_loadu_si256((const __m256i *)(src + 4 * (i + 8 * k))), 1);
        transpose4(a[0], a[1], a[2], a[3], o);
        if (mask) {
            for (int k = 0; k < 4; k++) b[k] = group4(_mm256_loadu_si256((const __m256i *)(base + 4 * (i + 8 * k))), 1);
            transpose4(b[0], b[1], b[2], b[3], x);
        }
        for (int p = 1; p < 4; p++)
            _mm256_storeu_si256((__m256i *)(pl[p - 1] + i), (mask >> p) & 1u ? dop(o[p], x[p], op) : o[p]);
        __m256i l7 = pack7_x4(o[0]);
        if (mask & 1u) l7 = dop(l7, pack7_x4(x[0]), op);
        store28(low + i / 8 * 7, l7);
        uint32_t s = (uint32_t)_mm256_movemask_epi8(_mm256_slli_epi16(o[0], 7));
        if ((mask >> 4) & 1u) {
            uint32_t sb = (uint32_t)_mm256_movemask_epi8(_mm256_slli_epi16(x[0], 7));
            s = (uint32_t)_mm_cvtsi128_si32(op ? _mm_sub_epi8(_mm_cvtsi32_si128((int)s), _mm_cvtsi32_si128((int)sb))
                                               : _mm_xor_si128(_mm_cvtsi32_si128((int)s), _mm_cvtsi32_si128((int)sb)));
        }
        memcpy(signs + i / 8, &s, 4);
    }
    return i;
}

static int64_t merge_s_avx2(uint8_t *const *planes, int64_t n, uint8_t *out) {
    int64_t i = 0;
    for (; i + 64 <= n; i += 32) { /* load28 reads 2 bytes past its group: not at the plane's end */
        uint32_t s;
        memcpy(&s, planes[4] + i / 8, 4);
        interleave4_store(_mm256_or_si256(unpack7_x4(load28(planes[0] + i / 8 * 7)), spread32(s)),
                          _mm256_loadu_si256((const __m256i *)(planes[1] + i)),
                          _mm256_loadu_si256((const __m256i *)(planes[2] + i)),
                          _mm256_loadu_si256((const __m256i *)(planes[3] + i)), 1, out + 4 * i);
    }
    return i;
}
#endif

void hr_bp_split_s(const uint8_t *src, const uint8_t *base, int64_t n, int32_t op, uint32_t mask, uint8_t *out) {
    uint8_t *low = out, *signs = out + n / 8 * 7 + 3 * n;
    uint8_t *pl[3] = {out + n / 8 * 7, out + n / 8 * 7 + n, out + n / 8 * 7 + 2 * n};
    if (base == NULL) mask = 0;
    int64_t done = 0;
#ifdef __AVX2__
    done = split_s_avx2(src, base, n, op, mask, low, pl, signs);
#endif
    split_s_scalar(src, base, done, n, op, mask, low, pl, signs);
}

/* The inverse (no deltas): planes[0..4] = low7, byte 1, byte 2, exponent, signs. */
void hr_bp_merge_s(uint8_t *const *planes, int64_t n, uint8_t *out) {
    int64_t done = 0;
#ifdef __AVX2__
    done = merge_s_avx2(planes, n, out);
#endif
    merge_s_scalar(planes, done, n, out);
}
