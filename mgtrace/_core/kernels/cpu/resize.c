/* Resampling kernels: 2-D nearest/bilinear resize with PyTorch's coordinate
 * rules, and index-mapping pad (reflect/replicate) for any dtype and ndim.
 *
 * Source coordinates (PyTorch's UpSample.h; "scale" is input/output size, or
 * 1/scale_factor when the caller passed one):
 *   nearest    src = min(floor(dst * scale), n - 1) in float32 arithmetic,
 *              except that an unchanged size copies and an exact doubling
 *              takes dst / 2 (PyTorch's shortcuts, kept for equal results).
 *   bilinear   align_corners: src = dst * (n - 1) / (m - 1);
 *              otherwise half-pixel centres, src = (dst + 0.5) * scale - 0.5,
 *              clamped at 0. Then i0 = floor(src), i1 = min(i0 + 1, n - 1),
 *              weights 1 - f and f for f = src - i0, computed in the kernel's
 *              dtype.
 * Both build per-axis index (and weight) tables once, then run one N*C plane
 * per OpenMP task.
 */
#ifndef MT_NN_TEMPLATE

#include <stdlib.h>
#include "nn.h"
#include "mt_taps.h"
#ifdef _OPENMP
#include <omp.h>
#endif


#define MT_NN_TEMPLATE
#define T float
#define SFX f32
#include "resize.c"
#undef T
#undef SFX
#define T double
#define SFX f64
#include "resize.c"
#undef T
#undef SFX
#undef MT_NN_TEMPLATE

int mt_resize2d(int dtype, int mode, const void *x, void *y, int64_t planes, int64_t h, int64_t w,
                int64_t oh, int64_t ow, double scale_h, double scale_w, int align_corners,
                int nthreads) {
    if (dtype == MT_FLOAT32)
        return resize_f32(mode, x, y, planes, h, w, oh, ow, scale_h, scale_w, align_corners, nthreads);
    return resize_f64(mode, x, y, planes, h, w, oh, ow, scale_h, scale_w, align_corners, nthreads);
}

/* ---------------------------------------------------------------- pad */

static inline void copy_item(char *dst, const char *src, int64_t isz) {
    switch (isz) {
    case 1: *dst = *src; break;
    case 2: memcpy(dst, src, 2); break;
    case 4: memcpy(dst, src, 4); break;
    case 8: memcpy(dst, src, 8); break;
    default: memcpy(dst, src, (size_t)isz);
    }
}

int mt_pad_index(const void *x, void *y, int ndim, const int64_t *shape, const int64_t *before,
                 const int64_t *after, int mode, int64_t itemsize, int nthreads) {
    int64_t oshape[MT_MAX_NDIM], istride[MT_MAX_NDIM], mapoff[MT_MAX_NDIM + 1];
    if (ndim == 0) { copy_item(y, x, itemsize); return 0; }
    int64_t rows = 1, total_map = 0, s = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        oshape[d] = shape[d] + before[d] + after[d];
        istride[d] = s;
        s *= shape[d];
    }
    for (int d = 0; d < ndim; d++) {
        mapoff[d] = total_map;
        total_map += oshape[d];
        if (d < ndim - 1) rows *= oshape[d];
    }
    const int last = ndim - 1;
    const int64_t orow = oshape[last];
    if (rows == 0 || orow == 0) return 0;
    /* map[mapoff[d] + i] = the input index along axis d that output index i copies */
    int64_t *map = malloc(sizeof(int64_t) * (size_t)(total_map > 0 ? total_map : 1));
    if (!map) return MT_NN_ENOMEM;
    for (int d = 0; d < ndim; d++) {
        const int64_t n = shape[d];
        for (int64_t i = 0; i < oshape[d]; i++) {
            int64_t j = i - before[d];
            if (mode == MT_PAD_REFLECT) {
                if (j < 0) j = -j;
                if (j >= n) j = 2 * (n - 1) - j;
            } else {
                j = j < 0 ? 0 : (j >= n ? n - 1 : j);
            }
            map[mapoff[d] + i] = j;
        }
    }
    const char *src = x;
    char *dst = y;
    const int64_t isz = itemsize, lb = before[last], ln = shape[last];
    #pragma omp parallel for num_threads(nthreads) schedule(static) if (nthreads > 1 && rows * orow >= MT_NN_GRAIN)
    for (int64_t r = 0; r < rows; r++) {
        int64_t rem = r, off = 0;
        for (int d = last - 1; d >= 0; d--) {
            const int64_t i = rem % oshape[d];
            rem /= oshape[d];
            off += map[mapoff[d] + i] * istride[d];
        }
        const char *srow = src + off * isz;
        char *drow = dst + r * orow * isz;
        memcpy(drow + lb * isz, srow, (size_t)(ln * isz));
        for (int64_t i = 0; i < lb; i++) copy_item(drow + i * isz, srow + map[mapoff[last] + i] * isz, isz);
        for (int64_t i = lb + ln; i < orow; i++) copy_item(drow + i * isz, srow + map[mapoff[last] + i] * isz, isz);
    }
    free(map);
    return 0;
}

#else /* ------------------------------------------- MT_NN_TEMPLATE: T, SFX */

#define FN(name) MT_CAT(name, SFX)

/* y [planes, oh, ow] = x [planes, h, w] resized: nearest, or bilinear from mt_resize_taps's tables. */
static int FN(resize)(int mode, const T *x, T *y, int64_t planes, int64_t h, int64_t w, int64_t oh,
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
        const T *xp = x + p * hw;
        T *yp = y + p * ohw;
        for (int64_t oy = 0; oy < oh; oy++) {
            T *yr = yp + oy * ow;
            if (mode == MT_RESIZE_NEAREST) {
                const T *xr = xp + y0[oy] * w;
                for (int64_t ox = 0; ox < ow; ox++) yr[ox] = xr[x0[ox]];
            } else {
                const T *ra = xp + y0[oy] * w, *rb = xp + y1[oy] * w;
                const T b1 = fy[oy], b0 = (T)1 - b1;
                for (int64_t ox = 0; ox < ow; ox++) {
                    const T a1 = fx[ox], a0 = (T)1 - a1;
                    yr[ox] = b0 * (a0 * ra[x0[ox]] + a1 * ra[x1[ox]]) + b1 * (a0 * rb[x0[ox]] + a1 * rb[x1[ox]]);
                }
            }
        }
    }
    free(idx);
    free(wt);
    return 0;
}

#undef FN
#endif
