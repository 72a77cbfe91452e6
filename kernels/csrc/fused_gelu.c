/* GELU (exact erf form) forward, and backward fused with the bias-gradient column sum.
 *
 * gelu'(v) = cdf(v) + v * pdf(v), cdf = (1 + erf(v / sqrt 2)) / 2,
 * pdf = exp(-v^2 / 2) / sqrt(2 pi). erf is ATen's vectorised one
 * (Abramowitz-Stegun 7.1.26, |error| < 1.5e-7), whose exp(-x^2) with
 * x = v / sqrt 2 IS exp(-v^2 / 2): one exp per element serves both cdf and
 * pdf, where ATen's gelu_backward computes two. Each row of gh is also
 * summed into the bias gradient while in registers (eager re-reads gh for
 * gh.sum(0)). Plain C that gcc -O3 -march=native -fopenmp-simd vectorises.
 */
#include <math.h>
#include <stdint.h>

#define HR_SQRT1_2 0.70710678118654752f
#define HR_INV_SQRT_2PI 0.39894228040143268f

/* exp(x) for x <= 0 (Cephes expf: 2^n * poly(r), |rel error| ~1e-7), inline so
 * the loop vectorises without a libm call; below -87 it flushes to 0. */
static inline float hr_exp_neg(float x) {
    x = x < -87.0f ? -87.0f : x;
    float n = floorf(fmaf(x, 1.44269504088896341f, 0.5f));
    float r = fmaf(n, -0.693359375f, x);
    r = fmaf(n, 2.12194440e-4f, r);
    float p = fmaf(fmaf(fmaf(fmaf(fmaf(1.9875691500e-4f, r, 1.3981999507e-3f), r, 8.3334519073e-3f), r,
                            4.1665795894e-2f), r, 1.6666665459e-1f), r, 5.0000001201e-1f);
    p = fmaf(p, r * r, r) + 1.0f;
    union { int32_t i; float f; } scale;
    scale.i = ((int32_t)n + 127) << 23;
    return p * scale.f;
}

/* erf(z) as ATen's vectorised CPU erf computes it (A-S 7.1.26); *e gets exp(-z^2). */
static inline float hr_erf(float z, float *e) {
    float t = 1.0f / fmaf(0.3275911f, fabsf(z), 1.0f);
    float p = fmaf(fmaf(fmaf(fmaf(1.061405429f, t, -1.453152027f), t, 1.421413741f), t,
                       -0.284496736f), t, 0.254829592f);
    *e = hr_exp_neg(-z * z);
    float erf_abs = 1.0f - p * t * *e;
    return z < 0.0f ? -erf_abs : erf_abs;
}

/* y = gelu(h) over [i0, i1); y may be h (in place: each element is read before it is written). */
void hr_gelu_forward(const float *h, float *y, int64_t i0, int64_t i1) {
#pragma omp simd
    for (int64_t i = i0; i < i1; i++) {
        float v = h[i], e;
        y[i] = v * 0.5f * (1.0f + hr_erf(v * HR_SQRT1_2, &e));
    }
}

/* Rows [r0, r1) of a row-major [rows, cols] problem; gb (cols doubles: long
 * columns summed in float drift) is accumulated into (the caller zeroes it),
 * so threads pass their own. */
void hr_gelu_backward_bias(const float *restrict gy, const float *restrict h,
                           float *restrict gh, double *restrict gb,
                           int64_t r0, int64_t r1, int64_t cols) {
    for (int64_t r = r0; r < r1; r++) {
        const float *a = gy + r * cols, *x = h + r * cols;
        float *o = gh + r * cols;
#pragma omp simd
        for (int64_t j = 0; j < cols; j++) {
            float v = x[j], e;
            float erf = hr_erf(v * HR_SQRT1_2, &e);
            float g = a[j] * (0.5f * (1.0f + erf) + v * e * HR_INV_SQRT_2PI);
            o[j] = g;
            gb[j] += (double)g;
        }
    }
}
