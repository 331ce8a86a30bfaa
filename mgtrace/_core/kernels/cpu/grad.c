/* Backward kernels: the gradients of pooling, resize and conv2d's weight,
 * and the index-add (scatter-add) that the backward of gathers needs
 * (mgtrace.autodiff.rules calls them through nn.pyx / index.pyx).
 *
 * Each mirrors its forward kernel's geometry (nn.h) exactly:
 *   max pooling  the gradient goes to the window's first maximum (taps in
 *                row-major order), or its first NaN when it holds one
 *                (PyTorch's choice; pool.c's forward lets a NaN win);
 *                positions outside the input are never chosen.
 *   avg pooling  each output's gradient / its divisor (pool.c's rule, with
 *                and without count_include_pad) spread over the window
 *                clipped to the input.
 *   adaptive     windows [floor(i*n/m), ceil((i+1)*n/m)) as pool.c.
 *   resize       the transpose of resize.c's taps: nearest adds each output's
 *                gradient to the source pixel, bilinear to its four taps
 *                with the forward's weights. The coordinate tables are the
 *                forward's (resize.c's nearest_index and linear_table,
 *                repeated here: resize.c keeps them static).
 *   activation   gy * act'(x) for the fused activations (act.c's set).
 *   conv2d dW    per group, dW[og, cg*kh*kw] = dY[og, L] @ cols[cg*kh*kw, L]^T
 *                with cols x's patches (im2col) over a chunk of images and
 *                L their output pixels: one GEMM per group and chunk.
 *
 * Pooling and resize gradients run one N*C plane per OpenMP task, so no two
 * threads add into the same element; index-add splits the inner extent.
 * float16/bfloat16 are computed in float32 by the caller.
 */
#ifndef MT_GRAD_TEMPLATE

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <cblas.h>
#include "nn.h"
#ifdef _OPENMP
#include <omp.h>
#endif

/* resize.c's nearest_index (PyTorch's shortcuts included) */
static int64_t grad_nearest_index(int64_t dst, int64_t n, int64_t m, double user_scale) {
    if (m == n) return dst;
    if (m == 2 * n) return dst >> 1;
    const float scale = user_scale > 0 ? (float)(1.0 / user_scale) : (float)n / (float)m;
    const int64_t src = (int64_t)floorf((float)dst * scale);
    return src < n - 1 ? src : n - 1;
}

/* conv dW: bytes of im2col columns a chunk of images (at least one image) */
#define MT_GRAD_COLS_BYTES ((int64_t)32 << 20)

#define MT_GRAD_TEMPLATE
#define T float
#define SFX f32
#include "grad.c"
#undef T
#undef SFX
#define T double
#define SFX f64
#include "grad.c"
#undef T
#undef SFX
#undef MT_GRAD_TEMPLATE

int mt_max_pool2d_backward(int dtype, const void *x, const void *gy, void *gx, const mt_pool2d_geom *g,
                           int nthreads) {
    if (dtype == MT_FLOAT32) max_pool_bw_f32(x, gy, gx, g, nthreads);
    else max_pool_bw_f64(x, gy, gx, g, nthreads);
    return 0;
}

int mt_avg_pool2d_backward(int dtype, const void *gy, void *gx, const mt_pool2d_geom *g, int nthreads) {
    if (dtype == MT_FLOAT32) avg_pool_bw_f32(gy, gx, g, nthreads);
    else avg_pool_bw_f64(gy, gx, g, nthreads);
    return 0;
}

int mt_adaptive_pool2d_backward(int dtype, int op, const void *x, const void *gy, void *gx, int64_t planes,
                                int64_t h, int64_t w, int64_t oh, int64_t ow, int nthreads) {
    if (dtype == MT_FLOAT32) adaptive_bw_f32(op, x, gy, gx, planes, h, w, oh, ow, nthreads);
    else adaptive_bw_f64(op, x, gy, gx, planes, h, w, oh, ow, nthreads);
    return 0;
}

int mt_resize2d_backward(int dtype, int mode, const void *gy, void *gx, int64_t planes, int64_t h, int64_t w,
                         int64_t oh, int64_t ow, double scale_h, double scale_w, int align_corners,
                         int nthreads) {
    if (dtype == MT_FLOAT32)
        return resize_bw_f32(mode, gy, gx, planes, h, w, oh, ow, scale_h, scale_w, align_corners, nthreads);
    return resize_bw_f64(mode, gy, gx, planes, h, w, oh, ow, scale_h, scale_w, align_corners, nthreads);
}

int mt_conv2d_backward_weight(int dtype, const void *x, const void *gy, void *gw, const mt_conv2d_geom *g,
                              int nthreads) {
    if (dtype == MT_FLOAT32) return conv_dw_f32(x, gy, gw, g, nthreads);
    return conv_dw_f64(x, gy, gw, g, nthreads);
}

int mt_index_add(int dtype, void *dst, int64_t rows, const int64_t *idx, int64_t n, const void *src,
                 int64_t inner, int nthreads) {
    for (int64_t k = 0; k < n; k++)
        if (idx[k] < 0 || idx[k] >= rows) return MT_NN_EINDEX;
    if (dtype == MT_FLOAT32) index_add_f32(dst, idx, n, src, inner, nthreads);
    else index_add_f64(dst, idx, n, src, inner, nthreads);
    return 0;
}

int mt_act_backward(int dtype, int act, const void *x, const void *gy, void *gx, int64_t n, int nthreads) {
    if (act <= MT_ACT_NONE || act >= MT_NACTS) return MT_NN_EINDEX;
    if (dtype == MT_FLOAT32) act_bw_f32(act, x, gy, gx, n, nthreads);
    else act_bw_f64(act, x, gy, gx, n, nthreads);
    return 0;
}

#else /* ------------------------------------------- MT_GRAD_TEMPLATE: T, SFX */

#define FN(name) MT_CAT(name, SFX)

static void FN(max_pool_bw)(const T *x, const T *gy, T *gx, const mt_pool2d_geom *g, int nt) {
    const int64_t hw = g->h * g->w, ohw = g->oh * g->ow;
    #pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1 && g->planes * ohw * g->kh * g->kw >= MT_NN_GRAIN)
    for (int64_t p = 0; p < g->planes; p++) {
        const T *xp = x + p * hw, *gp = gy + p * ohw;
        T *dp = gx + p * hw;
        memset(dp, 0, (size_t)hw * sizeof(T));
        for (int64_t oy = 0; oy < g->oh; oy++) {
            const int64_t y0 = oy * g->sh - g->ph;
            for (int64_t ox = 0; ox < g->ow; ox++) {
                const int64_t x0 = ox * g->sw - g->pw;
                int64_t arg = -1;
                T m = 0;
                for (int64_t kh = 0; kh < g->kh; kh++) {
                    const int64_t iy = y0 + kh * g->dh;
                    if (iy < 0 || iy >= g->h) continue;
                    for (int64_t kw = 0; kw < g->kw; kw++) {
                        const int64_t ix = x0 + kw * g->dw;
                        if (ix < 0 || ix >= g->w) continue;
                        const T v = xp[iy * g->w + ix];
                        if (arg < 0 || (m == m && (v > m || v != v))) { m = v; arg = iy * g->w + ix; }
                    }
                }
                if (arg >= 0) dp[arg] += gp[oy * g->ow + ox];
            }
        }
    }
}

static void FN(avg_pool_bw)(const T *gy, T *gx, const mt_pool2d_geom *g, int nt) {
    const int64_t hw = g->h * g->w, ohw = g->oh * g->ow;
    #pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1 && g->planes * ohw * g->kh * g->kw >= MT_NN_GRAIN)
    for (int64_t p = 0; p < g->planes; p++) {
        const T *gp = gy + p * ohw;
        T *dp = gx + p * hw;
        memset(dp, 0, (size_t)hw * sizeof(T));
        for (int64_t oy = 0; oy < g->oh; oy++) {
            int64_t ys = oy * g->sh - g->ph, ye = mt_min64(ys + g->kh, g->h + g->ph);
            const int64_t padded_h = ye - ys;
            ys = mt_max64(ys, 0);
            ye = mt_min64(ye, g->h);
            for (int64_t ox = 0; ox < g->ow; ox++) {
                int64_t xs = ox * g->sw - g->pw, xe = mt_min64(xs + g->kw, g->w + g->pw);
                const int64_t padded_w = xe - xs;
                xs = mt_max64(xs, 0);
                xe = mt_min64(xe, g->w);
                const int64_t count = g->count_include_pad ? padded_h * padded_w
                                                           : mt_max64(0, ye - ys) * mt_max64(0, xe - xs);
                if (count <= 0) continue;
                const T d = gp[oy * g->ow + ox] / (T)count;
                for (int64_t iy = ys; iy < ye; iy++)
                    for (int64_t ix = xs; ix < xe; ix++) dp[iy * g->w + ix] += d;
            }
        }
    }
}

static void FN(adaptive_bw)(int op, const T *x, const T *gy, T *gx, int64_t planes, int64_t h, int64_t w,
                            int64_t oh, int64_t ow, int nt) {
    const int64_t hw = h * w, ohw = oh * ow;
    #pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1 && planes * hw >= MT_NN_GRAIN)
    for (int64_t p = 0; p < planes; p++) {
        const T *gp = gy + p * ohw;
        T *dp = gx + p * hw;
        memset(dp, 0, (size_t)hw * sizeof(T));
        for (int64_t oy = 0; oy < oh; oy++) {
            const int64_t ys = oy * h / oh, ye = ((oy + 1) * h + oh - 1) / oh;
            for (int64_t ox = 0; ox < ow; ox++) {
                const int64_t xs = ox * w / ow, xe = ((ox + 1) * w + ow - 1) / ow;
                const T gv = gp[oy * ow + ox];
                if (op == MT_ADAPTIVE_MAX) {
                    const T *xp = x + p * hw;
                    int64_t arg = ys * w + xs;
                    T m = xp[arg];
                    for (int64_t iy = ys; iy < ye; iy++)
                        for (int64_t ix = xs; ix < xe; ix++) {
                            const T v = xp[iy * w + ix];
                            if (m == m && (v > m || v != v)) { m = v; arg = iy * w + ix; }
                        }
                    dp[arg] += gv;
                } else {
                    const T d = gv / (T)((ye - ys) * (xe - xs));
                    for (int64_t iy = ys; iy < ye; iy++)
                        for (int64_t ix = xs; ix < xe; ix++) dp[iy * w + ix] += d;
                }
            }
        }
    }
}

/* resize.c's linear_table: bilinear taps along one axis of n -> m */
static void FN(grad_linear_table)(int64_t n, int64_t m, double user_scale, int align_corners,
                                  int64_t *i0, int64_t *i1, T *f1) {
    T scale;
    if (align_corners) scale = m > 1 ? (T)(n - 1) / (T)(m - 1) : (T)0;
    else scale = user_scale > 0 ? (T)(1.0 / user_scale) : (T)n / (T)m;
    for (int64_t i = 0; i < m; i++) {
        T src = align_corners ? scale * (T)i : scale * ((T)i + (T)0.5) - (T)0.5;
        if (src < 0) src = 0;
        const int64_t a = (int64_t)src;
        i0[i] = a;
        i1[i] = a + (a < n - 1 ? 1 : 0);
        T f = src - (T)a;
        f1[i] = f < 0 ? (T)0 : (f > 1 ? (T)1 : f);
    }
}

static int FN(resize_bw)(int mode, const T *gy, T *gx, int64_t planes, int64_t h, int64_t w, int64_t oh,
                         int64_t ow, double scale_h, double scale_w, int align_corners, int nt) {
    const int64_t hw = h * w, ohw = oh * ow;
    int64_t *idx = malloc(sizeof(int64_t) * (size_t)(2 * (oh + ow) + 1));
    T *wt = malloc(sizeof(T) * (size_t)(oh + ow + 1));
    if (!idx || !wt) { free(idx); free(wt); return MT_NN_ENOMEM; }
    int64_t *y0 = idx, *y1 = y0 + oh, *x0 = y1 + oh, *x1 = x0 + ow;
    T *fy = wt, *fx = wt + oh;
    if (mode == MT_RESIZE_NEAREST) {
        for (int64_t i = 0; i < oh; i++) y0[i] = grad_nearest_index(i, h, oh, scale_h);
        for (int64_t i = 0; i < ow; i++) x0[i] = grad_nearest_index(i, w, ow, scale_w);
    } else {
        FN(grad_linear_table)(h, oh, scale_h, align_corners, y0, y1, fy);
        FN(grad_linear_table)(w, ow, scale_w, align_corners, x0, x1, fx);
    }
    #pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1 && planes * ohw >= MT_NN_GRAIN)
    for (int64_t p = 0; p < planes; p++) {
        const T *gp = gy + p * ohw;
        T *dp = gx + p * hw;
        memset(dp, 0, (size_t)hw * sizeof(T));
        for (int64_t oy = 0; oy < oh; oy++) {
            const T *gr = gp + oy * ow;
            if (mode == MT_RESIZE_NEAREST) {
                T *dr = dp + y0[oy] * w;
                for (int64_t ox = 0; ox < ow; ox++) dr[x0[ox]] += gr[ox];
            } else {
                T *ra = dp + y0[oy] * w, *rb = dp + y1[oy] * w;
                const T b1 = fy[oy], b0 = (T)1 - b1;
                for (int64_t ox = 0; ox < ow; ox++) {
                    const T a1 = fx[ox], a0 = (T)1 - a1, v = gr[ox];
                    ra[x0[ox]] += b0 * a0 * v;
                    ra[x1[ox]] += b0 * a1 * v;
                    rb[x0[ox]] += b1 * a0 * v;
                    rb[x1[ox]] += b1 * a1 * v;
                }
            }
        }
    }
    free(idx);
    free(wt);
    return 0;
}

/* C[m x n] (+)= A[m x k] @ B[n x k]^T, row-major */
static void FN(gemm_nt)(int64_t m, int64_t n, int64_t k, const T *a, int64_t lda, const T *b, int64_t ldb,
                        int accumulate, T *c, int64_t ldc) {
    if (sizeof(T) == 4)
        scipy_cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)m, (blasint)n, (blasint)k, 1.0f,
                          (const float *)a, (blasint)lda, (const float *)b, (blasint)ldb,
                          accumulate ? 1.0f : 0.0f, (float *)c, (blasint)ldc);
    else
        scipy_cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)m, (blasint)n, (blasint)k, 1.0,
                          (const double *)a, (blasint)lda, (const double *)b, (blasint)ldb,
                          accumulate ? 1.0 : 0.0, (double *)c, (blasint)ldc);
}

static int FN(conv_dw)(const T *x, const T *gy, T *gw, const mt_conv2d_geom *g, int nt) {
    const int64_t cg = g->c / g->groups, og = g->o / g->groups, kk = g->kh * g->kw;
    const int64_t rows = g->c * kk, ohw = g->oh * g->ow, hw = g->h * g->w;
    if (g->n == 0 || ohw == 0) {
        memset(gw, 0, (size_t)(g->o * cg * kk) * sizeof(T));
        return 0;
    }
    /* images a chunk: their columns within MT_GRAD_COLS_BYTES */
    int64_t nc = MT_GRAD_COLS_BYTES / mt_max64(1, rows * ohw * (int64_t)sizeof(T));
    nc = mt_max64(1, mt_min64(nc, g->n));
    const int64_t L = nc * ohw;
    T *cols = malloc(sizeof(T) * (size_t)(rows * L));
    T *dy = malloc(sizeof(T) * (size_t)(g->o * L));
    if (!cols || !dy) { free(cols); free(dy); return MT_NN_ENOMEM; }
    for (int64_t n0 = 0; n0 < g->n; n0 += nc) {
        const int64_t cnt = mt_min64(nc, g->n - n0), len = cnt * ohw;
        /* cols[r][i * ohw + q] for r = (c, ki, kj), image n0 + i, output pixel q */
        #pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1 && rows * len >= MT_NN_GRAIN)
        for (int64_t r = 0; r < rows; r++) {
            const int64_t ch = r / kk, ki = r % kk / g->kw, kj = r % g->kw;
            T *dst = cols + r * L;
            for (int64_t i = 0; i < cnt; i++) {
                const T *xp = x + ((n0 + i) * g->c + ch) * hw;
                for (int64_t oy = 0; oy < g->oh; oy++) {
                    const int64_t iy = oy * g->sh - g->ph + ki * g->dh;
                    T *d = dst + i * ohw + oy * g->ow;
                    if (iy < 0 || iy >= g->h) {
                        memset(d, 0, (size_t)g->ow * sizeof(T));
                        continue;
                    }
                    const T *xr = xp + iy * g->w;
                    const int64_t x0 = kj * g->dw - g->pw;
                    for (int64_t ox = 0; ox < g->ow; ox++) {
                        const int64_t ix = x0 + ox * g->sw;
                        d[ox] = ix >= 0 && ix < g->w ? xr[ix] : (T)0;
                    }
                }
            }
        }
        /* dy[o][i * ohw + q] */
        #pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1 && g->o * len >= MT_NN_GRAIN)
        for (int64_t o = 0; o < g->o; o++)
            for (int64_t i = 0; i < cnt; i++)
                memcpy(dy + o * L + i * ohw, gy + ((n0 + i) * g->o + o) * ohw, (size_t)ohw * sizeof(T));
        for (int64_t grp = 0; grp < g->groups; grp++)
            FN(gemm_nt)(og, cg * kk, len, dy + grp * og * L, L, cols + grp * cg * kk * L, L, n0 > 0,
                        gw + grp * og * cg * kk, cg * kk);
    }
    free(cols);
    free(dy);
    return 0;
}

/* gx = gy * act'(x), x the pre-activation (act.c's functions; PyTorch's
 * subgradients: relu 0 at 0, relu6 0 at 0 and 6, hardswish (2x + 3) / 6 on
 * [-3, 3]) */
static void FN(act_bw)(int act, const T *x, const T *gy, T *gx, int64_t n, int nt) {
    #pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1 && n >= MT_NN_GRAIN)
    for (int64_t i = 0; i < n; i++) {
        const double v = (double)x[i];
        double d;
        switch (act) {
        case MT_ACT_RELU: d = v > 0; break;
        case MT_ACT_RELU6: d = v > 0 && v < 6; break;
        case MT_ACT_SILU: { const double s = 1.0 / (1.0 + exp(-v)); d = s * (1.0 + v * (1.0 - s)); break; }
        case MT_ACT_HARDSWISH: d = v < -3 ? 0.0 : (v > 3 ? 1.0 : (2.0 * v + 3.0) / 6.0); break;
        case MT_ACT_SIGMOID: { const double s = 1.0 / (1.0 + exp(-v)); d = s * (1.0 - s); break; }
        default:   /* MT_ACT_GELU, exact: Phi(x) + x phi(x) */
            d = 0.5 * (1.0 + erf(v * 0.70710678118654752440)) + v * exp(-0.5 * v * v) * 0.39894228040143267794;
        }
        gx[i] = (T)((double)gy[i] * d);
    }
}

static void FN(index_add)(T *dst, const int64_t *idx, int64_t n, const T *src, int64_t inner, int nt) {
    /* threads take disjoint column blocks, so repeated indices never race */
    const int64_t blk = 64, nblk = (inner + blk - 1) / blk;
    #pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1 && nblk > 1 && n * inner >= MT_NN_GRAIN)
    for (int64_t b = 0; b < nblk; b++) {
        const int64_t lo = b * blk, hi = mt_min64(inner, lo + blk);
        for (int64_t k = 0; k < n; k++) {
            T *d = dst + idx[k] * inner;
            const T *s = src + k * inner;
            for (int64_t j = lo; j < hi; j++) d[j] += s[j];
        }
    }
}

#undef FN
#endif
