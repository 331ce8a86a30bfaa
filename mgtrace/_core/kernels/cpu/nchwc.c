/* Convolutions in the NCHW16c layout (float32): the channels in blocks of
 * 16, each pixel's block one 16-float vector, [N][ceil(C/16)][H][W][16];
 * channels past C are zero. What optimize()'s NCHWc pass runs a model's
 * conv layers in (the layout ONNX Runtime's NCHWc transformer and oneDNN
 * pick on x86): a 1x1 or KxK conv then needs no im2col, GEMM packing or
 * transposition at all, and a depthwise conv is whole-vector loads.
 *
 *   dense      (groups 1) two blocks of output channels (32) times up to
 *              14 pixels of an output row in registers (or 7 of each of
 *              two rows, for 7x7 planes); for each input channel and tap,
 *              two weight vectors are loaded and the input value broadcast
 *              (2R FMAs for R + 2 loads). The input is NCHW16c, or
 *              plain NCHW (a model's first conv, 3 channels: blocking them
 *              would pad to 16). Weights packed [pair][input block][tap]
 *              [lane][32]. The last input block sums its channels' lanes
 *              only; a second output block of 8 or fewer channels is
 *              half a block (8-lane multiply-adds) on a stride-1 row.
 *   depthwise  (groups = C = O) up to 8 output pixels of a block in
 *              registers; a tap is one vector load and one FMA a pixel.
 *              Weights packed [block][tap][16].
 *   winograd   (dense 3x3, stride 1, no dilation, NCHW16c input, enough
 *              tiles: mt_conv2d_nchwc_form) F(2x2, 3x3) or F(4x4, 3x3),
 *              the products of each transform point summed over the
 *              channels by the dense micro-kernel. Weights transformed and
 *              packed [point][pair][input block][lane][32].
 *
 * Padding: a dense conv on rows of at most 7 pixels reads each image from
 * a zero-padded copy (every pixel a register tile's); the others read in
 * place, the taps that fall outside the input left out of the tap list,
 * which is one list for a row's interior pixels (the kernel's rows that
 * exist) and one per border pixel, or, for a dense conv, one per border
 * column of the interior rows, computed in tiles down the column. The epilogue (bias, residual, activation: y = act(conv + bias +
 * residual)) runs on each register tile as it is stored, while it is in
 * L1.
 *
 * Max pooling (mt_max_pool2d_nchwc) runs on the same layout, so that a
 * first conv and the pool after it (ResNet's stem) stay blocked.
 *
 * Threads: one OpenMP region a call; tasks are (image, output-channel pair
 * or block, output row or pair of rows, column chunk), in contiguous
 * static ranges.
 */
#include <stdint.h>
#include <string.h>
#include "nn.h"
#include "winograd.h"   /* the transforms, shared with conv/winograd.c */
#ifdef _OPENMP
#include <omp.h>
#endif

#define NC 16           /* channels a block: one AVX-512 vector of float32 */
#define NC_PAIR 32      /* output channels a dense micro-kernel computes */
#define NC_R 14         /* output pixels a dense micro-kernel call (28 accumulators of the 32 registers) */
#define NC_DW_R 8       /* output pixels a depthwise micro-kernel call */
#define NC_CHUNK 192    /* output columns a task: splits a flat 1x1 plane over the threads */
#define NC_GRAIN 32768  /* multiply-adds below which one thread runs the call */
#define NC_SCRATCH (NC_R * NC_PAIR * (int64_t)sizeof(float))   /* bytes of a border column tile (nc_apart) */

/* the kernels are built for AVX-512 and for the baseline, picked at load time */
#define NC_CLONES MT_V4CLONES    /* mt_simd.h */

typedef mt_v16f_u v16;

typedef mt_v16i_u vi16;
typedef mt_v8f_u v8;
typedef mt_v8i_u vi8;

static inline v16 ld16(const float *p) { return *(const v16 *)p; }

/* ReLU and ReLU6 in registers, as act.c computes them (a NaN stays NaN);
 * the other activations run over the stored tile (1: they did). One body
 * for 16 and 8 lanes (nc_act8: half-block tiles). */
#define NC_ACT_BODY(V, VI)                                                     \
    if (act == MT_ACT_RELU || act == MT_ACT_RELU6) a = (V)((VI)a & ~(a < (V){0})); \
    if (act == MT_ACT_RELU6) {                                                \
        const V six = (V){0} + 6.0f;                                          \
        const VI big = a > six;                                               \
        a = (V)(((VI)a & ~big) | ((VI)six & big));                            \
    }                                                                         \
    return a;
static inline v16 nc_act(v16 a, int act) { NC_ACT_BODY(v16, vi16) }
static inline v8 nc_act8(v8 a, int act) { NC_ACT_BODY(v8, vi8) }
#define NC_ACT_T(a, act) _Generic((a), v8: nc_act8, default: nc_act)(a, act)
static inline int nc_act_after(int act) { return act != MT_ACT_NONE && act != MT_ACT_RELU && act != MT_ACT_RELU6; }

int64_t mt_nchwc_blocks(int64_t channels) { return (channels + NC - 1) / NC; }

/* ------------------------------------------------------------- geometry */

/* A conv seen as rows of output pixels. A 1x1, stride 1, unpadded conv is
 * one row of H*W pixels (the plane is contiguous in either layout), which
 * gives the micro-kernels full tiles on 7x7 and 14x14 planes. */
typedef struct {
    int64_t h, w, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw;
    int64_t lanes;      /* 16: NCHW16c input; 1: NCHW input */
    int64_t ncb;        /* input blocks (channels for NCHW input) */
    int64_t ll;         /* lanes of the last input block that hold channels (1 for NCHW) */
    int64_t cbs;        /* floats from one input block (channel) to the next */
    int64_t nob;        /* output blocks */
    int64_t ys;         /* floats from one output block to the next */
    int64_t kk;
} nc_geom;

static void nc_plan(const mt_conv2d_geom *g, int blocked, int flat_ok, nc_geom *q) {
    const int flat = flat_ok && g->kh == 1 && g->kw == 1 && g->sh == 1 && g->sw == 1 && g->ph == 0 && g->pw == 0;
    q->h = flat ? 1 : g->h;
    q->w = flat ? g->h * g->w : g->w;
    q->oh = flat ? 1 : g->oh;
    q->ow = flat ? g->oh * g->ow : g->ow;
    q->kh = g->kh; q->kw = g->kw; q->sh = g->sh; q->sw = g->sw;
    q->ph = g->ph; q->pw = g->pw; q->dh = g->dh; q->dw = g->dw;
    q->lanes = blocked ? NC : 1;
    q->ncb = blocked ? mt_nchwc_blocks(g->c) : g->c;
    q->ll = blocked && g->c % NC ? g->c % NC : q->lanes;
    q->cbs = g->h * g->w * q->lanes;
    q->nob = mt_nchwc_blocks(g->o);
    q->ys = g->oh * g->ow * NC;
    q->kk = g->kh * g->kw;
}

/* The interior columns of a row: the output pixels whose every kernel
 * column falls inside the input, [*a, *b). */
static void nc_interior(const nc_geom *q, int64_t *a, int64_t *b) {
    const int64_t last = q->w - 1 - (q->kw - 1) * q->dw + q->pw;   /* the largest ix0 + pw that fits */
    int64_t lo = mt_ceildiv(q->pw, q->sw), hi = last < 0 ? 0 : last / q->sw + 1;
    lo = mt_min64(lo, q->ow);
    hi = mt_max64(lo, mt_min64(hi, q->ow));
    *a = lo; *b = hi;
}

/* The taps of output pixel (oy, ox) that fall inside the input, as input
 * offsets from the pixel's tap (0, 0) position and tap indices (ox < 0:
 * every column, for a row's interior). Returns their count. */
static int64_t nc_taps(const nc_geom *q, int64_t oy, int64_t ox, int64_t *toff, int64_t *tidx) {
    const int64_t iy0 = oy * q->sh - q->ph;
    const int64_t ix0 = ox < 0 ? 0 : ox * q->sw - q->pw;
    int64_t n = 0;
    for (int64_t ky = 0; ky < q->kh; ky++) {
        const int64_t iy = iy0 + ky * q->dh;
        if (iy < 0 || iy >= q->h) continue;
        for (int64_t kx = 0; kx < q->kw; kx++) {
            const int64_t ix = ix0 + kx * q->dw;
            if (ox >= 0 && (ix < 0 || ix >= q->w)) continue;
            toff[n] = (ky * q->dh * q->w + kx * q->dw) * q->lanes;
            tidx[n++] = ky * q->kw + kx;
        }
    }
    return n;
}

/* the input offset (floats) of output pixel (oy, ox)'s tap (0, 0) */
static inline int64_t nc_origin(const nc_geom *q, int64_t oy, int64_t ox) {
    return ((oy * q->sh - q->ph) * q->w + ox * q->sw - q->pw) * q->lanes;
}

/* ------------------------------------------------------- micro-kernels */

/* Dense: R pixels (SW: a compile-time column stride, 0 for the runtime st)
 * times NV output blocks (3: a block and the first half of the next, T1
 * the second accumulators' type). x: the first pixel's tap-(0, 0) input; weights
 * w + cb * wcbs + tidx[t] * L * 32 + lane * 32; y: block 0's output of the
 * first pixel, block 1 ys floats on; rd: the residual's byte offset from
 * y (0: none). Accumulators start as the bias. (Named variables rather
 * than arrays: GCC keeps them in registers.) The last input block sums
 * its first ll lanes only: the others are the zeros past C (a 24-channel
 * input is a block and a half, and the half's zero lanes were a quarter
 * of the work).
 * Two rows (R1 < R): pixels R1.. are a second row's, their input xr and
 * their output yr floats after the first row's: a 7-pixel row (7x7
 * planes) then fills the registers as a 14-pixel one does, and each
 * weight loaded serves twice the pixels.
 * Half a block (NV 3, output channels 16k + 1..8): the second block's
 * accumulators are 8 lanes, an AVX-512 machine's 256-bit multiply-adds,
 * which Zen 4 issues at twice the rate of its 512-bit ones (two 256-bit
 * halves each); lanes 8..15 are stored as the zeros they are. Each lane's
 * sum is the two-block kernel's, in the same order.
 * Prefetch: each (input block, tap) step also asks for pfl bytes from pf
 * on into L2 (pfl 0: none), the next unit's weights (nc_prefetch_step). */
#define NC_ACC(r) v16 a0_##r = b0; t1v a1_##r = b1;
#define NC_X(r) (r < R1 ? xi[r * ST] : xi[xr + (r - R1) * ST])
#define NC_Y(r) (r < R1 ? y + r * NC : y + yr + (r - R1) * NC)
#define NC_FMA(r) if (R > r) { const float s = NC_X(r); a0_##r += s * w0; if (NV > 1) a1_##r += s * w1; }
#define NC_OUT(r) if (R > r) {                                                 \
    float *yo = NC_Y(r);                                                      \
    if (rd) { a0_##r += ld16((const float *)((const char *)yo + rd));         \
              if (NV > 1) a1_##r += *(const t1v *)((const char *)(yo + ys) + rd); } \
    *(v16 *)yo = nc_act(a0_##r, act);                                         \
    if (NV > 1) *(t1v *)(yo + ys) = NC_ACT_T(a1_##r, act);                     \
    if (NV == 3) *(t1v *)(yo + ys + NC / 2) = (t1v){0}; }
#define NC_ALL(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7) M(8) M(9) M(10) M(11) M(12) M(13)
#define NC_DENSE_T(NAME, RR, R1R, NVV, LL, SW, T1)                             \
static NC_CLONES void NAME(const float *restrict x, int64_t cbs, int64_t ncb, const int64_t *restrict toff, \
                           const int64_t *restrict tidx, int64_t ntap, const float *restrict w, int64_t wcbs, \
                           int64_t st, const float *restrict bias, float *restrict y, int64_t ys, int64_t rd, \
                           int act, int64_t xr, int64_t yr, const char *pf, int64_t pfl, int64_t ll) { \
    enum { R = RR, R1 = R1R, NV = NVV, L = LL };                              \
    typedef T1 t1v;                                                           \
    const int64_t ST = SW ? SW * L : st;                                      \
    const v16 b0 = ld16(bias);                                                \
    const T1 b1 = NV > 1 ? *(const T1 *)(bias + NC) : (T1){0};                \
    NC_ALL(NC_ACC)                                                            \
    for (int64_t cb = 0; cb < ncb; cb++) {                                    \
        const float *xc = x + cb * cbs;                                       \
        const float *wc = w + cb * wcbs;                                      \
        /* (int64: an int index cost a sign extension a step; L 1: no lane  \
         * loop, which GCC unrolled with the broadcasts kept across its      \
         * steps, spilled) */                                                 \
        const int64_t lc = L == 1 ? 1 : cb + 1 < ncb ? L : ll;               \
        for (int64_t t = 0; t < ntap; t++) {                                  \
            const float *xt = xc + toff[t];                                   \
            const float *wt = wc + tidx[t] * (L * NC_PAIR);                   \
            for (int64_t k = 0; k < pfl; k += 64) __builtin_prefetch(pf + k, 0, 2); \
            pf += pfl;                                                        \
            for (int64_t i = 0; i < lc; i++) {                                \
                const v16 w0 = ld16(wt + i * NC_PAIR);                        \
                const T1 w1 = NV > 1 ? *(const T1 *)(wt + i * NC_PAIR + NC) : (T1){0}; \
                const float *xi = xt + i;                                     \
                NC_ALL(NC_FMA)                                                \
            }                                                                 \
        }                                                                     \
    }                                                                         \
    NC_ALL(NC_OUT)                                                            \
}
#define NC_DENSE(NAME, RR, R1R, NVV, LL, SW) NC_DENSE_T(NAME, RR, R1R, NVV, LL, SW, v16)
#define NC_SET_T(TAG, NV, L, SW, T1)                                          \
    NC_DENSE_T(TAG##_1, 1, 1, NV, L, SW, T1) NC_DENSE_T(TAG##_2, 2, 2, NV, L, SW, T1) \
    NC_DENSE_T(TAG##_3, 3, 3, NV, L, SW, T1) NC_DENSE_T(TAG##_4, 4, 4, NV, L, SW, T1) \
    NC_DENSE_T(TAG##_5, 5, 5, NV, L, SW, T1) NC_DENSE_T(TAG##_6, 6, 6, NV, L, SW, T1) \
    NC_DENSE_T(TAG##_7, 7, 7, NV, L, SW, T1) NC_DENSE_T(TAG##_8, 8, 8, NV, L, SW, T1) \
    NC_DENSE_T(TAG##_9, 9, 9, NV, L, SW, T1) NC_DENSE_T(TAG##_10, 10, 10, NV, L, SW, T1) \
    NC_DENSE_T(TAG##_11, 11, 11, NV, L, SW, T1) NC_DENSE_T(TAG##_12, 12, 12, NV, L, SW, T1) \
    NC_DENSE_T(TAG##_13, 13, 13, NV, L, SW, T1) NC_DENSE_T(TAG##_14, 14, 14, NV, L, SW, T1)
#define NC_SET(TAG, NV, L, SW) NC_SET_T(TAG, NV, L, SW, v16)
/* two rows of 1..7 pixels (NCHW16c input only: the NCHW convs are stems on large planes) */
#define NC_SET2(TAG, NV, SW)                                                  \
    NC_DENSE(TAG##_1, 2, 1, NV, NC, SW) NC_DENSE(TAG##_2, 4, 2, NV, NC, SW) NC_DENSE(TAG##_3, 6, 3, NV, NC, SW) \
    NC_DENSE(TAG##_4, 8, 4, NV, NC, SW) NC_DENSE(TAG##_5, 10, 5, NV, NC, SW) NC_DENSE(TAG##_6, 12, 6, NV, NC, SW) \
    NC_DENSE(TAG##_7, 14, 7, NV, NC, SW)
/* input NCHW16c (b) or NCHW (p); one or two output blocks; stride 1, 2, other */
NC_SET(nc_b1s1, 1, NC, 1) NC_SET(nc_b1s2, 1, NC, 2) NC_SET(nc_b1ss, 1, NC, 0)
NC_SET(nc_b2s1, 2, NC, 1) NC_SET(nc_b2s2, 2, NC, 2) NC_SET(nc_b2ss, 2, NC, 0)
NC_SET(nc_p1s1, 1, 1, 1) NC_SET(nc_p1s2, 1, 1, 2) NC_SET(nc_p1ss, 1, 1, 0)
NC_SET(nc_p2s1, 2, 1, 1) NC_SET(nc_p2s2, 2, 1, 2) NC_SET(nc_p2ss, 2, 1, 0)
NC_SET2(nc_r1s1, 1, 1) NC_SET2(nc_r1s2, 1, 2) NC_SET2(nc_r1ss, 1, 0)
NC_SET2(nc_r2s1, 2, 1) NC_SET2(nc_r2s2, 2, 2) NC_SET2(nc_r2ss, 2, 0)
/* a block and a half: NCHW16c input, stride 1 (a 1x1 conv's flat plane:
 * MobileNetV2's projections to 24 channels); other strides run the
 * two-block kernels */
NC_SET_T(nc_h2s1, 3, NC, 1, v8)

typedef void (*nc_dense_fn)(const float *restrict, int64_t, int64_t, const int64_t *restrict,
                            const int64_t *restrict, int64_t, const float *restrict, int64_t, int64_t,
                            const float *restrict, float *restrict, int64_t, int64_t, int, int64_t, int64_t,
                            const char *, int64_t, int64_t);

/* The prefetch a micro-kernel call makes when it is to bring `bytes` from
 * p into L2 over its steps (input blocks times taps): bytes a step, whole
 * lines. A unit's weights are read from L2 by each of its tasks but the
 * first, which streams them from memory: 9.4 MB for a 512-channel 3x3
 * layer, 590 KB a unit, where the caches keep nothing of the layer from
 * one forward to the next (a model's weights and activations pass through
 * them in between). Asked for one unit ahead, spread over the current
 * unit's tasks, they arrive while the arithmetic runs. */
static inline int64_t nc_prefetch_step(int64_t bytes, int64_t steps) {
    return steps > 0 && bytes > 0 ? ((bytes + steps - 1) / steps + 63) & ~(int64_t)63 : 0;
}
#define NC_TABLE(TAG) {TAG##_1, TAG##_2, TAG##_3, TAG##_4, TAG##_5, TAG##_6, TAG##_7, TAG##_8, \
                       TAG##_9, TAG##_10, TAG##_11, TAG##_12, TAG##_13, TAG##_14}
#define NC_TABLE2(TAG) {TAG##_1, TAG##_2, TAG##_3, TAG##_4, TAG##_5, TAG##_6, TAG##_7}
/* [blocked input][output blocks - 1][stride 1, 2, other][R - 1] */
static const nc_dense_fn nc_dense_kernels[2][2][3][NC_R] = {
    {{NC_TABLE(nc_p1s1), NC_TABLE(nc_p1s2), NC_TABLE(nc_p1ss)},
     {NC_TABLE(nc_p2s1), NC_TABLE(nc_p2s2), NC_TABLE(nc_p2ss)}},
    {{NC_TABLE(nc_b1s1), NC_TABLE(nc_b1s2), NC_TABLE(nc_b1ss)},
     {NC_TABLE(nc_b2s1), NC_TABLE(nc_b2s2), NC_TABLE(nc_b2ss)}},
};
/* two rows, NCHW16c input: [output blocks - 1][stride 1, 2, other][pixels a row - 1] */
#define NC_R2 7
static const nc_dense_fn nc_dense2_kernels[2][3][NC_R2] = {
    {NC_TABLE2(nc_r1s1), NC_TABLE2(nc_r1s2), NC_TABLE2(nc_r1ss)},
    {NC_TABLE2(nc_r2s1), NC_TABLE2(nc_r2s2), NC_TABLE2(nc_r2ss)},
};
/* a block and a half (NV 3), NCHW16c input, stride 1: [R - 1] */
static const nc_dense_fn nc_half_kernels[NC_R] = NC_TABLE(nc_h2s1);

/* Depthwise: R pixels of one block; a tap is a vector load of the input
 * and a multiply-add with the tap's weight vector w + tidx[t] * 16. */
#define NC_DW_ACC(r) v16 a_##r = b0;
#define NC_DW_FMA(r) if (R > r) a_##r += ld16(xt + r * ST) * wv;
#define NC_DW_OUT(r) if (R > r) {                                              \
    if (rd) a_##r += ld16((const float *)((const char *)(y + r * NC) + rd));   \
    *(v16 *)(y + r * NC) = nc_act(a_##r, act); }
#define NC_DW_ALL(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7)
#define NC_DW(NAME, RR, SW)                                                     \
static NC_CLONES void NAME(const float *restrict x, const int64_t *restrict toff, const int64_t *restrict tidx, \
                           int64_t ntap, const float *restrict w, int64_t st, const float *restrict bias, \
                           float *restrict y, int64_t rd, int act) {          \
    enum { R = RR };                                                          \
    const int64_t ST = SW ? SW * NC : st;                                     \
    const v16 b0 = ld16(bias);                                                \
    NC_DW_ALL(NC_DW_ACC)                                                      \
    for (int64_t t = 0; t < ntap; t++) {                                      \
        const float *xt = x + toff[t];                                        \
        const v16 wv = ld16(w + tidx[t] * NC);                                \
        NC_DW_ALL(NC_DW_FMA)                                                  \
    }                                                                         \
    NC_DW_ALL(NC_DW_OUT)                                                      \
}
#define NC_DW_SET(TAG, SW)                                                    \
    NC_DW(TAG##_1, 1, SW) NC_DW(TAG##_2, 2, SW) NC_DW(TAG##_3, 3, SW) NC_DW(TAG##_4, 4, SW) \
    NC_DW(TAG##_5, 5, SW) NC_DW(TAG##_6, 6, SW) NC_DW(TAG##_7, 7, SW) NC_DW(TAG##_8, 8, SW)
NC_DW_SET(nc_dws1, 1) NC_DW_SET(nc_dws2, 2) NC_DW_SET(nc_dwss, 0)

typedef void (*nc_dw_fn)(const float *restrict, const int64_t *restrict, const int64_t *restrict, int64_t,
                         const float *restrict, int64_t, const float *restrict, float *restrict, int64_t, int);
#define NC_DW_TABLE(TAG) {TAG##_1, TAG##_2, TAG##_3, TAG##_4, TAG##_5, TAG##_6, TAG##_7, TAG##_8}
static const nc_dw_fn nc_dw_kernels[3][NC_DW_R] = {
    NC_DW_TABLE(nc_dws1), NC_DW_TABLE(nc_dws2), NC_DW_TABLE(nc_dwss)};

/* ------------------------------------------------------------- weights */

static int is_depthwise(const mt_conv2d_geom *g) { return g->groups > 1; }

static int64_t nw_packed_bytes(const mt_conv2d_geom *g, int64_t e);
static void nw_pack(const float *w, float *u, const mt_conv2d_geom *g, int64_t e);
static int64_t nw_workspace(const mt_conv2d_geom *g, int64_t e, int nthreads);
static int nw_conv(const float *x, const float *u, const float *bias, float *y, const mt_conv2d_geom *g,
                   int64_t e, int nthreads, void *workspace);
/* a form's Winograd tile edge: 2 or 4, 0 for a direct form */
static int64_t nw_edge(int form) { return form == MT_NCHWC_WINOGRAD ? 2 : form == MT_NCHWC_WINOGRAD4 ? 4 : 0; }

int64_t mt_conv2d_nchwc_packed_bytes(const mt_conv2d_geom *g, int blocked) {
    if (nw_edge(blocked)) return nw_packed_bytes(g, nw_edge(blocked));
    const int64_t kk = g->kh * g->kw, nob = mt_nchwc_blocks(g->o);
    if (is_depthwise(g)) return nob * kk * NC * (int64_t)sizeof(float);
    const int64_t ncb = blocked ? mt_nchwc_blocks(g->c) : g->c, lanes = blocked ? NC : 1;
    return (nob + 1) / 2 * ncb * kk * lanes * NC_PAIR * (int64_t)sizeof(float);
}

/* weight [O, C/groups, KH, KW] -> dense [pair][input block][tap][lane][32]
 * or depthwise [block][tap][16], zeros past O and C */
void mt_conv2d_nchwc_pack(const float *w, float *packed, const mt_conv2d_geom *g, int blocked) {
    if (nw_edge(blocked)) {
        nw_pack(w, packed, g, nw_edge(blocked));
        return;
    }
    const int64_t kk = g->kh * g->kw, nob = mt_nchwc_blocks(g->o);
    if (is_depthwise(g)) {
        for (int64_t b = 0; b < nob; b++)
            for (int64_t t = 0; t < kk; t++)
                for (int64_t j = 0; j < NC; j++) {
                    const int64_t c = b * NC + j;
                    *packed++ = c < g->o ? w[c * kk + t] : 0.0f;
                }
        return;
    }
    const int64_t lanes = blocked ? NC : 1, ncb = blocked ? mt_nchwc_blocks(g->c) : g->c;
    for (int64_t p = 0; p < (nob + 1) / 2; p++)
        for (int64_t cb = 0; cb < ncb; cb++)
            for (int64_t t = 0; t < kk; t++)
                for (int64_t i = 0; i < lanes; i++)
                    for (int64_t j = 0; j < NC_PAIR; j++) {
                        const int64_t o = p * NC_PAIR + j, c = cb * lanes + i;
                        *packed++ = o < g->o && c < g->c ? w[(o * g->c + c) * kk + t] : 0.0f;
                    }
}

/* --------------------------------------------------------------- calls */

static int64_t bias_bytes(const mt_conv2d_geom *g) {
    return ((mt_nchwc_blocks(g->o) + 1) / 2 * NC_PAIR * (int64_t)sizeof(float) + 63) & ~(int64_t)63;
}


/* The channels past O of r output pixels of the last block, from lane
 * `from` on, back to zero before the activations that run after the
 * store (ReLU and ReLU6 in registers left 0 as 0): their weights and bias are zero, but an infinite input times
 * zero is NaN, which the next conv would spread (its zero weights for
 * these lanes do not stop a NaN). */
static NC_CLONES void nc_zero_tail(float *y, int64_t r, int from) {
    vi16 keep;          /* (a vector AND per pixel: memset's rep stos cost 15% of a 24-channel conv) */
    for (int l = 0; l < NC; l++) keep[l] = l < from ? -1 : 0;
    for (int64_t p = 0; p < r; p++) *(vi16 *)(y + p * NC) &= keep;
}

/* The pixels of the next register tile when `left` remain: even tiles of
 * at most `cap` (with 12: 12 + 12 + 11 + ..., not 12 + ... + 4). */
static inline int64_t nc_tile(int64_t left, int64_t cap) {
    const int64_t k = (left + cap - 1) / cap;
    return left <= cap ? left : (left + k - 1) / k;
}

/* After a tile of r pixels was stored to nv blocks ys floats apart: the
 * unused lanes of the last block (tail: the lanes used, 0 when all are)
 * zeroed, then the activations the kernels do not apply in registers. */
static void nc_finish(float *yp, int nv, int64_t ys, int64_t r, int tail, int act) {
    if (tail) nc_zero_tail(yp + (nv - 1) * ys, r, tail);
    if (nc_act_after(act))
        for (int v = 0; v < nv; v++) mt_act_f32(yp + v * ys, r * NC, act);
}

/* Columns [c0, c1) of output row oy of one unit (a pair of output blocks,
 * nv of them real, or a depthwise block): the border pixels one by one
 * with their own taps, the interior in register tiles. x: the image (the
 * unit's input block for depthwise); w, b: the unit's packed weights and
 * bias; y: the unit's first output plane of the image. */
static void nc_row(const nc_geom *q, int dw, int nv, int tail, const float *x, const float *w, const float *b,
                   float *y, int64_t oy, int64_t c0, int64_t c1, int64_t *tl, int act, int64_t rd,
                   const char *pf, int64_t pfbytes, int skip_border) {
    int64_t *toff = tl, *tidx = tl + q->kk, *eoff = tl + 2 * q->kk, *eidx = tl + 3 * q->kk;
    int64_t a, bnd;
    nc_interior(q, &a, &bnd);
    a = mt_max64(c0, mt_min64(a, c1));
    bnd = mt_max64(a, mt_min64(bnd, c1));
    const int si = q->sw == 1 ? 0 : q->sw == 2 ? 1 : 2;
    const int64_t st = q->sw * q->lanes, wcbs = q->kk * q->lanes * NC_PAIR;
    /* a block and a half where the second block's channels are 8 or fewer */
    const nc_dense_fn *dk = nv == 2 && tail && tail <= NC / 2 && si == 0 && q->lanes == NC ? nc_half_kernels
                            : nc_dense_kernels[q->lanes == NC][nv - 1][si];
    const nc_dw_fn *wk = nc_dw_kernels[si];
    float *yrow = y + oy * q->ow * NC;
    const int64_t ntap = nc_taps(q, oy, -1, toff, tidx);
    int64_t ox = c0;
    while (ox < c1) {
        int64_t r, n;
        const int64_t *off = toff, *idx = tidx;
        if (ox < a || ox >= bnd) {        /* a border pixel: its own taps */
            if (skip_border) {            /* (nc_border_cols computes it) */
                ox++;
                continue;
            }
            r = 1;
            n = nc_taps(q, oy, ox, eoff, eidx);
            off = eoff; idx = eidx;
        } else {                          /* interior: even tiles up to the kernel's width */
            r = nc_tile(bnd - ox, dw ? NC_DW_R : NC_R);
            n = ntap;
        }
        const float *xp = x + nc_origin(q, oy, ox);
        float *yp = yrow + ox * NC;
        if (dw) wk[r - 1](xp, off, idx, n, w, st, b, yp, rd, act);
        else {      /* (the prefetch in the first call: a row's calls share the weights) */
            dk[r - 1](xp, q->cbs, q->ncb, off, idx, n, w, wcbs, st, b, yp, q->ys, rd, act, 0, 0, pf,
                      nc_prefetch_step(pfbytes, q->ncb * n), q->ll);
            pfbytes = 0;
        }
        nc_finish(yp, dw ? 1 : nv, q->ys, r, tail, act);
        ox += r;
    }
}

/* Output rows oy and oy + 1 of one dense unit whose rows are at most NC_R2
 * pixels wide, every pixel interior (a dense conv's always are: padding
 * is in its padded copy), in one micro-kernel call of two rows. */
static void nc_rows2(const nc_geom *q, int nv, int tail, const float *x, const float *w, const float *b,
                     float *y, int64_t oy, int64_t *tl, int act, int64_t rd, const char *pf, int64_t pfbytes) {
    int64_t *toff = tl, *tidx = tl + q->kk;
    const int64_t ntap = nc_taps(q, oy, -1, toff, tidx);
    const int si = q->sw == 1 ? 0 : q->sw == 2 ? 1 : 2;
    const int64_t st = q->sw * q->lanes, wcbs = q->kk * q->lanes * NC_PAIR;
    float *yp = y + oy * q->ow * NC;
    nc_dense2_kernels[nv - 1][si][q->ow - 1](x + nc_origin(q, oy, 0), q->cbs, q->ncb, toff, tidx, ntap, w, wcbs,
                                             st, b, yp, q->ys, rd, act, q->sh * q->w * q->lanes, q->ow * NC,
                                             pf, nc_prefetch_step(pfbytes, q->ncb * ntap), q->ll);
    nc_finish(yp, nv, q->ys, 2 * q->ow, tail, act);
}

/* A dense conv with padding whose output rows are wider than NC_R2 reads
 * its input in place: each row's interior columns in register tiles with
 * the row's taps (those of the kernel rows inside the input), each border
 * column of the interior rows in tiles down the column (nc_border_cols),
 * only the corners one pixel at a time. The zero-padded copy this replaces
 * was a pass over the image before every call: 21 us of ResNet-18's
 * layer2.0.conv1 (3x3 stride 2, 64 channels of 56x56: 3.5%) and 76 us of
 * its stem (7x7 stride 2 on 3 x 224 x 224: 6.4%), cold, at one thread.
 * Narrower rows (7x7 planes) keep the copy: they go two rows a call
 * through the micro-kernel, which wants every pixel interior. The taps
 * left out read the padding's zeros: the sums are the copy's but for the
 * sign of a zero sum and the NaN of a zero times an infinite weight, as
 * the depthwise convs sum. */
static int nc_apart(const mt_conv2d_geom *g) {
    return !is_depthwise(g) && (g->ph > 0 || g->pw > 0) && g->ow > NC_R2;
}

/* The interior rows: the output rows whose every kernel row falls inside
 * the input, [*a, *b) (nc_interior's rule down the columns). */
static void nc_interior_rows(const nc_geom *q, int64_t *a, int64_t *b) {
    const int64_t last = q->h - 1 - (q->kh - 1) * q->dh + q->ph;
    int64_t lo = mt_ceildiv(q->ph, q->sh), hi = last < 0 ? 0 : last / q->sh + 1;
    lo = mt_min64(lo, q->oh);
    hi = mt_max64(lo, mt_min64(hi, q->oh));
    *a = lo; *b = hi;
}

/* The border columns (those outside nc_interior's [a, b)): how many, and
 * the k-th of them. */
static int64_t nc_border_count(const nc_geom *q) {
    int64_t a, b;
    nc_interior(q, &a, &b);
    return a + q->ow - b;
}
static int64_t nc_border_col(const nc_geom *q, int64_t k) {
    int64_t a, b;
    nc_interior(q, &a, &b);
    return k < a ? k : b + (k - a);
}

/* Output pixels (oy0 + i, ox), i < r <= NC_R, of one dense unit, every row
 * interior: one micro-kernel call with the column's taps and the input's
 * row stride times sh as its pixel stride, into the thread's scratch (r
 * pixels of each block, NC_R * NC floats apart), then the residual and
 * the activation as the micro-kernel's store applies them (NC_OUT: the
 * same additions in the same order), each pixel to its place in y. */
static NC_CLONES void nc_border_cols(const nc_geom *q, int nv, int tail, const float *x, const float *w,
                                     const float *b, float *y, int64_t oy0, int64_t ox, int64_t r, int64_t *tl,
                                     float *scratch, int act, int64_t rd) {
    int64_t *eoff = tl + 2 * q->kk, *eidx = tl + 3 * q->kk;
    const int64_t n = nc_taps(q, oy0, ox, eoff, eidx);
    const int64_t wcbs = q->kk * q->lanes * NC_PAIR, st = q->sh * q->w * q->lanes;
    nc_dense_kernels[q->lanes == NC][nv - 1][2][r - 1](x + nc_origin(q, oy0, ox), q->cbs, q->ncb, eoff, eidx, n,
                                                        w, wcbs, st, b, scratch, NC_R * NC, 0, MT_ACT_NONE, 0, 0,
                                                        NULL, 0, q->ll);
    for (int64_t i = 0; i < r; i++) {
        float *yo = y + ((oy0 + i) * q->ow + ox) * NC;
        for (int v = 0; v < nv; v++) {
            float *yv = yo + v * q->ys;
            v16 a = ld16(scratch + v * NC_R * NC + i * NC);
            if (rd) a += ld16((const float *)((const char *)yv + rd));
            *(v16 *)yv = nc_act(a, act);
        }
        nc_finish(yo, nv, q->ys, 1, tail, act);
    }
}

/* Otherwise a dense conv with padding reads each image from a zero-padded
 * copy in the workspace, so that every output pixel is a register tile's
 * (border pixels one at a time ran at a fifth of the speed: 7x7 planes
 * have two in seven). A depthwise conv has no such loss and reads its
 * input in place. */
static int64_t padded_bytes(const mt_conv2d_geom *g, int blocked) {
    if (is_depthwise(g) || (g->ph == 0 && g->pw == 0) || nc_apart(g)) return 0;
    const int64_t lanes = blocked ? NC : 1, ncb = blocked ? mt_nchwc_blocks(g->c) : g->c;
    int64_t n = 0;
    if (__builtin_mul_overflow(ncb * lanes * (int64_t)sizeof(float), g->h + 2 * g->ph, &n)
        || __builtin_mul_overflow(n, g->w + 2 * g->pw, &n) || n > INT64_MAX - 63)
        return MT_NN_EOVERFLOW;
    return (n + 63) & ~(int64_t)63;
}

/* MT_NN_EOVERFLOW when the sizes do not fit int64 */
int64_t mt_conv2d_nchwc_workspace(const mt_conv2d_geom *g, int blocked, int nthreads) {
    if (nw_edge(blocked)) return nw_workspace(g, nw_edge(blocked), nthreads);
    const int64_t pad = padded_bytes(g, blocked);
    int64_t taps = 0;
    if (pad < 0 || __builtin_mul_overflow((int64_t)(nthreads < 1 ? 1 : nthreads) * 4 * (int64_t)sizeof(int64_t),
                                          g->kh * g->kw, &taps) || taps > INT64_MAX / 2 - pad)
        return MT_NN_EOVERFLOW;
    /* nc_apart: each thread's scratch for a border column tile */
    const int64_t scratch = nc_apart(g) ? 64 + (nthreads < 1 ? 1 : nthreads) * NC_SCRATCH : 0;
    return bias_bytes(g) + pad + taps + scratch;
}

/* image n's channel block (channel for NCHW) cb into the padded copy,
 * its border zeroed: by the tasks of the copy, on every thread, rather
 * than a memset of the whole copy before the parallel region (serial time
 * in every padded call, 0.6-0.9 MB for ResNet-18's stem and its first
 * stride-2 conv) */
static void pad_block(const float *x, float *xp, const mt_conv2d_geom *g, const nc_geom *q, int64_t n, int64_t cb) {
    const int64_t rowf = g->w * q->lanes, src_plane = g->h * rowf, prow = q->w * q->lanes, side = g->pw * q->lanes;
    const float *s = x + (n * q->ncb + cb) * src_plane;
    float *plane = xp + cb * q->cbs;
    memset(plane, 0, (size_t)(g->ph * prow) * sizeof(float));
    for (int64_t r = 0; r < g->h; r++) {
        float *d = plane + (g->ph + r) * prow;
        memset(d, 0, (size_t)side * sizeof(float));
        memcpy(d + side, s + r * rowf, (size_t)rowf * sizeof(float));
        memset(d + side + rowf, 0, (size_t)(prow - side - rowf) * sizeof(float));
    }
    memset(plane + (g->ph + g->h) * prow, 0, (size_t)((q->h - g->ph - g->h) * prow) * sizeof(float));
}

/* A direct conv call's plan (nc_plan_call), run by each thread of a
 * parallel region (nc_run): mt_conv2d_nchwc's, and the projection conv of
 * mt_conv2d_nchwc_pw_dw_pw. */
typedef struct {
    const float *x, *packed, *bp;
    float *y, *xp;                /* xp: the padded copy (NULL: none) */
    int64_t *tls;                 /* 4 kk tap entries a thread */
    float *scratch;               /* nc_apart: NC_SCRATCH bytes a thread */
    const mt_conv2d_geom *g;
    nc_geom q;
    int dw, two, units_outer;
    int64_t bands;                /* units outer: the rows in this many bands, each band's units in turn */
    int64_t pbytes, units, width, nchunk, chunk, rows, tasks, wunit, rd;
    /* nc_apart: the tasks of rows [0, rtasks), then those of the border
     * columns (unit, column, band of rows); interior rows [ra, rb) in
     * bands of bsize, nband of them, nbc border columns */
    int64_t rtasks, ra, rb, bsize, nband, nbc;
} nc_call;

/* Row bands. With units outer on several threads (nc_plan_call), each
 * thread read the whole image once a unit, half of it from the other core on a 2-core
 * Intel Xeon (Sapphire Rapids class): ResNet-18's layer2.0.conv1 (3x3
 * stride 2, 64 channels of 56x56: 0.8 MB of input, 0.3 MB of weights)
 * took 400 us at batch 1 on 2 threads where rows outer took 325 (and 650
 * on 1 thread against units outer's 610). Banded, each thread takes a
 * band of the rows and runs its units in turn over it: 340 us, 2960
 * against 3400 at batch 8. Where the weights outweigh the input it
 * costs: each thread then reads every unit's weights (layer4's 3x3
 * convs, 9.4 MB: 770 -> 880 us), so bands only where the input is the
 * larger; and not on NCHW input: the stem (0.6 MB of input) ran no
 * faster in bands, and the max pool after it, whose threads take whole
 * blocks, took 80 us instead of 62. Measured on Intel only; Zen 4 keeps
 * the order it was tuned with. mt_nchwc_set_bands (tests): -1 (default)
 * as the CPU says, 0 never, 1 wherever the bytes say. */
static int nc_bands_mode = -1;

int mt_nchwc_set_bands(int mode) {
    const int old = nc_bands_mode;
    nc_bands_mode = mode < 0 ? -1 : mode > 0;
    return old;
}

static int nc_bands_on(void) { return nc_bands_mode >= 0 ? nc_bands_mode : mt_cpu_intel(); }

/* the threads a direct conv call uses */
static int nc_threads(const mt_conv2d_geom *g, int nthreads) {
    const int64_t macs = g->n * g->o * g->oh * g->ow * (is_depthwise(g) ? 1 : g->c) * g->kh * g->kw;
    return macs >= NC_GRAIN ? nthreads : 1;
}

/* The plan of a direct conv on nt threads; fills the workspace's bias and
 * padding (mt_conv2d_nchwc_workspace's bytes). */
static void nc_plan_call(nc_call *c, const float *x, int blocked, const float *packed, const float *bias, float *y,
                         const mt_conv2d_geom *g, int nt, void *workspace) {
    c->x = x; c->packed = packed; c->y = y; c->g = g;
    c->dw = is_depthwise(g);
    c->pbytes = padded_bytes(g, blocked);
    mt_conv2d_geom gp = *g;              /* the geometry the kernels see: the padded copy's */
    if (c->pbytes) { gp.h += 2 * g->ph; gp.w += 2 * g->pw; gp.ph = gp.pw = 0; }
    nc_geom *q = &c->q;
    nc_plan(&gp, blocked || c->dw, c->pbytes == 0, q);    /* a padded copy has rows: never flat */
    c->units = c->dw ? q->nob : (q->nob + 1) / 2;
    c->width = c->dw ? NC : NC_PAIR;
    float *bp = (float *)workspace;
    for (int64_t i = 0; i < c->units * c->width; i++) bp[i] = bias && i < g->o ? bias[i] : 0.0f;
    c->bp = bp;
    c->xp = c->pbytes ? (float *)((char *)workspace + bias_bytes(g)) : NULL;
    c->tls = (int64_t *)((char *)workspace + bias_bytes(g) + c->pbytes);
    /* rows split in chunks of columns: at most NC_CHUNK wide, and enough
     * tasks (8 a thread) that a static split is even: a 784-pixel plane of
     * one unit made 5 tasks, 3 for one thread and 2 for the other */
    /* rows of at most NC_R2 pixels (7x7 planes) go two at a time: a task
     * then covers a pair of rows */
    c->two = !c->dw && q->lanes == NC && q->ow <= NC_R2 && q->oh > 1;
    const int64_t trows = c->two ? (q->oh + 1) / 2 : q->oh;
    int64_t nchunk = (q->ow + NC_CHUNK - 1) / NC_CHUNK;
    const int64_t even = (8 * nt + c->units * trows - 1) / (c->units * trows), most = (q->ow + NC_R - 1) / NC_R;
    if (nt > 1 && even > nchunk) nchunk = even < most ? even : most;
    /* and a multiple of the threads where chunks of a tile or more allow:
     * a 56x56 plane's 17 chunks of one unit went 9 to one thread, 8 to
     * the other (MobileNetV2's projection to 24 channels) */
    while (nt > 1 && c->units * trows * nchunk % nt && nchunk < most) nchunk++;
    c->nchunk = nchunk;
    c->chunk = (q->ow + nchunk - 1) / nchunk;
    c->rows = trows * nchunk;
    c->tasks = c->rtasks = c->units * c->rows;
    c->scratch = NULL;
    c->ra = c->rb = c->nband = c->bsize = c->nbc = 0;
    if (!c->dw && c->pbytes == 0 && nc_apart(g)) {
        const int64_t taps = (int64_t)nt * 4 * q->kk * (int64_t)sizeof(int64_t);
        c->scratch = (float *)((char *)workspace + ((bias_bytes(g) + taps + 63) & ~(int64_t)63));
        nc_interior_rows(q, &c->ra, &c->rb);
        c->nbc = nc_border_count(q);
        if (c->rb > c->ra && c->nbc > 0) {
            c->nband = (c->rb - c->ra + NC_R - 1) / NC_R;
            c->bsize = (c->rb - c->ra + c->nband - 1) / c->nband;
            c->nband = (c->rb - c->ra + c->bsize - 1) / c->bsize;
            c->tasks += c->units * c->nbc * c->nband;
        }
    }
    const int64_t xbytes = q->ncb * q->cbs * 4, wbytes = mt_conv2d_nchwc_packed_bytes(g, blocked);
    /* each task order reads one operand again per step of the other:
     * units outer re-reads the input once a unit, rows outer the weights once a row */
    c->units_outer = !c->dw && c->units * xbytes < c->rows * wbytes;
    c->bands = c->units_outer && nt > 1 && q->lanes == NC && xbytes >= wbytes && nc_bands_on()
               ? mt_min64(nt, c->rows) : 1;
    c->wunit = c->dw ? q->kk * NC : q->ncb * q->kk * q->lanes * NC_PAIR;
    c->rd = g->has_res ? g->res_delta : 0;
}

/* Row task `task`'s unit and row (of c->rows), and the rows [*lo, *hi)
 * of its band: rows outer, task = row * units + unit; units outer, the
 * rows in c->bands contiguous bands, task = the band's first task + unit *
 * the band's rows + its row in the band. */
static void nc_task_ur(const nc_call *c, int64_t task, int64_t *u, int64_t *row, int64_t *lo, int64_t *hi) {
    if (!c->units_outer) {
        *u = task % c->units; *row = task / c->units;
        *lo = 0; *hi = c->rows;
        return;
    }
    int64_t b = 0;
    while (b + 1 < c->bands && task >= c->units * (c->rows * (b + 1) / c->bands)) b++;
    *lo = c->rows * b / c->bands; *hi = c->rows * (b + 1) / c->bands;
    const int64_t k = task - c->units * *lo;
    *u = k / (*hi - *lo); *row = *lo + k % (*hi - *lo);
}

/* Border task `task` (from c->rtasks on, nc_apart): its unit, its border
 * column's index (nc_border_col) and its band of rows [*oy0, *oy0 + *r). */
static void nc_border_task(const nc_call *c, int64_t task, int64_t *u, int64_t *col, int64_t *oy0,
                           int64_t *r) {
    const int64_t bt = task - c->rtasks, per_unit = c->nbc * c->nband;
    *u = bt / per_unit;
    *col = bt % per_unit / c->nband;
    *oy0 = c->ra + bt % c->nband * c->bsize;
    *r = mt_min64(c->bsize, c->rb - *oy0);
}

/* The multiply-adds of task `task` (nc_run's numbering), in units of one
 * output block's pixel tap: a row task's pixels (its interior ones where
 * the border columns are tasks of their own) times its row's taps, or a
 * border column band's pixels times the column's taps. */
static int64_t nc_task_cost(const nc_call *c, int64_t task, int64_t *tl) {
    const nc_geom *q = &c->q;
    int64_t *toff = tl, *tidx = tl + q->kk;
    if (task >= c->rtasks) {
        int64_t u, col, oy0, r;
        nc_border_task(c, task, &u, &col, &oy0, &r);
        const int64_t nv = 2 * u + 1 < q->nob ? 2 : 1;
        return nv * r * nc_taps(q, oy0, nc_border_col(q, col), toff, tidx);
    }
    int64_t u, row, blo, bhi;
    nc_task_ur(c, task, &u, &row, &blo, &bhi);
    const int64_t oy = row / c->nchunk, c0 = (row % c->nchunk) * c->chunk, c1 = mt_min64(q->ow, c0 + c->chunk);
    int64_t a = c0, b = c1;
    if (oy >= c->ra && oy < c->rb) {      /* the border columns are the border tasks' */
        nc_interior(q, &a, &b);
        a = mt_max64(c0, mt_min64(a, c1));
        b = mt_max64(a, mt_min64(b, c1));
    }
    const int64_t nv = 2 * u + 1 < q->nob ? 2 : 1;
    return nv * (b - a) * nc_taps(q, oy, -1, toff, tidx);
}

/* Thread me's tasks [*t0, *t1) of a team: contiguous ranges as
 * schedule(static) deals them (equal counts, the first tasks % team
 * threads one more), or, where the border columns are tasks of their own
 * (nc_apart), ranges of equal cost (nc_task_cost): a border band is a
 * sixth to a tenth of a row task, and equal counts gave ResNet-18's stem
 * 59% of the work on one thread of two. */
static void nc_split(const nc_call *c, int me, int team, int64_t *tl, int64_t *t0, int64_t *t1) {
    const int64_t per = c->tasks / team, extra = c->tasks % team;
    *t0 = me * per + (me < extra ? me : extra);
    *t1 = *t0 + per + (me < extra);
    if (team == 1 || c->tasks == c->rtasks) return;
    int64_t total = 0;
    for (int64_t t = 0; t < c->tasks; t++) total += nc_task_cost(c, t, tl);
    /* the first task whose costs before it reach k / team of the total */
    int64_t sum = 0, t = 0;
    while (t < c->tasks && sum * team < total * me) sum += nc_task_cost(c, t++, tl);
    *t0 = t;
    while (t < c->tasks && sum * team < total * (me + 1)) sum += nc_task_cost(c, t++, tl);
    *t1 = me + 1 == team ? c->tasks : t;
}

/* A direct conv's tasks, run by every thread of the enclosing parallel
 * region (its work-sharing loops are orphaned). One barrier a call where
 * there is no padded copy (the region's end, or the caller's): each
 * barrier costs a futex system call in libgomp, and the tasks of one image
 * never read another's output. */
static void nc_run(const nc_call *c) {
    const nc_geom *q = &c->q;
    const mt_conv2d_geom *g = c->g;
#ifdef _OPENMP
    const int me = omp_get_thread_num(), team = omp_get_num_threads();
#else
    const int me = 0, team = 1;
#endif
    int64_t *tl = c->tls + (int64_t)me * 4 * q->kk;
    /* this thread's tasks [t0, tend) (nc_split), t1 the end of its row
     * tasks; with units outer, each task of a unit prefetches
     * its share of the weights of the thread's next unit (the first one
     * again for the next image); with rows outer, each task the whole of
     * its next task's unit (a 1x1 conv on a flat 7x7 plane: one task a
     * unit, each unit's weights read once) */
    int64_t t0, tend;
    nc_split(c, me, team, tl, &t0, &tend);
    const int64_t t1 = mt_min64(c->rtasks, tend);
    const int64_t wbytes = c->wunit * (int64_t)sizeof(float);
    const int pf_on = !c->dw && t1 > t0;
    int64_t ufirst = 0, ulast = 0, ig0, ig1, ig2;     /* units outer: the units of this thread's first and last tasks */
    if (pf_on && c->units_outer) {
        nc_task_ur(c, t0, &ufirst, &ig0, &ig1, &ig2);
        nc_task_ur(c, t1 - 1, &ulast, &ig0, &ig1, &ig2);
    }
    float *scratch = c->scratch ? (float *)((char *)c->scratch + me * NC_SCRATCH) : NULL;
    for (int64_t n = 0; n < g->n; n++) {
        if (c->xp) {
            if (n > 0) {
                #pragma omp barrier
            }
            #pragma omp for schedule(static)
            for (int64_t cb = 0; cb < q->ncb; cb++) pad_block(c->x, c->xp, g, q, n, cb);
        }
        for (int64_t task = t0; task < tend; task++) {
            if (task >= c->rtasks) {      /* nc_apart: a band of a border column */
                int64_t u, col, oy0, r;
                nc_border_task(c, task, &u, &col, &oy0, &r);
                const int nv = 2 * u + 1 < q->nob ? 2 : 1;
                const int tail = g->o % NC && 2 * u + nv - 1 == q->nob - 1 ? (int)(g->o % NC) : 0;
                nc_border_cols(q, nv, tail, c->x + n * q->ncb * q->cbs, c->packed + u * c->wunit,
                               c->bp + u * c->width, c->y + (n * q->nob + 2 * u) * q->ys, oy0,
                               nc_border_col(q, col), r, tl, scratch, g->act, c->rd);
                continue;
            }
            int64_t u, row, blo, bhi;
            nc_task_ur(c, task, &u, &row, &blo, &bhi);
            const int64_t oy = row / c->nchunk * (c->two ? 2 : 1), c0 = (row % c->nchunk) * c->chunk;
            const int64_t c1 = mt_min64(q->ow, c0 + c->chunk);
            const char *pf = NULL;
            int64_t pfbytes = 0;
            if (pf_on && !c->units_outer) {
                const int64_t nx = task + 1 < t1 ? task + 1 : n + 1 < g->n ? t0 : task;
                if (nx % c->units != u) {
                    pf = (const char *)(c->packed + nx % c->units * c->wunit);
                    pfbytes = wbytes;
                }
            } else if (pf_on) {
                const int64_t next = u + 1 <= ulast ? u + 1 : n + 1 < g->n ? ufirst : u;
                if (next != u) {
                    const int64_t lo = (row - blo) * wbytes / (bhi - blo), hi = (row - blo + 1) * wbytes / (bhi - blo);
                    pf = (const char *)(c->packed + next * c->wunit) + lo;
                    pfbytes = hi - lo;
                }
            }
            const float *xi = c->dw ? c->x + (n * q->nob + u) * q->cbs : c->xp ? c->xp : c->x + n * q->ncb * q->cbs;
            float *yu = c->y + (n * q->nob + u * (c->dw ? 1 : 2)) * q->ys;
            const int nv = c->dw || 2 * u + 1 < q->nob ? 2 : 1;
            /* the unit holding the last block, when O leaves part of it unused */
            const int tail = g->o % NC && (c->dw ? u : 2 * u + nv - 1) == q->nob - 1 ? (int)(g->o % NC) : 0;
            if (c->two && oy + 1 < q->oh)
                nc_rows2(q, nv, tail, xi, c->packed + u * c->wunit, c->bp + u * c->width, yu, oy, tl, g->act, c->rd,
                         pf, pfbytes);
            else
                nc_row(q, c->dw, nv, tail, xi, c->packed + u * c->wunit, c->bp + u * c->width, yu, oy, c0, c1, tl,
                       g->act, c->rd, pf, pfbytes, c->nband > 0 && oy >= c->ra && oy < c->rb);
        }
    }
}

int mt_conv2d_nchwc(const float *x, int blocked, const float *packed, const float *bias, float *y,
                    const mt_conv2d_geom *g, int nthreads, void *workspace) {
    if (g->n == 0 || g->o == 0) return 0;
    if (nw_edge(blocked)) return nw_conv(x, packed, bias, y, g, nw_edge(blocked), nthreads, workspace);
    const int nt = nc_threads(g, nthreads);
    nc_call c;
    nc_plan_call(&c, x, blocked, packed, bias, y, g, nt, workspace);
    #pragma omp parallel num_threads(nt) if (nt > 1)
    nc_run(&c);
    return 0;
}

/* ------------------------------------------------------------- Winograd */

/* A dense 3x3 conv, stride 1, no dilation, NCHW16c in and out, as
 * Winograd's F(e x e, 3x3), e = 2 or 4 (Lavin & Gray; conv.c's WINOGRAD
 * and WINOGRAD4 are the same arithmetic in NCHW): each e x e output tile is
 * A^T [U .* V] A with V = B^T d B of the tile's a x a input patch d
 * (a = e + 2) and U = G g G^T of each 3x3 kernel g. F(2x2) does 16
 * multiply-adds for 4 outputs, F(4x4) 36 for 16, where a direct conv does
 * 36 or 144 (2.25x and 4x fewer). In NCHW16c both transforms are
 * whole-vector adds, 16 channels at once, and the products summed over the
 * input channels are, for each of the a * a points of the transform
 * domain, a 1x1 conv of the tiles: the dense micro-kernel above, with the
 * tiles as its pixels.
 *
 * Per round (tile rows of the batch, image after image, their V within
 * NW_V_BYTES: at batch 8, ResNet-18's 7x7 planes hold 4 rows of 2x2 tiles
 * each, and a round of one image's 16 tiles read all of U for 14 + 2 rows
 * of the micro-kernel), two
 * parallel phases: the input transform into V [point][in block][tile][16]
 * (a task per input block and tile row), then a task per pair of output
 * blocks and group of tiles: for each point, the micro-kernel over the
 * group into the thread's M [point][2][tile][16], U's slab for that point
 * and pair staying in L1 across the group; then the output transform of
 * the group, with bias, residual and activation, into y. U is
 * [point][pair][in block][lane][32], 16/9 (F(2x2)) or 4 (F(4x4)) times the
 * weight's bytes, so Winograd pays where the tiles are many enough to
 * reuse each slab, and F(4x4) only on more tiles than F(2x2)
 * (mt_conv2d_nchwc_form). */

/* Tiles a phase-two task at most (F(4x4): half), and V's bytes a round at
 * most (more when one tile row needs it). On the 2-core Xeon, ResNet-18's
 * four 3x3 layers at batch 8 (cold caches, sum of medians) took 14.2 ms
 * against 15.6-15.9 with 56 tiles and 2 MB (1 thread: 24.0 against 27.8);
 * at batch 1, 2.7 against 2.8-3.0: U's slab is read once for more tiles,
 * and a round of 7x7 planes at batch 8 is the whole batch. */
#define NW_GROUP (8 * NC_R)
#define NW_V_BYTES (4 << 20)

static int nw_fits(const mt_conv2d_geom *g) {
    return g->groups == 1 && g->kh == 3 && g->kw == 3 && g->sh == 1 && g->sw == 1 && g->dh == 1 && g->dw == 1;
}

static int64_t nw_tiles(const mt_conv2d_geom *g, int64_t e) {
    return g->n * ((g->oh + e - 1) / e) * ((g->ow + e - 1) / e);
}

/* Which algorithm pays: U's bytes, read once a round of tiles, against
 * the arithmetic saved. F(2x2) from 32 tiles (at batch 1 on 7x7 planes, 16
 * tiles, its 16.8 MB of U for 512 channels was no faster than direct).
 * F(4x4) from 48 of its tiles (128 channels of 28x28 at batch 1: 0.26 ms
 * against 0.33 for F(2x2) on a 2-core Zen 5, level inside ResNet-18's plan
 * on a 2-core Xeon; 256 of 14x14 at batch 8, 2 threads, cold caches: 3.9-4.5
 * against 4.1-5.3; at batch 1, 16 tiles, 0.63 against 0.67 alone but the
 * plan's p50 9.0-9.3 ms against 8.8-9.1 with F(2x2)) with U within 12
 * MiB. Larger U is often faster still (512 channels of 7x7 at batch 8: 4.0
 * ms against 6.0-7.0 for F(2x2), 6.5-7.0 direct), but each such layer
 * holds 37.7 MB of U against 16.8 for F(2x2): ResNet-18's plan at batch
 * 8 peaked at 313 MB of RSS against ONNX Runtime's 264 (244 with the
 * cap), and on a Zen 5 with 32 MB of L3 the layer's F(4x4) took 7.5 ms
 * against 3.5 for F(2x2).
 *
 * F(4x4) rounds more: against a float64 reference (ReLU'd normal inputs,
 * He-scaled weights, 256 channels of 14x14 and 512 of 7x7 at batch 8),
 * the largest error 1.3e-5 of the largest output and the rms 2.4-2.9e-6
 * of the rms output, against 1.4-2.1e-6 and 5.8-8.0e-7 for the direct
 * kernel and 5.6-8.6e-7 and 4.3-5.8e-7 for F(2x2); over 9,632 random
 * shapes (1-1024 channels, batch 1-9) the largest was 3.2e-5 of the
 * largest output, against 1.6e-6 for F(2x2). Until this release the
 * pass kept F(4x4) to the shapes where conv2d's NCHW kernels run it; the
 * NCHWc kernel now picks it where it pays, as conv2d picks F(2x2) over
 * direct sums: both are float32 results to a few ulps of the output's
 * scale. */
#define NW_MIN_TILES 32
#define NW4_MIN_TILES 48
#define NW4_MAX_U (12 << 20)

int mt_conv2d_nchwc_form(const mt_conv2d_geom *g, int blocked, int winograd) {
    /* (C = 0, forced too: nothing to transform; the direct kernel gives the bias) */
    if (!blocked || !nw_fits(g) || winograd == 0 || g->c == 0) return blocked ? MT_NCHWC_BLOCKED : MT_NCHWC_PLAIN;
    if (winograd == 2) return MT_NCHWC_WINOGRAD4;
    if (winograd == 1) return MT_NCHWC_WINOGRAD;
    if (g->c < NC || nw_tiles(g, 2) < NW_MIN_TILES) return MT_NCHWC_BLOCKED;
    const double u4 = 36.0 * g->c * g->o * sizeof(float);
    return nw_tiles(g, 4) >= NW4_MIN_TILES && u4 <= NW4_MAX_U ? MT_NCHWC_WINOGRAD4 : MT_NCHWC_WINOGRAD;
}

typedef struct {
    int64_t e, np;       /* output tile edge, transform points (e + 2)^2 */
    int64_t th, tw, ncb, nob, units, group;
    int64_t rows;        /* tile rows a round (of the batch's rows, image after image) */
    int64_t vp;          /* floats of V from one point to the next: ncb * rows * tw * 16 */
} nw_plan;

static void nw_make_plan(const mt_conv2d_geom *g, int64_t e, nw_plan *pl) {
    pl->e = e;
    pl->np = (e + 2) * (e + 2);
    pl->th = (g->oh + e - 1) / e;
    pl->tw = (g->ow + e - 1) / e;
    pl->ncb = mt_nchwc_blocks(g->c);
    pl->nob = mt_nchwc_blocks(g->o);
    pl->units = (pl->nob + 1) / 2;
    pl->group = e == 4 ? NW_GROUP / 2 : NW_GROUP;
    const int64_t row_bytes = pl->np * pl->ncb * pl->tw * NC * (int64_t)sizeof(float);
    pl->rows = mt_max64(1, mt_min64(g->n * pl->th, NW_V_BYTES / row_bytes));
    pl->vp = pl->ncb * pl->rows * pl->tw * NC;
}

static int64_t nw_packed_bytes(const mt_conv2d_geom *g, int64_t e) {
    return (e + 2) * (e + 2) * ((mt_nchwc_blocks(g->o) + 1) / 2) * mt_nchwc_blocks(g->c) * NC * NC_PAIR
           * (int64_t)sizeof(float);
}

/* d = c[0] x0 + c[1] x1 + c[2] x2 in each of the 32 lanes, leaving out the
 * terms whose coefficient is 0: an infinite weight then stays out of the
 * points it has no part in (0 * inf is NaN) */
static inline __attribute__((always_inline)) void nw_combine(const double *c, const double *x0, const double *x1,
                                                             const double *x2, double *d) {
    const double *x[3] = {x0, x1, x2};
    int first = 1;
    for (int r = 0; r < 3; r++) {
        if (c[r] == 0.0) continue;
        for (int64_t j = 0; j < NC_PAIR; j++) d[j] = first ? c[r] * x[r][j] : d[j] + c[r] * x[r][j];
        first = 0;
    }
    if (first)
        for (int64_t j = 0; j < NC_PAIR; j++) d[j] = 0.0;
}

/* U = G g G^T of each 3x3 kernel into [point][pair][in block][lane][32],
 * zeros past O and C, computed in double (U is made once per weight): one
 * pair of output blocks and one input channel at a time, each step a loop
 * over the pair's 32 output channels that vectorizes, and each point's 32
 * values one contiguous store (the 32 kernels' rows read in turn, the
 * next channel's on the same lines). One kernel at a time, the output
 * channel outermost, the stores went to a set of lines larger than L2 and
 * the reads were 32 streams 18 KB apart: a first call with 512 x 512
 * channels took 13-15 ms (F(2x2)) and 51-56 ms (F(4x4)), now 4 and 11 (a
 * call of the layer at batch 1: under 1 ms). Under 4 KB of stack: packing
 * runs on the caller's thread, whatever its stack (a Python thread's can
 * be 32 KiB). */
static NC_CLONES void nw_pack_block(const float *w, float *up, const mt_conv2d_geom *g, int64_t e, int64_t o0,
                                    int64_t c0, int64_t plane) {
    const int64_t a = e + 2, no = mt_min64(NC_PAIR, g->o - o0), nc = mt_min64(NC, g->c - c0);
    const double (*G)[3] = e == 2 ? MT_WINO_G2 : MT_WINO_G4;   /* winograd.h */
    double k[9][NC_PAIR], gk[3][NC_PAIR], t[NC_PAIR];
    for (int64_t l = 0; l < nc; l++) {
        for (int64_t j = 0; j < NC_PAIR; j++)
            for (int i = 0; i < 9; i++) k[i][j] = j < no ? w[((o0 + j) * g->c + c0 + l) * 9 + i] : 0.0;
        for (int i = 0; i < a; i++) {
            for (int q = 0; q < 3; q++)             /* row i of G g: column q */
                nw_combine(G[i], k[q], k[3 + q], k[6 + q], gk[q]);
            for (int q = 0; q < a; q++) {           /* point (i, q) of (G g) G^T */
                nw_combine(G[q], gk[0], gk[1], gk[2], t);
                float *dst = up + (i * a + q) * plane + l * NC_PAIR;
                for (int64_t j = 0; j < NC_PAIR; j++) dst[j] = (float)t[j];
            }
        }
    }
}

static void nw_pack(const float *w, float *u, const mt_conv2d_geom *g, int64_t e) {
    const int64_t ncb = mt_nchwc_blocks(g->c), units = (mt_nchwc_blocks(g->o) + 1) / 2;
    const int64_t slab = ncb * NC * NC_PAIR, plane = units * slab;
    memset(u, 0, (size_t)nw_packed_bytes(g, e));
    for (int64_t p = 0; p < units; p++)
        for (int64_t cb = 0; cb < ncb; cb++)
            nw_pack_block(w, u + p * slab + cb * NC * NC_PAIR, g, e, p * NC_PAIR, cb * NC, plane);
}

static int64_t nw_workspace(const mt_conv2d_geom *g, int64_t e, int nthreads) {
    nw_plan pl;
    nw_make_plan(g, e, &pl);
    int64_t v = 0;
    if (__builtin_mul_overflow(pl.np * (int64_t)sizeof(float), pl.vp, &v) || v > INT64_MAX / 4)
        return MT_NN_EOVERFLOW;
    const int64_t m = pl.np * 2 * pl.group * NC * (int64_t)sizeof(float);
    return bias_bytes(g) + NC_PAIR * (int64_t)sizeof(float) + ((v + 63) & ~(int64_t)63)
           + (nthreads < 1 ? 1 : nthreads) * m;
}

/* The a x a patch of tile (ty, tx): input rows e ty - ph .., columns
 * e tx - pw .. of block plane xb, zeros outside the image. */
static inline __attribute__((always_inline)) void nw_patch(const float *restrict xb, const mt_conv2d_geom *g,
                                                           int64_t iy0, int64_t ix0, int a, v16 d[6][6]) {
    if (iy0 >= 0 && iy0 + a <= g->h && ix0 >= 0 && ix0 + a <= g->w) {
        for (int i = 0; i < a; i++)
            for (int j = 0; j < a; j++) d[i][j] = ld16(xb + ((iy0 + i) * g->w + ix0 + j) * NC);
        return;
    }
    for (int i = 0; i < a; i++)
        for (int j = 0; j < a; j++) {
            const int64_t iy = iy0 + i, ix = ix0 + j;
            d[i][j] = iy >= 0 && iy < g->h && ix >= 0 && ix < g->w ? ld16(xb + (iy * g->w + ix) * NC) : (v16){0};
        }
}

/* V of the tiles of tile row ty, input block plane xb: B^T d B of each
 * tile's patch; v: point 0's first tile of the row, points vp apart. */
static NC_CLONES void nw_input_row(const float *restrict xb, float *restrict v, const mt_conv2d_geom *g,
                                   int64_t e, int64_t ty, int64_t tw, int64_t vp) {
    const int a = (int)e + 2;
    for (int64_t tx = 0; tx < tw; tx++) {
        v16 d[6][6], t[6][6];
        nw_patch(xb, g, e * ty - g->ph, e * tx - g->pw, a, d);
        float *vt = v + tx * NC;
        if (e == 2) {
            for (int j = 0; j < 4; j++) {        /* B^T d: along the columns */
                v16 c[4];
                MT_WINO2_BT(d[0][j], d[1][j], d[2][j], d[3][j], c);
                for (int i = 0; i < 4; i++) t[i][j] = c[i];
            }
            for (int i = 0; i < 4; i++) {        /* (B^T d) B: along the rows */
                v16 r[4];
                MT_WINO2_BT(t[i][0], t[i][1], t[i][2], t[i][3], r);
                for (int j = 0; j < 4; j++) *(v16 *)(vt + (4 * i + j) * vp) = r[j];
            }
        } else {
            for (int j = 0; j < 6; j++) {
                v16 c[6];
                MT_WINO4_BT(&d[0][j], 6, c);
                for (int i = 0; i < 6; i++) t[i][j] = c[i];
            }
            for (int i = 0; i < 6; i++) {
                v16 r[6];
                MT_WINO4_BT(t[i], 1, r);
                for (int j = 0; j < 6; j++) *(v16 *)(vt + (6 * i + j) * vp) = r[j];
            }
        }
    }
}

/* y's pixel from a computed value: plus bias and residual, the lanes
 * past O zeroed (keep: the block's used lanes), the activation */
static inline void nw_store(float *yp, v16 a, v16 b, int64_t rd, vi16 keep, int act) {
    a += b;
    if (rd) a += ld16((const float *)((const char *)yp + rd));
    a = (v16)((vi16)a & keep);
    *(v16 *)yp = nc_act(a, act);
    if (nc_act_after(act)) mt_act_f32(yp, NC, act);
}

/* the 1-D A^T of F(e x e) (winograd.h) on s[0], s[st], ... */
static inline __attribute__((always_inline)) void nw_at(int64_t e, const v16 *s, int st, v16 *d) {
    if (e == 2) MT_WINO2_AT(s[0], s[st], s[2 * st], s[3 * st], d);
    else MT_WINO4_AT(s, st, d);
}

/* The outputs of tiles [0, n) of M (block stride ms floats, point stride
 * 2 * ms) for output block blk of image plane y: A^T m A, tile t at round
 * tile t0 + t (tw a row, the round from tile row ty0). */
static NC_CLONES void nw_output(const float *restrict m, int64_t ms, float *restrict y, const float *bias,
                                const mt_conv2d_geom *g, int64_t e, int64_t t0, int64_t n, int64_t ty0,
                                int64_t tw, int64_t rd, int tail) {
    const v16 b = ld16(bias);
    const int a = (int)e + 2;
    vi16 keep;
    for (int l = 0; l < NC; l++) keep[l] = !tail || l < tail ? -1 : 0;
    for (int64_t t = 0; t < n; t++) {
        const int64_t rt = t0 + t, oy = e * (ty0 + rt / tw), ox = e * (rt % tw);
        v16 mv[6][6], s[4][6];
        for (int i = 0; i < a; i++)
            for (int j = 0; j < a; j++) mv[i][j] = ld16(m + (i * a + j) * 2 * ms + t * NC);
        for (int j = 0; j < a; j++) {            /* A^T m: along the columns */
            v16 d[4];
            nw_at(e, &mv[0][j], 6, d);
            for (int i = 0; i < e; i++) s[i][j] = d[i];
        }
        const int64_t rows = mt_min64(e, g->oh - oy), cols = mt_min64(e, g->ow - ox);
        for (int64_t i = 0; i < rows; i++) {     /* (A^T m) A: along the rows */
            v16 d[4];
            nw_at(e, s[i], 1, d);
            float *yr = y + ((oy + i) * g->ow + ox) * NC;
            for (int64_t j = 0; j < cols; j++) nw_store(yr + j * NC, d[j], b, rd, keep, g->act);
        }
    }
}

static int nw_conv(const float *x, const float *u, const float *bias, float *y, const mt_conv2d_geom *g,
                   int64_t e, int nthreads, void *workspace) {
    nw_plan pl;
    nw_make_plan(g, e, &pl);
    float *bp = (float *)workspace, *zero = (float *)((char *)workspace + bias_bytes(g));
    for (int64_t i = 0; i < pl.units * NC_PAIR; i++) bp[i] = bias && i < g->o ? bias[i] : 0.0f;
    memset(zero, 0, NC_PAIR * sizeof(float));
    float *v = zero + NC_PAIR;
    const int64_t vbytes = ((pl.np * pl.vp * (int64_t)sizeof(float)) + 63) & ~(int64_t)63;
    float *mws = (float *)((char *)v + vbytes);
    const int64_t plane = g->h * g->w * NC, ys = g->oh * g->ow * NC, slab = pl.ncb * NC * NC_PAIR;
    const double macs = (double)g->n * g->o * g->oh * g->ow * g->c * 9;
    const int nt = macs >= NC_GRAIN ? nthreads : 1;
    const int64_t all_rows = g->n * pl.th, rounds = (all_rows + pl.rows - 1) / pl.rows, img_tiles = pl.th * pl.tw;
    const int64_t rd = g->has_res ? g->res_delta : 0;
    const int otail = g->o % NC ? (int)(g->o % NC) : 0;
    /* an input row holds NaN, inf or a magnitude past Winograd's bound
     * (mt_wino_bound): MT_NN_NONFINITE */
    int nonfinite = 0;
    const int bound = mt_wino_bound(MT_FLOAT32, g);
    #pragma omp parallel num_threads(nt) if (nt > 1)
    {
#ifdef _OPENMP
        const int me = omp_get_thread_num(), team = omp_get_num_threads();
#else
        const int me = 0, team = 1;
#endif
        float *m = mws + (int64_t)me * pl.np * 2 * pl.group * NC;
        for (int64_t r = 0; r < rounds; r++) {
            const int64_t row0 = r * pl.rows, nrows = mt_min64(pl.rows, all_rows - row0), tiles = nrows * pl.tw;
            const int64_t vcb = tiles * NC;          /* floats from one block of V to the next */
            const int64_t vp = pl.ncb * vcb;
            if (r > 0) {                             /* (the last round's tasks read V) */
                #pragma omp barrier
            }
            #pragma omp for schedule(static)
            for (int64_t task = 0; task < pl.ncb * nrows; task++) {
                const int64_t row = task / pl.ncb, cb = task % pl.ncb;
                const int64_t n = (row0 + row) / pl.th, ty = (row0 + row) % pl.th;
                const float *xb = x + (n * pl.ncb + cb) * plane;
                nw_input_row(xb, v + cb * vcb + row * pl.tw * NC, g, e, ty, pl.tw, vp);
                /* the input rows the row's patches read, in cache now */
                const int64_t iy0 = mt_max64(0, e * ty - g->ph);
                const int64_t iy1 = mt_min64(g->h, e * ty - g->ph + e + 2);
                if (iy1 > iy0 && !mt_all_below(MT_FLOAT32, xb + iy0 * g->w * NC, (iy1 - iy0) * g->w * NC, bound)) {
                    #pragma omp atomic write
                    nonfinite = 1;
                }
            }
            /* (read after the loop's barrier by every thread, before any
             * can write it again: they all stop at the same round) */
            int stop;
            #pragma omp atomic read
            stop = nonfinite;
            if (stop) break;
            /* groups of tiles: at most pl.group, and enough tasks for the threads */
            int64_t ngroup = (tiles + pl.group - 1) / pl.group;
            const int64_t want = (4 * nt + pl.units - 1) / pl.units, most = (tiles + NC_R - 1) / NC_R;
            if (nt > 1 && want > ngroup) ngroup = want < most ? want : most;
            const int64_t gsize = (tiles + ngroup - 1) / ngroup;
            ngroup = (tiles + gsize - 1) / gsize;
            /* U is read once a call, a slab (point, unit) at a time: each
             * slab's calls prefetch the next slab the thread reads (the
             * next point's, or the first of its next task), as the direct
             * convs do their next unit's weights (nc_prefetch_step) */
            const int64_t ntask = pl.units * ngroup, per = ntask / team, extra = ntask % team;
            const int64_t t1 = me * per + (me < extra ? me : extra) + per + (me < extra);
            /* Tasks in the order that reads fewer bytes a thread: every
             * pair for one group of tiles after another (each thread reads
             * all of U and the V of its own tile rows, which phase one's
             * row-major split wrote on the same core) where V is the larger,
             * as in ResNet's 64-channel layers (V 1.8 MB, U 0.6 MB at 56x56);
             * else each pair for all groups (each thread reads its pairs' U
             * and all of V). Each tile's arithmetic is the same either way. */
            const int gmajor = team > 1 && ngroup > 1 && pl.units * slab < vp;
            #pragma omp for schedule(static) nowait
            for (int64_t task = 0; task < ntask; task++) {
                const int64_t un = gmajor ? task % pl.units : task / ngroup;
                const int64_t g0 = (gmajor ? task / pl.units : task % ngroup) * gsize, gn = mt_min64(gsize, tiles - g0);
                const int nv = 2 * un + 1 < pl.nob ? 2 : 1;
                const int64_t ms = gn * NC, ncall = (gn + NC_R - 1) / NC_R;   /* nc_tile's tiles */
                const nc_dense_fn *dk = nc_dense_kernels[1][nv - 1][0];
                static const int64_t zero_off[1] = {0};
                for (int64_t p = 0; p < pl.np; p++) {
                    const float *vpnt = v + p * vp + g0 * NC, *up = u + (p * pl.units + un) * slab;
                    float *mp = m + p * 2 * ms;
                    const float *next = p + 1 < pl.np ? up + pl.units * slab
                                        : task + 1 < t1 ? u + (gmajor ? (task + 1) % pl.units : (task + 1) / ngroup) * slab
                                                        : NULL;
                    const int64_t share = next ? nc_prefetch_step(slab * (int64_t)sizeof(float) / ncall, pl.ncb) : 0;
                    const char *pf = (const char *)next;
                    for (int64_t t = 0; t < gn;) {
                        const int64_t rr = nc_tile(gn - t, NC_R);
                        dk[rr - 1](vpnt + t * NC, vcb, pl.ncb, zero_off, zero_off, 1, up, NC * NC_PAIR, NC,
                                   zero, mp + t * NC, ms, 0, MT_ACT_NONE, 0, 0, pf, share, NC);
                        pf += share * pl.ncb;
                        t += rr;
                    }
                }
                /* the group's tiles image by image (a round's rows can
                 * run from one image into the next) */
                for (int64_t t = 0; t < gn;) {
                    const int64_t at = row0 * pl.tw + g0 + t, n = at / img_tiles, it = at % img_tiles;
                    const int64_t run = mt_min64(gn - t, img_tiles - it);
                    for (int k = 0; k < nv; k++) {
                        const int64_t blk = 2 * un + k;
                        nw_output(m + k * ms + t * NC, ms, y + (n * pl.nob + blk) * ys, bp + blk * NC, g, e, it,
                                  run, 0, pl.tw, rd, blk == pl.nob - 1 ? otail : 0);
                    }
                    t += run;
                }
            }
        }
    }
    return nonfinite ? MT_NN_NONFINITE : 0;
}

/* ------------------------------------------- pointwise then depthwise */

/* A pointwise conv (1x1, stride 1, no padding: C -> E channels) and the
 * depthwise conv that alone reads its output, as one pass: each task (a
 * pair of E's blocks over a range of output rows) keeps the pointwise rows
 * the depthwise taps need in a ring of kh rows, so the E-channel tensor is
 * never written whole. MobileNetV2's are up to 96 x 112 x 112 floats (4.8
 * MB, more than L2): written by one call and read back by the next, they
 * came from memory both times. */

/* Zero columns each side of a ring row: the depthwise padding, so that
 * every output pixel is a register tile's (border pixels one at a time
 * with their own taps were 2 of 7 on 7x7 planes); none for a padding
 * wider than the kernel, whose zeros would only cost memory. */
static int64_t pwdw_pad(const mt_conv2d_geom *dw) { return dw->pw <= dw->kw ? dw->pw : 0; }

/* floats of a task's ring: two blocks of kh rows of W + 2 pad pixels */
static int64_t pwdw_ring(const mt_conv2d_geom *pw, const mt_conv2d_geom *dw) {
    return 2 * dw->kh * (pw->w + 2 * pwdw_pad(dw)) * NC;
}

int64_t mt_conv2d_nchwc_pw_dw_workspace(const mt_conv2d_geom *pw, const mt_conv2d_geom *dw, int nthreads) {
    int64_t ring = 0, per = 0, all = 0;
    const int64_t nt = nthreads < 1 ? 1 : nthreads;
    if (__builtin_mul_overflow(2 * NC * (int64_t)sizeof(float), dw->kh, &ring)
        || __builtin_mul_overflow(ring, pw->w + 2 * pwdw_pad(dw), &ring)
        || __builtin_add_overflow(ring, (4 * dw->kh * dw->kw + dw->kh) * (int64_t)sizeof(int64_t) + 63, &per)
        || __builtin_mul_overflow(per & ~(int64_t)63, nt, &all)
        || all > INT64_MAX - bias_bytes(pw) - bias_bytes(dw))
        return MT_NN_EOVERFLOW;
    return bias_bytes(pw) + bias_bytes(dw) + all;
}

/* The ring slot of input row iy (iy mod kh, in [0, kh) for a negative iy
 * too): one division a row, the next rows' slots counted along. */
static inline int64_t pwdw_slot(int64_t iy, int64_t kh) { const int64_t s = iy % kh; return s < 0 ? s + kh : s; }

/* The taps of depthwise output row oy that fall inside the image, as ring
 * offsets (the row of input row iy at slot iy % kh, each w * 16 floats)
 * from the row's column 0 and tap indices; returns their count. Every
 * block of the row shares them. */
static int64_t pwdw_row_taps(const nc_geom *q, int64_t oy, int64_t *toff, int64_t *tidx) {
    const int64_t row = q->w * NC, iy0 = oy * q->sh - q->ph;
    int64_t n = 0, slot = pwdw_slot(iy0, q->kh);
    for (int64_t ky = 0; ky < q->kh; ky++, slot = slot + 1 == q->kh ? 0 : slot + 1) {
        const int64_t iy = iy0 + ky;
        if (iy < 0 || iy >= q->h) continue;
        for (int64_t kx = 0; kx < q->kw; kx++) {
            toff[n] = slot * row + kx * NC;
            tidx[n++] = ky * q->kw + kx;
        }
    }
    return n;
}

/* Depthwise output row oy of one block from its ring, with the row's n
 * taps (pwdw_row_taps); q: the depthwise geometry. */
static void pwdw_dw_row(const nc_geom *q, const float *ring, const float *wp, const float *b, float *yrow,
                        const int64_t *toff, const int64_t *tidx, int64_t n, int64_t *eoff, int64_t *eidx,
                        int tail, int act) {
    int64_t a, bnd;
    nc_interior(q, &a, &bnd);
    const int si = q->sw == 1 ? 0 : q->sw == 2 ? 1 : 2;
    const nc_dw_fn *wk = nc_dw_kernels[si];
    for (int64_t ox = 0; ox < q->ow;) {
        int64_t r = 1;
        float *yp = yrow + ox * NC;
        const int64_t ix0 = ox * q->sw - q->pw;
        if (ox < a || ox >= bnd) {                      /* a border pixel: the taps inside */
            int64_t m = 0;
            /* (each row of taps holds all kw columns in order: kx counts
             * along, where tidx % kw cost a division a tap, 5% of
             * MobileNetV2's time) */
            for (int64_t t = 0, kx = 0; t < n; t++, kx = kx + 1 == q->kw ? 0 : kx + 1) {
                const int64_t ix = ix0 + kx;
                if (ix < 0 || ix >= q->w) continue;
                eoff[m] = toff[t] + ix0 * NC;
                eidx[m++] = tidx[t];
            }
            wk[0](ring, eoff, eidx, m, wp, 0, b, yp, 0, act);
        } else {
            r = nc_tile(bnd - ox, NC_DW_R);
            wk[r - 1](ring + ix0 * NC, toff, tidx, n, wp, q->sw * NC, b, yp, 0, act);
        }
        nc_finish(yp, 1, 0, r, tail, act);
        ox += r;
    }
}

/* A pointwise-then-depthwise call's plan (pwdw_plan_call), run by each
 * thread of a parallel region (pwdw_run). */
typedef struct {
    const float *x, *pw_packed, *dw_packed, *b1, *b2;
    float *y;
    char *scratch;                /* per thread: the ring, then the tap lists and ring tags */
    const mt_conv2d_geom *pw, *dw;
    nc_geom q, qp;
    int tail;
    int64_t nob, units, ncb, cbs, ys_out, kk, rp, rs, ring_f, per, rows, tasks;
} pwdw_call;

static int pwdw_threads(const mt_conv2d_geom *pw, const mt_conv2d_geom *dw, int nthreads) {
    const double macs = (double)pw->n * pw->o * ((double)pw->h * pw->w * pw->c
                                                 + (double)dw->oh * dw->ow * dw->kh * dw->kw);
    return macs >= NC_GRAIN ? nthreads : 1;
}

/* the plan on nt threads; fills the workspace's biases
 * (mt_conv2d_nchwc_pw_dw_workspace's bytes) */
static void pwdw_plan_call(pwdw_call *c, const float *x, const float *pw_packed, const float *pw_bias,
                           const float *dw_packed, const float *dw_bias, float *y, const mt_conv2d_geom *pw,
                           const mt_conv2d_geom *dw, int nt, void *workspace) {
    c->x = x; c->pw_packed = pw_packed; c->dw_packed = dw_packed; c->y = y; c->pw = pw; c->dw = dw;
    c->nob = mt_nchwc_blocks(pw->o);
    c->units = (c->nob + 1) / 2;
    c->ncb = mt_nchwc_blocks(pw->c);
    c->cbs = pw->h * pw->w * NC;
    c->ys_out = dw->oh * dw->ow * NC;
    c->kk = dw->kh * dw->kw;
    /* the depthwise conv reads ring rows of rp zeros, W pixels, rp zeros */
    c->rp = pwdw_pad(dw);
    c->rs = (pw->w + 2 * c->rp) * NC;
    nc_plan(dw, 1, 0, &c->q);
    c->q.w += 2 * c->rp;
    c->q.pw -= c->rp;
    /* the pointwise conv as nc_row sees it: one flat row of the image in,
     * one ring row out, the ring's blocks kh rows apart */
    nc_plan(pw, 1, 0, &c->qp);
    c->qp.h = c->qp.oh = 1;
    c->qp.ys = dw->kh * c->rs;
    float *b1 = (float *)workspace, *b2 = (float *)((char *)workspace + bias_bytes(pw));
    for (int64_t i = 0; i < c->units * NC_PAIR; i++) {
        b1[i] = pw_bias && i < pw->o ? pw_bias[i] : 0.0f;
        b2[i] = dw_bias && i < pw->o ? dw_bias[i] : 0.0f;
    }
    c->b1 = b1; c->b2 = b2;
    c->scratch = (char *)workspace + bias_bytes(pw) + bias_bytes(dw);
    c->ring_f = pwdw_ring(pw, dw);
    c->per = (c->ring_f * (int64_t)sizeof(float) + (4 * c->kk + dw->kh) * (int64_t)sizeof(int64_t) + 63)
             & ~(int64_t)63;
    /* enough tasks for the threads to share; each range of rows recomputes
     * the kh - sh pointwise rows its first output row shares with the last */
    int64_t nchunk = nt > 1 ? (4 * nt + c->units - 1) / c->units : 1;
    /* a multiple of the threads where the rows allow: 3 units (96
     * channels) in 3 ranges made 9 tasks, 5 for one thread and 4 for the
     * other (MobileNetV2's first expansion, its largest step) */
    while (nt > 1 && c->units * nchunk % nt && nchunk < dw->oh) nchunk++;
    if (nchunk > dw->oh) nchunk = dw->oh;
    c->rows = (dw->oh + nchunk - 1) / nchunk;
    nchunk = (dw->oh + c->rows - 1) / c->rows;      /* (ranges of c->rows: none empty) */
    c->tasks = c->units * nchunk;
    c->tail = pw->o % NC ? (int)(pw->o % NC) : 0;
}

/* the tasks, run by every thread of the enclosing parallel region; no
 * barrier (the rings are per thread) */
static void pwdw_run(const pwdw_call *c) {
    const mt_conv2d_geom *pw = c->pw, *dw = c->dw;
    const int64_t kk = c->kk, nob = c->nob, units = c->units;
#ifdef _OPENMP
    const int me = omp_get_thread_num(), team = omp_get_num_threads();
#else
    const int me = 0, team = 1;
#endif
    char *mine = c->scratch + (int64_t)me * c->per;
    /* this thread's tasks [t0, t1) (schedule(static), as nc_run): each
     * task prefetches the pointwise weights of its next task's unit, read
     * once a call (units are the inner index) */
    const int64_t per = c->tasks / team, extra = c->tasks % team;
    const int64_t t0 = me * per + (me < extra ? me : extra), t1 = t0 + per + (me < extra);
    const int64_t slab = c->ncb * NC * NC_PAIR;
    float *ring = (float *)mine;
    int64_t *tl = (int64_t *)(mine + c->ring_f * (int64_t)sizeof(float)), *tags = tl + 4 * kk;
    memset(ring, 0, (size_t)c->ring_f * sizeof(float));     /* the pad columns, never written */
    for (int64_t n = 0; n < pw->n; n++) {
        #pragma omp for schedule(static) nowait
        for (int64_t task = 0; task < c->tasks; task++) {
            const int64_t u = task % units, oy0 = task / units * c->rows;
            const int64_t oy1 = oy0 + c->rows < dw->oh ? oy0 + c->rows : dw->oh;
            const int nv = 2 * u + 1 < nob ? 2 : 1;
            const int ptail = 2 * u + nv - 1 == nob - 1 ? c->tail : 0;
            const float *xn = c->x + n * c->ncb * c->cbs;
            const int64_t nx = task + 1 < t1 ? task + 1 : n + 1 < pw->n ? t0 : task;
            const char *pf = nx % units != u ? (const char *)(c->pw_packed + nx % units * slab) : NULL;
            for (int64_t s = 0; s < dw->kh; s++) tags[s] = -1;
            for (int64_t oy = oy0; oy < oy1; oy++) {
                const int64_t iy0 = oy * dw->sh - dw->ph;
                int64_t slot = pwdw_slot(iy0, dw->kh);
                for (int64_t ky = 0; ky < dw->kh; ky++, slot = slot + 1 == dw->kh ? 0 : slot + 1) {
                    const int64_t iy = iy0 + ky;
                    if (iy < 0 || iy >= pw->h || tags[slot] == iy) continue;
                    nc_row(&c->qp, 0, nv, ptail, xn + iy * pw->w * NC, c->pw_packed + u * c->ncb * NC * NC_PAIR,
                           c->b1 + u * NC_PAIR, ring + slot * c->rs + c->rp * NC, 0, 0, pw->w, tl, pw->act, 0,
                           pf, pf ? slab * (int64_t)sizeof(float) : 0, 0);
                    pf = NULL;
                    tags[slot] = iy;
                }
                const int64_t ntap = pwdw_row_taps(&c->q, oy, tl, tl + kk);
                for (int v = 0; v < nv; v++) {
                    const int64_t blk = 2 * u + v;
                    pwdw_dw_row(&c->q, ring + v * c->qp.ys, c->dw_packed + blk * kk * NC, c->b2 + blk * NC,
                                c->y + (n * nob + blk) * c->ys_out + oy * dw->ow * NC, tl, tl + kk, ntap,
                                tl + 2 * kk, tl + 3 * kk, blk == nob - 1 ? c->tail : 0, dw->act);
                }
            }
        }
    }
}

int mt_conv2d_nchwc_pw_dw(const float *x, const float *pw_packed, const float *pw_bias, const float *dw_packed,
                          const float *dw_bias, float *y, const mt_conv2d_geom *pw, const mt_conv2d_geom *dw,
                          int nthreads, void *workspace) {
    if (pw->n == 0 || pw->o == 0 || dw->oh == 0 || dw->ow == 0) return 0;
    const int nt = pwdw_threads(pw, dw, nthreads);
    pwdw_call c;
    pwdw_plan_call(&c, x, pw_packed, pw_bias, dw_packed, dw_bias, y, pw, dw, nt, workspace);
    #pragma omp parallel num_threads(nt) if (nt > 1)
    pwdw_run(&c);
    return 0;
}

/* ------------------------------------ pointwise, depthwise, projection */

/* An inverted-residual block (MobileNetV2's: expansion 1x1, depthwise,
 * projection 1x1 with its residual) in one parallel region: the pointwise
 * and depthwise tasks write the block's E-channel middle tensor into the
 * workspace, a barrier, then the projection's tasks read it (while it is
 * in the caches: 16-230 KB at MobileNetV2's 28x28 and smaller planes).
 * One call, one output and one fork where the two calls had two of each:
 * a few microseconds each inside a model, where the kernels have evicted
 * the interpreter. */

static int64_t pwdwpj_mid_bytes(const mt_conv2d_geom *dw) {
    int64_t n = 0;
    if (__builtin_mul_overflow(dw->n * mt_nchwc_blocks(dw->o), dw->oh * dw->ow * NC * (int64_t)sizeof(float), &n)
        || n > INT64_MAX / 4)
        return MT_NN_EOVERFLOW;
    return (n + 63) & ~(int64_t)63;
}

int64_t mt_conv2d_nchwc_pw_dw_pw_workspace(const mt_conv2d_geom *pw, const mt_conv2d_geom *dw,
                                           const mt_conv2d_geom *pj, int nthreads) {
    const int64_t a = mt_conv2d_nchwc_pw_dw_workspace(pw, dw, nthreads), m = pwdwpj_mid_bytes(dw);
    const int64_t b = mt_conv2d_nchwc_workspace(pj, 1, nthreads);
    if (a < 0 || m < 0 || b < 0 || a > INT64_MAX / 4 || b > INT64_MAX / 4) return MT_NN_EOVERFLOW;
    return ((a + 63) & ~(int64_t)63) + m + b;
}

int mt_conv2d_nchwc_pw_dw_pw(const float *x, const float *pw_packed, const float *pw_bias, const float *dw_packed,
                             const float *dw_bias, const float *pj_packed, const float *pj_bias, float *y,
                             const mt_conv2d_geom *pw, const mt_conv2d_geom *dw, const mt_conv2d_geom *pj,
                             int nthreads, void *workspace) {
    if (pw->n == 0 || pj->o == 0 || dw->oh == 0 || dw->ow == 0) return 0;
    const int64_t a = (mt_conv2d_nchwc_pw_dw_workspace(pw, dw, nthreads) + 63) & ~(int64_t)63;
    float *mid = (float *)((char *)workspace + a);
    void *ws2 = (char *)workspace + a + pwdwpj_mid_bytes(dw);
    const int nt1 = pwdw_threads(pw, dw, nthreads), nt2 = nc_threads(pj, nthreads);
    const int nt = nt1 > nt2 ? nt1 : nt2;
    pwdw_call c1;
    nc_call c2;
    /* (no middle channels, E = 0: the projection's sum is empty, its
     * output the bias, residual and act) */
    if (pw->o > 0) pwdw_plan_call(&c1, x, pw_packed, pw_bias, dw_packed, dw_bias, mid, pw, dw, nt, workspace);
    nc_plan_call(&c2, mid, MT_NCHWC_BLOCKED, pj_packed, pj_bias, y, pj, nt, ws2);
    #pragma omp parallel num_threads(nt) if (nt > 1)
    {
        if (pw->o > 0) pwdw_run(&c1);
        #pragma omp barrier
        nc_run(&c2);
    }
    return 0;
}

/* ------------------------------------------------------------- pooling */

#define NC_POOL_R 8      /* interior output pixels pooled together: independent chains */

/* Columns [ox, ox + r) of an output row over input rows [ky_lo, ky_hi) of
 * the kernel, every column of the kernel inside the input. Each pixel's
 * taps go in order through its own chain (select on v > m: 4-5 cycles a
 * tap), so r pixels at once keep the vector units busy where one pixel at
 * a time waited on its chain (5 cycles a tap, measured). */
static inline __attribute__((always_inline)) void nc_pool_px(const float *restrict xp, float *restrict yr, const mt_pool2d_geom *g,
                              int64_t iy0, int64_t ky_lo, int64_t ky_hi, int64_t ox, int64_t kx_lo,
                              int64_t kx_hi, int r) {
    const v16 qnan = (v16){0} + __builtin_nanf(""), ninf = (v16){0} - __builtin_inff();
    v16 m[NC_POOL_R];
    vi16 nan[NC_POOL_R];
    for (int i = 0; i < NC_POOL_R; i++) { m[i] = ninf; nan[i] = (vi16){0}; }
    for (int64_t ky = ky_lo; ky < ky_hi; ky++) {
        const int64_t row = (iy0 + ky * g->dh) * g->w + ox * g->sw - g->pw;
        for (int64_t kx = kx_lo; kx < kx_hi; kx++) {
            const float *t = xp + (row + kx * g->dw) * NC;   /* (offsets first: row may be negative) */
            #pragma GCC unroll 8
            for (int i = 0; i < NC_POOL_R; i++) {
                if (i >= r) break;
                const v16 v = ld16(t + i * g->sw * NC);
                const vi16 gt = v > m[i];
                m[i] = (v16)(((vi16)v & gt) | ((vi16)m[i] & ~gt));
                nan[i] |= v != v;
            }
        }
    }
    #pragma GCC unroll 8
    for (int i = 0; i < NC_POOL_R; i++) {
        if (i >= r) break;
        *(v16 *)(yr + (ox + i) * NC) = (v16)(((vi16)qnan & nan[i]) | ((vi16)m[i] & ~nan[i]));
    }
}

/* Max pooling of NCHW16c vectors, one output row oy of a plane xp: padded
 * taps are never chosen and a NaN wins, pool.c's rules (the max as a
 * select on v > m, a NaN remembered apart). A window with no input in it
 * (dilation > 1 can make one) is -inf in every lane, the unused ones too:
 * the NCHWc pass converts only pools without dilation. */
static NC_CLONES void nc_pool_row(const float *restrict xp, float *restrict yr, const mt_pool2d_geom *g,
                                  int64_t oy) {
    const int64_t iy0 = oy * g->sh - g->ph;
    /* the kernel rows (columns) inside the input: [lo, hi), without a loop over the others */
    const int64_t ky_lo = mt_max64(0, mt_ceildiv(-iy0, g->dh)), ky_hi = mt_min64(g->kh, mt_floordiv(g->h - 1 - iy0, g->dh) + 1);
    /* the interior columns [a, b): every kernel column inside the input */
    const int64_t last = g->w - 1 - (g->kw - 1) * g->dw + g->pw;
    const int64_t a = mt_min64(mt_ceildiv(g->pw, g->sw), g->ow);
    const int64_t b = mt_max64(a, mt_min64(last < 0 ? 0 : last / g->sw + 1, g->ow));
    int64_t ox = 0;
    while (ox < g->ow) {
        if (ox >= a && ox < b) {
            const int r = (int)mt_min64(NC_POOL_R, b - ox);
            nc_pool_px(xp, yr, g, iy0, ky_lo, ky_hi, ox, 0, g->kw, r);
            ox += r;
        } else {
            const int64_t ix0 = ox * g->sw - g->pw;
            const int64_t kx_lo = mt_max64(0, mt_ceildiv(-ix0, g->dw));
            const int64_t kx_hi = mt_min64(g->kw, mt_floordiv(g->w - 1 - ix0, g->dw) + 1);
            nc_pool_px(xp, yr, g, iy0, ky_lo, ky_hi, ox, kx_lo, kx_hi, 1);
            ox++;
        }
    }
}

/* g->planes = images * blocks; a task an output row */
int mt_max_pool2d_nchwc(const float *x, float *y, const mt_pool2d_geom *g, int nthreads) {
    const int64_t tasks = g->planes * g->oh, plane = g->h * g->w * NC;
    const int nt = g->planes * g->oh * g->ow * g->kh * g->kw * NC >= 4 * NC_GRAIN ? nthreads : 1;
    #pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (int64_t task = 0; task < tasks; task++)
        nc_pool_row(x + task / g->oh * plane, y + task * g->ow * NC, g, task % g->oh);
    return 0;
}

/* ---------------------------------------------------------- conversion */

/* 16 vectors of 16 floats transposed in registers: four rounds (s = 8, 4,
 * 2, 1) of two-source permutes, each swapping the off-diagonal s x s
 * blocks of every 2s x 2s block (row i and row i + s: lo keeps i's left
 * half of each pair of s columns and takes i + s's, hi the other way). */
static const vi16 nc_tr_lo[4] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23},
    {0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27},
    {0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29},
    {0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30}};
static const vi16 nc_tr_hi[4] = {
    {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31},
    {4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31},
    {2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31},
    {1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31}};

static inline __attribute__((always_inline)) void nc_transpose16(v16 *r) {
    #pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        const int s = 8 >> k;
        #pragma GCC unroll 16
        for (int i = 0; i < NC; i++) {
            if (i & s) continue;
            const v16 a = r[i], b = r[i + s];
            r[i] = __builtin_shuffle(a, b, nc_tr_lo[k]);
            r[i + s] = __builtin_shuffle(a, b, nc_tr_hi[k]);
        }
    }
}

/* One block of one image between NCHW (plain: its first channel's plane,
 * planes hw apart) and NCHW16c (blocked: [hw][16]); lanes past `lanes`
 * are written zero. fast: 16 pixels at a time through a transpose in
 * registers (AVX-512: the element by element loop moved 1-2 floats a
 * cycle), the rest element by element. */
static NC_CLONES void nc_reorder_block(const float *restrict src, float *restrict dst, int64_t hw, int64_t lanes,
                                       int to_blocked, int fast) {
    int64_t p0 = 0;
    if (fast) {
        v16 r[NC];
        for (; p0 + NC <= hw; p0 += NC) {
            if (to_blocked) {
                for (int l = 0; l < NC; l++) r[l] = l < lanes ? ld16(src + l * hw + p0) : (v16){0};
                nc_transpose16(r);
                for (int k = 0; k < NC; k++) *(v16 *)(dst + (p0 + k) * NC) = r[k];
            } else {
                for (int k = 0; k < NC; k++) r[k] = ld16(src + (p0 + k) * NC);
                nc_transpose16(r);
                for (int l = 0; l < lanes; l++) *(v16 *)(dst + l * hw + p0) = r[l];
            }
        }
    }
    if (to_blocked) {
        for (int64_t p = p0; p < hw; p++) {
            v16 v = (v16){0};
            for (int64_t l = 0; l < lanes; l++) v[l] = src[l * hw + p];
            *(v16 *)(dst + p * NC) = v;
        }
    } else {
        for (int64_t l = 0; l < lanes; l++)
            for (int64_t p = p0; p < hw; p++) dst[l * hw + p] = src[p * NC + l];
    }
}

/* NCHW [n][c][hw] <-> NCHW16c [n][blocks][hw][16] (to_blocked 1: the
 * first into the second, the lanes past c zero; 0: back). A task is one
 * block of one image. */
static void nc_reorder(const float *x, float *y, int64_t n, int64_t c, int64_t hw, int nthreads, int to_blocked) {
    const int64_t nb = mt_nchwc_blocks(c), tasks = n * nb;
    const int nt = n * c * hw >= 4 * NC_GRAIN ? nthreads : 1;
    /* (the transpose's permutes are one instruction with AVX-512 and a
     * long emulation without it) */
    const int fast = mt_cpu_avx512();
    #pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (int64_t t = 0; t < tasks; t++) {
        const int64_t img = t / nb, b = t % nb, lanes = mt_min64(NC, c - b * NC);
        const int64_t plain = (img * c + b * NC) * hw, blocked = t * hw * NC;
        if (to_blocked) nc_reorder_block(x + plain, y + blocked, hw, lanes, 1, fast);
        else nc_reorder_block(x + blocked, y + plain, hw, lanes, 0, fast);
    }
}

void mt_to_nchwc(const float *x, float *y, int64_t n, int64_t c, int64_t hw, int nthreads) {
    nc_reorder(x, y, n, c, hw, nthreads, 1);
}

void mt_from_nchwc(const float *x, float *y, int64_t n, int64_t c, int64_t hw, int nthreads) {
    nc_reorder(x, y, n, c, hw, nthreads, 0);
}
