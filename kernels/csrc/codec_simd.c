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
void hr_onebit_encode(const float *x, int64_t n, int64_t block, float *scales, uint8_t *bits,
                      float *residual) {
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
        float scale = sum / (float)m;
        scales[b] = scale;
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

void hr_onebit_decode(const float *scales, const uint8_t *bits, int64_t n, int64_t block, float *out) {
    int64_t nb = (n + block - 1) / block;
#ifdef __AVX2__
    init_lut();
#endif
    for (int64_t b = 0; b < nb; b++) {
        int64_t s = b * block, m = n - s < block ? n - s : block;
        uint32_t su = f2u(scales[b]);
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

/* int8: scales[nb] = absmax / 127, q = rint(x * (127 / absmax)) (0 for all-zero blocks). */
void hr_int8_encode(const float *x, int64_t n, int64_t block, float *scales, int8_t *q) {
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
        scales[b] = amax / 127.0f;
        float inv = amax > 0.f ? 127.0f / amax : 0.f;
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

void hr_int8_decode(const float *scales, const int8_t *q, int64_t n, int64_t block, float *out) {
    int64_t nb = (n + block - 1) / block;
    for (int64_t b = 0; b < nb; b++) {
        int64_t s = b * block, m = n - s < block ? n - s : block;
        float sc = scales[b];
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

/* Stochastic 1-bit: scales[nb] = absmax per block; element negative iff
 * x < M * (1 - 2u), u ~ U[0, 1) from xoshiro256+ (state: 4 words, advanced),
 * so the decoded value (+-M) equals x in expectation. */
static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
static inline uint64_t xoshiro_next(uint64_t *s) {
    uint64_t r = s[0] + s[3], t = s[1] << 17;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3]; s[2] ^= t; s[3] = rotl(s[3], 45);
    return r;
}

void hr_onebit_stochastic_encode(const float *x, int64_t n, int64_t block, float *scales,
                                 uint8_t *bits, uint64_t *state) {
    int64_t nb = (n + block - 1) / block;
    const float inv24 = 1.0f / 16777216.0f;
    for (int64_t b = 0; b < nb; b++) {
        int64_t s = b * block, m = n - s < block ? n - s : block;
        const float *c = x + s;
        float amax = 0.f;
        for (int64_t i = 0; i < m; i++) { float a = fabsf(c[i]); if (a > amax) amax = a; }
        scales[b] = amax;
        for (int64_t i = 0; i < m; i += 8) {
            uint8_t byte = 0;
            for (int64_t j = 0; j < 8 && i + j < m; j++) {
                float u = (float)(xoshiro_next(state) >> 40) * inv24;  /* top 24 bits */
                byte |= (uint8_t)((c[i + j] < amax * (1.0f - 2.0f * u)) << j);
            }
            bits[(s + i) / 8] = byte;
        }
    }
}
