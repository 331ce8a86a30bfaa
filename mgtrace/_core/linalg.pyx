# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Matrix products: matmul (NumPy semantics) over OpenBLAS.

Float32/float64 products are BLAS sgemm/dgemm calls (OpenBLAS from the
scipy-openblas32 wheel, as NumPy links it); float16/bfloat16 are computed in
float32 and rounded back; integer products use a plain int64-accumulating
loop. The BLAS thread count follows mgtrace.set_num_threads.
"""
from libc.stdint cimport int64_t
from libc.stdlib cimport malloc, free

from mgtrace._core.kernels cimport MT_MAX_NDIM, MT_BK_ENOKERNEL
from mgtrace._core.tensor cimport (Tensor, empty, view_of, is_contiguous, shape_tuple, backend_of,
                                   backend_error, cpu_backend)
from mgtrace._core.tensor import missing_kernel
from mgtrace._core.dtype cimport CATEGORY, promote_operands
from mgtrace._core.dispatch cimport cast, coerce, fill, num_threads
from mgtrace._core.device cimport Device, DEVICES
from mgtrace._core.dtype import NAMES as DTYPE_NAMES
from mgtrace._core.dispatch import core_op

cdef extern from "kernels/cpu/gemm.h" nogil:
    ctypedef struct mt_gemm_shape:
        int64_t M, N, K
        int64_t sam, sak, sbk, sbn, scm, scn
    void mt_gemm_float_batch(int dtype, const mt_gemm_shape *s, const char *a, const char *b, char *c,
                             const int64_t *a_off, const int64_t *b_off, const int64_t *c_off,
                             int64_t batch, int nt)
    void mt_gemm_int_batch(int dtype, const mt_gemm_shape *s, const char *a, const char *b, char *c,
                           const int64_t *a_off, const int64_t *b_off, const int64_t *c_off,
                           int64_t batch, int nt)
    int mt_cpu_gemm_batch(int dtype, const mt_gemm_shape *s, const char *a, const char *b, char *c,
                          const int64_t *a_off, const int64_t *b_off, const int64_t *c_off,
                          int64_t batch, int nt)
    void mt_blas_set_threads(int n)
    int mt_blas_get_threads()
    const char *mt_blas_config()
    ctypedef struct mt_linalg_kernels:
        int (*gemm)(int dtype, const mt_gemm_shape *s, const char *a, const char *b, char *c,
                    int64_t batch, int64_t stride_a, int64_t stride_b, int64_t stride_c) noexcept nogil
        int native_half
        int (*gemm_batch)(int dtype, const mt_gemm_shape *s, const char *a, const char *b, char *c,
                          const int64_t *a_off, const int64_t *b_off, const int64_t *c_off,
                          int64_t batch, int nt) noexcept nogil

# the CPU backend's linalg member: its offset-list GEMM, no strided one
cdef mt_linalg_kernels _CPU
_CPU.gemm = NULL
_CPU.native_half = 0
_CPU.gemm_batch = mt_cpu_gemm_batch
cpu_backend().linalg = &_CPU

cdef int64_t BLAS_MAX = 2147483647


def set_blas_threads(int n):
    mt_blas_set_threads(n)


def get_blas_threads():
    """Threads OpenBLAS uses for one GEMM."""
    return mt_blas_get_threads()


def blas_config():
    """OpenBLAS's build description (kernel, threading)."""
    return mt_blas_config().decode()


cdef bint blas_ok(Tensor t) noexcept:
    """Last two axes usable by row-major BLAS as-is (one unit stride)."""
    cdef int64_t rs = t._strides[t._ndim - 2], cs = t._strides[t._ndim - 1]
    cdef int64_t rows = t._shape[t._ndim - 2], cols = t._shape[t._ndim - 1]
    if cs == 1 and (rows == 1 or rs >= max(cols, 1)):
        return rs < BLAS_MAX
    if rs == 1 and (cols == 1 or cs >= max(rows, 1)):
        return cs < BLAS_MAX
    return False


cdef bint _rows_fold(Tensor t, int64_t rows) noexcept:
    """Whether t [..., M, K]'s leading axes and M walk its rows with one
    stride (t's rows are one run of ``rows`` rows for row-major BLAS: unit
    column stride, each axis's stride the next one's extent times its
    stride)."""
    cdef int d, nd = t._ndim
    cdef int64_t rs = t._strides[nd - 2], step
    if nd < 3 or t._strides[nd - 1] != 1 or rows > BLAS_MAX or rs < max(t._shape[nd - 1], 1):
        return False
    step = t._shape[nd - 2] * rs            # the stride the next outer axis must have
    for d in range(nd - 3, -1, -1):
        if t._shape[d] != 1 and t._strides[d] != step:
            return False
        step *= t._shape[d]
    return True


cdef object _complex_matmul(Tensor ta, Tensor tb, int code):
    """a @ b for complex operands (either promoted to ``code``): four real
    products, (ar br - ai bi) + i (ar bi + ai br), each a BLAS GEMM."""
    from mgtrace._core.dispatch import complex_part, make_complex
    if ta._dtype != code:
        ta = cast(ta, code)
    if tb._dtype != code:
        tb = cast(tb, code)
    ar, ai = complex_part(ta, "real"), complex_part(ta, "imag")
    br, bi = complex_part(tb, "real"), complex_part(tb, "imag")
    return make_complex(matmul(ar, br) - matmul(ai, bi), matmul(ar, bi) + matmul(ai, br))


@core_op
def matmul(a, b):
    """Matrix product with NumPy's matmul semantics.

    Args:
        a: [..., M, K] or [K] (a 1-d operand gets a unit axis, removed after).
        b: [..., K, N] or [K].
        Leading (batch) axes broadcast (NumPy rules).

    Returns:
        Tensor [..., M, N], dtype by MegEngine promotion of a and b
        (float16/bfloat16 computed in float32; integers accumulate in int64
        and wrap on store; complex64/complex128 as four real products).

    Raises:
        ValueError: 0-d operands, K mismatch, batch shapes that do not
            broadcast, or devices that differ ("ambiguous device").
        TypeError: bool operands.

    >>> import mgtrace as mt
    >>> (mt.tensor([[1.0, 2.0], [3.0, 4.0]]) @ mt.tensor([1.0, 1.0])).tolist()
    [3.0, 7.0]
    >>> (mt.tensor([[1, 2]]) @ mt.tensor([[3], [4]])).tolist()
    [[11]]
    """
    cdef Tensor ta, tb, out
    cdef int dev, code, cdt
    ta = a if isinstance(a, Tensor) else None
    tb = b if isinstance(b, Tensor) else None
    dev = ta._device if ta is not None else (tb._device if tb is not None else 0)
    if ta is None:
        ta = coerce(a, dev)
    if tb is None:
        tb = coerce(b, dev)
    if ta._device != tb._device:
        raise ValueError(f"ambiguous device: {DEVICES[ta._device]} vs {DEVICES[tb._device]}")
    if ta._ndim == 0 or tb._ndim == 0:
        raise ValueError("matmul: 0-d operands are not allowed; use * for scalars")
    code = promote_operands((ta, tb))
    if code == 0:
        raise TypeError("matmul of bool tensors is not supported; cast to an integer or float dtype")
    if CATEGORY[code] == 4:
        return _complex_matmul(ta, tb, code)
    cdt = 9 if code in (7, 8) and not _native_half(dev) else code
    if ta._dtype != cdt:
        ta = cast(ta, cdt)
    if tb._dtype != cdt:
        tb = cast(tb, cdt)
    cdef bint a1 = ta._ndim == 1, b1 = tb._ndim == 1
    if a1:
        ta = ta.reshape(1, ta._shape[0])
    if b1:
        tb = tb.reshape(tb._shape[0], 1)
    if not blas_ok(ta):
        ta = ta.copy()
    if not blas_ok(tb):
        tb = tb.copy()
    out = _matmul2(ta, tb, cdt)
    if a1:
        out = out.squeeze(out._ndim - 2)
    if b1:
        out = out.squeeze(out._ndim - 1)
    if code != cdt:
        out = cast(out, code)
    return out


cdef Tensor _matmul2(Tensor ta, Tensor tb, int cdt):
    cdef int64_t M = ta._shape[ta._ndim - 2], K = ta._shape[ta._ndim - 1]
    cdef int64_t K2 = tb._shape[tb._ndim - 2], N = tb._shape[tb._ndim - 1]
    if K != K2:
        raise ValueError(f"matmul: inner dimensions differ: {shape_tuple(ta)} @ {shape_tuple(tb)} "
                         f"({K} vs {K2})")
    if M > BLAS_MAX or N > BLAS_MAX or K > BLAS_MAX:
        raise ValueError("matmul: a dimension exceeds the 32-bit BLAS limit")
    # broadcast batch axes
    cdef int nba = ta._ndim - 2, nbb = tb._ndim - 2, nb = max(nba, nbb), d, ka, kb
    cdef int64_t oshape[16]
    cdef int64_t sa[16]
    cdef int64_t sb[16]
    for d in range(nb):
        ka = d - (nb - nba)
        kb = d - (nb - nbb)
        da = ta._shape[ka] if ka >= 0 else 1
        db = tb._shape[kb] if kb >= 0 else 1
        if da != db and da != 1 and db != 1:
            raise ValueError(f"matmul: batch shapes do not broadcast: {shape_tuple(ta)} @ {shape_tuple(tb)}")
        oshape[d] = db if da == 1 else da      # NumPy's rule: a 0 against a 1 is 0
        sa[d] = ta._strides[ka] if ka >= 0 and da != 1 else 0
        sb[d] = tb._strides[kb] if kb >= 0 and db != 1 else 0
    oshape[nb] = M
    oshape[nb + 1] = N
    cdef Tensor out = empty(nb + 2, oshape, cdt, ta._device)
    cdef int64_t batch = 1
    for d in range(nb):
        batch *= oshape[d]
    if batch == 0 or M == 0 or N == 0:
        return out
    if K == 0:
        fill(out, 0)
        return out
    cdef mt_gemm_shape s
    s.M = M; s.N = N; s.K = K
    s.sam = ta._strides[ta._ndim - 2]; s.sak = ta._strides[ta._ndim - 1]
    s.sbk = tb._strides[tb._ndim - 2]; s.sbn = tb._strides[tb._ndim - 1]
    s.scm = N; s.scn = 1
    if nbb == 0 and nba == nb and _rows_fold(ta, batch * M):
        # x [..., M, K] @ w [K, N] (F.linear on 3-d input): the leading axes
        # are one run of rows, so this is one GEMM with M' = batch * M
        # instead of a loop of small ones (each paying BLAS's setup and
        # threading); the output [..., M, N] is that GEMM's [M', N]
        s.M = batch * M
        batch = 1
    cdef const mt_linalg_kernels *k = _kernels(ta._device, cdt)
    if k.gemm_batch == NULL:
        _device_gemm(ta, tb, out, &s, cdt, nb, oshape, batch)
        return out
    cdef int rc = 0
    cdef int64_t *offs = <int64_t *>malloc(sizeof(int64_t) * 3 * batch)
    if offs == NULL:
        raise MemoryError()
    cdef int64_t i, rem, idx, oa, ob
    try:
        for i in range(batch):
            rem = i
            oa = 0
            ob = 0
            for d in range(nb - 1, -1, -1):
                idx = rem % oshape[d]
                rem //= oshape[d]
                oa += idx * sa[d]
                ob += idx * sb[d]
            offs[i] = oa
            offs[batch + i] = ob
            offs[2 * batch + i] = i * M * N
        nt = num_threads()
        if cdt >= 9 and k.gemm_batch == mt_cpu_gemm_batch and nt != mt_blas_get_threads():
            # OpenBLAS's threads follow the kernels' (adaptive) count: a busy
            # machine gets single-threaded GEMMs, a quiet one threaded again
            mt_blas_set_threads(nt)
        with nogil:
            rc = k.gemm_batch(cdt, &s, ta._data, tb._data, out._data, offs, offs + batch,
                              offs + 2 * batch, batch, nt)
    finally:
        free(offs)
    if rc == MT_BK_ENOKERNEL:
        raise missing_kernel("matmul", ta._device, cdt)
    if rc != 0:
        raise backend_error(ta._device, rc, "matmul")
    return out


# ------------------------------------------------------------------ device backends

cdef const mt_linalg_kernels *_kernels(int dev, int cdt) except NULL:
    cdef const mt_linalg_kernels *k = <const mt_linalg_kernels *>backend_of(dev).linalg
    if k == NULL or (k.gemm == NULL and k.gemm_batch == NULL):
        raise missing_kernel("matmul", dev, cdt)
    return k


def _has_kernel(str op, int device, int dtype):
    """Whether ``device`` has a GEMM for matmul at dtype code ``dtype``
    (float16/bfloat16 count: without native ones they run in float32);
    None when op is not matmul (see has_kernel)."""
    if op != "matmul":
        return None
    cdef const mt_linalg_kernels *k = <const mt_linalg_kernels *>backend_of(device).linalg
    if k == NULL or (k.gemm == NULL and k.gemm_batch == NULL) or dtype == 0:
        return False
    return True


cdef bint _native_half(int dev) except -1:
    """Whether float16/bfloat16 products run in their own dtype on dev (a
    GPU's tensor cores) instead of float32 as on the CPU."""
    return _kernels(dev, 9).native_half != 0


cdef list _batch_offsets(Tensor ta, Tensor tb, int nb, int64_t *oshape, int64_t batch):
    """(A offset, B offset) in elements of each problem of the batch, the
    batch axes broadcast as in _matmul2."""
    cdef int nba = ta._ndim - 2, nbb = tb._ndim - 2, d, ka, kb
    cdef int64_t i, rem, idx, oa, ob
    sa, sb = [], []
    for d in range(nb):
        ka, kb = d - (nb - nba), d - (nb - nbb)
        sa.append(ta._strides[ka] if ka >= 0 and ta._shape[ka] != 1 else 0)
        sb.append(tb._strides[kb] if kb >= 0 and tb._shape[kb] != 1 else 0)
    offs = []
    for i in range(batch):
        rem, oa, ob = i, 0, 0
        for d in range(nb - 1, -1, -1):
            idx = rem % oshape[d]
            rem //= oshape[d]
            oa += idx * sa[d]
            ob += idx * sb[d]
        offs.append((oa, ob))
    return offs


cdef bint _uniform(list offs):
    """Whether problem i sits at i * (the first step) in A and in B."""
    if len(offs) < 2:
        return True
    sa, sb = offs[1]
    return all(oa == i * sa and ob == i * sb for i, (oa, ob) in enumerate(offs))


cdef int _device_gemm(Tensor ta, Tensor tb, Tensor out, mt_gemm_shape *s, int cdt, int nb,
                      int64_t *oshape, int64_t batch) except -1:
    """The batch on a device backend: one strided-batched call when the batch
    axes step A and B by one stride each. Views whose batch axes do not (the
    heads of attention, transposed out of [B, S, H, D]) are copied contiguous
    first: one copy costs far less than a GEMM call per problem. Batch axes
    that broadcast unevenly are left: one call per problem."""
    cdef const mt_linalg_kernels *k = _kernels(ta._device, cdt)
    cdef int64_t i, oa, ob, isz = ta.itemsize, step_a = 0, step_b = 0
    cdef int rc = 0
    offs = _batch_offsets(ta, tb, nb, oshape, batch) if batch > 1 else [(0, 0)]
    if not _uniform(offs):
        ta, tb = <Tensor>ta.contiguous(), <Tensor>tb.contiguous()
        s.sam, s.sak = ta._strides[ta._ndim - 2], ta._strides[ta._ndim - 1]
        s.sbk, s.sbn = tb._strides[tb._ndim - 2], tb._strides[tb._ndim - 1]
        offs = _batch_offsets(ta, tb, nb, oshape, batch)
    if _uniform(offs):
        if batch > 1:
            step_a, step_b = offs[1]
        with nogil:
            rc = k.gemm(cdt, s, ta._data, tb._data, out._data, batch, step_a, step_b, s.M * s.N)
    else:
        for i in range(batch):
            oa, ob = offs[i]
            rc = k.gemm(cdt, s, ta._data + oa * isz, tb._data + ob * isz,
                        out._data + i * s.M * s.N * isz, 1, 0, 0, 0)
            if rc != 0:
                break
    if rc == MT_BK_ENOKERNEL:
        raise missing_kernel("matmul", ta._device, cdt)
    if rc != 0:
        raise backend_error(ta._device, rc, "matmul")
    return 0

