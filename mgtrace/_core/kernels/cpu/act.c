/* Activation epilogues: the activation a fused convolution or linear layer
 * applies to its output while it is still in cache (enum mt_act, nn.h).
 *
 * float32 SiLU, sigmoid and GELU take the vector loops of mt_vmath.h;
 * float64 uses libm. Both are elementwise, so the result is the same as the
 * separate activation op's (tests/core/test_fused_kernels.py checks it). */
#include "nn.h"
#include "mt_vmath.h"
#ifdef _OPENMP
#include <omp.h>
#endif

MT_VMAP_LOOP(act_silu_f32, mt_vsilu(x))
MT_VMAP_LOOP(act_sigmoid_f32, mt_vsigmoid(x))
MT_VMAP_LOOP(act_gelu_f32, mt_vgelu(x))

static MT_CLONES void act_relu_f32(float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = y[i] < 0 ? 0 : y[i];
}
static MT_CLONES void act_relu6_f32(float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = y[i] < 0 ? 0 : (y[i] > 6 ? 6 : y[i]);
}
static MT_CLONES void act_hardswish_f32(float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const float x = y[i];
        y[i] = x * (x <= -3 ? 0 : (x >= 3 ? 1 : (x + 3) / 6));
    }
}

void mt_act_f32(float *y, int64_t n, int act) {
    switch (act) {
    case MT_ACT_RELU: act_relu_f32(y, n); break;
    case MT_ACT_RELU6: act_relu6_f32(y, n); break;
    case MT_ACT_SILU: act_silu_f32(y, y, n); break;
    case MT_ACT_HARDSWISH: act_hardswish_f32(y, n); break;
    case MT_ACT_SIGMOID: act_sigmoid_f32(y, y, n); break;
    case MT_ACT_GELU: act_gelu_f32(y, y, n); break;
    default: break;
    }
}

void mt_act_f64(double *y, int64_t n, int act) {
    for (int64_t i = 0; i < n; i++) {
        const double x = y[i];
        switch (act) {
        case MT_ACT_RELU: y[i] = x < 0 ? 0 : x; break;
        case MT_ACT_RELU6: y[i] = x < 0 ? 0 : (x > 6 ? 6 : x); break;
        case MT_ACT_SILU: y[i] = x / (1 + exp(-x)); break;
        case MT_ACT_HARDSWISH: y[i] = x * (x <= -3 ? 0 : (x >= 3 ? 1 : (x + 3) / 6)); break;
        case MT_ACT_SIGMOID: y[i] = 1 / (1 + exp(-x)); break;
        case MT_ACT_GELU: y[i] = x * 0.5 * (1 + erf(x * 0.70710678118654752440)); break;
        default: return;
        }
    }
}

/* y [rows, cols] row-major: y[r][c] = act(y[r][c] + bias[c]) (bias may be
 * NULL). Rows are shared over threads when there is enough work. */
int mt_bias_act(int dtype, void *y, int64_t rows, int64_t cols, const void *bias, int act, int nthreads) {
    const int par = nthreads > 1 && rows > 1 && rows * cols * (act >= MT_ACT_SILU ? 8 : 1) >= MT_NN_GRAIN;
    #pragma omp parallel for num_threads(nthreads) schedule(static) if (par)
    for (int64_t r = 0; r < rows; r++) {
        if (dtype == MT_FLOAT32) {
            float *d = (float *)y + r * cols;
            if (bias) { const float *b = bias; for (int64_t c = 0; c < cols; c++) d[c] += b[c]; }
            mt_act_f32(d, cols, act);
        } else {
            double *d = (double *)y + r * cols;
            if (bias) { const double *b = bias; for (int64_t c = 0; c < cols; c++) d[c] += b[c]; }
            mt_act_f64(d, cols, act);
        }
    }
    return 0;
}
