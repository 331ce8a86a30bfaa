"""Converters: one mgtrace op, function or builtin module to ONNX nodes.

Each converter takes the :class:`~mgtrace.onnx._builder.Builder`, the
recorded outputs (``out``: objects with ``dtype`` and ``shape``) and the
call's arguments with graph values as :class:`V` s, and returns the V (or
list of Vs) of the result. The exporter casts each result to the dtype the
trace recorded, so converters compute in whatever dtype ONNX allows and
promotion stays the trace's. :mod:`mgtrace.onnx.mapping` is the table that
names them.
"""
import math

import numpy as np

from mgtrace.onnx._builder import INT64_MAX, INT64_MIN, V

_F32 = np.dtype(np.float32)


def _dt(out):
    return np.dtype(out[0].dtype) if out[0].dtype is not None else _F32


def _flt(dtype):
    """The dtype a float-valued op computes in (integers give float32)."""
    return np.dtype(dtype) if np.dtype(dtype).kind == "f" else _F32


def _axes(axis, ndim):
    if axis is None:
        return list(range(ndim))
    if isinstance(axis, (tuple, list)):
        return [int(a) % max(ndim, 1) for a in axis]
    return [int(axis) % max(ndim, 1)]


# ------------------------------------------------------------ elementwise

def unary(onnx_op, compute="same", **attrs):
    """``onnx_op(x)``; ``compute="float"``: integers are cast to float32 first."""
    def conv(b, out, inputs, params):
        x = inputs[0]
        dt = _flt(_dt(out)) if compute == "float" else _dt(out)
        x = b.cast(x, dt)
        return b.op(onnx_op, [x], dt, x.shape, **attrs)
    conv.onnx = (onnx_op,)
    return conv


def composed(fn, onnx_ops, compute="float"):
    """A unary op written as several ONNX ops: ``fn(b, x, dtype)``."""
    def conv(b, out, inputs, params):
        dt = {"float": _flt(_dt(out)), "same": _dt(out), "bool": np.dtype(np.bool_)}[compute]
        return fn(b, b.cast(inputs[0], dt), dt)
    conv.onnx = tuple(onnx_ops)
    return conv


def _scalar(b, x, value):
    return b.const(np.asarray(value, x.dtype))


def _expm1(b, x, dt):
    return b.op("Sub", [b.op("Exp", [x], dt, x.shape), _scalar(b, x, 1)], dt, x.shape)


def _log1p(b, x, dt):
    return b.op("Log", [b.op("Add", [x, _scalar(b, x, 1)], dt, x.shape)], dt, x.shape)


def _log2(b, x, dt):
    return b.op("Div", [b.op("Log", [x], dt, x.shape), _scalar(b, x, math.log(2))], dt, x.shape)


def _rsqrt(b, x, dt):
    return b.op("Reciprocal", [b.op("Sqrt", [x], dt, x.shape)], dt, x.shape)


def _square(b, x, dt):
    return b.op("Mul", [x, x], dt, x.shape)


def _trunc(b, x, dt):
    if dt.kind != "f":
        return x
    neg = b.op("Less", [x, _scalar(b, x, 0)], np.bool_, x.shape)
    return b.op("Where", [neg, b.op("Ceil", [x], dt, x.shape), b.op("Floor", [x], dt, x.shape)],
                dt, x.shape)


def _round(b, x, dt):
    return x if dt.kind != "f" else b.op("Round", [x], dt, x.shape)


def _relu6(b, x, dt):
    return b.op("Clip", [x, _scalar(b, x, 0), _scalar(b, x, 6)], dt, x.shape)


MS = "com.microsoft"        # ONNX Runtime's contrib-op domain (export(contrib_ops=True))


def _gelu(b, x, dt):
    if b.opset >= 20:
        return b.op("Gelu", [x], dt, x.shape)
    if b.contrib and dt == _F32:
        return b.op("Gelu", [x], dt, x.shape, domain=MS)
    half = b.op("Mul", [x, _scalar(b, x, 0.5)], dt, x.shape)
    erf = b.op("Erf", [b.op("Mul", [x, _scalar(b, x, 1 / math.sqrt(2))], dt, x.shape)],
               dt, x.shape)
    return b.op("Mul", [half, b.op("Add", [erf, _scalar(b, x, 1)], dt, x.shape)], dt, x.shape)


def _gelu_tanh(b, x, dt):
    if b.opset >= 20:
        return b.op("Gelu", [x], dt, x.shape, approximate="tanh")
    if b.contrib and dt == _F32:
        return b.op("FastGelu", [x], dt, x.shape, domain=MS)
    cube = b.op("Mul", [b.op("Mul", [x, x], dt, x.shape), x], dt, x.shape)
    inner = b.op("Add", [x, b.op("Mul", [cube, _scalar(b, x, 0.044715)], dt, x.shape)],
                 dt, x.shape)
    t = b.op("Tanh", [b.op("Mul", [inner, _scalar(b, x, math.sqrt(2 / math.pi))], dt, x.shape)],
             dt, x.shape)
    half = b.op("Mul", [x, _scalar(b, x, 0.5)], dt, x.shape)
    return b.op("Mul", [half, b.op("Add", [t, _scalar(b, x, 1)], dt, x.shape)], dt, x.shape)


def _silu(b, x, dt):
    return b.op("Mul", [x, b.op("Sigmoid", [x], dt, x.shape)], dt, x.shape)


def _hardsigmoid(b, x, dt):
    return b.op("HardSigmoid", [x], dt, x.shape, alpha=1 / 6, beta=0.5)


def _hardswish(b, x, dt):
    if b.opset >= 14:
        return b.op("HardSwish", [x], dt, x.shape)
    return b.op("Mul", [x, _hardsigmoid(b, x, dt)], dt, x.shape)


def _isfinite(b, x, dt):
    bad = b.op("Or", [b.op("IsNaN", [x], np.bool_, x.shape), b.op("IsInf", [x], np.bool_, x.shape)],
               np.bool_, x.shape)
    return b.op("Not", [bad], np.bool_, x.shape)


def _in_dtype(out, inputs):
    """The dtype both operands of a comparison meet in: the result dtype of
    the tensor operands (a Python number takes the tensor's dtype unless it
    is a float beside integers)."""
    ts = [a.dtype for a in inputs if isinstance(a, V) and a.ndim >= 0]
    if not ts:
        return _F32
    dt = np.result_type(*ts)
    if dt.kind in "biu" and any(isinstance(a, float) for a in inputs):
        return _F32
    if dt.kind == "b" and any(isinstance(a, int) and not isinstance(a, bool) for a in inputs):
        return np.dtype(np.int32)
    return dt


def binary(onnx_op, compute="out"):
    """``onnx_op(x, y)``: operands cast to the result dtype (``"out"``), to
    their common dtype (``"in"``: comparisons) or to bool (``"bool"``)."""
    def conv(b, out, inputs, params):
        if compute == "out":
            dt = _dt(out)
        elif compute == "bool":
            dt = np.dtype(np.bool_)
        else:
            dt = _in_dtype(out, inputs)
        x, y = (b.operand(a, dt) for a in inputs)
        odt = np.bool_ if compute in ("in", "bool") else dt
        return b.op(onnx_op, [x, y], odt, out[0].shape)
    conv.onnx = (onnx_op,)
    return conv


def _ne(b, out, inputs, params):
    eq = binary("Equal", "in")(b, out, inputs, params)
    return b.op("Not", [eq], np.bool_, eq.shape)


_ne.onnx = ("Equal", "Not")


def _bitwise(onnx_bool, onnx_int):
    def conv(b, out, inputs, params):
        dt = _dt(out)
        x, y = (b.operand(a, dt) for a in inputs)
        return b.op(onnx_bool if dt.kind == "b" else onnx_int, [x, y], dt, out[0].shape)
    conv.onnx = (onnx_int,)
    return conv


def _bitwise_not(b, out, inputs, params):
    dt = _dt(out)
    x = b.cast(inputs[0], dt)
    return b.op("Not" if dt.kind == "b" else "BitwiseNot", [x], dt, x.shape)


_bitwise_not.onnx = ("BitwiseNot",)


def _truediv(b, out, inputs, params):
    dt = _flt(_dt(out))
    x, y = (b.operand(a, dt) for a in inputs)
    return b.op("Div", [x, y], dt, out[0].shape)


_truediv.onnx = ("Div",)


def floor_div(b, x, y, dt, shape):
    """Python's ``//``: floor of the quotient. Integers: ``(x - x mod y) / y``,
    the remainder with the divisor's sign (ONNX Mod, fmod=0, as Python's %)
    leaving an exact multiple, which ONNX's truncating Div divides exactly;
    the importer reads it back as ``//`` of sizes, kept symbolic."""
    if dt.kind == "f":
        return b.op("Floor", [b.op("Div", [x, y], dt, shape)], dt, shape)
    r = b.op("Mod", [x, y], dt, shape, fmod=0)
    return b.op("Div", [b.op("Sub", [x, r], dt, shape), y], dt, shape)


def _floordiv(b, out, inputs, params):
    dt = _dt(out)
    x, y = (b.operand(a, dt) for a in inputs)
    return floor_div(b, x, y, dt, out[0].shape)


_floordiv.onnx = ("Div", "Floor", "Mod")


def _mod(b, out, inputs, params):
    dt = _dt(out)
    x, y = (b.operand(a, dt) for a in inputs)
    shape = out[0].shape
    if dt.kind != "f":
        return b.op("Mod", [x, y], dt, shape, fmod=0)       # the divisor's sign, as Python
    q = b.op("Floor", [b.op("Div", [x, y], dt, shape)], dt, shape)
    return b.op("Sub", [x, b.op("Mul", [q, y], dt, shape)], dt, shape)


_mod.onnx = ("Mod",)


def _where(b, out, inputs, params):
    dt = _dt(out)
    c = b.operand(inputs[0], np.bool_)
    x, y = (b.operand(a, dt) for a in inputs[1:])
    return b.op("Where", [c, x, y], dt, out[0].shape)


_where.onnx = ("Where",)


def _clip(b, out, inputs, params):
    dt = _dt(out)
    y = b.cast(inputs[0], dt)
    lo, hi = inputs[1], inputs[2]
    if lo is not None:
        y = b.op("Max", [y, b.operand(lo, dt)], dt, out[0].shape)
    if hi is not None:
        y = b.op("Min", [y, b.operand(hi, dt)], dt, out[0].shape)
    return y


_clip.onnx = ("Max", "Min")


# ------------------------------------------------------------------ views

def _astype(b, out, inputs, params):
    return b.cast(inputs[0], _dt(out))


_astype.onnx = ("Cast",)


def reshape_to(b, x, shape, out_shape):
    kw = {"allowzero": 1} if b.opset >= 14 and not any(
        isinstance(s, int) and s == -1 for s in shape) else {}
    return b.op("Reshape", [x, b.shape_tensor(shape)], x.dtype, out_shape, **kw)


def _shape_param(v):
    if isinstance(v, (tuple, list)) and len(v) == 1 and isinstance(v[0], (tuple, list)):
        return tuple(v[0])
    return tuple(v) if isinstance(v, (tuple, list)) else (v,)


def _reshape(b, out, inputs, params):
    return reshape_to(b, inputs[0], _shape_param(params["shape"]), out[0].shape)


_reshape.onnx = ("Reshape",)


def _transpose(b, out, inputs, params):
    x = inputs[0]
    axes = _shape_param(params.get("axes"))
    if axes in ((), (None,)):
        axes = tuple(reversed(range(x.ndim)))
    return b.op("Transpose", [x], x.dtype, out[0].shape, perm=[int(a) % x.ndim for a in axes])


_transpose.onnx = ("Transpose",)


def _expand_dims(b, out, inputs, params):
    x = inputs[0]
    nd = len(out[0].shape)
    axes = [int(a) % nd for a in _shape_param(params["axis"])]
    return b.op("Unsqueeze", [x, b.ints(axes)], x.dtype, out[0].shape)


_expand_dims.onnx = ("Unsqueeze",)


def _squeeze(b, out, inputs, params):
    x = inputs[0]
    axis = params.get("axis")
    if axis is None:        # the axes of size 1 when the graph runs, as mgtrace's squeeze
        return b.op("Squeeze", [x], x.dtype, out[0].shape)
    axes = _axes(_shape_param(axis), x.ndim)
    if not axes:
        return x
    return b.op("Squeeze", [x, b.ints(axes)], x.dtype, out[0].shape)


_squeeze.onnx = ("Squeeze",)


def _broadcast_to(b, out, inputs, params):
    x = inputs[0]
    shape = list(_shape_param(params["shape"]))
    nd = len(shape)
    for i, s in enumerate(shape):          # -1 keeps x's size
        if isinstance(s, int) and s == -1:
            shape[i] = b.dim(x, i - nd + x.ndim)
    return b.op("Expand", [x, b.shape_tensor(shape)], x.dtype, out[0].shape)


_broadcast_to.onnx = ("Expand",)


# ------------------------------------------------------------ reductions

def reduce_op(b, onnx_op, x, axes, keepdims, dtype, shape):
    """``onnx_op`` over ``axes`` (None: all), axes as an input from opset 18
    (ReduceSum: 13), as an attribute before."""
    as_input = b.opset >= 18 or onnx_op == "ReduceSum"
    kw = {"keepdims": int(bool(keepdims))}
    if axes is None:
        axes = list(range(x.ndim))
    if as_input:
        return b.op(onnx_op, [x, b.ints(axes)], dtype, shape, **kw)
    return b.op(onnx_op, [x], dtype, shape, axes=list(axes), **kw)


def reduction(onnx_op, compute="out"):
    def conv(b, out, inputs, params):
        x = inputs[0]
        dt = _dt(out) if compute == "out" else _flt(_dt(out))
        if x.ndim == 0:
            return b.cast(x, dt)
        axes = _axes(params.get("axis"), x.ndim)
        return reduce_op(b, onnx_op, b.cast(x, dt), axes, params.get("keepdims", False), dt,
                         out[0].shape)
    conv.onnx = (onnx_op,)
    return conv


def _any_all(onnx_op):
    def conv(b, out, inputs, params):
        x = b.cast(b.cast(inputs[0], np.bool_), np.int32)
        if x.ndim == 0:
            return b.cast(x, np.bool_)
        y = reduce_op(b, onnx_op, x, _axes(params.get("axis"), x.ndim),
                      params.get("keepdims", False), np.int32, out[0].shape)
        return b.cast(y, np.bool_)
    conv.onnx = (onnx_op,)
    return conv


def _count(b, x, axes):
    """The number of elements over ``axes`` of x, a 0-d int64 V."""
    sizes = b.op("Gather", [b.shape_of(x), b.ints(axes)], np.int64, (len(axes),), axis=0)
    return reduce_op(b, "ReduceProd", sizes, [0], False, np.int64, ())


def var_of(b, x, axes, keepdims, ddof, dt, shape):
    mean = reduce_op(b, "ReduceMean", x, axes, True, dt, ())
    d = b.op("Sub", [x, mean], dt, x.shape)
    v = reduce_op(b, "ReduceMean", b.op("Mul", [d, d], dt, x.shape), axes, keepdims, dt, shape)
    if ddof:
        n = b.cast(_count(b, x, axes), dt)
        nd = b.op("Sub", [n, b.const(np.asarray(ddof, dt))], dt, ())
        v = b.op("Mul", [v, b.op("Div", [n, nd], dt, ())], dt, shape)
    return v


def _var(std):
    def conv(b, out, inputs, params):
        dt = _flt(_dt(out))
        x = b.cast(inputs[0], dt)
        axes = _axes(params.get("axis"), x.ndim)
        v = var_of(b, x, axes, params.get("keepdims", False), params.get("ddof", 0) or 0, dt,
                   out[0].shape)
        return b.op("Sqrt", [v], dt, v.shape) if std else v
    conv.onnx = ("ReduceMean", "Sub", "Mul") + (("Sqrt",) if std else ())
    return conv


def _arg(onnx_op):
    def conv(b, out, inputs, params):
        x = inputs[0]
        axis, keep = params.get("axis"), bool(params.get("keepdims", False))
        if x.dtype.kind == "b":
            x = b.cast(x, np.int32)
        if axis is None:
            flat = b.op("Reshape", [x, b.ints([-1])], x.dtype, (-1,))
            y = b.op(onnx_op, [flat], np.int64, (1,), axis=0, keepdims=0)
            if keep:
                y = b.op("Reshape", [y, b.ints([1] * x.ndim)], np.int64, out[0].shape)
            return y
        return b.op(onnx_op, [x], np.int64, out[0].shape, axis=int(axis) % x.ndim,
                    keepdims=int(keep))
    conv.onnx = (onnx_op,)
    return conv


def _softmax(onnx_op):
    def conv(b, out, inputs, params):
        dt = _flt(_dt(out))
        x = b.cast(inputs[0], dt)
        axis = params.get("axis")
        axis = -1 if axis is None else int(axis)
        return b.op(onnx_op, [x], dt, x.shape, axis=axis % max(x.ndim, 1))
    conv.onnx = (onnx_op,)
    return conv


def _cumsum(b, out, inputs, params):
    dt = _dt(out)
    x = b.cast(inputs[0], dt)
    return b.op("CumSum", [x, b.const(np.int64(int(params["axis"]) % x.ndim))], dt, x.shape)


_cumsum.onnx = ("CumSum",)


# -------------------------------------------------------------- indexing

def getitem_of(b, x, index, out_shape):
    """NumPy basic indexing (ints, slices, None, ``...``) and one integer
    tensor index, as Slice / Gather / Squeeze / Unsqueeze."""
    idx = index if isinstance(index, tuple) else (index,)
    n_real = sum(1 for i in idx if i is not None and i is not Ellipsis)
    if sum(1 for i in idx if i is Ellipsis) > 1:
        raise b.error("an index with more than one '...'")
    full = []
    for i in idx:
        if i is Ellipsis:
            full += [slice(None)] * (x.ndim - n_real)
        else:
            full.append(i)
    full += [slice(None)] * (x.ndim - sum(1 for i in full if i is not None))
    starts, ends, axes, steps, squeeze, new_at, tensor_at = [], [], [], [], [], [], None
    axis = out_pos = 0
    for i in full:
        if i is None:
            new_at.append(out_pos)
            out_pos += 1
            continue
        if isinstance(i, slice):
            st, en, sp = i.start, i.stop, i.step
            sp = 1 if sp is None else sp
            if isinstance(sp, V) and (st is None or en is None):
                # the default start and stop depend on the step's sign
                raise b.error("a slice step computed at run time with a default start or stop")
            if isinstance(sp, V) or not (st is None and en is None and sp == 1):
                starts.append((0 if sp > 0 else INT64_MAX) if st is None else st)
                ends.append((INT64_MAX if sp > 0 else INT64_MIN) if en is None else en)
                axes.append(axis)
                steps.append(sp)
            out_pos += 1
        elif isinstance(i, V) and i.ndim == 0 and i.dtype.kind in "iu" and i.blocked is None \
                and i.name and i.dtype == np.int64:
            starts.append(i)
            ends.append(b.op("Add", [i, b.const(np.int64(1))], np.int64, ()))
            axes.append(axis)
            steps.append(1)
            squeeze.append(axis)
        elif isinstance(i, V):
            if tensor_at is not None or i.dtype.kind == "b":
                raise b.error("indexing with a bool mask or with more than one tensor "
                              "(advanced indexing) has no ONNX form here")
            tensor_at = (axis, i, out_pos)
            out_pos += i.ndim
        elif isinstance(i, (int, np.integer)):
            i = int(i)
            starts.append(i)
            ends.append(INT64_MAX if i == -1 else i + 1)
            axes.append(axis)
            steps.append(1)
            squeeze.append(axis)
        else:
            raise b.error(f"an index entry of type {type(i).__name__} has no ONNX form")
        axis += 1
    if tensor_at is not None and squeeze:
        raise b.error("an integer index beside a tensor index (NumPy moves their axes) has no "
                      "ONNX form here")
    y = x
    if axes:
        y = b.op("Slice", [y, b.shape_tensor(starts), b.shape_tensor(ends), b.ints(axes),
                           b.shape_tensor(steps)], x.dtype, x.shape)
    if squeeze:
        y = b.op("Squeeze", [y, b.ints(squeeze)], x.dtype, ())
    if tensor_at is not None:
        ax, t, _ = tensor_at
        y = b.op("Gather", [y, b.cast(t, np.int64)], x.dtype, (), axis=ax)
    if new_at:
        y = b.op("Unsqueeze", [y, b.ints(new_at)], x.dtype, ())
    return V(y.name, y.dtype, out_shape)


def _getitem(b, out, inputs, params):
    return getitem_of(b, inputs[0], inputs[1], out[0].shape)


_getitem.onnx = ("Slice", "Squeeze", "Gather", "Unsqueeze")


def _gather(b, out, inputs, params):
    x, idx = inputs
    return b.op("GatherElements", [x, b.cast(idx, np.int64)], x.dtype, out[0].shape,
                axis=int(params["axis"]) % x.ndim)


_gather.onnx = ("GatherElements",)


def _scatter(b, out, inputs, params):
    x, idx, src = inputs
    return b.op("ScatterElements", [x, b.cast(idx, np.int64), b.operand(src, x.dtype)], x.dtype,
                out[0].shape, axis=int(params["axis"]) % x.ndim)


_scatter.onnx = ("ScatterElements",)


def _embedding(b, out, inputs, params):
    w, idx = inputs
    return b.op("Gather", [w, b.cast(idx, np.int64)], w.dtype, out[0].shape, axis=0)


_embedding.onnx = ("Gather",)


def _concat(b, out, inputs, params):
    dt = _dt(out)
    xs = [b.cast(x, dt) for x in _seq(inputs)]
    axis = int(params.get("axis", 0)) % len(out[0].shape)
    return b.op("Concat", xs, dt, out[0].shape, axis=axis)


_concat.onnx = ("Concat",)


def _seq(inputs):
    return list(inputs[0]) if len(inputs) == 1 and isinstance(inputs[0], (list, tuple)) \
        else list(inputs)


def _stack(b, out, inputs, params):
    dt = _dt(out)
    axis = int(params.get("axis", 0)) % len(out[0].shape)
    xs = [b.op("Unsqueeze", [b.cast(x, dt), b.ints([axis])], dt, ()) for x in _seq(inputs)]
    return b.op("Concat", xs, dt, out[0].shape, axis=axis)


_stack.onnx = ("Unsqueeze", "Concat")


def _split(b, out, inputs, params):
    x = inputs[0]
    axis = int(params.get("axis", 0)) % x.ndim
    spec = b.static(params["nsplits_or_sections"], "split's sections")
    if isinstance(spec, int):
        n = spec
        # equal parts of the axis as it is at run time (no sizes given)
        extra = {"num_outputs": n} if b.opset >= 18 else {}
        outs = b.node("Split", [x], n_out=n, axis=axis, **extra)
    else:
        points = [0] + [int(p) for p in spec] + [None]
        outs = [getitem_of(b, x, (slice(None),) * axis + (slice(points[k], points[k + 1]),),
                           out[k].shape).name for k in range(len(points) - 1)]
    return [V(o, x.dtype, s.shape) for o, s in zip(outs, out)]


_split.onnx = ("Split", "Slice")


def _matmul(b, out, inputs, params):
    dt = _dt(out)
    a, c = (b.cast(t, dt) for t in inputs)
    return b.op("MatMul", [a, c], dt, out[0].shape)


_matmul.onnx = ("MatMul",)


def _topk(b, out, inputs, params, *, k=None, largest=None, which=(0, 1)):
    x = inputs[0]
    axis = int(params.get("axis", -1)) % x.ndim
    largest = bool(params.get("descending", True)) if largest is None else largest
    kk = b.shape_tensor([k if k is not None else b.dim(x, axis)])
    vals, idx = b.node("TopK", [x, kk], n_out=2, axis=axis, largest=int(largest), sorted=1)
    res = [V(vals, x.dtype, out[0].shape), V(idx, np.int64, out[-1].shape)]
    return [res[i] for i in which]


def _sort(b, out, inputs, params):
    res = _topk(b, out, inputs, params, largest=bool(params.get("descending", False)))
    return res if len(out) == 2 else res[0]


def _argsort(b, out, inputs, params):
    return _topk(b, out, inputs, params, largest=bool(params.get("descending", False)),
                 which=(1,))[0]


def _topk_op(b, out, inputs, params):
    k = params["k"]
    if not isinstance(k, V):
        k = int(k)
    return _topk(b, out, inputs, params, k=k, largest=bool(params.get("descending", True)))


for _f in (_sort, _argsort, _topk_op):
    _f.onnx = ("TopK",)


# ------------------------------------------------------------------ nn ops

def _pair(v):
    return tuple(v) if isinstance(v, (tuple, list)) else (v, v)


def conv_of(b, x, w, bias, stride, padding, dilation, groups, dt, shape):
    ins = [b.cast(x, dt), b.cast(w, dt)] + ([b.cast(bias, dt)] if bias is not None else [])
    ph, pw = _pair(padding)
    return b.op("Conv", ins, dt, shape, strides=list(_pair(stride)),
                pads=[int(ph), int(pw), int(ph), int(pw)], dilations=list(_pair(dilation)),
                group=int(groups), kernel_shape=list(w.shape[2:]))


def act_of(b, y, act):
    """``act`` (a fused op's activation name) applied to y."""
    fn = {"none": None, "relu": lambda: b.op("Relu", [y], y.dtype, y.shape),
          "relu6": lambda: _relu6(b, y, y.dtype), "silu": lambda: _silu(b, y, y.dtype),
          "sigmoid": lambda: b.op("Sigmoid", [y], y.dtype, y.shape),
          "hardswish": lambda: _hardswish(b, y, y.dtype),
          "hardsigmoid": lambda: _hardsigmoid(b, y, y.dtype),
          "gelu": lambda: _gelu(b, y, y.dtype), "gelu_tanh": lambda: _gelu_tanh(b, y, y.dtype),
          "tanh": lambda: b.op("Tanh", [y], y.dtype, y.shape)}
    if act not in fn:
        raise b.error(f"activation {act!r} has no ONNX form")
    return y if fn[act] is None else fn[act]()


def _conv2d(b, out, inputs, params):
    x, w, bias = inputs[:3]
    return conv_of(b, x, w, bias, params["stride"], params["padding"], params["dilation"],
                   params["groups"], _dt(out), out[0].shape)


_conv2d.onnx = ("Conv",)


# activations com.microsoft FusedConv applies itself: (name, activation_params)
_FUSED_ACTS = {"relu": ("Relu", None), "relu6": ("Clip", [0.0, 6.0]),
               "sigmoid": ("Sigmoid", None), "tanh": ("Tanh", None),
               "hardsigmoid": ("HardSigmoid", [1 / 6, 0.5])}


def conv_act_of(b, x, w, bias, stride, padding, dilation, groups, dt, shape, act, res=None):
    """``act(conv(x) + res)``: one com.microsoft FusedConv where the export
    allows contrib ops and ONNX Runtime's FusedConv has the activation
    (float32, 2-d), else Conv, Add and the activation's nodes."""
    if b.contrib and act in _FUSED_ACTS and dt == _F32 and len(w.shape) == 4:
        name, ps = _FUSED_ACTS[act]
        ins = [b.cast(x, dt), b.cast(w, dt), b.cast(bias, dt) if bias is not None else None]
        if res is not None:
            ins.append(b.cast(res, dt))
        ph, pw = _pair(padding)
        return b.op("FusedConv", ins, dt, shape, domain=MS, activation=name,
                    activation_params=ps, strides=list(_pair(stride)),
                    pads=[int(ph), int(pw), int(ph), int(pw)], dilations=list(_pair(dilation)),
                    group=int(groups), kernel_shape=list(w.shape[2:]))
    y = conv_of(b, x, w, bias, stride, padding, dilation, groups, dt, shape)
    if res is not None:
        y = b.op("Add", [y, b.cast(res, dt)], dt, y.shape)
    return act_of(b, y, act)


def _conv2d_act(b, out, inputs, params):
    x, w, bias, res = inputs
    return conv_act_of(b, x, w, bias, params["stride"], params["padding"], params["dilation"],
                       params["groups"], _dt(out), out[0].shape, params.get("act", "none"), res)


_conv2d_act.onnx = ("Conv", "Add", "Relu", "Clip", "Sigmoid", "HardSwish")


def _conv_transpose2d(b, out, inputs, params):
    x, w, bias = inputs
    dt = _dt(out)
    ins = [b.cast(x, dt), b.cast(w, dt)] + ([b.cast(bias, dt)] if bias is not None else [])
    ph, pw = _pair(params["padding"])
    return b.op("ConvTranspose", ins, dt, out[0].shape, strides=list(_pair(params["stride"])),
                pads=[ph, pw, ph, pw], dilations=list(_pair(params["dilation"])),
                output_padding=list(_pair(params["output_padding"])),
                group=int(params["groups"]), kernel_shape=list(w.shape[2:]))


_conv_transpose2d.onnx = ("ConvTranspose",)


def _pool_attrs(params, dilation=True):
    ph, pw = _pair(params["padding"])
    kw = dict(kernel_shape=list(_pair(params["kernel_size"])),
              strides=list(_pair(params["stride"])), pads=[ph, pw, ph, pw],
              ceil_mode=int(bool(params.get("ceil_mode", False))))
    if dilation and params.get("dilation") is not None:
        kw["dilations"] = list(_pair(params["dilation"]))
    return kw


def _max_pool2d(b, out, inputs, params):
    x = inputs[0]
    return b.op("MaxPool", [x], x.dtype, out[0].shape, **_pool_attrs(params))


_max_pool2d.onnx = ("MaxPool",)


def _avg_pool2d(b, out, inputs, params):
    x = b.cast(inputs[0], _flt(_dt(out)))
    return b.op("AveragePool", [x], x.dtype, out[0].shape,
                count_include_pad=int(bool(params.get("count_include_pad", True))),
                **_pool_attrs(params, dilation=False))


_avg_pool2d.onnx = ("AveragePool",)


def _adaptive(global_op, name):
    """Global pooling for output size (1, 1); other sizes that divide the
    input as :func:`adaptive_of` (Reshape and ReduceMean / ReduceMax)."""
    reduce = "ReduceMean" if "avg" in name else "ReduceMax"

    def conv(b, out, inputs, params):
        x = inputs[0]
        if name.endswith("avg_pool2d"):
            x = b.cast(x, _flt(_dt(out)))
        size = _pair(params["output_size"])
        if tuple(size) == (1, 1):
            return b.op(global_op, [x], x.dtype, out[0].shape)
        return adaptive_of(b, x, size, reduce, name, out[0].shape)
    conv.onnx = (global_op, "Reshape", reduce)
    return conv


def _attention(b, out, inputs, params):
    q, k, v, mask = inputs
    dt = _dt(out)
    q, k, v = (b.cast(t, dt) for t in (q, k, v))
    kt = b.op("Transpose", [k], dt, k.shape, perm=list(range(k.ndim - 2)) + [k.ndim - 1,
                                                                              k.ndim - 2])
    s = b.op("MatMul", [q, kt], dt, ())
    scale = params.get("scale", 1.0)
    s = b.op("Mul", [s, b.operand(1.0 if scale is None else scale, dt)], dt, ())
    if mask is not None:
        s = b.op("Add", [s, b.cast(mask, dt)], dt, ())
    p = b.op("Softmax", [s], dt, (0,) * q.ndim, axis=q.ndim - 1)
    return b.op("MatMul", [p, v], dt, out[0].shape)


_attention.onnx = ("Transpose", "MatMul", "Mul", "Add", "Softmax")


def _pad(b, out, inputs, params):
    x = inputs[0]
    width = params["pad_width"]
    width = [tuple(p) if isinstance(p, (tuple, list)) else (p, p) for p in width]
    width += [(0, 0)] * (x.ndim - len(width))
    mode = {"constant": "constant", "reflect": "reflect", "edge": "edge",
            "replicate": "edge"}.get(params.get("mode", "constant"))
    if mode is None:
        raise b.error(f"pad mode {params.get('mode')!r} has no ONNX form")
    pads = b.shape_tensor([p[0] for p in width] + [p[1] for p in width])
    ins = [x, pads]
    if mode == "constant":
        ins.append(b.const(np.asarray(params.get("value", 0) or 0, x.dtype)))
    return b.op("Pad", ins, x.dtype, out[0].shape, mode=mode)


_pad.onnx = ("Pad",)


# ---------------------------------------------- NCHW16c layout (optimize)

def _blocked(b, out, inputs, params):
    """to_nchwc: the value stays NCHW, marked blocked (see :class:`V`)."""
    x = inputs[0]
    return V(x.name, x.dtype, out[0].shape, blocked=x.shape[1])


_blocked.onnx = ()


def unblock(b, v, shape=None):
    """A blocked value as the NCHW16c tensor the graph sees: Pad, Reshape,
    Transpose (for an op that reads the blocks themselves)."""
    if v.blocked is None:
        return v
    c = v.blocked
    nb = -(-c // 16)
    x = V(v.name, v.dtype, v.shape[:1] + (c,) + v.shape[2:4])
    if nb * 16 != c:
        x = b.op("Pad", [x, b.ints([0, 0, 0, 0, 0, nb * 16 - c, 0, 0])], x.dtype, x.shape)
    n, h, w = b.dim(x, 0), b.dim(x, 2), b.dim(x, 3)
    y = b.op("Reshape", [x, b.shape_tensor([n, nb, 16, h, w])], x.dtype, ())
    return b.op("Transpose", [y], x.dtype, shape or (0,) * 5, perm=[0, 1, 3, 4, 2])


def _nchw(b, v):
    """A (possibly blocked) value as its NCHW tensor."""
    if v is None or v.blocked is not None or v.ndim != 5:
        return None if v is None else V(v.name, v.dtype, v.shape[:1] + (v.blocked or 0,)
                                        + v.shape[2:4])
    n, nb, h, w = (b.dim(v, i) for i in range(4))
    t = b.op("Transpose", [v], v.dtype, (), perm=[0, 1, 4, 2, 3])
    c = b.op("Mul", [nb, b.const(np.int64(16))], np.int64, ())
    return b.op("Reshape", [t, b.shape_tensor([n, c, h, w])], v.dtype, (0,) * 4)


def _from_nchwc(b, out, inputs, params):
    x = inputs[0]
    c = int(params["channels"])
    y = _nchw(b, x)
    if (x.blocked or 0) != c or x.blocked is None:
        y = b.op("Slice", [y, b.ints([0]), b.ints([c]), b.ints([1])], x.dtype, ())
    return V(y.name, y.dtype, out[0].shape)


_from_nchwc.onnx = ("Slice",)


def _conv2d_nchwc(b, out, inputs, params):
    x, w, bias, res = inputs
    dt = _dt(out)
    o = w.shape[0]
    y = conv_act_of(b, _nchw(b, x), w, bias, params["stride"], params["padding"],
                    params["dilation"], params["groups"], dt, (), params.get("act", "none"),
                    None if res is None else _nchw(b, res))
    return V(y.name, dt, out[0].shape, blocked=o)


_conv2d_nchwc.onnx = ("Conv", "Add", "Relu", "Clip")


def _pw_dw(b, out, inputs, params):
    x, w, bias, dw_w, dw_b = inputs[:5]
    dt = _dt(out)
    y = conv_act_of(b, _nchw(b, x), w, bias, 1, 0, 1, 1, dt, (), params.get("act", "none"))
    y = conv_act_of(b, y, dw_w, dw_b, params["stride"], params["padding"], 1, dw_w.shape[0], dt,
                    (), params.get("dw_act", "none"))
    if len(inputs) > 5:
        pw_w, pw_b, res = inputs[5:]
        y = conv_act_of(b, y, pw_w, pw_b, 1, 0, 1, 1, dt, (), params.get("proj_act", "none"),
                        None if res is None else _nchw(b, res))
        return V(y.name, dt, out[0].shape, blocked=pw_w.shape[0])
    return V(y.name, dt, out[0].shape, blocked=dw_w.shape[0])


_pw_dw.onnx = ("Conv", "Add", "Relu", "Clip")


def _max_pool2d_nchwc(b, out, inputs, params):
    x = _nchw(b, inputs[0])
    c = inputs[0].blocked
    y = b.op("MaxPool", [x], x.dtype, (), **_pool_attrs(params))
    return V(y.name, y.dtype, out[0].shape, blocked=c)


_max_pool2d_nchwc.onnx = ("MaxPool",)


# ------------------------------------- ops composed of several ONNX ops

def _signbit(b, v, dt):
    """v < 0, or v is -0.0 (1 / v is -inf): NumPy's signbit for floats."""
    zero = b.const(np.asarray(0, dt))
    neg = b.op("Less", [v, zero], np.bool_, v.shape)
    inv = b.op("Div", [b.const(np.asarray(1, dt)), v], dt, v.shape)
    return b.op("Or", [neg, b.op("Less", [inv, zero], np.bool_, v.shape)], np.bool_, v.shape)


def _atan2(b, out, inputs, params):
    """NumPy's arctan2(x, y) (the angle of the point (y, x)): Atan(x / y), then
    the quadrant: +-pi where y < 0 (or y is -0.0 and x is 0), by x's sign
    bit; 0 / 0 gives 0 (signed zeros as NumPy's). Infinite operands together
    (inf / inf) give NaN where NumPy gives a multiple of pi/4."""
    dt = _flt(_dt(out))
    x, y = (b.operand(a, dt) for a in inputs)
    shape = out[0].shape
    q = b.op("Atan", [b.op("Div", [x, y], dt, shape)], dt, shape)
    zero = b.const(np.asarray(0, dt))
    x0 = b.op("Equal", [x, zero], np.bool_, shape)
    y0 = b.op("Equal", [y, zero], np.bool_, shape)
    both0 = b.op("And", [x0, y0], np.bool_, shape)
    q = b.op("Where", [both0, b.op("Mul", [x, zero], dt, shape), q], dt, shape)
    ylt = b.op("Less", [y, zero], np.bool_, shape)
    flip = b.op("Or", [ylt, b.op("And", [both0, _signbit(b, y, dt)], np.bool_, shape)],
                np.bool_, shape)
    pi = b.op("Where", [_signbit(b, x, dt), b.const(np.asarray(-math.pi, dt)),
                        b.const(np.asarray(math.pi, dt))], dt, shape)
    return b.op("Where", [flip, b.op("Add", [q, pi], dt, shape), q], dt, shape)


_atan2.onnx = ("Atan", "Div", "Where")


def _shift(left):
    """``x << y`` / ``x >> y`` of integers: ONNX BitShift takes unsigned
    integers, so the bits are shifted as the unsigned type of the same
    width; a left shift wraps (two's complement), a right shift of a
    negative signed value is arithmetic (``~(~x >> y)``), and a shift by the
    width or more gives 0 (-1 for a negative value shifted right), as
    mgtrace's kernels."""
    def conv(b, out, inputs, params):
        dt = _dt(out)
        if dt.kind not in "iu":
            raise b.error(f"{'left' if left else 'right'}_shift of {dt} has no ONNX form "
                          f"(integers only)")
        bits = dt.itemsize * 8
        udt = np.dtype(f"uint{bits}")
        x, y = (b.cast(b.operand(a, dt), np.int64) for a in inputs)
        shape = out[0].shape
        big = b.op("GreaterOrEqual", [y, b.const(np.int64(bits))], np.bool_, shape)
        yc = b.cast(b.op("Min", [y, b.const(np.int64(bits - 1))], np.int64, shape), udt)
        signed = dt.kind == "i"
        neg = b.op("Less", [x, b.const(np.int64(0))], np.bool_, shape) if signed else None
        if left or not signed:
            xu = b.cast(b.cast(x, dt), udt)
            s = b.cast(b.op("BitShift", [xu, yc], udt, shape,
                            direction="LEFT" if left else "RIGHT"), np.int64)
            # the wrap to dt's width: back through dt itself
            s = b.cast(b.cast(b.cast(s, udt), dt), np.int64)
            r = b.op("Where", [big, b.const(np.int64(0)), s], np.int64, shape)
        else:
            m1 = b.const(np.int64(-1))
            xs = b.op("Where", [neg, b.op("Sub", [m1, x], np.int64, shape), x], np.int64, shape)
            s = b.cast(b.op("BitShift", [b.cast(xs, udt), yc], udt, shape, direction="RIGHT"),
                       np.int64)
            r = b.op("Where", [neg, b.op("Sub", [m1, s], np.int64, shape), s], np.int64, shape)
        return b.cast(r, dt)
    conv.onnx = ("BitShift", "Cast", "Where")
    return conv


def _cumprod(b, out, inputs, params):
    """The running product along ``axis``: the axis moved last, each output
    position the ReduceProd of the inputs up to it (a [n, n] lower-triangle
    mask, Where to 1 elsewhere), the axis moved back. O(n^2) elements."""
    dt = _dt(out)
    x = b.cast(inputs[0], dt)
    if x.ndim == 0:
        return x
    axis = int(params["axis"]) % x.ndim
    perm = [i for i in range(x.ndim) if i != axis] + [axis]
    xt = b.op("Transpose", [x], dt, (), perm=perm) if axis != x.ndim - 1 else x
    n = b.dim(x, axis)
    r = b.op("Range", [b.const(np.int64(0)), n, b.const(np.int64(1))], np.int64, (0,))
    rows = b.op("Unsqueeze", [r, b.ints([1])], np.int64, (0, 1))
    cols = b.op("Unsqueeze", [r, b.ints([0])], np.int64, (1, 0))
    mask = b.op("LessOrEqual", [cols, rows], np.bool_, (0, 0))
    a = b.op("Unsqueeze", [xt, b.ints([x.ndim - 1])], dt, ())
    a = b.op("Where", [mask, a, b.const(np.asarray(1, dt))], dt, ())
    y = reduce_op(b, "ReduceProd", a, [x.ndim], False, dt, ())
    if axis != x.ndim - 1:
        inv = [perm.index(i) for i in range(x.ndim)]
        y = b.op("Transpose", [y], dt, (), perm=inv)
    return V(y.name, dt, out[0].shape)


_cumprod.onnx = ("Range", "Where", "ReduceProd", "Transpose")


def _nonzero(b, out, inputs, params):
    """NonZero (int64 [ndim, n]) of the value cast to bool, transposed to
    mgtrace's [n, ndim] (or its columns, ``as_tuple``)."""
    x = inputs[0]
    if x.ndim == 0:
        raise b.error("nonzero of a 0-d tensor has no ONNX form here")
    nz = b.op("NonZero", [b.cast(x, np.bool_)], np.int64, (x.ndim, 0))
    if params.get("as_tuple"):
        return [b.op("Squeeze", [b.op("Slice", [nz, b.ints([k]), b.ints([k + 1]), b.ints([0])],
                                      np.int64, (1, 0)), b.ints([0])], np.int64, o.shape)
                for k, o in zip(range(x.ndim), out)]
    return b.op("Transpose", [nz], np.int64, out[0].shape, perm=[1, 0])


_nonzero.onnx = ("NonZero", "Transpose")


def setitem_of(b, x, index, value):
    """``x[index] = value`` as a new value: the flat positions ``index``
    selects (the same index applied to a Range shaped like x, so every
    index getitem exports takes), then ScatterElements of value (broadcast
    to the selection) into the flattened x."""
    dt = x.dtype
    shape = b.shape_of(x)
    numel = reduce_op(b, "ReduceProd", shape, [0], False, np.int64, ())
    pos = b.op("Range", [b.const(np.int64(0)), numel, b.const(np.int64(1))], np.int64, (0,))
    pos = b.op("Reshape", [pos, shape], np.int64, x.shape)
    sel = getitem_of(b, pos, index, ())
    sel_shape = b.shape_of(sel)
    val = b.op("Expand", [b.operand(value, dt), sel_shape], dt, ())
    flat = b.ints([-1])
    y = b.op("ScatterElements", [b.op("Reshape", [x, flat], dt, (0,)),
                                 b.op("Reshape", [sel, flat], np.int64, (0,)),
                                 b.op("Reshape", [val, flat], dt, (0,))], dt, (0,), axis=0)
    return b.op("Reshape", [y, shape], dt, x.shape)


def _setitem(b, out, inputs, params):
    return setitem_of(b, inputs[0], inputs[1], inputs[2])


_setitem.onnx = ("Range", "Slice", "Gather", "Expand", "ScatterElements", "Reshape")


def _interpolate(b, out, inputs, params):
    """Resize: "nearest" as asymmetric coordinates floored (PyTorch's and
    mgtrace's source floor(dst * in / out)); "bilinear" as "linear" with
    half-pixel coordinates, or "align_corners". ``size`` gives the output
    size (a Sizes input: the batch and channels read at run time),
    ``scale_factor`` the Scales input (ONNX's output floor(in * scale), the
    factor mapping coordinates, as mgtrace)."""
    x = inputs[0]
    dt = _flt(_dt(out))
    x = b.cast(x, dt)
    mode = params.get("mode", "nearest")
    if mode == "nearest":
        attrs = dict(mode="nearest", coordinate_transformation_mode="asymmetric",
                     nearest_mode="floor")
    elif mode == "bilinear":
        attrs = dict(mode="linear", coordinate_transformation_mode="align_corners"
                     if params.get("align_corners") else "half_pixel")
    else:
        raise b.error(f"interpolate mode {mode!r} has no ONNX form here")
    size, factor = params.get("size"), params.get("scale_factor")
    if size is not None:
        oh, ow = _pair(size)
        sizes = b.shape_tensor([b.dim(x, 0), b.dim(x, 1), oh, ow])
        ins = [x, None, None, sizes]
    else:
        fh, fw = (float(f) for f in _pair(b.static(factor, "interpolate's scale_factor")))
        ins = [x, None, b.const(np.asarray([1, 1, fh, fw], np.float32))]
    return b.op("Resize", ins, dt, out[0].shape, **attrs)


_interpolate.onnx = ("Resize",)


def adaptive_of(b, x, size, reduce, name, shape):
    """Adaptive pooling to ``size`` where the output divides the input:
    equal windows of in / out (PyTorch's windows then coincide), read at
    run time: a Reshape to [N, C, oh, H / oh, ow, W / ow] reduced over the
    window axes. A size that does not divide the traced input is an
    ExportError (PyTorch's unequal windows have no ONNX pooling form); at
    run time such a size fails in the Reshape rather than giving other
    windows."""
    size = list(_pair(size))
    h, w = x.shape[2], x.shape[3]
    dims = []
    for i, (s, n) in enumerate(zip(size, (h, w))):
        if s is None:
            dims.append((b.dim(x, 2 + i), 1))
            continue
        s = int(s)
        if n % s:
            raise b.error(f"{name} from ({h}, {w}) to {tuple(size)}: the output does not "
                          f"divide the input, so PyTorch's windows differ in size, which "
                          f"ONNX pooling cannot express; only sizes that divide the input "
                          f"(equal windows) or (1, 1) export")
        dims.append((s, b.op("Div", [b.dim(x, 2 + i), b.const(np.int64(s))], np.int64, ())))
    (oh, kh), (ow, kw) = dims
    y = b.op("Reshape", [x, b.shape_tensor([b.dim(x, 0), b.dim(x, 1), oh, kh, ow, kw])],
             x.dtype, (0,) * 6)
    return reduce_op(b, reduce, y, [3, 5], False, x.dtype, shape)
