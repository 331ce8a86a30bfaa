/* The windows the CPU's pooling and resize kernels read, shared by their
 * forward (pool.c, resize.c) and backward (grad.c) so that a gradient
 * always goes back through the taps the forward read. Internal to cpu/. */
#ifndef MT_TAPS_H
#define MT_TAPS_H
#include <math.h>
#include <stdlib.h>
#include "nn.h"

/* avg pooling: output (oy, ox)'s window clipped to the input, rows
 * [*ys, *ye) and columns [*xs, *xe), and its divisor: the window clipped to
 * the padded input when count_include_pad, else its part inside the input
 * (0 for a window wholly in the padding) */
static inline int64_t mt_avg_window(const mt_pool2d_geom *g, int64_t oy, int64_t ox, int64_t *ys,
                                    int64_t *ye, int64_t *xs, int64_t *xe) {
    int64_t y0 = oy * g->sh - g->ph, y1 = mt_min64(y0 + g->kh, g->h + g->ph);
    int64_t x0 = ox * g->sw - g->pw, x1 = mt_min64(x0 + g->kw, g->w + g->pw);
    const int64_t padded = (y1 - y0) * (x1 - x0);
    *ys = mt_max64(y0, 0);
    *ye = mt_min64(y1, g->h);
    *xs = mt_max64(x0, 0);
    *xe = mt_min64(x1, g->w);
    return g->count_include_pad ? padded : mt_max64(0, *ye - *ys) * mt_max64(0, *xe - *xs);
}

/* adaptive pooling: output i of m over n inputs reads [floor(i n / m),
 * ceil((i + 1) n / m)) (PyTorch's windows) */
static inline void mt_adaptive_window(int64_t i, int64_t n, int64_t m, int64_t *s, int64_t *e) {
    *s = i * n / m;
    *e = ((i + 1) * n + m - 1) / m;
}

/* nearest resize: the source index of destination dst along an axis of n
 * -> m, floor(dst * scale) in float32 as PyTorch computes it (scale 1 /
 * user_scale when given, else n / m), with its shortcuts for m == n and
 * m == 2n */
static inline int64_t mt_nearest_index(int64_t dst, int64_t n, int64_t m, double user_scale) {
    if (m == n) return dst;
    if (m == 2 * n) return dst >> 1;
    const float scale = user_scale > 0 ? (float)(1.0 / user_scale) : (float)n / (float)m;
    const int64_t src = (int64_t)floorf((float)dst * scale);
    return src < n - 1 ? src : n - 1;
}

/* bilinear resize: for each destination i of m along an axis of n, the two
 * taps i0[i], i1[i] and the weight f1[i] of i1 (1 - f1 that of i0), in the
 * kernel's dtype T (half-pixel centres unless align_corners) */
#define MT_LINEAR_TABLE(T, SFX)                                                 \
    static inline void mt_linear_table_##SFX(int64_t n, int64_t m, double user_scale, int align_corners, \
                                             int64_t *i0, int64_t *i1, T *f1) { \
        T scale;                                                                \
        if (align_corners) scale = m > 1 ? (T)(n - 1) / (T)(m - 1) : (T)0;     \
        else scale = user_scale > 0 ? (T)(1.0 / user_scale) : (T)n / (T)m;     \
        for (int64_t i = 0; i < m; i++) {                                       \
            T src = align_corners ? scale * (T)i : scale * ((T)i + (T)0.5) - (T)0.5; \
            if (src < 0) src = 0;                                               \
            const int64_t a = (int64_t)src;                                     \
            i0[i] = a;                                                          \
            i1[i] = a + (a < n - 1 ? 1 : 0);                                    \
            T f = src - (T)a;                                                   \
            f1[i] = f < 0 ? (T)0 : (f > 1 ? (T)1 : f);                          \
        }                                                                       \
    }
MT_LINEAR_TABLE(float, f32)
MT_LINEAR_TABLE(double, f64)
#undef MT_LINEAR_TABLE

/* The taps of a resize from h x w to oh x ow, for its forward (resize.c)
 * and backward (grad.c): *idx holds y0[oh], y1[oh], x0[ow], x1[ow] (nearest:
 * y0 and x0 only) and *wt the weights fy[oh], fx[ow] of y1 and x1 (linear).
 * Both malloc'd (the caller frees them); -1 when memory is short, with
 * nothing left allocated. */
#define MT_RESIZE_TAPS(T, SFX)                                                  \
    static inline int mt_resize_taps_##SFX(int mode, int64_t h, int64_t w, int64_t oh, int64_t ow, \
                                           double scale_h, double scale_w, int align_corners, \
                                           int64_t **idx, T **wt) {             \
        *idx = malloc(sizeof(int64_t) * (size_t)(2 * (oh + ow) + 1));           \
        *wt = malloc(sizeof(T) * (size_t)(oh + ow + 1));                        \
        if (!*idx || !*wt) { free(*idx); free(*wt); *idx = NULL; *wt = NULL; return -1; } \
        int64_t *y0 = *idx, *y1 = y0 + oh, *x0 = y1 + oh, *x1 = x0 + ow;        \
        if (mode == MT_RESIZE_NEAREST) {                                        \
            for (int64_t i = 0; i < oh; i++) y0[i] = mt_nearest_index(i, h, oh, scale_h); \
            for (int64_t i = 0; i < ow; i++) x0[i] = mt_nearest_index(i, w, ow, scale_w); \
        } else {                                                                \
            mt_linear_table_##SFX(h, oh, scale_h, align_corners, y0, y1, *wt);  \
            mt_linear_table_##SFX(w, ow, scale_w, align_corners, x0, x1, *wt + oh); \
        }                                                                       \
        return 0;                                                               \
    }
MT_RESIZE_TAPS(float, f32)
MT_RESIZE_TAPS(double, f64)
#undef MT_RESIZE_TAPS

#endif
