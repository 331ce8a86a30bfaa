# cython: language_level=3, boundscheck=False, wraparound=False
"""The executor of inference plans (kernels/plan.c): steps recorded from the
backend's kernel calls, replayed with the GIL released.

:mod:`mgtrace.plan` decides what a plan is (which calls, which buffers,
where the arena puts each intermediate); this module only owns the memory
of one (the step array, the GEMM offset lists, the arenas) and runs it.

- :func:`capture_install` / :func:`capture_uninstall` put the recording
  wrappers into the CPU backend's elementwise and linalg members (counted:
  nested compiles share one install); :func:`capture_begin` and
  :func:`take_capture` bracket one op in the calling thread.
- :class:`Executor` holds the steps and the buffer table; ``run`` makes a
  :class:`Run` (the addresses of one call) and replays every step, calling
  back into Python, with the GIL, for the steps that are Python.
"""
from cpython.ref cimport PyObject
from libc.stdint cimport int64_t, int32_t, uint64_t, uintptr_t
from libc.stdlib cimport malloc, calloc, free, realloc
from libc.string cimport memcpy, memset

from mgtrace._core.kernels cimport mt_storage, mt_backend, mt_ew_call, MT_MAX_NDIM, \
    MT_EW_UNARY, MT_FLOAT32

cdef extern from "kernels/contract/mt_ops.h" nogil:
    enum: MT_U_relu6
from mgtrace._core.tensor cimport Tensor, cpu_backend, empty
from mgtrace._core.dtype cimport ITEMSIZE

cdef extern from "kernels/cpu/gemm.h" nogil:
    ctypedef struct mt_gemm_shape:
        int64_t M, N, K
        int64_t sam, sak, sbk, sbn, scm, scn
    ctypedef struct mt_linalg_kernels:
        int (*gemm)(int dtype, const mt_gemm_shape *s, const char *a, const char *b, char *c,
                    int64_t batch, int64_t stride_a, int64_t stride_b, int64_t stride_c) noexcept nogil
        int native_half
        int (*gemm_batch)(int dtype, const mt_gemm_shape *s, const char *a, const char *b, char *c,
                          const int64_t *a_off, const int64_t *b_off, const int64_t *c_off,
                          int64_t batch, int nt) noexcept nogil

cdef extern from "kernels/cpu/nn.h" nogil:
    ctypedef struct mt_conv2d_geom:
        int has_res
        int64_t res_delta
    ctypedef struct mt_pool2d_geom:
        int64_t planes
    ctypedef struct mt_attn_geom:
        int64_t b
    ctypedef struct mt_nn_kernels:
        int (*layer_norm)(int dtype, const void *x, const void *w, const void *b, void *y,
                          int64_t rows, int64_t cols, double eps, int nt) noexcept nogil

cdef extern from "kernels/contract/reduce_kernels.h" nogil:
    ctypedef struct mt_reduce_geom:
        int nkeep
        int64_t kshape[16]
        int64_t kin[16]
        int64_t kout[16]
        int nred
        int64_t rshape[16]
        int64_t rin[16]
    ctypedef int (*mt_reduce_fn)(const char *inp, char *out, const mt_reduce_geom *g,
                                 int nt) noexcept nogil
    ctypedef struct mt_reduce_kernels:
        pass

cdef extern from "kernels/cpu/plan.h" nogil:
    enum: MT_STEP_EW, MT_STEP_GEMM, MT_STEP_CALLBACK, MT_STEP_NN, MT_STEP_REDUCE, MT_STEP_GATHER
    enum: MT_STEP_QUANT, MT_Q_NKERNELS, MT_PLAN_Q_PTRS, MT_PLAN_Q_INTS, MT_PLAN_Q_FLOATS
    enum: MT_Q_GEMM, MT_Q_CONV, MT_Q_DWCONV, MT_Q_QUANTIZE, MT_Q_DEQUANTIZE, MT_Q_ADD
    enum: MT_Q_MAXPOOL, MT_Q_AVGPOOL, MT_Q_FLIP, MT_Q_CONCAT, MT_Q_BLOCK
    enum: MT_NN_CONV2D_NCHWC, MT_NN_PW_DW, MT_NN_PW_DW_PW, MT_NN_MAX_POOL_NCHWC
    enum: MT_NN_TO_NCHWC, MT_NN_FROM_NCHWC, MT_NN_LAYER_NORM, MT_NN_ATTENTION, MT_NN_BIAS_ACT
    enum: MT_NN_CONV2D, MT_NN_CONV2D_PACKED, MT_NN_MAX_POOL2D, MT_NN_AVG_POOL2D
    enum: MT_NN_ADAPTIVE_POOL2D, MT_NN_RESIZE2D, MT_NN_CONV_TRANSPOSE2D, MT_NN_CONV3D
    enum: MT_NN_LSTM_CELL, MT_NN_RNN_CELL, MT_NN_LRN, MT_NN_ADD_LAYER_NORM, MT_NN_PAD_INDEX
    enum: MT_PLAN_NN_PTRS
    ctypedef int (*mt_ew_kernel)(const mt_ew_call *call) noexcept nogil
    ctypedef int (*mt_gemm_batch_kernel)(int dtype, const mt_gemm_shape *s, const char *a,
                                         const char *b, char *c, const int64_t *a_off,
                                         const int64_t *b_off, const int64_t *c_off,
                                         int64_t batch, int nt) noexcept nogil
    ctypedef struct mt_plan_ref:
        int32_t buf
        int64_t off
    ctypedef struct mt_plan_ew:
        mt_ew_call call
        mt_plan_ref ref[4]
        int64_t scalar[4]
        mt_ew_kernel kernel
    ctypedef struct mt_plan_gemm:
        int dtype, nt
        mt_gemm_shape shape
        mt_plan_ref a, b, c
        int64_t batch
        int64_t *offs
        mt_gemm_batch_kernel kernel
    ctypedef struct mt_plan_nn:
        int which, np, nt
        void *kernel
        mt_plan_ref p[12]
        mt_conv2d_geom g[3]
        mt_pool2d_geom pool
        mt_attn_geom attn
        int64_t i[8]
        double eps
        double f[2]
    ctypedef struct mt_plan_reduce:
        int nt
        mt_reduce_fn kernel
        mt_plan_ref inp "in"
        mt_plan_ref out
        mt_reduce_geom g
    ctypedef struct mt_plan_gather:
        mt_plan_ref idx, src, out
        int isz, is_signed
        int64_t n, rows, row_bytes, src_stride
    ctypedef struct mt_plan_quant:
        int which, nt
        const void *k
        mt_plan_ref p[17]          # plan.h's MT_PLAN_Q_PTRS, MT_PLAN_Q_INTS, MT_PLAN_Q_FLOATS
        int64_t i[40]
        double f[8]
    ctypedef union mt_plan_u:
        mt_plan_ew ew
        mt_plan_gemm gemm
        mt_plan_nn nn
        mt_plan_reduce red
        mt_plan_gather gather
        mt_plan_quant quant
    ctypedef struct mt_plan_step:
        int kind
        int index
        mt_plan_u u
    ctypedef int (*mt_plan_callback)(void *ctx, int index) noexcept nogil
    int mt_plan_run(const mt_plan_step *steps, int64_t n, char *const *bases,
                    mt_plan_callback callback, void *ctx, int64_t *failed)
    int mt_plan_run_timed(const mt_plan_step *steps, int64_t n, char *const *bases,
                          mt_plan_callback callback, void *ctx, int64_t *failed, int64_t *ns)
    ctypedef struct mt_plan_captured:
        int kind
        mt_ew_call ew
        int64_t ew_scalar[4]
        mt_ew_kernel ew_kernel
        int dtype, nt
        mt_gemm_shape shape
        const char *a
        const char *b
        char *c
        int64_t batch
        int64_t *offs
        mt_gemm_batch_kernel gemm_kernel
        mt_plan_nn nn
        mt_plan_reduce red
    int mt_plan_capture_allocs()
    void mt_plan_capture_alloc_get(int i, uintptr_t *ptr, int64_t *nbytes)
    void mt_plan_set_real_nn(const mt_nn_kernels *real, mt_nn_kernels *wrapped)
    void mt_plan_set_real_reduce(const mt_reduce_kernels *real, mt_reduce_kernels *wrapped)
    void mt_plan_set_real_alloc(mt_storage *(*real)(int index, size_t nbytes) noexcept nogil)
    mt_storage *mt_plan_capture_alloc(int index, size_t nbytes)
    void mt_plan_capture_begin()
    int mt_plan_capture_count()
    const mt_plan_captured *mt_plan_capture_get(int i)
    void mt_plan_capture_end()
    ctypedef int (*mt_gemm_kernel)(int dtype, const mt_gemm_shape *s, const char *a, const char *b,
                                   char *c, int64_t batch, int64_t stride_a, int64_t stride_b,
                                   int64_t stride_c) noexcept nogil
    void mt_plan_set_real_kernels(mt_ew_kernel ew, mt_gemm_batch_kernel gemm_batch, mt_gemm_kernel gemm)
    int mt_plan_capture_elementwise(const mt_ew_call *call)
    int mt_plan_capture_gemm_batch(int dtype, const mt_gemm_shape *s, const char *a, const char *b,
                                   char *c, const int64_t *a_off, const int64_t *b_off,
                                   const int64_t *c_off, int64_t batch, int nt)
    int mt_plan_capture_gemm(int dtype, const mt_gemm_shape *s, const char *a, const char *b,
                             char *c, int64_t batch, int64_t stride_a, int64_t stride_b,
                             int64_t stride_c)

# buffer kinds (mgtrace.plan's BufferKind mirrors them)
cdef enum:
    BUF_ARENA = 0     # intermediates: arena + offset
    BUF_INPUT = 1     # the call's input number ``where``
    BUF_CONST = 2     # a tensor the plan holds (parameters, constants)
    BUF_OUTPUT = 3    # a fresh storage of ``nbytes`` per call (what the caller gets back)
    BUF_DYNAMIC = 4   # the storage a Python step returned, bound during the run

STEP_EW, STEP_GEMM, STEP_CALLBACK, STEP_NN = MT_STEP_EW, MT_STEP_GEMM, MT_STEP_CALLBACK, MT_STEP_NN
# ew_info()'s codes for the ReLU6 fold (plan/_qact.py)
EW_UNARY, U_RELU6, FLOAT32 = MT_EW_UNARY, MT_U_relu6, MT_FLOAT32
STEP_REDUCE = MT_STEP_REDUCE
STEP_GATHER = MT_STEP_GATHER
STEP_QUANT = MT_STEP_QUANT
# the int8 calls mgtrace._core.qint8 records, by its names (add_quant's which)
Q_CALLS = {"gemm": MT_Q_GEMM, "conv": MT_Q_CONV, "dwconv": MT_Q_DWCONV,
           "quantize": MT_Q_QUANTIZE, "dequantize": MT_Q_DEQUANTIZE, "add": MT_Q_ADD,
           "maxpool": MT_Q_MAXPOOL, "avgpool": MT_Q_AVGPOOL, "flip": MT_Q_FLIP,
           "concat": MT_Q_CONCAT, "block": MT_Q_BLOCK}
# per nn kernel: (index of its output pointer, index of its workspace or -1)
NN_ROLES = {MT_NN_CONV2D_NCHWC: (3, 4), MT_NN_PW_DW: (5, 6), MT_NN_PW_DW_PW: (7, 8),
            MT_NN_MAX_POOL_NCHWC: (1, -1), MT_NN_TO_NCHWC: (1, -1), MT_NN_FROM_NCHWC: (1, -1),
            MT_NN_LAYER_NORM: (3, -1), MT_NN_ATTENTION: (4, 5), MT_NN_BIAS_ACT: (0, -1),
            MT_NN_CONV2D: (3, 4), MT_NN_CONV2D_PACKED: (3, 4), MT_NN_MAX_POOL2D: (1, -1),
            MT_NN_AVG_POOL2D: (1, -1), MT_NN_ADAPTIVE_POOL2D: (1, -1), MT_NN_RESIZE2D: (1, -1),
            MT_NN_CONV_TRANSPOSE2D: (3, 4), MT_NN_CONV3D: (3, -1),
            # lstm_cell writes h_out (5) and c_out (6), both outputs of its op
            MT_NN_LSTM_CELL: (5, -1), MT_NN_RNN_CELL: (4, -1), MT_NN_LRN: (1, -1),
            MT_NN_ADD_LAYER_NORM: (5, -1), MT_NN_PAD_INDEX: (1, -1)}
NN_NAMES = {MT_NN_CONV2D_NCHWC: "conv2d_nchwc", MT_NN_PW_DW: "conv2d_nchwc_pw_dw",
            MT_NN_PW_DW_PW: "conv2d_nchwc_pw_dw_pw", MT_NN_MAX_POOL_NCHWC: "max_pool2d_nchwc",
            MT_NN_TO_NCHWC: "to_nchwc", MT_NN_FROM_NCHWC: "from_nchwc",
            MT_NN_LAYER_NORM: "layer_norm", MT_NN_ATTENTION: "attention", MT_NN_BIAS_ACT: "bias_act",
            MT_NN_CONV2D: "conv2d", MT_NN_CONV2D_PACKED: "conv2d_packed",
            MT_NN_MAX_POOL2D: "max_pool2d", MT_NN_AVG_POOL2D: "avg_pool2d",
            MT_NN_ADAPTIVE_POOL2D: "adaptive_pool2d", MT_NN_RESIZE2D: "resize2d",
            MT_NN_CONV_TRANSPOSE2D: "conv_transpose2d", MT_NN_CONV3D: "conv3d",
            MT_NN_LSTM_CELL: "lstm_cell", MT_NN_RNN_CELL: "rnn_cell", MT_NN_LRN: "lrn",
            MT_NN_ADD_LAYER_NORM: "add_layer_norm", MT_NN_PAD_INDEX: "pad"}


# ------------------------------------------------------------------ capture

cdef int _installs = 0
cdef mt_linalg_kernels _wrapped_linalg
cdef const void *_saved_linalg = NULL
cdef const void *_saved_nn = NULL
cdef mt_ew_kernel _saved_ew = NULL
cdef mt_storage *(*_saved_alloc)(int index, size_t nbytes) noexcept nogil
cdef char _wrapped_nn[4096]      # a copy of the nn table with the recording members
cdef const void *_saved_reduce = NULL
cdef char _wrapped_reduce[256]   # a copy of the reduce table with recording reductions


def capture_install():
    """Put the recording wrappers into the CPU backend (counted)."""
    global _installs, _saved_linalg, _saved_ew, _wrapped_linalg
    cdef mt_backend *b = cpu_backend()
    cdef const mt_linalg_kernels *lk
    _installs += 1
    if _installs > 1:
        return
    _saved_ew = b.elementwise
    _saved_linalg = b.linalg
    lk = <const mt_linalg_kernels *>b.linalg
    mt_plan_set_real_kernels(b.elementwise, lk.gemm_batch if lk != NULL else NULL,
                             lk.gemm if lk != NULL else NULL)
    if b.elementwise != NULL:
        b.elementwise = mt_plan_capture_elementwise
    if lk != NULL:
        _wrapped_linalg = lk[0]
        if lk.gemm_batch != NULL:
            _wrapped_linalg.gemm_batch = mt_plan_capture_gemm_batch
        if lk.gemm != NULL:
            _wrapped_linalg.gemm = mt_plan_capture_gemm
        b.linalg = &_wrapped_linalg
    global _saved_nn, _saved_alloc
    _saved_nn = b.nn
    if b.nn != NULL:
        mt_plan_set_real_nn(<const mt_nn_kernels *>b.nn, <mt_nn_kernels *>_wrapped_nn)
        b.nn = <const void *>_wrapped_nn
    global _saved_reduce
    _saved_reduce = b.reduce
    if b.reduce != NULL:
        mt_plan_set_real_reduce(<const mt_reduce_kernels *>b.reduce,
                                <mt_reduce_kernels *>_wrapped_reduce)
        b.reduce = <const void *>_wrapped_reduce
    _saved_alloc = b.alloc
    mt_plan_set_real_alloc(b.alloc)
    b.alloc = mt_plan_capture_alloc


def capture_uninstall():
    global _installs
    cdef mt_backend *b = cpu_backend()
    if _installs == 0:
        return
    _installs -= 1
    if _installs == 0:
        b.elementwise = _saved_ew
        b.linalg = _saved_linalg
        b.nn = _saved_nn
        b.reduce = _saved_reduce
        b.alloc = _saved_alloc


def capture_begin():
    """Start recording the kernel calls this thread makes."""
    mt_plan_capture_begin()


cdef class Captured:
    """One recorded kernel call (a copy; its GEMM offsets owned here)."""
    cdef mt_plan_captured c

    def __dealloc__(self):
        free(self.c.offs)

    @property
    def kind(self):
        return self.c.kind

    def pointers(self):
        """The call's memory arguments, as addresses: elementwise: one per
        arg (output first), None for a host scalar; GEMM: (a, b, c)."""
        cdef int a
        if self.c.kind == MT_STEP_GEMM:
            return [<uintptr_t>self.c.a, <uintptr_t>self.c.b, <uintptr_t>self.c.c]
        if self.c.kind == MT_STEP_NN:
            return [None if self.c.nn.p[a].off == 0 else <uintptr_t>self.c.nn.p[a].off
                    for a in range(self.c.nn.np)]
        if self.c.kind == MT_STEP_REDUCE:
            return [<uintptr_t>self.c.red.inp.off, <uintptr_t>self.c.red.out.off]
        return [None if a > 0 and self.c.ew.scalar_mask & (1u << (a - 1)) else
                <uintptr_t>self.c.ew.args[a] for a in range(self.c.ew.nargs)]

    def roles(self):
        """(index of the output pointer, index of the workspace or -1)."""
        if self.c.kind == MT_STEP_GEMM:
            return 2, -1
        if self.c.kind == MT_STEP_NN:
            return NN_ROLES[self.c.nn.which]
        if self.c.kind == MT_STEP_REDUCE:
            return 1, -1
        return 0, -1

    def extents(self):
        """Per pointer, the byte range [lo, hi) the call may touch relative to
        it (from the geometry), so a plan can check it stays in its buffer."""
        cdef int a, d
        cdef int64_t lo, hi, s, isz
        cdef list out = []
        cdef const mt_reduce_geom *g
        if self.c.kind == MT_STEP_REDUCE:
            g = &self.c.red.g
            return [_span(g.nkeep, g.kshape, g.kin, g.nred, g.rshape, g.rin),
                    _span(g.nkeep, g.kshape, g.kout, 0, NULL, NULL)]
        if self.c.kind != MT_STEP_EW:
            return None
        for a in range(self.c.ew.nargs):
            lo = hi = 0
            for d in range(self.c.ew.ndim):
                s = self.c.ew.strides[a][d] * (self.c.ew.shape[d] - 1)
                if s < 0:
                    lo += s
                else:
                    hi += s
            out.append((lo, hi))
        return out

    def ew_info(self):
        """An elementwise call's (kind, op, dtype, nargs, shape, byte strides
        per arg), None for the other kinds: what a plan pass needs to
        recognise one (e.g. a float32 ReLU6 over a whole buffer)."""
        cdef int a, d
        if self.c.kind != MT_STEP_EW:
            return None
        shape = tuple(self.c.ew.shape[d] for d in range(self.c.ew.ndim))
        strides = tuple(tuple(self.c.ew.strides[a][d] for d in range(self.c.ew.ndim))
                        for a in range(self.c.ew.nargs))
        return self.c.ew.kind, self.c.ew.op, self.c.ew.dtype, self.c.ew.nargs, shape, strides

    def describe(self):
        if self.c.kind == MT_STEP_GEMM:
            return (f"gemm dtype={self.c.dtype} M={self.c.shape.M} N={self.c.shape.N} "
                    f"K={self.c.shape.K} batch={self.c.batch}")
        if self.c.kind == MT_STEP_NN:
            return NN_NAMES.get(self.c.nn.which, f"nn kernel {self.c.nn.which}")
        if self.c.kind == MT_STEP_REDUCE:
            return f"reduce kept={self.c.red.g.nkeep} reduced={self.c.red.g.nred}"
        return f"elementwise kind={self.c.ew.kind} op={self.c.ew.op} dtype={self.c.ew.dtype}"


cdef tuple _span(int n1, const int64_t *shape1, const int64_t *st1, int n2,
                 const int64_t *shape2, const int64_t *st2):
    """The byte range [lo, hi] of element starts over two (shape, byte
    strides) lists, relative to the base address."""
    cdef int64_t lo = 0, hi = 0, s
    cdef int d
    for d in range(n1):
        s = st1[d] * (shape1[d] - 1)
        if s < 0:
            lo += s
        else:
            hi += s
    for d in range(n2):
        s = st2[d] * (shape2[d] - 1)
        if s < 0:
            lo += s
        else:
            hi += s
    return lo, hi


def take_allocs():
    """[(address, nbytes)] of the storages allocated through the backend
    since :func:`capture_begin` (call before :func:`take_capture`)."""
    cdef uintptr_t p
    cdef int64_t nb
    cdef int i
    res = []
    for i in range(mt_plan_capture_allocs()):
        mt_plan_capture_alloc_get(i, &p, &nb)
        res.append((p, nb))
    return res


def take_capture():
    """The calls recorded since :func:`capture_begin` (a list of
    :class:`Captured`), or None when one could not be recorded; ends the
    recording."""
    cdef int n = mt_plan_capture_count(), i
    cdef Captured c
    cdef const mt_plan_captured *src
    if n < 0:
        mt_plan_capture_end()
        return None
    out = []
    try:
        for i in range(n):
            src = mt_plan_capture_get(i)
            c = Captured.__new__(Captured)
            c.c = src[0]
            c.c.offs = NULL
            if src.kind == MT_STEP_GEMM:
                c.c.offs = <int64_t *>malloc(sizeof(int64_t) * 3 * max(src.batch, 1))
                if c.c.offs == NULL:
                    raise MemoryError()
                memcpy(c.c.offs, src.offs, sizeof(int64_t) * 3 * src.batch)
            out.append(c)
    finally:
        mt_plan_capture_end()
    return out


# ------------------------------------------------------------------ tensors

def tensor_info(Tensor t):
    """(data address, storage id, storage start, storage nbytes, storage uid,
    dtype code, device id, strides in elements) of a tensor."""
    return (<uintptr_t>t._data, <uintptr_t>t._st, <uintptr_t>t._st.ptr, t._st.nbytes, t._st.uid,
            t._dtype, t._device, tuple([t._strides[i] for i in range(t._ndim)]))


cdef class VersionWatch:
    """The storage versions (counts of the in-place writes mgtrace made) of
    some tensors at one moment, to tell cheaply whether any was written
    since: a plan's module parameters and buffers, read on every call
    (a loop in C: 0.07-0.11 us for the optimized ResNet-18, MiniLM and
    MobileNetV2)."""
    cdef list tensors
    cdef uint64_t *versions
    cdef Py_ssize_t n

    def __cinit__(self, tensors):
        cdef Py_ssize_t i
        self.tensors = [t for t in tensors]
        for t in self.tensors:
            if not isinstance(t, Tensor):
                raise TypeError(f"VersionWatch takes Tensors, not {type(t).__name__}")
        self.n = len(self.tensors)
        self.versions = <uint64_t *>malloc(sizeof(uint64_t) * max(self.n, 1))
        if self.versions == NULL:
            raise MemoryError()
        for i in range(self.n):
            self.versions[i] = (<Tensor>self.tensors[i])._st.version

    def __dealloc__(self):
        free(self.versions)

    def changed(self):
        """Whether any tensor's storage was written since the watch was made."""
        cdef Py_ssize_t i
        for i in range(self.n):
            if (<Tensor>self.tensors[i])._st.version != self.versions[i]:
                return True
        return False


def next_uid():
    """A uid no storage made so far has (storages made later get larger ones)."""
    cdef int64_t one = 1
    return empty(1, &one, 2, 0)._st.uid


cdef Tensor _make_view(mt_storage *st, char *data, int dtype, int device, tuple shape, tuple strides):
    cdef Tensor t = Tensor.__new__(Tensor)
    cdef int i, nd = len(shape)
    t._st = st
    st.refcount += 1
    t._data = data
    t._ndim = nd
    t._dtype = dtype
    t._device = device
    for i in range(nd):
        t._shape[i] = shape[i]
        t._strides[i] = strides[i]
    return t


# ------------------------------------------------------------------ runs

cdef class Run:
    """The addresses of one call of a plan: bases[buf], and the tensor whose
    storage keeps each buffer alive while the run's views exist."""
    cdef char **bases
    cdef list owners
    cdef int nbuf
    cdef int device
    cdef object step_fn
    cdef object error
    cdef public list step_ns     # per step, its wall time in ns (a timed run), else None

    def __dealloc__(self):
        free(self.bases)

    def view(self, int buf, int64_t off, int dtype, tuple shape, tuple strides):
        """A Tensor over buffer ``buf`` at byte offset ``off``."""
        cdef Tensor o = <Tensor>self.owners[buf]
        if o is None:
            raise RuntimeError(f"plan buffer {buf} is not bound in this run")
        return _make_view(o._st, self.bases[buf] + off, dtype, self.device, shape, strides)

    def bind(self, int buf, Tensor t):
        """Make ``t``'s storage buffer ``buf`` (a Python step's result)."""
        self.owners[buf] = t
        self.bases[buf] = t._st.ptr


cdef int _callback(void *ctx, int index) noexcept nogil:
    with gil:
        r = <Run>ctx
        try:
            r.step_fn(r, index)
            return 0
        except BaseException as e:
            r.error = e
            return -1


cdef class Executor:
    """Steps and buffers of one plan (see the module docstring)."""
    cdef mt_plan_step *steps
    cdef int64_t n, cap
    cdef int nbuf
    cdef int device
    cdef int *kind
    cdef int64_t *where
    cdef int64_t *nbytes
    cdef list consts
    cdef list arenas           # free arenas (uint8 Tensors), one per concurrent run
    cdef int64_t arena_bytes

    def __cinit__(self, int nbuf, int device):
        self.nbuf = nbuf
        self.device = device
        self.kind = <int *>calloc(max(nbuf, 1), sizeof(int))
        self.where = <int64_t *>calloc(max(nbuf, 1), sizeof(int64_t))
        self.nbytes = <int64_t *>calloc(max(nbuf, 1), sizeof(int64_t))
        if self.kind == NULL or self.where == NULL or self.nbytes == NULL:
            raise MemoryError()
        self.consts = [None] * nbuf
        self.arenas = []
        self.arena_bytes = 0

    def __dealloc__(self):
        cdef int64_t i
        if self.steps != NULL:
            for i in range(self.n):
                if self.steps[i].kind == MT_STEP_GEMM:
                    free(self.steps[i].u.gemm.offs)
        free(self.steps)
        free(self.kind)
        free(self.where)
        free(self.nbytes)

    def set_arena(self, int64_t nbytes):
        self.arenas = []
        self.arena_bytes = nbytes

    def set_buffer(self, int buf, int kind, int64_t where=0, int64_t nbytes=0, Tensor const=None):
        """Buffer ``buf``: ARENA at offset ``where``, INPUT number ``where``,
        CONST ``const`` (held), OUTPUT of ``nbytes``, or DYNAMIC."""
        if not 0 <= buf < self.nbuf:
            raise IndexError(buf)
        self.kind[buf] = kind
        self.where[buf] = where
        self.nbytes[buf] = nbytes
        self.consts[buf] = const

    cdef mt_plan_step *_new_step(self) except NULL:
        cdef mt_plan_step *p
        if self.n == self.cap:
            self.cap = self.cap * 2 if self.cap else 16
            p = <mt_plan_step *>realloc(self.steps, sizeof(mt_plan_step) * self.cap)
            if p == NULL:
                raise MemoryError()
            self.steps = p
        p = &self.steps[self.n]
        memset(p, 0, sizeof(mt_plan_step))
        self.n += 1
        return p

    def add_captured(self, Captured c, list refs):
        """A kernel step from a recorded call; ``refs`` gives (buffer, byte
        offset) per pointer of :meth:`Captured.pointers` (None for scalars)."""
        cdef mt_plan_step *s = self._new_step()
        cdef int a
        if c.c.kind == MT_STEP_GEMM:
            s.kind = MT_STEP_GEMM
            s.u.gemm.dtype = c.c.dtype
            s.u.gemm.nt = c.c.nt
            s.u.gemm.shape = c.c.shape
            s.u.gemm.batch = c.c.batch
            s.u.gemm.kernel = c.c.gemm_kernel
            s.u.gemm.a.buf, s.u.gemm.a.off = refs[0]
            s.u.gemm.b.buf, s.u.gemm.b.off = refs[1]
            s.u.gemm.c.buf, s.u.gemm.c.off = refs[2]
            s.u.gemm.offs = <int64_t *>malloc(sizeof(int64_t) * 3 * max(c.c.batch, 1))
            if s.u.gemm.offs == NULL:
                self.n -= 1
                raise MemoryError()
            memcpy(s.u.gemm.offs, c.c.offs, sizeof(int64_t) * 3 * c.c.batch)
            return
        if c.c.kind == MT_STEP_REDUCE:
            s.kind = MT_STEP_REDUCE
            s.u.red = c.c.red
            s.u.red.inp.buf, s.u.red.inp.off = refs[0]
            s.u.red.out.buf, s.u.red.out.off = refs[1]
            return
        if c.c.kind == MT_STEP_NN:
            s.kind = MT_STEP_NN
            s.u.nn = c.c.nn
            for a in range(MT_PLAN_NN_PTRS):
                s.u.nn.p[a].buf = -1
                s.u.nn.p[a].off = 0
            for a in range(c.c.nn.np):
                if refs[a] is not None:
                    s.u.nn.p[a].buf, s.u.nn.p[a].off = refs[a]
            return
        s.kind = MT_STEP_EW
        s.u.ew.call = c.c.ew
        s.u.ew.kernel = c.c.ew_kernel
        for a in range(4):
            s.u.ew.scalar[a] = c.c.ew_scalar[a]
            s.u.ew.ref[a].buf = -1
            s.u.ew.call.args[a] = NULL
        for a in range(c.c.ew.nargs):
            if refs[a] is not None:
                s.u.ew.ref[a].buf, s.u.ew.ref[a].off = refs[a]

    def add_gather(self, tuple idx, tuple src, tuple out, int isz, bint is_signed, int64_t n,
                   int64_t rows, int64_t row_bytes, int64_t src_stride):
        """A gather step (plan.h's mt_plan_gather: an embedding lookup):
        ``out`` row i (``row_bytes``, rows contiguous) = ``src`` row
        idx[i], ``src_stride`` bytes between source rows, ``n`` contiguous
        integer indices of ``isz`` bytes; idx, src, out are (buffer, byte
        offset). An index outside -rows..rows-1 makes :meth:`run` return
        None (the caller runs the module, which raises)."""
        cdef mt_plan_step *s
        if isz not in (1, 2, 4, 8):
            raise ValueError(f"add_gather: index itemsize {isz}")
        s = self._new_step()
        s.kind = MT_STEP_GATHER
        s.u.gather.idx.buf, s.u.gather.idx.off = idx
        s.u.gather.src.buf, s.u.gather.src.off = src
        s.u.gather.out.buf, s.u.gather.out.off = out
        s.u.gather.isz = isz
        s.u.gather.is_signed = is_signed
        s.u.gather.n = n
        s.u.gather.rows = rows
        s.u.gather.row_bytes = row_bytes
        s.u.gather.src_stride = src_stride

    def add_quant(self, int which, int nt, list refs, tuple ints, tuple floats):
        """An int8 kernel step (plan.h's mt_plan_quant): quant table call
        ``which`` (MT_Q_*) of the CPU backend with ``nt`` threads, pointer
        arguments ``refs`` ((buffer, byte offset) or None for NULL), integer
        and float arguments in plan.c's run_quant order (as
        mgtrace._core.qint8 records them)."""
        cdef mt_plan_step *s
        cdef int j
        if not 0 <= which < MT_Q_NKERNELS or len(refs) > MT_PLAN_Q_PTRS or \
                len(ints) > MT_PLAN_Q_INTS or len(floats) > MT_PLAN_Q_FLOATS:
            raise ValueError(f"add_quant: call {which} with {len(refs)} pointers, {len(ints)} "
                             f"integers, {len(floats)} floats")
        if cpu_backend().quant == NULL:
            raise RuntimeError("add_quant: the CPU backend has no int8 table (import "
                               "mgtrace._core.qint8 first)")
        s = self._new_step()
        s.kind = MT_STEP_QUANT
        s.u.quant.which = which
        s.u.quant.nt = nt
        s.u.quant.k = cpu_backend().quant
        for j in range(MT_PLAN_Q_PTRS):
            s.u.quant.p[j].buf = -1
        for j, r in enumerate(refs):
            if r is not None:
                s.u.quant.p[j].buf, s.u.quant.p[j].off = r
        for j, v in enumerate(ints):
            s.u.quant.i[j] = v
        for j, v in enumerate(floats):
            s.u.quant.f[j] = v

    def add_callback(self, int index):
        cdef mt_plan_step *s = self._new_step()
        s.kind = MT_STEP_CALLBACK
        s.index = index

    def counts(self):
        """(kernel steps, Python steps)."""
        cdef int64_t i, k = 0
        for i in range(self.n):
            if self.steps[i].kind != MT_STEP_CALLBACK:
                k += 1
        return k, self.n - k

    def step_threads(self):
        """Per step, the thread count its kernel is called with (recorded
        with the call), or None where the kernel picks its own when it runs
        (elementwise, gather, Python steps)."""
        cdef int64_t i
        cdef int kind
        out = []
        for i in range(self.n):
            kind = self.steps[i].kind
            if kind == MT_STEP_GEMM:
                out.append(self.steps[i].u.gemm.nt)
            elif kind == MT_STEP_NN:
                out.append(self.steps[i].u.nn.nt)
            elif kind == MT_STEP_REDUCE:
                out.append(self.steps[i].u.red.nt)
            elif kind == MT_STEP_QUANT:
                out.append(self.steps[i].u.quant.nt)
            else:
                out.append(None)
        return out

    def run(self, tuple inputs, object step_fn, bint timed=False):
        """Replays every step for ``inputs`` (checked by the caller's guard);
        returns the :class:`Run` (its buffers hold the outputs), or None when
        a kernel returned a positive code: conv2d's Winograd met a
        non-finite or huge value, which the graph reruns on a direct kernel,
        so the caller runs the module for this call. ``timed``: the Run's
        ``step_ns`` gets each step's wall time in nanoseconds."""
        cdef Run r = Run.__new__(Run)
        cdef int b, rc = 0
        cdef int64_t failed = -1, n
        cdef Tensor arena = None
        cdef Tensor t
        cdef int64_t *ns = NULL
        r.nbuf = self.nbuf
        r.device = self.device
        r.step_fn = step_fn
        r.owners = [None] * self.nbuf
        r.bases = <char **>calloc(max(self.nbuf, 1), sizeof(char *))
        if r.bases == NULL:
            raise MemoryError()
        if self.arenas:
            arena = self.arenas.pop()
        else:
            # one byte where every intermediate is empty: their views still
            # point into an arena (a None one was dereferenced: a segfault)
            n = max(self.arena_bytes, 1)
            arena = empty(1, &n, 2, self.device)
        try:
            for b in range(self.nbuf):
                k = self.kind[b]
                if k == BUF_ARENA:
                    r.owners[b] = arena
                    r.bases[b] = arena._st.ptr + self.where[b]
                elif k == BUF_INPUT:
                    t = <Tensor>inputs[self.where[b]]
                    r.owners[b] = t
                    r.bases[b] = t._data
                elif k == BUF_CONST:
                    t = <Tensor>self.consts[b]
                    r.owners[b] = t
                    r.bases[b] = t._st.ptr
                elif k == BUF_OUTPUT:
                    n = self.nbytes[b]
                    t = empty(1, &n, 2, self.device)
                    r.owners[b] = t
                    r.bases[b] = t._st.ptr
            if timed:
                ns = <int64_t *>calloc(max(self.n, 1), sizeof(int64_t))
                if ns == NULL:
                    raise MemoryError()
                with nogil:
                    rc = mt_plan_run_timed(self.steps, self.n, r.bases, _callback, <void *>r,
                                           &failed, ns)
                r.step_ns = [ns[b] for b in range(self.n)]
            else:
                with nogil:
                    rc = mt_plan_run(self.steps, self.n, r.bases, _callback, <void *>r, &failed)
        finally:
            free(ns)
            if arena is not None:
                self.arenas.append(arena)
        if rc != 0:
            if r.error is not None:
                err, r.error = r.error, None
                raise err
            if rc > 0:
                return None     # a kernel asked for the call to be made another way
            raise RuntimeError(f"plan step {failed}: kernel failed with code {rc}")
        return r
