# cython: language_level=3, boundscheck=False, wraparound=False
"""The int8 kernels (kernels/qgemm.c) for mgtrace.quantization.int8: an
int8 GEMM with int32 accumulation and a fused requantize + bias + ReLU
epilogue (VNNI where the CPU has it, portable C otherwise) and an im2col
for int8 convolutions. Arguments are NumPy arrays, checked by the caller
(mgtrace/quantization/int8.py) for dtype, contiguity and shape; this layer
checks sizes again so that a bad call raises instead of reading past an
array. Every kernel is reached through the backend table of its data's
device (contract/quant_kernels.h; the CPU's for NumPy arrays), and while
mgtrace.plan records a layer (record_begin / record_end) each call is
noted with its arguments for the plan to replay."""
import threading

import numpy as np
cimport numpy as cnp
from libc.stdint cimport int8_t, uint8_t, int32_t, int64_t
from mgtrace._core.tensor cimport Tensor, is_contiguous, numel, on_host, backend_of, cpu_backend
from mgtrace._core.device cimport device_id
from mgtrace._core.tensor import missing_kernel
# each kernel call first sets its most threads (mt_q_set_threads) to what the
# float kernels get: set_num_threads, fewer under load with adaptive threads
from mgtrace._core.dispatch cimport num_threads

cnp.import_array()

# the most inputs a plan's int8 concat step takes (its recording spoils beyond)
cdef extern from "plan.h":
    enum: MT_PLAN_Q_CONCAT_INPUTS

cdef extern from "quant_kernels.h":
    ctypedef struct mt_quant_kernels:
        int (*has_vnni)() noexcept nogil
        int (*has_amx)() noexcept nogil
        void (*set_threads)(int n) noexcept nogil
        void (*quantize_f32)(const float *x, int64_t n, float scale, float zp, float lo,
                             float hi, int kind, void *out, int path) noexcept nogil
        void (*dequantize_f32)(const void *q, int kind, int64_t n, float scale, float zp,
                               float *out) noexcept nogil
        int64_t (*gemm_packed_size)(int64_t N, int64_t K) noexcept nogil
        void (*gemm_pack_s8)(int64_t N, int64_t K, const int8_t *w, int8_t *packed,
                             int32_t *wsum) noexcept nogil
        int (*gemm_u8s8)(int64_t M, int64_t N, int64_t K, const uint8_t *a, int64_t lda,
                         int32_t a_zp, const int8_t *packed, const int32_t *wsum,
                         const int32_t *bias, const double *mult, int32_t out_zp, int32_t lo,
                         int32_t hi, int out_u8, void *out, int64_t ldo_m, int64_t ldo_n,
                         int path) noexcept nogil
        void (*im2col_u8)(const uint8_t *x, int64_t C, int64_t H, int64_t W, int64_t KH,
                          int64_t KW, int64_t SH, int64_t SW, int64_t PH, int64_t PW,
                          int64_t DH, int64_t DW, int64_t OH, int64_t OW, uint8_t pad,
                          uint8_t *cols) noexcept nogil
        int (*conv_u8s8)(const uint8_t *x, int64_t NB, int64_t C, int64_t H, int64_t W,
                         int32_t a_zp, const int8_t *wrows, int64_t lw, const int32_t *wsum,
                         int64_t Co, int64_t G, int64_t KH, int64_t KW, int64_t SH,
                         int64_t SW, int64_t PH, int64_t PW, int64_t DH, int64_t DW,
                         int64_t OH, int64_t OW, const int32_t *bias, const double *mult,
                         int32_t out_zp, int32_t lo, int32_t hi, int out_u8, void *out,
                         int path) noexcept nogil
        void (*dwconv_u8s8)(const uint8_t *x, int64_t NB, int64_t C, int64_t H, int64_t W,
                            int32_t a_zp, const int8_t *w, int64_t KH, int64_t KW, int64_t SH,
                            int64_t SW, int64_t PH, int64_t PW, int64_t DH, int64_t DW,
                            int64_t OH, int64_t OW, const int32_t *bias, const double *mult,
                            int32_t out_zp, int32_t lo, int32_t hi, int out_u8,
                            void *out) noexcept nogil
        int (*dwconv_vec_u8s8)(const uint8_t *x, int64_t NB, int64_t C, int64_t H, int64_t W,
                               int32_t a_zp, const int8_t *w, int64_t KH, int64_t KW,
                               int64_t SH, int64_t SW, int64_t PH, int64_t PW, int64_t DH,
                               int64_t DW, int64_t OH, int64_t OW, const int32_t *bias,
                               const double *mult, int32_t out_zp, int32_t lo, int32_t hi,
                               int out_u8, void *out, int path) noexcept nogil
        int (*add_u8)(const void *a, int ak, float as_, float az, const void *b, int bk,
                      float bs, float bz, int64_t n, float os, float oz, float lo, float hi,
                      int relu, void *out, int ok, int path) noexcept nogil
        int (*maxpool2d_u8)(const uint8_t *x, int64_t planes, int64_t H, int64_t W, int64_t KH,
                            int64_t KW, int64_t SH, int64_t SW, int64_t PH, int64_t PW,
                            int64_t DH, int64_t DW, int64_t OH, int64_t OW,
                            uint8_t *out) noexcept nogil
        int (*avgpool2d)(const void *x, int is_s8, int64_t planes, int64_t H, int64_t W,
                         int64_t OH, int64_t OW, const int64_t *ys, const int64_t *ye,
                         const int64_t *dy, const int64_t *xs, const int64_t *xe,
                         const int64_t *dx, int32_t zp, int32_t lo, int32_t hi,
                         void *out) noexcept nogil
        void (*concat_u8)(int n_in, const void *const *xs, const int *kinds,
                          const float *scales, const float *zps, const int64_t *inner,
                          int64_t outer, float os, float oz, float lo, float hi, int ok,
                          uint8_t *tables, void *out) noexcept nogil
        void (*flip_s8)(const int8_t *x, int64_t n, uint8_t *out) noexcept nogil

cdef extern from *:
    """
    extern const mt_quant_kernels mt_cpu_quant_kernels;   /* kernels/cpu/qtable.c */
    """
    const mt_quant_kernels mt_cpu_quant_kernels


cdef extern from *:
    """
    int64_t mt_qblock_set_band_bytes(int64_t n);            /* kernels/cpu/qblock.c */
    """
    int64_t mt_qblock_set_band_bytes(int64_t n) nogil


def _set_block_band_bytes(int64_t n):
    """Tests' hook: the most expanded bytes of one band of rows an int8
    block step (mgtrace.plan's MT_Q_BLOCK) computes at once (0: the
    default); returns the previous value."""
    return mt_qblock_set_band_bytes(n)


# the CPU backend's quant member: every call below goes through the table
# of its data's device (backend.h), the CPU's for NumPy arrays
cpu_backend().quant = &mt_cpu_quant_kernels


cdef int _device(object device) except -1:
    return 0 if device is None else device_id(device)


cdef const mt_quant_kernels *_table(str op, int device, object dtype) except NULL:
    """``device``'s int8 kernel table, or NoKernelError naming the op and the
    device when its backend has none (CUDA's)."""
    cdef const mt_quant_kernels *k = <const mt_quant_kernels *>backend_of(device).quant
    if k == NULL:
        raise missing_kernel(op, device, dtype)
    k.set_threads(num_threads())
    return k


# ---- recording (mgtrace.plan): while on, each kernel call this thread makes
# is noted as (call, pointers, integers, floats, threads) in plan.c's
# run_quant order, each pointer (address, bytes, role, owner) with role "r"
# (data read), "w" (data written) or "c" (a constant the call reads: packed
# weights, multipliers, windows), None for NULL; owner the array or Tensor,
# kept by record_end for the constants only. A
# call that cannot be replayed (im2col, a concat of more than
# MT_PLAN_Q_CONCAT_INPUTS inputs) spoils it.
cdef object _REC = None
cdef object _REC_THREAD = None
cdef bint _REC_SPOILED = False


def record_begin():
    """Note this thread's kernel calls from now (see record_end)."""
    global _REC, _REC_THREAD, _REC_SPOILED
    _REC, _REC_THREAD, _REC_SPOILED = [], threading.get_ident(), False


def record_end():
    """The calls noted since record_begin, or None when one of them cannot
    be replayed from its arguments."""
    global _REC, _REC_THREAD
    calls = None if _REC_SPOILED else _REC
    _REC, _REC_THREAD = None, None
    if calls is None:
        return None
    # the data pointers' owners were held while recording (no address of
    # them served another array meanwhile); from now on only the constants'
    return [(call, tuple(p if p is None or p[2] == "c" else p[:3] + (None,) for p in ptrs),
             ints, floats, nt) for call, ptrs, ints, floats, nt in calls]


cdef inline bint _recording() noexcept:
    return _REC is not None and threading.get_ident() == _REC_THREAD


cdef int _note(str call, tuple ptrs, tuple ints, tuple floats) except -1:
    if _recording():
        _REC.append((call, ptrs, ints, floats, num_threads()))
    return 0


cdef int _spoil() except -1:
    global _REC_SPOILED
    if _recording():
        _REC_SPOILED = True
    return 0


cdef tuple _arr(cnp.ndarray a, str role):
    return (<size_t>cnp.PyArray_DATA(a), a.nbytes, role, a)


cdef tuple _ten(Tensor t, int64_t nbytes, str role):
    return (<size_t>t._data, nbytes, role, t)


def has_table(device=None):
    """Whether ``device`` (default: the CPU) has int8 kernels: its backend's
    quant table (kernels/contract/quant_kernels.h; CUDA has none)."""
    return (<const mt_quant_kernels *>backend_of(_device(device)).quant) != NULL


def require(str op, device=None, dtype="qint8"):
    """Raise NoKernelError "no kernel for op ``op`` on device D with dtype
    ``dtype``" when ``device`` has no int8 kernel table."""
    _table(op, _device(device), dtype)


# core dtype codes (dtype.pyx's NAMES): int8 1, uint8 2, int32 5, float32 9
cdef int _kind(Tensor t) except -2:
    if t._dtype == 1:
        return 0
    if t._dtype == 2:
        return 1
    if t._dtype == 5:
        return 2
    raise ValueError("quantized storage is int8, uint8 or int32")


cdef int _check(Tensor t, str what) except -1:
    if not on_host(t._device) or not is_contiguous(t):
        raise ValueError(f"{what} must be a contiguous CPU tensor")
    return 0


def quantize_into(Tensor x, Tensor out, float scale, float zero_point, float qmin, float qmax,
                  int path=0):
    """out[i] = clamp(rint(x[i] / scale) + zero_point, qmin, qmax) for
    float32 x and int8/uint8/int32 out (contiguous CPU tensors of one size),
    in float32 as NumPy computes it, round half to even; NaN gives qmin.
    path 0: AVX-512 where the CPU has it; 1: portable C (same bits)."""
    cdef const mt_quant_kernels *k = _table("quantize", out._device, out._dtype)
    _check(x, "x")
    _check(out, "out")
    if x._dtype != 9 or numel(x) != numel(out):
        raise ValueError("quantize_into takes float32 x and out of the same size")
    cdef int kind = _kind(out)
    cdef int64_t n = numel(x)
    _note("quantize", (_ten(x, n * 4, "r"), _ten(out, n * (4 if kind == 2 else 1), "w")),
          (n, kind, path), (scale, zero_point, qmin, qmax))
    with nogil:
        k.quantize_f32(<const float *>x._data, n, scale, zero_point, qmin, qmax, kind,
                       <void *>out._data, path)


def dequantize_into(Tensor q, Tensor out, float scale, float zero_point):
    """out[i] = (q[i] - zero_point) * scale in float32 for int8/uint8/int32 q
    and float32 out (contiguous CPU tensors of one size)."""
    cdef const mt_quant_kernels *k = _table("dequantize", q._device, q._dtype)
    _check(q, "q")
    _check(out, "out")
    if out._dtype != 9 or numel(q) != numel(out):
        raise ValueError("dequantize_into takes float32 out of q's size")
    cdef int kind = _kind(q)
    cdef int64_t n = numel(q)
    _note("dequantize", (_ten(q, n * (4 if kind == 2 else 1), "r"), _ten(out, n * 4, "w")),
          (kind, n), (scale, zero_point))
    with nogil:
        k.dequantize_f32(<const void *>q._data, kind, n, scale, zero_point, <float *>out._data)


def flip_into(cnp.ndarray x, cnp.ndarray out, device=None):
    """out = x ^ 0x80 for int8 x and uint8 out (C-contiguous, one size): a
    signed activation's integers as the uint8 bytes the kernels take (its
    zero point then + 128)."""
    cdef const mt_quant_kernels *k = _table("quantize", _device(device), "qint8")
    if x.dtype != np.int8 or out.dtype != np.uint8 or x.size != out.size or \
            not x.flags.c_contiguous or not out.flags.c_contiguous:
        raise ValueError("flip_into takes C-contiguous int8 x and uint8 out of one size")
    cdef int64_t n = x.size
    if n == 0:
        return
    _note("flip", (_arr(x, "r"), _arr(out, "w")), (n,), ())
    with nogil:
        k.flip_s8(<const int8_t *>cnp.PyArray_DATA(x), n, <uint8_t *>cnp.PyArray_DATA(out))


def has_vnni():
    """Whether the int8 GEMM runs on AVX-512 VNNI here."""
    cdef const mt_quant_kernels *k = _table("linear", 0, "qint8")
    return bool(k.has_vnni())


def pack_weight(cnp.ndarray w, device=None):
    """int8 [N, K] C-contiguous -> (packed int8 [size], wsum int32 [N]).
    device: where the weight runs (default: the CPU; NumPy arrays are host
    memory): its int8 table packs it."""
    cdef const mt_quant_kernels *k = _table("linear", _device(device), "qint8")
    if w.dtype != np.int8 or w.ndim != 2 or not w.flags.c_contiguous:
        raise ValueError("pack_weight takes a C-contiguous int8 [N, K] array")
    cdef int64_t N = w.shape[0], K = w.shape[1]
    cdef cnp.ndarray packed = np.empty(k.gemm_packed_size(N, K), np.int8)
    cdef cnp.ndarray wsum = np.empty(N, np.int32)
    with nogil:
        k.gemm_pack_s8(N, K, <const int8_t *>cnp.PyArray_DATA(w),
                       <int8_t *>cnp.PyArray_DATA(packed), <int32_t *>cnp.PyArray_DATA(wsum))
    return packed, wsum


def gemm(cnp.ndarray a, int a_zp, cnp.ndarray packed, cnp.ndarray wsum, object bias,
         cnp.ndarray mult, int out_zp, int lo, int hi, cnp.ndarray out, int64_t ldo_m,
         int64_t ldo_n, int path=0, device=None):
    """out[m*ldo_m + n*ldo_n] = clamp(rint((a[m] - a_zp) . w[n] + bias[n]) * mult[n])
    + out_zp, lo, hi) for a uint8 [M, K] (C-contiguous), out int8 or uint8;
    out float32: (acc * mult[n]) unrounded, ReLU when lo is 0. path 0: the
    best here; 1: portable C; 2: VNNI; 3: AMX (whole blocks of 16 rows
    where K is a multiple of 64, the other rows on VNNI); 4: AVX2; each
    where the CPU has it, else the next best (same bits). Returns the path
    used: 1 portable, 2 VNNI, 3 AMX, 4 AVX2. device: whose int8 table runs
    it (default: the CPU); NoKernelError where it has none."""
    cdef const mt_quant_kernels *k = _table("linear", _device(device), "qint8")
    if a.dtype != np.uint8 or a.ndim != 2 or not a.flags.c_contiguous:
        raise ValueError("gemm: a must be a C-contiguous uint8 [M, K] array")
    cdef int64_t M = a.shape[0], K = a.shape[1], N = wsum.shape[0]
    if packed.dtype != np.int8 or packed.size != k.gemm_packed_size(N, K):
        raise ValueError("gemm: packed weight does not fit [N, K]")
    if wsum.dtype != np.int32 or mult.dtype != np.float64 or mult.shape[0] != N \
            or not mult.flags.c_contiguous or not wsum.flags.c_contiguous:
        raise ValueError("gemm: wsum int32 [N] and mult float64 [N] expected")
    cdef cnp.ndarray b
    cdef const int32_t *bp = NULL
    if bias is not None:
        b = bias
        if b.dtype != np.int32 or b.shape[0] != N or not b.flags.c_contiguous:
            raise ValueError("gemm: bias must be int32 [N]")
        bp = <const int32_t *>cnp.PyArray_DATA(b)
    if out.dtype not in (np.int8, np.uint8, np.float32) or not out.flags.c_contiguous:
        raise ValueError("gemm: out must be a C-contiguous int8, uint8 or float32 array")
    if M and N and (M - 1) * ldo_m + (N - 1) * ldo_n >= out.size or ldo_m < 0 or ldo_n < 0:
        raise ValueError("gemm: the output strides reach past out")
    cdef int out_u8 = 2 if out.dtype == np.float32 else int(out.dtype == np.uint8)
    cdef int used
    _note("gemm", (_arr(a, "r"), _arr(packed, "c"), _arr(wsum, "c"),
                   None if bias is None else _arr(b, "c"), _arr(mult, "c"), _arr(out, "w")),
          (M, N, K, K, a_zp, out_zp, lo, hi, out_u8, ldo_m, ldo_n, path), ())
    with nogil:
        used = k.gemm_u8s8(M, N, K, <const uint8_t *>cnp.PyArray_DATA(a), K, a_zp,
                           <const int8_t *>cnp.PyArray_DATA(packed),
                           <const int32_t *>cnp.PyArray_DATA(wsum), bp,
                           <const double *>cnp.PyArray_DATA(mult), out_zp, lo, hi, out_u8,
                           cnp.PyArray_DATA(out), ldo_m, ldo_n, path)
    return used


def im2col(cnp.ndarray x, int64_t KH, int64_t KW, int64_t SH, int64_t SW, int64_t PH,
           int64_t PW, int64_t DH, int64_t DW, int64_t OH, int64_t OW, int pad, device=None):
    """uint8 [C, H, W] (C-contiguous) -> uint8 [OH * OW, C * KH * KW]."""
    cdef const mt_quant_kernels *k = _table("conv2d", _device(device), "qint8")
    if x.dtype != np.uint8 or x.ndim != 3 or not x.flags.c_contiguous:
        raise ValueError("im2col takes a C-contiguous uint8 [C, H, W] array")
    cdef int64_t C = x.shape[0], H = x.shape[1], W = x.shape[2]
    cdef cnp.ndarray cols = np.empty((OH * OW, C * KH * KW), np.uint8)
    _spoil()              # its result is a NumPy array the plan does not hold
    with nogil:
        k.im2col_u8(<const uint8_t *>cnp.PyArray_DATA(x), C, H, W, KH, KW, SH, SW, PH, PW,
                    DH, DW, OH, OW, <uint8_t>pad, <uint8_t *>cnp.PyArray_DATA(cols))
    return cols


def dwconv(cnp.ndarray x, int a_zp, cnp.ndarray w, int64_t KH, int64_t KW, int64_t SH,
           int64_t SW, int64_t PH, int64_t PW, int64_t DH, int64_t DW, object bias,
           cnp.ndarray mult, int out_zp, int lo, int hi, cnp.ndarray out, int path=0,
           device=None):
    """Depthwise int8 conv2d: x uint8 [N, C, H, W], w int8 [C, KH * KW], out
    [N, C, OH, OW] int8, uint8 or float32 (C-contiguous), with gemm()'s
    epilogue (bias int32 [C] or None, mult float64 [C]). path 0: the best
    kernel here: qconv.c's AVX-512 VBMI + VNNI one, or its vpmaddwd one (AVX-512
    VNNI CPUs without VBMI), for horizontal strides 1 and 2; else the scalar
    one (qgemm.c); outputs at most 8 wide (under 16 where the three-row
    one does not apply) whose planes are small enough (VBMI + VNNI): the
    flat-pixel one; else outputs at most 8 wide with C a multiple of 16
    and horizontal dilation 1: the channel-blocked one (16 channels in the
    lanes); 1: the scalar one; 2: the vpmaddwd one (where it applies); 4:
    the AVX2 one (which CPUs without AVX-512 VNNI run); 5: the
    channel-blocked one (where it applies); 6: the flat-pixel one (where it
    applies). Returns the kernel used (1 scalar, 2 vpmaddwd, 3 VBMI, 4
    AVX2, 5 channel-blocked, 6 flat-pixel); all give the same bits.
    device: whose int8 table runs it (default: the CPU)."""
    cdef const mt_quant_kernels *k = _table("conv2d", _device(device), "qint8")
    if x.dtype != np.uint8 or x.ndim != 4 or not x.flags.c_contiguous:
        raise ValueError("dwconv: x must be a C-contiguous uint8 [N, C, H, W] array")
    cdef int64_t NB = x.shape[0], C = x.shape[1], H = x.shape[2], W = x.shape[3]
    if w.dtype != np.int8 or w.ndim != 2 or w.shape[0] != C or w.shape[1] != KH * KW \
            or not w.flags.c_contiguous:
        raise ValueError("dwconv: w must be int8 [C, KH * KW]")
    if mult.dtype != np.float64 or mult.shape[0] != C or not mult.flags.c_contiguous:
        raise ValueError("dwconv: mult must be float64 [C]")
    cdef cnp.ndarray b
    cdef const int32_t *bp = NULL
    if bias is not None:
        b = bias
        if b.dtype != np.int32 or b.shape[0] != C or not b.flags.c_contiguous:
            raise ValueError("dwconv: bias must be int32 [C]")
        bp = <const int32_t *>cnp.PyArray_DATA(b)
    if out.ndim != 4 or out.shape[0] != NB or out.shape[1] != C or not out.flags.c_contiguous \
            or out.dtype not in (np.int8, np.uint8, np.float32):
        raise ValueError("dwconv: out must be C-contiguous [N, C, OH, OW] int8/uint8/float32")
    cdef int64_t OH = out.shape[2], OW = out.shape[3]
    if OH <= 0 or OW <= 0 or OH != (H + 2 * PH - DH * (KH - 1) - 1) // SH + 1 \
            or OW != (W + 2 * PW - DW * (KW - 1) - 1) // SW + 1:
        raise ValueError("dwconv: out's spatial size does not fit the geometry")
    cdef int out_u8 = 2 if out.dtype == np.float32 else int(out.dtype == np.uint8)
    cdef int done = 0
    _note("dwconv", (_arr(x, "r"), _arr(w, "c"), None if bias is None else _arr(b, "c"),
                     _arr(mult, "c"), _arr(out, "w")),
          (NB, C, H, W, a_zp, KH, KW, SH, SW, PH, PW, DH, DW, OH, OW, out_zp, lo, hi, out_u8,
           path), ())
    with nogil:
        if path != 1:
            done = k.dwconv_vec_u8s8(<const uint8_t *>cnp.PyArray_DATA(x), NB, C, H, W,
                                     a_zp, <const int8_t *>cnp.PyArray_DATA(w), KH, KW, SH,
                                     SW, PH, PW, DH, DW, OH, OW, bp,
                                     <const double *>cnp.PyArray_DATA(mult), out_zp, lo, hi,
                                     out_u8, cnp.PyArray_DATA(out), path)
    if done:
        return done
    with nogil:
        k.dwconv_u8s8(<const uint8_t *>cnp.PyArray_DATA(x), NB, C, H, W, a_zp,
                      <const int8_t *>cnp.PyArray_DATA(w), KH, KW, SH, SW, PH, PW, DH, DW,
                      OH, OW, bp, <const double *>cnp.PyArray_DATA(mult), out_zp, lo, hi,
                      out_u8, cnp.PyArray_DATA(out))
    return 1


def has_amx():
    """Whether dense int8 convs run on AMX here (the CPU has AMX-INT8 and
    Linux lets this process use the tile state)."""
    cdef const mt_quant_kernels *k = _table("conv2d", 0, "qint8")
    return bool(k.has_amx())


def conv(cnp.ndarray x, int a_zp, cnp.ndarray wrows, cnp.ndarray wsum, int64_t groups,
         int64_t KH, int64_t KW, int64_t SH, int64_t SW, int64_t PH, int64_t PW, int64_t DH,
         int64_t DW, object bias, cnp.ndarray mult, int out_zp, int lo, int hi,
         cnp.ndarray out, int path=0, device=None):
    """Dense or grouped int8 conv2d (qconv.c), NCHW: x uint8 [N, C, H, W],
    wrows int8 [C_out + 31, ceil(K / 64) * 64] (K = C / groups * KH * KW:
    each output channel's filter flattened, zeros after it and in the 31
    rows after the last channel), wsum int32 [C_out] the filters' sums, out
    [N, C_out, OH, OW] int8, uint8 or float32 (C-contiguous), with gemm()'s
    epilogue (bias int32 [C_out] or None, mult float64 [C_out]).
    path 0: the best here (AMX, VNNI, AVX2, portable C); 1 portable C; 2
    VNNI; 3 AMX; 4 AVX2 (each where available, else the next in that
    order); all give the same bits. Returns the path used (1 portable, 2
    VNNI, 3 AMX, 4 AVX2). device: whose int8 table runs it (default: the
    CPU)."""
    cdef const mt_quant_kernels *k = _table("conv2d", _device(device), "qint8")
    if x.dtype != np.uint8 or x.ndim != 4 or not x.flags.c_contiguous:
        raise ValueError("conv: x must be a C-contiguous uint8 [N, C, H, W] array")
    cdef int64_t NB = x.shape[0], C = x.shape[1], H = x.shape[2], W = x.shape[3]
    if groups < 1 or C % groups:
        raise ValueError("conv: the input channels do not split into the groups")
    cdef int64_t Co = wsum.shape[0] if wsum.ndim == 1 else -1
    cdef int64_t K = C // groups * KH * KW
    if wsum.dtype != np.int32 or Co < 1 or Co % groups or not wsum.flags.c_contiguous:
        raise ValueError("conv: wsum must be int32 [C_out], C_out a multiple of groups")
    if wrows.dtype != np.int8 or wrows.ndim != 2 or wrows.shape[0] != Co + 31 \
            or wrows.shape[1] != (K + 63) // 64 * 64 or not wrows.flags.c_contiguous:
        raise ValueError("conv: wrows must be int8 [C_out + 31, ceil(K / 64) * 64]")
    if mult.dtype != np.float64 or mult.ndim != 1 or mult.shape[0] != Co \
            or not mult.flags.c_contiguous:
        raise ValueError("conv: mult must be float64 [C_out]")
    cdef cnp.ndarray b
    cdef const int32_t *bp = NULL
    if bias is not None:
        b = bias
        if b.dtype != np.int32 or b.ndim != 1 or b.shape[0] != Co or not b.flags.c_contiguous:
            raise ValueError("conv: bias must be int32 [C_out]")
        bp = <const int32_t *>cnp.PyArray_DATA(b)
    if out.ndim != 4 or out.shape[0] != NB or out.shape[1] != Co or not out.flags.c_contiguous \
            or out.dtype not in (np.int8, np.uint8, np.float32):
        raise ValueError("conv: out must be C-contiguous [N, C_out, OH, OW] int8/uint8/float32")
    cdef int64_t OH = out.shape[2], OW = out.shape[3], lw = wrows.shape[1]
    _note("conv", (_arr(x, "r"), _arr(wrows, "c"), _arr(wsum, "c"),
                   None if bias is None else _arr(b, "c"), _arr(mult, "c"), _arr(out, "w")),
          (NB, C, H, W, a_zp, lw, Co, groups, KH, KW, SH, SW, PH, PW, DH, DW, OH, OW, out_zp,
           lo, hi, 2 if out.dtype == np.float32 else int(out.dtype == np.uint8), path), ())
    if KH < 1 or KW < 1 or SH < 1 or SW < 1 or DH < 1 or DW < 1 or PH < 0 or PW < 0 \
            or OH <= 0 or OW <= 0 or OH != (H + 2 * PH - DH * (KH - 1) - 1) // SH + 1 \
            or OW != (W + 2 * PW - DW * (KW - 1) - 1) // SW + 1:
        raise ValueError("conv: out's spatial size does not fit the geometry")
    cdef int out_u8 = 2 if out.dtype == np.float32 else int(out.dtype == np.uint8)
    cdef int used
    with nogil:
        used = k.conv_u8s8(<const uint8_t *>cnp.PyArray_DATA(x), NB, C, H, W, a_zp,
                           <const int8_t *>cnp.PyArray_DATA(wrows), lw,
                           <const int32_t *>cnp.PyArray_DATA(wsum), Co, groups, KH, KW, SH,
                           SW, PH, PW, DH, DW, OH, OW, bp,
                           <const double *>cnp.PyArray_DATA(mult), out_zp, lo, hi, out_u8,
                           cnp.PyArray_DATA(out), path)
    if used == 0:
        raise MemoryError("conv: out of memory for the int8 convolution's buffers")
    return used


def add_into(Tensor a, Tensor b, Tensor out, float a_scale, float a_zp, float b_scale,
             float b_zp, float out_scale, float out_zp, float qmin, float qmax, bint relu,
             int path=0):
    """out[i] = clamp(rint(v / out_scale) + out_zp, qmin, qmax) with v =
    (a[i] - a_zp) * a_scale + (b[i] - b_zp) * b_scale (then max(v, 0) for
    relu), every step in float32 as the quantized Elemwise's dequantize /
    add / quantize passes compute it (qelemwise.c). a, b, out: contiguous
    CPU tensors of int8 or uint8 storage and one size. path 0: AVX-512
    where the CPU has it; 1: portable C (same bits). Returns the path used
    (1 portable, 2 AVX-512)."""
    cdef const mt_quant_kernels *k = _table("add", out._device, out._dtype)
    _check(a, "a")
    _check(b, "b")
    _check(out, "out")
    if numel(a) != numel(out) or numel(b) != numel(out):
        raise ValueError("add_into takes a, b and out of one size")
    cdef int ak = _kind(a), bk = _kind(b), ok = _kind(out)
    if ak == 2 or bk == 2 or ok == 2:
        raise ValueError("add_into takes int8 or uint8 storage")
    cdef int64_t n = numel(out)
    cdef int used
    _note("add", (_ten(a, n, "r"), _ten(b, n, "r"), _ten(out, n, "w")),
          (ak, bk, n, relu, ok, path),
          (a_scale, a_zp, b_scale, b_zp, out_scale, out_zp, qmin, qmax))
    with nogil:
        used = k.add_u8(<const void *>a._data, ak, a_scale, a_zp, <const void *>b._data, bk,
                        b_scale, b_zp, n, out_scale, out_zp, qmin, qmax, relu,
                        <void *>out._data, ok, path)
    return used


def maxpool(cnp.ndarray x, int64_t KH, int64_t KW, int64_t SH, int64_t SW, int64_t PH,
            int64_t PW, int64_t DH, int64_t DW, cnp.ndarray out, device=None):
    """Max pooling of uint8 [N, C, H, W] into uint8 [N, C, OH, OW] (both
    C-contiguous; qpool.c), geometry checked by the caller (padding at most
    half the kernel). device: whose int8 table runs it (default: the CPU)."""
    cdef const mt_quant_kernels *k = _table("max_pool2d", _device(device), "quint8")
    if x.dtype != np.uint8 or x.ndim != 4 or not x.flags.c_contiguous:
        raise ValueError("maxpool takes a C-contiguous uint8 [N, C, H, W] array")
    if out.dtype != np.uint8 or out.ndim != 4 or not out.flags.c_contiguous or \
            out.shape[0] != x.shape[0] or out.shape[1] != x.shape[1]:
        raise ValueError("maxpool writes a C-contiguous uint8 [N, C, OH, OW] array")
    if min(KH, KW, SH, SW, DH, DW) < 1 or min(PH, PW) < 0 or 2 * PH > KH or 2 * PW > KW:
        raise ValueError("maxpool: kernel, stride, dilation >= 1 and padding in [0, kernel / 2]")
    cdef int64_t planes = x.shape[0] * x.shape[1], H = x.shape[2], W = x.shape[3]
    cdef int64_t OH = out.shape[2], OW = out.shape[3]
    if OH < 1 or OW < 1 or (OH - 1) * SH - PH >= H or (OW - 1) * SW - PW >= W:
        raise ValueError("maxpool: a window starts past the input")
    cdef int ok
    _note("maxpool", (_arr(x, "r"), _arr(out, "w")),
          (planes, H, W, KH, KW, SH, SW, PH, PW, DH, DW, OH, OW), ())
    with nogil:
        ok = k.maxpool2d_u8(<const uint8_t *>cnp.PyArray_DATA(x), planes, H, W, KH, KW, SH,
                            SW, PH, PW, DH, DW, OH, OW, <uint8_t *>cnp.PyArray_DATA(out))
    if not ok:
        raise MemoryError("maxpool: out of memory for the int8 max pool's buffers")


def _windows(cnp.ndarray s, cnp.ndarray e, cnp.ndarray d, int64_t n, int64_t m, str axis):
    if s.dtype != np.int64 or e.dtype != np.int64 or d.dtype != np.int64 or \
            s.ndim != 1 or e.ndim != 1 or d.ndim != 1 or not s.flags.c_contiguous or \
            not e.flags.c_contiguous or not d.flags.c_contiguous or \
            s.shape[0] != m or e.shape[0] != m or d.shape[0] != m:
        raise ValueError(f"avgpool: the {axis} windows must be three C-contiguous int64 "
                         f"arrays of the output's size {m}")
    if m and (s.min() < 0 or e.max() > n or (e < s).any() or d.min() < 0 or
              (d > (1 << 31)).any()):
        raise ValueError(f"avgpool: a {axis} window lies outside the input's {n} or has a "
                         "negative or too large divisor")


def avgpool(cnp.ndarray x, cnp.ndarray ys, cnp.ndarray ye, cnp.ndarray dy, cnp.ndarray xs,
            cnp.ndarray xe, cnp.ndarray dx, int32_t zp, int32_t lo, int32_t hi,
            cnp.ndarray out, device=None):
    """Average pooling of int8 / uint8 [N, C, H, W] into the same dtype [N, C,
    OH, OW] (both C-contiguous; qpool.c): output (oy, ox) is
    ``clamp(round_half_even((sum(q) - zp * n) / (dy[oy] * dx[ox])) + zp,
    lo, hi)`` over rows [ys[oy], ye[oy]) and columns [xs[ox], xe[ox]) (n
    elements); zp for a zero divisor. The windows are int64 [OH] / [OW].
    device: whose int8 table runs it (default: the CPU)."""
    cdef const mt_quant_kernels *k = _table("avg_pool2d", _device(device), "qint8")
    if x.dtype not in (np.int8, np.uint8) or x.ndim != 4 or not x.flags.c_contiguous:
        raise ValueError("avgpool takes a C-contiguous int8 / uint8 [N, C, H, W] array")
    if out.dtype != x.dtype or out.ndim != 4 or not out.flags.c_contiguous or \
            out.shape[0] != x.shape[0] or out.shape[1] != x.shape[1]:
        raise ValueError("avgpool writes a C-contiguous [N, C, OH, OW] array of x's dtype")
    cdef int64_t planes = x.shape[0] * x.shape[1], H = x.shape[2], W = x.shape[3]
    cdef int64_t OH = out.shape[2], OW = out.shape[3]
    _windows(ys, ye, dy, H, OH, "row")
    _windows(xs, xe, dx, W, OW, "column")
    cdef int ok, s8 = x.dtype == np.int8
    if planes == 0 or OH == 0 or OW == 0:
        return
    _note("avgpool", (_arr(x, "r"), _arr(ys, "c"), _arr(ye, "c"), _arr(dy, "c"), _arr(xs, "c"),
                      _arr(xe, "c"), _arr(dx, "c"), _arr(out, "w")),
          (s8, planes, H, W, OH, OW, zp, lo, hi), ())
    with nogil:
        ok = k.avgpool2d(cnp.PyArray_DATA(x), s8, planes, H, W, OH, OW,
                         <const int64_t *>cnp.PyArray_DATA(ys),
                         <const int64_t *>cnp.PyArray_DATA(ye),
                         <const int64_t *>cnp.PyArray_DATA(dy),
                         <const int64_t *>cnp.PyArray_DATA(xs),
                         <const int64_t *>cnp.PyArray_DATA(xe),
                         <const int64_t *>cnp.PyArray_DATA(dx), zp, lo, hi,
                         cnp.PyArray_DATA(out))
    if not ok:
        raise MemoryError("avgpool: out of memory for the int8 average pool's buffers")


def concat_into(list xs, list scales, list zps, int64_t outer, Tensor out, float out_scale,
                float out_zp, float qmin, float qmax):
    """Concatenate int8 / uint8 CPU tensors ``xs`` into ``out`` (qelemwise.c),
    each requantized to (out_scale, out_zp) as the dequantize / quantize
    passes compute it in float32: ``clamp(rint(((q - zp) * scale) /
    out_scale) + out_zp, qmin, qmax)``. Each x is contiguous and read as
    [outer, numel / outer]; out is contiguous [outer, sum of those]."""
    cdef const mt_quant_kernels *k = _table("concat", out._device, out._dtype)
    cdef int n = len(xs), j
    if n < 1 or len(scales) != n or len(zps) != n or outer < 1:
        raise ValueError("concat_into takes one scale and zero point per input, outer >= 1")
    _check(out, "out")
    cdef int ok = _kind(out)
    if ok == 2:
        raise ValueError("concat_into writes int8 or uint8 storage")
    cdef cnp.ndarray ptrs = np.empty(n, np.uintp), kinds = np.empty(n, np.intc)
    cdef cnp.ndarray sc = np.asarray(scales, np.float32), zp = np.asarray(zps, np.float32)
    cdef cnp.ndarray inner = np.empty(n, np.int64), tables = np.empty(257 * n, np.uint8)
    cdef Tensor x
    cdef int64_t total = 0
    for j in range(n):
        x = xs[j]
        _check(x, "x")
        kinds[j] = _kind(x)
        if kinds[j] == 2 or numel(x) % outer:
            raise ValueError("concat_into takes int8 or uint8 inputs of whole rows")
        ptrs[j] = <size_t>x._data
        inner[j] = numel(x) // outer
        total += inner[j]
    if total * outer != numel(out):
        raise ValueError("concat_into: out holds not the inputs' elements")
    if n > MT_PLAN_Q_CONCAT_INPUTS:
        _spoil()          # more inputs than a plan's concat step takes
    else:
        _note("concat", (_ten(out, numel(out), "w"), _arr(kinds, "c"), _arr(sc, "c"),
                         _arr(zp, "c"), _arr(inner, "c"), _arr(tables, "w"))
              + tuple(_ten(xs[j], numel(xs[j]), "r") for j in range(n)),
              (n, outer, ok), (out_scale, out_zp, qmin, qmax))
    with nogil:
        k.concat_u8(n, <const void *const *>cnp.PyArray_DATA(ptrs),
                    <const int *>cnp.PyArray_DATA(kinds), <const float *>cnp.PyArray_DATA(sc),
                    <const float *>cnp.PyArray_DATA(zp), <const int64_t *>cnp.PyArray_DATA(inner),
                    outer, out_scale, out_zp, qmin, qmax, ok,
                    <uint8_t *>cnp.PyArray_DATA(tables), <void *>out._data)
