# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Neural-network ops of the core: convolution, pooling, resize, pad.

Each op here owns its API: it checks its arguments (ValueError / TypeError
with the expected and the actual value), picks the device and the compute
dtype, makes its inputs contiguous, allocates the result and runs a C kernel
from ``kernels/cpu/{conv,pool,resize}.c`` (CUDA's: ``kernels/cuda/nn.cu``) with the GIL released.

Rules shared by every op (the same as the rest of the core):

- Layout NCHW. Tensor arguments may also be NumPy arrays or nested lists;
  those go to the device of the Tensor arguments.
- dtypes: float32 and float64 run natively; float16 and bfloat16 are computed
  in float32 and the result is cast back. Tensor arguments of different float
  dtypes are promoted (MegEngine's rule: NumPy's promote_types within floats).
  Integer or bool inputs raise TypeError (``pad`` takes every dtype).
- Devices: all tensor arguments on one device, else
  ``ValueError("ambiguous device: cpu:0 vs cpu:1")``; the result lives on that
  device. Only CPU devices have kernels here; others raise NotImplementedError
  naming the op, the device and the dtype.
- Sizes: kernel sizes, strides, padding, dilation, groups and output sizes
  are at most ``MAX_GEOMETRY`` (2**31 - 1: the int of the BLAS calls every
  dense convolution runs in, and the range of MegEngine's uint32 conv
  parameters). Sizes derived from them (output shapes, padded planes, work
  buffers) are computed with Python ints, or saturating C arithmetic for the
  kernels' work buffers, and checked before any memory is touched: a size
  past what a tensor can hold raises ValueError naming the argument.
- Each op is registered with ``@core_op`` (its row in op_table.py): for
  :func:`mgtrace._core.dispatch.apply` under its own name, and handed to
  the trace hook instead of running while module tracing is on.
"""
from libc.stdint cimport int64_t, intptr_t, uint64_t

import numpy as np

from collections import OrderedDict

from mgtrace._core.kernels cimport (MT_UINT8, MT_FLOAT16, MT_BFLOAT16, MT_FLOAT32, MT_FLOAT64,
                                    mt_storage_tracked)
from mgtrace._core.tensor cimport (Tensor, empty, view_of, numel, is_contiguous, shape_tuple,
                                   backend_of, backend_error, cpu_backend, on_host)
from mgtrace._core.tensor import missing_kernel, set_storage_end_listener, watch_storage
from mgtrace._core.dtype cimport CATEGORY, PROMOTE, ITEMSIZE
from mgtrace._core.device cimport Device, DEVICES, default_device_id
from mgtrace._core.dispatch cimport cast, coerce, copy_into, fill, num_threads, check_writable
from mgtrace._core.dispatch import core_op
from mgtrace._core.tensor import MAX_NUMEL
from mgtrace._core.dtype import NAMES as DTYPE_NAMES
from mgtrace._core import args as A
from mgtrace._core import fallbacks
from mgtrace._core.args import MAX_GEOMETRY
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.bytes cimport PyBytes_FromStringAndSize

cdef extern from "kernels/contract/geometry.h" nogil:
    int64_t mt_window_out(int64_t size, int64_t k, int64_t stride, int64_t pad, int64_t dil, int ceil_mode) noexcept

cdef extern from "kernels/cpu/nn.h" nogil:
    enum: MT_NN_ENOMEM, MT_NN_EOVERFLOW, MT_NN_NONFINITE
    enum:
        MT_CONV_AUTO, MT_CONV_GEMM1X1, MT_CONV_SHIFTED, MT_CONV_IM2COL, MT_CONV_DEPTHWISE,
        MT_CONV_WINOGRAD, MT_CONV_WINOGRAD4, MT_CONV_DIRECT, MT_CONV_BLOCKED
    ctypedef struct mt_conv2d_geom:
        int64_t n, c, h, w
        int64_t o, kh, kw
        int64_t oh, ow
        int64_t sh, sw, ph, pw, dh, dw
        int64_t groups
        int act
        int has_res
        int64_t res_delta
    int64_t mt_conv2d_workspace(int dtype, const mt_conv2d_geom *g, int algo, int nthreads) noexcept
    int mt_conv2d(int dtype, const void *x, const void *weight, const void *bias, void *y,
                  const mt_conv2d_geom *g, int algo, int nthreads, void *workspace) noexcept
    int64_t mt_conv_transpose2d_workspace(int dtype, const mt_conv2d_geom *g, int nthreads) noexcept
    int mt_conv_transpose2d(int dtype, const void *x, const void *weight, const void *bias, void *y,
                            const mt_conv2d_geom *g, int nthreads, void *workspace) noexcept
    int mt_conv2d_pick_algo(const mt_conv2d_geom *g) noexcept
    int mt_conv2d_direct_algo(const mt_conv2d_geom *g) noexcept
    int mt_wino_bound(int dtype, const mt_conv2d_geom *g) noexcept
    int mt_all_below(int dtype, const void *p, int64_t n, int k) noexcept
    void mt_conv2d_direct_force_narrow(int on) noexcept
    int mt_conv2d_pick_algo_ex(const mt_conv2d_geom *g, int w_cached) noexcept
    int mt_conv2d_packs_weights(int algo) noexcept
    int mt_conv2d_packed_layout(int algo) noexcept
    int64_t mt_conv2d_packed_bytes(int dtype, const mt_conv2d_geom *g, int algo, int layout) noexcept
    void mt_conv2d_pack_weights(int dtype, const void *weight, void *packed, const mt_conv2d_geom *g,
                                int algo, int layout, int nthreads) noexcept
    int64_t mt_conv2d_packed_workspace(int dtype, const mt_conv2d_geom *g, int algo, int layout,
                                       int nthreads) noexcept
    int mt_conv2d_packed(int dtype, const void *x, const void *packed, const void *bias, void *y,
                         const mt_conv2d_geom *g, int algo, int layout, int nthreads, void *workspace) noexcept
    int64_t mt_nchwc_blocks(int64_t channels) noexcept
    enum mt_nchwc_form:
        MT_NCHWC_PLAIN, MT_NCHWC_BLOCKED, MT_NCHWC_WINOGRAD, MT_NCHWC_WINOGRAD4
    int mt_conv2d_nchwc_form(const mt_conv2d_geom *g, int blocked, int winograd) noexcept
    int mt_nchwc_set_bands(int mode) noexcept
    int64_t mt_conv2d_nchwc_packed_bytes(const mt_conv2d_geom *g, int blocked) noexcept
    void mt_conv2d_nchwc_pack(const float *w, float *packed, const mt_conv2d_geom *g, int blocked) noexcept
    int64_t mt_conv2d_nchwc_workspace(const mt_conv2d_geom *g, int blocked, int nthreads) noexcept
    int mt_conv2d_nchwc(const float *x, int blocked, const float *packed, const float *bias, float *y,
                        const mt_conv2d_geom *g, int nthreads, void *workspace) noexcept
    int64_t mt_conv2d_nchwc_pw_dw_workspace(const mt_conv2d_geom *pw, const mt_conv2d_geom *dw,
                                            int nthreads) noexcept
    int mt_conv2d_nchwc_pw_dw(const float *x, const float *pw_packed, const float *pw_bias,
                              const float *dw_packed, const float *dw_bias, float *y,
                              const mt_conv2d_geom *pw, const mt_conv2d_geom *dw, int nthreads,
                              void *workspace) noexcept
    int64_t mt_conv2d_nchwc_pw_dw_pw_workspace(const mt_conv2d_geom *pw, const mt_conv2d_geom *dw,
                                               const mt_conv2d_geom *pj, int nthreads) noexcept
    int mt_conv2d_nchwc_pw_dw_pw(const float *x, const float *pw_packed, const float *pw_bias,
                                 const float *dw_packed, const float *dw_bias, const float *pj_packed,
                                 const float *pj_bias, float *y, const mt_conv2d_geom *pw,
                                 const mt_conv2d_geom *dw, const mt_conv2d_geom *pj, int nthreads,
                                 void *workspace) noexcept
    void mt_to_nchwc(const float *x, float *y, int64_t n, int64_t c, int64_t hw, int nthreads) noexcept
    void mt_from_nchwc(const float *x, float *y, int64_t n, int64_t c, int64_t hw, int nthreads) noexcept
    enum:
        MT_ACT_NONE, MT_ACT_RELU, MT_ACT_RELU6, MT_ACT_SILU, MT_ACT_HARDSWISH, MT_ACT_SIGMOID,
        MT_ACT_GELU
    int mt_bias_act(int dtype, void *y, int64_t rows, int64_t cols, const void *bias, int act,
                    int nthreads) noexcept
    ctypedef struct mt_attn_geom:
        int64_t b, h, sq, sk, d, dv
        int64_t qs[4]
        int64_t ks[4]
        int64_t vs[4]
        int64_t ms[4]
        float scale
        int64_t os[3]
    int mt_layer_norm(int dtype, const void *x, const void *w, const void *b, void *y, int64_t rows,
                      int64_t cols, double eps, int nthreads) noexcept
    int mt_add_layer_norm(int dtype, const void *x, const void *x_bias, const void *residual,
                          const void *w, const void *b, void *y, int64_t rows, int64_t cols, double eps,
                          int nthreads) noexcept
    int64_t mt_attention_workspace(const mt_attn_geom *g, int nthreads) noexcept
    int mt_attention_f32(const float *q, const float *k, const float *v, const float *mask,
                         float *out, const mt_attn_geom *g, int nthreads, void *workspace) noexcept

    ctypedef struct mt_pool2d_geom:
        int64_t planes, h, w, oh, ow
        int64_t kh, kw, sh, sw, ph, pw, dh, dw
        int count_include_pad
    int mt_max_pool2d(int dtype, const void *x, void *y, const mt_pool2d_geom *g, int nthreads) noexcept
    int mt_max_pool2d_nchwc(const float *x, float *y, const mt_pool2d_geom *g, int nthreads) noexcept
    int mt_avg_pool2d(int dtype, const void *x, void *y, const mt_pool2d_geom *g, int nthreads) noexcept
    enum: MT_ADAPTIVE_AVG, MT_ADAPTIVE_MAX
    int mt_adaptive_pool2d(int dtype, int op, const void *x, void *y, int64_t planes, int64_t h,
                           int64_t w, int64_t oh, int64_t ow, int nthreads) noexcept

    enum: MT_RESIZE_NEAREST, MT_RESIZE_BILINEAR
    int mt_resize2d(int dtype, int mode, const void *x, void *y, int64_t planes, int64_t h, int64_t w,
                    int64_t oh, int64_t ow, double scale_h, double scale_w, int align_corners,
                    int nthreads) noexcept

    enum: MT_PAD_REFLECT, MT_PAD_REPLICATE
    int mt_pad_index(const void *x, void *y, int ndim, const int64_t *shape, const int64_t *before,
                     const int64_t *after, int mode, int64_t itemsize, int nthreads) noexcept

    # backward kernels (grad.c)
    enum: MT_NN_EINDEX
    int mt_max_pool2d_backward(int dtype, const void *x, const void *gy, void *gx, const mt_pool2d_geom *g,
                               int nthreads) noexcept
    int mt_avg_pool2d_backward(int dtype, const void *gy, void *gx, const mt_pool2d_geom *g,
                               int nthreads) noexcept
    int mt_adaptive_pool2d_backward(int dtype, int op, const void *x, const void *gy, void *gx,
                                    int64_t planes, int64_t h, int64_t w, int64_t oh, int64_t ow,
                                    int nthreads) noexcept
    int mt_resize2d_backward(int dtype, int mode, const void *gy, void *gx, int64_t planes, int64_t h,
                             int64_t w, int64_t oh, int64_t ow, double scale_h, double scale_w,
                             int align_corners, int nthreads) noexcept
    int mt_conv2d_backward_weight(int dtype, const void *x, const void *gy, void *gw,
                                  const mt_conv2d_geom *g, int nthreads) noexcept
    int mt_index_add(int dtype, void *dst, int64_t rows, const int64_t *idx, int64_t n, const void *src,
                     int64_t inner, int nthreads) noexcept
    int mt_act_backward(int dtype, int act, const void *x, const void *gy, void *gx, int64_t n,
                        int nthreads) noexcept
    int mt_layer_norm_backward(int dtype, const void *x, const void *w, const void *gy, void *gx,
                               void *gw, void *gb, int64_t rows, int64_t cols, double eps,
                               int nthreads) noexcept

    # conv3d (conv3d.c)
    ctypedef struct mt_conv3d_geom:
        int64_t n, c, d, h, w
        int64_t o, kd, kh, kw
        int64_t od, oh, ow
        int64_t sd, sh, sw, pd, ph, pw, dd, dh, dw
        int64_t groups
    int mt_conv3d(int dtype, const void *x, const void *weight, const void *bias, void *y,
                  const mt_conv3d_geom *g, int nthreads) noexcept
    int mt_conv3d_backward_data(int dtype, const void *gy, const void *weight, void *gx,
                                const mt_conv3d_geom *g, int nthreads) noexcept
    int mt_conv3d_backward_weight(int dtype, const void *x, const void *gy, void *gw,
                                  const mt_conv3d_geom *g, int nthreads) noexcept
    # one recurrent step (rnn_cell.c)
    int mt_lstm_cell(int dtype, const void *gx, const void *h, const void *c, const void *w_hh,
                     const void *b_hh, void *h_out, void *c_out, int64_t n, int64_t hidden,
                     int64_t h_width, int nthreads) noexcept
    int mt_rnn_cell(int dtype, int relu, const void *gx, const void *h, const void *w_hh, const void *b_hh,
                    void *h_out, int64_t n, int64_t hidden, int nthreads) noexcept
    # local response normalization (lrn.c)
    int mt_lrn(int dtype, const void *x, void *y, int64_t outer, int64_t c, int64_t inner, int64_t n,
               double k, double alpha, double beta, int nthreads) noexcept
    # training kernels (train.c)
    int mt_batch_norm_train(int dtype, const void *x, const void *w, const void *b, void *y, void *mean,
                            void *var, int64_t outer, int64_t c, int64_t inner, double eps,
                            int nthreads) noexcept
    int mt_batch_norm_backward(int dtype, const void *x, const void *w, const void *gy, void *gx, void *gw,
                               void *gb, int64_t outer, int64_t c, int64_t inner, double eps,
                               int nthreads) noexcept
    int mt_sgd_step(int dtype, void *p, const void *g, void *buf, int64_t n, double lr, double momentum,
                    double weight_decay, int nesterov, int first, int nthreads) noexcept
    int mt_softmax_backward(int dtype, int log_softmax, const void *y, const void *gy, void *gx,
                            int64_t rows, int64_t cols, int nthreads) noexcept
    int64_t mt_attention_backward_workspace(const mt_attn_geom *g, int nthreads) noexcept
    int mt_attention_backward_f32(const float *q, const float *k, const float *v, const float *mask,
                                  const float *probs, const float *gy, float *gq, float *gk, float *gv,
                                  float *gs, const mt_attn_geom *g, int nthreads, void *workspace) noexcept
    int mt_attention_train_f32(const float *q, const float *k, const float *v, const float *mask,
                               float *out, float *probs, const mt_attn_geom *g, int nthreads) noexcept

    # this area's kernels on a device type (the CPU's below, a backend's from backend.h)
    ctypedef struct mt_nn_kernels:
        int64_t (*conv2d_workspace)(int dtype, const mt_conv2d_geom *g, int algo, int nt) noexcept nogil
        int (*conv2d)(int dtype, const void *x, const void *weight, const void *bias, void *y,
                      const mt_conv2d_geom *g, int algo, int nt, void *workspace) noexcept nogil
        int (*max_pool2d)(int dtype, const void *x, void *y, const mt_pool2d_geom *g, int nt) noexcept nogil
        int (*avg_pool2d)(int dtype, const void *x, void *y, const mt_pool2d_geom *g, int nt) noexcept nogil
        int (*adaptive_pool2d)(int dtype, int op, const void *x, void *y, int64_t planes, int64_t h,
                               int64_t w, int64_t oh, int64_t ow, int nt) noexcept nogil
        int (*resize2d)(int dtype, int mode, const void *x, void *y, int64_t planes, int64_t h,
                        int64_t w, int64_t oh, int64_t ow, double scale_h, double scale_w,
                        int align_corners, int nt) noexcept nogil
        int (*bias_act)(int dtype, void *y, int64_t rows, int64_t cols, const void *bias, int act,
                        int nt) noexcept nogil
        int64_t (*conv_transpose2d_workspace)(int dtype, const mt_conv2d_geom *g, int nt) noexcept nogil
        int (*conv_transpose2d)(int dtype, const void *x, const void *weight, const void *bias, void *y,
                                const mt_conv2d_geom *g, int nt, void *workspace) noexcept nogil
        int (*pad_index)(const void *x, void *y, int ndim, const int64_t *shape, const int64_t *before,
                         const int64_t *after, int mode, int64_t itemsize, int nt) noexcept nogil
        int (*layer_norm)(int dtype, const void *x, const void *w, const void *b, void *y,
                          int64_t rows, int64_t cols, double eps, int nt) noexcept nogil
        int64_t (*attention_workspace)(const mt_attn_geom *g, int nt) noexcept nogil
        int (*attention_f32)(const float *q, const float *k, const float *v, const float *mask,
                             float *out, const mt_attn_geom *g, int nt, void *workspace) noexcept nogil
        void (*to_nchwc)(const float *x, float *y, int64_t n, int64_t c, int64_t hw, int nt) noexcept nogil
        void (*from_nchwc)(const float *x, float *y, int64_t n, int64_t c, int64_t hw, int nt) noexcept nogil
        int (*conv2d_nchwc)(const float *x, int blocked, const float *packed, const float *bias,
                            float *y, const mt_conv2d_geom *g, int nt, void *workspace) noexcept nogil
        int (*conv2d_nchwc_pw_dw)(const float *x, const float *pw_packed, const float *pw_bias,
                                  const float *dw_packed, const float *dw_bias, float *y,
                                  const mt_conv2d_geom *pw, const mt_conv2d_geom *dw, int nt,
                                  void *workspace) noexcept nogil
        int (*conv2d_nchwc_pw_dw_pw)(const float *x, const float *pw_packed, const float *pw_bias,
                                     const float *dw_packed, const float *dw_bias,
                                     const float *pj_packed, const float *pj_bias, float *y,
                                     const mt_conv2d_geom *pw, const mt_conv2d_geom *dw,
                                     const mt_conv2d_geom *pj, int nt, void *workspace) noexcept nogil
        int (*max_pool2d_nchwc)(const float *x, float *y, const mt_pool2d_geom *g, int nt) noexcept nogil
        int (*conv2d_packed)(int dtype, const void *x, const void *packed, const void *bias, void *y,
                             const mt_conv2d_geom *g, int algo, int layout, int nt,
                             void *workspace) noexcept nogil
        int (*max_pool2d_backward)(int dtype, const void *x, const void *gy, void *gx,
                                   const mt_pool2d_geom *g, int nt) noexcept nogil
        int (*avg_pool2d_backward)(int dtype, const void *gy, void *gx, const mt_pool2d_geom *g,
                                   int nt) noexcept nogil
        int (*adaptive_pool2d_backward)(int dtype, int op, const void *x, const void *gy, void *gx,
                                        int64_t planes, int64_t h, int64_t w, int64_t oh, int64_t ow,
                                        int nt) noexcept nogil
        int (*resize2d_backward)(int dtype, int mode, const void *gy, void *gx, int64_t planes, int64_t h,
                                 int64_t w, int64_t oh, int64_t ow, double scale_h, double scale_w,
                                 int align_corners, int nt) noexcept nogil
        int (*conv2d_backward_weight)(int dtype, const void *x, const void *gy, void *gw,
                                      const mt_conv2d_geom *g, int nt) noexcept nogil
        int (*index_add)(int dtype, void *dst, int64_t rows, const int64_t *idx, int64_t n,
                         const void *src, int64_t inner, int nt) noexcept nogil
        int (*act_backward)(int dtype, int act, const void *x, const void *gy, void *gx, int64_t n,
                            int nt) noexcept nogil
        int (*layer_norm_backward)(int dtype, const void *x, const void *w, const void *gy, void *gx,
                                   void *gw, void *gb, int64_t rows, int64_t cols, double eps,
                                   int nt) noexcept nogil
        int (*conv3d)(int dtype, const void *x, const void *weight, const void *bias, void *y,
                      const mt_conv3d_geom *g, int nt) noexcept nogil
        int (*conv3d_backward_data)(int dtype, const void *gy, const void *weight, void *gx,
                                    const mt_conv3d_geom *g, int nt) noexcept nogil
        int (*conv3d_backward_weight)(int dtype, const void *x, const void *gy, void *gw,
                                      const mt_conv3d_geom *g, int nt) noexcept nogil
        int (*lstm_cell)(int dtype, const void *gx, const void *h, const void *c, const void *w_hh,
                         const void *b_hh, void *h_out, void *c_out, int64_t n, int64_t hidden,
                         int64_t h_width, int nt) noexcept nogil
        int (*rnn_cell)(int dtype, int relu, const void *gx, const void *h, const void *w_hh,
                        const void *b_hh, void *h_out, int64_t n, int64_t hidden, int nt) noexcept nogil
        int (*lrn)(int dtype, const void *x, void *y, int64_t outer, int64_t c, int64_t inner,
                   int64_t n, double k, double alpha, double beta, int nt) noexcept nogil
        int (*batch_norm_train)(int dtype, const void *x, const void *w, const void *b, void *y,
                                void *mean, void *var, int64_t outer, int64_t c, int64_t inner,
                                double eps, int nt) noexcept nogil
        int (*batch_norm_backward)(int dtype, const void *x, const void *w, const void *gy, void *gx,
                                   void *gw, void *gb, int64_t outer, int64_t c, int64_t inner,
                                   double eps, int nt) noexcept nogil
        int (*sgd_step)(int dtype, void *p, const void *g, void *buf, int64_t n, double lr,
                        double momentum, double weight_decay, int nesterov, int first,
                        int nt) noexcept nogil
        int (*add_layer_norm)(int dtype, const void *x, const void *x_bias, const void *residual,
                              const void *w, const void *b, void *y, int64_t rows, int64_t cols,
                              double eps, int nt) noexcept nogil
        int (*softmax_backward)(int dtype, int log_softmax, const void *y, const void *gy, void *gx,
                                int64_t rows, int64_t cols, int nt) noexcept nogil
        int64_t (*attention_backward_workspace)(const mt_attn_geom *g, int nt) noexcept nogil
        int (*attention_backward_f32)(const float *q, const float *k, const float *v, const float *mask,
                                      const float *probs, const float *gy, float *gq, float *gk, float *gv,
                                      float *gs, const mt_attn_geom *g, int nt, void *workspace) noexcept nogil
        int (*attention_train_f32)(const float *q, const float *k, const float *v, const float *mask,
                                   float *out, float *probs, const mt_attn_geom *g, int nt) noexcept nogil

cdef extern from *:
    """
    /* conv.c: route OpenBLAS's threaded calls to OpenMP threads */
    void mt_nn_blas_threads_init(void);
    """
    void mt_nn_blas_threads_init() noexcept nogil

# One thread pool for the process: OpenBLAS's threaded calls (matmul's as
# well as any other) run their jobs on OpenMP threads from here on, so that
# OpenBLAS's own workers never spin against the OpenMP kernels (conv.c,
# "Threads", has the measurements).
mt_nn_blas_threads_init()

__all__ = ["conv2d", "conv2d_act", "conv2d_nchwc", "conv2d_nchwc_pw_dw", "conv2d_nchwc_pw_dw_pw", "to_nchwc", "from_nchwc", "max_pool2d_nchwc", "attention", "conv_transpose2d", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d",
           "adaptive_max_pool2d", "interpolate", "pad", "conv3d", "conv_transpose3d", "lstm_cell", "rnn_cell"]

CONV_ALGOS = {"auto": MT_CONV_AUTO, "gemm1x1": MT_CONV_GEMM1X1, "shifted": MT_CONV_SHIFTED,
              "im2col": MT_CONV_IM2COL, "depthwise": MT_CONV_DEPTHWISE, "winograd": MT_CONV_WINOGRAD,
              "winograd4": MT_CONV_WINOGRAD4, "direct": MT_CONV_DIRECT, "blocked": MT_CONV_BLOCKED}
_ALGO_NAMES = {v: k for k, v in CONV_ALGOS.items()}
# the activations a fused conv2d / linear applies after its bias (enum mt_act, nn.h)
ACTIVATIONS = {"none": MT_ACT_NONE, "relu": MT_ACT_RELU, "relu6": MT_ACT_RELU6, "silu": MT_ACT_SILU,
               "hardswish": MT_ACT_HARDSWISH, "sigmoid": MT_ACT_SIGMOID, "gelu": MT_ACT_GELU}
_INTERP_MODES = {"nearest": MT_RESIZE_NEAREST, "bilinear": MT_RESIZE_BILINEAR}
_PAD_MODES = ("constant", "reflect", "replicate", "circular")

# MAX_GEOMETRY (mgtrace._core.args): the largest kernel size, stride, padding,
# dilation, group count or output size the nn ops take, 2**31 - 1, BLAS's int

cdef int64_t _BLAS_INT_MAX = 2147483647


# ------------------------------------------------------------------ helpers

cdef str _dev(int device):
    return str(DEVICES[device])


cdef list _operands(str op, tuple xs):
    """The tensor arguments as Tensors on one device (None stays None).

    Raises ValueError("ambiguous device: a vs b") when Tensors disagree and
    NotImplementedError for a device without kernels here."""
    cdef int dev = -1
    cdef Tensor t
    for x in xs:
        if isinstance(x, Tensor):
            t = <Tensor>x
            if dev < 0:
                dev = t._device
            elif t._device != dev:
                raise ValueError(f"ambiguous device: {_dev(dev)} vs {_dev(t._device)}")
    if dev < 0:
        dev = default_device_id
    out = []
    for x in xs:
        if x is None or isinstance(x, Tensor):
            out.append(x)
        else:
            out.append(coerce(x, dev))
    return out


cdef Tensor _operand1(str op, object x):
    """The one tensor argument x as a Tensor; TypeError for None (a cast of
    None to Tensor would read garbage memory)."""
    if x is None:
        raise TypeError(f"{op}: x must be a tensor, got None")
    return <Tensor>_operands(op, (x,))[0]


# ------------------------------------------------------------------ kernel tables by device type

cdef mt_nn_kernels _CPU
_CPU.conv2d_workspace = mt_conv2d_workspace
_CPU.conv2d = mt_conv2d
_CPU.max_pool2d = mt_max_pool2d
_CPU.avg_pool2d = mt_avg_pool2d
_CPU.adaptive_pool2d = mt_adaptive_pool2d
_CPU.resize2d = mt_resize2d
_CPU.bias_act = mt_bias_act
_CPU.conv_transpose2d_workspace = mt_conv_transpose2d_workspace
_CPU.conv_transpose2d = mt_conv_transpose2d
_CPU.pad_index = mt_pad_index
_CPU.layer_norm = mt_layer_norm
_CPU.attention_workspace = mt_attention_workspace
_CPU.attention_f32 = mt_attention_f32
_CPU.to_nchwc = mt_to_nchwc
_CPU.from_nchwc = mt_from_nchwc
_CPU.conv2d_nchwc = mt_conv2d_nchwc
_CPU.conv2d_nchwc_pw_dw = mt_conv2d_nchwc_pw_dw
_CPU.conv2d_nchwc_pw_dw_pw = mt_conv2d_nchwc_pw_dw_pw
_CPU.max_pool2d_nchwc = mt_max_pool2d_nchwc
_CPU.conv2d_packed = mt_conv2d_packed
_CPU.max_pool2d_backward = mt_max_pool2d_backward
_CPU.avg_pool2d_backward = mt_avg_pool2d_backward
_CPU.adaptive_pool2d_backward = mt_adaptive_pool2d_backward
_CPU.resize2d_backward = mt_resize2d_backward
_CPU.conv2d_backward_weight = mt_conv2d_backward_weight
_CPU.index_add = mt_index_add
_CPU.act_backward = mt_act_backward
_CPU.layer_norm_backward = mt_layer_norm_backward
_CPU.conv3d = mt_conv3d
_CPU.conv3d_backward_data = mt_conv3d_backward_data
_CPU.conv3d_backward_weight = mt_conv3d_backward_weight
_CPU.lstm_cell = mt_lstm_cell
_CPU.rnn_cell = mt_rnn_cell
_CPU.lrn = mt_lrn
_CPU.batch_norm_train = mt_batch_norm_train
_CPU.batch_norm_backward = mt_batch_norm_backward
_CPU.sgd_step = mt_sgd_step
_CPU.add_layer_norm = mt_add_layer_norm
_CPU.softmax_backward = mt_softmax_backward
_CPU.attention_backward_workspace = mt_attention_backward_workspace
_CPU.attention_backward_f32 = mt_attention_backward_f32
_CPU.attention_train_f32 = mt_attention_train_f32
cpu_backend().nn = &_CPU          # the CPU backend's nn member


cdef object _no_kernel(str op, Tensor t):
    return missing_kernel(op, t._device, t._dtype)


cdef const mt_nn_kernels *_kernels(str op, Tensor t) except NULL:
    """The nn kernels of t's device backend (a member may still be NULL:
    check it with _need)."""
    cdef const mt_nn_kernels *k = <const mt_nn_kernels *>backend_of(t._device).nn
    if k == NULL:
        raise _no_kernel(op, t)
    return k


def _has_kernel(str op, int device, int dtype):
    """Whether ``device``'s nn table has op's kernel for dtype code ``dtype``
    (the NCHW16c kernels and fused attention take float32 only, by their
    signatures; the others any float dtype); None for another area's op
    (see has_kernel)."""
    cdef const mt_nn_kernels *k = <const mt_nn_kernels *>backend_of(device).nn
    cdef bint f32_only = True, present
    if k == NULL:
        return False if op in _NN_KERNEL_OPS else None
    if op in ("conv2d", "conv2d_act"):
        present, f32_only = k.conv2d != NULL and k.conv2d_workspace != NULL, False
    elif op == "conv2d_nchwc":
        present = k.conv2d_nchwc != NULL
    elif op == "conv2d_nchwc_pw_dw":
        present = k.conv2d_nchwc_pw_dw != NULL
    elif op == "conv2d_nchwc_pw_dw_pw":
        present = k.conv2d_nchwc_pw_dw_pw != NULL
    elif op == "to_nchwc":
        present = k.to_nchwc != NULL
    elif op == "from_nchwc":
        present = k.from_nchwc != NULL
    elif op == "max_pool2d_nchwc":
        present = k.max_pool2d_nchwc != NULL
    elif op == "attention":
        present = k.attention_f32 != NULL and k.attention_workspace != NULL
    elif op == "conv_transpose2d":
        present, f32_only = k.conv_transpose2d != NULL and k.conv_transpose2d_workspace != NULL, False
    elif op in ("conv3d", "conv_transpose3d"):
        present, f32_only = (k.conv3d if op == "conv3d" else k.conv3d_backward_data) != NULL, False
    elif op == "lstm_cell":
        present, f32_only = k.lstm_cell != NULL, False
    elif op == "rnn_cell":
        present, f32_only = k.rnn_cell != NULL, False
    elif op == "max_pool2d":
        present, f32_only = k.max_pool2d != NULL, False
    elif op == "avg_pool2d":
        present, f32_only = k.avg_pool2d != NULL, False
    elif op in ("adaptive_avg_pool2d", "adaptive_max_pool2d"):
        present, f32_only = k.adaptive_pool2d != NULL, False
    elif op == "interpolate":
        present, f32_only = k.resize2d != NULL, False
    elif op == "pad":
        present, f32_only = k.pad_index != NULL, False
    elif op == "layer_norm":
        present, f32_only = k.layer_norm != NULL, False
    elif op == "bias_act":
        present, f32_only = k.bias_act != NULL, False
    else:
        return None
    if not present:
        return False
    return dtype == MT_FLOAT32 if f32_only else CATEGORY[dtype] == 3


_NN_KERNEL_OPS = frozenset({
    "conv2d", "conv2d_act", "conv2d_nchwc", "conv2d_nchwc_pw_dw", "conv2d_nchwc_pw_dw_pw",
    "to_nchwc", "from_nchwc", "max_pool2d_nchwc", "attention", "conv_transpose2d", "max_pool2d",
    "avg_pool2d", "adaptive_avg_pool2d", "adaptive_max_pool2d", "interpolate", "pad",
    "layer_norm", "bias_act", "conv3d", "conv_transpose3d",
    "lstm_cell", "rnn_cell"})


cdef int _need(bint present, str op, Tensor t) except -1:
    if not present:
        raise _no_kernel(op, t)
    return 0




cdef int _float_code(str op, list ts) except -1:
    """The promoted float dtype of the tensors in ts; TypeError for any other."""
    cdef int code = -1, c
    for x in ts:
        if x is None:
            continue
        c = (<Tensor>x)._dtype
        if CATEGORY[c] != 3:
            raise TypeError(f"{op}: expected floating-point tensors, got {DTYPE_NAMES[c]}; "
                            f"convert with .astype('float32')")
        code = c if code < 0 else PROMOTE[code][c]
    return code


cdef inline int _work_code(int code) noexcept:
    """The dtype the kernels compute ``code`` in (half types in float32)."""
    return MT_FLOAT32 if code == MT_FLOAT16 or code == MT_BFLOAT16 else code


cdef Tensor _ready(Tensor t, int work):
    """t as a contiguous tensor of dtype ``work``."""
    if t._dtype != work:
        return cast(t, work)
    return t if is_contiguous(t) else <Tensor>t.contiguous()


cdef Tensor _finish(Tensor out, int code):
    return out if out._dtype == code else cast(out, code)


cdef bint _is_int(object v):
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


cdef int64_t _MAX_GEOMETRY = MAX_GEOMETRY
cdef int64_t _NUMEL_MAX = MAX_NUMEL


cdef inline bint _small_int(object v, int minimum):
    """Whether v is a plain int in [minimum, MAX_GEOMETRY], compared in C."""
    cdef int overflow = 0
    cdef long long i
    if type(v) is not int:
        return False
    i = PyLong_AsLongLongAndOverflow(v, &overflow)
    return overflow == 0 and minimum <= i <= _MAX_GEOMETRY


cdef tuple _pair(str op, str name, object v, int minimum):
    """An int or a pair of ints as (a, b), each in [minimum, MAX_GEOMETRY].
    The common case is checked here (plain ints first, in C: a conv call
    checks three pairs, and Python's comparisons cost it a microsecond);
    anything else goes to mgtrace._core.args.pair, which normalizes it or
    raises the error F and M raise for the same argument."""
    if type(v) is tuple and len(<tuple>v) == 2 and _small_int((<tuple>v)[0], minimum) \
            and _small_int((<tuple>v)[1], minimum):
        return <tuple>v
    if _small_int(v, minimum):
        return (v, v)
    if _is_int(v):
        a = b = v
    elif isinstance(v, (tuple, list)) and len(v) == 2 and _is_int(v[0]) and _is_int(v[1]):
        a, b = v
    else:
        return A.pair(op, name, v, minimum)
    if a < minimum or b < minimum or a > MAX_GEOMETRY or b > MAX_GEOMETRY:
        return A.pair(op, name, v, minimum)
    return (int(a), int(b))


cdef tuple _positive(str op, str name, object v):
    return _pair(op, name, v, 1)


cdef tuple _nonneg(str op, str name, object v):
    return _pair(op, name, v, 0)


cdef object _groups(str op, object groups):
    if _is_int(groups) and 1 <= groups <= MAX_GEOMETRY:
        return int(groups)
    return A.to_size(op, "groups", groups, 1)


cdef int _check_numel(str op, tuple shape, str cause) except -1:
    """ValueError when a result of ``shape`` (Python ints, computed from the
    arguments) could not be a tensor: its element count past 2**62, which
    also keeps every entry within int64 before it reaches C."""
    cdef object n = 1
    for s in shape:
        n *= s
    if any(s > MAX_NUMEL for s in shape) or n > MAX_NUMEL:
        raise ValueError(f"{op}: {cause} give an output of shape {shape}, more elements than a "
                         f"tensor can hold (2**62)")
    return 0


cdef int _check_4d(str op, str name, Tensor t, str layout) except -1:
    if t._ndim != 4:
        raise ValueError(f"{op}: expected {name} of shape {layout} (4-D), got shape {shape_tuple(t)}")
    return 0


cdef inline bint _over_blas(int64_t a, int64_t b) noexcept:
    """a * b > _BLAS_INT_MAX for a, b >= 0, without the product (it may pass int64)."""
    return b != 0 and a > _BLAS_INT_MAX // b


cdef int _check_blas(str op, tuple sizes) except -1:
    for s in sizes:
        if s > _BLAS_INT_MAX:
            raise ValueError(f"{op}: a dimension product of {s} exceeds the 32-bit BLAS limit "
                             f"({_BLAS_INT_MAX}); split the input")
    return 0


cdef Tensor _workspace(str op, int64_t nbytes, int device, object geometry):
    """Kernel scratch memory from the core's allocator (it caches large
    blocks, so repeated calls do not pay fresh page faults); None for 0.
    ValueError when the kernel's plan for ``geometry`` (a description of the
    arguments for the message; the convolutions format it only when nbytes
    is MT_NN_EOVERFLOW: formatting shapes, or a closure doing it, on every
    call cost more than a small convolution's arithmetic) needs more bytes
    than int64 counts."""
    if nbytes == MT_NN_EOVERFLOW:
        raise ValueError(f"{op}: the kernel's work buffer for {geometry} needs more bytes than "
                         f"int64 counts; use less padding or split the input")
    if nbytes <= 0:
        return None
    return empty(1, &nbytes, MT_UINT8, device)


cdef int _check_rc(str op, int rc, int device=0) except -1:
    """MemoryError for a kernel's failed work buffer in host memory, else the
    backend's error (its own message: a CUDA error string)."""
    if rc == 0:
        return 0
    if rc == MT_NN_ENOMEM and on_host(device):
        raise MemoryError(f"{op}: cannot allocate the kernel's work buffer")
    raise backend_error(device, rc, op)


# ----------------------------------------------------------- packed weights

# The weights as WINOGRAD (its transformed U: 16 values per 3x3 kernel, 16/9
# of the weight's bytes), DIRECT and BLOCKED (blocks of output channels
# interleaved for their micro-kernels) read them are a function of the
# weight and the groups alone, and
# the weights of a loaded or optimized module do not change between calls:
# packing them once instead of on every call saves a pass over the weights
# (about 10% of a ResNet-18 layer at batch 1 for WINOGRAD; for DIRECT on
# 512 channels of 7x7, a third of the layer), and lets WINOGRAD pay on fewer
# tiles. An entry is keyed by the algorithm, its packed layout and the
# groups, the weight's storage (its uid, unique over the process's
# lifetime), the view's offset, shape and strides, and the compute dtype; it
# holds the storage's version from before the packing, so a weight written
# in place since, or during it from another thread (every mgtrace write
# bumps the version; see dispatch.check_writable), is packed afresh, never
# served stale. A storage others may write unseen (memory imported through
# DLPack, read-only or not, unless the archive reader vouched for its
# mapping; or exported writable) is never cached.
# Least recently used entries go first past WEIGHT_CACHE_BYTES; the entries
# of a weight whose storage is freed go with it (the storage-end listener:
# a dead weight's pack would otherwise stay until pushed out).
WEIGHT_CACHE_BYTES = 256 << 20
# (None for weights a Winograd algorithm must not use: see _wino_unfit)
_weight_cache = OrderedDict()     # key -> (version, packed weights or None, storage uid)
_weight_cache_bytes = 0
_keys_by_uid = {}                 # storage uid -> its keys in _weight_cache


def _weight_storage_ended(uid):
    """Drops the packed weights of a storage that was just freed."""
    global _weight_cache_bytes
    for key in _keys_by_uid.pop(uid, ()):
        gone = _weight_cache.pop(key, None)
        if gone is not None:
            _weight_cache_bytes -= _entry_bytes(gone[1])


set_storage_end_listener(_weight_storage_ended)


def weight_cache_info():
    """(entries, bytes) of conv2d's cache of packed weights."""
    return len(_weight_cache), _weight_cache_bytes


def clear_weight_cache():
    """Drops conv2d's cached packed weights (they are rebuilt on use)."""
    global _weight_cache_bytes
    _weight_cache.clear()
    _keys_by_uid.clear()
    _weight_cache_bytes = 0


cdef bytes _weight_key(Tensor w, int work, int algo, int layout, int64_t groups):
    """The cache key of weight view ``w`` packed for ``algo`` in ``layout``
    with ``groups`` and computed in dtype ``work``, or None when its
    storage's writes are not all seen (mt_storage_tracked). One bytes
    record of int64s, hashed and compared in C: a tuple of tuples cost a
    microsecond a conv call, more than a small conv's arithmetic."""
    if not mt_storage_tracked(w._st):
        return None
    cdef int64_t rec[8 + 2 * 16]
    cdef int i, nd = w._ndim
    rec[0], rec[1], rec[2], rec[3] = algo, layout, groups, <int64_t>w._st.uid
    rec[4], rec[5], rec[6], rec[7] = <int64_t>(w._data - w._st.ptr), w._dtype, work, nd
    for i in range(nd):
        rec[8 + i] = w._shape[i]
        rec[8 + nd + i] = w._strides[i]
    return PyBytes_FromStringAndSize(<char *>rec, (8 + 2 * nd) * <Py_ssize_t>sizeof(int64_t))


# _packed_weights' algo for conv2d_nchwc's weights (its layout: an
# mt_nchwc_form); not an mt_conv_algo
cdef int _NCHWC = 1000


cdef bint _wino_unfit(Tensor w, int work, mt_conv2d_geom *g, int algo, int layout) noexcept:
    """Whether ``algo`` / ``layout`` is a Winograd one and the weights ``w``
    (contiguous, dtype ``work``) hold a NaN, an inf or a magnitude past its
    bound (mt_wino_bound), so that the call must run on a direct kernel:
    Winograd mixes an infinite weight into points of U where the direct
    sum keeps it out (inf - inf = NaN), and overflows in its transforms on
    huge ones. One pass over the weights when they are packed (cached with
    them), not every call."""
    cdef bint wino = (layout == MT_NCHWC_WINOGRAD or layout == MT_NCHWC_WINOGRAD4) if algo == _NCHWC else \
        (algo == MT_CONV_WINOGRAD or algo == MT_CONV_WINOGRAD4)
    return wino and not mt_all_below(work, w._data, numel(w), mt_wino_bound(work, g))

# conv2d_nchwc's Winograd: -1 as mt_conv2d_nchwc_form picks, 0 never, 1
# F(2x2) and 2 F(4x4) wherever it applies (for tests and benchmarks: see
# _set_nchwc_winograd)
cdef int _nchwc_winograd = -1
_WINOGRAD_MODES = {None: -1, False: 0, 2: 1, 4: 2}


def _set_nchwc_winograd(mode):
    """Sets how conv2d_nchwc runs a dense 3x3, stride-1 conv: None (as
    the shapes say), False (its direct kernel), 2 or 4 (Winograd F(2x2,
    3x3) or F(4x4, 3x3) wherever it applies); returns the previous
    setting. For tests and benchmarks, which compare the algorithms."""
    global _nchwc_winograd
    if mode not in _WINOGRAD_MODES:     # (True is 1: not a mode)
        raise ValueError(f"_set_nchwc_winograd: mode must be None, False, 2 or 4, got {mode!r}")
    old = next(k for k, v in _WINOGRAD_MODES.items() if v == _nchwc_winograd)
    _nchwc_winograd = _WINOGRAD_MODES[mode]
    return old


def _set_nchwc_bands(mode):
    """Sets how a direct conv2d_nchwc on several threads orders its tasks
    where each thread would otherwise read the whole input once per pair of
    output blocks: None (as the CPU says: row bands on Intel), False (never
    in bands) or True (in bands wherever the input outweighs the weights);
    returns the previous setting. For tests and benchmarks: the bits are
    the same either way."""
    modes = {None: -1, False: 0, True: 1}
    if mode not in modes:
        raise ValueError(f"_set_nchwc_bands: mode must be None, False or True, got {mode!r}")
    old = mt_nchwc_set_bands(modes[mode])
    return {-1: None, 0: False, 1: True}[old]


cdef inline int64_t _entry_bytes(object u):
    return 0 if u is None else numel(<Tensor>u)


cdef Tensor _packed_weights(Tensor w_orig, Tensor w, int work, mt_conv2d_geom *g, int algo, int layout, int nt):
    """The weights ``w`` (``w_orig`` made contiguous in dtype ``work``)
    packed for ``algo`` in ``layout`` (Winograd's U, DIRECT's blocks), from
    the cache when ``w_orig`` has not been written since; None when the
    algorithm is a Winograd one and the weights are unfit for it
    (_wino_unfit: the caller then runs a direct kernel), remembered in the
    cache as well until the weight is written."""
    global _weight_cache_bytes
    # (groups too: DIRECT and BLOCKED pad each group's last block)
    key = _weight_key(w_orig, work, algo, layout, g.groups)
    # the version before packing: a write from another thread while the
    # packing runs (without the GIL) leaves an entry that the next call
    # finds stale, never one that looks current
    cdef uint64_t version = w_orig._st.version
    if key is not None:
        hit = _weight_cache.get(key)
        if hit is not None and hit[0] == version:
            _weight_cache.move_to_end(key)
            return <Tensor>hit[1]
    cdef int64_t nbytes = 0
    cdef Tensor u = None
    if not _wino_unfit(w, work, g, algo, layout):
        nbytes = mt_conv2d_nchwc_packed_bytes(g, layout) if algo == _NCHWC else \
            mt_conv2d_packed_bytes(work, g, algo, layout)
        u = _workspace("conv2d", nbytes, w._device, "the packed weights")
        with nogil:
            if algo == _NCHWC:
                mt_conv2d_nchwc_pack(<const float *>w._data, <float *>u._data, g, layout)
            else:
                mt_conv2d_pack_weights(work, w._data, u._data, g, algo, layout, nt)
    if key is None or nbytes > WEIGHT_CACHE_BYTES:
        return u
    old = _weight_cache.pop(key, None)
    if old is not None:
        _weight_cache_bytes -= _entry_bytes(old[1])
    uid = w_orig._st.uid
    keys = _keys_by_uid.get(uid)
    if keys is None:
        keys = _keys_by_uid[uid] = set()
        watch_storage(w_orig)
    keys.add(key)
    _weight_cache[key] = (version, u, uid)
    _weight_cache_bytes += nbytes
    while _weight_cache_bytes > WEIGHT_CACHE_BYTES:
        gone_key, (_, gone, gone_uid) = _weight_cache.popitem(last=False)
        _weight_cache_bytes -= _entry_bytes(gone)
        keys = _keys_by_uid.get(gone_uid)
        if keys is not None:
            keys.discard(gone_key)
            if not keys:
                del _keys_by_uid[gone_uid]
    return u


# ------------------------------------------------------------------ convolution

cdef tuple _conv_operands(str op, x, weight, bias):
    ts = _operands(op, (x, weight, bias))
    cdef int code = _float_code(op, ts)
    return ts[0], ts[1], ts[2], code


@core_op
def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """2-D convolution (cross-correlation, as in PyTorch and MegEngine).

    Args:
        x: float [N, C, H, W].
        weight: float [O, C / groups, KH, KW].
        bias: float [O] or None.
        stride, padding, dilation: int or (h, w) pair; stride and dilation
            >= 1, padding >= 0 (zeros).
        groups: int >= 1 dividing C and O.

    Returns:
        [N, O, OH, OW] with OH = (H + 2*ph - dh*(KH-1) - 1) // sh + 1 (OW alike),
        in the promoted float dtype of the arguments, on their device.

    Raises:
        ValueError: wrong ndim, channel/groups/bias mismatch, a kernel larger
            than the padded input, non-positive stride or dilation, negative
            padding, tensors on different devices.
        TypeError: integer or bool tensors; non-int geometry arguments.
        NotImplementedError: a device with no CPU kernels.

    Algorithms (picked by shape, see ``conv2d_algorithm``): Winograd
    F(4x4, 3x3) or F(2x2, 3x3) for 3x3 stride-1 convs with >= 16 channels
    (Lavin & Gray; F(4x4) on planes with many 4x4 tiles, 28x28 and up at
    batch 1). Their transforms round: F(2x2) differs from a direct sum by a
    few float32 ulps, F(4x4) by up to about 5e-6 of the output's largest
    magnitude (512 input channels). Shifted
    GEMMs over a padded copy, tiled im2col, a plain GEMM for 1x1, and direct
    loops for depthwise convs (one input channel per group). Apart from
    depthwise, every multiply-add runs in BLAS sgemm/dgemm.

    >>> import mgtrace as mt
    >>> x = mt.tensor(np.ones((1, 2, 4, 4), np.float32))
    >>> w = mt.tensor(np.ones((3, 2, 3, 3), np.float32))
    >>> conv2d(x, w, padding=1).shape
    (1, 3, 4, 4)
    """
    return _conv2d(x, weight, bias, stride, padding, dilation, groups, "auto")


cdef int _act_code(str op, object act) except -1:
    if not isinstance(act, str) or act not in ACTIVATIONS:
        raise ValueError(f"{op}: act must be one of {', '.join(map(repr, ACTIVATIONS))}, got {act!r}")
    return ACTIVATIONS[act]


@core_op
def conv2d_act(x, weight, bias=None, residual=None, stride=1, padding=0, dilation=1, groups=1,
               act="relu"):
    """conv2d followed by a residual addition and an activation, in one
    pass: both run in the convolution's epilogue, on each tile of output
    while it is still in cache (what ``optimize()``'s FuseConvAct calls).

    Args:
        x, weight, bias, stride, padding, dilation, groups: as :func:`conv2d`.
        residual: None, or a tensor of the output's shape [N, O, OH, OW]
            added before the activation (a ResNet block's shortcut).
        act: "none", "relu", "relu6", "silu", "hardswish", "sigmoid" or
            "gelu" (exact erf GELU).

    Returns:
        ``act(conv2d(x, weight, bias, ...) + residual)``, the same values as
        the ops one after the other (the activations are elementwise; float32
        SiLU, sigmoid and GELU use the vector kernels of the elementwise ops).

    Raises:
        ValueError: an unknown ``act``, a residual of another shape;
            otherwise as :func:`conv2d`.

    >>> import mgtrace as mt
    >>> x = mt.tensor(np.full((1, 1, 2, 2), -1.0, np.float32))
    >>> conv2d_act(x, mt.tensor(np.ones((1, 1, 1, 1), np.float32)), act="relu").tolist()
    [[[[0.0, 0.0], [0.0, 0.0]]]]
    """
    return _conv2d(x, weight, bias, stride, padding, dilation, groups, "auto", act, residual,
                   "conv2d_act")


def bias_act_(y, bias, act):
    """In place: ``y[..., j] = act(y[..., j] + bias[j])`` for a contiguous
    float32/float64 ``y`` (bias [y.shape[-1]] or None) that nothing else
    reads yet, e.g. a matmul's fresh result (a fused linear's epilogue).
    Returns y.

    Raises:
        TypeError: y not a contiguous float32/float64 CPU Tensor, bias of
            another dtype.
        ValueError: an unknown ``act``, a bias of the wrong shape.
    """
    cdef str op = "bias_act_"
    cdef int a = _act_code(op, act)
    cdef Tensor ty, tb = None
    if not isinstance(y, Tensor) or (<Tensor>y)._dtype not in (MT_FLOAT32, MT_FLOAT64) \
            or not is_contiguous(<Tensor>y):
        raise TypeError(f"{op}: y must be a contiguous float32 or float64 Tensor")
    ty = <Tensor>y
    cdef int64_t cols = ty._shape[ty._ndim - 1] if ty._ndim > 0 else 1
    cdef int64_t rows = numel(ty) // cols if cols > 0 else 0
    cdef const void *bptr = NULL
    if bias is not None:
        if not isinstance(bias, Tensor) or shape_tuple(<Tensor>bias) != (cols,):
            raise ValueError(f"{op}: bias must be a Tensor of shape ({cols},)")
        tb = <Tensor>bias
        if tb._dtype != ty._dtype:
            raise TypeError(f"{op}: bias dtype {DTYPE_NAMES[tb._dtype]} differs from y's "
                            f"{DTYPE_NAMES[ty._dtype]}")
        if tb._device != ty._device:
            raise ValueError(f"ambiguous device: {_dev(ty._device)} vs {_dev(tb._device)}")
        tb = _ready(tb, ty._dtype)
        bptr = tb._data
    if rows == 0 or cols == 0 or (bptr == NULL and a == MT_ACT_NONE):
        return y
    cdef int nt = num_threads(), rc
    cdef const mt_nn_kernels *kn = _kernels(op, ty)
    _need(kn.bias_act != NULL, op, ty)
    with nogil:
        rc = kn.bias_act(ty._dtype, ty._data, rows, cols, bptr, a, nt)
    _check_rc(op, rc, ty._device)
    return y


def lrn_rows(x, int64_t n, double k, double alpha, double beta):
    """Local response normalization across channels of a float32/float64
    Tensor ``x`` [N, C, *spatial] in one C pass (kernels/cpu/lrn.c):
    ``x * (k + alpha * s) ** -beta``, s the sum of x**2 over the ``n``
    channels centred on each (zeros past the ends), in double. What
    ``F.local_response_norm``'s fast path passes (it checks the
    arguments). Returns a new contiguous Tensor of x's shape and dtype, or
    None where x's device has no such kernel (CUDA: the caller composes).

    Raises:
        TypeError: x not a float32/float64 Tensor of 2 or more axes.
        ValueError: n not odd and positive.
    """
    cdef str op = "local_response_norm"
    if not isinstance(x, Tensor) or (<Tensor>x)._dtype not in (MT_FLOAT32, MT_FLOAT64) or \
            (<Tensor>x)._ndim < 2:
        raise TypeError(f"{op}: x must be a float32 or float64 Tensor [N, C, *spatial]")
    if n < 1 or n % 2 == 0:
        raise ValueError(f"{op}: kernel_size must be odd and positive, got {n}")
    cdef Tensor tx = <Tensor>x
    cdef const mt_nn_kernels *kn = <const mt_nn_kernels *>backend_of(tx._device).nn
    if kn == NULL or kn.lrn == NULL:
        return None
    tx = _ready(tx, tx._dtype)
    cdef Tensor out = empty(tx._ndim, tx._shape, tx._dtype, tx._device)
    cdef int64_t outer = tx._shape[0], c = tx._shape[1], inner = 1, total = numel(tx)
    cdef int i, rc, nt = num_threads()
    for i in range(2, tx._ndim):
        inner *= tx._shape[i]
    if total:
        with nogil:
            rc = kn.lrn(tx._dtype, tx._data, out._data, outer, c, inner, n, k, alpha, beta, nt)
        _check_rc(op, rc, tx._device)
    return out


cdef tuple _bn_geometry(str op, Tensor tx):
    """(outer, c, inner) of x [N, C, *spatial] read as [outer, c, inner]."""
    cdef int64_t inner = 1
    cdef int i
    for i in range(2, tx._ndim):
        inner *= tx._shape[i]
    return tx._shape[0], tx._shape[1], inner


cdef Tensor _bn_channel_param(str op, str name, object v, Tensor tx):
    """A per-channel weight/bias of C elements, x's dtype and device, ready for C (None: None)."""
    if v is None:
        return None
    if not isinstance(v, Tensor) or (<Tensor>v)._dtype != tx._dtype or (<Tensor>v)._device != tx._device:
        raise TypeError(f"{op}: {name} must be a Tensor of x's dtype and device")
    if numel(<Tensor>v) != tx._shape[1]:
        raise ValueError(f"{op}: {name} must have {tx._shape[1]} elements (x's channels), got "
                         f"{numel(<Tensor>v)}")
    return _ready(<Tensor>v, tx._dtype)


def has_batch_norm_train(x):
    """Whether Tensor ``x``'s device has batch norm's training kernels, the
    forward and its backward (the CPU's; CUDA's table leaves them NULL)."""
    if not isinstance(x, Tensor):
        return False
    cdef const mt_nn_kernels *kn = <const mt_nn_kernels *>backend_of((<Tensor>x)._device).nn
    return kn != NULL and kn.batch_norm_train != NULL and kn.batch_norm_backward != NULL


def batch_norm_train(x, weight, bias, double eps):
    """Batch normalization in training of a float32/float64 Tensor ``x``
    [N, C, *spatial] in one C pass per channel (kernels/cpu/train.c):
    ``(x - mean) / sqrt(var + eps) * weight + bias`` with the batch's mean
    and biased var per channel (over N and the spatial axes, in double).
    What ``F.batch_norm``'s training path passes (it checks the arguments).

    Args:
        x: float32/float64 [N, C, *spatial]; weight, bias: None or C
            elements of x's dtype and device; eps: added to the variance.

    Returns:
        ``(y, mean, var)``: y a new contiguous Tensor of x's shape and
        dtype, mean and the biased var [C] of x's dtype; or None where x's
        device has no such kernel (CUDA: the caller composes core ops).

    Raises:
        TypeError: x not a float32/float64 Tensor of 2 or more axes,
            weight/bias of another dtype or device.
        ValueError: weight/bias not of C elements.
    """
    cdef str op = "batch_norm"
    if not isinstance(x, Tensor) or (<Tensor>x)._dtype not in (MT_FLOAT32, MT_FLOAT64) or \
            (<Tensor>x)._ndim < 2:
        raise TypeError(f"{op}: x must be a float32 or float64 Tensor [N, C, *spatial]")
    cdef Tensor tx = <Tensor>x
    cdef Tensor tw = _bn_channel_param(op, "weight", weight, tx)
    cdef Tensor tb = _bn_channel_param(op, "bias", bias, tx)
    cdef const mt_nn_kernels *kn = <const mt_nn_kernels *>backend_of(tx._device).nn
    if kn == NULL or kn.batch_norm_train == NULL:
        return None
    tx = _ready(tx, tx._dtype)
    cdef int64_t outer, c, inner
    outer, c, inner = _bn_geometry(op, tx)
    cdef Tensor y = empty(tx._ndim, tx._shape, tx._dtype, tx._device)
    cdef int64_t flat[1]
    flat[0] = c
    cdef Tensor mean = empty(1, flat, tx._dtype, tx._device), var = empty(1, flat, tx._dtype, tx._device)
    cdef const void *wp = tw._data if tw is not None else NULL
    cdef const void *bp = tb._data if tb is not None else NULL
    cdef int nt = num_threads(), rc
    if outer * c * inner:
        with nogil:
            rc = kn.batch_norm_train(tx._dtype, tx._data, wp, bp, y._data, mean._data, var._data,
                                     outer, c, inner, eps, nt)
        _check_rc(op, rc, tx._device)
    else:
        fill(mean, float("nan"))
        fill(var, float("nan"))
    return y, mean, var


def batch_norm_backward(x, weight, gy, double eps, bint want_x=True, bint want_weight=True,
                        bint want_bias=True):
    """The gradients of :func:`batch_norm_train` in one C pass per channel
    (the batch statistics recomputed from x as the forward computes them;
    PyTorch's formula ``gx = w rstd (gy - mean(gy) - xhat mean(gy xhat))``).

    Args:
        x: the forward's float32/float64 Tensor [N, C, *spatial]; gy: its
            output's gradient, x's shape, dtype and device; weight: None
            or C elements of x's dtype; eps: the forward's.
        want_x, want_weight, want_bias: which gradients to return.

    Returns:
        ``(gx, gweight, gbias)``: gx of x's shape and dtype, gweight
        ``sum(gy xhat)`` and gbias ``sum(gy)`` flat [C] of x's dtype; None
        where not wanted (gweight also when weight is None).

    Raises:
        TypeError: x not a float32/float64 Tensor of 2 or more axes, gy or
            weight of another dtype or device. ValueError: gy of another
            shape, weight not of C elements.
        NoKernelError: x's device has no such kernel.
    """
    cdef str op = "batch_norm"
    if not isinstance(x, Tensor) or (<Tensor>x)._dtype not in (MT_FLOAT32, MT_FLOAT64) or \
            (<Tensor>x)._ndim < 2:
        raise TypeError(f"{op} backward: x must be a float32 or float64 Tensor [N, C, *spatial]")
    cdef Tensor tx = <Tensor>x, tg
    if not isinstance(gy, Tensor) or (<Tensor>gy)._dtype != tx._dtype or (<Tensor>gy)._device != tx._device:
        raise TypeError(f"{op} backward: gy must be a Tensor of x's dtype and device")
    if shape_tuple(<Tensor>gy) != shape_tuple(tx):
        raise ValueError(f"{op} backward: gy {shape_tuple(<Tensor>gy)} and x {shape_tuple(tx)} differ in shape")
    cdef Tensor tw = _bn_channel_param(op + " backward", "weight", weight, tx)
    cdef const mt_nn_kernels *kn = _kernels(op, tx)
    _need(kn.batch_norm_backward != NULL, op + " backward", tx)
    tx = _ready(tx, tx._dtype)
    tg = _ready(<Tensor>gy, tx._dtype)
    cdef int64_t outer, c, inner
    outer, c, inner = _bn_geometry(op, tx)
    cdef Tensor gx = empty(tx._ndim, tx._shape, tx._dtype, tx._device) if want_x else None
    cdef Tensor gw = None, gb = None
    cdef int64_t flat[1]
    flat[0] = c
    if want_weight and tw is not None:
        gw = empty(1, flat, tx._dtype, tx._device)
    if want_bias:
        gb = empty(1, flat, tx._dtype, tx._device)
    cdef const void *wp = tw._data if tw is not None else NULL
    cdef void *gxp = gx._data if gx is not None else NULL
    cdef void *gwp = gw._data if gw is not None else NULL
    cdef void *gbp = gb._data if gb is not None else NULL
    cdef int nt = num_threads(), rc = 0
    if outer * inner and c:
        with nogil:
            rc = kn.batch_norm_backward(tx._dtype, tx._data, wp, tg._data, gxp, gwp, gbp,
                                        outer, c, inner, eps, nt)
        _check_rc(op + " backward", rc, tx._device)
    else:
        for t in (gw, gb):
            if t is not None:
                fill(t, 0)
    return gx, gw, gb


def sgd_step(p, g, buf, double lr, double momentum, double weight_decay, bint nesterov, bint first):
    """One SGD update of parameter ``p`` in place, in one C pass over p, its
    gradient g and its momentum buffer (kernels/cpu/train.c), in p's dtype:
    ``g' = g + weight_decay p``; ``buf = momentum buf + g'`` (``buf = g'``
    when ``first``); ``p -= lr (g' + momentum buf if nesterov else buf)``;
    ``buf`` None: no momentum, ``p -= lr g'``. What
    :class:`mgtrace.optimizer.SGD` runs where it can.

    Returns:
        True when done; False (nothing written) where the kernel does not
        apply: p or buf not contiguous float32/float64 Tensors of one dtype
        and device, g of another shape, dtype or device, or a device
        without the kernel. The caller then runs the tensor formula.

    Raises:
        ValueError: p or buf read-only (as any in-place write).
    """
    if not isinstance(p, Tensor) or not isinstance(g, Tensor):
        return False
    cdef Tensor tp = <Tensor>p, tg = <Tensor>g, tb = None
    if tp._dtype not in (MT_FLOAT32, MT_FLOAT64) or not is_contiguous(tp) or tg._dtype != tp._dtype \
            or tg._device != tp._device or shape_tuple(tg) != shape_tuple(tp):
        return False
    if buf is not None:
        if not isinstance(buf, Tensor):
            return False
        tb = <Tensor>buf
        if tb._dtype != tp._dtype or tb._device != tp._device or not is_contiguous(tb) \
                or shape_tuple(tb) != shape_tuple(tp) or tb._st == tp._st:
            return False
    cdef const mt_nn_kernels *kn = <const mt_nn_kernels *>backend_of(tp._device).nn
    if kn == NULL or kn.sgd_step == NULL:
        return False
    if tg._st == tp._st or (tb is not None and tg._st == tb._st):
        tg = tg.copy()                   # the gradient aliases what is written
    tg = _ready(tg, tp._dtype)
    check_writable(tp)
    if tb is not None:
        check_writable(tb)
    cdef int64_t n = numel(tp)
    cdef void *bp = tb._data if tb is not None else NULL
    cdef int nt = num_threads(), rc = 0
    if n:
        with nogil:
            rc = kn.sgd_step(tp._dtype, tp._data, tg._data, bp, n, lr, momentum, weight_decay,
                             nesterov, first, nt)
        _check_rc("SGD", rc, tp._device)
    tp._st.version += 1                  # written (see dispatch.check_writable)
    if tb is not None:
        tb._st.version += 1
    return True


def layer_norm_rows(x, weight, bias, int64_t cols, double eps):
    """Layer normalization of a float32/float64 CPU Tensor ``x`` over its
    trailing ``cols`` elements (rows of a contiguous copy): ``(x - mean) /
    sqrt(var + eps) * weight + bias``, biased var, mean and variance in
    double; weight and bias: None or Tensors of ``cols`` elements of x's
    dtype (what ``F.layer_norm``'s fast path passes; it checks the shapes).
    Returns a new contiguous Tensor of x's shape.

    Raises:
        TypeError: x not a float32/float64 CPU Tensor, or weight/bias of
            another dtype or device.
        ValueError: cols not dividing x's size, weight/bias of another size.
    """
    cdef str op = "layer_norm"
    if not isinstance(x, Tensor) or (<Tensor>x)._dtype not in (MT_FLOAT32, MT_FLOAT64):
        raise TypeError(f"{op}: x must be a float32 or float64 Tensor")
    cdef Tensor tx = <Tensor>x, tw = None, tb = None, t
    cdef const mt_nn_kernels *kn = _kernels(op, tx)
    _need(kn.layer_norm != NULL, op, tx)
    cdef int64_t n = numel(tx)
    if cols <= 0 or n % cols:
        raise ValueError(f"{op}: {cols} trailing elements do not divide x's {n}")
    for name, v in (("weight", weight), ("bias", bias)):
        if v is None:
            continue
        if not isinstance(v, Tensor) or (<Tensor>v)._dtype != tx._dtype or (<Tensor>v)._device != tx._device:
            raise TypeError(f"{op}: {name} must be a Tensor of x's dtype and device")
        if numel(<Tensor>v) != cols:
            raise ValueError(f"{op}: {name} must have {cols} elements, got {numel(<Tensor>v)}")
        t = _ready(<Tensor>v, tx._dtype)
        if name == "weight":
            tw = t
        else:
            tb = t
    tx = _ready(tx, tx._dtype)
    cdef Tensor out = empty(tx._ndim, tx._shape, tx._dtype, tx._device)
    cdef const void *wp = tw._data if tw is not None else NULL
    cdef const void *bp = tb._data if tb is not None else NULL
    cdef int nt = num_threads(), rc
    if n:
        with nogil:
            rc = kn.layer_norm(tx._dtype, tx._data, wp, bp, out._data, n // cols, cols, eps, nt)
        _check_rc(op, rc, tx._device)
    return out


def add_layer_norm_rows(x, x_bias, residual, weight, bias, double eps, bint into_x=False):
    """``layer_norm((x + x_bias) + residual)`` over x's last axis in one C
    pass per row (kernels/cpu/norm.c): the additions a linear layer's bias
    and a residual add make, in that order and in x's dtype, then the
    layer norm as :func:`layer_norm_rows` computes it (mean and variance in
    double), so the result equals those three calls one after the other
    bit for bit. ``x``: a float32/float64 CPU Tensor [..., cols];
    ``residual``: None or a Tensor of x's shape; ``x_bias``, ``weight``,
    ``bias``: None or Tensors of ``cols`` elements; all of x's dtype and
    device (what ``F.linear_add_layer_norm``'s fast path passes; it checks
    the shapes). Returns a new contiguous Tensor of x's shape, or, with
    ``into_x``, x itself written in place when x is contiguous (a fresh
    matmul result nothing else reads: a plan then replays the pass in the
    memory it already holds).

    Raises:
        TypeError: x not a float32/float64 Tensor, another operand of
            another dtype or device.
        ValueError: a residual of another shape, a vector of another size.
        NoKernelError: x's device has no add_layer_norm kernel.
    """
    cdef str op = "add_layer_norm"
    if not isinstance(x, Tensor) or (<Tensor>x)._dtype not in (MT_FLOAT32, MT_FLOAT64) \
            or (<Tensor>x)._ndim == 0:
        raise TypeError(f"{op}: x must be a float32 or float64 Tensor of at least one axis")
    cdef Tensor tx = <Tensor>x, tr = None, t
    cdef const mt_nn_kernels *kn = _kernels(op, tx)
    _need(kn.add_layer_norm != NULL, op, tx)
    cdef int64_t cols = tx._shape[tx._ndim - 1], n = numel(tx)
    cdef const void *ptr[3]
    for i, (name, v) in enumerate((("x_bias", x_bias), ("weight", weight), ("bias", bias))):
        ptr[i] = NULL
        if v is None:
            continue
        if not isinstance(v, Tensor) or (<Tensor>v)._dtype != tx._dtype or (<Tensor>v)._device != tx._device:
            raise TypeError(f"{op}: {name} must be a Tensor of x's dtype and device")
        if numel(<Tensor>v) != cols:
            raise ValueError(f"{op}: {name} must have {cols} elements (x's last axis), got {numel(<Tensor>v)}")
        t = _ready(<Tensor>v, tx._dtype)
        ptr[i] = t._data
        if i == 0:
            x_bias = t                       # held for the call
        elif i == 1:
            weight = t
        else:
            bias = t
    if residual is not None:
        if not isinstance(residual, Tensor) or (<Tensor>residual)._dtype != tx._dtype \
                or (<Tensor>residual)._device != tx._device:
            raise TypeError(f"{op}: residual must be a Tensor of x's dtype and device")
        if shape_tuple(<Tensor>residual) != shape_tuple(tx):
            raise ValueError(f"{op}: residual of shape {shape_tuple(<Tensor>residual)} differs from x's "
                             f"{shape_tuple(tx)}")
        tr = _ready(<Tensor>residual, tx._dtype)
    cdef Tensor out
    if into_x and is_contiguous(tx):
        out = tx
    else:
        tx = _ready(tx, tx._dtype)
        out = empty(tx._ndim, tx._shape, tx._dtype, tx._device)
    cdef const void *rp = tr._data if tr is not None else NULL
    cdef int nt = num_threads(), rc
    if n and cols:
        with nogil:
            rc = kn.add_layer_norm(tx._dtype, tx._data, ptr[0], rp, ptr[1], ptr[2], out._data, n // cols,
                                   cols, eps, nt)
        _check_rc(op, rc, tx._device)
    if out is tx:
        tx._st.version += 1              # written (see dispatch.check_writable)
    return out


def layer_norm_backward_rows(x, weight, gy, int64_t cols, double eps, bint want_weight=True,
                              bint want_bias=True):
    """The gradients of :func:`layer_norm_rows` in one C pass over x and gy
    (mean and variance recomputed from x as the forward computes them).

    Args:
        x: the forward's float32/float64 CPU Tensor; gy: its output's
            gradient, x's shape; weight: None or ``cols`` elements of x's
            dtype; cols: the normalized trailing size; eps: the forward's.
        want_weight, want_bias: whether to return those gradients.

    Returns:
        ``(gx, gweight, gbias)``: gx of x's shape and dtype; gweight (when
        weight is given and wanted) and gbias (when wanted) flat [cols] of
        x's dtype, summed over the rows; None where not returned.

    Raises:
        TypeError: x not a float32/float64 Tensor, gy or weight of another
            dtype or device. ValueError: cols not dividing x's size, gy of
            another shape, weight of another size.
        NoKernelError: the device has no such kernel.
    """
    cdef str op = "layer_norm"
    if not isinstance(x, Tensor) or (<Tensor>x)._dtype not in (MT_FLOAT32, MT_FLOAT64):
        raise TypeError(f"{op} backward: x must be a float32 or float64 Tensor")
    cdef Tensor tx = <Tensor>x, tw = None, tg
    if not isinstance(gy, Tensor) or (<Tensor>gy)._dtype != tx._dtype or (<Tensor>gy)._device != tx._device:
        raise TypeError(f"{op} backward: gy must be a Tensor of x's dtype and device")
    if shape_tuple(<Tensor>gy) != shape_tuple(tx):
        raise ValueError(f"{op} backward: gy {shape_tuple(<Tensor>gy)} and x {shape_tuple(tx)} differ in shape")
    cdef const mt_nn_kernels *kn = _kernels(op, tx)
    _need(kn.layer_norm_backward != NULL, op + " backward", tx)
    cdef int64_t n = numel(tx)
    if cols <= 0 or n % cols:
        raise ValueError(f"{op} backward: {cols} trailing elements do not divide x's {n}")
    if weight is not None:
        if not isinstance(weight, Tensor) or (<Tensor>weight)._dtype != tx._dtype \
                or (<Tensor>weight)._device != tx._device:
            raise TypeError(f"{op} backward: weight must be a Tensor of x's dtype and device")
        if numel(<Tensor>weight) != cols:
            raise ValueError(f"{op} backward: weight must have {cols} elements, got {numel(<Tensor>weight)}")
        tw = _ready(<Tensor>weight, tx._dtype)
    tx = _ready(tx, tx._dtype)
    tg = _ready(<Tensor>gy, tx._dtype)
    cdef Tensor gx = empty(tx._ndim, tx._shape, tx._dtype, tx._device)
    cdef Tensor gw = None, gb = None
    cdef int64_t flat[1]
    flat[0] = cols
    if want_weight and tw is not None:
        gw = empty(1, flat, tx._dtype, tx._device)
    if want_bias:
        gb = empty(1, flat, tx._dtype, tx._device)
    cdef const void *wp = tw._data if tw is not None else NULL
    cdef void *gwp = gw._data if gw is not None else NULL
    cdef void *gbp = gb._data if gb is not None else NULL
    cdef int nt = num_threads(), rc = 0
    if n:
        with nogil:
            rc = kn.layer_norm_backward(tx._dtype, tx._data, wp, tg._data, gx._data, gwp, gbp,
                                        n // cols, cols, eps, nt)
        _check_rc(op + " backward", rc, tx._device)
    else:
        if gw is not None:
            fill(gw, 0)
        if gb is not None:
            fill(gb, 0)
    return gx, gw, gb


cdef Tensor _rows_ready(Tensor t):
    """t with a unit last stride and rows at least a row apart (what BLAS
    takes), else a contiguous copy."""
    cdef int nd = t._ndim
    if t._strides[nd - 1] == 1 and t._strides[nd - 2] >= max(t._shape[nd - 1], 1):
        return t
    return <Tensor>t.contiguous()


cdef tuple _attention_shapes(str op, Tensor tq, Tensor tk, Tensor tv, object mask):
    """The sizes (B, H, Sq, Sk, D, Dv) of q [B, H, Sq, D], k [B, H, Sk, D]
    and v [B, H, Sk, Dv], and the mask broadcast to the scores
    [B, H, Sq, Sk] (None for none). Raises ValueError naming the shapes
    when they do not fit."""
    cdef Tensor tm = None
    for name, t in (("q", tq), ("k", tk), ("v", tv)):
        if t._ndim != 4:
            raise ValueError(f"{op}: expected {name} of shape [B, H, S, D] (4-D), got shape "
                             f"{shape_tuple(t)}")
    b, h, sq, d = shape_tuple(tq)
    if shape_tuple(tk)[:2] != (b, h) or shape_tuple(tk)[3] != d or shape_tuple(tv)[:3] != shape_tuple(tk)[:3]:
        raise ValueError(f"{op}: shapes do not fit: q {shape_tuple(tq)}, k {shape_tuple(tk)}, "
                         f"v {shape_tuple(tv)} (want [B, H, Sq, D], [B, H, Sk, D], [B, H, Sk, Dv])")
    sk, dv = tk._shape[2], tv._shape[3]
    if mask is not None:
        try:
            tm = <Tensor>(<Tensor>mask).broadcast_to((b, h, sq, sk))
        except ValueError:
            raise ValueError(f"{op}: mask of shape {shape_tuple(<Tensor>mask)} does not broadcast "
                             f"to the scores [B, H, Sq, Sk] = {(b, h, sq, sk)}") from None
    return (b, h, sq, sk, d, dv), tm


cdef void _fill_attn_geom(mt_attn_geom *g, tuple dims, Tensor tq, Tensor tk, Tensor tv, Tensor tm,
                          double scale):
    """g's sizes (B, H, Sq, Sk, D, Dv), the operands' strides (the mask's 0
    for none) and scale; the output strides 0 (the caller's to set)."""
    cdef int i
    g.b, g.h, g.sq, g.sk, g.d, g.dv = dims
    for i in range(4):
        g.qs[i], g.ks[i], g.vs[i] = tq._strides[i], tk._strides[i], tv._strides[i]
        g.ms[i] = tm._strides[i] if tm is not None else 0
    g.os[0] = g.os[1] = g.os[2] = 0
    g.scale = scale


@core_op
def attention(q, k, v, mask=None, scale=1.0):
    """Scaled dot-product attention: ``softmax(q @ k^T * scale + mask) @ v``
    over the last axis, computed per (batch, head) pair with the scores
    kept in cache (what ``optimize()``'s FuseAttention calls).

    Args:
        q: float [B, H, Sq, D]; k: [B, H, Sk, D]; v: [B, H, Sk, Dv].
        mask: None, or a float tensor broadcastable to [B, H, Sq, Sk], added
            to the scaled scores (e.g. a large negative value on padding).
        scale: float, multiplies q @ k^T.

    Returns:
        [B, H, Sq, Dv] in the promoted float dtype; float32 runs the
        device's fused kernel where it has one, other dtypes and devices
        the op table's fallback (mgtrace._core.fallbacks.attention: the ops
        one after the other, the same values up to rounding).

    Raises:
        ValueError: q, k, v not 4-d, or their shapes do not fit; a mask that
            does not broadcast; tensors on different devices.
        TypeError: integer or bool tensors.

    >>> import mgtrace as mt
    >>> q = mt.tensor(np.ones((1, 1, 2, 3), np.float32))
    >>> attention(q, q, q, scale=0.5).tolist()
    [[[[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]]]
    """
    cdef str op = "attention"
    cdef Tensor tq, tk, tv, tm = None, out
    cdef mt_attn_geom g
    cdef int code, nt, i, rc
    ts = _operands(op, (q, k, v, mask))
    code = _float_code(op, ts)
    tq, tk, tv = ts[0], ts[1], ts[2]
    (b, h, sq, sk, d, dv), tm = _attention_shapes(op, tq, tk, tv, ts[3])
    scale = A.to_float(op, "scale", scale)
    cdef const mt_nn_kernels *kn = <const mt_nn_kernels *>backend_of(tq._device).nn
    # each operand float32, not only their promotion: a float16 q, k or v
    # beside float32 ones promotes to float32 and was read as float32 bytes
    # (wrong numbers, past the end of its buffer)
    if code != MT_FLOAT32 or tq._dtype != MT_FLOAT32 or tk._dtype != MT_FLOAT32 \
            or tv._dtype != MT_FLOAT32 or (tm is not None and tm._dtype != MT_FLOAT32) \
            or kn == NULL or kn.attention_f32 == NULL or kn.attention_workspace == NULL:
        # no fused kernel for this device or dtype: the op table's fallback
        return fallbacks.attention(tq, tk, tv, tm, scale)
    tq, tk, tv = _rows_ready(tq), _rows_ready(tk), _rows_ready(tv)
    _check_blas(op, (sq, sk, d, dv, tq._strides[2], tk._strides[2], tv._strides[2]))
    _fill_attn_geom(&g, (b, h, sq, sk, d, dv), tq, tk, tv, tm, float(scale))
    # out is written heads-inner, [b, sq, h, dv] in memory, and returned as
    # the [b, h, sq, dv] view: a model's merge of the heads after it
    # (transpose(0, 2, 1, 3), reshape to [b, sq, h * dv]) is then a view,
    # not a copy; the same values either way
    cdef int64_t oshape[4]
    oshape[0], oshape[1], oshape[2], oshape[3] = b, sq, h, dv
    out = empty(4, oshape, MT_FLOAT32, tq._device)
    g.os[0], g.os[1], g.os[2] = sq * h * dv, dv, h * dv
    nt = num_threads()
    cdef Tensor ws = _workspace(op, kn.attention_workspace(&g, nt), tq._device,
                                f"q {tuple(tq.shape)}, k {tuple(tk.shape)}, v {tuple(tv.shape)}")
    cdef const float *mptr = <const float *>tm._data if tm is not None else NULL
    with nogil:
        rc = kn.attention_f32(<const float *>tq._data, <const float *>tk._data,
                              <const float *>tv._data, mptr, <float *>out._data, &g, nt,
                              ws._data if ws is not None else NULL)
    _check_rc(op, rc, tq._device)
    return out.transpose(0, 2, 1, 3)


def _conv2d(x, weight, bias, stride, padding, dilation, groups, algo, act="none", residual=None,
            str called="conv2d"):
    """conv2d with a chosen algorithm ("auto" or a name of ``CONV_ALGOS``),
    activation (a name of ``ACTIVATIONS``) and residual; tests use it to
    check every kernel path. ValueError when the algorithm does not apply
    to the geometry; NoKernelError naming op ``called`` when the device has
    no conv2d kernel."""
    cdef str op = "conv2d"
    cdef Tensor tx, tw, tb = None, out, tr = None
    cdef int code, work, rc, nt, a
    cdef mt_conv2d_geom g
    tx, tw, tb_obj, code = _conv_operands(op, x, weight, bias)
    _check_4d(op, "x", tx, "[N, C, H, W]")
    _check_4d(op, "weight", tw, "[O, C / groups, KH, KW]")
    groups = _groups(op, groups)
    sh, sw = _positive(op, "stride", stride)
    ph, pw = _nonneg(op, "padding", padding)
    dh, dw = _positive(op, "dilation", dilation)
    n, c, h, w = shape_tuple(tx)
    o, cg, kh, kw = shape_tuple(tw)
    if c % groups:
        raise ValueError(f"{op}: groups={groups} does not divide the {c} input channels")
    if o % groups:
        raise ValueError(f"{op}: groups={groups} does not divide the {o} output channels (weight.shape[0])")
    if cg * groups != c:
        raise ValueError(f"{op}: x has {c} channels but weight expects {cg * groups} "
                         f"(weight.shape[1] * groups = {cg} * {groups})")
    if kh < 1 or kw < 1:
        raise ValueError(f"{op}: kernel size must be positive, got weight shape {shape_tuple(tw)}")
    if tb_obj is not None:
        tb = <Tensor>tb_obj
        if shape_tuple(tb) != (o,):
            raise ValueError(f"{op}: bias must have shape ({o},), got {shape_tuple(tb)}")
    oh = mt_window_out(h, kh, sh, ph, dh, 0)
    ow = mt_window_out(w, kw, sw, pw, dw, 0)
    if oh < 1 or ow < 1:
        raise ValueError(_no_window(op, (kh, kw), (dh, dw), (h, w), (ph, pw)))
    _check_blas(op, ((h + 2 * ph) * (w + 2 * pw), oh * ow, o, c * kh * kw))
    g.n, g.c, g.h, g.w = n, c, h, w
    g.o, g.kh, g.kw, g.oh, g.ow = o, kh, kw, oh, ow
    g.sh, g.sw, g.ph, g.pw, g.dh, g.dw, g.groups = sh, sw, ph, pw, dh, dw, groups
    g.act = _act_code(op, act)
    g.has_res, g.res_delta = 0, 0
    if residual is not None:
        rs = _operands(op, (tx, residual))[1]
        if shape_tuple(<Tensor>rs) != (n, o, oh, ow):
            raise ValueError(f"{op}: residual must have the output's shape {(n, o, oh, ow)}, got "
                             f"{shape_tuple(<Tensor>rs)}")
        if CATEGORY[(<Tensor>rs)._dtype] != 3:
            raise TypeError(f"{op}: residual must be a float tensor, got "
                            f"{DTYPE_NAMES[(<Tensor>rs)._dtype]}")
        code = PROMOTE[code][(<Tensor>rs)._dtype]
        tr = <Tensor>rs
    if algo not in CONV_ALGOS:
        raise ValueError(f"{op}: unknown algorithm {algo!r}; expected one of {', '.join(CONV_ALGOS)}")
    a = CONV_ALGOS[algo]
    if a == MT_CONV_DEPTHWISE and cg != 1:
        raise ValueError(f"{op}: the depthwise kernel needs one input channel per group, got {cg}")
    if a == MT_CONV_GEMM1X1 and not (kh == kw == 1 and sh == sw == 1 and ph == pw == 0):
        raise ValueError(f"{op}: the gemm1x1 kernel needs a 1x1 kernel, stride 1 and no padding")
    if (a == MT_CONV_WINOGRAD or a == MT_CONV_WINOGRAD4) and not (kh == kw == 3 and sh == sw == 1 and dh == dw == 1):
        raise ValueError(f"{op}: the {algo} kernel needs a 3x3 kernel, stride 1 and dilation 1")
    work = _work_code(code)
    tx = _ready(tx, work)
    cdef Tensor tw_orig = tw
    tw = _ready(tw, work)
    cdef const void *bptr = NULL
    if tb is not None:
        tb = _ready(tb, work)
        bptr = tb._data
    cdef int64_t oshape[4]
    oshape[0], oshape[1], oshape[2], oshape[3] = n, o, oh, ow
    out = empty(4, oshape, work, tx._device)
    if tr is not None:
        tr = _ready(tr, work)
        g.has_res = 1
        g.res_delta = <int64_t>(<intptr_t>tr._data - <intptr_t>out._data)
    nt = num_threads()
    cdef const mt_nn_kernels *kn = _kernels(called, tx)
    cdef void *dwsp = NULL
    _need(kn.conv2d != NULL and kn.conv2d_workspace != NULL, called, tx)
    if kn.conv2d_packed == NULL:     # a backend without packed weights (the cache below is for them)
        nb = kn.conv2d_workspace(work, &g, a, nt)
        dws = _workspace(op, nb, tx._device, None if nb != MT_NN_EOVERFLOW else
                         f"x {shape_tuple(tx)}, weight {shape_tuple(tw)}, stride {(sh, sw)}, "
                         f"padding {(ph, pw)}, dilation {(dh, dw)}, groups {groups}")
        dwsp = (<Tensor>dws)._data if dws is not None else NULL
        with nogil:
            rc = kn.conv2d(work, tx._data, tw._data, bptr, out._data, &g, a, nt, dwsp)
        _check_rc(op, rc, tx._device)
        return _finish(out, code)
    if a == MT_CONV_AUTO and n > 0 and o > 0 and c > 0:
        a = mt_conv2d_pick_algo_ex(&g, mt_storage_tracked(tw_orig._st))
    cdef Tensor u = None
    cdef int layout = mt_conv2d_packed_layout(a)
    if mt_conv2d_packs_weights(a) and n > 0 and o > 0 and c > 0:
        u = _packed_weights(tw_orig, tw, work, &g, a, layout, nt)
        if u is None:       # weights unfit for Winograd (_wino_unfit): the direct kernel
            a = mt_conv2d_direct_algo(&g)
            layout = mt_conv2d_packed_layout(a)
            if mt_conv2d_packs_weights(a):
                u = _packed_weights(tw_orig, tw, work, &g, a, layout, nt)
    cdef int64_t wsbytes = mt_conv2d_packed_workspace(work, &g, a, layout, nt) if u is not None else \
        kn.conv2d_workspace(work, &g, a, nt)
    cdef Tensor ws = _workspace(op, wsbytes, tx._device, None if wsbytes != MT_NN_EOVERFLOW else
                                f"x {shape_tuple(tx)}, weight {shape_tuple(tw)}, stride {(sh, sw)}, "
                                f"padding {(ph, pw)}, dilation {(dh, dw)}, groups {groups}")
    cdef void *wsp = ws._data if ws is not None else NULL
    with nogil:
        if u is not None:
            rc = kn.conv2d_packed(work, tx._data, u._data, bptr, out._data, &g, a, layout, nt, wsp)
        else:
            rc = kn.conv2d(work, tx._data, tw._data, bptr, out._data, &g, a, nt, wsp)
    if rc == MT_NN_NONFINITE:
        rc = _conv2d_direct(op, tx, tw, bptr, out, &g, nt)
    _check_rc(op, rc, tx._device)
    return _finish(out, code)


cdef int _conv2d_direct(str op, Tensor tx, Tensor tw, const void *bptr, Tensor out, mt_conv2d_geom *g,
                        int nt) except? -100:
    """conv2d again with a kernel without transforms, for a Winograd call
    that met NaN, inf or a magnitude past its bound in x (MT_NN_NONFINITE):
    the direct sum keeps each to the outputs whose receptive field holds
    it, and overflows only where its own sums do. Returns the kernel's rc."""
    cdef int a = mt_conv2d_direct_algo(g), rc
    cdef int64_t wsbytes = mt_conv2d_workspace(tx._dtype, g, a, nt)
    cdef Tensor ws = _workspace(op, wsbytes, tx._device, None if wsbytes != MT_NN_EOVERFLOW else
                                f"x {shape_tuple(tx)}, weight {shape_tuple(tw)}")
    cdef void *wsp = ws._data if ws is not None else NULL
    with nogil:
        rc = mt_conv2d(tx._dtype, tx._data, tw._data, bptr, out._data, g, a, nt, wsp)
    return rc


# ------------------------------------------------------------------ NCHW16c

cdef Tensor _f32_cpu(str op, str name, object t):
    """t, contiguous, for an NCHW16c op: a float32 Tensor on a device whose
    backend has the layout's kernels (TypeError, NoKernelError otherwise)."""
    if not isinstance(t, Tensor):
        raise TypeError(f"{op}: {name} must be a Tensor, got {type(t).__name__}")
    cdef Tensor tt = <Tensor>t
    if tt._dtype != MT_FLOAT32:
        raise TypeError(f"{op}: {name} must be a float32 tensor, got {DTYPE_NAMES[tt._dtype]} "
                        f"on {_dev(tt._device)}")
    _need(_kernels(op, tt).to_nchwc != NULL, op, tt)
    return tt if is_contiguous(tt) else <Tensor>tt.contiguous()


cdef int64_t _blocks(int64_t c):
    return mt_nchwc_blocks(c)


cdef int _nchwc_x(str op, Tensor tx, int64_t c) except -1:
    """ValueError unless x is NCHW16c [N, ceil(c/16), H, W, 16]."""
    if tx._ndim != 5:
        raise ValueError(f"{op}: x must be NCHW16c (5-D), got shape {shape_tuple(tx)}")
    if tx._shape[4] != 16 or tx._shape[1] != _blocks(c):
        raise ValueError(f"{op}: x of shape {shape_tuple(tx)} is not NCHW16c for the weight's {c} input "
                         f"channels (want [N, {_blocks(c)}, H, W, 16])")
    return 0


cdef Tensor _nchwc_bias(str op, str name, object bias, int64_t o):
    if bias is None:
        return None
    cdef Tensor tb = _f32_cpu(op, name, bias)
    if tb._ndim != 1 or tb._shape[0] != o:
        raise ValueError(f"{op}: {name} must have shape ({o},), got {shape_tuple(tb)}")
    return tb


cdef Tensor _nchwc_out(str op, const int64_t *oshape, int device):
    """The float32 NCHW16c output of shape ``oshape``; the errors of a
    shape past 2**62 elements or of memory that cannot be had name ``op``."""
    try:
        return empty(5, oshape, MT_FLOAT32, device)
    except (ValueError, MemoryError) as e:
        raise type(e)(f"{op}: the output: {e}") from None


cdef int _nchwc_geom(str op, mt_conv2d_geom *g, int64_t n, int64_t c, int64_t h, int64_t w, int64_t o,
                     int64_t kh, int64_t kw, stride, padding, dilation, int64_t groups, act) except -1:
    """Fills ``g`` (no residual) for a conv of [n, c, h, w] by [o, c / groups,
    kh, kw], checking stride, padding, dilation and the sizes as conv2d
    does. In C ints (Python-int arithmetic here cost a microsecond a conv
    call): the sizes are tensor dimensions (below 2**62) and the pairs at
    most MAX_GEOMETRY, so the padded sizes fit int64, and a kernel's span
    is mt_window_out's, in 128 bits."""
    cdef int64_t sh, sw, ph, pw, dh, dw
    sh, sw = _positive(op, "stride", stride)
    ph, pw = _nonneg(op, "padding", padding)
    dh, dw = _positive(op, "dilation", dilation)
    cdef int64_t oh = mt_window_out(h, kh, sh, ph, dh, 0), ow = mt_window_out(w, kw, sw, pw, dw, 0)
    if oh < 1 or ow < 1:
        raise ValueError(_no_window(op, (kh, kw), (dh, dw), (h, w), (ph, pw)))
    if _over_blas(h + 2 * ph, w + 2 * pw) or _over_blas(oh, ow) or o > _BLAS_INT_MAX or \
            _over_blas(c, kh) or _over_blas(c * kh, kw):      # conv2d's limits
        _check_blas(op, ((h + 2 * ph) * <object>(w + 2 * pw), <object>oh * ow, o, <object>c * kh * kw))
    g.n, g.c, g.h, g.w = n, c, h, w
    g.o, g.kh, g.kw, g.oh, g.ow = o, kh, kw, oh, ow
    g.sh, g.sw, g.ph, g.pw, g.dh, g.dw, g.groups = sh, sw, ph, pw, dh, dw, groups
    g.act = _act_code(op, act)
    g.has_res, g.res_delta = 0, 0
    return 0


cdef Tensor _nchwc_residual(str op, residual, Tensor out, mt_conv2d_geom *g):
    """Sets ``g``'s residual to ``residual``, which must be float32
    NCHW16c of ``out``'s shape (the kernels read it as laid out as out).
    Returns the tensor g points into (a contiguous copy of a strided
    residual): the caller holds it until the kernel has run."""
    cdef Tensor tr = _f32_cpu(op, "residual", residual)
    cdef int i
    cdef bint same = tr._ndim == 5
    if same:
        for i in range(5):
            same = same and tr._shape[i] == out._shape[i]
    if not same:
        raise ValueError(f"{op}: residual must have the output's NCHW16c shape {shape_tuple(out)}, "
                         f"got {shape_tuple(tr)}")
    g.has_res = 1
    g.res_delta = <int64_t>(<intptr_t>tr._data - <intptr_t>out._data)
    return tr


@core_op
def conv2d_nchwc(x, weight, bias=None, residual=None, stride=1, padding=0, dilation=1, groups=1,
                 act="none"):
    """conv2d with its output in the NCHW16c layout: ``act(conv2d(x, weight,
    bias) + residual)`` as :func:`conv2d_act` computes it, with channels in
    blocks of 16 (what ``optimize()``'s NCHWc pass runs conv layers in).

    Args:
        x: float32 [N, ceil(C/16), H, W, 16] (NCHW16c, channels past C
            zero), or float32 [N, C, H, W] (NCHW; dense convs only, for a
            first layer with few channels).
        weight: float32 [O, C/groups, KH, KW].
        bias: float32 [O] or None.
        residual: None, or float32 NCHW16c of the output's shape.
        stride, padding, dilation: as :func:`conv2d`.
        groups: 1 (dense) or C with C = O and weight.shape[1] = 1 (depthwise;
            an NCHW16c x).
        act: as :func:`conv2d_act`.

    Returns:
        float32 [N, ceil(O/16), OH, OW, 16]: the output channels past O are
        act(0) (zero for every activation but sigmoid's 0.5).

    Raises:
        TypeError: a tensor that is not float32 on the CPU.
        ValueError: shapes that do not fit, other groups, an unknown act;
            otherwise as :func:`conv2d`.

    A dense 3x3 conv of stride 1 without dilation, on an NCHW16c x with
    enough output tiles, runs as Winograd F(2x2, 3x3), or F(4x4, 3x3)
    where conv2d runs its F(4x4) (:func:`conv2d_nchwc_algorithm`). With
    128-256 channels of random values, F(2x2) rounds within 7e-7 of the
    output's scale (a direct sum within 2e-6) and F(4x4) within 1.5e-5,
    as conv2d's. A NaN or inf in x or in the weights stays where a direct
    sum puts it (in the outputs whose receptive field holds it), and huge
    finite values overflow only where a direct sum does: Winograd finds x
    past its bound (NaN, inf, or 2^53 in magnitude with 16 channels, 2^51
    with 512: mt_wino_bound) as it reads it, the weights when it packs
    them, and the call runs on the direct kernel instead.

    >>> import mgtrace as mt
    >>> x = to_nchwc(mt.tensor(np.ones((1, 2, 2, 2), np.float32)))
    >>> y = conv2d_nchwc(x, mt.tensor(np.ones((1, 2, 1, 1), np.float32)))
    >>> from_nchwc(y, 1).tolist()
    [[[[2.0, 2.0], [2.0, 2.0]]]]
    """
    cdef str op = "conv2d_nchwc"
    cdef Tensor tx = _f32_cpu(op, "x", x), tw = _f32_cpu(op, "weight", weight), tb = None, tr = None, out
    cdef mt_conv2d_geom g
    cdef int blocked = tx._ndim == 5, rc, nt
    cdef void *wsp
    _check_4d(op, "weight", tw, "[O, C / groups, KH, KW]")
    cdef int64_t o = tw._shape[0], cg = tw._shape[1], kh = tw._shape[2], kw = tw._shape[3]
    cdef int64_t ngroups = _groups(op, groups)
    if cg > _NUMEL_MAX // ngroups:
        raise ValueError(f"{op}: {cg} weight channels a group times groups={ngroups} is more channels "
                         f"than a tensor can hold")
    cdef int64_t c = cg * ngroups
    if blocked:
        _nchwc_x(op, tx, c)
    elif tx._ndim == 4:
        if tx._shape[1] != c:
            raise ValueError(f"{op}: x has {tx._shape[1]} channels but weight expects {c}")
    else:
        raise ValueError(f"{op}: x must be NCHW16c (5-D) or NCHW (4-D), got shape {shape_tuple(tx)}")
    if ngroups != 1 and not (ngroups == c == o and cg == 1 and blocked):
        raise ValueError(f"{op}: groups must be 1, or the channel count with an NCHW16c x and one "
                         f"weight channel a group (depthwise), got groups={ngroups} for {c} -> {o} channels")
    if kh < 1 or kw < 1:
        raise ValueError(f"{op}: kernel size must be positive, got weight shape {shape_tuple(tw)}")
    tb = _nchwc_bias(op, "bias", bias, o)
    _nchwc_geom(op, &g, tx._shape[0], c, tx._shape[2], tx._shape[3], o, kh, kw, stride, padding, dilation,
                ngroups, act)
    cdef int64_t oshape[5]
    oshape[0], oshape[1], oshape[2], oshape[3], oshape[4] = g.n, _blocks(o), g.oh, g.ow, 16
    out = _nchwc_out(op, oshape, tx._device)
    if residual is not None:
        tr = _nchwc_residual(op, residual, out, &g)     # (held: the kernel reads it)
    if numel(out) == 0:
        return out
    nt = num_threads()
    # (the cache key is the weight as given: a non-contiguous one's copy is new every call)
    cdef int form = mt_conv2d_nchwc_form(&g, blocked, _nchwc_winograd)
    cdef Tensor u = _packed_weights(<Tensor>weight, tw, MT_FLOAT32, &g, _NCHWC, form, nt)
    if u is None:       # weights unfit for Winograd (_wino_unfit): the direct form
        form = mt_conv2d_nchwc_form(&g, blocked, 0)
        u = _packed_weights(<Tensor>weight, tw, MT_FLOAT32, &g, _NCHWC, form, nt)
    cdef int64_t nb = mt_conv2d_nchwc_workspace(&g, form, nt)
    cdef Tensor ws = _workspace(op, nb, tx._device, None if nb != MT_NN_EOVERFLOW else
                                f"x {shape_tuple(tx)}, weight {shape_tuple(tw)}, padding {(g.ph, g.pw)}")
    cdef const float *bptr = <const float *>tb._data if tb is not None else NULL
    wsp = ws._data
    cdef const mt_nn_kernels *kn = _kernels(op, tx)
    _need(kn.conv2d_nchwc != NULL, op, tx)
    with nogil:
        rc = kn.conv2d_nchwc(<const float *>tx._data, form, <const float *>u._data, bptr,
                             <float *>out._data, &g, nt, wsp)
    if rc == MT_NN_NONFINITE:       # Winograd met NaN, inf or a huge value in x: the direct kernel
        form = mt_conv2d_nchwc_form(&g, blocked, 0)
        u = _packed_weights(<Tensor>weight, tw, MT_FLOAT32, &g, _NCHWC, form, nt)
        nb = mt_conv2d_nchwc_workspace(&g, form, nt)
        ws = _workspace(op, nb, tx._device, None if nb != MT_NN_EOVERFLOW else
                        f"x {shape_tuple(tx)}, weight {shape_tuple(tw)}, padding {(g.ph, g.pw)}")
        wsp = ws._data
        with nogil:
            rc = kn.conv2d_nchwc(<const float *>tx._data, form, <const float *>u._data, bptr,
                                 <float *>out._data, &g, nt, wsp)
    _check_rc(op, rc, tx._device)
    return out


cdef tuple _pw_dw_operands(str op, Tensor tx, weight, bias, dw_weight, dw_bias, stride, padding, act, dw_act,
                           mt_conv2d_geom *g1, mt_conv2d_geom *g2):
    """The checks of a pointwise conv (weight [E, C, 1, 1]) of the NCHW16c
    ``tx`` and the depthwise conv (dw_weight [E, 1, KH, KW]) of its output,
    filling their geometries ``g1`` and ``g2``; returns (weight, dw_weight,
    bias, dw_bias) as float32 CPU tensors (the biases None or [E])."""
    cdef Tensor tw = _f32_cpu(op, "weight", weight), tw2 = _f32_cpu(op, "dw_weight", dw_weight)
    _check_4d(op, "weight", tw, "[E, C, 1, 1]")
    _check_4d(op, "dw_weight", tw2, "[E, 1, KH, KW]")
    cdef int64_t e = tw._shape[0], c = tw._shape[1], kh = tw2._shape[2], kw = tw2._shape[3]
    if tw._shape[2] != 1 or tw._shape[3] != 1:
        raise ValueError(f"{op}: weight must be [E, C, 1, 1] (pointwise), got {shape_tuple(tw)}")
    if tw2._shape[0] != e or tw2._shape[1] != 1 or kh < 1 or kw < 1:
        raise ValueError(f"{op}: dw_weight must be [{e}, 1, KH, KW] (depthwise over weight's {e} "
                         f"channels), got {shape_tuple(tw2)}")
    _nchwc_x(op, tx, c)
    cdef int64_t n = tx._shape[0], h = tx._shape[2], w = tx._shape[3]
    cdef Tensor tb = _nchwc_bias(op, "bias", bias, e), tb2 = _nchwc_bias(op, "dw_bias", dw_bias, e)
    # (the geometry errors say which conv: an x with no rows fails the
    # pointwise conv's, as the two separate calls would)
    _nchwc_geom(f"{op} (pointwise conv)", g1, n, c, h, w, e, 1, 1, 1, 0, 1, 1, act)
    # groups > 1 is what makes the packing depthwise's, one channel included
    _nchwc_geom(f"{op} (depthwise conv)", g2, n, e, h, w, e, kh, kw, stride, padding, 1, max(e, 2), dw_act)
    return tw, tw2, tb, tb2


@core_op
def conv2d_nchwc_pw_dw(x, weight, bias, dw_weight, dw_bias, stride=1, padding=0, act="none",
                       dw_act="none"):
    """A pointwise conv and the depthwise conv that reads its output, in one
    call on NCHW16c tensors: ``conv2d_nchwc(conv2d_nchwc(x, weight, bias,
    act=act), dw_weight, dw_bias, stride, padding, groups=E, act=dw_act)``
    without the E-channel tensor between them (MobileNet's expansion and
    depthwise layers; see optimize()'s FusePointwiseDepthwise).

    Args:
        x: float32 [N, ceil(C/16), H, W, 16] (NCHW16c).
        weight: float32 [E, C, 1, 1]; bias: float32 [E] or None.
        dw_weight: float32 [E, 1, KH, KW]; dw_bias: float32 [E] or None.
        stride, padding: the depthwise conv's, as :func:`conv2d`
            (dilation 1).
        act, dw_act: the two convs' activations, as :func:`conv2d_act`.

    Returns:
        float32 [N, ceil(E/16), OH, OW, 16]; the channels past E are
        dw_act(0).

    Raises:
        TypeError: a tensor that is not float32 on the CPU.
        ValueError: shapes that do not fit, an unknown act.

    >>> import mgtrace as mt
    >>> x = to_nchwc(mt.tensor(np.ones((1, 2, 3, 3), np.float32)))
    >>> y = conv2d_nchwc_pw_dw(x, mt.tensor(np.ones((1, 2, 1, 1), np.float32)), None,
    ...                        mt.tensor(np.ones((1, 1, 3, 3), np.float32)), None, padding=1)
    >>> from_nchwc(y, 1)[0, 0].tolist()
    [[8.0, 12.0, 8.0], [12.0, 18.0, 12.0], [8.0, 12.0, 8.0]]
    """
    cdef str op = "conv2d_nchwc_pw_dw"
    cdef Tensor tx = _f32_cpu(op, "x", x), tw, tw2, tb, tb2, out
    cdef mt_conv2d_geom g1, g2
    cdef int rc, nt
    tw, tw2, tb, tb2 = _pw_dw_operands(op, tx, weight, bias, dw_weight, dw_bias, stride, padding, act, dw_act,
                                       &g1, &g2)
    cdef int64_t oshape[5]
    oshape[0], oshape[1], oshape[2], oshape[3], oshape[4] = g1.n, _blocks(g1.o), g2.oh, g2.ow, 16
    out = _nchwc_out(op, oshape, tx._device)
    if numel(out) == 0:
        return out
    nt = num_threads()
    cdef Tensor u1 = _packed_weights(<Tensor>weight, tw, MT_FLOAT32, &g1, _NCHWC, 1, nt)
    cdef Tensor u2 = _packed_weights(<Tensor>dw_weight, tw2, MT_FLOAT32, &g2, _NCHWC, 1, nt)
    cdef int64_t nb = mt_conv2d_nchwc_pw_dw_workspace(&g1, &g2, nt)
    cdef Tensor ws = _workspace(op, nb, tx._device, None if nb != MT_NN_EOVERFLOW else
                                f"x {shape_tuple(tx)}, dw_weight {shape_tuple(tw2)}")
    cdef const float *b1 = <const float *>tb._data if tb is not None else NULL
    cdef const float *b2 = <const float *>tb2._data if tb2 is not None else NULL
    cdef const mt_nn_kernels *kn = _kernels(op, tx)
    _need(kn.conv2d_nchwc_pw_dw != NULL, op, tx)
    with nogil:
        rc = kn.conv2d_nchwc_pw_dw(<const float *>tx._data, <const float *>u1._data, b1,
                                   <const float *>u2._data, b2, <float *>out._data, &g1, &g2, nt, ws._data)
    _check_rc(op, rc, tx._device)
    return out


@core_op
def conv2d_nchwc_pw_dw_pw(x, weight, bias, dw_weight, dw_bias, proj_weight, proj_bias, residual=None,
                          stride=1, padding=0, act="none", dw_act="none", proj_act="none"):
    """An inverted-residual block (MobileNetV2's) in one call on NCHW16c
    tensors: ``conv2d_nchwc(conv2d_nchwc_pw_dw(x, weight, bias, dw_weight,
    dw_bias, stride, padding, act, dw_act), proj_weight, proj_bias,
    residual, act=proj_act)``, with one output tensor and one parallel
    region where the two calls have two of each (see optimize()'s
    FusePointwiseDepthwise).

    Args:
        x: float32 [N, ceil(C/16), H, W, 16] (NCHW16c).
        weight: float32 [E, C, 1, 1]; bias: float32 [E] or None.
        dw_weight: float32 [E, 1, KH, KW]; dw_bias: float32 [E] or None.
        proj_weight: float32 [O, E, 1, 1]; proj_bias: float32 [O] or None.
        residual: None, or float32 NCHW16c of the output's shape.
        stride, padding: the depthwise conv's, as :func:`conv2d`
            (dilation 1).
        act, dw_act, proj_act: the three convs' activations, as
            :func:`conv2d_act`.

    Returns:
        float32 [N, ceil(O/16), OH, OW, 16]; the channels past O are
        proj_act(0).

    Raises:
        TypeError: a tensor that is not float32 on the CPU.
        ValueError: shapes that do not fit, an unknown act.

    >>> import mgtrace as mt
    >>> x = to_nchwc(mt.tensor(np.ones((1, 2, 3, 3), np.float32)))
    >>> one = lambda *s: mt.tensor(np.ones(s, np.float32))
    >>> y = conv2d_nchwc_pw_dw_pw(x, one(1, 2, 1, 1), None, one(1, 1, 3, 3), None, one(2, 1, 1, 1), None,
    ...                           padding=1)
    >>> from_nchwc(y, 2)[0, 1].tolist()
    [[8.0, 12.0, 8.0], [12.0, 18.0, 12.0], [8.0, 12.0, 8.0]]
    """
    cdef str op = "conv2d_nchwc_pw_dw_pw"
    cdef Tensor tx = _f32_cpu(op, "x", x), tw, tw2, tb, tb2
    cdef Tensor tw3 = _f32_cpu(op, "proj_weight", proj_weight)
    cdef Tensor tr = None, out       # (tr: the residual the kernel reads, alive until it has)
    cdef mt_conv2d_geom g1, g2, g3
    cdef int rc, nt
    tw, tw2, tb, tb2 = _pw_dw_operands(op, tx, weight, bias, dw_weight, dw_bias, stride, padding, act, dw_act,
                                       &g1, &g2)
    _check_4d(op, "proj_weight", tw3, "[O, E, 1, 1]")
    cdef int64_t e = g1.o, o = tw3._shape[0]
    if tw3._shape[1] != e or tw3._shape[2] != 1 or tw3._shape[3] != 1:
        raise ValueError(f"{op}: proj_weight must be [O, {e}, 1, 1] (pointwise over weight's {e} "
                         f"channels), got {shape_tuple(tw3)}")
    cdef Tensor tb3 = _nchwc_bias(op, "proj_bias", proj_bias, o)
    _nchwc_geom(f"{op} (projection conv)", &g3, g1.n, e, g2.oh, g2.ow, o, 1, 1, 1, 0, 1, 1, proj_act)
    cdef int64_t oshape[5]
    oshape[0], oshape[1], oshape[2], oshape[3], oshape[4] = g1.n, _blocks(o), g2.oh, g2.ow, 16
    out = _nchwc_out(op, oshape, tx._device)
    if residual is not None:
        tr = _nchwc_residual(op, residual, out, &g3)
    if numel(out) == 0:
        return out
    nt = num_threads()
    cdef Tensor u1 = _packed_weights(<Tensor>weight, tw, MT_FLOAT32, &g1, _NCHWC, 1, nt)
    cdef Tensor u2 = _packed_weights(<Tensor>dw_weight, tw2, MT_FLOAT32, &g2, _NCHWC, 1, nt)
    cdef Tensor u3 = _packed_weights(<Tensor>proj_weight, tw3, MT_FLOAT32, &g3, _NCHWC, 1, nt)
    cdef int64_t nb = mt_conv2d_nchwc_pw_dw_pw_workspace(&g1, &g2, &g3, nt)
    cdef Tensor ws = _workspace(op, nb, tx._device, None if nb != MT_NN_EOVERFLOW else
                                f"x {shape_tuple(tx)}, dw_weight {shape_tuple(tw2)}")
    cdef const float *b1 = <const float *>tb._data if tb is not None else NULL
    cdef const float *b2 = <const float *>tb2._data if tb2 is not None else NULL
    cdef const float *b3 = <const float *>tb3._data if tb3 is not None else NULL
    cdef const mt_nn_kernels *kn = _kernels(op, tx)
    _need(kn.conv2d_nchwc_pw_dw_pw != NULL, op, tx)
    with nogil:
        rc = kn.conv2d_nchwc_pw_dw_pw(<const float *>tx._data, <const float *>u1._data, b1,
                                      <const float *>u2._data, b2, <const float *>u3._data, b3,
                                      <float *>out._data, &g1, &g2, &g3, nt, ws._data)
    _check_rc(op, rc, tx._device)
    return out


@core_op
def to_nchwc(x):
    """NCHW to NCHW16c: float32 [N, C, H, W] -> [N, ceil(C/16), H, W, 16]
    with ``y[n, c // 16, h, w, c % 16] = x[n, c, h, w]`` and zeros for the
    channels past C (the layout :func:`conv2d_nchwc` reads).

    Raises:
        TypeError: x not a float32 CPU tensor.
        ValueError: x not 4-D.

    >>> import mgtrace as mt
    >>> to_nchwc(mt.tensor(np.ones((1, 3, 1, 1), np.float32))).shape
    (1, 1, 1, 1, 16)
    """
    cdef str op = "to_nchwc"
    cdef Tensor tx = _f32_cpu(op, "x", x)
    _check_4d(op, "x", tx, "[N, C, H, W]")
    n, c, h, w = shape_tuple(tx)
    return _reorder(tx, (n, _blocks(c), h, w, 16), n, c, h * w, True)


cdef Tensor _reorder(Tensor tx, tuple out_shape, int64_t n, int64_t c, int64_t hw, bint to_blocked):
    """A new float32 tensor of ``out_shape``: tx (n images of c channels of
    hw pixels) reordered to NCHW16c, or back."""
    cdef int64_t oshape[5]
    cdef int i
    for i in range(len(out_shape)):
        oshape[i] = out_shape[i]
    cdef Tensor out = empty(len(out_shape), oshape, MT_FLOAT32, tx._device)
    cdef int nt = num_threads()
    cdef const mt_nn_kernels *kn = _kernels("to_nchwc" if to_blocked else "from_nchwc", tx)
    _need((kn.to_nchwc if to_blocked else kn.from_nchwc) != NULL,
          "to_nchwc" if to_blocked else "from_nchwc", tx)
    with nogil:
        if to_blocked:
            kn.to_nchwc(<const float *>tx._data, <float *>out._data, n, c, hw, nt)
        else:
            kn.from_nchwc(<const float *>tx._data, <float *>out._data, n, c, hw, nt)
    return out


@core_op
def from_nchwc(x, channels):
    """NCHW16c to NCHW: float32 [N, B, H, W, 16] -> [N, channels, H, W],
    the first ``channels`` channels (the inverse of :func:`to_nchwc`).

    Raises:
        TypeError: x not a float32 CPU tensor, channels not an int.
        ValueError: x not [N, B, H, W, 16], or channels not in
            (16 * (B - 1), 16 * B].

    >>> import mgtrace as mt
    >>> x = mt.tensor(np.arange(3, dtype=np.float32).reshape(1, 3, 1, 1))
    >>> from_nchwc(to_nchwc(x), 3).tolist()
    [[[[0.0]], [[1.0]], [[2.0]]]]
    """
    cdef str op = "from_nchwc"
    cdef Tensor tx = _f32_cpu(op, "x", x)
    c = A.to_int(op, "channels", channels, 0)
    if tx._ndim != 5 or tx._shape[4] != 16:
        raise ValueError(f"{op}: x must be NCHW16c [N, B, H, W, 16], got shape {shape_tuple(tx)}")
    n, b, h, w, _ = shape_tuple(tx)
    if -(-c // 16) != b:       # (in Python ints: a channels past int64 is this error too)
        raise ValueError(f"{op}: {c} channels do not fill {b} blocks of 16 (want "
                         f"{16 * b - 15}..{16 * b})")
    return _reorder(tx, (n, c, h, w), n, c, h * w, False)


def _wide_conv_kernels():
    """Whether DIRECT and BLOCKED run their AVX-512 kernels (the CPU has
    AVX-512 and the test switch below is off); AUTO picks BLOCKED only then."""
    return mt_conv2d_packed_layout(MT_CONV_BLOCKED) == 64


def _direct_force_narrow(bint on):
    """Tests: run the DIRECT and BLOCKED convs' AVX2/baseline micro-kernels
    even on a CPU with AVX-512 (``False``: pick by CPU again)."""
    mt_conv2d_direct_force_narrow(on)


cdef int _shape_geom(mt_conv2d_geom *g, x_shape, weight_shape, stride, padding, dilation, groups) except -1:
    """Fills ``g`` (no epilogue) for conv2d's shapes alone, as conv2d checks them."""
    n, c, h, w = x_shape
    o, cg, kh, kw = weight_shape
    groups = _groups("conv2d", groups)
    if c % groups or o % groups or cg * groups != c:
        raise ValueError(f"conv2d: groups={groups!r} does not fit x channels {c} and weight {tuple(weight_shape)}")
    g.n, g.c, g.h, g.w, g.o, g.kh, g.kw = n, c, h, w, o, kh, kw
    g.sh, g.sw = _positive("conv2d", "stride", stride)
    g.ph, g.pw = _nonneg("conv2d", "padding", padding)
    g.dh, g.dw = _positive("conv2d", "dilation", dilation)
    g.groups = groups
    g.act, g.has_res, g.res_delta = MT_ACT_NONE, 0, 0
    if kh < 1 or kw < 1:
        raise ValueError(f"conv2d: kernel size must be positive, got weight shape {tuple(weight_shape)}")
    g.oh = mt_window_out(h, kh, g.sh, g.ph, g.dh, 0)
    g.ow = mt_window_out(w, kw, g.sw, g.pw, g.dw, 0)
    if g.oh < 1 or g.ow < 1:
        raise ValueError(_no_window("conv2d", (kh, kw), (g.dh, g.dw), (h, w), (g.ph, g.pw)))
    return 0


def conv2d_algorithm(x_shape, weight_shape, stride=1, padding=0, dilation=1, groups=1, cached=False):
    """The algorithm conv2d picks for these shapes: "winograd4" (F(4x4, 3x3)),
    "winograd" (F(2x2, 3x3)), "blocked", "direct", "shifted", "im2col",
    "gemm1x1" or "depthwise" (for benchmarks and tests). ``cached``: for a
    weight whose packed copy conv2d caches (a weight in memory that mgtrace
    tracks, see ``WEIGHT_CACHE_BYTES``; the default False answers for one
    packed on every call): BLOCKED (on a CPU with AVX-512; DIRECT without)
    then takes the strided layers and the 3x3 layers with few Winograd
    tiles (ResNet-18's last three stages at batch 1), and Winograd pays
    from 32 tiles whatever its size.

    >>> conv2d_algorithm((8, 64, 56, 56), (64, 64, 3, 3), padding=1)
    'winograd4'
    >>> conv2d_algorithm((8, 256, 14, 14), (256, 256, 3, 3), padding=1)
    'winograd'
    >>> conv2d_algorithm((8, 128, 28, 28), (128, 128, 3, 3), padding=1, cached=True)
    'winograd4'
    """
    cdef mt_conv2d_geom g
    _shape_geom(&g, x_shape, weight_shape, stride, padding, dilation, groups)
    return _ALGO_NAMES[mt_conv2d_pick_algo_ex(&g, 1 if cached else 0)]


def conv2d_nchwc_algorithm(x_shape, weight_shape, stride=1, padding=0, dilation=1, groups=1):
    """The algorithm :func:`conv2d_nchwc` picks for an NCHW16c input of the
    NCHW shape ``x_shape``: for a dense 3x3 conv, stride 1, no dilation,
    with 16 or more input channels and 32 or more 2x2 output tiles in the
    batch, "winograd4" (F(4x4, 3x3): with 48 or more 4x4 tiles and its
    transformed weights, 36 floats a kernel, within 12 MiB; it rounds more
    than F(2x2): an rms error about 3e-6 of the rms output against 5e-7
    with 256-512 channels, the largest up to 3e-5 of the largest output
    over random shapes against 2e-6) or
    "winograd" (F(2x2, 3x3)); otherwise "depthwise" or "direct".

    >>> conv2d_nchwc_algorithm((1, 256, 14, 14), (256, 256, 3, 3), padding=1)
    'winograd'
    >>> conv2d_nchwc_algorithm((1, 64, 56, 56), (64, 64, 3, 3), padding=1)
    'winograd4'
    >>> conv2d_nchwc_algorithm((1, 512, 7, 7), (512, 512, 3, 3), padding=1)
    'direct'
    """
    cdef mt_conv2d_geom g
    _shape_geom(&g, x_shape, weight_shape, stride, padding, dilation, groups)
    if g.groups > 1:
        return "depthwise"
    cdef int form = mt_conv2d_nchwc_form(&g, 1, _nchwc_winograd)
    return "winograd4" if form == MT_NCHWC_WINOGRAD4 else "winograd" if form == MT_NCHWC_WINOGRAD else "direct"


@core_op
def conv_transpose2d(x, weight, bias=None, stride=1, padding=0, output_padding=0, dilation=1, groups=1):
    """2-D transposed convolution (the gradient of conv2d with respect to its input).

    Args:
        x: float [N, C, H, W].
        weight: float [C, O / groups, KH, KW] (PyTorch's layout).
        bias: float [O] or None.
        stride, padding, output_padding, dilation: int or (h, w) pair;
            output_padding must be smaller than stride or dilation.
        groups: int >= 1 dividing C.

    Returns:
        [N, O, OH, OW] with OH = (H - 1)*sh - 2*ph + dh*(KH - 1) + oph + 1,
        in the promoted float dtype, on the arguments' device.

    Raises:
        ValueError, TypeError, NotImplementedError: as :func:`conv2d`.

    >>> import mgtrace as mt
    >>> x = mt.tensor(np.ones((1, 2, 3, 3), np.float32))
    >>> w = mt.tensor(np.ones((2, 4, 3, 3), np.float32))
    >>> conv_transpose2d(x, w, stride=2, padding=1, output_padding=1).shape
    (1, 4, 6, 6)
    """
    cdef str op = "conv_transpose2d"
    cdef Tensor tx, tw, tb = None, out
    cdef int code, work, rc, nt
    cdef mt_conv2d_geom g
    tx, tw, tb_obj, code = _conv_operands(op, x, weight, bias)
    cdef const mt_nn_kernels *kn = _kernels(op, tx)
    _need(kn.conv_transpose2d != NULL and kn.conv_transpose2d_workspace != NULL, op, tx)
    _check_4d(op, "x", tx, "[N, C, H, W]")
    _check_4d(op, "weight", tw, "[C, O / groups, KH, KW]")
    groups = _groups(op, groups)
    sh, sw = _positive(op, "stride", stride)
    ph, pw = _nonneg(op, "padding", padding)
    oph, opw = _nonneg(op, "output_padding", output_padding)
    dh, dw = _positive(op, "dilation", dilation)
    n, c, h, w = shape_tuple(tx)
    cw, og, kh, kw = shape_tuple(tw)
    if cw != c:
        raise ValueError(f"{op}: x has {c} channels but weight.shape[0] is {cw}")
    if c % groups:
        raise ValueError(f"{op}: groups={groups} does not divide the {c} input channels")
    if kh < 1 or kw < 1:
        raise ValueError(f"{op}: kernel size must be positive, got weight shape {shape_tuple(tw)}")
    if (oph >= sh and oph >= dh) or (opw >= sw and opw >= dw):
        raise ValueError(f"{op}: output_padding {(oph, opw)} must be smaller than either stride "
                         f"{(sh, sw)} or dilation {(dh, dw)}")
    o = og * groups
    if tb_obj is not None:
        tb = <Tensor>tb_obj
        if shape_tuple(tb) != (o,):
            raise ValueError(f"{op}: bias must have shape ({o},), got {shape_tuple(tb)}")
    oh = (h - 1) * sh - 2 * ph + dh * (kh - 1) + oph + 1
    ow = (w - 1) * sw - 2 * pw + dw * (kw - 1) + opw + 1
    if oh < 1 or ow < 1:
        raise ValueError(f"{op}: padding {(ph, pw)} leaves no output for input ({h}, {w}) and kernel "
                         f"({kh}, {kw}): output would be ({oh}, {ow})")
    _check_numel(op, (n, o, oh, ow), f"stride {(sh, sw)} and dilation {(dh, dw)} on input ({h}, {w})")
    _check_blas(op, (h * w, og * kh * kw, c))
    g.n, g.c, g.h, g.w = n, c, h, w
    g.o, g.kh, g.kw, g.oh, g.ow = o, kh, kw, oh, ow
    g.sh, g.sw, g.ph, g.pw, g.dh, g.dw, g.groups = sh, sw, ph, pw, dh, dw, groups
    g.act, g.has_res, g.res_delta = MT_ACT_NONE, 0, 0
    work = _work_code(code)
    tx = _ready(tx, work)
    cdef Tensor tw_orig = tw
    tw = _ready(tw, work)
    cdef const void *bptr = NULL
    if tb is not None:
        tb = _ready(tb, work)
        bptr = tb._data
    cdef int64_t oshape[4]
    oshape[0], oshape[1], oshape[2], oshape[3] = n, o, oh, ow
    out = empty(4, oshape, work, tx._device)
    nt = num_threads()
    cdef Tensor ws = _workspace(op, kn.conv_transpose2d_workspace(work, &g, nt), tx._device,
                                f"x {shape_tuple(tx)}, weight {shape_tuple(tw)}, groups {groups}")
    cdef void *wsp = ws._data if ws is not None else NULL
    with nogil:
        rc = kn.conv_transpose2d(work, tx._data, tw._data, bptr, out._data, &g, nt, wsp)
    _check_rc(op, rc, tx._device)
    return _finish(out, code)


# ------------------------------------------------------------------ pooling

cdef Tensor _pool_input(str op, x):
    cdef Tensor t = _operand1(op, x)
    _float_code(op, [t])
    _check_4d(op, "x", t, "[N, C, H, W]")
    return t


cdef str _no_window(str op, tuple k, tuple d, tuple size, tuple p):
    """The one message for a window with no output (mt_window_out's -1)."""
    padded = tuple(size[i] + 2 * p[i] for i in range(len(size)))
    return f"{op}: kernel {k} with dilation {d} is larger than the padded input {padded}"


def window_output_size(op, size, kernel, stride, padding, dilation, ceil_mode=False):
    """The output size of a sliding window (a convolution's kernel or a
    pooling window) along each axis: ``(size + 2 * padding - dilation *
    (kernel - 1) - 1) // stride + 1``, rounded up with ``ceil_mode`` as
    long as the last window starts inside the input or the left padding
    (PyTorch's ``pooling_output_shape``, MegEngine's pooling). The rule of
    every conv and pool path, in C (``mt_window_out``, contract/geometry.h).

    Args:
        op: str, the calling op's name for the error message.
        size, kernel, stride, padding, dilation: tuples of ints, one per
            axis, of one length; kernel, stride and dilation >= 1, size and
            padding >= 0, each below 2**63 (the callers check their ranges).
        ceil_mode: bool, pooling's ceil_mode.

    Returns:
        tuple of ints, the output size of each axis (each >= 1).

    Raises:
        ValueError: "<op>: kernel K with dilation D is larger than the
            padded input P" when an axis has no output.

    >>> window_output_size("conv2d", (7, 7), (3, 3), (2, 2), (1, 1), (1, 1))
    (4, 4)
    >>> window_output_size("max_pool2d", (5,), (2,), (2,), (0,), (1,), ceil_mode=True)
    (3,)
    """
    n = len(size)
    out = tuple(mt_window_out(size[i], kernel[i], stride[i], padding[i], dilation[i], 1 if ceil_mode else 0)
                for i in range(n))
    if min(out, default=1) < 1:
        raise ValueError(_no_window(op, tuple(kernel), tuple(dilation), tuple(size), tuple(padding)))
    return out


cdef tuple _pool_geom(str op, int64_t planes, int64_t h, int64_t w, kernel_size, stride, padding, dilation,
                      bint ceil_mode, mt_pool2d_geom *g):
    """Fills ``g`` for pooling ``planes`` planes of h x w; returns (oh, ow).
    ValueError for bad geometry or an empty output."""
    kh, kw = _positive(op, "kernel_size", kernel_size)
    sh, sw = (kh, kw) if stride is None or (isinstance(stride, (tuple, list)) and len(stride) == 0) \
        else _positive(op, "stride", stride)
    ph, pw = _nonneg(op, "padding", padding)
    dh, dw = _positive(op, "dilation", dilation)
    if ph > kh // 2 or pw > kw // 2:
        raise ValueError(f"{op}: padding {(ph, pw)} must be at most half the kernel size {(kh, kw)}")
    oh = mt_window_out(h, kh, sh, ph, dh, ceil_mode)
    ow = mt_window_out(w, kw, sw, pw, dw, ceil_mode)
    if oh < 1 or ow < 1:
        raise ValueError(_no_window(op, (kh, kw), (dh, dw), (h, w), (ph, pw)))
    g.planes, g.h, g.w, g.oh, g.ow = planes, h, w, oh, ow
    g.kh, g.kw, g.sh, g.sw, g.ph, g.pw, g.dh, g.dw = kh, kw, sh, sw, ph, pw, dh, dw
    return oh, ow


cdef object _pool2d(str op, x, kernel_size, stride, padding, dilation, bint ceil_mode, bint count_include_pad):
    cdef Tensor t = _pool_input(op, x), out
    cdef int code = t._dtype, work = _work_code(code), rc, nt
    cdef mt_pool2d_geom g
    n, c, h, w = shape_tuple(t)
    oh, ow = _pool_geom(op, n * c, h, w, kernel_size, stride, padding, dilation, ceil_mode, &g)
    g.count_include_pad = count_include_pad
    t = _ready(t, work)
    cdef int64_t oshape[4]
    oshape[0], oshape[1], oshape[2], oshape[3] = n, c, oh, ow
    out = empty(4, oshape, work, t._device)
    nt = num_threads()
    cdef const mt_nn_kernels *kn = _kernels(op, t)
    if op == "max_pool2d":
        _need(kn.max_pool2d != NULL, op, t)
        with nogil:
            rc = kn.max_pool2d(work, t._data, out._data, &g, nt)
    else:
        _need(kn.avg_pool2d != NULL, op, t)
        with nogil:
            rc = kn.avg_pool2d(work, t._data, out._data, &g, nt)
    _check_rc(op, rc, t._device)
    return _finish(out, code)


@core_op
def max_pool2d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
    """2-D max pooling (PyTorch semantics).

    Args:
        x: float [N, C, H, W].
        kernel_size: int or (h, w).
        stride: int or (h, w); None means kernel_size.
        padding: int or (h, w), at most half the kernel; padded positions
            never win (they count as -inf).
        dilation: int or (h, w) >= 1.
        ceil_mode: round the output size up; the last window must still
            start inside the input or its left padding.

    Returns:
        [N, C, OH, OW], OH = floor_or_ceil((H + 2*ph - dh*(KH-1) - 1) / sh) + 1,
        same dtype as x. NaN in a window gives NaN.

    Raises:
        ValueError: bad geometry or an empty output. TypeError: integer input.
    """
    return _pool2d("max_pool2d", x, kernel_size, stride, padding, dilation, ceil_mode, True)


@core_op
def max_pool2d_nchwc(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
    """:func:`max_pool2d` of an NCHW16c tensor (channels in blocks of 16,
    see :func:`conv2d_nchwc`), the result NCHW16c too.

    Args:
        x: float32 [N, B, H, W, 16].
        kernel_size, stride, padding, dilation, ceil_mode: as :func:`max_pool2d`.

    Returns:
        float32 [N, B, OH, OW, 16]: ``to_nchwc(max_pool2d(from_nchwc(x, C),
        ...))`` for the channels C that x holds (the channels past them are
        pooled too: zeros stay zeros, except in a window that holds no
        input, which dilation can make: -inf in every lane).

    Raises:
        TypeError: x not a float32 CPU tensor.
        ValueError: x not [N, B, H, W, 16]; as :func:`max_pool2d`.

    >>> import mgtrace as mt
    >>> x = to_nchwc(mt.tensor(np.arange(4, dtype=np.float32).reshape(1, 1, 2, 2)))
    >>> from_nchwc(max_pool2d_nchwc(x, 2), 1).tolist()
    [[[[3.0]]]]
    """
    cdef str op = "max_pool2d_nchwc"
    cdef Tensor t = _f32_cpu(op, "x", x), out
    cdef mt_pool2d_geom g
    cdef int rc, nt
    if t._ndim != 5 or t._shape[4] != 16:
        raise ValueError(f"{op}: x must be NCHW16c [N, B, H, W, 16], got shape {shape_tuple(t)}")
    n, b, h, w, _ = shape_tuple(t)
    oh, ow = _pool_geom(op, n * b, h, w, kernel_size, stride, padding, dilation, ceil_mode, &g)
    g.count_include_pad = 0
    cdef int64_t oshape[5]
    oshape[0], oshape[1], oshape[2], oshape[3], oshape[4] = n, b, oh, ow, 16
    out = empty(5, oshape, MT_FLOAT32, t._device)
    nt = num_threads()
    cdef const mt_nn_kernels *kn = _kernels(op, t)
    _need(kn.max_pool2d_nchwc != NULL, op, t)
    with nogil:
        rc = kn.max_pool2d_nchwc(<const float *>t._data, <float *>out._data, &g, nt)
    _check_rc(op, rc, t._device)
    return out


@core_op
def avg_pool2d(x, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True):
    """2-D average pooling (PyTorch semantics).

    Args:
        x: float [N, C, H, W].
        kernel_size, stride (None: kernel_size), padding: as :func:`max_pool2d`.
        ceil_mode: as :func:`max_pool2d`; windows reaching past the right
            padding are cut there.
        count_include_pad: divide by the window size including zero padding
            (True), or by the number of input elements in it (False).

    Returns:
        [N, C, OH, OW], same dtype as x.

    Raises:
        ValueError: bad geometry or an empty output. TypeError: integer input.
    """
    return _pool2d("avg_pool2d", x, kernel_size, stride, padding, 1, ceil_mode, count_include_pad)


cdef object _adaptive(str op, x, output_size, int kind):
    cdef Tensor t = _pool_input(op, x), out
    cdef int code = t._dtype, work = _work_code(code), rc, nt
    n, c, h, w = shape_tuple(t)
    oh, ow = A.pair(op, "output_size", output_size, 1, allow_none=True)
    oh = h if oh is None else oh                 # None keeps that axis
    ow = w if ow is None else ow
    if h < 1 or w < 1:
        raise ValueError(f"{op}: input spatial size must be non-zero, got ({h}, {w})")
    _check_numel(op, (n, c, oh, ow), f"output_size {output_size!r}")
    t = _ready(t, work)
    cdef int64_t oshape[4]
    oshape[0], oshape[1], oshape[2], oshape[3] = n, c, oh, ow
    out = empty(4, oshape, work, t._device)
    cdef int64_t planes = n * c, ih = h, iw = w, toh = oh, tow = ow
    nt = num_threads()
    cdef const mt_nn_kernels *kn = _kernels(op, t)
    _need(kn.adaptive_pool2d != NULL, op, t)
    with nogil:
        rc = kn.adaptive_pool2d(work, kind, t._data, out._data, planes, ih, iw, toh, tow, nt)
    _check_rc(op, rc, t._device)
    return _finish(out, code)


@core_op
def adaptive_avg_pool2d(x, output_size):
    """Average pooling to a fixed output size (PyTorch's windows: output i of
    m along an axis of n averages [floor(i*n/m), ceil((i+1)*n/m))).

    Args:
        x: float [N, C, H, W] with H, W >= 1.
        output_size: int or (oh, ow); a None entry keeps that input size.

    Returns:
        [N, C, oh, ow], same dtype as x.
    """
    return _adaptive("adaptive_avg_pool2d", x, output_size, MT_ADAPTIVE_AVG)


@core_op
def adaptive_max_pool2d(x, output_size):
    """Max pooling to a fixed output size (windows as :func:`adaptive_avg_pool2d`).

    Returns the values only (no indices), same dtype as x.
    """
    return _adaptive("adaptive_max_pool2d", x, output_size, MT_ADAPTIVE_MAX)


# ------------------------------------------------------------------ resize

@core_op
def interpolate(x, size=None, scale_factor=None, mode="nearest", align_corners=None):
    """Resize the two spatial axes of x (PyTorch's F.interpolate coordinate rules).

    Args:
        x: float [N, C, H, W].
        size: int or (oh, ow); or
        scale_factor: float or (fh, fw) > 0, output = floor(input * factor);
            the factor itself (not the rounded size) maps coordinates, as in
            PyTorch with recompute_scale_factor unset. Give exactly one.
        mode: "nearest" (source floor(dst * in/out)) or "bilinear".
        align_corners: bilinear only; False/None uses half-pixel centres
            (clamped at 0), True maps corner pixels onto corner pixels.

    Returns:
        [N, C, oh, ow], same dtype as x.

    Raises:
        ValueError: unknown mode, both or neither of size and scale_factor,
            align_corners with nearest, an empty output.
    """
    cdef str op = "interpolate"
    cdef Tensor t = _operand1(op, x), out
    _float_code(op, [t])
    _check_4d(op, "x", t, "[N, C, H, W]")
    if mode not in _INTERP_MODES:
        raise ValueError(f"{op}: unsupported mode {mode!r}; expected one of {', '.join(_INTERP_MODES)}")
    if mode == "nearest" and align_corners is not None:
        raise ValueError(f"{op}: align_corners can only be set with mode='bilinear'")
    if (size is None) == (scale_factor is None):
        raise ValueError(f"{op}: give exactly one of size and scale_factor")
    n, c, h, w = shape_tuple(t)
    cdef double fh = 0, fw = 0
    if size is not None:
        oh, ow = _positive(op, "size", size)
    else:
        if isinstance(scale_factor, (tuple, list)):
            if len(scale_factor) != 2:
                raise ValueError(f"{op}: scale_factor must be a number or a pair, got {scale_factor!r}")
            fh, fw = float(scale_factor[0]), float(scale_factor[1])
        elif isinstance(scale_factor, (int, float, np.integer, np.floating)) and not isinstance(scale_factor, bool):
            fh = fw = float(scale_factor)
        else:
            raise TypeError(f"{op}: scale_factor must be a number or a pair, got {scale_factor!r}")
        if not (fh > 0 and fw > 0) or fh == float("inf") or fw == float("inf"):
            raise ValueError(f"{op}: scale_factor must be positive and finite, got {scale_factor!r}")
        if h * fh >= MAX_GEOMETRY + 1 or w * fw >= MAX_GEOMETRY + 1:
            raise ValueError(f"{op}: scale_factor {scale_factor!r} gives an output size above "
                             f"{MAX_GEOMETRY} (2**31 - 1) for input ({h}, {w})")
        oh, ow = int(np.floor(h * fh)), int(np.floor(w * fw))
        if oh < 1 or ow < 1:
            raise ValueError(f"{op}: scale_factor {scale_factor!r} gives an empty output ({oh}, {ow}) "
                             f"for input ({h}, {w})")
    if h < 1 or w < 1:
        raise ValueError(f"{op}: input spatial size must be non-zero, got ({h}, {w})")
    _check_numel(op, (n, c, oh, ow), f"size {size!r}" if size is not None else f"scale_factor {scale_factor!r}")
    cdef int code = t._dtype, work = _work_code(code), rc, nt
    cdef int m = _INTERP_MODES[mode], ac = bool(align_corners)
    t = _ready(t, work)
    cdef int64_t oshape[4]
    oshape[0], oshape[1], oshape[2], oshape[3] = n, c, oh, ow
    out = empty(4, oshape, work, t._device)
    cdef int64_t planes = n * c, ih = h, iw = w, toh = oh, tow = ow
    nt = num_threads()
    cdef const mt_nn_kernels *kn = _kernels(op, t)
    _need(kn.resize2d != NULL, op, t)
    with nogil:
        rc = kn.resize2d(work, m, t._data, out._data, planes, ih, iw, toh, tow, fh, fw, ac, nt)
    _check_rc(op, rc, t._device)
    return _finish(out, code)


# ------------------------------------------------------------------ pad

cdef list _pad_pairs(object pad_width, int ndim):
    """np.pad's rule: pad_width broadcasts to [ndim, 2] (before, after) pairs,
    first axis first; so an int pads every side, one pair pads every axis."""
    if isinstance(pad_width, Tensor):
        pad_width = pad_width.tolist()
    try:
        arr = np.asarray(pad_width)
    except ValueError:
        arr = None
    # (Python ints too large for int64 make an object array: kept exact, so
    # that 2**63 is reported as too large rather than wrapped to negative)
    if arr is None or (arr.size and not (arr.dtype.kind in "iu" or arr.dtype.kind == "O" and all(
            _is_int(v) for v in arr.flat))):
        raise TypeError(f"pad: pad_width must be an int or (before, after) pairs of ints, "
                        f"got {pad_width!r}")
    if ndim == 0 and arr.size == 0:
        return []
    try:
        arr = np.broadcast_to(arr, (ndim, 2))
    except ValueError:
        raise ValueError(f"pad: pad_width needs one (before, after) pair per axis ({ndim} axes), "
                         f"got {pad_width!r}") from None
    pairs = [(int(b), int(a)) for b, a in arr.tolist()]
    for d, (b, a) in enumerate(pairs):
        if b < 0 or a < 0:
            raise ValueError(f"pad: padding must be non-negative, got {(b, a)} for axis {d}")
    return pairs


cdef int _wrap_edges(Tensor out, int nd, const int64_t *shape, const int64_t *before,
                     const int64_t *after) except -1:
    """Circular padding of ``out``, whose interior already holds x: axis by
    axis, each pad is block copies (of at most one period) from the
    interior along that axis, over the axes before it in full (padded
    already) and the axes after it in their interior."""
    cdef int d, k
    cdef int64_t vshape[16]
    cdef int64_t base, n, b, a, j0, cnt, st
    for d in range(nd):
        n, b, a = shape[d], before[d], after[d]
        if b == 0 and a == 0:
            continue
        base = 0
        for k in range(nd):
            vshape[k] = out._shape[k] if k < d else shape[k]
            if k > d:
                base += before[k] * out._strides[k]
        st = out._strides[d]
        j0 = 0
        while j0 < a:                  # out[b + n + j] = out[b + j % n]
            cnt = min(n, a - j0)
            vshape[d] = cnt
            copy_into(view_of(out, nd, vshape, out._strides, base + (b + n + j0) * st),
                      view_of(out, nd, vshape, out._strides, base + b * st))
            j0 += cnt
        j0 = 0
        while j0 < b:                  # out[b - 1 - j] = out[b + n - 1 - j % n]
            cnt = min(n, b - j0)
            vshape[d] = cnt
            copy_into(view_of(out, nd, vshape, out._strides, base + (b - j0 - cnt) * st),
                      view_of(out, nd, vshape, out._strides, base + (b + n - cnt) * st))
            j0 += cnt
    return 0


@core_op
def pad(x, pad_width, mode="constant", value=0.0):
    """Pad a tensor of any ndim and dtype (np.pad's pad_width layout).

    Args:
        x: tensor of any shape and dtype.
        pad_width: an int (every side of every axis); one (before, after)
            pair for every axis; or a sequence of ndim pairs, first axis first.
        mode: "constant" (fill with ``value``), "reflect" (mirror without
            repeating the edge: NumPy's and PyTorch's reflect), "replicate"
            (repeat the edge: NumPy's "edge") or "circular" (wrap around:
            NumPy's "wrap", PyTorch's circular; padding longer than the axis
            repeats it again).
        value: the fill for "constant", a Python scalar converted to x's dtype.

    Returns:
        a new tensor of x's dtype, each axis longer by before + after.

    Raises:
        ValueError: negative padding, a pair count that does not match ndim,
            reflect padding not smaller than its axis, replicate or circular
            padding of an empty axis, unknown mode.

    >>> import mgtrace as mt
    >>> pad(mt.tensor([1, 2, 3]), (2, 1), mode="reflect").tolist()
    [3, 2, 1, 2, 3, 2]
    >>> pad(mt.tensor([1, 2, 3]), (4, 2), mode="circular").tolist()
    [3, 1, 2, 3, 1, 2, 3, 1, 2]
    """
    cdef str op = "pad"
    cdef Tensor t = _operand1(op, x), out, inner
    if mode not in _PAD_MODES:
        raise ValueError(f"{op}: unsupported mode {mode!r}; expected one of {', '.join(_PAD_MODES)}")
    cdef int nd = t._ndim, d, rc, nt
    pairs = _pad_pairs(pad_width, nd)
    _check_numel(op, tuple([t._shape[d] + pairs[d][0] + pairs[d][1] for d in range(nd)]),
                 f"pad_width {pad_width!r}")
    cdef int64_t shape[16]
    cdef int64_t oshape[16]
    cdef int64_t before[16]
    cdef int64_t after[16]
    cdef int64_t offset = 0
    for d in range(nd):
        shape[d] = t._shape[d]
        before[d], after[d] = pairs[d]
        oshape[d] = shape[d] + before[d] + after[d]
        if mode == "reflect" and (before[d] >= shape[d] or after[d] >= shape[d]) and (before[d] or after[d]):
            raise ValueError(f"{op}: reflect padding {pairs[d]} on axis {d} must be smaller than the "
                             f"axis (size {shape[d]})")
        if mode in ("replicate", "circular") and shape[d] == 0 and (before[d] or after[d]):
            raise ValueError(f"{op}: cannot {mode}-pad axis {d} of size 0")
    out = empty(nd, oshape, t._dtype, t._device)
    if mode in ("constant", "circular"):
        if mode == "constant":
            fill(out, value)
        for d in range(nd):
            offset += before[d] * out._strides[d]
        if numel(t):
            inner = view_of(out, nd, shape, out._strides, offset)
            copy_into(inner, t)
        if mode == "circular" and numel(out):
            _wrap_edges(out, nd, shape, before, after)
        return out
    t = <Tensor>t.contiguous()
    cdef int m = MT_PAD_REFLECT if mode == "reflect" else MT_PAD_REPLICATE
    cdef int64_t isz = ITEMSIZE[t._dtype]
    nt = num_threads()
    cdef const mt_nn_kernels *kn = _kernels(op, t)
    _need(kn.pad_index != NULL, op, t)
    with nogil:
        rc = kn.pad_index(t._data, out._data, nd, shape, before, after, m, isz, nt)
    _check_rc(op, rc, t._device)
    return out



# ------------------------------------------------------------------ backward kernels
# The gradients mgtrace.autodiff.rules asks of the forward ops above, through
# the device's table like the forwards (a device without the kernel raises
# NoKernelError). Not ops themselves: a rule's call runs unrecorded. Each
# takes the forward's own arguments, so that the geometry is the forward's.

cdef tuple _grad_out(str op, Tensor t, object shape, int work):
    cdef int64_t oshape[4]
    oshape[0], oshape[1], oshape[2], oshape[3] = shape
    return empty(4, oshape, work, t._device), num_threads()


def pool2d_backward(str kind, x, gy, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
                    count_include_pad=True):
    """The gradient of max_pool2d (kind "max") or avg_pool2d (kind "avg")
    with respect to its input, given ``gy`` (the output's gradient, [N, C,
    OH, OW]); the other arguments are the forward's. ``x``: the forward's
    input for max (each output's gradient goes to its window's first
    maximum, its first NaN if any: PyTorch's choice); for avg its shape
    (N, C, H, W) is enough.

    Returns:
        [N, C, H, W], gy's dtype.

    Raises:
        ValueError: gy's shape is not the forward's output shape.
        NoKernelError: the device has no such kernel.
    """
    cdef str op = kind + "_pool2d"
    cdef Tensor t = None, tg = _pool_input(op, gy), out
    cdef int code = tg._dtype, work = _work_code(code), rc, nt
    cdef mt_pool2d_geom g
    if kind == "max":
        t = <Tensor>_operands(op, (x, tg))[0]
        n, c, h, w = shape_tuple(t)
        t = _ready(t, work)
    else:
        n, c, h, w = x
    oh, ow = _pool_geom(op, n * c, h, w, kernel_size, stride, padding, dilation, ceil_mode, &g)
    g.count_include_pad = count_include_pad
    if shape_tuple(tg) != (n, c, oh, ow):
        raise ValueError(f"{op} backward: the gradient has shape {shape_tuple(tg)}, the output {(n, c, oh, ow)}")
    tg = _ready(tg, work)
    out, nt = _grad_out(op, tg, (n, c, h, w), work)
    cdef const mt_nn_kernels *kn = _kernels(op, tg)
    if kind == "max":
        _need(kn.max_pool2d_backward != NULL, op + " backward", tg)
        with nogil:
            rc = kn.max_pool2d_backward(work, t._data, tg._data, out._data, &g, nt)
    else:
        _need(kn.avg_pool2d_backward != NULL, op + " backward", tg)
        with nogil:
            rc = kn.avg_pool2d_backward(work, tg._data, out._data, &g, nt)
    _check_rc(op, rc, tg._device)
    return _finish(out, code)


def adaptive_pool2d_backward(str kind, x, gy):
    """The gradient of adaptive_{avg,max}_pool2d with respect to its input
    given gy [N, C, OH, OW] (the output size is gy's). ``x``: the forward's
    input for max (each window's first maximum, or first NaN, takes its
    gradient); for avg its shape (N, C, H, W).

    Returns:
        [N, C, H, W], gy's dtype.

    Raises:
        ValueError: gy not [N, C, OH, OW] for x's N and C.
        NoKernelError: the device has no such kernel."""
    cdef str op = f"adaptive_{kind}_pool2d"
    cdef Tensor t = None, tg = _pool_input(op, gy), out
    cdef int code = tg._dtype, work = _work_code(code), rc, nt
    if kind == "max":
        t = <Tensor>_operands(op, (x, tg))[0]
        n, c, h, w = shape_tuple(t)
        t = _ready(t, work)
    else:
        n, c, h, w = x
    gs = shape_tuple(tg)
    if gs[:2] != (n, c) or h < 1 or w < 1:
        raise ValueError(f"{op} backward: the gradient has shape {gs} for input {(n, c, h, w)}")
    tg = _ready(tg, work)
    out, nt = _grad_out(op, tg, (n, c, h, w), work)
    cdef int64_t planes = n * c, ih = h, iw = w, toh = gs[2], tow = gs[3]
    cdef int k = MT_ADAPTIVE_MAX if kind == "max" else MT_ADAPTIVE_AVG
    cdef const void *xp = t._data if t is not None else NULL
    cdef const mt_nn_kernels *kn = _kernels(op, tg)
    _need(kn.adaptive_pool2d_backward != NULL, op + " backward", tg)
    with nogil:
        rc = kn.adaptive_pool2d_backward(work, k, xp, tg._data, out._data, planes, ih, iw, toh, tow, nt)
    _check_rc(op, rc, tg._device)
    return _finish(out, code)


def interpolate_backward(gy, tuple x_shape, scale_factor=None, mode="nearest", align_corners=None):
    """The gradient of interpolate with respect to its input of shape
    ``x_shape`` ([N, C, H, W]) given gy [N, C, OH, OW]; scale_factor, mode
    and align_corners are the forward's (the output size is gy's). The
    transpose of the forward's taps: nearest adds each output's gradient to
    its source pixel, bilinear to its four taps with the same weights.

    Raises:
        ValueError: unknown mode; gy not 4-D.
        NoKernelError: the device has no such kernel."""
    cdef str op = "interpolate"
    cdef Tensor tg = <Tensor>_operands(op, (gy,))[0], out
    cdef int code = _float_code(op, [tg]), work = _work_code(code), rc, nt
    _check_4d(op, "gy", tg, "[N, C, OH, OW]")
    if mode not in _INTERP_MODES:
        raise ValueError(f"{op}: unsupported mode {mode!r}; expected one of {', '.join(_INTERP_MODES)}")
    cdef double fh = 0, fw = 0
    if scale_factor is not None:
        fh, fw = (float(scale_factor[0]), float(scale_factor[1])) if isinstance(scale_factor, (tuple, list)) \
            else (float(scale_factor), float(scale_factor))
    n, c, h, w = x_shape
    tg = _ready(tg, work)
    out, nt = _grad_out(op, tg, (n, c, h, w), work)
    gs = shape_tuple(tg)
    cdef int64_t planes = n * c, ih = h, iw = w, toh = gs[2], tow = gs[3]
    cdef int m = _INTERP_MODES[mode], ac = bool(align_corners)
    cdef const mt_nn_kernels *kn = _kernels(op, tg)
    _need(kn.resize2d_backward != NULL, op + " backward", tg)
    with nogil:
        rc = kn.resize2d_backward(work, m, tg._data, out._data, planes, ih, iw, toh, tow, fh, fw, ac, nt)
    _check_rc(op, rc, tg._device)
    return _finish(out, code)


def conv2d_backward_weight(x, gy, tuple w_shape, stride=1, padding=0, dilation=1, int groups=1):
    """conv2d's gradient with respect to its weight (shape ``w_shape``, [O,
    C/groups, KH, KW]) given x [N, C, H, W] and the output's gradient gy
    [N, O, OH, OW]: per group one GEMM of gy by x's patches (im2col) over
    chunks of images.

    Returns:
        [O, C/groups, KH, KW], the promoted float dtype of x and gy.

    Raises:
        ValueError: shapes that do not fit one conv2d geometry.
        NoKernelError: the device has no such kernel."""
    cdef str op = "conv2d"
    tx, tg = _operands(op, (x, gy))
    cdef int code = _float_code(op, [tx, tg]), work = _work_code(code), rc, nt
    cdef Tensor ux = _ready(<Tensor>tx, work), ug = _ready(<Tensor>tg, work), out
    _check_4d(op, "x", ux, "[N, C, H, W]")
    _check_4d(op, "gy", ug, "[N, O, OH, OW]")
    n, c, h, w = shape_tuple(ux)
    o, cg, kh, kw = w_shape
    sh, sw = _positive(op, "stride", stride)
    ph, pw = _nonneg(op, "padding", padding)
    dh, dw = _positive(op, "dilation", dilation)
    oh, ow = window_output_size(op, (h, w), (kh, kw), (sh, sw), (ph, pw), (dh, dw))
    if groups < 1 or c != cg * groups or o % groups or shape_tuple(ug) != (n, o, oh, ow):
        raise ValueError(f"{op} backward: x {(n, c, h, w)}, gradient {shape_tuple(ug)} and weight "
                         f"{w_shape} (groups {groups}) are not one conv2d's")
    cdef mt_conv2d_geom g
    g.n, g.c, g.h, g.w, g.o, g.kh, g.kw, g.oh, g.ow = n, c, h, w, o, kh, kw, oh, ow
    g.sh, g.sw, g.ph, g.pw, g.dh, g.dw, g.groups = sh, sw, ph, pw, dh, dw, groups
    g.act, g.has_res, g.res_delta = 0, 0, 0
    out, nt = _grad_out(op, ux, (o, cg, kh, kw), work)
    cdef const mt_nn_kernels *kn = _kernels(op, ux)
    _need(kn.conv2d_backward_weight != NULL, op + " backward", ux)
    with nogil:
        rc = kn.conv2d_backward_weight(work, ux._data, ug._data, out._data, &g, nt)
    _check_rc(op, rc, ux._device)
    return _finish(out, code)


def index_add(tuple shape, index, src):
    """zeros(shape) with src's rows added at rows ``index`` of it (repeated
    rows add up, as NumPy's ``np.add.at(out, index, src)``): the backward of
    gathers (embedding, take, advanced indexing).

    Args:
        shape: (rows, *inner) of the result.
        index: integer tensor of n row numbers (any shape, read flat); negative
            ones count from the end.
        src: float tensor of n * prod(inner) elements, read as [n, *inner].

    Returns:
        float [rows, *inner] in src's dtype.

    Raises:
        IndexError: a row number outside [-rows, rows).
        ValueError: src's size is not n * prod(inner).
        NoKernelError: the device has no such kernel."""
    cdef str op = "index_add"
    ti, ts = _operands(op, (index, src))
    cdef Tensor tidx = <Tensor>ti, tsrc = <Tensor>ts, out
    if CATEGORY[tidx._dtype] not in (1, 2):
        raise TypeError(f"{op}: index must be an integer tensor, got {DTYPE_NAMES[tidx._dtype]}")
    cdef int code = _float_code(op, [tsrc]), work = _work_code(code), rc, nt
    cdef int64_t rows = shape[0], inner = 1, nidx = numel(tidx)
    for d in shape[1:]:
        inner *= d
    if numel(tsrc) != nidx * inner:
        raise ValueError(f"{op}: src has {numel(tsrc)} elements, {nidx} rows of {inner} expected")
    tidx = <Tensor>tidx.astype("int64").reshape(-1)
    if nidx and rows:
        tidx = <Tensor>(tidx + (tidx < 0).astype("int64") * rows)
    tidx = _ready(tidx, tidx._dtype)
    tsrc = _ready(tsrc, work)
    cdef int64_t flat[1]
    flat[0] = rows * inner
    out = empty(1, flat, work, tsrc._device)
    fill(out, 0)
    nt = num_threads()
    cdef const mt_nn_kernels *kn = _kernels(op, tsrc)
    _need(kn.index_add != NULL, op, tsrc)
    with nogil:
        rc = kn.index_add(work, out._data, rows, <const int64_t *>tidx._data, nidx, tsrc._data, inner, nt)
    if rc == MT_NN_EINDEX:
        raise IndexError(f"{op}: an index is outside [-{rows}, {rows})")
    _check_rc(op, rc, tsrc._device)
    return _finish(out, code).reshape(shape)


def act_backward(str act, x, gy):
    """The gradient ``gy * act'(x)`` of a fused activation (one of
    ACTIVATIONS but "none") at its input x, given the output's gradient gy
    of x's shape: one pass in C (PyTorch's subgradients: relu's 0 at 0,
    relu6's 0 at 0 and 6, hardswish's (2x + 3) / 6 on [-3, 3]).

    Returns:
        x's shape, the promoted float dtype of x and gy.

    Raises:
        ValueError: an unknown act, or shapes that differ.
        NoKernelError: the device has no such kernel."""
    cdef str op = act
    if act not in ACTIVATIONS or act == "none":
        raise ValueError(f"act_backward: act must be one of {', '.join(a for a in ACTIVATIONS if a != 'none')}, "
                         f"got {act!r}")
    tx, tg = _operands(op, (x, gy))
    cdef int code = _float_code(op, [tx, tg]), work = _work_code(code), rc, nt
    cdef Tensor ux = _ready(<Tensor>tx, work), ug = _ready(<Tensor>tg, work), out
    if shape_tuple(ux) != shape_tuple(ug):
        raise ValueError(f"act_backward: x {shape_tuple(ux)} and gy {shape_tuple(ug)} differ in shape")
    out = empty(ux._ndim, ux._shape, work, ux._device)
    cdef int a = ACTIVATIONS[act]
    cdef int64_t n = numel(ux)
    nt = num_threads()
    cdef const mt_nn_kernels *kn = _kernels(op, ux)
    _need(kn.act_backward != NULL, op + " backward", ux)
    with nogil:
        rc = kn.act_backward(work, a, ux._data, ug._data, out._data, n, nt)
    _check_rc(op, rc, ux._device)
    return _finish(out, code)


def softmax_backward(y, gy, int axis, bint log=False):
    """The gradient of softmax (log False) or log_softmax (log True) at its
    input, given its output ``y`` and the output's gradient ``gy`` (y's
    shape), along ``axis``: one pass in C per row (PyTorch's formulas:
    softmax ``y * (gy - sum(gy * y))``, log_softmax ``gy - exp(y) *
    sum(gy)``, the sums along the axis in double). The axis must be the
    last one that is not of size 1 (rows of y are the softmax's lines).

    Returns:
        y's shape, the promoted float dtype of y and gy (float16 and
        bfloat16 computed in float32).

    Raises:
        ValueError: shapes that differ, an axis out of range, or one that
            is not the last of size > 1.
        TypeError: integer or bool tensors.
        NoKernelError: the device has no such kernel (CUDA: the rule
            composes core ops)."""
    cdef str op = "log_softmax" if log else "softmax"
    ty, tg = _operands(op, (y, gy))
    cdef int code = _float_code(op, [ty, tg]), work = _work_code(code), rc, nt
    cdef Tensor uy = <Tensor>ty, ug = <Tensor>tg, out
    if shape_tuple(uy) != shape_tuple(ug):
        raise ValueError(f"{op} backward: y {shape_tuple(uy)} and gy {shape_tuple(ug)} differ in shape")
    cdef int nd = uy._ndim, d
    if nd == 0 or not -nd <= axis < nd:
        raise ValueError(f"{op} backward: axis {axis} is out of range for a {nd}-d tensor")
    if axis < 0:
        axis += nd
    for d in range(axis + 1, nd):
        if uy._shape[d] != 1:
            raise ValueError(f"{op} backward: axis {axis} of {shape_tuple(uy)} is not the last axis "
                             "of size > 1 (move it last first)")
    cdef const mt_nn_kernels *kn = _kernels(op, uy)
    _need(kn.softmax_backward != NULL, op + " backward", uy)
    uy, ug = _ready(uy, work), _ready(ug, work)
    cdef int64_t cols = uy._shape[axis], rows = numel(uy) // cols if cols else 0
    out = empty(uy._ndim, uy._shape, work, uy._device)
    nt = num_threads()
    with nogil:
        rc = kn.softmax_backward(work, log, uy._data, ug._data, out._data, rows, cols, nt)
    _check_rc(op, rc, uy._device)
    return _finish(out, code)


cdef tuple _attention_grad_operands(str op, tuple ts, mt_attn_geom *g, double scale):
    """attention_train's / attention_backward's checks: q, k, v float32 of
    shapes that fit, the mask broadcast to the scores; fills g (its os
    left 0) and returns (q, k, v, mask) ready for BLAS."""
    cdef Tensor tq, tk, tv, tm = None
    cdef int i
    for t in ts:
        if t is not None and (<Tensor>t)._dtype != MT_FLOAT32:
            raise TypeError(f"{op}: float32 operands only, got {(<Tensor>t).dtype}")
    tq, tk, tv = ts[0], ts[1], ts[2]
    (b, h, sq, sk, d, dv), tm = _attention_shapes(op, tq, tk, tv, ts[3])
    tq, tk, tv = _rows_ready(tq), _rows_ready(tk), _rows_ready(tv)
    _check_blas(op, (sq, sk, d, dv, tq._strides[2], tk._strides[2], tv._strides[2], sq * sk))
    _fill_attn_geom(g, (b, h, sq, sk, d, dv), tq, tk, tv, tm, scale)
    return tq, tk, tv, tm


def attention_train(q, k, v, mask, scale):
    """``attention(q, k, v, mask, scale)`` as a GradManager records it: the
    output and the probabilities ``softmax(q @ k^T * scale + mask)``, which
    attention_backward then reads instead of recomputing them (one C pass
    per (batch, head) pair, cpu/attention_grad.c).

    Args:
        q, k, v, mask, scale: as attention's (float32; mask None or
            broadcastable to [B, H, Sq, Sk]).

    Returns:
        (out, probs): out [B, H, Sq, Dv] (a view of heads-inner memory, as
        attention's), probs [B, H, Sq, Sk] contiguous.

    Raises:
        ValueError: shapes that do not fit (as attention's).
        TypeError: operands that are not float32.
        NoKernelError: the device has no such kernel (CUDA: the rule
            composes core ops)."""
    cdef str op = "attention"
    cdef Tensor tq, tk, tv, tm, out, probs
    cdef mt_attn_geom g
    cdef int rc, nt
    ts = _operands(op, (q, k, v, mask))
    tq, tk, tv, tm = _attention_grad_operands(op, tuple(ts), &g, A.to_float(op, "scale", scale))
    cdef const mt_nn_kernels *kn = _kernels(op, tq)
    _need(kn.attention_train_f32 != NULL, op + " (training forward)", tq)
    cdef int64_t shp[4]
    shp[0], shp[1], shp[2], shp[3] = g.b, g.sq, g.h, g.dv
    out = empty(4, shp, MT_FLOAT32, tq._device)
    shp[1], shp[2], shp[3] = g.h, g.sq, g.sk
    probs = empty(4, shp, MT_FLOAT32, tq._device)
    cdef const float *mptr = <const float *>tm._data if tm is not None else NULL
    nt = num_threads()
    with nogil:
        rc = kn.attention_train_f32(<const float *>tq._data, <const float *>tk._data, <const float *>tv._data,
                                    mptr, <float *>out._data, <float *>probs._data, &g, nt)
    _check_rc(op, rc, tq._device)
    return out.transpose(0, 2, 1, 3), probs


def attention_backward(q, k, v, mask, gy, scale, bint need_mask=False, probs=None):
    """The gradients of ``attention(q, k, v, mask, scale)`` given its
    output's gradient ``gy``, in one C pass per (batch, head) pair (the
    formulas in cpu/attention_grad.c, PyTorch's for matmul and softmax).

    Args:
        q, k, v, mask, scale: the forward's operands (float32; mask None or
            broadcastable to [B, H, Sq, Sk]).
        gy: float32 [B, H, Sq, Dv], any strides.
        need_mask: also return the scores' gradient (the mask's before it
            is summed to the mask's shape).
        probs: None (the probabilities recomputed from q, k and the mask)
            or attention_train's probabilities for these operands.

    Returns:
        (gq, gk, gv, gs): q's, k's and v's shapes (views of heads-inner
        memory, as the forward's output), gs [B, H, Sq, Sk] or None.

    Raises:
        ValueError: shapes that do not fit (as attention's), gy not of the
            output's shape, probs not contiguous float32 [B, H, Sq, Sk].
        TypeError: operands that are not float32.
        NoKernelError: the device has no such kernel (CUDA: the rule
            composes core ops)."""
    cdef str op = "attention backward"
    cdef Tensor tq, tk, tv, tm, tg, tp = None, gq, gk, gv, gs = None
    cdef mt_attn_geom g
    cdef int i, rc, nt
    ts = _operands(op, (q, k, v, mask, gy))
    tq, tk, tv, tm = _attention_grad_operands(op, tuple(ts), &g, float(scale))
    tg = ts[4]
    if tg._dtype != MT_FLOAT32:
        raise TypeError(f"{op}: float32 operands only, got {tg.dtype}")
    if shape_tuple(tg) != (g.b, g.h, g.sq, g.dv):
        raise ValueError(f"{op}: gy of shape {shape_tuple(tg)}, want the output's {(g.b, g.h, g.sq, g.dv)}")
    if probs is not None:
        tp = _operands(op, (probs,))[0]
        if tp._dtype != MT_FLOAT32 or shape_tuple(tp) != (g.b, g.h, g.sq, g.sk) or not is_contiguous(tp) \
                or tp._device != tq._device:
            raise ValueError(f"{op}: probs must be contiguous float32 {(g.b, g.h, g.sq, g.sk)} on q's "
                             f"device, got {tp.dtype} {shape_tuple(tp)}")
    cdef const mt_nn_kernels *kn = _kernels(op, tq)
    _need(kn.attention_backward_f32 != NULL and kn.attention_backward_workspace != NULL, op, tq)
    tg = _rows_ready(tg)
    _check_blas(op, (tg._strides[2],))
    for i in range(3):
        g.os[i] = tg._strides[i]        # os[2] >= 1 after _rows_ready: never read as dense
    cdef int64_t shp[4]
    shp[0], shp[1], shp[2], shp[3] = g.b, g.sq, g.h, g.d
    gq = empty(4, shp, MT_FLOAT32, tq._device)
    shp[1] = g.sk
    gk = empty(4, shp, MT_FLOAT32, tq._device)
    shp[3] = g.dv
    gv = empty(4, shp, MT_FLOAT32, tq._device)
    if need_mask:
        shp[1], shp[2], shp[3] = g.h, g.sq, g.sk
        gs = empty(4, shp, MT_FLOAT32, tq._device)
    nt = num_threads()
    cdef Tensor ws = _workspace(op, kn.attention_backward_workspace(&g, nt), tq._device,
                                f"q {tuple(tq.shape)}, k {tuple(tk.shape)}, v {tuple(tv.shape)}")
    cdef const float *mptr = <const float *>tm._data if tm is not None else NULL
    cdef const float *pptr = <const float *>tp._data if tp is not None else NULL
    cdef float *gsptr = <float *>gs._data if gs is not None else NULL
    with nogil:
        rc = kn.attention_backward_f32(<const float *>tq._data, <const float *>tk._data,
                                       <const float *>tv._data, mptr, pptr, <const float *>tg._data,
                                       <float *>gq._data, <float *>gk._data, <float *>gv._data, gsptr,
                                       &g, nt, ws._data if ws is not None else NULL)
    _check_rc(op, rc, tq._device)
    return gq.transpose(0, 2, 1, 3), gk.transpose(0, 2, 1, 3), gv.transpose(0, 2, 1, 3), gs


# ------------------------------------------------------------------ conv3d (kernels/cpu/conv3d.c)

cdef int _conv3d_geom(str op, mt_conv3d_geom *g, tuple xs, tuple ws, bint transpose, stride, padding,
                      dilation, groups, output_padding) except -1:
    """Fills g, the geometry of the conv3d whose input is x [N, C, D, H, W]
    (conv3d) or whose output is x (transpose: conv_transpose3d's input, its
    weight [C, O/groups, KD, KH, KW] being that conv3d's [O', C'/groups, ...]);
    ValueError for shapes or geometry that are not one."""
    if len(xs) != 5:
        raise ValueError(f"{op}: expected x of shape [N, C, D, H, W] (5-D), got shape {xs}")
    if len(ws) != 5:
        layout = "[C, O/groups, KD, KH, KW]" if transpose else "[O, C/groups, KD, KH, KW]"
        raise ValueError(f"{op}: expected weight of shape {layout} (5-D), got shape {ws}")
    gr = _groups(op, groups)
    s = A.ntuple(op, "stride", stride, 3, 1)
    p = A.ntuple(op, "padding", padding, 3, 0)
    dl = A.ntuple(op, "dilation", dilation, 3, 1)
    k = ws[2:]
    if min(k) < 1:
        raise ValueError(f"{op}: kernel size must be positive, got weight shape {ws}")
    n, c = xs[0], xs[1]
    if transpose:
        op_ = A.ntuple(op, "output_padding", output_padding, 3, 0)
        if any(a >= b and a >= e for a, b, e in zip(op_, s, dl)):
            raise ValueError(f"{op}: output_padding {op_} must be smaller than either stride {s} "
                             f"or dilation {dl}")
        if ws[0] != c:
            raise ValueError(f"{op}: x has {c} channels but weight.shape[0] is {ws[0]}")
        if c % gr:
            raise ValueError(f"{op}: groups={gr} does not divide the {c} input channels")
        full = tuple((i - 1) * st - 2 * pd + d_ * (kk - 1) + o_ + 1
                     for i, st, pd, d_, kk, o_ in zip(xs[2:], s, p, dl, k, op_))
        if min(full) < 1:
            raise ValueError(f"{op}: padding {p} leaves no output for input {xs[2:]} and kernel {k}: "
                             f"output would be {full}")
        # the conv3d whose output x is: input [n, ws[1] * groups, *full], output channels c
        big, small, ci, co = full, xs[2:], ws[1] * gr, c
    else:
        if xs[1] != ws[1] * gr:
            raise ValueError(f"{op}: x has {c} channels but weight expects {ws[1] * gr} "
                             f"(weight.shape[1] * groups = {ws[1]} * {gr})")
        if ws[0] % gr:
            raise ValueError(f"{op}: groups={gr} must divide the {ws[0]} output channels of weight")
        small = window_output_size(op, tuple(xs[2:]), tuple(k), tuple(s), tuple(p), tuple(dl))
        big, ci, co = xs[2:], c, ws[0]
    _check_numel(op, (n, co) + small, f"stride {s} and dilation {dl} on input {xs[2:]}")
    _check_numel(op, (n, ci) + big, f"stride {s} and dilation {dl} on input {xs[2:]}")
    _check_blas(op, (ci // gr * k[0] * k[1] * k[2], small[0] * small[1] * small[2],
                     big[0] * big[1] * big[2]))
    g.n, g.c, g.d, g.h, g.w = n, ci, big[0], big[1], big[2]
    g.o, g.kd, g.kh, g.kw = co, k[0], k[1], k[2]
    g.od, g.oh, g.ow = small
    g.sd, g.sh, g.sw = s
    g.pd, g.ph, g.pw = p
    g.dd, g.dh, g.dw = dl
    g.groups = gr
    return 0


# Which forward runs (CPU time, one thread, kernels/cpu/conv3d.c against
# conv2d per kernel depth tap, fallbacks.conv3d): conv3d.c's GEMM per tap
# over a padded copy wins at stride 1 with 8 to 31 channels a group (16
# channels, 16^3: 4.2 ms against 6.5) and for 1x1x1 kernels; conv2d's
# Winograd wins from 32 channels (64 channels, 16x28x28: 24 ms against 39),
# and conv2d's algorithms beat vol2col everywhere (strided or with fewer
# than 8 channels: 1.5 to 5.5 times less CPU)
_CONV3D_SHIFTED_MIN_C = 8           # conv3d.c's MT_CONV3D_SHIFTED_MIN_C
_CONV3D_WINOGRAD_MIN_C = 32


cdef bint _conv3d_kernel_always = False


def _conv3d_force_kernel(bint on):
    """Tests: every conv3d forward through conv3d.c (vol2col where the
    policy above would run conv2d per tap), or back to the policy."""
    global _conv3d_kernel_always
    _conv3d_kernel_always = on


cdef int _conv3d_by_taps(const mt_conv3d_geom *g) except -1:
    """Whether conv3d runs as conv2d per kernel depth tap (conv.c's
    algorithms on each) rather than conv3d.c's GEMMs."""
    cdef int64_t cg = g.c // g.groups
    if _conv3d_kernel_always:
        return False
    if g.kd == 1 and g.kh == 1 and g.kw == 1 and g.sd == 1 and g.sh == 1 and g.sw == 1 and \
            g.pd == 0 and g.ph == 0 and g.pw == 0:
        return False                        # one GEMM on x itself
    if g.sd != 1 or g.sh != 1 or g.sw != 1 or cg < _CONV3D_SHIFTED_MIN_C:
        return True                         # conv3d.c would take vol2col
    if cg < _CONV3D_WINOGRAD_MIN_C:
        return False
    return conv2d_algorithm((g.n * g.od, g.c, g.h, g.w), (g.o, cg, g.kh, g.kw),
                            (g.sh, g.sw), (g.ph, g.pw), (g.dh, g.dw), g.groups) in ("winograd", "winograd4")


cdef bint _transpose3d_as_conv3d(const mt_conv3d_geom *g):
    """Whether conv_transpose3d runs as the conv3d it equals (flipped,
    regrouped weight; fallbacks.transpose3d_as_conv3d) rather than
    conv3d.c's col2vol: at stride 1 and dilation 1, padding within the
    kernel, and a kernel larger than 1x1x1 (that one is a single GEMM
    either way). Conv3d's policy then measured about half the CPU time
    (16 channels, 8x16x16, 3x3x3: 0.91 ms against 3.8; 64 channels,
    16x28x28: 15.4 against 34; benchmarks/bench_conv3d_rnn.py)."""
    if _conv3d_kernel_always:
        return False
    if g.sd != 1 or g.sh != 1 or g.sw != 1 or g.dd != 1 or g.dh != 1 or g.dw != 1:
        return False
    if g.kd == 1 and g.kh == 1 and g.kw == 1:
        return False
    return g.pd <= g.kd - 1 and g.ph <= g.kh - 1 and g.pw <= g.kw - 1


cdef Tensor _conv3d_bias(str op, object tb_obj, int64_t o, int work):
    if tb_obj is None:
        return None
    cdef Tensor tb = <Tensor>tb_obj
    if shape_tuple(tb) != (o,):
        raise ValueError(f"{op}: bias must have shape ({o},), got {shape_tuple(tb)}")
    return _ready(tb, work)


cdef Tensor _vol_out(int64_t n, int64_t c, int64_t d, int64_t h, int64_t w, int work, int device):
    cdef int64_t shape[5]
    shape[0], shape[1], shape[2], shape[3], shape[4] = n, c, d, h, w
    return empty(5, shape, work, device)


cdef Tensor _add_bias5(Tensor out, Tensor tb):
    """out [N, O, ...] += tb [O] (conv_transpose3d's bias: the data kernel has none)"""
    if tb is None:
        return out
    return <Tensor>(out + tb.reshape((1, tb._shape[0], 1, 1, 1)))


@core_op
def conv3d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """3-D convolution (cross-correlation, as in PyTorch and MegEngine).
    At stride 1 with 8 or more input channels a group, kernels/cpu/conv3d.c:
    one BLAS GEMM per kernel tap over a zero-padded copy of each image
    (a 1x1x1 kernel: one GEMM on x). Elsewhere, and from 32 channels where
    conv2d takes Winograd for the 2-d slices, conv2d per kernel depth tap
    (mgtrace._core.fallbacks.conv3d), which measured faster there. The
    gradients are conv3d.c's (vol2col and GEMMs).

    Args:
        x: float [N, C, D, H, W].
        weight: float [O, C / groups, KD, KH, KW].
        bias: float [O] or None.
        stride, padding, dilation: int or (d, h, w) triple; stride and
            dilation >= 1, padding >= 0 (zeros).
        groups: int >= 1 dividing C and O.

    Returns:
        [N, O, OD, OH, OW], OD = (D + 2*pd - dd*(KD-1) - 1) // sd + 1 (OH, OW
        alike), in the promoted float dtype (float16/bfloat16 computed in
        float32), on the arguments' device.

    Raises:
        ValueError: wrong ndim, channel/groups/bias mismatch, a kernel larger
            than the padded input, bad geometry, tensors on different devices.
        TypeError: integer or bool tensors; non-int geometry.
        NoKernelError: a device without the kernel (CUDA: run
            mgtrace._core.fallbacks.conv3d, conv2d per depth tap, instead).

    >>> import mgtrace as mt
    >>> x = mt.tensor(np.ones((1, 1, 3, 3, 3), np.float32))
    >>> conv3d(x, mt.tensor(np.ones((2, 1, 2, 2, 2), np.float32))).shape
    (1, 2, 2, 2, 2)
    """
    cdef str op = "conv3d"
    cdef mt_conv3d_geom g
    cdef int rc, nt
    tx, tw, tb_obj, code = _conv_operands(op, x, weight, bias)
    cdef const mt_nn_kernels *kn = <const mt_nn_kernels *>backend_of((<Tensor>tx)._device).nn
    if kn == NULL or kn.conv3d == NULL:          # the op table's fallback
        return fallbacks.conv3d(tx, tw, tb_obj, stride, padding, dilation, groups)
    _conv3d_geom(op, &g, shape_tuple(tx), shape_tuple(tw), False, stride, padding, dilation, groups, 0)
    if _conv3d_by_taps(&g):
        return fallbacks.conv3d(tx, tw, tb_obj, stride, padding, dilation, groups)
    cdef int work = _work_code(code)
    cdef Tensor ux = _ready(<Tensor>tx, work), uw = _ready(<Tensor>tw, work)
    cdef Tensor tb = _conv3d_bias(op, tb_obj, g.o, work)
    cdef const void *bptr = tb._data if tb is not None else NULL
    cdef Tensor out = _vol_out(g.n, g.o, g.od, g.oh, g.ow, work, ux._device)
    nt = num_threads()
    with nogil:
        rc = kn.conv3d(work, ux._data, uw._data, bptr, out._data, &g, nt)
    _check_rc(op, rc, ux._device)
    return _finish(out, code)


@core_op
def conv_transpose3d(x, weight, bias=None, stride=1, padding=0, output_padding=0, dilation=1, groups=1):
    """3-D transposed convolution (conv3d's gradient with respect to its
    input): per image and group one GEMM of the weight's transpose by x,
    its columns added back onto the output (col2vol, kernels/cpu/conv3d.c).
    At stride 1 and dilation 1 with padding below the kernel size (and a
    kernel larger than 1x1x1) it runs as the conv3d it equals instead (the
    weight regrouped to [O, C/groups, ...] and flipped, padding K - 1 - p),
    which :func:`conv3d`'s policy computes in about half the time.

    Args:
        x: float [N, C, D, H, W].
        weight: float [C, O / groups, KD, KH, KW] (PyTorch's layout).
        bias: float [O] or None.
        stride, padding, output_padding, dilation: int or (d, h, w) triple;
            output_padding smaller than stride or dilation.
        groups: int >= 1 dividing C.

    Returns:
        [N, O, OD, OH, OW], OD = (D - 1)*sd - 2*pd + dd*(KD - 1) + opd + 1
        (OH, OW alike), the promoted float dtype, on the arguments' device.

    Raises:
        ValueError, TypeError, NoKernelError: as :func:`conv3d` (a device
        without the kernel runs mgtrace._core.fallbacks.conv_transpose3d).

    >>> import mgtrace as mt
    >>> x = mt.tensor(np.ones((1, 2, 2, 3, 3), np.float32))
    >>> w = mt.tensor(np.ones((2, 4, 3, 3, 3), np.float32))
    >>> conv_transpose3d(x, w, stride=2, padding=1, output_padding=1).shape
    (1, 4, 4, 6, 6)
    """
    cdef str op = "conv_transpose3d"
    cdef mt_conv3d_geom g
    cdef int rc, nt
    tx, tw, tb_obj, code = _conv_operands(op, x, weight, bias)
    cdef const mt_nn_kernels *kn = <const mt_nn_kernels *>backend_of((<Tensor>tx)._device).nn
    if kn == NULL or kn.conv3d_backward_data == NULL:
        return fallbacks.conv_transpose3d(tx, tw, tb_obj, stride, padding, output_padding, dilation, groups)
    _conv3d_geom(op, &g, shape_tuple(tx), shape_tuple(tw), True, stride, padding, dilation, groups,
                 output_padding)
    if _transpose3d_as_conv3d(&g):
        return fallbacks.transpose3d_as_conv3d(tx, tw, tb_obj, (g.pd, g.ph, g.pw), g.groups)
    cdef int work = _work_code(code)
    cdef Tensor ux = _ready(<Tensor>tx, work), uw = _ready(<Tensor>tw, work)
    cdef Tensor tb = _conv3d_bias(op, tb_obj, g.c, work)
    cdef Tensor out = _vol_out(g.n, g.c, g.d, g.h, g.w, work, ux._device)
    nt = num_threads()
    with nogil:
        rc = kn.conv3d_backward_data(work, ux._data, uw._data, out._data, &g, nt)
    _check_rc(op, rc, ux._device)
    return _finish(_add_bias5(out, tb), code)


def conv3d_backward_weight(x, gy, tuple w_shape, stride=1, padding=0, dilation=1, groups=1):
    """conv3d's gradient with respect to its weight (shape ``w_shape``, [O,
    C/groups, KD, KH, KW]) given its input x [N, C, D, H, W] and the output's
    gradient gy [N, O, OD, OH, OW]: per image and group one GEMM of gy by x's
    patches. For conv_transpose3d's weight gradient pass its output's gradient
    as x and its input as gy.

    Returns:
        float w_shape, the promoted float dtype of x and gy.

    Raises:
        ValueError: shapes that are not one conv3d's.
        NoKernelError: the device has no such kernel."""
    cdef str op = "conv3d"
    cdef mt_conv3d_geom g
    cdef int rc, nt
    tx, tg = _operands(op, (x, gy))
    cdef int code = _float_code(op, [tx, tg]), work = _work_code(code)
    cdef Tensor ux = _ready(<Tensor>tx, work), ug = _ready(<Tensor>tg, work), out
    _conv3d_geom(op, &g, shape_tuple(ux), w_shape, False, stride, padding, dilation, groups, 0)
    if shape_tuple(ug) != (g.n, g.o, g.od, g.oh, g.ow):
        raise ValueError(f"{op} backward: x {shape_tuple(ux)}, gradient {shape_tuple(ug)} and weight "
                         f"{w_shape} (groups {groups}) are not one conv3d's")
    cdef const mt_nn_kernels *kn = _kernels(op, ux)
    _need(kn.conv3d_backward_weight != NULL, op + " backward", ux)
    out = _vol_out(w_shape[0], w_shape[1], w_shape[2], w_shape[3], w_shape[4], work, ux._device)
    nt = num_threads()
    with nogil:
        rc = kn.conv3d_backward_weight(work, ux._data, ug._data, out._data, &g, nt)
    _check_rc(op, rc, ux._device)
    return _finish(out, code)


# ------------------------------------------------------------------ recurrent steps (kernels/cpu/rnn_cell.c)

cdef tuple _cell_operands(str op, list ts, int64_t chunks):
    """(work dtype code, promoted code, n, hidden, h width) for gx [N, chunks
    * H], h [N, P], (LSTM: c [N, H]), w_hh [chunks * H, P], b_hh [chunks * H]
    or None (the last of ts); P = H for an RNN. ValueError for shapes that
    do not fit."""
    cdef int code = _float_code(op, ts)
    cdef Py_ssize_t k = len(ts)
    h, w_hh, b_hh = ts[1], ts[k - 2], ts[k - 1]
    if (<Tensor>h)._ndim != 2:
        raise ValueError(f"{op}: h must be [N, hidden] (2-D), got shape {shape_tuple(h)}")
    n, p = shape_tuple(h)
    hid = shape_tuple(ts[2])[1] if chunks == 4 and (<Tensor>ts[2])._ndim == 2 else p
    want = [("gx", ts[0], (n, chunks * hid)), ("w_hh", w_hh, (chunks * hid, p))]
    if chunks == 4:
        want.append(("c", ts[2], (n, hid)))
    for name, t, shape in want:
        if shape_tuple(t) != shape:
            raise ValueError(f"{op}: {name} must have shape {shape} for h of shape {(n, p)} and "
                             f"hidden size {hid}, got {shape_tuple(t)}")
    if b_hh is not None and shape_tuple(b_hh) != (chunks * hid,):
        raise ValueError(f"{op}: b_hh must have shape ({chunks * hid},), got {shape_tuple(b_hh)}")
    _check_blas(op, (n, chunks * hid, p))
    return _work_code(code), code, n, hid, p


@core_op
def lstm_cell(gx, h, c, w_hh, b_hh=None):
    """One LSTM time step, fused: gates = gx + b_hh + h @ w_hh^T (one GEMM),
    then in one pass (torch.nn's gate order input, forget, cell, output)
    c' = sigmoid(f) * c + sigmoid(i) * tanh(g), h' = sigmoid(o) * tanh(c')
    (kernels/cpu/rnn_cell.c). gx is the input's share x @ w_ih^T + b_ih,
    which mgtrace.module.LSTM computes for every step in one GEMM.

    Args:
        gx: float [N, 4H]; h: float [N, P] (P = H, or the projection's
        size: the caller projects h' itself); c: float [N, H]; w_hh: float
        [4H, P]; b_hh: float [4H] or None.

    Returns:
        (h', c'): float [N, H] each, in the promoted float dtype
        (float16/bfloat16 computed in float32).

    Raises:
        ValueError: shapes that do not fit, tensors on different devices.
        TypeError: non-float tensors.
        NoKernelError: a device without the kernel nor matmul, sigmoid and
            tanh (CUDA runs mgtrace._core.fallbacks.lstm_cell, the same
            formula in core ops).

    >>> import mgtrace as mt
    >>> z = mt.tensor(np.zeros((1, 2), np.float32))
    >>> h, c = lstm_cell(mt.tensor(np.zeros((1, 8), np.float32)), z, z, mt.tensor(np.zeros((8, 2), np.float32)))
    >>> h.shape, float(c.numpy().sum())
    ((1, 2), 0.0)
    """
    cdef str op = "lstm_cell"
    ts = _operands(op, (gx, h, c, w_hh, b_hh))
    cdef int work, code, rc, nt
    cdef int64_t n, hid, width
    work, code, n, hid, width = _cell_operands(op, ts, 4)
    cdef Tensor ug = _ready(<Tensor>ts[0], work), uh = _ready(<Tensor>ts[1], work)
    cdef Tensor uc = _ready(<Tensor>ts[2], work), uw = _ready(<Tensor>ts[3], work)
    cdef Tensor ub = _ready(<Tensor>ts[4], work) if ts[4] is not None else None
    cdef const void *bptr = ub._data if ub is not None else NULL
    cdef const mt_nn_kernels *kn = <const mt_nn_kernels *>backend_of(ug._device).nn
    if kn == NULL or kn.lstm_cell == NULL:
        return fallbacks.lstm_cell(ug, uh, uc, uw, ub)
    cdef Tensor ho = empty(2, uc._shape, work, ug._device), co = empty(2, uc._shape, work, ug._device)
    nt = num_threads()
    with nogil:
        rc = kn.lstm_cell(work, ug._data, uh._data, uc._data, uw._data, bptr, ho._data, co._data, n, hid,
                          width, nt)
    _check_rc(op, rc, ug._device)
    return _finish(ho, code), _finish(co, code)


@core_op
def rnn_cell(gx, h, w_hh, b_hh=None, nonlinearity="tanh"):
    """One simple-RNN time step, fused: h' = act(gx + b_hh + h @ w_hh^T)
    (one GEMM, then the activation in place; kernels/cpu/rnn_cell.c). gx is
    the input's share x @ w_ih^T + b_ih, which mgtrace.module.RNN computes
    for every step in one GEMM.

    Args:
        gx: float [N, H]; h: float [N, H]; w_hh: float [H, H]; b_hh: float
            [H] or None; nonlinearity: "tanh" or "relu".

    Returns:
        h': float [N, H], the promoted float dtype.

    Raises:
        ValueError: shapes that do not fit, another nonlinearity.
        TypeError: non-float tensors.
        NoKernelError: a device without the kernel nor matmul and the
            activation (CUDA runs mgtrace._core.fallbacks.rnn_cell).

    >>> import mgtrace as mt
    >>> one = mt.tensor(np.ones((1, 1), np.float32))
    >>> float(rnn_cell(one, one, one, None, "relu").numpy()[0, 0])
    2.0
    """
    cdef str op = "rnn_cell"
    if nonlinearity not in ("tanh", "relu"):
        raise ValueError(f"{op}: nonlinearity must be 'tanh' or 'relu', got {nonlinearity!r}")
    ts = _operands(op, (gx, h, w_hh, b_hh))
    cdef int work, code, rc, nt
    cdef int relu = nonlinearity == "relu"
    cdef int64_t n, hid, width
    work, code, n, hid, width = _cell_operands(op, ts, 1)
    cdef Tensor ug = _ready(<Tensor>ts[0], work), uh = _ready(<Tensor>ts[1], work)
    cdef Tensor uw = _ready(<Tensor>ts[2], work)
    cdef Tensor ub = _ready(<Tensor>ts[3], work) if ts[3] is not None else None
    cdef const void *bptr = ub._data if ub is not None else NULL
    cdef const mt_nn_kernels *kn = <const mt_nn_kernels *>backend_of(ug._device).nn
    if kn == NULL or kn.rnn_cell == NULL:
        return fallbacks.rnn_cell(ug, uh, uw, ub, nonlinearity)
    cdef Tensor ho = empty(2, uh._shape, work, ug._device)
    nt = num_threads()
    with nogil:
        rc = kn.rnn_cell(work, relu, ug._data, uh._data, uw._data, bptr, ho._data, n, hid, nt)
    _check_rc(op, rc, ug._device)
    return _finish(ho, code)
