/* GELU (exact erf form) backward fused with the bias-gradient column sum.
 *
 * Eager runs gelu_backward (reads gy and h, writes gh) and then gh.sum(0)
 * (reads gh again). Here each row of gh is summed into the bias gradient
 * while it is still in registers. Built with -ffast-math -fopenmp-simd so
 * gcc calls glibc's vector erff/expf (libmvec) 16 lanes at a time.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#define HR_SQRT1_2 0.70710678118654752f
#define HR_INV_SQRT_2PI 0.39894228040143268f

/* Rows [r0, r1) of a row-major [rows, cols] problem; gb (cols floats) is
 * accumulated into (the caller zeroes it), so threads pass their own. */
void hr_gelu_backward_bias(const float *restrict gy, const float *restrict h,
                           float *restrict gh, float *restrict gb,
                           int64_t r0, int64_t r1, int64_t cols) {
    for (int64_t r = r0; r < r1; r++) {
        const float *a = gy + r * cols, *x = h + r * cols;
        float *o = gh + r * cols;
#pragma omp simd
        for (int64_t j = 0; j < cols; j++) {
            float v = x[j];
            float cdf = 0.5f * (1.0f + erff(v * HR_SQRT1_2));
            float pdf = expf(-0.5f * v * v) * HR_INV_SQRT_2PI;
            float g = a[j] * (cdf + v * pdf);
            o[j] = g;
            gb[j] += g;
        }
    }
}

int hr_fused_abi(void) { return 1; }
