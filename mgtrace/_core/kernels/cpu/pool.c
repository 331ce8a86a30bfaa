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
 * Every kernel runs one N*C plane per OpenMP task. max_pool2d first copies
 * the plane into a -inf padded, stride-phase split buffer (as conv.c's
 * DEPTHWISE does), so that each tap is one unit-stride vector loop over the
 * whole plane; planes too large for it take the direct loops. The typed kernels are
 * written once below MT_NN_TEMPLATE and compiled per dtype by including this
 * file again with T and SFX defined.
 */
#ifndef MT_NN_TEMPLATE

#include <stdlib.h>
#include "nn.h"
#include "mt_taps.h"
#ifdef _OPENMP
#include <omp.h>
#endif



/* Taps k in [*lo, *hi) with 0 <= start + k*d < n. */
static inline void valid_taps(int64_t start, int64_t d, int64_t k, int64_t n, int64_t *lo, int64_t *hi) {
    *lo = mt_min64(k, mt_max64(0, mt_ceildiv(-start, d)));
    *hi = mt_max64(*lo, mt_min64(k, mt_floordiv(n - 1 - start, d) + 1));
}

/* max_pool2d's packed plane (as conv.c's DEPTHWISE): the plane padded with
 * -inf and split into the stride's sh * sw phases, each hq x wq, so that tap
 * (kh, kw) of output (oy, ox) is element oy * wq + ox + off[tap]: a plane's
 * outputs are one unit-stride loop per tap over "wide" rows of wq elements.
 * Used while a thread's copy and wide output fit MT_POOL_PACK_BYTES. */
#define MT_POOL_PACK_BYTES ((int64_t)4 << 20)
typedef struct {
    int64_t hq, wq, plane, cnt, pk_elems, elems;   /* elems: a thread's scratch, in elements */
    int packed;
} pool_pack;

static void plan_pool_pack(const mt_pool2d_geom *g, int64_t isz, pool_pack *pl) {
    const double hp = (double)(g->oh - 1) * g->sh + (double)(g->kh - 1) * g->dh + 1;
    const double wp = (double)(g->ow - 1) * g->sw + (double)(g->kw - 1) * g->dw + 1;
    const double hq = (hp + g->sh - 1) / g->sh, wq = (wp + g->sw - 1) / g->sw;
    const double elems = (double)g->sh * g->sw * hq * wq + (double)g->oh * wq + 16;
    pl->packed = elems * isz <= (double)MT_POOL_PACK_BYTES && g->oh > 0 && g->ow > 0;
    if (!pl->packed) return;
    pl->hq = ((int64_t)hp + g->sh - 1) / g->sh;
    pl->wq = ((int64_t)wp + g->sw - 1) / g->sw;
    pl->plane = pl->hq * pl->wq;
    pl->cnt = (g->oh - 1) * pl->wq + g->ow;
    pl->pk_elems = (g->sh * g->sw * pl->plane + 15) & ~(int64_t)15;
    pl->elems = pl->pk_elems + g->oh * pl->wq;
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
    pool_pack pl;
    plan_pool_pack(g, dtype == MT_FLOAT32 ? 4 : 8, &pl);
    if (pl.packed) {
        const int nt = nthreads > 1 && g->planes > 1 && g->planes * g->oh * g->ow * g->kh * g->kw >= MT_NN_GRAIN
                       ? nthreads : 1;
        int64_t *off = malloc(sizeof(int64_t) * (size_t)(g->kh * g->kw));
        char *scratch = malloc((size_t)(nt * pl.elems) * (dtype == MT_FLOAT32 ? 4 : 8));
        if (!off || !scratch) { free(off); free(scratch); return MT_NN_ENOMEM; }
        for (int64_t k = 0; k < g->kh * g->kw; k++) {
            const int64_t r = k / g->kw * g->dh, c = k % g->kw * g->dw;
            off[k] = ((r % g->sh) * g->sw + c % g->sw) * pl.plane + (r / g->sh) * pl.wq + c / g->sw;
        }
        if (dtype == MT_FLOAT32) max_pool_packed_f32(x, y, g, &pl, off, (float *)scratch, nt);
        else max_pool_packed_f64(x, y, g, &pl, off, (double *)scratch, nt);
        free(off);
        free(scratch);
        return 0;
    }
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

/* the plane xp into the packed plane pk (pool_pack) whose -inf padding
 * was written once (it is the same for every plane) */
static MT_CLONES void FN(pool_pack_plane)(const T *restrict xp, T *restrict pk, const mt_pool2d_geom *g,
                                          const pool_pack *pl) {
    for (int64_t a = 0; a < g->sh; a++) {
        /* row i of phase a is input row i * sh + a - ph */
        const int64_t ilo = mt_min64(pl->hq, mt_max64(0, mt_ceildiv(g->ph - a, g->sh)));
        const int64_t ihi = mt_max64(ilo, mt_min64(pl->hq, mt_floordiv(g->h - 1 + g->ph - a, g->sh) + 1));
        for (int64_t b = 0; b < g->sw; b++) {
            const int64_t first = b - g->pw, sw = g->sw;   /* input column of phase column 0 */
            const int64_t lo = mt_min64(pl->wq, mt_max64(0, mt_ceildiv(-first, sw)));
            const int64_t hi = mt_max64(lo, mt_min64(pl->wq, mt_floordiv(g->w - 1 - first, sw) + 1));
            T *restrict d = pk + (a * sw + b) * pl->plane;
            for (int64_t i = ilo; i < ihi; i++) {
                const T *restrict src = xp + (i * g->sh + a - g->ph) * g->w + first;
                T *restrict dr = d + i * pl->wq;
                if (sw == 1) for (int64_t t = lo; t < hi; t++) dr[t] = src[t];
                else if (sw == 2) for (int64_t t = lo; t < hi; t++) dr[t] = src[2 * t];
                else for (int64_t t = lo; t < hi; t++) dr[t] = src[t * sw];
            }
        }
    }
}

/* y[j] = max(y[j], s[j]) for j < n (a plain select: vectorises to max
 * instructions; the caller has ruled NaN out). A function of its own so that
 * GCC does not unroll-and-jam the taps' loop around it into scalar code. */
static MT_CLONES __attribute__((noinline)) void FN(max_into)(T *restrict y, const T *restrict s, int64_t n) {
    for (int64_t j = 0; j < n; j++) {
        const T v = s[j], m = y[j];
        y[j] = v > m ? v : m;
    }
}

/* yw[j] = max over taps of pk[j + off[tap]], j < cnt, for a plane without
 * NaN; 3x3 (ResNet's pool) in one pass */
static MT_CLONES void FN(pool_max_wide)(const T *restrict pk, const int64_t *off, int64_t kk, T *restrict yw,
                                        int64_t cnt) {
    if (kk == 9) {
        const T *restrict p0 = pk + off[0], *restrict p1 = pk + off[1], *restrict p2 = pk + off[2];
        const T *restrict p3 = pk + off[3], *restrict p4 = pk + off[4], *restrict p5 = pk + off[5];
        const T *restrict p6 = pk + off[6], *restrict p7 = pk + off[7], *restrict p8 = pk + off[8];
        for (int64_t j = 0; j < cnt; j++) {
            T m = p0[j];
            m = p1[j] > m ? p1[j] : m; m = p2[j] > m ? p2[j] : m; m = p3[j] > m ? p3[j] : m;
            m = p4[j] > m ? p4[j] : m; m = p5[j] > m ? p5[j] : m; m = p6[j] > m ? p6[j] : m;
            m = p7[j] > m ? p7[j] : m; m = p8[j] > m ? p8[j] : m;
            yw[j] = m;
        }
        return;
    }
    memcpy(yw, pk + off[0], (size_t)cnt * sizeof(T));
    for (int64_t k = 1; k < kk; k++) FN(max_into)(yw, pk + off[k], cnt);
}

/* Whether a[0..n) may hold a NaN: sums of a[i] * 0 are NaN for a NaN or an
 * infinity (then the caller takes the exact scalar path), in 8 lanes so that
 * the loop vectorises. */
static MT_CLONES int FN(maybe_nan)(const T *restrict a, int64_t n) {
    T acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += a[i + j] * (T)0;
    T r = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (; i < n; i++) r += a[i] * (T)0;
    return r != r;
}

/* The exact path for a plane that may hold NaN: a NaN tap wins and stays. */
static void FN(pool_max_wide_nan)(const T *restrict pk, const int64_t *off, int64_t kk, T *restrict yw,
                                  int64_t cnt) {
    for (int64_t j = 0; j < cnt; j++) {
        T m = pk[j + off[0]];
        for (int64_t k = 1; k < kk; k++) {
            const T v = pk[j + off[k]];
            if (v > m || v != v) m = m != m ? m : v;
        }
        yw[j] = m;
    }
}

static void FN(max_pool_packed)(const T *x, T *y, const mt_pool2d_geom *g, const pool_pack *pl,
                                const int64_t *off, T *scratch, int nt) {
    const int64_t hw = g->h * g->w, ohw = g->oh * g->ow, kk = g->kh * g->kw;
    #pragma omp parallel num_threads(nt) if (nt > 1)
    {
#ifdef _OPENMP
        T *pk = scratch + omp_get_thread_num() * pl->elems;
#else
        T *pk = scratch;
#endif
        T *yw = pk + pl->pk_elems;
        for (int64_t i = 0; i < g->sh * g->sw * pl->plane; i++) pk[i] = (T)-INFINITY;
        #pragma omp for schedule(static)
        for (int64_t p = 0; p < g->planes; p++) {
            FN(pool_pack_plane)(x + p * hw, pk, g, pl);
            if (FN(maybe_nan)(x + p * hw, hw)) FN(pool_max_wide_nan)(pk, off, kk, yw, pl->cnt);
            else FN(pool_max_wide)(pk, off, kk, yw, pl->cnt);
            T *yp = y + p * ohw;
            for (int64_t oy = 0; oy < g->oh; oy++)
                memcpy(yp + oy * g->ow, yw + oy * pl->wq, (size_t)g->ow * sizeof(T));
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
            for (int64_t ox = 0; ox < g->ow; ox++) {
                int64_t ys, ye, xs, xe;
                const int64_t count = mt_avg_window(g, oy, ox, &ys, &ye, &xs, &xe);
                T sum = 0;
                for (int64_t iy = ys; iy < ye; iy++)
                    for (int64_t ix = xs; ix < xe; ix++) sum += xp[iy * g->w + ix];
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
            int64_t ys, ye, xs, xe;
            mt_adaptive_window(oy, h, oh, &ys, &ye);
            for (int64_t ox = 0; ox < ow; ox++) {
                mt_adaptive_window(ox, w, ow, &xs, &xe);
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
