/* Layer normalization over contiguous rows, in one pass over the output:
 * y[r][j] = (x[r][j] - mean_r) * rstd_r * w[j] + b[j] with mean_r and the
 * biased variance of row r, rstd_r = 1 / sqrt(var_r + eps).
 *
 * The composed form (mean, var, sub, add, rsqrt, mul, mul, add) makes eight
 * passes over the tensor and its var updates a running mean one element at
 * a time (a division per element): MiniLM's 8 x 128 x 384 LayerNorm took
 * ~1.7 ms that way. Here the mean and then the sum of squared deviations
 * (two passes over the row, which is in cache) accumulate in double, in 8
 * lanes so that the loops vectorise; the result is within float32 rounding
 * of the composed one (tests/core/test_fused_kernels.py). Rows are shared
 * over threads when there is enough work.
 */
#include "nn.h"
#include "mt_moments.h"

#ifndef MT_NN_TEMPLATE

#define MT_NN_TEMPLATE
#define T float
#define SFX f32
#include "norm.c"
#undef T
#undef SFX
#define T double
#define SFX f64
#include "norm.c"
#undef T
#undef SFX
#undef MT_NN_TEMPLATE

int mt_layer_norm(int dtype, const void *x, const void *w, const void *b, void *y, int64_t rows, int64_t cols,
                  double eps, int nthreads) {
    const int par = nthreads > 1 && rows > 1 && rows * cols >= MT_NN_GRAIN;
    #pragma omp parallel for num_threads(nthreads) schedule(static) if (par)
    for (int64_t r = 0; r < rows; r++) {
        if (dtype == MT_FLOAT32)
            layer_norm_row_f32((const float *)x + r * cols, w, b, (float *)y + r * cols, cols, eps);
        else
            layer_norm_row_f64((const double *)x + r * cols, w, b, (double *)y + r * cols, cols, eps);
    }
    return 0;
}

int mt_add_layer_norm(int dtype, const void *x, const void *x_bias, const void *residual, const void *w,
                      const void *b, void *y, int64_t rows, int64_t cols, double eps, int nthreads) {
    const int par = nthreads > 1 && rows > 1 && rows * cols >= MT_NN_GRAIN;
    #pragma omp parallel for num_threads(nthreads) schedule(static) if (par)
    for (int64_t r = 0; r < rows; r++) {
        if (dtype == MT_FLOAT32)
            add_layer_norm_row_f32((const float *)x + r * cols, x_bias,
                                   residual ? (const float *)residual + r * cols : NULL, w, b,
                                   (float *)y + r * cols, cols, eps);
        else
            add_layer_norm_row_f64((const double *)x + r * cols, x_bias,
                                   residual ? (const double *)residual + r * cols : NULL, w, b,
                                   (double *)y + r * cols, cols, eps);
    }
    return 0;
}

#else /* ------------------------------------------- MT_NN_TEMPLATE: T, SFX */

#define FN(name) MT_CAT(name, SFX)

static MT_CLONES void FN(layer_norm_row)(const T *restrict x, const void *wv, const void *bv, T *restrict y,
                                         int64_t n, double eps) {
    const T *restrict w = wv, *restrict b = bv;
    double mean, rstd;
    FN(mt_row_moments)(x, n, eps, &mean, &rstd);
    int64_t i;
    const T m = (T)mean, rs = (T)rstd;
    if (w && b) for (i = 0; i < n; i++) y[i] = (x[i] - m) * rs * w[i] + b[i];
    else if (w) for (i = 0; i < n; i++) y[i] = (x[i] - m) * rs * w[i];
    else if (b) for (i = 0; i < n; i++) y[i] = (x[i] - m) * rs + b[i];
    else for (i = 0; i < n; i++) y[i] = (x[i] - m) * rs;
}

/* one row of mt_add_layer_norm: the sums into y (x and r may be y: no
 * restrict), then layer_norm_row's normalization of y in place, the same
 * arithmetic as the additions and the layer norm one after the other */
static MT_CLONES void FN(add_layer_norm_row)(const T *x, const void *xbv, const T *r, const void *wv,
                                             const void *bv, T *y, int64_t n, double eps) {
    const T *restrict xb = xbv, *restrict w = wv, *restrict b = bv;
    int64_t i;
    if (xb && r) for (i = 0; i < n; i++) y[i] = (x[i] + xb[i]) + r[i];
    else if (xb) for (i = 0; i < n; i++) y[i] = x[i] + xb[i];
    else if (r) for (i = 0; i < n; i++) y[i] = x[i] + r[i];
    else if (y != x) for (i = 0; i < n; i++) y[i] = x[i];
    double mean, rstd;
    FN(mt_row_moments)(y, n, eps, &mean, &rstd);
    const T m = (T)mean, rs = (T)rstd;
    if (w && b) for (i = 0; i < n; i++) y[i] = (y[i] - m) * rs * w[i] + b[i];
    else if (w) for (i = 0; i < n; i++) y[i] = (y[i] - m) * rs * w[i];
    else if (b) for (i = 0; i < n; i++) y[i] = (y[i] - m) * rs + b[i];
    else for (i = 0; i < n; i++) y[i] = (y[i] - m) * rs;
}

#undef FN
#endif
