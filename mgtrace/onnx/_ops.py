"""ONNX ops as mgtrace calls: the importer's table (:data:`IMPORTERS`).

A value is an mgtrace Tensor (recorded by the tracer), a NumPy array (a
constant of the model, computed here at import), or a :class:`Dims` (an
int64 vector read from shapes: Python ints, symbolic while tracing). Ops
on constants and Dims compute in Python, so a ``Shape -> Gather -> Concat
-> Reshape`` chain becomes ``x.reshape(x.shape[0], -1)`` in the trace.
"""
import math

import numpy as np

import mgtrace as mt
import mgtrace.functional as F
from mgtrace.traced_module.symbolic import SymFloat, SymInt

SymNumber = (SymInt, SymFloat)

__all__ = ["IMPORTERS", "run_node", "Dims"]

_BIG = 2 ** 62


class Dims(tuple):
    """A 1-d int64 value made of shape entries (ints, SymInts while tracing)."""


def _err(node, msg):
    from mgtrace.onnx.importer import OnnxImportError
    return OnnxImportError(f"node {node.name or node.op_type!r} ({node.op_type}): {msg}")


def _attrs(node):
    from onnx import AttributeProto, TensorProto, helper
    for a in node.attribute:
        ts = [a.t] if a.type == AttributeProto.TENSOR else \
            list(a.tensors) if a.type == AttributeProto.TENSORS else []
        if any(t.data_location == TensorProto.EXTERNAL for t in ts):
            # onnx's to_array reads such data relative to the working folder:
            # a Constant could read any file there, past the folder checks
            raise _err(node, f"attribute {a.name!r} keeps its tensor's data outside the file "
                             f"(external data); mgtrace reads external data only for "
                             f"initializers, from the model's folder")
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _is_t(v):
    return isinstance(v, mt.Tensor)


def _static(v):
    return v is not None and not _is_t(v)


def _ints(node, v, what):
    """A static or Dims int vector as a tuple of ints / SymInts."""
    if v is None:
        return None
    if isinstance(v, Dims):
        return tuple(v)
    if _is_t(v):
        raise _err(node, f"{what} computed from tensor data at run time has no mgtrace form")
    return tuple(int(i) for i in np.asarray(v).reshape(-1))


def _scalar(v):
    """A 0-d / 1-element static as a Python number (tensors kept)."""
    if isinstance(v, np.ndarray) and v.size == 1:
        return v.reshape(()).item()
    return v


def _np(v):
    return np.asarray(v) if not isinstance(v, Dims) else v


def _dims_or_np(values, fn):
    """Elementwise arithmetic on Dims / Python numbers / constants."""
    if any(isinstance(v, Dims) for v in values):
        n = max(len(v) if isinstance(v, (Dims, np.ndarray)) and np.ndim(v) else 1
                for v in values)
        cols = [list(v) if isinstance(v, Dims) else
                [v.reshape(-1)[0].item()] * n if isinstance(v, np.ndarray) and v.size == 1 else
                [int(x) for x in v.reshape(-1)] if isinstance(v, np.ndarray) else [v] * n
                for v in values]
        cols = [c * n if len(c) == 1 else c for c in cols]
        return Dims(fn(*xs) for xs in zip(*cols))
    return fn(*values)


def _unary(fn):
    def run(node, ins, a, opset):
        if isinstance(ins[0], SymNumber) and fn is F.neg:
            return [-ins[0]]            # -x.shape[0] stays symbolic
        return [fn(_as_tensor(ins[0]))]
    return run


def _binary(fn, np_fn=None):
    def run(node, ins, a, opset):
        x, y = ins
        if _symbolic_scalars(x, y) and (np_fn is None or not _int_div_of(x, y, np_fn)):
            # a shape entry and a number: Python arithmetic, recorded by the trace
            # (np.ndim / np.asarray would freeze the traced size)
            return [fn(_operand(x), _operand(y))]
        if not _is_t(x) and not _is_t(y):
            if isinstance(x, Dims) or isinstance(y, Dims) or (np.ndim(x) == 0 and np.ndim(y) == 0
                                                              and np_fn is None):
                return [_dims_or_np([x, y], np_fn or fn)]
            return [(np_fn or fn)(np.asarray(x), np.asarray(y))]
        return [fn(_operand(x), _operand(y))]
    return run


def _symbolic_scalars(x, y):
    """Neither a tensor nor Dims, and at least one a SymInt/SymFloat."""
    def scalar(v):
        return isinstance(v, (int, float, SymNumber)) or isinstance(v, np.ndarray) and v.ndim == 0
    return (isinstance(x, SymNumber) or isinstance(y, SymNumber)) and scalar(x) and scalar(y)


def _int_div_of(x, y, np_fn):
    """An integer Div (ONNX truncates; Python's // floors) of something other
    than a shape entry by a positive number: not done symbolically. A shape
    entry (non-negative) by a positive number truncates and floors alike, so
    ``x[:, :x.shape[1] // 2]`` stays symbolic as ``//``."""
    def is_int(v):
        return isinstance(v, int) or isinstance(v, np.ndarray) and v.dtype.kind in "iu"
    if np_fn is _np_div and isinstance(x, SymInt) and is_int(y) and not isinstance(y, SymInt) \
            and int(np.asarray(y)) > 0:
        return False
    return np_fn is _np_div and is_int(x) and is_int(y)


def _operand(v):
    if isinstance(v, Dims):
        return mt.tensor(list(v)) if v else mt.tensor(np.zeros(0, np.int64))
    if isinstance(v, np.ndarray) and v.ndim == 0:
        return v.item() if v.dtype.kind != "b" else bool(v)
    if isinstance(v, np.ndarray):
        return mt.tensor(v)         # a constant operand (the trace keeps it as one)
    return v


def _div(x, y):
    if isinstance(x, SymInt) and not _is_t(y):
        return x // _operand(y)         # see _int_div_of: a size by a positive number
    if _is_t(x) and x.dtype.kind in "iu" or isinstance(x, int) and _is_t(y) and \
            y.dtype.kind in "iu":
        q = F.floor_div(F.abs(x), F.abs(y))
        return q * F.sign(x) * F.sign(y)            # ONNX Div truncates integers
    return x / y


def _np_div(x, y):
    if np.asarray(x).dtype.kind in "iu":
        return (np.trunc(np.asarray(x) / np.asarray(y))).astype(np.asarray(x).dtype)
    return np.asarray(x) / np.asarray(y)


def _int_div(x, y):
    return int(x / y) if not hasattr(x, "__index__") or not hasattr(y, "__index__") \
        else x // y


def _cast(node, ins, a, opset):
    from onnx import helper
    dt = np.dtype(helper.tensor_dtype_to_np_dtype(a["to"]))
    x = ins[0]
    if isinstance(x, Dims):
        return [x if dt.kind in "iu" else np.asarray(x, dt)]
    if isinstance(x, SymInt) and dt.kind in "iuf":
        # a shape entry (Shape -> Gather) cast for arithmetic, as in x * x.shape[0]:
        # stay symbolic, or the import freezes the traced batch size
        return [x if dt.kind in "iu" else x * 1.0]
    if not _is_t(x):
        return [np.asarray(x).astype(dt)]
    if dt == np.uint32:
        # mgtrace has no uint32: its values (what BitShift reads) held as int64
        return [x.astype("int64") & 0xFFFFFFFF]
    if dt == np.uint64:
        raise _err(node, "a cast to uint64 has no mgtrace form (no uint64 dtype)")
    return [x.astype(dt.name)]


def _bitshift(node, ins, a, opset):
    """BitShift of unsigned values (uint8/uint16, or uint32 held as int64 by
    Cast): a left shift's bits above the width are dropped by the Cast that
    reads the result, a right shift of a non-negative value is logical."""
    x, y = (_as_tensor(v) for v in ins)
    left = a.get("direction", b"") in (b"LEFT", "LEFT")
    if x.dtype.kind == "u":         # uint8/uint16: the shifted bits kept to the width
        bits = x.dtype.itemsize * 8
        z = x.astype("int64")
        z = F.left_shift(z, y.astype("int64")) if left else F.right_shift(z, y.astype("int64"))
        return [(z & ((1 << bits) - 1)).astype(x.dtype.name)]
    x, y = x.astype("int64"), y.astype("int64")
    return [F.left_shift(x, y) if left else F.right_shift(x, y)]


def _shape(node, ins, a, opset):
    x = ins[0]
    s = tuple(x.shape) if _is_t(x) else np.shape(x)
    start, end = a.get("start", 0), a.get("end", None)
    return [Dims(s[start:end])]


def _gather(node, ins, a, opset):
    x, idx = ins
    axis = a.get("axis", 0)
    if isinstance(x, Dims) and _static(idx):
        i = np.asarray(idx)
        if i.ndim == 0:
            return [x[int(i)]]
        return [Dims(x[int(k)] for k in i.reshape(-1))]
    if not _is_t(x) and not _is_t(idx):
        return [np.take(np.asarray(x), np.asarray(idx), axis=axis)]
    if _is_t(x):
        nd = x.ndim
        axis %= nd
        if _static(idx) and np.ndim(idx) == 0:
            return [x[(slice(None),) * axis + (int(np.asarray(idx)),)]]
        if axis == 0 and x.ndim == 2:
            return [F.embedding(_as_tensor(idx), x)]
        return [x[(slice(None),) * axis + (_as_tensor(idx),)]]
    raise _err(node, "Gather of a constant by a tensor index")


def _as_tensor(v):
    if _is_t(v):
        return v
    return mt.tensor(np.asarray(list(v) if isinstance(v, Dims) else v))


def _unsqueeze(node, ins, a, opset):
    x = ins[0]
    axes = a.get("axes") if opset < 13 else _ints(node, ins[1], "axes")
    if not _is_t(x):
        # a SymInt first: np.ndim would int() it (a spurious TraceWarning at the load call)
        if isinstance(x, (Dims, SymInt)) or np.ndim(x) == 0 and not isinstance(x, np.ndarray):
            if axes in ((0,), (-1,)) and not isinstance(x, Dims):
                return [Dims([x])]
        if isinstance(x, Dims):
            return [np.expand_dims(np.asarray(x, object), axes)]
        return [np.expand_dims(np.asarray(x), tuple(axes))]
    nd = x.ndim + len(axes)
    return [F.expand_dims(x, tuple(sorted(int(i) % nd for i in axes)))]


def _squeeze(node, ins, a, opset):
    x = ins[0]
    axes = a.get("axes") if opset < 13 else _ints(node, ins[1] if len(ins) > 1 else None,
                                                  "axes")
    if isinstance(x, Dims) and len(x) == 1:
        return [x[0]]
    if not _is_t(x):
        return [np.squeeze(np.asarray(x), None if axes is None else tuple(axes))]
    if axes is None:
        return [F.squeeze(x)]
    return [F.squeeze(x, tuple(int(i) % x.ndim for i in axes))]


def _concat(node, ins, a, opset):
    axis = a["axis"]
    if all(not _is_t(v) for v in ins) and any(isinstance(v, Dims) for v in ins):
        out = []
        for v in ins:
            out += list(v) if isinstance(v, Dims) else [int(i) for i in np.asarray(v).reshape(-1)]
        return [Dims(out)]
    if all(not _is_t(v) for v in ins):
        return [np.concatenate([np.asarray(v) for v in ins], axis)]
    ts = [_as_tensor(v) for v in ins]
    dt = np.result_type(*[t.dtype for t in ts])
    return [F.concat([t if t.dtype == dt else t.astype(dt.name) for t in ts], axis)]


def _reshape(node, ins, a, opset):
    x = ins[0]
    shape = list(_ints(node, ins[1], "the shape"))
    if not a.get("allowzero", 0):
        for i, s in enumerate(shape):
            if isinstance(s, int) and not hasattr(s, "_sym") and s == 0 and type(s) is int:
                shape[i] = x.shape[i] if _is_t(x) else np.shape(x)[i]
    if not _is_t(x):
        return [np.reshape(np.asarray(x), [int(s) for s in shape])]
    return [x.reshape(tuple(shape))]


def _slice(node, ins, a, opset):
    x = ins[0]
    if opset < 10:
        starts, ends, axes, steps = a["starts"], a["ends"], a.get("axes"), None
    else:
        starts, ends = _ints(node, ins[1], "starts"), _ints(node, ins[2], "ends")
        axes = _ints(node, ins[3], "axes") if len(ins) > 3 else None
        steps = _ints(node, ins[4], "steps") if len(ins) > 4 else None
    nd = x.ndim if _is_t(x) else (1 if isinstance(x, Dims) else np.ndim(x))
    axes = axes if axes is not None else tuple(range(len(starts)))
    steps = steps if steps is not None else (1,) * len(starts)
    index = [slice(None)] * nd
    for st, en, ax, sp in zip(starts, ends, axes, steps):
        def clip(v):
            return None if isinstance(v, int) and type(v) is int and abs(v) >= _BIG else v
        index[int(ax) % nd] = slice(clip(st), clip(en), int(sp))
    if isinstance(x, Dims):
        return [Dims(x[index[0]])]
    if not _is_t(x):
        return [np.asarray(x)[tuple(index)]]
    return [x[tuple(index)]]


def _expand(node, ins, a, opset):
    """ONNX Expand (broadcast both ways): a target dim of 1 keeps x's."""
    x = ins[0]
    shape = list(_ints(node, ins[1], "the shape"))
    xs = list(x.shape) if _is_t(x) else list(np.shape(x))
    nd = max(len(shape), len(xs))
    shape = [1] * (nd - len(shape)) + shape
    xs = [1] * (nd - len(xs)) + xs
    target = tuple(t if type(s) is int and s == 1 else s for s, t in zip(shape, xs))
    if not _is_t(x):
        if all(type(t) is int for t in target):
            return [np.broadcast_to(np.asarray(x), target).copy()]
        arr = np.asarray(x)
        if arr.size == 1:
            return [F.full(target, arr.reshape(-1)[0].item(), dtype=arr.dtype.name)]
        x = mt.tensor(arr)
    return [F.broadcast_to(x, target)]


def _reduce(fn_name, np_fn):
    def run(node, ins, a, opset):
        x = ins[0]
        axes = a.get("axes")
        if len(ins) > 1 and ins[1] is not None:
            axes = _ints(node, ins[1], "axes")
        keep = bool(a.get("keepdims", 1))
        if not axes:
            if a.get("noop_with_empty_axes", 0):
                return [x]
            axes = None
        else:
            axes = tuple(int(i) for i in axes)
        if not _is_t(x):
            return [np_fn(np.asarray(x), axis=axes, keepdims=keep)]
        if fn_name == "l2":
            return [F.norm(x, 2, axes, keep)]
        if fn_name == "l1":
            return [F.sum(F.abs(x), axes, keep)]
        return [getattr(F, fn_name)(x, axes, keep)]
    return run


def _arg(fn_name):
    def run(node, ins, a, opset):
        y = getattr(F, fn_name)(ins[0], a.get("axis", 0), bool(a.get("keepdims", 1)))
        return [y.astype("int64")]
    return run


def _softmax(fn):
    def run(node, ins, a, opset):
        axis = a.get("axis", -1 if opset >= 13 else 1)
        if opset < 13 and axis % ins[0].ndim != ins[0].ndim - 1:
            raise _err(node, "Softmax before opset 13 (2-d coercion) over a non-last axis")
        return [fn(ins[0], axis)]
    return run


def _pads2(node, pads, n=2):
    pads = list(pads or [0] * (2 * n))
    if pads[:n] != pads[n:]:
        raise _err(node, f"asymmetric pads {pads} have no mgtrace form")
    return tuple(pads[:n])


def _auto_pad(node, a):
    if a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET", b"VALID", "VALID"):
        raise _err(node, f"auto_pad={a['auto_pad']!r} has no mgtrace form; export with "
                         f"explicit pads")


def _kernel_matches(node, a, w):
    """ONNX's kernel_shape, where given, must be the weight's spatial shape."""
    ks = a.get("kernel_shape")
    have = _known(w.shape[2:])
    if ks is not None and have is not None and [int(k) for k in ks] != have:
        raise _err(node, f"kernel_shape {list(ks)} contradicts the weight's spatial shape "
                         f"{have}")


def _conv(node, ins, a, opset):
    _auto_pad(node, a)
    x, w = ins[0], ins[1]
    _kernel_matches(node, a, w)
    b = ins[2] if len(ins) > 2 else None
    k = len(w.shape) - 2
    if k == 1:
        return [F.conv1d(x, w, b, a.get("strides", [1])[0], _pads2(node, a.get("pads"), 1)[0],
                         a.get("dilations", [1])[0], a.get("group", 1))]
    if k == 3:
        return [F.conv3d(x, w, b, tuple(a.get("strides", (1,) * 3)),
                         _pads2(node, a.get("pads"), 3), tuple(a.get("dilations", (1,) * 3)),
                         a.get("group", 1))]
    if k != 2:
        raise _err(node, f"a {k}-d convolution has no mgtrace form")
    return [F.conv2d(x, w, b, tuple(a.get("strides", (1, 1))), _pads2(node, a.get("pads")),
                     tuple(a.get("dilations", (1, 1))), a.get("group", 1))]


def _conv_t(node, ins, a, opset):
    _auto_pad(node, a)
    x, w = ins[0], ins[1]
    _kernel_matches(node, a, w)
    b = ins[2] if len(ins) > 2 else None
    if "output_shape" in a:
        raise _err(node, "ConvTranspose with output_shape has no mgtrace form")
    if len(w.shape) == 5:
        return [F.conv_transpose3d(x, w, b, tuple(a.get("strides", (1,) * 3)),
                                   _pads2(node, a.get("pads"), 3),
                                   tuple(a.get("output_padding", (0,) * 3)),
                                   tuple(a.get("dilations", (1,) * 3)), a.get("group", 1))]
    return [F.conv_transpose2d(x, w, b, tuple(a.get("strides", (1, 1))),
                               _pads2(node, a.get("pads")),
                               tuple(a.get("output_padding", (0, 0))),
                               tuple(a.get("dilations", (1, 1))), a.get("group", 1))]


def _pool(node, ins, a, opset, avg):
    _auto_pad(node, a)
    ks = tuple(a["kernel_shape"])
    if len(ks) != 2:
        raise _err(node, f"a {len(ks)}-d pool has no mgtrace form")
    st, pd = tuple(a.get("strides", (1, 1))), _pads2(node, a.get("pads"))
    ceil = bool(a.get("ceil_mode", 0))
    if avg:
        mode = "average" if a.get("count_include_pad", 0) else "average_count_exclude_padding"
        return [F.avg_pool2d(ins[0], ks, st, pd, mode, ceil)]
    if len(node.output) > 1 and node.output[1]:
        raise _err(node, "MaxPool's indices output has no mgtrace form")
    return [F.max_pool2d(ins[0], ks, st, pd, tuple(a.get("dilations", (1, 1))), ceil)]


def _batch_norm(node, ins, a, opset):
    if a.get("training_mode", 0):
        raise _err(node, "BatchNormalization in training mode")
    x, w, b, mean, var = ins[:5]
    return [F.batch_norm(x, mean, var, w, b, training=False, eps=a.get("epsilon", 1e-5))]


def _layer_norm(node, ins, a, opset):
    x, w = ins[0], ins[1]
    b = ins[2] if len(ins) > 2 else None
    axis = a.get("axis", -1) % x.ndim
    if len(node.output) > 1 and any(node.output[1:]):
        raise _err(node, "LayerNormalization's mean / inv_std outputs have no mgtrace form")
    return [F.layer_norm(x, tuple(w.shape)[-(x.ndim - axis):], w, b, a.get("epsilon", 1e-5))]


def _gemm(node, ins, a, opset):
    x, w = ins[0], ins[1]
    c = ins[2] if len(ins) > 2 else None
    y = F.matmul(x, w, transpose_a=bool(a.get("transA", 0)), transpose_b=bool(a.get("transB", 0)))
    if a.get("alpha", 1.0) != 1.0:
        y = y * a["alpha"]
    if c is not None:
        beta = a.get("beta", 1.0)
        y = y + (c if beta == 1.0 else c * beta)
    return [y]


def _clip(node, ins, a, opset):
    lo = _scalar(ins[1]) if len(ins) > 1 else a.get("min")
    hi = _scalar(ins[2]) if len(ins) > 2 else a.get("max")
    return [F.clip(ins[0], lo, hi)]


def _pad(node, ins, a, opset):
    x = ins[0]
    pads = _ints(node, ins[1], "pads") if opset >= 11 else a["pads"]
    value = _scalar(ins[2]) if len(ins) > 2 and ins[2] is not None else a.get("value", 0.0)
    if len(ins) > 3 and ins[3] is not None:
        raise _err(node, "Pad with axes has no mgtrace form")
    n = len(pads) // 2
    mode = a.get("mode", b"constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    width = tuple((pads[i], pads[i + n]) for i in range(n))
    mode = {"constant": "constant", "reflect": "reflect", "edge": "edge"}.get(mode)
    if mode is None:
        raise _err(node, f"Pad mode {a.get('mode')!r} has no mgtrace form")
    return [F.pad(x, width, mode, value or 0.0)]


def _resize(node, ins, a, opset):
    """Resize of the forms mgtrace's interpolate has: "nearest" with
    asymmetric coordinates floored, "linear" with half-pixel (or
    pytorch_half_pixel, the same for outputs above 1) or align_corners
    coordinates; 4-d, the two last axes only."""
    def attr(k, d):
        v = a.get(k, d)
        return v.decode() if isinstance(v, bytes) else v
    x = ins[0]
    if x.ndim != 4:
        raise _err(node, f"a Resize of a {x.ndim}-d tensor has no mgtrace form")
    mode, ctm = attr("mode", "nearest"), attr("coordinate_transformation_mode", "half_pixel")
    if mode == "nearest":
        if ctm != "asymmetric" or attr("nearest_mode", "round_prefer_floor") != "floor":
            raise _err(node, f"nearest Resize with {ctm!r} coordinates and nearest_mode "
                             f"{attr('nearest_mode', 'round_prefer_floor')!r} has no mgtrace "
                             f"form (asymmetric and floor import)")
        kw = {"mode": "nearest"}
    elif mode == "linear":
        if ctm not in ("half_pixel", "pytorch_half_pixel", "align_corners"):
            raise _err(node, f"linear Resize with {ctm!r} coordinates has no mgtrace form")
        kw = {"mode": "bilinear", "align_corners": ctm == "align_corners"}
    else:
        raise _err(node, f"Resize mode {mode!r} has no mgtrace form")
    if a.get("antialias", 0) or attr("keep_aspect_ratio_policy", "stretch") != "stretch" or \
            a.get("axes") is not None or attr("exclude_outside", 0):
        raise _err(node, "Resize with antialias, axes, exclude_outside or an aspect-ratio "
                         "policy has no mgtrace form")
    scales = ins[2] if len(ins) > 2 else None
    sizes = ins[3] if len(ins) > 3 else None
    if sizes is not None and (not isinstance(sizes, np.ndarray) or sizes.size):
        hw = _ints(node, sizes, "sizes")[2:]
        return [F.interpolate(x, size=tuple(hw), **kw)]
    f = [float(v) for v in np.asarray(scales).reshape(-1)]
    if f[:2] != [1.0, 1.0]:
        raise _err(node, f"Resize scaling the batch or channel axes ({f}) has no mgtrace form")
    return [F.interpolate(x, scale_factor=(f[2], f[3]), **kw)]


def _depth_to_space(node, ins, a, opset):
    x = ins[0]
    r = int(a["blocksize"])
    mode = a.get("mode", b"DCR")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if mode == "CRD":
        return [F.pixel_shuffle(x, r)]
    n, c, h, w = x.shape
    y = x.reshape(n, r, r, c // (r * r), h, w).transpose(0, 3, 4, 1, 5, 2)
    return [y.reshape(n, c // (r * r), h * r, w * r)]


def _lrn(node, ins, a, opset):
    n = int(a["size"])
    if n % 2 == 0:
        raise _err(node, f"LRN of an even size {n} has no mgtrace form (odd sizes import)")
    return [F.local_response_norm(ins[0], n, a.get("bias", 1.0), a.get("alpha", 1e-4) / n,
                                  a.get("beta", 0.75))]


def _hardsigmoid(node, ins, a, opset):
    alpha, beta = a.get("alpha", 0.2), a.get("beta", 0.5)
    if abs(alpha - 1 / 6) < 1e-7 and beta == 0.5:
        return [F.hardsigmoid(ins[0])]
    return [F.clip(ins[0] * alpha + beta, 0.0, 1.0)]


def _where(node, ins, a, opset):
    c, x, y = ins
    if not any(_is_t(v) for v in ins):
        return [np.where(_np(c), _np(x), _np(y))]
    return [F.where(_as_tensor(c).astype("bool") if not _is_t(c) else c, _operand(x),
                    _operand(y))]


def _split(node, ins, a, opset):
    x = ins[0]
    axis = a.get("axis", 0) % x.ndim
    sizes = _ints(node, ins[1], "split") if len(ins) > 1 and ins[1] is not None else a.get("split")
    n = len(node.output)
    if sizes is None:
        return list(F.split(x, n, axis))
    dim = x.shape[axis]
    if len(sizes) != n or any(isinstance(v, int) and v < 0 for v in sizes) or (
            isinstance(dim, int) and all(isinstance(v, int) for v in sizes) and
            int(sum(sizes)) != int(dim)):      # SymInts: their traced values
        # sizes [2^62] on an axis of 2 returned the whole value as the one piece
        raise _err(node, f"split sizes {list(sizes)} do not cut axis {axis} of size {dim} "
                         f"into its {n} outputs")
    points = list(np.cumsum(sizes)[:-1])
    return list(F.split(x, [int(p) for p in points], axis))


def _range(node, ins, a, opset):
    start, limit, delta = (_scalar(v) for v in ins)
    if not any(_is_t(v) for v in (start, limit, delta)):
        if any(hasattr(v, "__index__") and type(v) is not int for v in (start, limit, delta)):
            return [F.arange(start, limit, delta)]
        return [np.arange(start, limit, delta)]
    raise _err(node, "Range with tensor bounds")


def _constant_of_shape(node, ins, a, opset):
    from onnx import numpy_helper
    value = numpy_helper.to_array(a["value"]) if "value" in a else np.zeros(1, np.float32)
    shape = _ints(node, ins[0], "the shape")
    if all(type(s) is int for s in shape):
        return [np.full(shape, value.reshape(-1)[0], value.dtype)]
    return [F.full(shape, value.reshape(-1)[0].item(), dtype=value.dtype.name)]


def _constant(node, ins, a, opset):
    from onnx import numpy_helper
    if "value" in a:
        return [numpy_helper.to_array(a["value"])]
    for k, dt in (("value_float", np.float32), ("value_int", np.int64)):
        if k in a:
            return [np.asarray(a[k], dt)]
    for k, dt in (("value_floats", np.float32), ("value_ints", np.int64)):
        if k in a:
            return [np.asarray(a[k], dt)]
    raise _err(node, f"Constant with {sorted(a)} has no mgtrace form")


def _topk(node, ins, a, opset):
    x = ins[0]
    k = _scalar(ins[1]) if not isinstance(ins[1], Dims) else ins[1][0]
    axis = a.get("axis", -1) % x.ndim
    if axis != x.ndim - 1:
        raise _err(node, "TopK over an axis other than the last")
    dim = x.shape[axis]
    if isinstance(k, (int, np.integer)):
        if k < 0 or isinstance(dim, int) and int(k) > int(dim):
            # ONNX Runtime refuses it; slicing returned the whole axis
            raise _err(node, f"k = {int(k)} is outside 0..{dim} (the size of axis {axis})")
    largest = bool(a.get("largest", 1))
    vals, idx = F.sort(x, descending=largest)
    index = (slice(None),) * axis + (slice(0, k),)
    return [vals[index], idx[index].astype("int64")]


def _flatten(node, ins, a, opset):
    x = ins[0]
    axis = a.get("axis", 1) % (x.ndim + 1) if x.ndim else 0
    if axis == 0:
        return [x.reshape(1, -1)]
    if axis == 1:
        return [F.flatten(x, 1)] if x.ndim > 1 else [x.reshape(x.shape[0], 1)]
    lead = 1
    for s in x.shape[:axis]:
        lead = lead * s
    return [x.reshape(lead, -1)]


def _mod(node, ins, a, opset):
    x, y = ins
    if _symbolic_scalars(x, y):
        # a shape entry mod a number (x[:, :x.shape[1] % 4]): Python's %, kept
        # symbolic; ONNX's integer Mod takes the divisor's sign as Python's, and
        # fmod's truncation agrees with it for the non-negative sizes of shapes
        return [_operand(x) % _operand(y)]
    if not _is_t(x) and not _is_t(y):
        x, y = np.asarray(list(x) if isinstance(x, Dims) else x), \
            np.asarray(list(y) if isinstance(y, Dims) else y)
        return [np.fmod(x, y) if a.get("fmod", 0) else np.mod(x, y)]
    if a.get("fmod", 0):
        return [x - F.trunc(x / y) * y if x.dtype.kind == "f" else
                x - _div(x, y) * y]
    return [x % y]


def _sum_n(fn):
    def run(node, ins, a, opset):
        y = _operand(ins[0])
        for v in ins[1:]:
            y = fn(y, _operand(v))
        return [y]
    return run


def _compress(node, ins, a, opset):
    x, c = _as_tensor(ins[0]), _as_tensor(ins[1])
    if "axis" not in a:
        x = x.reshape(-1)
    elif a["axis"] % x.ndim != 0 or x.ndim != 1:
        raise _err(node, "Compress along an axis of a tensor of more than one axis has no "
                         "mgtrace form (1-d and flattened import)")
    return [F.cond_take(c.astype("bool"), x)[0]]


_QRANGE = {np.dtype(np.int8): (-128, 127), np.dtype(np.uint8): (0, 255)}


def _q_params(node, x, scale, zp, a, opset, dequantize=False):
    """(scale, zero point, output dtype, broadcast shape) of a Quantize /
    DequantizeLinear: per-tensor (scalar scale) or per-axis (1-d scale along
    ``axis``); int8 / uint8 zero points only (plain int8/uint8 tensors)."""
    if a.get("block_size", 0):
        raise _err(node, "blocked quantization (block_size) has no mgtrace form")
    zdt = np.dtype(np.uint8) if zp is None else np.dtype(
        zp.dtype if not _is_t(zp) else zp.dtype)
    if "output_dtype" in a and a["output_dtype"]:
        from onnx import helper
        zdt = np.dtype(helper.tensor_dtype_to_np_dtype(a["output_dtype"]))
    if zdt not in _QRANGE and not (dequantize and zdt == np.int32):
        raise _err(node, f"quantization to {zdt} has no mgtrace form (int8 and uint8 import; "
                         f"int32 too where dequantized: a bias)")
    sshape = tuple(scale.shape)
    nd = x.ndim if _is_t(x) else np.ndim(x)
    if len(sshape) == 0 or sshape == (1,):
        shape = None
    elif len(sshape) == 1:
        axis = a.get("axis", 1) % max(nd, 1)
        shape = tuple(sshape[0] if i == axis else 1 for i in range(nd))
    else:
        raise _err(node, f"a scale of shape {list(sshape)} (blocked) has no mgtrace form")
    return zdt, shape


def _q_operand(v, shape, dt):
    """A scale / zero point as a tensor (or number) that broadcasts over x."""
    if v is None:
        return 0
    if not _is_t(v):
        v = np.asarray(v)
        if shape is None:
            return v.reshape(-1)[0].item()
        return mt.tensor(v.astype(dt).reshape(shape))
    v = v.astype(dt)
    return v.reshape(shape) if shape is not None else v.reshape(())


def _quantize(node, ins, a, opset):
    """QuantizeLinear: saturate(round(x / scale) + zero_point), rounding half
    to even (ONNX's rule, mgtrace's round), as core ops on a plain int8 /
    uint8 tensor."""
    x, scale = ins[0], ins[1]
    zp = ins[2] if len(ins) > 2 else None
    zdt, shape = _q_params(node, x, scale, zp, a, opset)
    lo, hi = _QRANGE[zdt]
    x = _as_tensor(x)
    y = F.round(x.astype("float32") / _q_operand(scale, shape, "float32"))
    y = y + _q_operand(zp, shape, "float32")
    return [F.clip(y, float(lo), float(hi)).astype(zdt.name)]


def _dequantize(node, ins, a, opset):
    """DequantizeLinear: (x - zero_point) * scale, in float32."""
    x, scale = ins[0], ins[1]
    zp = ins[2] if len(ins) > 2 else None
    if zp is None:
        zp = np.zeros((), x.dtype if not _is_t(x) else x.dtype)
    _q_params(node, x, scale, zp, a, opset, dequantize=True)
    xdt = np.dtype(x.dtype)
    if xdt not in _QRANGE and xdt != np.int32:
        raise _err(node, f"dequantization of {xdt} has no mgtrace form (int8, uint8, int32)")
    sshape = tuple(scale.shape)
    nd = x.ndim if _is_t(x) else np.ndim(x)
    shape = None if len(sshape) == 0 or sshape == (1,) else tuple(
        sshape[0] if i == a.get("axis", 1) % max(nd, 1) else 1 for i in range(nd))
    if not _is_t(x) and not _is_t(scale) and not _is_t(zp):
        # a quantized weight: dequantized once, here (a float constant of the model)
        s = np.asarray(scale, np.float32).reshape(shape or ())
        z = np.asarray(zp).astype(np.int32).reshape(shape or ())
        return [((np.asarray(x).astype(np.int32) - z).astype(np.float32) * s)]
    x = _as_tensor(x).astype("int32")
    d = (x - _q_operand(zp, shape, "int32")).astype("float32")
    return [d * _q_operand(scale, shape, "float32")]


def _zp_shift(v, zp, axis_len=None, axis=None, nd=None):
    """``v - zp`` in int32 (a per-row / per-channel zero point reshaped to
    broadcast along ``axis`` of an ``nd``-d value)."""
    v = _as_tensor(v).astype("int32")
    if zp is None:
        return v
    z = np.asarray(zp) if not _is_t(zp) else zp
    if not _is_t(z) and z.size == 1:
        return v - int(z.reshape(-1)[0])
    z = _as_tensor(z).astype("int32")
    if axis is not None:
        z = z.reshape(tuple(-1 if i == axis else 1 for i in range(nd)))
    return v - z


def _int_conv(node, x, w, a):
    """The int32 sums of an integer convolution, exact: computed in float64
    (every product and sum of int8/uint8 operands below 2^53) and cast."""
    _auto_pad(node, a)
    _kernel_matches(node, a, w)
    if len(w.shape) != 4:
        raise _err(node, f"a {len(w.shape) - 2}-d integer convolution has no mgtrace form")
    y = F.conv2d(x.astype("float64"), w.astype("float64"), None,
                 tuple(a.get("strides", (1, 1))), _pads2(node, a.get("pads")),
                 tuple(a.get("dilations", (1, 1))), a.get("group", 1))
    return y.astype("int32")


def _int_matmul(x, w):
    return F.matmul(x, w)           # int32 operands: mgtrace's exact int32 matmul


def _requantize(node, acc, scale, y_scale, y_zp, channel_axis, nd):
    """ONNX Runtime's requantization of int32 sums: times the float32
    multiplier ``scale / y_scale``, rounded half to even, plus the output zero
    point, saturated to its type."""
    zdt = np.dtype(np.uint8) if y_zp is None else np.dtype(y_zp.dtype)
    if zdt not in _QRANGE:
        raise _err(node, f"an output of {zdt} has no mgtrace form (int8 and uint8 import)")
    lo, hi = _QRANGE[zdt]
    # float32 throughout, in ORT's order: x_scale * w_scale / y_scale
    m = (scale / _as_tensor(y_scale).astype("float32").reshape(())).reshape(
        tuple(-1 if i == channel_axis else 1 for i in range(nd)))
    y = F.round(acc.astype("float32") * m)
    if y_zp is not None:
        y = y + float(np.asarray(y_zp).reshape(-1)[0])
    return F.clip(y, float(lo), float(hi)).astype(zdt.name)


def _constant_only(node, v, what):
    if _is_t(v):
        raise _err(node, f"{what} computed at run time has no mgtrace form here (a constant "
                         f"of the model imports)")
    return v


def _scales(xs, ws):
    """x_scale * w_scale (per tensor or per output channel) as a float32 tensor."""
    return _as_tensor(xs).astype("float32").reshape(()) * \
        _as_tensor(ws).astype("float32").reshape(-1)


def _conv_integer(node, ins, a, opset):
    x, w = ins[0], ins[1]
    xz = ins[2] if len(ins) > 2 else None
    wz = ins[3] if len(ins) > 3 else None
    return [_int_conv(node, _zp_shift(x, xz), _zp_shift(w, wz, axis=0, nd=4), a)]


def _matmul_integer(node, ins, a, opset):
    x, w = ins[0], ins[1]
    xz = ins[2] if len(ins) > 2 else None
    wz = ins[3] if len(ins) > 3 else None
    wt = _as_tensor(w)
    return [_int_matmul(_zp_shift(x, xz), _zp_shift(wt, wz, axis=wt.ndim - 1, nd=wt.ndim))]


def _qlinear_conv(node, ins, a, opset):
    x, xs, xz, w, ws, wz, ys, yz = ins[:8]
    bias = ins[8] if len(ins) > 8 else None
    _constant_only(node, yz, "y_zero_point")
    acc = _int_conv(node, _zp_shift(x, xz), _zp_shift(w, wz, axis=0, nd=4), a)
    if bias is not None:
        acc = acc + _as_tensor(bias).astype("int32").reshape(1, -1, 1, 1)
    return [_requantize(node, acc, _scales(xs, ws), ys, yz, 1, 4)]


def _qlinear_matmul(node, ins, a, opset):
    x, xs, xz, w, ws, wz, ys, yz = ins[:8]
    _constant_only(node, yz, "y_zero_point")
    wt = _as_tensor(w)
    acc = _int_matmul(_zp_shift(x, xz), _zp_shift(wt, wz, axis=wt.ndim - 1, nd=wt.ndim))
    return [_requantize(node, acc, _scales(xs, ws), ys, yz, acc.ndim - 1, acc.ndim)]


def _identity(node, ins, a, opset):
    return [ins[0]] + [None] * (len(node.output) - 1)


def _pow(x, y):
    if isinstance(x, SymNumber) and not _is_t(y):
        return x ** y
    if _is_t(x) and x.dtype.kind == "f" and not _is_t(y):
        return x ** y
    return F.pow(x, y)


IMPORTERS = {
    # elementwise
    "Add": _binary(lambda x, y: x + y), "Sub": _binary(lambda x, y: x - y),
    "Mul": _binary(lambda x, y: x * y), "Div": _binary(_div, _np_div),
    "Pow": _binary(_pow, np.power), "Max": _sum_n(F.maximum), "Min": _sum_n(F.minimum),
    "Sum": _sum_n(lambda x, y: x + y),
    "Equal": _binary(F.equal, np.equal), "Less": _binary(F.less, np.less),
    "LessOrEqual": _binary(F.less_equal, np.less_equal),
    "Greater": _binary(F.greater, np.greater),
    "GreaterOrEqual": _binary(F.greater_equal, np.greater_equal),
    "And": _binary(F.logical_and, np.logical_and), "Or": _binary(F.logical_or, np.logical_or),
    "Xor": _binary(F.logical_xor, np.logical_xor), "Mod": _mod,
    "Where": _where,
    "BitwiseAnd": _binary(lambda x, y: x & y, np.bitwise_and),
    "BitwiseOr": _binary(lambda x, y: x | y, np.bitwise_or),
    "BitwiseXor": _binary(lambda x, y: x ^ y, np.bitwise_xor),
    "BitwiseNot": _unary(lambda x: ~x),
    **{k: _unary(getattr(F, v)) for k, v in {
        "Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Exp": "exp", "Log": "log",
        "Sqrt": "sqrt", "Neg": "neg", "Abs": "abs", "Erf": "erf", "Floor": "floor",
        "Ceil": "ceil", "Round": "round", "Sign": "sign", "Sin": "sin", "Cos": "cos",
        "Tan": "tan", "Asin": "asin", "Acos": "acos", "Atan": "atan", "Softplus": "softplus",
        "HardSwish": "hardswish", "IsNaN": "isnan", "IsInf": "isinf",
        "Not": "logical_not"}.items()},
    "Reciprocal": _unary(lambda x: 1.0 / x),
    "HardSigmoid": _hardsigmoid,
    "Gelu": lambda node, ins, a, opset: [F.gelu(ins[0], "tanh" if a.get(
        "approximate", b"none") in (b"tanh", "tanh") else "none")],
    "LeakyRelu": lambda node, ins, a, opset: [F.leaky_relu(ins[0], a.get("alpha", 0.01))],
    "Clip": _clip,
    # shapes and views
    "Shape": _shape, "Gather": _gather, "Unsqueeze": _unsqueeze, "Squeeze": _squeeze,
    "Concat": _concat, "Reshape": _reshape, "Slice": _slice, "Expand": _expand,
    "Transpose": lambda node, ins, a, opset: [ins[0].transpose(
        tuple(a["perm"]) if "perm" in a else tuple(reversed(range(ins[0].ndim))))],
    "Flatten": _flatten, "Cast": _cast, "Identity": _identity, "Dropout": _identity,
    "Constant": _constant, "ConstantOfShape": _constant_of_shape, "Range": _range,
    "Split": _split, "Tile": lambda node, ins, a, opset: [F.tile(ins[0], _ints(
        node, ins[1], "repeats"))],
    "GatherElements": lambda node, ins, a, opset: [F.gather(ins[0], a.get("axis", 0),
                                                            ins[1])],
    "ScatterElements": lambda node, ins, a, opset: [F.scatter(ins[0], a.get("axis", 0),
                                                              ins[1], ins[2])],
    # reductions
    "ReduceSum": _reduce("sum", np.sum), "ReduceMean": _reduce("mean", np.mean),
    "ReduceMax": _reduce("max", np.max), "ReduceMin": _reduce("min", np.min),
    "ReduceProd": _reduce("prod", np.prod), "ReduceL2": _reduce("l2", None),
    "ReduceL1": _reduce("l1", None),
    "ArgMax": _arg("argmax"), "ArgMin": _arg("argmin"),
    "Softmax": _softmax(F.softmax), "LogSoftmax": _softmax(F.log_softmax),
    "CumSum": lambda node, ins, a, opset: [F.cumsum(ins[0], int(_scalar(ins[1])))],
    "TopK": _topk,
    # nn
    "MatMul": lambda node, ins, a, opset: [F.matmul(ins[0], ins[1])],
    "Gemm": _gemm, "Conv": _conv, "ConvTranspose": _conv_t,
    "MaxPool": lambda node, ins, a, opset: _pool(node, ins, a, opset, False),
    "AveragePool": lambda node, ins, a, opset: _pool(node, ins, a, opset, True),
    "GlobalAveragePool": lambda node, ins, a, opset: [F.adaptive_avg_pool2d(ins[0], 1)],
    "GlobalMaxPool": lambda node, ins, a, opset: [F.adaptive_max_pool2d(ins[0], 1)],
    "BatchNormalization": _batch_norm, "LayerNormalization": _layer_norm, "Pad": _pad,
    "Resize": _resize, "DepthToSpace": _depth_to_space, "LRN": _lrn,
    "InstanceNormalization": lambda node, ins, a, opset: [F.instance_norm(
        ins[0], True, ins[1], ins[2], a.get("epsilon", 1e-5))],
    "NonZero": lambda node, ins, a, opset: [F.non_zero(ins[0]).transpose(1, 0).astype("int64")],
    "BitShift": _bitshift,
    "QuantizeLinear": _quantize, "DequantizeLinear": _dequantize,
    "ConvInteger": _conv_integer, "MatMulInteger": _matmul_integer,
    "QLinearConv": _qlinear_conv, "QLinearMatMul": _qlinear_matmul,
    "Compress": _compress, "Einsum": lambda node, ins, a, opset: [F.einsum(
        a["equation"].decode() if isinstance(a["equation"], bytes) else a["equation"],
        *[_as_tensor(v) for v in ins])],
}


def _known(dims):
    """``dims`` as Python ints (a SymInt: its value in the import's own
    trace, which is what would be allocated), None where one is not an int."""
    from mgtrace.traced_module.symbolic import plain
    out = []
    for d in dims:
        if isinstance(d, SymInt):
            d = plain(d)
        if type(d) is not int and not isinstance(d, (np.integer,)):
            return None
        out.append(int(d))
    return out


def _shape_in(v):
    if v is None:
        return None
    if isinstance(v, Dims):
        return [len(v)]
    return _known(v.shape if _is_t(v) else np.shape(v))


def _values(v):
    """A static or Dims int vector as Python ints, None where not known."""
    if v is None or _is_t(v):
        return None
    if isinstance(v, Dims):
        return _known(v)
    return [int(i) for i in np.asarray(v).reshape(-1)] if np.asarray(v).dtype.kind in "iub" \
        else None


def _output_elements(node, ins, a):
    """The element count of the op's (largest) output where the inputs fix it
    before it is made (ConstantOfShape, Expand, Tile, Pad, Range, Resize by
    sizes), else None."""
    op = node.op_type
    try:
        if op == "ConstantOfShape":
            s = _values(ins[0])
        elif op == "Expand":
            x, t = _shape_in(ins[0]), _values(ins[1])
            if x is None or t is None:
                return None
            n = max(len(x), len(t))
            x, t = [1] * (n - len(x)) + x, [1] * (n - len(t)) + t
            s = [xd if td == 1 else td for xd, td in zip(x, t)]
        elif op == "Tile":
            x, r = _shape_in(ins[0]), _values(ins[1])
            s = None if x is None or r is None else [d * k for d, k in zip(x, r)]
        elif op == "Pad" and len(ins) > 1:
            x, p = _shape_in(ins[0]), _values(ins[1])
            s = None if x is None or p is None or len(p) != 2 * len(x) else \
                [d + p[i] + p[i + len(x)] for i, d in enumerate(x)]
        elif op == "Range":
            v = [_scalar(i) for i in ins]
            if not all(isinstance(i, (int, float, np.integer, np.floating)) and
                       not isinstance(i, SymNumber) for i in v) or not v[2]:
                return None
            s = [max(math.ceil((v[1] - v[0]) / v[2]), 0)]
        elif op == "Resize" and len(ins) > 3:
            s = _values(ins[3])
        else:
            return None
    except (TypeError, ValueError, OverflowError, IndexError):
        # too few inputs or values of the wrong kind: the op's importer names them
        return None
    if s is None:
        return None
    return math.prod(max(int(d), 0) for d in s)


def run_node(node, ins, opset):
    """The outputs of ONNX ``node`` on ``ins`` (a list, one per output)."""
    a = _attrs(node)
    from mgtrace.errors import NoKernelError
    from mgtrace.onnx.importer import MAX_ELEMENTS, OnnxImportError
    n = _output_elements(node, ins, a)
    if n is not None and n > MAX_ELEMENTS:
        # refused before anything is allocated (a few GB of ConstantOfShape is real memory)
        raise _err(node, f"its output would hold {n} elements, more than the {MAX_ELEMENTS} "
                         f"(2^31) an imported value may hold")
    try:
        if node.domain in ("", "ai.onnx"):
            outs = IMPORTERS[node.op_type](node, ins, a, opset)
        else:
            from mgtrace.onnx._import_contrib import CONTRIB
            outs = CONTRIB[f"{node.domain}.{node.op_type}"](node, ins, a, opset)
    except OnnxImportError:
        raise
    except ZeroDivisionError as err:
        # a Slice / Gather / Split axis taken modulo the rank of a 0-d value
        raise _err(node, f"inputs or attributes this importer cannot read ({err!r})") from None
    except (MemoryError, OverflowError) as err:
        # a ConstantOfShape / Expand / Tile / Pad / Range to an absurd size
        raise _err(node, f"its output is absurdly large ({type(err).__name__}: "
                         f"{str(err)[:120]})") from None
    except NoKernelError as err:
        # operands of a dtype the op has no kernel for (a complex input to Relu)
        raise _err(node, f"operands mgtrace has no kernel for ({err})") from None
    except (KeyError, IndexError, AttributeError, TypeError, ValueError) as err:
        # a mutated attribute (an int where ints belong, a missing list) or
        # operands the op refuses: name the node rather than leak a traceback
        raise _err(node, f"inputs or attributes this importer cannot read ({err!r})") from None
    return list(outs) + [None] * (len(node.output) - len(outs))
