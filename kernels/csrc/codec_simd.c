/* Single-pass CPU codecs (AVX2 where the compiler targets it, portable C otherwise).
 *
 * Same wire format as kernels/codec_reference.py. Each function streams its
 * input once: per block it reduces the scale and packs/quantises while the
 * block is in L1, so the cost is close to reading the input from memory.
 * Built at first use by kernels/codec_native.py with the system C compiler.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif

static inline uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* Block scales travel as fp32, or as bf16 (the top half of the fp32 bits,
 * rounded to nearest even) to halve their share of the wire: 2 bytes per
 * block. The encoder rounds first and quantises with the rounded scale, so
 * the error feedback residual and the int8 steps see what the receiver sees. */
static inline float bf16_round(float f) {
    uint32_t u = f2u(f);
    return u2f((u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u);
}
static inline float scale_get(const void *scales, int64_t b, int bf16) {
    if (bf16) return u2f((uint32_t)((const uint16_t *)scales)[b] << 16);
    return ((const float *)scales)[b];
}
static inline float scale_put(void *scales, int64_t b, float v, int bf16) {
    if (bf16) {
        v = bf16_round(v);
        ((uint16_t *)scales)[b] = (uint16_t)(f2u(v) >> 16);
    } else {
        ((float *)scales)[b] = v;
    }
    return v;
}

#ifdef __AVX2__
static __m256i SIGN_LUT[256];
static int lut_ready = 0;
static void init_lut(void) {
    if (lut_ready) return;
    for (int b = 0; b < 256; b++) {
        uint32_t m[8];
        for (int j = 0; j < 8; j++) m[j] = ((b >> j) & 1u) << 31;
        SIGN_LUT[b] = _mm256_loadu_si256((const __m256i *)m);
    }
    lut_ready = 1;
}
static inline float hsum(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_shuffle_ps(lo, lo, 1));
    return _mm_cvtss_f32(lo);
}
static inline float hmax(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_max_ps(lo, hi);
    lo = _mm_max_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_max_ss(lo, _mm_shuffle_ps(lo, lo, 1));
    return _mm_cvtss_f32(lo);
}
#endif

int hr_has_avx2(void) {
#ifdef __AVX2__
    return 1;
#else
    return 0;
#endif
}

/* 1-bit: scales[nb] = mean|c| per block, bits = sign bits of c, where c = x
 * (+ residual, which then receives c - decode(c)). */
void hr_onebit_encode(const float *x, int64_t n, int64_t block, void *scales, uint8_t *bits,
                      float *residual, int bf16) {
    int64_t nb = (n + block - 1) / block;
#ifdef __AVX2__
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 signmask = _mm256_castsi256_ps(_mm256_set1_epi32((int)0x80000000u));
#endif
    /* c = x + r goes to a block-sized stack buffer (L1), so the residual is read
     * once and written once; blocks too big for the stack keep c in r itself. */
    int use_stack = residual != NULL && block <= 4096;
    float cbuf[use_stack ? block : 1];
    for (int64_t b = 0; b < nb; b++) {
        int64_t s = b * block, m = n - s < block ? n - s : block;
        const float *c = x + s;
        if (residual) {
            float *r = residual + s, *dst = use_stack ? cbuf : r;
            for (int64_t i = 0; i < m; i++) dst[i] = c[i] + r[i];
            c = dst;
        }
        int64_t i = 0;
        float sum = 0.f;
#ifdef __AVX2__
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        __m256 a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
        for (; i + 32 <= m; i += 32) {
            __m256 v0 = _mm256_loadu_ps(c + i), v1 = _mm256_loadu_ps(c + i + 8);
            __m256 v2 = _mm256_loadu_ps(c + i + 16), v3 = _mm256_loadu_ps(c + i + 24);
            a0 = _mm256_add_ps(a0, _mm256_and_ps(v0, absmask));
            a1 = _mm256_add_ps(a1, _mm256_and_ps(v1, absmask));
            a2 = _mm256_add_ps(a2, _mm256_and_ps(v2, absmask));
            a3 = _mm256_add_ps(a3, _mm256_and_ps(v3, absmask));
            uint8_t *o = bits + (s + i) / 8;
            o[0] = (uint8_t)_mm256_movemask_ps(v0);
            o[1] = (uint8_t)_mm256_movemask_ps(v1);
            o[2] = (uint8_t)_mm256_movemask_ps(v2);
            o[3] = (uint8_t)_mm256_movemask_ps(v3);
        }
        sum = hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
#endif
        for (int64_t j = i; j < m; j++) sum += fabsf(c[j]);
        for (; i < m; i += 8) {
            uint8_t byte = 0;
            for (int64_t j = 0; j < 8 && i + j < m; j++) byte |= (uint8_t)((f2u(c[i + j]) >> 31) << j);
            bits[(s + i) / 8] = byte;
        }
        float scale = scale_put(scales, b, sum / (float)m, bf16);
        if (residual) {
            float *r = residual + s;
            int64_t k = 0;
#ifdef __AVX2__
            __m256 sv = _mm256_set1_ps(scale);
            for (; k + 8 <= m; k += 8) {
                __m256 v = _mm256_loadu_ps(c + k);
                __m256 dec = _mm256_or_ps(sv, _mm256_and_ps(v, signmask));
                _mm256_storeu_ps(r + k, _mm256_sub_ps(v, dec));
            }
#endif
            for (; k < m; k++) r[k] = c[k] - u2f(f2u(scale) | (f2u(c[k]) & 0x80000000u));
        }
    }
}

void hr_onebit_decode(const void *scales, const uint8_t *bits, int64_t n, int64_t block, float *out,
                      int bf16) {
    int64_t nb = (n + block - 1) / block;
#ifdef __AVX2__
    init_lut();
#endif
    for (int64_t b = 0; b < nb; b++) {
        int64_t s = b * block, m = n - s < block ? n - s : block;
        uint32_t su = f2u(scale_get(scales, b, bf16));
        int64_t i = 0;
#ifdef __AVX2__
        __m256i sv = _mm256_set1_epi32((int)su);
        const uint8_t *in = bits + s / 8;
        for (; i + 8 <= m; i += 8)
            _mm256_storeu_si256((__m256i *)(out + s + i), _mm256_or_si256(SIGN_LUT[in[i / 8]], sv));
#endif
        for (; i < m; i++) {
            uint32_t bit = (bits[(s + i) / 8] >> ((s + i) % 8)) & 1u;
            out[s + i] = u2f(su | (bit << 31));
        }
    }
}

/* int8: scales[nb] = absmax / 127, q = rint(x * (127 / absmax)) (0 for all-zero blocks);
 * with bf16 scales q = rint(x * (1 / bf16(absmax / 127))), clamped to +-127. */
void hr_int8_encode(const float *x, int64_t n, int64_t block, void *scales, int8_t *q, int bf16) {
    int64_t nb = (n + block - 1) / block;
    for (int64_t b = 0; b < nb; b++) {
        int64_t s = b * block, m = n - s < block ? n - s : block;
        const float *c = x + s;
        float amax = 0.f;
        int64_t i = 0;
#ifdef __AVX2__
        const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
        __m256 mx = _mm256_setzero_ps();
        for (; i + 8 <= m; i += 8) mx = _mm256_max_ps(mx, _mm256_and_ps(_mm256_loadu_ps(c + i), absmask));
        amax = hmax(mx);
#endif
        for (; i < m; i++) { float a = fabsf(c[i]); if (a > amax) amax = a; }
        float sc = scale_put(scales, b, amax / 127.0f, bf16);
        float inv = bf16 ? (sc > 0.f ? 1.0f / sc : 0.f) : (amax > 0.f ? 127.0f / amax : 0.f);
        int8_t *o = q + s;
        i = 0;
#ifdef __AVX2__
        __m256 iv = _mm256_set1_ps(inv);
        const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
        const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        for (; i + 32 <= m; i += 32) {
            __m256i q0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(c + i), iv));
            __m256i q1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(c + i + 8), iv));
            __m256i q2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(c + i + 16), iv));
            __m256i q3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(c + i + 24), iv));
            q0 = _mm256_min_epi32(_mm256_max_epi32(q0, lo), hi);
            q1 = _mm256_min_epi32(_mm256_max_epi32(q1, lo), hi);
            q2 = _mm256_min_epi32(_mm256_max_epi32(q2, lo), hi);
            q3 = _mm256_min_epi32(_mm256_max_epi32(q3, lo), hi);
            __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q0, q1), _mm256_packs_epi32(q2, q3));
            _mm256_storeu_si256((__m256i *)(o + i), _mm256_permutevar8x32_epi32(p, perm));
        }
#endif
        for (; i < m; i++) {
            float r = nearbyintf(c[i] * inv);
            o[i] = (int8_t)(r > 127.f ? 127.f : (r < -127.f ? -127.f : r));
        }
    }
}

void hr_int8_decode(const void *scales, const int8_t *q, int64_t n, int64_t block, float *out, int bf16) {
    int64_t nb = (n + block - 1) / block;
    for (int64_t b = 0; b < nb; b++) {
        int64_t s = b * block, m = n - s < block ? n - s : block;
        float sc = scale_get(scales, b, bf16);
        int64_t i = 0;
#ifdef __AVX2__
        __m256 sv = _mm256_set1_ps(sc);
        for (; i + 8 <= m; i += 8) {
            __m256i v = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + s + i)));
            _mm256_storeu_ps(out + s + i, _mm256_mul_ps(_mm256_cvtepi32_ps(v), sv));
        }
#endif
        for (; i < m; i++) out[s + i] = (float)q[s + i] * sc;
    }
}

/* Stochastic 1-bit: scales[nb] = absmax M per block; element i negative iff
 * x < M * (1 - 2u_i), so the decoded value (+-M) equals x in expectation.
 * u_i = hash(i, key) >> 8 over 2^24: a counter-based generator (the lowbias32
 * integer hash of the index plus key k0, XOR key k1), so every element's draw is independent of the
 * others and of the order they are computed in: vectorisable, and the numpy
 * and torch paths (kernels/codec_reference.stochastic_uniform24) reproduce it
 * bit for bit. The threshold 1 - u24 * 2^-23 is exact in fp32. */
static inline uint32_t lowbias32(uint32_t x) {
    x ^= x >> 16; x *= 0x7feb352du; x ^= x >> 15; x *= 0x846ca68bu; x ^= x >> 16;
    return x;
}
static inline uint32_t stoch_u24(int64_t i, uint32_t k0, uint32_t k1) {
    return (lowbias32((uint32_t)i + k0 + (uint32_t)((uint64_t)i >> 32) * 0x9e3779b9u) ^ k1) >> 8;
}
#ifdef __AVX2__
static inline __m256i lowbias32_v(__m256i x) {
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
    x = _mm256_mullo_epi32(x, _mm256_set1_epi32(0x7feb352d));
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 15));
    x = _mm256_mullo_epi32(x, _mm256_set1_epi32((int)0x846ca68bu));
    return _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
}
#endif

void hr_onebit_stochastic_encode(const float *x, int64_t n, int64_t block, float *scales,
                                 uint8_t *bits, uint32_t k0, uint32_t k1) {
    int64_t nb = (n + block - 1) / block;
    const float two_m23 = 1.0f / 8388608.0f;
    for (int64_t b = 0; b < nb; b++) {
        int64_t s = b * block, m = n - s < block ? n - s : block;
        const float *c = x + s;
        float amax = 0.f;
        int64_t i = 0;
#ifdef __AVX2__
        const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
        __m256 mx = _mm256_setzero_ps();
        for (; i + 8 <= m; i += 8) mx = _mm256_max_ps(mx, _mm256_and_ps(_mm256_loadu_ps(c + i), absmask));
        amax = hmax(mx);
#endif
        for (; i < m; i++) { float a = fabsf(c[i]); if (a > amax) amax = a; }
        scales[b] = amax;
        i = 0;
#ifdef __AVX2__
        /* the high half of the index is the same for a whole block unless it
         * straddles 2^32; such blocks take the scalar path */
        if (((uint64_t)s >> 32) == ((uint64_t)(s + m) >> 32)) {
            const __m256 mv = _mm256_set1_ps(amax), one = _mm256_set1_ps(1.0f);
            const __m256 step = _mm256_set1_ps(two_m23);
            const __m256i k0v = _mm256_set1_epi32((int)(k0 + (uint32_t)((uint64_t)s >> 32) * 0x9e3779b9u));
            const __m256i k1v = _mm256_set1_epi32((int)k1);
            const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            /* four independent groups of 8 per iteration: the hash is a chain of
             * dependent multiplies, so interleaving keeps the multiplier busy */
            __m256i idx = _mm256_add_epi32(_mm256_set1_epi32((int)(uint32_t)s), lane);
            const __m256i eight = _mm256_set1_epi32(8);
            for (; i + 32 <= m; i += 32) {
                uint32_t word = 0;
                for (int k = 0; k < 4; k++) {
                    __m256i h = _mm256_xor_si256(lowbias32_v(_mm256_add_epi32(idx, k0v)), k1v);
                    h = _mm256_srli_epi32(h, 8);
                    __m256 t = _mm256_sub_ps(one, _mm256_mul_ps(_mm256_cvtepi32_ps(h), step));
                    __m256 neg = _mm256_cmp_ps(_mm256_loadu_ps(c + i + 8 * k), _mm256_mul_ps(mv, t), _CMP_LT_OQ);
                    word |= (uint32_t)_mm256_movemask_ps(neg) << (8 * k);
                    idx = _mm256_add_epi32(idx, eight);
                }
                memcpy(bits + (s + i) / 8, &word, 4);
            }
            for (; i + 8 <= m; i += 8) {
                __m256i h = _mm256_srli_epi32(_mm256_xor_si256(lowbias32_v(_mm256_add_epi32(idx, k0v)), k1v), 8);
                __m256 t = _mm256_sub_ps(one, _mm256_mul_ps(_mm256_cvtepi32_ps(h), step));
                __m256 neg = _mm256_cmp_ps(_mm256_loadu_ps(c + i), _mm256_mul_ps(mv, t), _CMP_LT_OQ);
                bits[(s + i) / 8] = (uint8_t)_mm256_movemask_ps(neg);
                idx = _mm256_add_epi32(idx, eight);
            }
        }
#endif
        for (; i < m; i += 8) {
            uint8_t byte = 0;
            for (int64_t j = 0; j < 8 && i + j < m; j++) {
                float t = 1.0f - (float)stoch_u24(s + i + j, k0, k1) * two_m23;
                byte |= (uint8_t)((c[i + j] < amax * t) << j);
            }
            bits[(s + i) / 8] = byte;
        }
    }
}

/* fp8 e4m3fn: scales[nb] = absmax / 448, y = clamp(x * (448 / absmax), +-448)
 * converted with round-to-nearest-even exactly as torch's float8_e4m3fn cast
 * (c10 fp8e4m3fn_from_fp32_value; NaN -> 0x7f with the sign). */
static inline uint8_t fp8_from_f32(float f) {
    uint32_t fb = f2u(f), sign = fb & 0x80000000u, r;
    fb ^= sign;
    if (fb >= (1087u << 20)) {
        r = 0x7f;
    } else if (fb < (121u << 23)) {
        r = f2u(u2f(fb) + u2f(141u << 23)) - (141u << 23);
    } else {
        uint32_t odd = (fb >> 20) & 1u;
        fb += ((uint32_t)(7 - 127) << 23) + 0x7ffffu + odd;
        r = fb >> 20;
    }
    return (uint8_t)(r | (sign >> 24));
}
static inline float fp8_to_f32(uint8_t b) {
    if ((b & 0x7f) == 0x7f) return u2f(0x7fc00000u | ((uint32_t)(b & 0x80) << 24));
    /* exponent field moved into fp32's; 2^120 re-biases (7 vs 127), subnormals included */
    return u2f(((uint32_t)(b & 0x80) << 24) | ((uint32_t)(b & 0x7f) << 20)) * 0x1p120f;
}

#ifdef __AVX2__
static inline __m256i fp8_from_f32_v(__m256 y) {
    __m256i fb = _mm256_castps_si256(y);
    __m256i sign = _mm256_and_si256(fb, _mm256_set1_epi32((int)0x80000000u));
    __m256i a = _mm256_xor_si256(fb, sign);
    __m256i nan = _mm256_cmpgt_epi32(a, _mm256_set1_epi32((int)((1087u << 20) - 1)));
    __m256i den = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(121u << 23)), a);
    const __m256i dm = _mm256_set1_epi32((int)(141u << 23));
    __m256i rd = _mm256_sub_epi32(
        _mm256_castps_si256(_mm256_add_ps(_mm256_castsi256_ps(a), _mm256_castsi256_ps(dm))), dm);
    __m256i odd = _mm256_and_si256(_mm256_srli_epi32(a, 20), _mm256_set1_epi32(1));
    __m256i rn = _mm256_add_epi32(a, _mm256_set1_epi32((int)(((uint32_t)(7 - 127) << 23) + 0x7ffffu)));
    rn = _mm256_srli_epi32(_mm256_add_epi32(rn, odd), 20);
    __m256i r = _mm256_blendv_epi8(rn, rd, den);
    r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7f), nan);
    return _mm256_or_si256(r, _mm256_srli_epi32(sign, 24));
}
#endif

void hr_fp8_encode(const float *x, int64_t n, int64_t block, float *scales, uint8_t *q) {
    int64_t nb = (n + block - 1) / block;
    for (int64_t b = 0; b < nb; b++) {
        int64_t s = b * block, m = n - s < block ? n - s : block;
        const float *c = x + s;
        float amax = 0.f;
        int64_t i = 0;
#ifdef __AVX2__
        const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
        __m256 mx = _mm256_setzero_ps();
        for (; i + 8 <= m; i += 8) mx = _mm256_max_ps(mx, _mm256_and_ps(_mm256_loadu_ps(c + i), absmask));
        amax = hmax(mx);
#endif
        for (; i < m; i++) { float a = fabsf(c[i]); if (a > amax) amax = a; }
        scales[b] = amax / 448.0f;
        float inv = amax > 0.f ? 448.0f / amax : 0.f;
        uint8_t *o = q + s;
        i = 0;
#ifdef __AVX2__
        const __m256 iv = _mm256_set1_ps(inv), hi = _mm256_set1_ps(448.0f), lo = _mm256_set1_ps(-448.0f);
        const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        for (; i + 32 <= m; i += 32) {
            __m256i r[4];
            for (int k = 0; k < 4; k++) {
                __m256 y = _mm256_mul_ps(_mm256_loadu_ps(c + i + 8 * k), iv);
                /* min/max return their second operand on NaN: NaN passes through, as in torch.clamp */
                y = _mm256_max_ps(lo, _mm256_min_ps(hi, y));
                r[k] = fp8_from_f32_v(y);
            }
            __m256i p = _mm256_packus_epi16(_mm256_packus_epi32(r[0], r[1]), _mm256_packus_epi32(r[2], r[3]));
            _mm256_storeu_si256((__m256i *)(o + i), _mm256_permutevar8x32_epi32(p, perm));
        }
#endif
        for (; i < m; i++) {
            float y = c[i] * inv;
            if (y > 448.0f) y = 448.0f;
            else if (y < -448.0f) y = -448.0f;
            o[i] = fp8_from_f32(y);
        }
    }
}

/* fp8 of clamp(x, +-448): the cast on its own, for the bit-exactness tests. */
void hr_fp8_e4m3_saturate(const float *x, int64_t n, uint8_t *out) {
    int64_t i = 0;
#ifdef __AVX2__
    const __m256 hi = _mm256_set1_ps(448.0f), lo = _mm256_set1_ps(-448.0f);
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (; i + 32 <= n; i += 32) {
        __m256i r[4];
        for (int k = 0; k < 4; k++)
            r[k] = fp8_from_f32_v(_mm256_max_ps(lo, _mm256_min_ps(hi, _mm256_loadu_ps(x + i + 8 * k))));
        __m256i p = _mm256_packus_epi16(_mm256_packus_epi32(r[0], r[1]), _mm256_packus_epi32(r[2], r[3]));
        _mm256_storeu_si256((__m256i *)(out + i), _mm256_permutevar8x32_epi32(p, perm));
    }
#endif
    for (; i < n; i++) {
        float y = x[i];
        if (y > 448.0f) y = 448.0f;
        else if (y < -448.0f) y = -448.0f;
        out[i] = fp8_from_f32(y);
    }
}

void hr_fp8_decode(const float *scales, const uint8_t *q, int64_t n, int64_t block, float *out) {
    int64_t nb = (n + block - 1) / block;
    for (int64_t b = 0; b < nb; b++) {
        int64_t s = b * block, m = n - s < block ? n - s : block;
        float sc = scales[b];
        int64_t i = 0;
#ifdef __AVX2__
        const __m256 sv = _mm256_set1_ps(sc), rebias = _mm256_set1_ps(0x1p120f);
        const __m256i low7 = _mm256_set1_epi32(0x7f), qnan = _mm256_set1_epi32(0x7fc00000);
        for (; i + 8 <= m; i += 8) {
            __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(q + s + i)));
            __m256i mag = _mm256_and_si256(v, low7);
            __m256 f = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(mag, 20)), rebias);
            f = _mm256_blendv_ps(f, _mm256_castsi256_ps(qnan), _mm256_castsi256_ps(_mm256_cmpeq_epi32(mag, low7)));
            __m256 sign = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_srli_epi32(v, 7), 31));
            _mm256_storeu_ps(out + s + i, _mm256_mul_ps(_mm256_or_ps(f, sign), sv));
        }
#endif
        for (; i < m; i++) out[s + i] = fp8_to_f32(q[s + i]) * sc;
    }
}

/* int4: scales[nb] = absmax / 7 (fp32 or bf16), q = rint(x * inv) clamped to +-7, stored as
 * q + 8, two per byte (element 2i in the low nibble). inv = 7 / absmax, or 1 / the rounded
 * bf16 scale. Blocks hold an even count except the last, so pairs never straddle blocks
 * (the Python side asks for an even block size). */
void hr_int4_encode(const float *x, int64_t n, int64_t block, void *scales, uint8_t *q, int bf16) {
    int64_t nb = (n + block - 1) / block;
    for (int64_t b = 0; b < nb; b++) {
        int64_t s = b * block, m = n - s < block ? n - s : block;
        const float *c = x + s;
        float amax = 0.f;
        int64_t i = 0;
#ifdef __AVX2__
        const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
        __m256 mx = _mm256_setzero_ps();
        for (; i + 8 <= m; i += 8) mx = _mm256_max_ps(mx, _mm256_and_ps(_mm256_loadu_ps(c + i), absmask));
        amax = hmax(mx);
#endif
        for (; i < m; i++) { float a = fabsf(c[i]); if (a > amax) amax = a; }
        float sc = scale_put(scales, b, amax / 7.0f, bf16);
        float inv = bf16 ? (sc > 0.f ? 1.0f / sc : 0.f) : (amax > 0.f ? 7.0f / amax : 0.f);
        uint8_t *o = q + s / 2;
        i = 0;
#ifdef __AVX2__
        const __m256 iv = _mm256_set1_ps(inv);
        const __m256i lo = _mm256_set1_epi32(-7), hi = _mm256_set1_epi32(7), eight = _mm256_set1_epi32(8);
        /* nibble pairs: even lane + 16 * odd lane, via a multiply-add on bytes */
        const __m256i pairw = _mm256_set1_epi16(0x1001);
        const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        for (; i + 32 <= m; i += 32) {
            __m256i r[4];
            for (int k = 0; k < 4; k++) {
                __m256i v = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(c + i + 8 * k), iv));
                r[k] = _mm256_add_epi32(_mm256_min_epi32(_mm256_max_epi32(v, lo), hi), eight);
            }
            __m256i bytes = _mm256_packus_epi16(_mm256_packs_epi32(r[0], r[1]), _mm256_packs_epi32(r[2], r[3]));
            bytes = _mm256_permutevar8x32_epi32(bytes, perm);          /* 32 values in order */
            __m256i pairs = _mm256_maddubs_epi16(bytes, pairw);         /* 16 x (even + 16 odd) */
            __m128i packed = _mm_packus_epi16(_mm256_castsi256_si128(pairs), _mm256_extracti128_si256(pairs, 1));
            _mm_storeu_si128((__m128i *)(o + i / 2), packed);
        }
#endif
        for (; i < m; i += 2) {
            uint8_t pair = 0;
            for (int64_t j = 0; j < 2; j++) {
                float r = 8.0f;
                if (i + j < m) {
                    r = nearbyintf(c[i + j] * inv);
                    r = (r > 7.f ? 7.f : (r < -7.f ? -7.f : r)) + 8.0f;
                }
                pair |= (uint8_t)((uint8_t)r << (4 * j));
            }
            o[i / 2] = pair;
        }
    }
}

void hr_int4_decode(const void *scales, const uint8_t *q, int64_t n, int64_t block, float *out, int bf16) {
    int64_t nb = (n + block - 1) / block;
    for (int64_t b = 0; b < nb; b++) {
        int64_t s = b * block, m = n - s < block ? n - s : block;
        float sc = scale_get(scales, b, bf16);
        const uint8_t *in = q + s / 2;
        int64_t i = 0;
#ifdef __AVX2__
        const __m256 sv = _mm256_set1_ps(sc);
        const __m128i low4 = _mm_set1_epi8(15);
        const __m256i eight = _mm256_set1_epi32(8);
        for (; i + 32 <= m; i += 32) {
            __m128i pk = _mm_loadu_si128((const __m128i *)(in + i / 2));
            __m128i lo = _mm_and_si128(pk, low4), hi = _mm_and_si128(_mm_srli_epi16(pk, 4), low4);
            __m128i v[2] = {_mm_unpacklo_epi8(lo, hi), _mm_unpackhi_epi8(lo, hi)};  /* in order */
            for (int k = 0; k < 4; k++) {
                __m128i part = k & 1 ? _mm_srli_si128(v[k / 2], 8) : v[k / 2];
                __m256i w = _mm256_sub_epi32(_mm256_cvtepu8_epi32(part), eight);
                _mm256_storeu_ps(out + s + i + 8 * k, _mm256_mul_ps(_mm256_cvtepi32_ps(w), sv));
            }
        }
#endif
        for (; i < m; i++) {
            uint8_t v = (in[i / 2] >> (4 * (i & 1))) & 15u;
            out[s + i] = (float)((int)v - 8) * sc;
        }
    }
}
