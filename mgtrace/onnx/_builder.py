"""The ONNX graph under construction: values, nodes, initializers, and the
few helpers every converter shares (casts, constants, shape tensors).

A graph value is a :class:`V`: its ONNX name, its NumPy dtype and the
shape it had while tracing (``shape`` gives the rank; its entries are the
traced sizes, which a converter may read only where the size cannot
change between runs: a weight's, never an input-derived one). A shape
entry read while tracing (a graph ``ValueNode``) is a 0-d int64 V, so
arithmetic on it becomes ONNX arithmetic, never a frozen constant.
"""
import numpy as np

from mgtrace.errors import Error

__all__ = ["ExportError", "V", "Builder", "INT64_MAX"]

INT64_MAX = np.iinfo(np.int64).max
INT64_MIN = np.iinfo(np.int64).min


class ExportError(Error, ValueError):
    """A TracedModule cannot be exported to ONNX: an op with no ONNX
    equivalent, an opset too old for an op, a value ONNX cannot express.
    The message names the op, the node's qualname and the user's source
    line; nothing is written."""


class V:
    """One ONNX value: ``name``, ``dtype`` (NumPy), ``shape`` (traced sizes,
    for the rank) and ``blocked``: for an NCHW16c tensor of ``optimize``'s
    layout pass, the channel count, the value itself being kept in NCHW;
    ``q``: for the integers of a quantized tensor, their per-tensor
    quantization (a :class:`mgtrace.onnx._quant.Q`), else None."""
    __slots__ = ("name", "dtype", "shape", "blocked", "q")

    def __init__(self, name, dtype, shape, blocked=None, q=None):
        self.name = name
        self.dtype = np.dtype(dtype)
        self.shape = tuple(shape)
        self.blocked = blocked
        self.q = q

    @property
    def ndim(self):
        return len(self.shape)

    def __repr__(self):
        return f"V({self.name!r}, {self.dtype}, {self.shape})"


class Builder:
    """Collects the nodes and initializers of one ONNX graph.

    ``where`` is the expr being converted (its node names and error
    messages); ``opset`` the target opset."""

    def __init__(self, opset, contrib=False):
        from onnx import helper, numpy_helper
        self._helper, self._numpy_helper = helper, numpy_helper
        self.opset = opset
        self.contrib = bool(contrib)    # ONNX Runtime's com.microsoft fused ops allowed
        self.domains = set()            # the non-standard domains the nodes use
        self.shapes = {}                # value name -> traced shape (graph values only)
        self.nodes = []
        self.initializers = []
        self._names = set()
        self._consts = {}
        self.scope = "graph"        # qualname of the expr being converted
        self.source = None          # its user source line
        self.used_ops = {}          # onnx op type -> first scope that used it
        self.qdq = set()            # ("q" or "dq", storage dtype name): QDQ pairs, DQ of constants

    # ------------------------------------------------------------- names
    def fresh(self, base):
        base = base or "v"
        name, i = base, 1
        while name in self._names:
            i += 1
            name = f"{base}_{i}"
        self._names.add(name)
        return name

    def reserve(self, name):
        """Claim ``name`` exactly (graph inputs, initializers); a clash gets a suffix."""
        return self.fresh(name)

    # ------------------------------------------------------------- nodes
    def node(self, op_type, inputs, n_out=1, domain="", **attrs):
        """Append one node; returns its output names (a list)."""
        outs = [self.fresh(f"{self.scope}/{op_type}" + (f":{i}" if n_out > 1 else ""))
                for i in range(n_out)]
        attrs = {k: v for k, v in attrs.items() if v is not None}
        if domain:
            self.domains.add(domain)
        self.nodes.append(self._helper.make_node(
            op_type, [getattr(i, "name", i) if i is not None else "" for i in inputs], outs,
            name=self.fresh(f"{self.scope}/{op_type}#node"), domain=domain or None, **attrs))
        self.used_ops.setdefault(op_type, self.scope)
        return outs

    def op(self, op_type, inputs, dtype, shape, **attrs):
        """One node with one output, returned as a V of ``dtype``/``shape``."""
        return V(self.node(op_type, inputs, **attrs)[0], dtype, shape)

    def error(self, what):
        at = f", at {self.source}" if self.source else ""
        return ExportError(f"{what} (node {self.scope}{at})")

    # --------------------------------------------------------- constants
    def const(self, value, dtype=None, name=None):
        """An initializer holding ``value`` (array or number) as a V;
        small unnamed constants are shared."""
        arr = np.asarray(value, dtype=dtype)
        if arr.dtype == np.float64 and dtype is None and not isinstance(value, np.ndarray):
            arr = arr.astype(np.float32)
        key = None
        if name is None and arr.size <= 16:
            key = (arr.dtype.str, arr.shape, arr.tobytes())
            if key in self._consts:
                return self._consts[key]
        v = V(self.reserve(name or f"const_{len(self.initializers)}"), arr.dtype, arr.shape)
        data = np.require(arr, requirements="C")
        self.initializers.append(self._numpy_helper.from_array(data, v.name))
        if key is not None:
            self._consts[key] = v
        return v

    def ints(self, values):
        """A 1-d int64 initializer (axes, pads, starts...)."""
        return self.const(np.asarray(list(values), np.int64).reshape(-1), np.int64)

    # ------------------------------------------------------------- casts
    def cast(self, v, dtype):
        dtype = np.dtype(dtype)
        if v.dtype == dtype:
            return v
        from onnx import helper
        return self.op("Cast", [v], dtype, v.shape, to=helper.np_dtype_to_tensor_dtype(dtype))

    def operand(self, a, dtype):
        """A V or a Python number as a V of ``dtype``."""
        if isinstance(a, V):
            return self.cast(a, dtype)
        if isinstance(a, (bool, int, float, np.number, np.bool_)):
            return self.const(np.asarray(a).astype(dtype))
        raise self.error(f"an operand of type {type(a).__name__} ({a!r}) has no ONNX form")

    def static(self, v, what):
        """``v`` as a Python value fixed at export: refuses a value known only
        when the graph runs (a shape entry) where ONNX wants an attribute."""
        def check(x):
            if isinstance(x, V):
                raise self.error(f"{what} is computed from a shape at run time, but ONNX takes "
                                 f"it as a fixed attribute; compute it from constants, or export "
                                 f"with dynamic=False")
            if isinstance(x, (tuple, list)):
                for y in x:
                    check(y)
        check(v)
        return v

    # -------------------------------------------------------------- shapes
    def shape_of(self, v):
        return self.op("Shape", [v], np.int64, (v.ndim,))

    def dim(self, v, axis):
        """Size of axis ``axis`` of ``v`` as a 0-d int64 V (Shape, Gather)."""
        return self.op("Gather", [self.shape_of(v), self.const(np.int64(axis % v.ndim))],
                       np.int64, (), axis=0)

    def shape_tensor(self, items):
        """A 1-d int64 tensor from Python ints and 0-d int64 Vs."""
        items = list(items)
        if all(not isinstance(i, V) for i in items):
            return self.ints(int(i) for i in items)
        parts, run = [], []
        for i in items:
            if isinstance(i, V):
                if run:
                    parts.append(self.ints(run))
                    run = []
                s = self.cast(i, np.int64)
                if s.ndim == 0:
                    s = self.op("Unsqueeze", [s, self.ints([0])], np.int64, (1,))
                parts.append(s)
            else:
                run.append(int(i))
        if run:
            parts.append(self.ints(run))
        if len(parts) == 1:
            return parts[0]
        return self.op("Concat", parts, np.int64, (len(items),), axis=0)
