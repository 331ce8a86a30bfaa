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
 *                forward's (mt_taps.h's, which resize.c uses too).
 *   activation   gy * act'(x) for the fused activations (act.c's set);
 *                float32 SiLU, sigmoid and GELU on mt_vmath.h's vector exp
 *                and erf (act.c's forward uses the same), float64 on libm.
 *   layer norm   per row, mean and 1/std again as norm.c's forward (double
 *                sums), then gx = rstd (g - mean(g) - xhat mean(g xhat)),
 *                g = gy w: one pass over x and gy; dweight = sum gy xhat and
 *                dbias = sum gy over the rows, in double per thread, added
 *                up at the end in thread order.
 *   conv2d dW    per group, dW[og, cg*kh*kw] += dY[og, L] @ cols[cg*kh*kw, L]^T
 *                with cols x's patches (im2col) over a piece of the output
 *                pixels (L of them): one single-threaded GEMM per group and
 *                piece, the pieces shared over threads (see conv_dw).
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
#include "mt_taps.h"
#include "mt_moments.h"
#include "blas_threads.h"
#include "mt_vmath.h"
#if MT_ISA_CLONES
#include <immintrin.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

/* float32 gx = gy * act'(x) over MT_VL lanes at a time for the activations
 * whose derivative needs exp or erf (GELU: Phi(x) + x phi(x); SiLU:
 * s (1 + x (1 - s)); sigmoid: s (1 - s)); the tail through zero-padded
 * buffers */
#define MT_GRAD_VACT(NAME, VEXPR)                                              \
    static MT_VCLONES void NAME(const float *xs, const float *gy, float *gx, int64_t n) { \
        int64_t i = 0;                                                         \
        for (; i + MT_VL <= n; i += MT_VL) {                                   \
            mt_vf x, g; memcpy(&x, xs + i, sizeof x); memcpy(&g, gy + i, sizeof g); \
            mt_vf v = g * (VEXPR); memcpy(gx + i, &v, sizeof v);               \
        }                                                                      \
        if (i < n) {                                                           \
            float bx[MT_VL] = {0}, bg[MT_VL] = {0};                            \
            memcpy(bx, xs + i, (size_t)(n - i) * 4); memcpy(bg, gy + i, (size_t)(n - i) * 4); \
            mt_vf x, g; memcpy(&x, bx, sizeof x); memcpy(&g, bg, sizeof g);    \
            mt_vf v = g * (VEXPR); memcpy(bx, &v, sizeof v);                   \
            memcpy(gx + i, bx, (size_t)(n - i) * 4);                           \
        }                                                                      \
    }
MT_GRAD_VACT(gelu_bw_f32, 0.5f * (1.0f + mt_verf(x * 0.70710678118654752440f)) +
                          x * mt_vexp(-0.5f * x * x) * 0.39894228040143267794f)
MT_GRAD_VACT(silu_bw_f32, mt_vsigmoid(x) * (1.0f + x * (1.0f - mt_vsigmoid(x))))
MT_GRAD_VACT(sigmoid_bw_f32, mt_vsigmoid(x) * (1.0f - mt_vsigmoid(x)))

/* float32 act backward through the vector loops above, a block of elements
 * per OpenMP task; 0 when act has none (the scalar loop runs) */
static int act_bw_vec_f32(int act, const float *x, const float *gy, float *gx, int64_t n, int nt) {
    void (*f)(const float *, const float *, float *, int64_t) =
        act == MT_ACT_GELU ? gelu_bw_f32 : act == MT_ACT_SILU ? silu_bw_f32 :
        act == MT_ACT_SIGMOID ? sigmoid_bw_f32 : NULL;
    if (f == NULL) return 0;
    const int64_t blk = 16384, nblk = (n + blk - 1) / blk;
    #pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1 && nblk > 1 && n >= MT_NN_GRAIN / 8)
    for (int64_t b = 0; b < nblk; b++) {
        const int64_t lo = b * blk, len = mt_min64(n - lo, blk);
        f(x + lo, gy + lo, gx + lo, len);
    }
    return 1;
}

/* max-pool backward over one output row's outputs [ox, oxb), whose windows
 * lie inside the input (y0 the window's top row), at stride S (1 or 2):
 * MT_VL outputs at a time, each lane keeping its window's maximum and where
 * it is, taps in row-major order with max_pool_one's rule (the first
 * maximum; a NaN wins and the first NaN stays). At stride 2 a block that
 * would come within 2 MT_VL values of the plane's end (hw values) is left
 * to the scalar loop, as max_pool_row_avx512 must (this loop itself reads
 * nothing outside the windows), so both leave the same outputs. Then each
 * output's gradient is added at its argmax in output order. Returns the
 * first output not done. */
static inline __attribute__((always_inline)) int64_t
max_pool_row_body(const float *xp, const float *gr, float *dp, const mt_pool2d_geom *g, int64_t y0, int64_t ox,
                  int64_t oxb, int64_t hw, const int S) {
    const int64_t span = (g->kh - 1) * g->dh * g->w + (g->kw - 1) * g->dw;   /* last tap - first */
    for (; ox + MT_VL <= oxb; ox += MT_VL) {
        const int64_t first = y0 * g->w + ox * S - g->pw;
        if (S == 2 && first + span + 2 * MT_VL > hw) break;
        float m[MT_VL];
        int32_t arg[MT_VL];
        for (int l = 0; l < MT_VL; l++) {
            m[l] = xp[first + l * S];
            arg[l] = (int32_t)first + l * S;
        }
        for (int64_t kh = 0; kh < g->kh; kh++) {
            const int64_t row = first + kh * g->dh * g->w;
            for (int64_t kw = kh == 0; kw < g->kw; kw++) {
                const int64_t at = row + kw * g->dw;
                const float *xa = xp + at;
                /* GCC unrolls this lane loop into scalar code (it still branches):
                 * the AVX-512 version below is the fast one, this the portable form */
                for (int l = 0; l < MT_VL; l++) {
                    const float v = xa[l * S];
                    const int take = (v > m[l]) | ((v != v) & (m[l] == m[l]));
                    m[l] = take ? v : m[l];
                    arg[l] = take ? (int32_t)at + l * S : arg[l];
                }
            }
        }
        for (int l = 0; l < MT_VL; l++) dp[arg[l]] += gr[ox + l];
    }
    return ox;
}

#if MT_ISA_CLONES
/* max_pool_row_body in AVX-512 (where mt_cpu_avx512()): GCC does not
 * vectorise the body's lane loop (it unrolls it into scalar branches), so
 * here the lanes are one register, the choice a compare mask (a greater
 * value, or a NaN over a number: max_pool_one's rule) and the stride-2
 * taps two loads de-interleaved by a permute, which read up to 2 MT_VL - 1
 * values past a tap: a block that would read past the plane is left to the
 * scalar loop */
static MT_V4ONLY int64_t max_pool_row_avx512(const float *xp, const float *gr, float *dp, const mt_pool2d_geom *g,
                                             int64_t y0, int64_t ox, int64_t oxb, int64_t hw, int S) {
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i lane = S == 1 ? _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15) : even;
    const int64_t span = (g->kh - 1) * g->dh * g->w + (g->kw - 1) * g->dw;   /* last tap - first */
    for (; ox + MT_VL <= oxb; ox += MT_VL) {
        const int64_t first = y0 * g->w + ox * S - g->pw;
        if (S == 2 && first + span + 2 * MT_VL > hw) break;
        __m512 m = S == 1 ? _mm512_loadu_ps(xp + first)
                          : _mm512_permutex2var_ps(_mm512_loadu_ps(xp + first), even,
                                                   _mm512_loadu_ps(xp + first + MT_VL));
        __m512i arg = _mm512_add_epi32(_mm512_set1_epi32((int32_t)first), lane);
        for (int64_t kh = 0; kh < g->kh; kh++) {
            const int64_t row = first + kh * g->dh * g->w;
            for (int64_t kw = kh == 0; kw < g->kw; kw++) {
                const int64_t at = row + kw * g->dw;
                const __m512 v = S == 1 ? _mm512_loadu_ps(xp + at)
                                        : _mm512_permutex2var_ps(_mm512_loadu_ps(xp + at), even,
                                                                 _mm512_loadu_ps(xp + at + MT_VL));
                const __mmask16 take = _mm512_cmp_ps_mask(v, m, _CMP_GT_OQ) |
                                       (_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q) & _mm512_cmp_ps_mask(m, m, _CMP_ORD_Q));
                m = _mm512_mask_mov_ps(m, take, v);
                arg = _mm512_mask_mov_epi32(arg, take, _mm512_add_epi32(_mm512_set1_epi32((int32_t)at), lane));
            }
        }
        int32_t where[MT_VL];
        _mm512_storeu_si512(where, arg);
        for (int l = 0; l < MT_VL; l++) dp[where[l]] += gr[ox + l];
    }
    return ox;
}
#endif

static MT_VCLONES int64_t max_pool_row_s1(const float *xp, const float *gr, float *dp, const mt_pool2d_geom *g,
                                          int64_t y0, int64_t ox, int64_t oxb, int64_t hw) {
    return max_pool_row_body(xp, gr, dp, g, y0, ox, oxb, hw, 1);
}

static MT_VCLONES int64_t max_pool_row_s2(const float *xp, const float *gr, float *dp, const mt_pool2d_geom *g,
                                          int64_t y0, int64_t ox, int64_t oxb, int64_t hw) {
    return max_pool_row_body(xp, gr, dp, g, y0, ox, oxb, hw, 2);
}

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
    if (act == MT_ACT_RELU || act == MT_ACT_RELU6) {
        if (dtype == MT_FLOAT32) relu_bw_f32(act == MT_ACT_RELU6, x, gy, gx, n, nthreads);
        else relu_bw_f64(act == MT_ACT_RELU6, x, gy, gx, n, nthreads);
        return 0;
    }
    if (dtype == MT_FLOAT32) {
        if (!act_bw_vec_f32(act, x, gy, gx, n, nthreads)) act_bw_f32(act, x, gy, gx, n, nthreads);
    } else {
        act_bw_f64(act, x, gy, gx, n, nthreads);
    }
    return 0;
}

int mt_layer_norm_backward(int dtype, const void *x, const void *w, const void *gy, void *gx, void *gw,
                           void *gb, int64_t rows, int64_t cols, double eps, int nthreads) {
    if (rows <= 0 || cols <= 0) return 0;
    if (dtype == MT_FLOAT32) return layer_norm_bw_f32(x, w, gy, gx, gw, gb, rows, cols, eps, nthreads);
    return layer_norm_bw_f64(x, w, gy, gx, gw, gb, rows, cols, eps, nthreads);
}

#else /* ------------------------------------------- MT_GRAD_TEMPLATE: T, SFX */

#define FN(name) MT_CAT(name, SFX)

/* one output's gradient to its window's first maximum (first NaN) */
static inline void FN(max_pool_one)(const T *xp, T gv, T *dp, const mt_pool2d_geom *g, int64_t y0, int64_t x0) {
    int64_t arg = -1;
    T m = 0;
    if (y0 >= 0 && y0 + (g->kh - 1) * g->dh < g->h && x0 >= 0 && x0 + (g->kw - 1) * g->dw < g->w) {
        /* the window inside the plane: no bounds tests; the same choice (the first
         * maximum, the first NaN). GCC still branches on the comparison (random data
         * mispredicts it): float32 rows at stride 1 or 2 go through max_pool_row_avx512 or _s1/_s2 */
        arg = y0 * g->w + x0;
        m = xp[arg];
        for (int64_t kh = 0; kh < g->kh; kh++) {
            const int64_t row = (y0 + kh * g->dh) * g->w + x0;
            for (int64_t kw = kh == 0; kw < g->kw; kw++) {
                const int64_t at = row + kw * g->dw;
                const T v = xp[at];
                const int take = (v > m) | ((v != v) & (m == m));
                m = take ? v : m;
                arg = take ? at : arg;
            }
        }
        dp[arg] += gv;
        return;
    }
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
    if (arg >= 0) dp[arg] += gv;
}

static void FN(max_pool_bw)(const T *x, const T *gy, T *gx, const mt_pool2d_geom *g, int nt) {
    const int64_t hw = g->h * g->w, ohw = g->oh * g->ow;
    /* outputs [oxa, oxb) of a row have their windows inside the input's columns */
    const int64_t oxa = mt_min64(g->ow, (g->pw + g->sw - 1) / g->sw);
    const int64_t last = g->w - 1 + g->pw - (g->kw - 1) * g->dw;      /* x0 + pw of the last one */
    const int64_t oxb = last < 0 ? oxa : mt_max64(oxa, mt_min64(g->ow, last / g->sw + 1));
    const int vec = sizeof(T) == 4 && hw <= INT32_MAX && oxb - oxa >= MT_VL && (g->sw == 1 || g->sw == 2);
#if MT_ISA_CLONES
    const int wide = vec && mt_cpu_avx512();
#endif
    #pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1 && g->planes * ohw * g->kh * g->kw >= MT_NN_GRAIN)
    for (int64_t p = 0; p < g->planes; p++) {
        const T *xp = x + p * hw, *gp = gy + p * ohw;
        T *dp = gx + p * hw;
        memset(dp, 0, (size_t)hw * sizeof(T));
        for (int64_t oy = 0; oy < g->oh; oy++) {
            const int64_t y0 = oy * g->sh - g->ph;
            const int rows_in = y0 >= 0 && y0 + (g->kh - 1) * g->dh < g->h;
            for (int64_t ox = 0; ox < g->ow;) {
                if (vec && rows_in && ox == oxa) {
                    /* the interior, MT_VL outputs at a time; the same choices and the
                     * same order of the additions as max_pool_one */
                    const float *xf = (const float *)xp, *gf = (const float *)gp + oy * g->ow;
#if MT_ISA_CLONES
                    if (wide)
                        ox = max_pool_row_avx512(xf, gf, (float *)dp, g, y0, oxa, oxb, hw, (int)g->sw);
                    else
#endif
                        ox = (g->sw == 1 ? max_pool_row_s1 : max_pool_row_s2)(xf, gf, (float *)dp, g, y0, oxa,
                                                                               oxb, hw);
                    if (ox > oxa) continue;
                }
                FN(max_pool_one)(xp, gp[oy * g->ow + ox], dp, g, y0, ox * g->sw - g->pw);
                ox++;
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
            for (int64_t ox = 0; ox < g->ow; ox++) {
                int64_t ys, ye, xs, xe;
                const int64_t count = mt_avg_window(g, oy, ox, &ys, &ye, &xs, &xe);
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
            int64_t ys, ye, xs, xe;
            mt_adaptive_window(oy, h, oh, &ys, &ye);
            for (int64_t ox = 0; ox < ow; ox++) {
                mt_adaptive_window(ox, w, ow, &xs, &xe);
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

static int FN(resize_bw)(int mode, const T *gy, T *gx, int64_t planes, int64_t h, int64_t w, int64_t oh,
                         int64_t ow, double scale_h, double scale_w, int align_corners, int nt) {
    const int64_t hw = h * w, ohw = oh * ow;
    int64_t *idx;
    T *wt;
    if (FN(mt_resize_taps)(mode, h, w, oh, ow, scale_h, scale_w, align_corners, &idx, &wt))
        return MT_NN_ENOMEM;
    const int64_t *y0 = idx, *y1 = y0 + oh, *x0 = y1 + oh, *x1 = x0 + ow;
    const T *fy = wt, *fx = wt + oh;
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

/* d[t] = src[2 t], t < n (im2col's row at stride 2, vectorised in the clones) */
static MT_CLONES void FN(copy_stride2)(T *restrict d, const T *restrict src, int64_t n) {
    for (int64_t t = 0; t < n; t++) d[t] = src[2 * t];
}

/* One piece of conv dW's columns: images [i0, i0 + cnt) whole (cnt > 1), or
 * output pixels [q0, q1) of image i0 (cnt == 1). cols[r][j] (r = (c, ki,
 * kj), j the piece's column) gets x's patch values, 0 in the padding. */
static void FN(dw_im2col)(const T *x, const mt_conv2d_geom *g, int64_t i0, int64_t cnt, int64_t q0,
                          int64_t q1, T *cols, int64_t ld) {
    const int64_t kk = g->kh * g->kw, rows = g->c * kk, hw = g->h * g->w;
    for (int64_t r = 0; r < rows; r++) {
        const int64_t ch = r / kk, ki = r % kk / g->kw, kj = r % g->kw;
        const int64_t x0 = kj * g->dw - g->pw;
        T *d = cols + r * ld;
        for (int64_t i = 0; i < cnt; i++) {
            const T *xp = x + ((i0 + i) * g->c + ch) * hw;
            int64_t oy = q0 / g->ow, ox = q0 % g->ow;
            for (int64_t q = q0; q < q1;) {
                const int64_t run = mt_min64(g->ow - ox, q1 - q);     /* to the row's end */
                const int64_t iy = oy * g->sh - g->ph + ki * g->dh;
                if (iy < 0 || iy >= g->h) {
                    memset(d, 0, (size_t)run * sizeof(T));
                } else {
                    /* columns [ox, ox + run): zeros left of the input, a copy (strided
                     * at stride > 1) of the row, zeros right of it; no test per element */
                    const T *xr = xp + iy * g->w;
                    int64_t lo = x0 >= 0 ? 0 : (-x0 + g->sw - 1) / g->sw;           /* first ix >= 0 */
                    int64_t hi = x0 < g->w ? (g->w - 1 - x0) / g->sw + 1 : 0;        /* first ix >= w */
                    lo = mt_min64(mt_max64(lo - ox, 0), run);
                    hi = mt_min64(mt_max64(hi - ox, lo), run);
                    if (lo > 0) memset(d, 0, (size_t)lo * sizeof(T));
                    if (hi > lo) {
                        const T *src = xr + x0 + (ox + lo) * g->sw;
                        if (g->sw == 1) memcpy(d + lo, src, (size_t)(hi - lo) * sizeof(T));
                        else if (g->sw == 2) FN(copy_stride2)(d + lo, src, hi - lo);
                        else
                            for (int64_t t = lo; t < hi; t++) d[t] = src[(t - lo) * g->sw];
                    }
                    if (hi < run) memset(d + hi, 0, (size_t)(run - hi) * sizeof(T));
                }
                d += run;
                q += run;
                ox = 0;
                oy++;
            }
        }
    }
}

/* conv2d's weight gradient. The n * oh * ow output pixels (the GEMM's K)
 * are cut into pieces of about MT_GRAD_PIECE_BYTES of im2col columns (at
 * least MT_GRAD_PIECE_MIN columns: whole images grouped when an image has
 * fewer pixels, a range of one image's pixels when it has more). Threads
 * take whole pieces (static schedule, so the sums' order is fixed for a
 * thread count), each with its own columns, single-threaded GEMMs and
 * weight-gradient sum, added up in thread order at the end. OpenBLAS's
 * own threading of one tall-K GEMM instead met its threads at every K
 * panel: on a loaded machine each meeting waited for a descheduled thread
 * (the ResNet-18 stem's gradient took 17x the CPU time on two threads
 * that it took on one). A piece's columns stay in the L2 cache between
 * im2col writing them and the GEMM reading them: with 4 MiB pieces they
 * went out to memory and back (ResNet-18's weight gradients at batch 8,
 * one thread: 276 ms with 4 MiB pieces and a scalar stride-2 copy, 239
 * ms with 1 MiB and copy_stride2; 248 ms with 512 KiB). */
#define MT_GRAD_PIECE_BYTES ((int64_t)1 << 20)
#define MT_GRAD_PIECE_MIN 256

static int FN(conv_dw)(const T *x, const T *gy, T *gw, const mt_conv2d_geom *g, int nt) {
    const int64_t cg = g->c / g->groups, og = g->o / g->groups, kk = g->kh * g->kw;
    const int64_t rows = g->c * kk, ohw = g->oh * g->ow, wsize = g->o * cg * kk;
    memset(gw, 0, (size_t)wsize * sizeof(T));
    if (g->n == 0 || ohw == 0) return 0;
    int64_t want = mt_max64(MT_GRAD_PIECE_MIN, MT_GRAD_PIECE_BYTES / mt_max64(1, rows * (int64_t)sizeof(T)));
    /* cnt images a piece, or a piece per span columns of one image */
    const int64_t cnt = ohw >= want ? 1 : mt_min64(g->n, want / ohw);
    const int64_t per_image = ohw >= want ? (ohw + want - 1) / want : 1;
    const int64_t span = (ohw + per_image - 1) / per_image;
    const int64_t pieces = ohw >= want ? g->n * per_image : (g->n + cnt - 1) / cnt;
    const int64_t width = ohw >= want ? span : cnt * ohw;          /* most columns in a piece */
    const int team = (int)mt_max64(1, mt_min64(nt, pieces));
    T *acc = team > 1 ? calloc((size_t)(team - 1) * (size_t)wsize, sizeof(T)) : NULL;
    if (team > 1 && acc == NULL) return MT_NN_ENOMEM;
    int failed = 0;
    if (team > 1) mt_nn_blas_single_begin();
    #pragma omp parallel num_threads(team) if (team > 1) reduction(| : failed)
    {
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        T *mine = tid == 0 ? gw : acc + (size_t)(tid - 1) * (size_t)wsize;
        T *cols = malloc(sizeof(T) * (size_t)(rows * width));
        T *dy = cnt > 1 ? malloc(sizeof(T) * (size_t)(g->o * width)) : NULL;
        if (cols == NULL || (cnt > 1 && dy == NULL)) failed = 1;
        #pragma omp for schedule(static)
        for (int64_t pc = 0; pc < pieces; pc++) {
            if (failed) continue;
            int64_t i0, n_img, q0, q1;
            if (cnt == 1) {
                i0 = pc / per_image;
                n_img = 1;
                q0 = pc % per_image * span;
                q1 = mt_min64(ohw, q0 + span);
            } else {
                i0 = pc * cnt;
                n_img = mt_min64(cnt, g->n - i0);
                q0 = 0;
                q1 = ohw;
            }
            const int64_t len = n_img * (q1 - q0);
            FN(dw_im2col)(x, g, i0, n_img, q0, q1, cols, len);
            const T *gp;
            int64_t ldg;
            if (n_img == 1) {                  /* dy [o, ohw] of the image, read in place */
                gp = gy + i0 * g->o * ohw + q0;
                ldg = ohw;
            } else {                           /* dy[o][i * ohw + q] gathered */
                for (int64_t o = 0; o < g->o; o++)
                    for (int64_t i = 0; i < n_img; i++)
                        memcpy(dy + o * len + i * ohw, gy + ((i0 + i) * g->o + o) * ohw,
                               (size_t)ohw * sizeof(T));
                gp = dy;
                ldg = len;
            }
            for (int64_t grp = 0; grp < g->groups; grp++)
                FN(gemm_nt)(og, cg * kk, len, gp + grp * og * ldg, ldg, cols + grp * cg * kk * len, len, 1,
                            mine + grp * og * cg * kk, cg * kk);
        }
        free(cols);
        free(dy);
    }
    if (team > 1) mt_nn_blas_single_end();
    if (!failed)
        for (int t = 1; t < team; t++) {
            const T *a = acc + (size_t)(t - 1) * (size_t)wsize;
            for (int64_t j = 0; j < wsize; j++) gw[j] += a[j];
        }
    free(acc);
    return failed ? MT_NN_ENOMEM : 0;
}

/* relu's and relu6's gx = gy * (0 < x < top), top 6 or none, the product kept (gy * 0 is NaN
 * for an infinite gy, as the scalar loop's). The two comparisons make GCC vectorise the loop:
 * gy * (x > 0) alone becomes a branch, which random signs mispredict half the time (5x the CPU
 * time). Without a top, top is NaN: !(x >= NaN) always holds */
static MT_CLONES void FN(relu_bw)(int six, const void *xv, const void *gyv, void *gxv, int64_t n, int nt) {
    const T *restrict x = xv, *restrict gy = gyv;
    T *restrict gx = gxv;
    const T top = six ? (T)6 : (T)NAN;
    const int64_t blk = 16384, nblk = (n + blk - 1) / blk;
    #pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1 && nblk > 1 && n >= MT_NN_GRAIN)
    for (int64_t b = 0; b < nblk; b++) {
        const int64_t lo = b * blk, hi = mt_min64(n, lo + blk);
        for (int64_t i = lo; i < hi; i++) gx[i] = gy[i] * (T)((x[i] > 0) & !(x[i] >= top));
    }
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

/* one row of layer norm's backward: gx's row, and gy xhat and gy added
 * into the thread's weight and bias sums (pw, pb; NULL: not wanted). The
 * row's two sums in 8 fixed double lanes (one order in every ISA clone),
 * each loop a single kind of work so that the clones vectorise it (one
 * loop of both sums and the column sums ran scalar) */
static MT_CLONES void FN(layer_norm_bw_row)(const T *restrict xr, const T *restrict w, const T *restrict gr,
                                            T *restrict dr, double *restrict pw, double *restrict pb,
                                            int64_t cols, double eps) {
    double mean, rstd;
    FN(mt_row_moments)(xr, cols, eps, &mean, &rstd);   /* the forward's statistics */
    const T m = (T)mean, rs = (T)rstd;
    double ag[8] = {0, 0, 0, 0, 0, 0, 0, 0}, ax[8] = {0, 0, 0, 0, 0, 0, 0, 0}, sg = 0, sgx = 0;
    int64_t j = 0;
    for (; j + 8 <= cols; j += 8)
        for (int l = 0; l < 8; l++) {
            const T xh = (xr[j + l] - m) * rs, g = w ? gr[j + l] * w[j + l] : gr[j + l];
            ag[l] += (double)g;
            ax[l] += (double)g * (double)xh;
        }
    for (; j < cols; j++) {
        const T xh = (xr[j] - m) * rs, g = w ? gr[j] * w[j] : gr[j];
        sg += (double)g;
        sgx += (double)g * (double)xh;
    }
    sg += ((ag[0] + ag[4]) + (ag[1] + ag[5])) + ((ag[2] + ag[6]) + (ag[3] + ag[7]));
    sgx += ((ax[0] + ax[4]) + (ax[1] + ax[5])) + ((ax[2] + ax[6]) + (ax[3] + ax[7]));
    if (pw)
        for (j = 0; j < cols; j++) {
            const T xh = (xr[j] - m) * rs;
            pw[j] += (double)gr[j] * (double)xh;
            pb[j] += (double)gr[j];
        }
    const T a = (T)(sg / (double)cols), b = (T)(sgx / (double)cols);
    for (j = 0; j < cols; j++) {
        const T xh = (xr[j] - m) * rs, g = w ? gr[j] * w[j] : gr[j];
        dr[j] = rs * (g - a - xh * b);
    }
}

/* x, gy, gx [rows, cols]; w [cols] or NULL (no weight: g = gy); gw, gb
 * [cols] or NULL (not wanted). MT_NN_ENOMEM when the per-thread sums
 * cannot be allocated. */
static int FN(layer_norm_bw)(const T *x, const T *w, const T *gy, T *gx, T *gw, T *gb, int64_t rows,
                             int64_t cols, double eps, int nt) {
    const int par = nt > 1 && rows > 1 && rows * cols >= MT_NN_GRAIN;
    const int team = par ? (int)mt_min64(nt, rows) : 1;
    const int sums = gw != NULL || gb != NULL;
    double *part = NULL;
    if (sums) {
        part = calloc((size_t)team * 2 * (size_t)cols, sizeof(double));
        if (part == NULL) return MT_NN_ENOMEM;
    }
    #pragma omp parallel num_threads(team) if (par)
    {
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        double *pw = sums ? part + (size_t)tid * 2 * (size_t)cols : NULL, *pb = pw ? pw + cols : NULL;
        #pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++)
            FN(layer_norm_bw_row)(x + r * cols, w, gy + r * cols, gx + r * cols, pw, pb, cols, eps);
    }
    if (sums) {
        for (int64_t j = 0; j < cols; j++) {
            double sw = 0, sb = 0;
            for (int t = 0; t < team; t++) {
                sw += part[(size_t)t * 2 * (size_t)cols + (size_t)j];
                sb += part[(size_t)t * 2 * (size_t)cols + (size_t)cols + (size_t)j];
            }
            if (gw) gw[j] = (T)sw;
            if (gb) gb[j] = (T)sb;
        }
        free(part);
    }
    return 0;
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
