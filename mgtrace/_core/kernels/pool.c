/* Pooling kernels: max/avg pooling and their adaptive forms, PyTorch's
 * semantics (nn.h has the geometry; nn.pyx computes output sizes and checks
 * them).
 *
 *   max_pool2d   window rows oy*sh - ph + kh*dh; positions outside the input
 *                count as -inf (never chosen); NaN wins, as in PyTorch.
 *   avg_pool2d   window [oy*sh - ph, +kh) clipped to [-ph, h + ph) gives the
 *                divisor with count_include_pad, then clipped to the input for
 *                the sum (and for the divisor without count_include_pad).
 *   adaptive     window of output i along an axis of n -> m:
 *                [floor(i*n/m), ceil((i+1)*n/m)).
 *
 * Every kernel runs one N*C plane per OpenMP task. The typed kernels are
 * written once below MT_NN_TEMPLATE and compiled per dtype by including this
 * file again with T and SFX defined.
 */
#ifndef MT_NN_TEMPLATE

#include <stdlib.h>
#include "nn.h"
#ifdef _OPENMP
#include <omp.h>
#endif


static inline int64_t mt_floordiv(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }
static inline int64_t mt_ceildiv(int64_t a, int64_t b) { return -mt_floordiv(-a, b); }

/* Taps k in [*lo, *hi) with 0 <= start + k*d < n. */
static inline void valid_taps(int64_t start, int64_t d, int64_t k, int64_t n, int64_t *lo, int64_t *hi) {
    *lo = mt_min64(k, mt_max64(0, mt_ceildiv(-start, d)));
    *hi = mt_max64(*lo, mt_min64(k, mt_floordiv(n - 1 - start, d) + 1));
}

#define MT_NN_TEMPLATE
#define T float
#define SFX f32
#include "pool.c"
#undef T
#undef SFX
#define T double
#define SFX f64
#include "pool.c"
#undef T
#undef SFX
#undef MT_NN_TEMPLATE

int mt_max_pool2d(int dtype, const void *x, void *y, const mt_pool2d_geom *g, int nthreads) {
    /* the taps inside the input, per output row and column: [lo, hi) */
    int64_t *taps = malloc(sizeof(int64_t) * (size_t)(2 * (g->oh + g->ow) + 1));
    if (!taps) return MT_NN_ENOMEM;
    for (int64_t i = 0; i < g->oh; i++)
        valid_taps(i * g->sh - g->ph, g->dh, g->kh, g->h, &taps[2 * i], &taps[2 * i + 1]);
    for (int64_t i = 0; i < g->ow; i++)
        valid_taps(i * g->sw - g->pw, g->dw, g->kw, g->w, &taps[2 * (g->oh + i)], &taps[2 * (g->oh + i) + 1]);
    if (dtype == MT_FLOAT32) max_pool_f32(x, y, g, taps, taps + 2 * g->oh, nthreads);
    else max_pool_f64(x, y, g, taps, taps + 2 * g->oh, nthreads);
    free(taps);
    return 0;
}

int mt_avg_pool2d(int dtype, const void *x, void *y, const mt_pool2d_geom *g, int nthreads) {
    if (dtype == MT_FLOAT32) avg_pool_f32(x, y, g, nthreads);
    else avg_pool_f64(x, y, g, nthreads);
    return 0;
}

int mt_adaptive_pool2d(int dtype, int op, const void *x, void *y, int64_t planes, int64_t h,
                       int64_t w, int64_t oh, int64_t ow, int nthreads) {
    if (dtype == MT_FLOAT32) adaptive_pool_f32(op, x, y, planes, h, w, oh, ow, nthreads);
    else adaptive_pool_f64(op, x, y, planes, h, w, oh, ow, nthreads);
    return 0;
}

#else /* ------------------------------------------- MT_NN_TEMPLATE: T, SFX */

#define FN(name) MT_CAT(name, SFX)

static void FN(max_pool)(const T *x, T *y, const mt_pool2d_geom *g, const int64_t *rows,
                         const int64_t *cols, int nt) {
    const int64_t hw = g->h * g->w, ohw = g->oh * g->ow;
    #pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1 && g->planes * ohw * g->kh * g->kw >= MT_NN_GRAIN)
    for (int64_t p = 0; p < g->planes; p++) {
        const T *xp = x + p * hw;
        T *yp = y + p * ohw;
        for (int64_t oy = 0; oy < g->oh; oy++) {
            const int64_t y0 = oy * g->sh - g->ph, khlo = rows[2 * oy], khhi = rows[2 * oy + 1];
            for (int64_t ox = 0; ox < g->ow; ox++) {
                const int64_t x0 = ox * g->sw - g->pw, kwlo = cols[2 * ox], kwhi = cols[2 * ox + 1];
                /* branch-free: on random data a compare-and-branch mispredicts half the
                 * time; a NaN is remembered apart and wins at the end */
                T m = (T)-INFINITY;
                int nan = 0;
                for (int64_t kh = khlo; kh < khhi; kh++) {
                    const T *xr = xp + (y0 + kh * g->dh) * g->w + x0;
                    for (int64_t kw = kwlo; kw < kwhi; kw++) {
                        const T v = xr[kw * g->dw];
                        m = v > m ? v : m;
                        nan |= v != v;
                    }
                }
                yp[oy * g->ow + ox] = nan ? (T)NAN : m;
            }
        }
    }
}

static void FN(avg_pool)(const T *x, T *y, const mt_pool2d_geom *g, int nt) {
    const int64_t hw = g->h * g->w, ohw = g->oh * g->ow;
    #pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1 && g->planes * ohw * g->kh * g->kw >= MT_NN_GRAIN)
    for (int64_t p = 0; p < g->planes; p++) {
        const T *xp = x + p * hw;
        T *yp = y + p * ohw;
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
                T sum = 0;
                for (int64_t iy = ys; iy < ye; iy++)
                    for (int64_t ix = xs; ix < xe; ix++) sum += xp[iy * g->w + ix];
                const int64_t count = g->count_include_pad ? padded_h * padded_w
                                                           : mt_max64(0, ye - ys) * mt_max64(0, xe - xs);
                yp[oy * g->ow + ox] = count > 0 ? sum / (T)count : (T)0;
            }
        }
    }
}

/* sum of n elements with 8 running partial sums (vectorizable; a different
 * rounding order from a plain loop, within the float tolerance) */
static MT_CLONES T FN(row_sum)(const T *restrict a, int64_t n) {
    T acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += a[i + j];
    T s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (; i < n; i++) s += a[i];
    return s;
}

static void FN(adaptive_pool)(int op, const T *x, T *y, int64_t planes, int64_t h, int64_t w,
                              int64_t oh, int64_t ow, int nt) {
    const int64_t hw = h * w, ohw = oh * ow;
    #pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1 && planes * hw >= MT_NN_GRAIN)
    for (int64_t p = 0; p < planes; p++) {
        const T *xp = x + p * hw;
        T *yp = y + p * ohw;
        for (int64_t oy = 0; oy < oh; oy++) {
            const int64_t ys = oy * h / oh, ye = ((oy + 1) * h + oh - 1) / oh;
            for (int64_t ox = 0; ox < ow; ox++) {
                const int64_t xs = ox * w / ow, xe = ((ox + 1) * w + ow - 1) / ow;
                T acc;
                if (op == MT_ADAPTIVE_MAX) {
                    acc = (T)-INFINITY;
                    for (int64_t iy = ys; iy < ye; iy++)
                        for (int64_t ix = xs; ix < xe; ix++) {
                            const T v = xp[iy * w + ix];
                            if (v > acc || v != v) acc = v;
                        }
                } else if (xs == 0 && xe == w) {  /* whole rows: one contiguous run */
                    acc = FN(row_sum)(xp + ys * w, (ye - ys) * w) / (T)((ye - ys) * w);
                } else {
                    acc = 0;
                    for (int64_t iy = ys; iy < ye; iy++) acc += FN(row_sum)(xp + iy * w + xs, xe - xs);
                    acc /= (T)((ye - ys) * (xe - xs));
                }
                yp[oy * ow + ox] = acc;
            }
        }
    }
}

#undef FN
#endif
