/* 3-d convolution (NCDHW) by vol2col and GEMM: the forward, its transpose
 * (conv_transpose3d's forward, conv3d's input gradient) and the weight
 * gradient, for float32 and float64 (nn_kernels.h's mt_conv3d_geom; the
 * caller, nn.pyx, has validated every shape).
 *
 * Per image and group, the output's depth slices are taken in tiles whose
 * columns fit MT_CONV3D_COLS_BYTES (at least one slice):
 *   forward   cols[r][q] = x at tap r = (c, a, b, e) for output pixel q of the
 *             tile (zero outside the input), then y[og, q] = W[og, r] @ cols,
 *             the bias added after;
 *   data      cols = W^T @ gy[og, q], then each column scattered back onto the
 *             input positions it was read from (col2vol), the channels split
 *             between threads so no two threads add into one element;
 *   weight    gw[og, r] += gy[og, q] @ cols^T over every tile and image.
 * A 1x1x1 kernel with unit stride and no padding reads x as its own columns;
 * other stride-1 forwards with enough channels a group skip vol2col: one
 * GEMM per kernel tap over a zero-padded copy (conv3d_shifted, the 3-d form
 * of conv.c's SHIFTED).
 * The GEMMs are OpenBLAS's (threaded through blas_threads.c's bridge); the
 * copies run on OpenMP threads.
 */
#ifndef MT_CONV3D_TEMPLATE

#include <stdlib.h>
#include <string.h>
#include <cblas.h>
#include "nn.h"
#ifdef _OPENMP
#include <omp.h>
#endif

/* bytes of vol2col columns one tile may hold (at least one output slice) */
#define MT_CONV3D_COLS_BYTES ((int64_t)16 << 20)

/* stride-1 convolutions with at least this many input channels a group run
 * one GEMM per tap over a padded copy (conv3d_shifted); fewer channels make
 * those GEMMs too thin, and vol2col's one GEMM with KD*KH*KW times the
 * depth wins */
#define MT_CONV3D_SHIFTED_MIN_C 8

/* output depth slices per tile */
static int64_t conv3d_tile(const mt_conv3d_geom *g, int64_t itemsize) {
    const int64_t rows = g->c / g->groups * g->kd * g->kh * g->kw;
    const int64_t slice = mt_max64(1, rows * g->oh * g->ow * itemsize);
    return mt_max64(1, mt_min64(g->od, MT_CONV3D_COLS_BYTES / slice));
}

static int conv3d_pointwise(const mt_conv3d_geom *g) {
    return g->kd == 1 && g->kh == 1 && g->kw == 1 && g->sd == 1 && g->sh == 1 && g->sw == 1 &&
           g->pd == 0 && g->ph == 0 && g->pw == 0;
}

#define MT_CONV3D_TEMPLATE
#define T float
#define SFX f32
#include "conv3d.c"
#undef T
#undef SFX
#define T double
#define SFX f64
#include "conv3d.c"
#undef T
#undef SFX
#undef MT_CONV3D_TEMPLATE

int mt_conv3d(int dtype, const void *x, const void *weight, const void *bias, void *y,
              const mt_conv3d_geom *g, int nthreads) {
    if (dtype == MT_FLOAT32) return conv3d_fwd_f32(x, weight, bias, y, g, nthreads);
    return conv3d_fwd_f64(x, weight, bias, y, g, nthreads);
}

int mt_conv3d_backward_data(int dtype, const void *gy, const void *weight, void *gx,
                            const mt_conv3d_geom *g, int nthreads) {
    if (dtype == MT_FLOAT32) return conv3d_bwd_data_f32(gy, weight, gx, g, nthreads);
    return conv3d_bwd_data_f64(gy, weight, gx, g, nthreads);
}

int mt_conv3d_backward_weight(int dtype, const void *x, const void *gy, void *gw,
                              const mt_conv3d_geom *g, int nthreads) {
    if (dtype == MT_FLOAT32) return conv3d_bwd_weight_f32(x, gy, gw, g, nthreads);
    return conv3d_bwd_weight_f64(x, gy, gw, g, nthreads);
}

#else /* ------------------------------------------- MT_CONV3D_TEMPLATE: T, SFX */

#define FN(name) MT_CAT(name, SFX)

/* C[m x n] (+)= op(A) @ op(B), row-major */
static void FN(c3_gemm)(int ta, int tb, int64_t m, int64_t n, int64_t k, const T *a, int64_t lda,
                        const T *b, int64_t ldb, int accumulate, T *c, int64_t ldc) {
    const enum CBLAS_TRANSPOSE at = ta ? CblasTrans : CblasNoTrans, bt = tb ? CblasTrans : CblasNoTrans;
    if (sizeof(T) == 4)
        scipy_cblas_sgemm(CblasRowMajor, at, bt, (blasint)m, (blasint)n, (blasint)k, 1.0f,
                          (const float *)a, (blasint)lda, (const float *)b, (blasint)ldb,
                          accumulate ? 1.0f : 0.0f, (float *)c, (blasint)ldc);
    else
        scipy_cblas_dgemm(CblasRowMajor, at, bt, (blasint)m, (blasint)n, (blasint)k, 1.0,
                          (const double *)a, (blasint)lda, (const double *)b, (blasint)ldb,
                          accumulate ? 1.0 : 0.0, (double *)c, (blasint)ldc);
}

/* cols[r][(z - z0) * oh * ow + q] for the taps r of one group (xg: that
 * group's first channel of one image) and output slices z0 .. z0 + nz */
static void FN(vol2col)(const T *xg, T *cols, const mt_conv3d_geom *g, int64_t z0, int64_t nz, int nt) {
    const int64_t cg = g->c / g->groups, kk = g->kd * g->kh * g->kw, rows = cg * kk;
    const int64_t hw = g->h * g->w, dhw = g->d * hw, ohw = g->oh * g->ow, len = nz * ohw;
    #pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1 && rows * len >= MT_NN_GRAIN)
    for (int64_t r = 0; r < rows; r++) {
        const int64_t ch = r / kk, a = r % kk / (g->kh * g->kw), b = r % (g->kh * g->kw) / g->kw,
                      e = r % g->kw;
        const T *xc = xg + ch * dhw;
        T *dst = cols + r * len;
        for (int64_t i = 0; i < nz; i++) {
            const int64_t iz = (z0 + i) * g->sd - g->pd + a * g->dd;
            T *dz = dst + i * ohw;
            if (iz < 0 || iz >= g->d) {
                memset(dz, 0, (size_t)ohw * sizeof(T));
                continue;
            }
            for (int64_t oy = 0; oy < g->oh; oy++) {
                const int64_t iy = oy * g->sh - g->ph + b * g->dh;
                T *d = dz + oy * g->ow;
                if (iy < 0 || iy >= g->h) {
                    memset(d, 0, (size_t)g->ow * sizeof(T));
                    continue;
                }
                const T *xr = xc + iz * hw + iy * g->w;
                const int64_t x0 = e * g->dw - g->pw;
                if (g->sw == 1 && x0 >= 0 && x0 + g->ow <= g->w) {
                    memcpy(d, xr + x0, (size_t)g->ow * sizeof(T));
                    continue;
                }
                for (int64_t ox = 0; ox < g->ow; ox++) {
                    const int64_t ix = x0 + ox * g->sw;
                    d[ox] = ix >= 0 && ix < g->w ? xr[ix] : (T)0;
                }
            }
        }
    }
}

/* the transpose of vol2col: each column added onto the input position it
 * reads (gxg: one group's first channel of one image, zeroed by the caller) */
static void FN(col2vol)(const T *cols, T *gxg, const mt_conv3d_geom *g, int64_t z0, int64_t nz, int nt) {
    const int64_t cg = g->c / g->groups, kk = g->kd * g->kh * g->kw;
    const int64_t hw = g->h * g->w, dhw = g->d * hw, ohw = g->oh * g->ow, len = nz * ohw;
    #pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1 && cg * kk * len >= MT_NN_GRAIN)
    for (int64_t ch = 0; ch < cg; ch++) {
        T *gc = gxg + ch * dhw;
        for (int64_t t = 0; t < kk; t++) {
            const int64_t a = t / (g->kh * g->kw), b = t % (g->kh * g->kw) / g->kw, e = t % g->kw;
            const T *src = cols + (ch * kk + t) * len;
            for (int64_t i = 0; i < nz; i++) {
                const int64_t iz = (z0 + i) * g->sd - g->pd + a * g->dd;
                if (iz < 0 || iz >= g->d) continue;
                for (int64_t oy = 0; oy < g->oh; oy++) {
                    const int64_t iy = oy * g->sh - g->ph + b * g->dh;
                    if (iy < 0 || iy >= g->h) continue;
                    T *gr = gc + iz * hw + iy * g->w;
                    const T *s = src + i * ohw + oy * g->ow;
                    const int64_t x0 = e * g->dw - g->pw;
                    for (int64_t ox = 0; ox < g->ow; ox++) {
                        const int64_t ix = x0 + ox * g->sw;
                        if (ix >= 0 && ix < g->w) gr[ix] += s[ox];
                    }
                }
            }
        }
    }
}

/* stride 1: one GEMM per kernel tap over a zero-padded copy of the image,
 * the outputs computed on the padded grid (row ends included) and cropped:
 *   Y'[og, q] += W_tap[og, cg] @ Xp[cg, q + offset(tap)],  q = z*Hp*Wp + y*Wp + x
 * no vol2col (whose copy is KD*KH*KW times the input) */
static int FN(conv3d_shifted)(const T *x, const T *w, const T *bias, T *y, const mt_conv3d_geom *g, int nt) {
    const int64_t cg = g->c / g->groups, og = g->o / g->groups, kk = g->kd * g->kh * g->kw;
    const int64_t dp = g->d + 2 * g->pd, hp = g->h + 2 * g->ph, wp = g->w + 2 * g->pw;
    const int64_t plane = hp * wp, vol = dp * plane, ohw = g->oh * g->ow, L = g->od * ohw;
    const int64_t lq = (g->od - 1) * plane + (g->oh - 1) * wp + g->ow;    /* padded-grid outputs */
    T *xp = malloc(sizeof(T) * (size_t)(g->c * vol));
    T *yq = malloc(sizeof(T) * (size_t)(og * lq));
    T *wt = malloc(sizeof(T) * (size_t)(g->o * cg * kk));   /* [tap][o][c] */
    if (!xp || !yq || !wt) { free(xp); free(yq); free(wt); return MT_NN_ENOMEM; }
    for (int64_t t = 0; t < kk; t++)
        for (int64_t o = 0; o < g->o; o++)
            for (int64_t c = 0; c < cg; c++)
                wt[(t * g->o + o) * cg + c] = w[(o * cg + c) * kk + t];
    memset(xp, 0, sizeof(T) * (size_t)(g->c * vol));
    for (int64_t n = 0; n < g->n; n++) {
        const T *xn = x + n * g->c * g->d * g->h * g->w;
        #pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1 && g->c * vol >= MT_NN_GRAIN)
        for (int64_t cz = 0; cz < g->c * g->d; cz++) {
            const int64_t c = cz / g->d, z = cz % g->d;
            for (int64_t r = 0; r < g->h; r++)
                memcpy(xp + c * vol + (z + g->pd) * plane + (r + g->ph) * wp + g->pw,
                       xn + (cz * g->h + r) * g->w, (size_t)g->w * sizeof(T));
        }
        for (int64_t grp = 0; grp < g->groups; grp++) {
            for (int64_t t = 0; t < kk; t++) {
                const int64_t a = t / (g->kh * g->kw), b = t % (g->kh * g->kw) / g->kw, e = t % g->kw;
                const int64_t off = a * g->dd * plane + b * g->dh * wp + e * g->dw;
                FN(c3_gemm)(0, 0, og, lq, cg, wt + (t * g->o + grp * og) * cg, cg,
                            xp + grp * cg * vol + off, vol, t > 0, yq, lq);
            }
            T *yg = y + (n * g->o + grp * og) * L;
            #pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1 && og * L >= MT_NN_GRAIN)
            for (int64_t o = 0; o < og; o++) {
                const T bv = bias ? bias[grp * og + o] : (T)0;
                for (int64_t z = 0; z < g->od; z++)
                    for (int64_t r = 0; r < g->oh; r++) {
                        const T *src = yq + o * lq + z * plane + r * wp;
                        T *dst = yg + o * L + z * ohw + r * g->ow;
                        for (int64_t q = 0; q < g->ow; q++) dst[q] = src[q] + bv;
                    }
            }
        }
    }
    free(xp);
    free(yq);
    free(wt);
    return 0;
}

/* the columns one GEMM reads for output depths z0 .. z0+nz-1 of one group's
 * input xg: a pointwise conv reads the input's own slices (leading dimension
 * d*h*w), any other gets vol2col's copy in cols (leading dimension nz*oh*ow) */
static const T *FN(chunk_cols)(const T *xg, T *cols, const mt_conv3d_geom *g, int64_t z0, int64_t nz,
                               int direct, int nt, int64_t *ldb) {
    const int64_t ohw = g->oh * g->ow;
    if (direct) {
        *ldb = g->d * g->h * g->w;
        return xg + z0 * ohw;
    }
    FN(vol2col)(xg, cols, g, z0, nz, nt);
    *ldb = nz * ohw;
    return cols;
}

static int FN(conv3d_fwd)(const T *x, const T *w, const T *bias, T *y, const mt_conv3d_geom *g, int nt) {
    const int64_t cg = g->c / g->groups, og = g->o / g->groups, rows = cg * g->kd * g->kh * g->kw;
    if (g->sd == 1 && g->sh == 1 && g->sw == 1 && cg >= MT_CONV3D_SHIFTED_MIN_C && g->n > 0 &&
        !conv3d_pointwise(g))
        return FN(conv3d_shifted)(x, w, bias, y, g, nt);
    const int64_t dhw = g->d * g->h * g->w, ohw = g->oh * g->ow, L = g->od * ohw;
    const int64_t nzt = conv3d_tile(g, sizeof(T));
    const int direct = conv3d_pointwise(g);
    T *cols = NULL;
    if (!direct && g->n > 0 && L > 0) {
        cols = malloc(sizeof(T) * (size_t)(rows * nzt * ohw));
        if (!cols) return MT_NN_ENOMEM;
    }
    for (int64_t n = 0; n < g->n; n++)
        for (int64_t grp = 0; grp < g->groups; grp++) {
            const T *xg = x + (n * g->c + grp * cg) * dhw;
            T *yg = y + (n * g->o + grp * og) * L;
            for (int64_t z0 = 0; z0 < g->od; z0 += nzt) {
                const int64_t nz = mt_min64(nzt, g->od - z0), len = nz * ohw;
                int64_t ldb;
                const T *b = FN(chunk_cols)(xg, cols, g, z0, nz, direct, nt, &ldb);
                FN(c3_gemm)(0, 0, og, len, rows, w + grp * og * rows, rows, b, ldb, 0, yg + z0 * ohw, L);
            }
        }
    free(cols);
    if (bias) {
        #pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1 && g->n * g->o * L >= MT_NN_GRAIN)
        for (int64_t p = 0; p < g->n * g->o; p++) {
            const T bv = bias[p % g->o];
            T *yp = y + p * L;
            for (int64_t q = 0; q < L; q++) yp[q] += bv;
        }
    }
    return 0;
}

static int FN(conv3d_bwd_data)(const T *gy, const T *w, T *gx, const mt_conv3d_geom *g, int nt) {
    const int64_t cg = g->c / g->groups, og = g->o / g->groups, rows = cg * g->kd * g->kh * g->kw;
    const int64_t dhw = g->d * g->h * g->w, ohw = g->oh * g->ow, L = g->od * ohw;
    const int64_t nzt = conv3d_tile(g, sizeof(T));
    const int direct = conv3d_pointwise(g);
    memset(gx, 0, sizeof(T) * (size_t)(g->n * g->c * dhw));
    if (g->n == 0 || L == 0) return 0;
    T *cols = direct ? NULL : malloc(sizeof(T) * (size_t)(rows * nzt * ohw));
    if (!direct && !cols) return MT_NN_ENOMEM;
    for (int64_t n = 0; n < g->n; n++)
        for (int64_t grp = 0; grp < g->groups; grp++) {
            T *gxg = gx + (n * g->c + grp * cg) * dhw;
            const T *gyg = gy + (n * g->o + grp * og) * L;
            for (int64_t z0 = 0; z0 < g->od; z0 += nzt) {
                const int64_t nz = mt_min64(nzt, g->od - z0), len = nz * ohw;
                if (direct) {   /* the input's slices are the output's: write them in place */
                    FN(c3_gemm)(1, 0, rows, len, og, w + grp * og * rows, rows, gyg + z0 * ohw, L, 0,
                                gxg + z0 * ohw, dhw);
                    continue;
                }
                FN(c3_gemm)(1, 0, rows, len, og, w + grp * og * rows, rows, gyg + z0 * ohw, L, 0, cols, len);
                FN(col2vol)(cols, gxg, g, z0, nz, nt);
            }
        }
    free(cols);
    return 0;
}

static int FN(conv3d_bwd_weight)(const T *x, const T *gy, T *gw, const mt_conv3d_geom *g, int nt) {
    const int64_t cg = g->c / g->groups, og = g->o / g->groups, rows = cg * g->kd * g->kh * g->kw;
    const int64_t dhw = g->d * g->h * g->w, ohw = g->oh * g->ow, L = g->od * ohw;
    const int64_t nzt = conv3d_tile(g, sizeof(T));
    const int direct = conv3d_pointwise(g);
    memset(gw, 0, sizeof(T) * (size_t)(g->o * rows));
    if (g->n == 0 || L == 0) return 0;
    T *cols = direct ? NULL : malloc(sizeof(T) * (size_t)(rows * nzt * ohw));
    if (!direct && !cols) return MT_NN_ENOMEM;
    for (int64_t n = 0; n < g->n; n++)
        for (int64_t grp = 0; grp < g->groups; grp++) {
            const T *xg = x + (n * g->c + grp * cg) * dhw;
            const T *gyg = gy + (n * g->o + grp * og) * L;
            for (int64_t z0 = 0; z0 < g->od; z0 += nzt) {
                const int64_t nz = mt_min64(nzt, g->od - z0), len = nz * ohw;
                int64_t ldb;
                const T *b = FN(chunk_cols)(xg, cols, g, z0, nz, direct, nt, &ldb);
                FN(c3_gemm)(0, 1, og, rows, len, gyg + z0 * ohw, L, b, ldb, 1, gw + grp * og * rows, rows);
            }
        }
    free(cols);
    return 0;
}

#undef FN
#endif
