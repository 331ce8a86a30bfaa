/* The CPU's neural-network kernels: convolution (conv.c), pooling (pool.c),
 * resize and pad (resize.c), activation epilogues (act.c), attention
 * (attention.c), layer normalization (norm.c), the NCHW16c layout (nchwc.c).
 * Their geometries, return codes and enums, and the backend table, are the
 * contract's nn_kernels.h.
 *
 * C does bytes: tensors arrive as contiguous NCHW buffers (the Cython layer in
 * nn.pyx makes them so) and every shape has been validated there. The float
 * kernels take a dtype code (MT_FLOAT32 or MT_FLOAT64, see mt_types.h);
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
#include "nn_kernels.h"   /* contract/: geometries, codes, enums, the table */
#include "blas_threads.h"

/* 1 when the n values at p (MT_FLOAT32 or MT_FLOAT64) are all below 2^k in
 * magnitude (so finite; k 128 or 1024: the finiteness test) */
int mt_all_below(int dtype, const void *p, int64_t n, int k);
/* ---- activation epilogues (act.c) ---- */

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
/* y[r] = layer_norm((x[r] + x_bias) + residual[r]) (nn_kernels.h's add_layer_norm: x_bias
 * and residual may be NULL; y may be x or residual) */
int mt_add_layer_norm(int dtype, const void *x, const void *x_bias, const void *residual, const void *w,
                      const void *b, void *y, int64_t rows, int64_t cols, double eps, int nthreads);

/* ---- fused attention (attention.c) ---- */

int64_t mt_attention_workspace(const mt_attn_geom *g, int nthreads);
int mt_attention_f32(const float *q, const float *k, const float *v, const float *mask, float *out,
                     const mt_attn_geom *g, int nthreads, void *workspace);
/* one row of scores in place: + the mask row (element stride ms3, or none),
 * softmax (row max subtracted, float32 exp, double sum); shared with the
 * backward (attention_grad.c) so both see the same probabilities */
void mt_attention_softmax_row(float *row, const float *mrow, int64_t ms3, int64_t n);
/* mt_nn_blas_single_begin/end: OpenBLAS single-threaded while OpenMP threads
 * run their own GEMMs (blas_threads.h) */

/* ---- convolution ---- */

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
/* mt_cpu_avx512(): mt_simd.h (cpu_features.c) */
/* The algorithm MT_CONV_AUTO picks for this geometry. */
int mt_conv2d_pick_algo(const mt_conv2d_geom *g);
/* Winograd's bound k (see cpu/conv/winograd.c): its transforms stay finite when every
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
/* the form for a conv of geometry g: for a blocked dense 3x3 conv, stride
 * 1, no dilation, MT_NCHWC_WINOGRAD (F(2x2, 3x3)) or MT_NCHWC_WINOGRAD4
 * (F(4x4, 3x3)) where they pay (winograd -1), or that one wherever it
 * applies (winograd 1: F(2x2), 2: F(4x4)), or never (0) */
int mt_conv2d_nchwc_form(const mt_conv2d_geom *g, int blocked, int winograd);
/* how a direct NCHW16c conv orders its tasks over the threads: -1 as the
 * CPU says, 0 never in row bands, 1 wherever the bytes say (nchwc.c);
 * returns the previous mode. For tests. */
int mt_nchwc_set_bands(int mode);
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

int mt_max_pool2d(int dtype, const void *x, void *y, const mt_pool2d_geom *g, int nthreads);
/* float32 NCHW16c x [planes = n * blocks][h][w][16] -> y [planes][oh][ow][16] (nchwc.c) */
int mt_max_pool2d_nchwc(const float *x, float *y, const mt_pool2d_geom *g, int nthreads);
int mt_avg_pool2d(int dtype, const void *x, void *y, const mt_pool2d_geom *g, int nthreads);

int mt_adaptive_pool2d(int dtype, int op, const void *x, void *y, int64_t planes, int64_t h,
                       int64_t w, int64_t oh, int64_t ow, int nthreads);

/* ---- resize: x [planes, h, w] -> y [planes, oh, ow] ---- */

/* scale_h/scale_w: the user's scale factors (output/input), or 0 to derive
 * the coordinate scale from the sizes, as PyTorch does. */
int mt_resize2d(int dtype, int mode, const void *x, void *y, int64_t planes, int64_t h, int64_t w,
                int64_t oh, int64_t ow, double scale_h, double scale_w, int align_corners,
                int nthreads);

/* ---- pad by index mapping (any dtype, any ndim; x contiguous, y contiguous) ---- */

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
int mt_index_add(int dtype, void *dst, int64_t rows, const int64_t *idx, int64_t n, const void *src,
                 int64_t inner, int nthreads);

/* gx [n] = gy * act'(x) for x the pre-activation, act an enum mt_act other
 * than NONE (MT_NN_EINDEX for another) */
int mt_act_backward(int dtype, int act, const void *x, const void *gy, void *gx, int64_t n, int nthreads);
/* layer norm's backward over rows of cols (x, gy, gx contiguous [rows,
 * cols]; mean and variance recomputed from x as mt_layer_norm does): gx;
 * gw = sum over rows of gy * xhat and gb = sum of gy when not NULL; w NULL
 * for no weight. 0, or MT_NN_ENOMEM */
int mt_layer_norm_backward(int dtype, const void *x, const void *w, const void *gy, void *gx, void *gw,
                           void *gb, int64_t rows, int64_t cols, double eps, int nthreads);

/* ---- conv3d by vol2col and GEMM (conv3d.c): y [n, o, od, oh, ow] from x [n, c, d, h,
 * w] and weight [o, c/groups, kd, kh, kw] (+ bias [o] unless NULL); gx [n, c, d, h, w]
 * from gy (the transpose: conv_transpose3d's forward); gw [o, c/groups, kd, kh, kw] ---- */
int mt_conv3d(int dtype, const void *x, const void *weight, const void *bias, void *y,
              const mt_conv3d_geom *g, int nthreads);
int mt_conv3d_backward_data(int dtype, const void *gy, const void *weight, void *gx,
                            const mt_conv3d_geom *g, int nthreads);
int mt_conv3d_backward_weight(int dtype, const void *x, const void *gy, void *gw,
                              const mt_conv3d_geom *g, int nthreads);

/* ---- one fused LSTM / RNN time step (rnn_cell.c; nn_kernels.h's table members) ---- */
int mt_lstm_cell(int dtype, const void *gx, const void *h, const void *c, const void *w_hh, const void *b_hh,
                 void *h_out, void *c_out, int64_t n, int64_t hidden, int64_t h_width, int nthreads);
int mt_rnn_cell(int dtype, int relu, const void *gx, const void *h, const void *w_hh, const void *b_hh,
                void *h_out, int64_t n, int64_t hidden, int nthreads);

/* ---- local response normalization across channels (lrn.c; nn_kernels.h's table member) ---- */
int mt_lrn(int dtype, const void *x, void *y, int64_t outer, int64_t c, int64_t inner, int64_t n,
           double k, double alpha, double beta, int nthreads);

/* ---- training kernels (train.c; nn_kernels.h's table members, which say what they compute):
 * batch norm in training over [outer, c, inner] and its backward, the SGD step ---- */
int mt_batch_norm_train(int dtype, const void *x, const void *w, const void *b, void *y, void *mean, void *var,
                        int64_t outer, int64_t c, int64_t inner, double eps, int nthreads);
int mt_batch_norm_backward(int dtype, const void *x, const void *w, const void *gy, void *gx, void *gw,
                           void *gb, int64_t outer, int64_t c, int64_t inner, double eps, int nthreads);
int mt_sgd_step(int dtype, void *p, const void *g, void *buf, int64_t n, double lr, double momentum,
                double weight_decay, int nesterov, int first, int nthreads);
int mt_softmax_backward(int dtype, int log_softmax, const void *y, const void *gy, void *gx, int64_t rows,
                        int64_t cols, int nthreads);
/* fused attention's backward (attention_grad.c; nn_kernels.h's table member says what it computes) */
int64_t mt_attention_backward_workspace(const mt_attn_geom *g, int nthreads);
int mt_attention_backward_f32(const float *q, const float *k, const float *v, const float *mask,
                              const float *probs, const float *gy, float *gq, float *gk, float *gv, float *gs,
                              const mt_attn_geom *g, int nthreads, void *workspace);
int mt_attention_train_f32(const float *q, const float *k, const float *v, const float *mask, float *out,
                           float *probs, const mt_attn_geom *g, int nthreads);

/* below this many elements of work an nn loop stays on one thread */
#define MT_NN_GRAIN 32768

#endif
