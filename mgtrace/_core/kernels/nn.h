/* Neural-network kernels: convolution (conv.c), pooling (pool.c), resize and
 * pad (resize.c), activation epilogues (act.c), attention (attention.c),
 * layer normalization (norm.c).
 *
 * C does bytes: tensors arrive as contiguous NCHW buffers (the Cython layer in
 * nn.pyx makes them so) and every shape has been validated there. The float
 * kernels take a dtype code (MT_FLOAT32 or MT_FLOAT64, see mt_common.h);
 * float16/bfloat16 are computed in float32 by the caller. nthreads is the
 * OpenMP thread budget (dispatch's num_threads()). A convolution is one
 * OpenMP region whose threads each run single-threaded GEMMs while OpenBLAS
 * is switched to one thread (see conv.c), so BLAS threads and OpenMP threads
 * never compete for the cores.
 *
 * Every function returns 0, or MT_NN_ENOMEM when a work buffer could not be
 * allocated (the output is then unspecified). The convolutions allocate
 * nothing: their scratch memory is a workspace the caller sizes with
 * mt_conv2d_workspace / mt_conv_transpose2d_workspace.
 */
#ifndef MT_NN_H
#define MT_NN_H
#include "mt_common.h"

#define MT_NN_ENOMEM (-1)
/* returned by the workspace queries when the size does not fit int64 */
#define MT_NN_EOVERFLOW (-2)
/* returned by a transform-based conv (WINOGRAD, WINOGRAD4, the NCHWc
 * Winograd forms) whose input holds a NaN, an infinity or a magnitude past
 * mt_wino_bound: a transform mixes a whole tile's patch into every output
 * of the tile (and an inf into inf - inf = NaN), where a direct sum keeps
 * each non-finite input to the outputs whose receptive field holds it, and
 * a huge finite one overflows in the transforms where the direct sum does
 * not. The call stops early, its output unspecified; the caller runs it
 * again with a direct kernel (mt_conv2d_direct_algo, or the NCHWc form for
 * winograd 0). Found by a check of the input as the kernel reads it (no
 * extra pass); for WINOGRAD with unpacked weights, of the weights too. */
#define MT_NN_NONFINITE 1

/* 1 when the n values at p (MT_FLOAT32 or MT_FLOAT64) are all below 2^k in
 * magnitude (so finite; k 128 or 1024: the finiteness test) */
int mt_all_below(int dtype, const void *p, int64_t n, int k);
/* ---- activation epilogues (act.c) ---- */

/* The activation a fused conv2d / linear applies after its bias (the same
 * values as the separate elementwise op). Append only: nn.pyx names them. */
enum mt_act {
    MT_ACT_NONE = 0, MT_ACT_RELU, MT_ACT_RELU6, MT_ACT_SILU, MT_ACT_HARDSWISH,
    MT_ACT_SIGMOID, MT_ACT_GELU, MT_NACTS
};
/* y[0..n) = act(y[0..n)) in place */
void mt_act_f32(float *y, int64_t n, int act);
void mt_act_f64(double *y, int64_t n, int act);
/* y [rows, cols] row-major: y[r][c] = act(y[r][c] + bias[c]); bias may be NULL */
int mt_bias_act(int dtype, void *y, int64_t rows, int64_t cols, const void *bias, int act, int nthreads);

/* ---- layer normalization (norm.c) ---- */

/* x, y [rows, cols] contiguous: y[r] = (x[r] - mean) / sqrt(var + eps) * w + b
 * over each row (biased var); w and b [cols] or NULL. */
int mt_layer_norm(int dtype, const void *x, const void *w, const void *b, void *y, int64_t rows, int64_t cols,
                  double eps, int nthreads);

/* ---- fused attention (attention.c) ---- */

/* out [b, h, sq, dv] (contiguous) = softmax(q k^T * scale + mask) v with
 * q [b, h, sq, d], k [b, h, sk, d], v [b, h, sk, dv], mask broadcast to
 * [b, h, sq, sk]: element strides per axis (0 on broadcast axes); q, k and v
 * need a unit last stride and a row stride >= their last extent. */
typedef struct {
    int64_t b, h, sq, sk, d, dv;
    int64_t qs[4], ks[4], vs[4], ms[4];
    float scale;
} mt_attn_geom;
int64_t mt_attention_workspace(const mt_attn_geom *g, int nthreads);
int mt_attention_f32(const float *q, const float *k, const float *v, const float *mask, float *out,
                     const mt_attn_geom *g, int nthreads, void *workspace);
/* OpenBLAS single-threaded while OpenMP threads run their own GEMMs (conv.c) */
void mt_nn_blas_single_begin(void);
void mt_nn_blas_single_end(void);

/* ---- convolution ---- */

/* How conv2d computes; AUTO picks by shape (see conv.c). */
enum mt_conv_algo {
    MT_CONV_AUTO = 0,
    MT_CONV_GEMM1X1,    /* 1x1, stride 1, no padding: one GEMM per image, no copies */
    MT_CONV_SHIFTED,    /* one GEMM per kernel tap over a padded (polyphase) copy */
    MT_CONV_IM2COL,     /* im2col in cache-sized column tiles, then GEMM */
    MT_CONV_DEPTHWISE,  /* direct loops; needs one input channel per group */
    MT_CONV_WINOGRAD,   /* F(2x2, 3x3): 3x3, stride 1, dilation 1; 16 GEMMs per tile block */
    MT_CONV_WINOGRAD4,  /* F(4x4, 3x3): as WINOGRAD, 36 GEMMs per block of 4x4 tiles */
    MT_CONV_DIRECT,     /* direct multiply-adds over a padded polyphase copy, no GEMM */
    MT_CONV_BLOCKED,    /* direct multiply-adds vectorised over blocks of output channels */
    MT_CONV_NALGOS
};

/* Geometry of one conv2d / conv_transpose2d call (all NCHW).
 * conv2d:           x [n, c, h, w], weight [o, c/groups, kh, kw], y [n, o, oh, ow]
 * conv_transpose2d: x [n, c, h, w], weight [c, o/groups, kh, kw], y [n, o, oh, ow] */
typedef struct {
    int64_t n, c, h, w;
    int64_t o, kh, kw;
    int64_t oh, ow;
    int64_t sh, sw, ph, pw, dh, dw;
    int64_t groups;
    /* conv2d's epilogue: y = act(conv + bias + residual) */
    int act;        /* enum mt_act (0: none) */
    int has_res;    /* 1: add a residual tensor laid out as y, ... */
    int64_t res_delta;  /* ... whose element for y's element at address a is at a + res_delta */
} mt_conv2d_geom;

/* Scratch bytes the call needs (0: none; MT_NN_EOVERFLOW when the count
 * would not fit int64). The caller passes a 64-byte aligned buffer of that
 * size as workspace, with the same nthreads. */
int64_t mt_conv2d_workspace(int dtype, const mt_conv2d_geom *g, int algo, int nthreads);
int mt_conv2d(int dtype, const void *x, const void *weight, const void *bias, void *y,
              const mt_conv2d_geom *g, int algo, int nthreads, void *workspace);
int64_t mt_conv_transpose2d_workspace(int dtype, const mt_conv2d_geom *g, int nthreads);
int mt_conv_transpose2d(int dtype, const void *x, const void *weight, const void *bias, void *y,
                        const mt_conv2d_geom *g, int nthreads, void *workspace);
/* Weights packed once, for the algorithms that rearrange them
 * (mt_conv2d_packs_weights: WINOGRAD and WINOGRAD4's transformed U,
 * DIRECT's blocks of output channels), so that a caller can cache the
 * packed copy: the layout on this CPU (an int the cache key must hold:
 * DIRECT's depends on the CPU and the test switch below), the packed bytes,
 * the packing (from weight [O, C/groups, KH, KW]), and the conv on the
 * packed weights with its own (smaller) workspace. The geometry must suit
 * the algorithm. */
int mt_conv2d_packs_weights(int algo);
int mt_conv2d_packed_layout(int algo);
int64_t mt_conv2d_packed_bytes(int dtype, const mt_conv2d_geom *g, int algo, int layout);
void mt_conv2d_pack_weights(int dtype, const void *weight, void *packed, const mt_conv2d_geom *g, int algo,
                            int layout, int nthreads);
int64_t mt_conv2d_packed_workspace(int dtype, const mt_conv2d_geom *g, int algo, int layout, int nthreads);
int mt_conv2d_packed(int dtype, const void *x, const void *packed, const void *bias, void *y,
                     const mt_conv2d_geom *g, int algo, int layout, int nthreads, void *workspace);
/* tests: 1 makes DIRECT run its AVX2/baseline micro-kernel even where the
 * CPU has AVX-512 (0: pick by CPU, the default) */
void mt_conv2d_direct_force_narrow(int on);
/* 1 when this CPU has the AVX-512 subsets (F, DQ, BW, VL) of x86-64-v4,
 * which the kernels' AVX-512 clones are built for */
int mt_cpu_avx512(void);
/* The algorithm MT_CONV_AUTO picks for this geometry. */
int mt_conv2d_pick_algo(const mt_conv2d_geom *g);
/* Winograd's bound k (see conv.c): its transforms stay finite when every
 * |x| and every |w| is below 2^k (float32: 55 with one input channel a
 * group, 53 with 16, 51 with 512). Weights packed for a Winograd algorithm
 * or NCHWc form must be within it: the caller checks them with
 * mt_all_below before packing, and runs a direct kernel otherwise. */
int mt_wino_bound(int dtype, const mt_conv2d_geom *g);
/* The kernel without transforms that reruns a call ended by
 * MT_NN_NONFINITE: DIRECT where its packed image fits, else IM2COL. */
int mt_conv2d_direct_algo(const mt_conv2d_geom *g);
/* The same for a caller that caches packed weights (w_cached 1: see
 * mt_conv2d_pack_weights): WINOGRAD and WINOGRAD4 then pay on fewer tiles,
 * and DIRECT on more geometries. */
int mt_conv2d_pick_algo_ex(const mt_conv2d_geom *g, int w_cached);

/* ---- NCHW16c convolutions (nchwc.c, float32): channels in blocks of 16,
 * [n][ceil(c/16)][h][w][16], zeros past c ----
 * conv: x NCHW16c (blocked 1) or NCHW (blocked 0; dense only) -> y NCHW16c;
 * groups 1 (dense) or groups = c = o (depthwise, blocked input); the
 * epilogue of mt_conv2d_geom (residual NCHW16c like y). Weights packed
 * once (mt_conv2d_nchwc_pack, bytes from _packed_bytes), scratch from
 * _workspace (64-byte aligned). */
int64_t mt_nchwc_blocks(int64_t channels);
/* the `blocked` argument of the calls below: the input's layout, and for
 * an NCHW16c input the algorithm (weights packed for it) */
enum mt_nchwc_form { MT_NCHWC_PLAIN = 0, MT_NCHWC_BLOCKED = 1, MT_NCHWC_WINOGRAD = 2, MT_NCHWC_WINOGRAD4 = 3 };
/* the form for a conv of geometry g: for a blocked dense 3x3 conv, stride
 * 1, no dilation, MT_NCHWC_WINOGRAD (F(2x2, 3x3)) or MT_NCHWC_WINOGRAD4
 * (F(4x4, 3x3)) where they pay (winograd -1), or that one wherever it
 * applies (winograd 1: F(2x2), 2: F(4x4)), or never (0) */
int mt_conv2d_nchwc_form(const mt_conv2d_geom *g, int blocked, int winograd);
int64_t mt_conv2d_nchwc_packed_bytes(const mt_conv2d_geom *g, int blocked);
void mt_conv2d_nchwc_pack(const float *w, float *packed, const mt_conv2d_geom *g, int blocked);
int64_t mt_conv2d_nchwc_workspace(const mt_conv2d_geom *g, int blocked, int nthreads);
int mt_conv2d_nchwc(const float *x, int blocked, const float *packed, const float *bias, float *y,
                    const mt_conv2d_geom *g, int nthreads, void *workspace);
/* A pointwise conv pw (1x1, stride 1, no padding, blocked x) and the
 * depthwise conv dw that reads its output (dilation 1; dw->c = dw->o =
 * pw->o) in one call: x NCHW16c [n, c/16, h, w] -> y NCHW16c [n, o/16, oh,
 * ow]; each geometry's act; no residual. Weights packed as for
 * mt_conv2d_nchwc (blocked 1). */
int64_t mt_conv2d_nchwc_pw_dw_workspace(const mt_conv2d_geom *pw, const mt_conv2d_geom *dw, int nthreads);
int mt_conv2d_nchwc_pw_dw(const float *x, const float *pw_packed, const float *pw_bias, const float *dw_packed,
                          const float *dw_bias, float *y, const mt_conv2d_geom *pw, const mt_conv2d_geom *dw,
                          int nthreads, void *workspace);
/* An inverted-residual block: mt_conv2d_nchwc_pw_dw (pw, dw) and the 1x1
 * projection pj (stride 1, no padding, pj->c = pw->o, its epilogue's
 * residual NCHW16c like y) that reads its output, in one call: x NCHW16c
 * [n, c/16, h, w] -> y NCHW16c [n, o/16, oh, ow]. Weights packed as for
 * mt_conv2d_nchwc (blocked 1). */
int64_t mt_conv2d_nchwc_pw_dw_pw_workspace(const mt_conv2d_geom *pw, const mt_conv2d_geom *dw,
                                           const mt_conv2d_geom *pj, int nthreads);
int mt_conv2d_nchwc_pw_dw_pw(const float *x, const float *pw_packed, const float *pw_bias, const float *dw_packed,
                             const float *dw_bias, const float *pj_packed, const float *pj_bias, float *y,
                             const mt_conv2d_geom *pw, const mt_conv2d_geom *dw, const mt_conv2d_geom *pj,
                             int nthreads, void *workspace);
/* NCHW [n, c, hw] <-> NCHW16c [n, ceil(c/16), hw, 16] */

void mt_to_nchwc(const float *x, float *y, int64_t n, int64_t c, int64_t hw, int nthreads);
void mt_from_nchwc(const float *x, float *y, int64_t n, int64_t c, int64_t hw, int nthreads);

/* ---- pooling: x [planes, h, w] -> y [planes, oh, ow], planes = N*C ---- */

typedef struct {
    int64_t planes, h, w, oh, ow;
    int64_t kh, kw, sh, sw, ph, pw, dh, dw;
    int count_include_pad;   /* avg only */
} mt_pool2d_geom;

int mt_max_pool2d(int dtype, const void *x, void *y, const mt_pool2d_geom *g, int nthreads);
/* float32 NCHW16c x [planes = n * blocks][h][w][16] -> y [planes][oh][ow][16] (nchwc.c) */
int mt_max_pool2d_nchwc(const float *x, float *y, const mt_pool2d_geom *g, int nthreads);
int mt_avg_pool2d(int dtype, const void *x, void *y, const mt_pool2d_geom *g, int nthreads);

enum mt_adaptive_op { MT_ADAPTIVE_AVG = 0, MT_ADAPTIVE_MAX };
int mt_adaptive_pool2d(int dtype, int op, const void *x, void *y, int64_t planes, int64_t h,
                       int64_t w, int64_t oh, int64_t ow, int nthreads);

/* ---- resize: x [planes, h, w] -> y [planes, oh, ow] ---- */

enum mt_resize_mode { MT_RESIZE_NEAREST = 0, MT_RESIZE_BILINEAR };
/* scale_h/scale_w: the user's scale factors (output/input), or 0 to derive
 * the coordinate scale from the sizes, as PyTorch does. */
int mt_resize2d(int dtype, int mode, const void *x, void *y, int64_t planes, int64_t h, int64_t w,
                int64_t oh, int64_t ow, double scale_h, double scale_w, int align_corners,
                int nthreads);

/* ---- pad by index mapping (any dtype, any ndim; x contiguous, y contiguous) ---- */

enum mt_pad_mode { MT_PAD_REFLECT = 0, MT_PAD_REPLICATE };
/* out_shape[d] = shape[d] + before[d] + after[d]; reflect needs before, after
 * < shape[d], replicate needs shape[d] > 0 where padding is asked for. */
int mt_pad_index(const void *x, void *y, int ndim, const int64_t *shape, const int64_t *before,
                 const int64_t *after, int mode, int64_t itemsize, int nthreads);

/* ---- backward kernels (grad.c): gradients with the forward's geometry ----
 * gx/gw are outputs (fully written); gy is the output's gradient, x the
 * forward's input (contiguous, as the forward's). */

/* max pooling: gy [planes, oh, ow] to the window's first maximum (its first
 * NaN when it holds one) */
int mt_max_pool2d_backward(int dtype, const void *x, const void *gy, void *gx, const mt_pool2d_geom *g,
                           int nthreads);
int mt_avg_pool2d_backward(int dtype, const void *gy, void *gx, const mt_pool2d_geom *g, int nthreads);
int mt_adaptive_pool2d_backward(int dtype, int op, const void *x, const void *gy, void *gx, int64_t planes,
                                int64_t h, int64_t w, int64_t oh, int64_t ow, int nthreads);
int mt_resize2d_backward(int dtype, int mode, const void *gy, void *gx, int64_t planes, int64_t h, int64_t w,
                         int64_t oh, int64_t ow, double scale_h, double scale_w, int align_corners,
                         int nthreads);
/* conv2d's weight gradient gw [o, c/groups, kh, kw] from x [n, c, h, w] and
 * gy [n, o, oh, ow] (the geometry's epilogue fields are ignored) */
int mt_conv2d_backward_weight(int dtype, const void *x, const void *gy, void *gw, const mt_conv2d_geom *g,
                              int nthreads);
/* dst [rows, inner] += src [n, inner] row k added at row idx[k] (repeated
 * rows add up); MT_NN_EINDEX, dst untouched, when an index is outside [0, rows) */
#define MT_NN_EINDEX (-3)
int mt_index_add(int dtype, void *dst, int64_t rows, const int64_t *idx, int64_t n, const void *src,
                 int64_t inner, int nthreads);

/* gx [n] = gy * act'(x) for x the pre-activation, act an enum mt_act other
 * than NONE (MT_NN_EINDEX for another) */
int mt_act_backward(int dtype, int act, const void *x, const void *gy, void *gx, int64_t n, int nthreads);

/* below this many elements of work an nn loop stays on one thread */
#define MT_NN_GRAIN 32768

/* this area's kernels on a device backend (backend.h) */
typedef struct mt_nn_kernels {
    int64_t (*conv2d_workspace)(int dtype, const mt_conv2d_geom *g, int algo, int nt);
    int (*conv2d)(int dtype, const void *x, const void *weight, const void *bias, void *y,
                  const mt_conv2d_geom *g, int algo, int nt, void *workspace);
    int (*max_pool2d)(int dtype, const void *x, void *y, const mt_pool2d_geom *g, int nt);
    int (*avg_pool2d)(int dtype, const void *x, void *y, const mt_pool2d_geom *g, int nt);
    int (*adaptive_pool2d)(int dtype, int op, const void *x, void *y, int64_t planes, int64_t h,
                           int64_t w, int64_t oh, int64_t ow, int nt);
    int (*resize2d)(int dtype, int mode, const void *x, void *y, int64_t planes, int64_t h,
                    int64_t w, int64_t oh, int64_t ow, double scale_h, double scale_w,
                    int align_corners, int nt);
    int (*bias_act)(int dtype, void *y, int64_t rows, int64_t cols, const void *bias, int act, int nt);
    /* the CPU's only so far (CUDA leaves them NULL: the op raises, or runs
     * its op-table fallback); the signatures of the mt_ functions above */
    int64_t (*conv_transpose2d_workspace)(int dtype, const mt_conv2d_geom *g, int nt);
    int (*conv_transpose2d)(int dtype, const void *x, const void *weight, const void *bias, void *y,
                            const mt_conv2d_geom *g, int nt, void *workspace);
    int (*pad_index)(const void *x, void *y, int ndim, const int64_t *shape, const int64_t *before,
                     const int64_t *after, int mode, int64_t itemsize, int nt);
    int (*layer_norm)(int dtype, const void *x, const void *w, const void *b, void *y, int64_t rows,
                      int64_t cols, double eps, int nt);
    int64_t (*attention_workspace)(const mt_attn_geom *g, int nt);
    int (*attention_f32)(const float *q, const float *k, const float *v, const float *mask,
                         float *out, const mt_attn_geom *g, int nt, void *workspace);
    /* the NCHW16c layout's kernels (its packing helpers, mt_conv2d_nchwc_form
     * and the workspaces, are host functions of the layout) */
    void (*to_nchwc)(const float *x, float *y, int64_t n, int64_t c, int64_t hw, int nt);
    void (*from_nchwc)(const float *x, float *y, int64_t n, int64_t c, int64_t hw, int nt);
    int (*conv2d_nchwc)(const float *x, int blocked, const float *packed, const float *bias, float *y,
                        const mt_conv2d_geom *g, int nt, void *workspace);
    int (*conv2d_nchwc_pw_dw)(const float *x, const float *pw_packed, const float *pw_bias,
                              const float *dw_packed, const float *dw_bias, float *y,
                              const mt_conv2d_geom *pw, const mt_conv2d_geom *dw, int nt,
                              void *workspace);
    int (*conv2d_nchwc_pw_dw_pw)(const float *x, const float *pw_packed, const float *pw_bias,
                                 const float *dw_packed, const float *dw_bias, const float *pj_packed,
                                 const float *pj_bias, float *y, const mt_conv2d_geom *pw,
                                 const mt_conv2d_geom *dw, const mt_conv2d_geom *pj, int nt,
                                 void *workspace);
    int (*max_pool2d_nchwc)(const float *x, float *y, const mt_pool2d_geom *g, int nt);
    /* optional: conv2d over weights packed once per weight (the CPU's
     * Winograd/direct/blocked layouts, cached by nn.pyx; the algorithm pick
     * and packing are mt_conv2d_pick_algo_ex / mt_conv2d_pack_weights). A
     * device without it runs conv2d. */
    int (*conv2d_packed)(int dtype, const void *x, const void *packed, const void *bias, void *y,
                         const mt_conv2d_geom *g, int algo, int layout, int nt, void *workspace);
    /* backward kernels (grad.c's signatures; CUDA leaves them NULL: the
     * gradient raises NoKernelError there) */
    int (*max_pool2d_backward)(int dtype, const void *x, const void *gy, void *gx, const mt_pool2d_geom *g,
                               int nt);
    int (*avg_pool2d_backward)(int dtype, const void *gy, void *gx, const mt_pool2d_geom *g, int nt);
    int (*adaptive_pool2d_backward)(int dtype, int op, const void *x, const void *gy, void *gx, int64_t planes,
                                    int64_t h, int64_t w, int64_t oh, int64_t ow, int nt);
    int (*resize2d_backward)(int dtype, int mode, const void *gy, void *gx, int64_t planes, int64_t h,
                             int64_t w, int64_t oh, int64_t ow, double scale_h, double scale_w,
                             int align_corners, int nt);
    int (*conv2d_backward_weight)(int dtype, const void *x, const void *gy, void *gw, const mt_conv2d_geom *g,
                                  int nt);
    int (*index_add)(int dtype, void *dst, int64_t rows, const int64_t *idx, int64_t n, const void *src,
                     int64_t inner, int nt);
    int (*act_backward)(int dtype, int act, const void *x, const void *gy, void *gx, int64_t n, int nt);
} mt_nn_kernels;

#endif
