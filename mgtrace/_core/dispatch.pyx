# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""apply(): the one path every core op takes.

For an elementwise op: classify operands (Tensor, Python scalar, or other
array-like, which becomes a tensor on the operands' device), check devices,
promote (MegEngine rule), pick the compute dtype by the op's rule, cast,
broadcast (NumPy rule), allocate the output, coalesce dimensions and run the
kernel from the (op, device, dtype) table with the GIL released.

The module-tracing switch lives here too: while it is on, every op is handed
to the trace hook as ``hook.on_apply(OpDef, *inputs)`` instead of running;
the hook runs it with :func:`apply` (tracing is off inside the hook) and
returns the outputs. This is how a tracer sees ops not reached through a
patched ``functional`` function (MegEngine's module-trace transformation).
Elementwise ops check the switch here; every other op gets the check from
:func:`core_op`, the decorator that registers it (hooks are installed with
:func:`mgtrace._core.trace_hooks.installed`).
"""
from libc.stdint cimport int64_t, int8_t, int16_t, int32_t, uint8_t, uint16_t
from libc.string cimport memcpy
from cpython.object cimport PyObject

import numpy as np

from mgtrace._core.kernels cimport (
    MT_MAX_NDIM, mt_loop_fn, mt_nd_loop, mt_elementwise_init, mt_unary_loops, mt_binary_loops,
    mt_ternary_loops, mt_cast_loops, mt_fill_loops, mt_unary_names, mt_binary_names,
    mt_ternary_names, mt_unary_rules, mt_binary_rules, mt_ternary_rules, MT_NUNARY, MT_NBINARY,
    MT_NTERNARY, MT_RULE_SAME, MT_RULE_FLOAT, MT_RULE_BOOL, MT_RULE_INT, mt_f2h, mt_f2bf,
    mt_get_num_threads, mt_set_num_threads, mt_run_threads, mt_pin_run_threads, mt_set_adaptive_threads,
    mt_get_adaptive_threads, mt_ew_call, mt_backend, MT_BK_ENOKERNEL, MT_EW_UNARY,
    MT_EW_BINARY, MT_EW_TERNARY, MT_EW_CAST, MT_EW_FILL, mt_cpu_elementwise, mt_cpu_has_elementwise,
    mt_complex_init, mt_complex_make_loop, mt_complex_part_loop, MT_CPART_REAL, MT_CPART_IMAG,
    MT_CPART_ABS, MT_CPART_ANGLE)
from mgtrace._core.tensor cimport (
    Tensor, empty, view_of, numel, is_contiguous, install_dispatch, to_tensor, shape_tuple,
    parse_shape, trace_hook, set_trace_hook, traced_here, PyThread_get_thread_ident, backend_of, backend_error, cpu_backend, on_host)
from mgtrace._core.tensor import missing_kernel as _missing_kernel
from mgtrace._core.dtype cimport (
    ITEMSIZE, CATEGORY, PROMOTE, NP_DTYPES, dtype_code, scalar_code, float_result,
    check_scalar_fits, promote_operands)
from mgtrace._core.device cimport Device, DEVICES, default_device_id, device_id
from mgtrace._core.dtype import NAMES as DTYPE_NAMES
from mgtrace._core import op_table
import importlib
import inspect

cdef extern from "Python.h":
    ctypedef struct PyMethodDef:
        const char *ml_name
        void *ml_meth
        int ml_flags
        const char *ml_doc
    int METH_FASTCALL, METH_KEYWORDS
    object PyCFunction_NewEx(PyMethodDef *ml, object self, object module)
    object PyObject_Vectorcall(object callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
_tensor_mod = importlib.import_module("mgtrace._core.tensor")

mt_elementwise_init()
mt_complex_init()
cpu_backend().elementwise = mt_cpu_elementwise     # the CPU backend's elementwise member
cpu_backend().has_elementwise = mt_cpu_has_elementwise     # and what it has, per dtype

# ------------------------------------------------------------------ op table

UNARY = {mt_unary_names[i].decode(): i for i in range(MT_NUNARY)}
BINARY = {mt_binary_names[i].decode(): i for i in range(MT_NBINARY)}
TERNARY = {mt_ternary_names[i].decode(): i for i in range(MT_NTERNARY)}
_RULE_NAMES = ("same", "float", "bool", "int")
RULES = {**{n: _RULE_NAMES[mt_unary_rules[i]] for n, i in UNARY.items()},
         **{n: _RULE_NAMES[mt_binary_rules[i]] for n, i in BINARY.items()},
         **{n: _RULE_NAMES[mt_ternary_rules[i]] for n, i in TERNARY.items()}}

cdef int U_ABS = UNARY["abs"]
cdef int U_ISNAN = UNARY["isnan"], U_ISINF = UNARY["isinf"], U_ISFINITE = UNARY["isfinite"]
cdef int T_WHERE = TERNARY["where"]

# Ops that bool operands refuse, as NumPy does: their arithmetic meaning would
# leave bool (True - True is not a bool), so a missing kernel is not the story;
# the fix is the logical op that a user of bools means.
_BOOL_REFUSED = {
    ("binary", BINARY["sub"]): "bool - bool (sub) is not supported: use ^ or "
                               "mgtrace.functional.logical_xor for bools, or cast to an integer dtype first",
    ("unary", UNARY["neg"]): "-bool (neg) is not supported: use ~ or "
                             "mgtrace.functional.logical_not for bools, or cast to an integer dtype first",
}


cdef inline void check_bool_op(str kind, int op, int code) except *:
    """Raises TypeError for an op that bool operands refuse (see _BOOL_REFUSED)."""
    if code == 0:
        msg = _BOOL_REFUSED.get((kind, op))
        if msg is not None:
            raise TypeError(msg)

# ------------------------------------------------------------------ tracing

# the module-tracing switch: the id of the thread tracing, 0 when none (one
# check per op when off; another thread's ops run eagerly, see traced_here)
cdef unsigned long _tracing = 0
_IMPLS = {}   # op name -> callable(*inputs, **params)
_ARITY = {}   # op name -> number of inputs, where fixed
_SEQUENCE = set()   # ops whose inputs are one sequence argument (concat, stack)


cdef class OpDef:
    """One op application as the tracer sees it: a stable name and params.

    ``apply(OpDef("add"), x, y)`` runs it. Names are those of the op table
    (:mod:`mgtrace._core.op_table`, e.g. ``"add"``, ``"sum"``, ``"conv2d"``).
    """
    cdef readonly str name
    cdef readonly dict params

    def __init__(self, str name, dict params=None):
        self.name = name
        self.params = params or {}

    def __repr__(self):
        ps = ", ".join(f"{k}={v!r}" for k, v in self.params.items())
        return f"OpDef({self.name}{', ' if ps else ''}{ps})"

    def __eq__(self, other):
        return isinstance(other, OpDef) and self.name == (<OpDef>other).name and self.params == (<OpDef>other).params

    def __hash__(self):
        return hash(self.name)


def register_op(str name, impl, n_inputs=None):
    """Make ``impl(*inputs, **params)`` the implementation of op ``name`` for
    apply(); ``n_inputs`` (default: the op table's arity) is checked on
    every apply()."""
    _IMPLS[name] = impl
    row = op_table.OPS.get(name)
    if n_inputs is None and row is not None:
        n_inputs = row.arity
        if row.arity is None:
            _SEQUENCE.add(name)
    if n_inputs is not None:
        _ARITY[name] = n_inputs


def apply(op, *inputs):
    """Run ``op`` (an OpDef) on ``inputs``; goes to the trace hook while tracing.

    Raises:
        NotImplementedError: no op of that name is registered.
    """
    if not isinstance(op, OpDef):
        raise TypeError(f"apply() takes an OpDef, not {type(op).__name__}")
    for x in inputs:            # apply() runs a core op's implementation: the same check
        if isinstance(x, Tensor) and (<Tensor>x)._qdtype is not None:
            c = _CORE_OPS.get(op.name)
            if c is not None and (<CoreOp>c)._qmode:
                _quantized_core_op(<CoreOp>c, dict(zip(c.op.inputs, inputs), **op.params))
            break
    if traced_here(_tracing):
        return traced(op.name, inputs, op.params)
    impl = _IMPLS.get(op.name)
    if impl is None:
        raise NotImplementedError(f"no op named {op.name!r}")
    n = _ARITY.get(op.name)
    if n is not None and len(inputs) != n:
        raise TypeError(f"op {op.name!r} takes {n} input{'s' if n > 1 else ''}, got {len(inputs)}")
    if op.name in _SEQUENCE:                # the tensors are one argument: concat([x, y])
        return impl(list(inputs), **op.params)
    return impl(*inputs, **op.params)


cdef object traced(str name, tuple inputs, dict params):
    """Hands one op to the trace hook with tracing switched off meanwhile."""
    global _tracing
    cdef unsigned long owner = _tracing
    _tracing = 0
    try:
        return trace_hook().on_apply(OpDef(name, params), *inputs)
    finally:
        _tracing = owner


cdef object traced_args(str name, tuple args):
    """:func:`traced` for ``args`` in the op table's order: its inputs, then
    its params (how Tensor's methods hand over their ops)."""
    op = op_table.OPS[name]
    n = len(op.inputs)
    return traced(name, args[:n], {p: _freeze(v) for p, v in zip(op.params, args[n:])})


cdef object traced_into(str name, tuple inputs, object out):
    # an in-place op (x += y) reaches the hook with its destination as the
    # ``out`` param, so the tracer can rebind x to the result; the hook runs
    # the op with ``out`` and so does the write itself
    if out is None:
        return traced(name, inputs, {})
    return traced(name, inputs, {"out": out})


def _install_hook(hook, tracing):
    """Make ``hook`` the trace hook and set the switch (for
    :func:`mgtrace._core.trace_hooks.installed`, the one writer).
    ``tracing``: False (off), True (on for the calling thread) or a thread
    id as :func:`_tracing_thread` returned it (putting a saved state back)."""
    global _tracing
    if tracing and hook is None:
        raise RuntimeError("module tracing needs a trace hook (see mgtrace._core.trace_hooks)")
    set_trace_hook(hook)
    if tracing is True:
        _tracing = PyThread_get_thread_ident()
    else:
        _tracing = <unsigned long>tracing if tracing else 0


def _tracing_thread():
    """The id of the thread whose ops are traced, 0 when none."""
    return _tracing


def is_tracing_module():
    """Whether the calling thread's core ops go to the trace hook."""
    return traced_here(_tracing)


cpdef bint tracing_active():
    return traced_here(_tracing)


def _freeze(v):
    """Lists to tuples (op params must compare and hash for the tracer)."""
    if isinstance(v, (list, tuple)):
        return tuple([_freeze(e) for e in v])
    return v


cdef class CoreOp:
    """One core op's function as :func:`core_op` made it: its op table row
    and its implementation. Called (through the builtin function that
    :func:`core_op` returns) it checks the tracing switch once and, when
    off, calls the implementation with the same arguments (vectorcall, no
    repacking); when on, binds the arguments by the row's inputs and params
    and hands the op to the trace hook."""
    cdef readonly object op
    cdef readonly object impl
    cdef object _sig
    cdef tuple _names           # the implementation's parameters, in order
    cdef dict _defaults
    cdef bytes _name
    cdef bytes _doc
    cdef PyMethodDef _def
    cdef int _qmode             # quantized operands: 0 pass, 1 refuse, 2 setitem's rule

    cdef dict _bind(self, tuple args, dict kwargs):
        """The arguments by parameter name, defaults filled in (what
        inspect's bind gives, without its cost on every traced call)."""
        cdef dict a
        if len(args) <= len(self._names):
            a = dict(zip(self._names, args))
            for k, v in kwargs.items():
                if k in a or k not in self._names:
                    break
                a[k] = v
            else:
                for k in self._names:
                    if k not in a:
                        if k not in self._defaults:
                            break
                        a[k] = self._defaults[k]
                else:
                    return a
        if self._sig is None:
            self._sig = inspect.signature(self.impl)
        bound = self._sig.bind(*args, **kwargs)       # raises the TypeError Python would
        bound.apply_defaults()
        return dict(bound.arguments)

    def trace(self, tuple args, dict kwargs):
        a = self._bind(args, kwargs)
        op = self.op
        if op.arity is None:               # a sequence of tensors (concat, stack)
            seq = a[op.inputs[0][1:]]
            if not isinstance(seq, (list, tuple)):
                return self.impl(*args, **kwargs)     # raises the implementation's TypeError
            inputs = tuple(seq)
        else:
            inputs = tuple([a[n] for n in op.inputs])
        return traced(op.name, inputs, {p: _freeze(a[p]) for p in op.params})


cdef object _core_op_call(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                          PyObject *kwnames):
    cdef CoreOp c = <CoreOp>self
    cdef Py_ssize_t i, n
    if c._qmode:                # a quantized tensor among the arguments? (a slot read each)
        n = nargs + (len(<tuple><object>kwnames) if kwnames != NULL else 0)
        for i in range(n):
            if isinstance(<object>args[i], Tensor) and (<Tensor><object>args[i])._qdtype is not None:
                a = dict(zip(c._names, [<object>args[i] for i in range(nargs)]))
                if kwnames != NULL:
                    a.update(zip(<tuple><object>kwnames, [<object>args[i] for i in range(nargs, n)]))
                _quantized_core_op(c, a)
                break
    if not traced_here(_tracing):
        return PyObject_Vectorcall(c.impl, args, <size_t>nargs, kwnames)
    kwargs = {}
    if kwnames != NULL:
        names = <tuple><object>kwnames
        for i in range(len(names)):
            kwargs[names[i]] = <object>args[nargs + i]
    return c.trace(tuple([<object>args[i] for i in range(nargs)]), kwargs)


# core ops that move a quantized tensor's integers without computing on them
# (their callers keep its quantized dtype); every other core op refuses one
_QUANTIZED_PASS = frozenset(["getitem", "concat", "split"])
_CORE_OPS = {}      # name -> CoreOp, for apply()'s check


cdef int _quantized_core_op(CoreOp c, dict a) except -1:
    """A quantized tensor reached core op ``c``: QuantizationError naming the
    op and its tensor operands' dtypes (as elementwise ops do), except
    setitem's value of the target's own quantized dtype, written as is."""
    name = c._name.decode()
    if c._qmode == 2:
        x, value = a.get("x"), a.get("value")
        if isinstance(x, Tensor) and isinstance(value, Tensor):
            from mgtrace.quantization.qdtype import same_dtype
            if (<Tensor>x)._qdtype is not None and same_dtype(x.dtype, value.dtype):
                return 0
        from mgtrace.quantization.utils import QuantizationError
        from mgtrace._core.dtype import qdtype_str
        vname = qdtype_str(value.dtype) if isinstance(value, Tensor) else type(value).__name__
        raise QuantizationError(
            f"setitem: cannot write {vname} into {qdtype_str(x.dtype)}: a quantized tensor "
            "takes a value of its own quantized dtype only (quantize it first: "
            "value.astype(x.dtype)); a float tensor takes no quantized value (dequantize it "
            "first: F.dequantize(value))")
    refuse_quantized(name, tuple([t for t in a.values() if isinstance(t, Tensor)]))


def core_op(fn):
    """Decorator: ``fn`` is the implementation of the op table row of its
    name. Registers it for :func:`apply` and :class:`Tensor` methods and
    returns it behind the trace hook (a builtin function with fn's name,
    docstring and signature).

    Raises:
        KeyError: the op table has no row of that name (add one first).
    """
    name = fn.__name__
    if name not in op_table.OPS:
        raise KeyError(f"core op {name!r} is not declared in mgtrace/_core/op_table.py")
    cdef CoreOp c = CoreOp.__new__(CoreOp)
    c.op = op_table.OPS[name]
    c.impl = fn
    code = fn.__code__            # plain positional parameters (inspect.signature costs
    if code.co_flags & 0x0C or code.co_kwonlyargcount:     # 40 us an op at import)
        raise TypeError(f"core op {name}: *args, **kwargs and keyword-only parameters are "
                        "not supported")
    c._names = tuple(code.co_varnames[:code.co_argcount])
    c._defaults = dict(zip(c._names[len(c._names) - len(fn.__defaults__ or ()):],
                           fn.__defaults__ or ()))
    text = ", ".join([n + (f"={c._defaults[n]!r}" if n in c._defaults else "") for n in c._names])
    c._name = name.encode()
    # "name(sig)\n--\n\n" makes inspect.signature() work on the builtin
    c._doc = f"{name}({text})\n--\n\n{fn.__doc__ or ''}".encode()
    c._qmode = 0 if name in _QUANTIZED_PASS else 2 if name == "setitem" else 1
    c._def.ml_name = c._name
    c._def.ml_meth = <void *>_core_op_call
    c._def.ml_flags = METH_FASTCALL | METH_KEYWORDS
    c._def.ml_doc = c._doc
    f = PyCFunction_NewEx(&c._def, c, fn.__module__)
    register_op(name, fn)
    _CORE_OPS[name] = c
    _tensor_mod._install_ops(**{name: f})
    return f

# ------------------------------------------------------------------ operands

cdef void operand_of(Tensor t, Operand *o) noexcept:
    o.data = t._data
    o.ndim = t._ndim
    o.shape = t._shape
    o.strides = t._strides
    o.itemsize = ITEMSIZE[t._dtype]


cdef int broadcast_shape(int n, Operand *ops, int64_t *out) except -1:
    """NumPy broadcasting of the operands' shapes into ``out``; returns ndim."""
    cdef int nd = 0, i, d, k
    cdef int64_t s, o
    for i in range(n):
        if ops[i].ndim > nd:
            nd = ops[i].ndim
    for d in range(nd):
        out[d] = 1
    for i in range(n):
        for k in range(ops[i].ndim):
            d = nd - ops[i].ndim + k
            s = ops[i].shape[k]
            o = out[d]
            if o == 1:
                out[d] = s
            elif s != 1 and s != o:
                raise ValueError("operands could not be broadcast together with shapes " + " ".join(
                    str(tuple([ops[j].shape[q] for q in range(ops[j].ndim)])) for j in range(n)))
    return nd


cdef int _geometry(Tensor out, int nin, Operand *ins, mt_ew_call *c) except -1:
    """The coalesced index space of an elementwise call: out's shape with the
    inputs broadcast to it, size-1 dims dropped, and a dim merged into the
    previous kept dim when every operand steps through both as one run."""
    cdef int nargs = nin + 1, nd = out._ndim, a, d, k, cd = 0
    cdef int64_t strides[4][16]
    cdef int64_t isz = ITEMSIZE[out._dtype]
    c.nargs = nargs
    c.scalar_mask = 0
    c.args[0] = out._data
    for d in range(nd):
        strides[0][d] = out._strides[d] * isz
    for a in range(nin):
        c.args[a + 1] = ins[a].data
        if ins[a].strides == NULL:
            c.scalar_mask |= 1u << a
        for d in range(nd):
            k = d - (nd - ins[a].ndim)
            if k < 0 or ins[a].strides == NULL or ins[a].shape[k] == 1:
                strides[a + 1][d] = 0
            else:
                strides[a + 1][d] = ins[a].strides[k] * ins[a].itemsize
    for d in range(nd):
        if out._shape[d] == 1:
            continue
        if cd > 0:
            for a in range(nargs):
                if c.strides[a][cd - 1] != strides[a][d] * out._shape[d]:
                    break
            else:
                c.shape[cd - 1] *= out._shape[d]
                for a in range(nargs):
                    c.strides[a][cd - 1] = strides[a][d]
                continue
        c.shape[cd] = out._shape[d]
        for a in range(nargs):
            c.strides[a][cd] = strides[a][d]
        cd += 1
    if cd == 0:
        c.shape[0] = 1
        for a in range(nargs):
            c.strides[a][0] = 0
        cd = 1
    c.ndim = cd
    return 0


cdef int run_loop(mt_loop_fn fn, Tensor out, int nin, Operand *ins, const void *aux, int cost) except -1:
    """Runs the CPU loop fn over out's shape, inputs broadcast to it."""
    cdef mt_ew_call c
    _geometry(out, nin, ins, &c)
    with nogil:
        mt_nd_loop(fn, c.nargs, c.args, c.ndim, c.shape, &c.strides[0][0], aux, cost)
    return 0


cdef int run_elementwise(int kind, int op, int dt, int dt2, Tensor out, int nin,
                         Operand *ins, const void *aux, int cost) except -1:
    """The elementwise kernel (kind, op, dtype) of out's device backend over
    out's shape, inputs broadcast to it (the CPU's: mt_cpu_elementwise, the
    mt_ops.h loop run by mt_nd_loop; ``cost`` is its threading hint).

    Raises NoKernelError "no kernel for op X on device D with dtype T" when
    the backend has none; nothing is written then."""
    cdef mt_ew_call c
    cdef const mt_backend *b = backend_of(out._device)
    cdef int rc
    if kind == MT_EW_CAST and CATEGORY[dt] == 4 and CATEGORY[dt2] != 4:
        raise TypeError(f"cannot cast {DTYPE_NAMES[dt]} to {DTYPE_NAMES[dt2]}: it would drop the "
                        f"imaginary part; take F.real, F.imag or F.abs of it instead")
    _geometry(out, nin, ins, &c)
    c.kind, c.op, c.dtype, c.dtype2, c.aux, c.cost = kind, op, dt, dt2, aux, cost
    with nogil:
        rc = b.elementwise(&c) if b.elementwise != NULL else MT_BK_ENOKERNEL
    if rc == MT_BK_ENOKERNEL:
        raise missing_kernel(_ew_name(kind, op), out._device, dt)
    if rc != 0:
        raise backend_error(out._device, rc, _ew_name(kind, op))
    out._st.version += 1     # written (see check_writable)
    return 0


cdef str _ew_name(int kind, int op):
    if kind == MT_EW_UNARY:
        return mt_unary_names[op].decode()
    if kind == MT_EW_BINARY:
        return mt_binary_names[op].decode()
    if kind == MT_EW_TERNARY:
        return mt_ternary_names[op].decode()
    return "astype" if kind == MT_EW_CAST else "fill"


# ------------------------------------------------------------------ helpers

cdef str dev_name(int device):
    return str(DEVICES[device])


cdef int store_scalar(object v, int code, char *buf) except -1:
    """Writes Python scalar v into buf as dtype ``code`` (C conversion)."""
    cdef double d
    cdef int64_t i
    cdef double complex z
    if code == 0:
        (<uint8_t *>buf)[0] = 1 if v else 0
        return 0
    if CATEGORY[code] == 4:
        z = <double complex>complex(v)
        if code == 11:
            (<float *>buf)[0] = <float>z.real
            (<float *>buf)[1] = <float>z.imag
        else:
            (<double *>buf)[0] = z.real
            (<double *>buf)[1] = z.imag
        return 0
    if isinstance(v, complex):
        raise TypeError(f"cannot convert complex {v} to {DTYPE_NAMES[code]}")
    if CATEGORY[code] == 3:
        d = <double>v
        if code == 9:
            (<float *>buf)[0] = <float>d
        elif code == 10:
            (<double *>buf)[0] = d
        elif code == 7:
            (<uint16_t *>buf)[0] = mt_f2h(<float>d)
        else:
            (<uint16_t *>buf)[0] = mt_f2bf(<float>d)
        return 0
    if isinstance(v, float):
        if v != v or v in (float("inf"), float("-inf")):
            raise ValueError(f"cannot convert {v} to {DTYPE_NAMES[code]}")
        v = int(v)  # truncation toward zero, as a C cast
    check_scalar_fits(v, code)
    i = <int64_t>v
    if code == 1:
        (<int8_t *>buf)[0] = <int8_t>i
    elif code == 2:
        (<uint8_t *>buf)[0] = <uint8_t>i
    elif code == 3:
        (<int16_t *>buf)[0] = <int16_t>i
    elif code == 4:
        (<uint16_t *>buf)[0] = <uint16_t>i
    elif code == 5:
        (<int32_t *>buf)[0] = <int32_t>i
    else:
        (<int64_t *>buf)[0] = i
    return 0


cdef int scalar_operand(object v, int code, char *buf, Operand *o) except -1:
    """A Python scalar as an operand: its value in buf, broadcast with stride 0."""
    store_scalar(v, code, buf)
    o.data = buf
    o.ndim = 0
    o.shape = NULL
    o.strides = NULL
    return 0


cdef Tensor coerce(object x, int device):
    """Non-scalar, non-Tensor operand (ndarray, NumPy scalar, list) -> Tensor."""
    if isinstance(x, (np.ndarray, np.generic)):
        return to_tensor(x, None, device)
    if isinstance(x, (list, tuple)):
        return to_tensor(x, None, device)
    if x is None:
        raise TypeError("operand is None")
    if hasattr(x, "__dlpack__") or hasattr(x, "__array__"):
        return to_tensor(np.asarray(x), None, device)
    raise TypeError(f"unsupported operand type {type(x).__name__}")


cdef Tensor cast(Tensor t, int code):
    """A new contiguous tensor holding t converted to dtype ``code``."""
    cdef Tensor out = empty(t._ndim, t._shape, code, t._device)
    cdef Operand o
    operand_of(t, &o)
    run_elementwise(MT_EW_CAST, 0, t._dtype, code, out, 1, &o, NULL, 1)
    return out


cdef int check_writable(Tensor t) except -1:
    if t._readonly_view:
        raise ValueError("cannot write to a broadcast view: its elements alias each other "
                         "(as NumPy's broadcast_to); copy it with .copy() first")
    if t._st.readonly:
        raise ValueError("tensor is read-only (e.g. memory-mapped from an archive); "
                         "copy it with .copy() before writing")
    # every in-place write passes here: caches of derived values see it. The
    # version moves again once the write is done (run_elementwise, setitem's
    # put), so that a cache filled without the GIL while another thread
    # writes, which records the version it read before, never records the
    # one the finished write leaves (conv2d's packed weights)
    t._st.version += 1
    return 0


cdef bint overlaps(Tensor out, Tensor t) noexcept:
    """True when writing out could clobber t before it is read (same storage,
    not the identical view)."""
    cdef int i
    if t is None or out._st != t._st:
        return False
    if out._data != t._data or out._ndim != t._ndim:
        return True
    for i in range(t._ndim):
        if out._strides[i] != t._strides[i] and out._shape[i] != 1:
            return True
    return False


cdef bint has_shape(Tensor t, int nd, const int64_t *shape) noexcept:
    cdef int i
    if t._ndim != nd:
        return False
    for i in range(nd):
        if t._shape[i] != shape[i]:
            return False
    return True


cdef int check_same_kind(int res, Tensor out, str opname) except -1:
    if CATEGORY[res] > CATEGORY[out._dtype]:
        raise TypeError(f"{opname}: cannot store a {DTYPE_NAMES[res]} result in place into a "
                        f"{DTYPE_NAMES[out._dtype]} tensor (NumPy's same-kind casting rule)")
    return 0


cdef int copy_into(Tensor dst, Tensor src) except -1:
    """dst[...] = src with broadcasting and a cast to dst's dtype."""
    cdef Operand o
    cdef int64_t bshape[16]
    check_writable(dst)
    if dst._device != src._device and not (on_host(dst._device) and on_host(src._device)):
        src = src.to(DEVICES[dst._device])       # one bulk copy, then the strided write
    while src._ndim > dst._ndim and src._shape[0] == 1:   # NumPy drops leading unit axes
        src = src.squeeze(0)
    operand_of(src, &o)
    if o.ndim > dst._ndim:
        raise ValueError(f"could not broadcast value of shape {shape_tuple(src)} into shape {shape_tuple(dst)}")
    for d in range(o.ndim):
        if o.shape[d] != 1 and o.shape[d] != dst._shape[dst._ndim - o.ndim + d]:
            raise ValueError(f"could not broadcast value of shape {shape_tuple(src)} into shape {shape_tuple(dst)}")
    if overlaps(dst, src):
        src = src.copy()
        operand_of(src, &o)
    run_elementwise(MT_EW_CAST, 0, src._dtype, dst._dtype, dst, 1, &o, NULL, 1)
    return 0


cdef int fill(Tensor dst, object value) except -1:
    cdef char buf[16]
    check_writable(dst)
    store_scalar(value, dst._dtype, buf)
    run_elementwise(MT_EW_FILL, 0, dst._dtype, dst._dtype, dst, 0, NULL, buf, 1)
    return 0


def copy_(dst, src):
    """Write src (Tensor, array or scalar) into dst in place, broadcasting and
    casting to dst's dtype. Returns dst."""
    if not isinstance(dst, Tensor):
        raise TypeError(f"copy_ destination must be a Tensor, not {type(dst).__name__}")
    if scalar_code(src) >= 0:
        fill(<Tensor>dst, src)
    else:
        if not isinstance(src, Tensor):
            src = coerce(src, (<Tensor>dst)._device)
        elif (<Tensor>src)._device != (<Tensor>dst)._device:
            raise ValueError(f"ambiguous device: {dev_name((<Tensor>dst)._device)} vs {dev_name((<Tensor>src)._device)}")
        copy_into(<Tensor>dst, <Tensor>src)
    return dst


def cast_(x, code):
    if not isinstance(x, Tensor):
        raise TypeError(f"expected a Tensor, not {type(x).__name__}")
    if (<Tensor>x)._qdtype is not None and code != (<Tensor>x)._dtype:    # copy() keeps the dtype
        refuse_quantized("astype", (x,))    # the integers as numbers (the ops' int -> float32)
    if traced_here(_tracing):
        return traced_args("astype", (x, DTYPE_NAMES[code]))
    return cast(<Tensor>x, code)


def astype(x, dtype):
    """x converted to ``dtype`` (always a new tensor)."""
    return cast_(x, dtype_code(dtype))


def full(shape, value, dtype=None, device=None):
    """A new tensor of ``shape`` filled with ``value``; dtype defaults to
    the dtype the Python scalar stands for (bool, int32, float32)."""
    from mgtrace._core.device import as_device
    cdef int code = dtype_code(dtype) if dtype is not None else scalar_code(value)
    if code < 0:
        raise TypeError(f"fill value must be a Python bool, int or float, not {type(value).__name__}")
    t = empty_shape(shape, code, (<Device>as_device(device))._id)
    fill(t, value)
    return t


# ------------------------------------------------------------------ complex
#
# The loops whose result dtype is not the computation's (kernels/mt_complex.h);
# the CPU has them, another device's backend does not yet (NoKernelError).

_PARTS = {"real": MT_CPART_REAL, "imag": MT_CPART_IMAG, "abs": MT_CPART_ABS,
          "angle": MT_CPART_ANGLE}


def make_complex(re, im):
    """The complex tensor ``re + 1j * im`` (new, contiguous).

    ``re`` and ``im`` are Tensors of one dtype, float32 (-> complex64) or
    float64 (-> complex128), on one device; their shapes broadcast (NumPy).
    Raises TypeError for other dtypes, ValueError for shapes that do not
    broadcast or two devices, NoKernelError off the CPU."""
    if not isinstance(re, Tensor) or not isinstance(im, Tensor):
        raise TypeError("make_complex: re and im must be Tensors")
    cdef Tensor a = <Tensor>re, b = <Tensor>im, res
    if a._dtype != b._dtype or a._dtype not in (9, 10):
        raise TypeError(f"make_complex: re and im must both be float32 or both float64, got "
                        f"{DTYPE_NAMES[a._dtype]} and {DTYPE_NAMES[b._dtype]}")
    if a._device != b._device:
        raise ValueError(f"ambiguous device: {dev_name(a._device)} vs {dev_name(b._device)}")
    cdef int code = 11 if a._dtype == 9 else 12
    cdef mt_loop_fn fn = mt_complex_make_loop(a._dtype) if on_host(a._device) else NULL
    if fn == NULL:
        raise missing_kernel("complex", a._device, code)
    cdef Operand ops[2]
    cdef int64_t oshape[16]
    operand_of(a, &ops[0])
    operand_of(b, &ops[1])
    cdef int nd = broadcast_shape(2, ops, oshape)
    res = empty(nd, oshape, code, a._device)
    run_loop(fn, res, 2, ops, NULL, 1)
    return res


def complex_part(x, part):
    """A real tensor from complex ``x``: ``part`` is "real", "imag", "abs"
    (the modulus, C99's cabs: no overflow in between) or "angle" (the
    argument in (-pi, pi], carg). complex64 gives float32, complex128
    float64. Raises TypeError for a real ``x``, NoKernelError off the CPU."""
    if not isinstance(x, Tensor):
        raise TypeError(f"complex_part: expected a Tensor, not {type(x).__name__}")
    cdef Tensor t = <Tensor>x, res
    if CATEGORY[t._dtype] != 4:
        raise TypeError(f"complex_part: expected a complex tensor, got {DTYPE_NAMES[t._dtype]}")
    cdef int which = _PARTS[part] if isinstance(part, str) else part
    cdef mt_loop_fn fn = mt_complex_part_loop(which, t._dtype) if on_host(t._device) else NULL
    if fn == NULL:
        raise missing_kernel([k for k, v in _PARTS.items() if v == which][0], t._device, t._dtype)
    cdef Operand o
    operand_of(t, &o)
    res = empty(t._ndim, t._shape, 9 if t._dtype == 11 else 10, t._device)
    run_loop(fn, res, 1, &o, NULL, 2)
    return res


cpdef Tensor empty_shape(object shape, int code, int device):
    cdef int64_t buf[16]
    cdef int nd = parse_shape(shape, buf)
    return empty(nd, buf, code, device)


# ------------------------------------------------------------------ elementwise

cdef inline int promote2(int ca, bint sa, int cb, bint sb) noexcept:
    """MegEngine promotion for two operands (see dtype.pyx)."""
    if sa == sb:
        if CATEGORY[ca] == CATEGORY[cb]:
            return PROMOTE[ca][cb]
        return ca if CATEGORY[ca] > CATEGORY[cb] else cb
    if sa:  # a scalar, b tensor
        return ca if CATEGORY[ca] > CATEGORY[cb] else cb
    return cb if CATEGORY[cb] > CATEGORY[ca] else ca


cdef int compute_dtype(int rule, int code, str name) except -1:
    if rule == MT_RULE_FLOAT:
        return float_result(code)
    if rule == MT_RULE_INT and CATEGORY[code] >= 3:
        raise TypeError(f"{name} needs integer or bool operands, got {DTYPE_NAMES[code]}")
    return code


cdef object missing_kernel(str name, int device, int code):
    return _missing_kernel(name, device, code)


cdef inline bint _quantized(object t) noexcept:
    # a quantized tensor carries its quantized dtype (tensor.pyx)
    return isinstance(t, Tensor) and (<Tensor>t)._qdtype is not None


cdef int refuse_quantized(str name, tuple operands) except -1:
    """QuantizationError naming every operand's dtype: the integers of a
    quantized tensor mean nothing to an elementwise op (MegEngine would
    compute on them; mgtrace refuses, as issue 32 asks)."""
    from mgtrace.quantization.utils import QuantizationError    # only quantization makes one
    from mgtrace._core.dtype import qdtype_str
    names = [qdtype_str(x.dtype) if isinstance(x, Tensor) else
             (qdtype_str(x.dtype) if hasattr(x, "dtype") else type(x).__name__)
             for x in operands]
    raise QuantizationError(
        f"{name}: cannot compute on {' and '.join(names)}: quantized tensors take part in "
        "no arithmetic; dequantize first (F.dequantize(x), x.astype('float32')) or use "
        "the modules of mgtrace.module.quantized")


cdef object binary(int op, object a, object b, object out):
    if _quantized(a) or _quantized(b) or _quantized(out):
        refuse_quantized(mt_binary_names[op].decode(), (a, b))
    if traced_here(_tracing):
        return traced_into(mt_binary_names[op].decode(), (a, b), out)
    cdef Tensor ta = None, tb = None, to = None, res
    cdef int ca, cb, dev, code, cdt, rdt, rule = mt_binary_rules[op]
    cdef bint sa = False, sb = False
    cdef char bufa[16]
    cdef char bufb[16]
    cdef Operand ops[2]
    cdef int64_t oshape[16]
    cdef int nd
    # classify operands
    if isinstance(a, Tensor):
        ta = <Tensor>a
    else:
        ca = scalar_code(a)
        sa = ca >= 0
    if isinstance(b, Tensor):
        tb = <Tensor>b
    else:
        cb = scalar_code(b)
        sb = cb >= 0
    if ta is not None:
        dev = ta._device
    elif tb is not None:
        dev = tb._device
    else:
        dev = default_device_id
    if ta is None and not sa:
        ta = coerce(a, dev)
    if tb is None and not sb:
        tb = coerce(b, dev)
    if sa and sb:  # two Python scalars: the first becomes a tensor
        ta = to_tensor(a, None, dev)
        sa = False
    if ta is not None:
        ca = ta._dtype
    if tb is not None:
        cb = tb._dtype
        if ta is not None and ta._device != tb._device:
            raise ValueError(f"ambiguous device: {dev_name(ta._device)} vs {dev_name(tb._device)}")
    name = None
    code = promote2(ca, sa, cb, sb)
    if rule == MT_RULE_SAME or rule == MT_RULE_BOOL:
        cdt = code
    else:
        name = mt_binary_names[op].decode()
        cdt = compute_dtype(rule, code, name)
    rdt = 0 if rule == MT_RULE_BOOL else cdt
    check_bool_op("binary", op, cdt)
    # operands in the compute dtype
    if sa:
        scalar_operand(a, cdt, bufa, &ops[0])
    else:
        if ta._dtype != cdt:
            ta = cast(ta, cdt)
        operand_of(ta, &ops[0])
    if sb:
        scalar_operand(b, cdt, bufb, &ops[1])
    else:
        if tb._dtype != cdt:
            tb = cast(tb, cdt)
        operand_of(tb, &ops[1])
    nd = broadcast_shape(2, ops, oshape)
    if out is None:
        res = empty(nd, oshape, rdt, dev)
    else:
        to = <Tensor>out
        check_writable(to)
        if to._device != dev:
            raise ValueError(f"ambiguous device: {dev_name(to._device)} vs {dev_name(dev)}")
        if not has_shape(to, nd, oshape):
            raise ValueError(f"in-place {mt_binary_names[op].decode()}: result shape "
                             f"{tuple([oshape[i] for i in range(nd)])} does not match the "
                             f"destination's {shape_tuple(to)}")
        check_same_kind(rdt, to, mt_binary_names[op].decode())
        if to._dtype == rdt:
            res = to
            if overlaps(to, ta):
                ta = ta.copy()
                operand_of(ta, &ops[0])
            if overlaps(to, tb):
                tb = tb.copy()
                operand_of(tb, &ops[1])
        else:
            res = empty(nd, oshape, rdt, dev)
    run_elementwise(MT_EW_BINARY, op, cdt, rdt, res, 2, ops, NULL, 1)
    if to is not None and res is not to:
        copy_into(to, res)
        return to
    return res


cdef object unary(int op, object a, object out):
    if _quantized(a) or _quantized(out):
        refuse_quantized(mt_unary_names[op].decode(), (a,))
    if traced_here(_tracing):
        return traced_into(mt_unary_names[op].decode(), (a,), out)
    cdef Tensor ta, res, to = None
    cdef int rule = mt_unary_rules[op], cdt, rdt
    cdef Operand o
    if isinstance(a, Tensor):
        ta = <Tensor>a
    else:
        ta = to_tensor(a, None, default_device_id) if scalar_code(a) >= 0 else coerce(a, default_device_id)
    name = mt_unary_names[op].decode()
    if op == U_ABS and CATEGORY[ta._dtype] == 4 and out is None:
        return complex_part(ta, MT_CPART_ABS)        # |z|: a real result
    cdt = compute_dtype(rule, ta._dtype, name)
    if rule == MT_RULE_BOOL and CATEGORY[cdt] < 3 and op in (U_ISNAN, U_ISINF, U_ISFINITE):
        # integers are never nan or inf
        res = empty(ta._ndim, ta._shape, 0, ta._device)
        fill(res, op == U_ISFINITE)
        return res
    rdt = 0 if rule == MT_RULE_BOOL else cdt
    check_bool_op("unary", op, cdt)
    if ta._dtype != cdt:
        ta = cast(ta, cdt)
    if out is None:
        res = empty(ta._ndim, ta._shape, rdt, ta._device)
    else:
        to = <Tensor>out
        check_writable(to)
        check_same_kind(rdt, to, name)
        res = to if to._dtype == rdt and not overlaps(to, ta) else empty(ta._ndim, ta._shape, rdt, ta._device)
        if not has_shape(to, ta._ndim, ta._shape):
            raise ValueError(f"in-place {name}: shapes differ")
    operand_of(ta, &o)
    run_elementwise(MT_EW_UNARY, op, cdt, rdt, res, 1, &o, NULL,
                    4 if rule == MT_RULE_FLOAT else 1)
    if to is not None and res is not to:
        copy_into(to, res)
        return to
    return res


cdef object ternary(int op, object a, object b, object c):
    cdef str name = mt_ternary_names[op].decode()
    if _quantized(a) or _quantized(b) or _quantized(c):
        refuse_quantized(name, (a, b, c))
    if traced_here(_tracing):
        return traced(name, (a, b, c), {})
    cdef list ts = [a, b, c]
    cdef Tensor t, res
    cdef int dev = -1, i, code, first = 1 if op == T_WHERE else 0
    cdef char bufs[3][16]
    cdef Operand ops[3]
    cdef int64_t oshape[16]
    for x in ts:
        if isinstance(x, Tensor):
            if dev < 0:
                dev = (<Tensor>x)._device
            elif (<Tensor>x)._device != dev:
                raise ValueError(f"ambiguous device: {dev_name(dev)} vs {dev_name((<Tensor>x)._device)}")
    if dev < 0:
        dev = default_device_id
    for i in range(3):
        if not isinstance(ts[i], Tensor) and scalar_code(ts[i]) < 0:
            ts[i] = coerce(ts[i], dev)
    if op == T_WHERE and scalar_code(ts[0]) >= 0:
        ts[0] = to_tensor(ts[0], "bool", dev)
    code = dtype_promotion_codes(ts[first:])
    for i in range(3):
        x = ts[i]
        cdt = 0 if i < first else code
        if isinstance(x, Tensor):
            t = <Tensor>x
            if t._dtype != cdt:
                t = cast(t, cdt)
                ts[i] = t
            operand_of(t, &ops[i])
        else:
            scalar_operand(x, cdt, bufs[i], &ops[i])
    nd = broadcast_shape(3, ops, oshape)
    res = empty(nd, oshape, code, dev)
    run_elementwise(MT_EW_TERNARY, op, code, code, res, 3, ops, NULL, 2)
    return res


cdef int dtype_promotion_codes(list xs) except -1:
    return promote_operands(tuple(xs))


def get_device(*operands):
    """The device an op on ``operands`` runs on.

    Returns the device shared by all Tensor operands, or the default device
    when there is none.

    Raises:
        ValueError: ``"ambiguous device: cpu:0 vs cpu:1"`` when they differ.

    >>> import mgtrace as mt
    >>> mt.get_device(mt.tensor([1.0], device="cpu:1"), 2.0)
    Device('cpu:1')
    """
    dev = None
    for x in operands:
        if isinstance(x, Tensor):
            d = (<Tensor>x)._device
            if dev is None:
                dev = d
            elif d != dev:
                raise ValueError(f"ambiguous device: {dev_name(dev)} vs {dev_name(d)}")
    return DEVICES[default_device_id if dev is None else dev]


# Python-visible entry points, also registered as apply() implementations
def _make_unary(int op):
    def f(x, out=None):
        return unary(op, x, out)
    f.__name__ = mt_unary_names[op].decode()
    return f


def _make_binary(int op):
    def f(x, y, out=None):
        return binary(op, x, y, out)
    f.__name__ = mt_binary_names[op].decode()
    return f


def _make_ternary(int op):
    def f(x, y, z):
        return ternary(op, x, y, z)
    f.__name__ = mt_ternary_names[op].decode()
    return f


unary_ops = {n: _make_unary(i) for n, i in UNARY.items()}
binary_ops = {n: _make_binary(i) for n, i in BINARY.items()}
ternary_ops = {n: _make_ternary(i) for n, i in TERNARY.items()}
for _table in (unary_ops, binary_ops, ternary_ops):
    for _n, _f in _table.items():
        register_op(_n, _f)
register_op("astype", astype)

install_dispatch(binary, unary, traced_args, &_tracing)
# views and in-place writes of Tensor report to the trace hook under these names
register_op("reshape", lambda x, shape: x.reshape(shape))
register_op("transpose", lambda x, axes: x.transpose(axes))
register_op("expand_dims", lambda x, axis: x.expand_dims(axis))
register_op("squeeze", lambda x, axis=None: x.squeeze(axis))
register_op("broadcast_to", lambda x, shape: x.broadcast_to(shape))
_tensor_mod._install_codes(BINARY, UNARY)
_tensor_mod._install_ops(copy_=copy_, cast=cast_)


def set_num_threads(n):
    """Threads used by mgtrace's kernels and by its BLAS (one budget, so the
    two pools never oversubscribe the cores). n >= 1."""
    if not isinstance(n, int) or isinstance(n, bool):
        raise TypeError(f"number of threads must be an int, got {n!r}")
    if n < 1:
        raise ValueError(f"number of threads must be >= 1, got {n}")
    mt_set_num_threads(min(n, 1024))
    from mgtrace._core import linalg
    linalg.set_blas_threads(n)


def get_num_threads():
    """Threads the kernels use at most (set_num_threads, else OpenMP's
    default); see :func:`set_adaptive_threads` for when they use fewer."""
    return mt_get_num_threads()


def set_adaptive_threads(on):
    """Whether kernels use fewer threads than :func:`get_num_threads` while
    other processes keep the cores busy (off by default, so that outputs
    do not depend on the machine's load; ``MGTRACE_ADAPTIVE_THREADS=1``
    turns it on at import, mgtrace/_flags.py). A team of
    threads is as slow as its most-descheduled member, so on a busy machine
    fewer threads finish sooner. Returns the previous setting."""
    old = bool(mt_get_adaptive_threads())
    mt_set_adaptive_threads(1 if on else 0)
    return old


def run_threads():
    """Threads the next kernel would use (the adaptive count, for tests and
    benchmarks)."""
    return mt_run_threads()


def _pin_run_threads(int n):
    """Kernels run in the calling thread use exactly ``n`` threads (0:
    unpin, back to :func:`run_threads`' rule) until pinned again; other
    threads are not affected. Returns the previous pin (0 for none). For
    :mod:`mgtrace.plan`, which records a program at the count it replays at."""
    if n < 0:
        raise ValueError(f"a pinned thread count is >= 0, got {n}")
    return mt_pin_run_threads(min(n, 1024))


cdef int num_threads() noexcept nogil:
    return mt_run_threads()



# ------------------------------------------------------------------ kernel queries

def _has_elementwise(str op, int device, int dtype):
    """Whether ``device`` has the elementwise kernel of op at compute dtype
    code ``dtype``, from its backend's ``has_elementwise`` member (the CPU's
    loop tables, CUDA's per (op, dtype) table); a backend without that
    member reports a dtype it lacks only when called, so there the answer
    is whether it has the elementwise member. None for another area's op."""
    cdef const mt_backend *b = backend_of(device)
    cdef int kind, code = 0
    if op in UNARY:
        kind, code = MT_EW_UNARY, UNARY[op]
    elif op in BINARY:
        kind, code = MT_EW_BINARY, BINARY[op]
    elif op in TERNARY:
        kind, code = MT_EW_TERNARY, TERNARY[op]
    elif op in ("astype", "concat", "stack"):    # joins copy by casts
        kind = MT_EW_CAST
    else:
        return None
    if b.elementwise == NULL:
        return False
    if b.has_elementwise == NULL:
        return True
    return b.has_elementwise(kind, code, dtype, dtype) != 0


# ops that run no kernel on the device: views, and nonzero (found on the
# host: the count sizes the result; the device only copies)
_NO_DEVICE_KERNEL = ("split", "nonzero")
_KERNEL_AREAS = ("mgtrace._core.dispatch:_has_elementwise", "mgtrace._core.reduce:_has_kernel",
                 "mgtrace._core.linalg:_has_kernel", "mgtrace._core.index:_has_kernel",
                 "mgtrace._core.nn:_has_kernel")


def has_kernel(op, device=None, dtype="float32"):
    """Whether ``device`` (None: the default device) has a kernel of its own
    for core op ``op`` (an op_table name, or ``"layer_norm"`` /
    ``"bias_act"``) at ``dtype``: what a pass asks before it puts an op on a
    module's device (the NCHWc passes ask it for ``"conv2d_nchwc"``). An op
    whose device lacks the kernel raises NoKernelError "no kernel for op X on
    device D with dtype T", or runs its op-table fallback (attention's).

    Views and other ops that run no kernel (reshape, transpose...) answer
    True. Every area answers per dtype from the device's kernel tables
    (elementwise ops from the backend's ``has_elementwise``: the CPU's
    loops, CUDA's per (op, dtype) table).

    Raises:
        KeyError: ``op`` is no core op.
        DeviceUnavailable: ``device``'s backend cannot be loaded.

    >>> import mgtrace as mt
    >>> mt.has_kernel("conv2d_nchwc", "cpu", "float32"), mt.has_kernel("conv2d_nchwc", "cpu", "float64")
    (True, False)
    """
    row = op_table.OPS.get(op)
    if row is None and op not in ("layer_norm", "bias_act"):
        raise KeyError(f"has_kernel: {op!r} is no core op")
    cdef int dev = device_id(device)
    cdef int code = dtype_code(dtype)
    if row is not None and (row.group in ("view", "identity") or op in _NO_DEVICE_KERNEL):
        return True
    for entry in _KERNEL_AREAS:
        module, name = entry.split(":")
        answer = getattr(importlib.import_module(module), name)(op, dev, code)
        if answer is not None:
            return bool(answer)
    raise KeyError(f"has_kernel: no kernel area knows op {op!r}")
