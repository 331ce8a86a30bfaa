/* Neural-network ops on any device: the geometry of each call (NCHW,
 * validated by nn.pyx), the return codes, the enums that name activations,
 * algorithms and modes, and the backend table (backend.h's ``nn``). The
 * CPU's kernels are cpu/nn.h, CUDA's cuda/nn.cu.
 *
 * Every kernel returns 0, MT_NN_ENOMEM when a work buffer could not be
 * allocated (the output is then unspecified), or a code below.
 */
#ifndef MT_NN_KERNELS_H
#define MT_NN_KERNELS_H
#include "mt_types.h"

#define MT_NN_ENOMEM (-1)
/* returned by the workspace queries when the size does not fit int64 */
#define MT_NN_EOVERFLOW (-2)
/* returned by a gather-like kernel (index_add) for an index out of range */
#define MT_NN_EINDEX (-3)
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

/* The activation a fused conv2d / linear applies after its bias (the same
 * values as the separate elementwise op). Append only: nn.pyx names them. */
enum mt_act {
    MT_ACT_NONE = 0, MT_ACT_RELU, MT_ACT_RELU6, MT_ACT_SILU, MT_ACT_HARDSWISH,
    MT_ACT_SIGMOID, MT_ACT_GELU, MT_NACTS
};

/* out [b, h, sq, dv] = softmax(q k^T * scale + mask) v with
 * q [b, h, sq, d], k [b, h, sk, d], v [b, h, sk, dv], mask broadcast to
 * [b, h, sq, sk]: element strides per axis (0 on broadcast axes); q, k and v
 * need a unit last stride and a row stride >= their last extent. out's
 * element strides along b, h and sq are os (its last axis unit, rows at
 * least dv apart); os all 0: contiguous (as before os was added: a device
 * that ignores it must see it 0). */
typedef struct {
    int64_t b, h, sq, sk, d, dv;
    int64_t qs[4], ks[4], vs[4], ms[4];
    float scale;
    int64_t os[3];
} mt_attn_geom;

/* How conv2d computes; AUTO lets the device pick (the CPU: by shape, the priority list in cpu/conv/choice.c). */
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

/* the `blocked` argument of the NCHW16c convolutions (cpu/nn.h, the table's
 * conv2d_nchwc): the input's layout, and for an NCHW16c input the algorithm
 * (weights packed for it) */
enum mt_nchwc_form { MT_NCHWC_PLAIN = 0, MT_NCHWC_BLOCKED = 1, MT_NCHWC_WINOGRAD = 2, MT_NCHWC_WINOGRAD4 = 3 };

/* pooling: x [planes, h, w] -> y [planes, oh, ow], planes = N*C */
typedef struct {
    int64_t planes, h, w, oh, ow;
    int64_t kh, kw, sh, sw, ph, pw, dh, dw;
    int count_include_pad;   /* avg only */
} mt_pool2d_geom;

enum mt_adaptive_op { MT_ADAPTIVE_AVG = 0, MT_ADAPTIVE_MAX };

/* resize: nearest or bilinear (x [planes, h, w] -> y [planes, oh, ow]) */
enum mt_resize_mode { MT_RESIZE_NEAREST = 0, MT_RESIZE_BILINEAR };

/* pad by index mapping */
enum mt_pad_mode { MT_PAD_REFLECT = 0, MT_PAD_REPLICATE };

/* Geometry of one conv3d call (NCDHW; cpu/conv3d.c). The transposed
 * convolution and the gradients use the same geometry, that of the forward
 * conv3d whose input is x [n, c, d, h, w], weight [o, c/groups, kd, kh, kw]
 * and output y [n, o, od, oh, ow]. */
typedef struct {
    int64_t n, c, d, h, w;
    int64_t o, kd, kh, kw;
    int64_t od, oh, ow;
    int64_t sd, sh, sw, pd, ph, pw, dd, dh, dw;
    int64_t groups;
} mt_conv3d_geom;

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
    /* backward kernels (the CPU's in cpu/grad.c; CUDA leaves them NULL: the
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
    /* layer norm over rows of cols: gx from x and gy (mean and variance
     * recomputed as layer_norm's), and the weight's and bias's gradients
     * summed over the rows where gw / gb are not NULL (w NULL: no weight) */
    int (*layer_norm_backward)(int dtype, const void *x, const void *w, const void *gy, void *gx, void *gw,
                               void *gb, int64_t rows, int64_t cols, double eps, int nt);
    /* conv3d (the CPU's in cpu/conv3d.c; CUDA leaves them NULL): y = conv3d(x, weight) + bias
     * (bias may be NULL); gx = the transpose of conv3d applied to gy (conv_transpose3d's
     * forward and conv3d's input gradient); gw = conv3d's weight gradient */
    int (*conv3d)(int dtype, const void *x, const void *weight, const void *bias, void *y,
                  const mt_conv3d_geom *g, int nt);
    int (*conv3d_backward_data)(int dtype, const void *gy, const void *weight, void *gx,
                                const mt_conv3d_geom *g, int nt);
    int (*conv3d_backward_weight)(int dtype, const void *x, const void *gy, void *gw,
                                  const mt_conv3d_geom *g, int nt);
    /* one recurrent time step (the CPU's in cpu/rnn_cell.c; CUDA leaves them NULL): gx [n, G]
     * the input's precomputed share of the gates (G = 4 * hidden for LSTM, hidden for RNN),
     * h [n, h_width] (LSTM: h_width < hidden with a projection; RNN: hidden), c [n, hidden],
     * w_hh [G, h_width], b_hh [G] or NULL; h_out, c_out [n, hidden]; gates = gx + b_hh + h @ w_hh^T,
     * then LSTM: i, f, g, o = the gates' quarters, c_out = sigmoid(f) c + sigmoid(i) tanh(g),
     * h_out = sigmoid(o) tanh(c_out); RNN: h_out = tanh(gates), or relu(gates) if relu */
    int (*lstm_cell)(int dtype, const void *gx, const void *h, const void *c, const void *w_hh,
                     const void *b_hh, void *h_out, void *c_out, int64_t n, int64_t hidden, int64_t h_width,
                     int nt);
    int (*rnn_cell)(int dtype, int relu, const void *gx, const void *h, const void *w_hh, const void *b_hh,
                    void *h_out, int64_t n, int64_t hidden, int nt);
    /* local response normalization across channels (the CPU's in cpu/lrn.c; CUDA leaves it
     * NULL and F.local_response_norm composes core ops): x, y [outer, c, inner] contiguous,
     * y = x * (k + alpha * sum of x^2 over the n channels centred on each (n odd, zeros past
     * the ends))^-beta */
    int (*lrn)(int dtype, const void *x, void *y, int64_t outer, int64_t c, int64_t inner, int64_t n,
               double k, double alpha, double beta, int nt);
    /* training kernels (the CPU's in cpu/train.c; CUDA leaves them NULL and the callers compose
     * core ops). Batch norm in training: x, y, gy, gx [outer, c, inner] contiguous; the batch's
     * mean and biased var per channel over outer and inner (written to mean / var [c], x's dtype,
     * when not NULL); y = (x - mean) / sqrt(var + eps) * w + b (w, b [c] or NULL); the backward
     * recomputes the statistics from x and writes gx, and gw = sum(gy xhat), gb = sum(gy) [c]
     * where not NULL. SGD: one parameter p [n] updated in place from its gradient g:
     * g' = g + weight_decay p; buf = momentum buf + g' (buf = g' when first; buf NULL: no
     * momentum); p -= lr (nesterov ? g' + momentum buf : buf), or lr g' without momentum */
    int (*batch_norm_train)(int dtype, const void *x, const void *w, const void *b, void *y, void *mean,
                            void *var, int64_t outer, int64_t c, int64_t inner, double eps, int nt);
    int (*batch_norm_backward)(int dtype, const void *x, const void *w, const void *gy, void *gx, void *gw,
                               void *gb, int64_t outer, int64_t c, int64_t inner, double eps, int nt);
    int (*sgd_step)(int dtype, void *p, const void *g, void *buf, int64_t n, double lr, double momentum,
                    double weight_decay, int nesterov, int first, int nt);
    /* a residual block's tail in one pass (the CPU's in cpu/norm.c; CUDA leaves it NULL and
     * F.linear_add_layer_norm composes core ops): x, residual, y [rows, cols] contiguous, x_bias,
     * w, b [cols] or NULL; s = (x + x_bias) + residual in x's dtype (the additions a linear
     * layer's bias and a residual add make, in that order), then y = layer_norm(s) as
     * layer_norm computes it. y may be x or residual (each row is read before it is written) */
    int (*add_layer_norm)(int dtype, const void *x, const void *x_bias, const void *residual, const void *w,
                          const void *b, void *y, int64_t rows, int64_t cols, double eps, int nt);
    /* softmax's (log_softmax 0) or log_softmax's (1) input gradient over rows of cols (the
     * softmax axis last; the CPU's in cpu/train.c, CUDA leaves it NULL and the gradient rule
     * composes core ops): y, gy, gx [rows, cols] contiguous, y the forward's output;
     * softmax: gx = y (gy - sum(gy y)), log_softmax: gx = gy - exp(y) sum(gy), per row */
    int (*softmax_backward)(int dtype, int log_softmax, const void *y, const void *gy, void *gx, int64_t rows,
                            int64_t cols, int nt);
    /* attention_f32's gradients (the CPU's in cpu/attention_grad.c; CUDA leaves them NULL and the
     * gradient rule composes core ops): q, k, v, mask and g->scale as the forward's geometry
     * says, gy [b, h, sq, dv] with element strides g->os along b, h, sq (all 0: contiguous);
     * writes gq [b, h, sq, d], gk [b, h, sk, d], gv [b, h, sk, dv] heads-inner ([b, s, h, d] in
     * memory, as the forward's out) and, when gs is not NULL, the scores' gradient gs
     * [b, h, sq, sk] contiguous (the mask's, before reduction to its shape); the probabilities
     * are probs [b, h, sq, sk] contiguous as attention_train_f32 wrote them, or, probs NULL,
     * recomputed from q, k and mask. attention_train_f32: the forward (out heads-inner, its os
     * ignored) that also writes the probabilities to probs for the backward */
    int64_t (*attention_backward_workspace)(const mt_attn_geom *g, int nt);
    int (*attention_backward_f32)(const float *q, const float *k, const float *v, const float *mask,
                                  const float *probs, const float *gy, float *gq, float *gk, float *gv,
                                  float *gs, const mt_attn_geom *g, int nt, void *workspace);
    int (*attention_train_f32)(const float *q, const float *k, const float *v, const float *mask, float *out,
                               float *probs, const mt_attn_geom *g, int nt);
} mt_nn_kernels;

#endif
