"""Every core op, declared once: the vocabulary the core, the tracer, the
graph code and the archive share.

One row per op (tinygrad's ``Ops``, grouped like its ``GroupOp``): the
stable name (``OpDef.name``, an ``Apply`` expr's op in archives, the key of
the kernel tables), the group, the tensor inputs, the params recorded with
the op, the Tensor method or operator that applies it (with its reflected
and in-place forms), Python's spelling of it (infix symbol, :mod:`operator`
function) and its version; where a device may lack the kernel, the composite that
replaces it (``fallback``: a function of :mod:`mgtrace._core.fallbacks`,
run where ``has_kernel`` says no; attention's is softmax(q k^T scale +
mask) v). Everything else derives from these rows:
registration and the trace hook (``dispatch.core_op``), the tracer's
method forms, graph nodes' operators and methods, generated code, printed
names, the archive's allowed methods and core ops (schema/ops.json).

Elementwise kernels are C: ``kernels/contract/mt_ops.h`` lists them with their
dtype rules, and tests/core/test_op_table.py checks that it and this table
name the same ops. Adding an op: its kernel, one row here, the
``mgtrace.functional`` wrapper and a test.

Pure Python with no compiled dependency: a backend (CUDA) registers its
kernels against these names without importing the CPU core.
"""
from typing import NamedTuple

__all__ = ["Op", "OPS", "GROUPS", "ELEMENTWISE", "TENSOR_ONLY_METHODS", "POS",
           "POSITIONAL_PARAMS", "GRAPH_METHODS", "by_method", "forms", "inplace_methods",
           "tensor_methods", "node_methods", "operator_functions"]


class Op(NamedTuple):
    name: str
    group: str
    inputs: tuple             # tensor operands in order; "*tensors" is a sequence of any length
    params: tuple = ()        # recorded with the op (OpDef.params), in order
    method: str = None        # Tensor method or operator dunder
    reflected: str = None     # dunder of ``other <op> tensor``
    inplace: str = None       # dunder of ``tensor <op>= other``
    symbol: str = None        # Python's spelling: infix, prefix, or ``abs()`` / ``[]``
    pyop: str = None          # the function of Python's operator module
    version: int = 1
    fallback: str = None      # composite run where a device has no kernel: fallbacks.<name>

    @property
    def arity(self):
        """Number of tensor inputs, None for a sequence of any length."""
        return None if self.inputs[:1] == ("*tensors",) else len(self.inputs)


_X, _XY, _XYZ, _AXES = ("x",), ("x", "y"), ("x", "y", "z"), ("axis", "keepdims")


def _unary(group, names):
    return [Op(n, group, _X) for n in names.split()]


def _operator(name, group, dunder, symbol, pyop, reflected=True, inplace=True, mirror=None):
    """A binary op Tensor applies as an operator: ``__add__`` / ``__radd__`` /
    ``__iadd__``; comparisons reflect to their mirror (``a < b`` is ``b > a``)."""
    return Op(name, group, _XY, method=f"__{dunder}__",
              reflected=f"__{mirror}__" if mirror else f"__r{dunder}__" if reflected else None,
              inplace=f"__i{dunder}__" if inplace else None, symbol=symbol, pyop=pyop)


_ROWS = [
    # --- elementwise, one input (kernels: MT_UNARY_OPS)
    Op("neg", "unary", _X, method="__neg__", symbol="-", pyop="neg"),
    Op("abs", "unary", _X, method="__abs__", symbol="abs()", pyop="abs"),
    *_unary("unary", "sign square round floor ceil trunc"),
    *_unary("unary", "exp expm1 log log1p log2 sqrt rsqrt sin cos tan tanh erf asin acos atan"),
    *_unary("activation", "relu relu6 sigmoid gelu gelu_tanh silu hardswish hardsigmoid softplus"),
    *_unary("predicate", "isnan isinf isfinite logical_not"),
    Op("bitwise_not", "bitwise", _X, method="__invert__", symbol="~", pyop="invert"),
    # --- elementwise, two inputs (kernels: MT_BINARY_OPS)
    _operator("add", "binary", "add", "+", "add"),
    _operator("sub", "binary", "sub", "-", "sub"),
    _operator("mul", "binary", "mul", "*", "mul"),
    _operator("truediv", "binary", "truediv", "/", "truediv"),
    _operator("floordiv", "binary", "floordiv", "//", "floordiv"),
    _operator("mod", "binary", "mod", "%", "mod"),
    _operator("pow", "binary", "pow", "**", "pow"),
    *[Op(n, "binary", _XY) for n in ("maximum", "minimum", "atan2")],
    _operator("eq", "compare", "eq", "==", "eq", inplace=False, mirror="eq"),
    _operator("ne", "compare", "ne", "!=", "ne", inplace=False, mirror="ne"),
    _operator("lt", "compare", "lt", "<", "lt", inplace=False, mirror="gt"),
    _operator("le", "compare", "le", "<=", "le", inplace=False, mirror="ge"),
    _operator("gt", "compare", "gt", ">", "gt", inplace=False, mirror="lt"),
    _operator("ge", "compare", "ge", ">=", "ge", inplace=False, mirror="le"),
    *[Op(n, "predicate", _XY) for n in ("logical_and", "logical_or", "logical_xor")],
    _operator("bitwise_and", "bitwise", "and", "&", "and_"),
    _operator("bitwise_or", "bitwise", "or", "|", "or_"),
    _operator("bitwise_xor", "bitwise", "xor", "^", "xor"),
    _operator("left_shift", "bitwise", "lshift", "<<", "lshift"),
    _operator("right_shift", "bitwise", "rshift", ">>", "rshift"),
    # --- elementwise, three inputs (kernels: MT_TERNARY_OPS)
    Op("where", "ternary", _XYZ),
    Op("clip", "ternary", _XYZ),
    # --- dtype and views (Tensor methods; params passed positionally)
    Op("astype", "cast", _X, ("dtype",), method="astype"),
    *[Op(n, "view", _X, (p,), method=n) for n, p in (
        ("reshape", "shape"), ("transpose", "axes"), ("expand_dims", "axis"),
        ("squeeze", "axis"), ("broadcast_to", "shape"))],
    # --- reductions (Tensor methods take the params as keywords)
    *[Op(n, "reduce", _X, _AXES, method=n)
      for n in ("sum", "mean", "prod", "max", "min", "any", "all", "argmax", "argmin")],
    Op("var", "reduce", _X, _AXES + ("ddof",), method="var"),
    Op("std", "reduce", _X, _AXES + ("ddof",), method="std"),
    *[Op(n, "reduce", _X, ("axis",)) for n in ("softmax", "log_softmax", "cumsum", "cumprod")],
    Op("sort", "sort", _X, ("axis", "descending")),
    Op("argsort", "sort", _X, ("axis", "descending")),
    Op("topk", "sort", _X, ("k", "axis", "descending", "sorted")),
    # --- indexing and joining
    Op("getitem", "index", ("x", "index"), method="__getitem__", symbol="[]", pyop="getitem"),
    Op("setitem", "index", ("x", "index", "value"), method="__setitem__"),
    Op("nonzero", "index", _X, ("as_tuple",)),
    Op("gather", "index", ("x", "index"), ("axis",)),
    Op("scatter", "index", ("x", "index", "src"), ("axis",)),
    Op("embedding", "index", ("weight", "indices")),
    Op("concat", "join", ("*tensors",), ("axis",)),
    Op("stack", "join", ("*tensors",), ("axis",)),
    Op("split", "join", _X, ("nsplits_or_sections", "axis")),
    # --- linear algebra and neural-network ops
    Op("matmul", "linalg", ("a", "b"), method="__matmul__", reflected="__rmatmul__", symbol="@",
       pyop="matmul"),
    Op("conv2d", "nn", ("x", "weight", "bias"), ("stride", "padding", "dilation", "groups")),
    Op("conv2d_act", "nn", ("x", "weight", "bias", "residual"),
       ("stride", "padding", "dilation", "groups", "act")),
    Op("conv2d_nchwc", "nn", ("x", "weight", "bias", "residual"),
       ("stride", "padding", "dilation", "groups", "act")),
    Op("conv2d_nchwc_pw_dw", "nn", ("x", "weight", "bias", "dw_weight", "dw_bias"),
       ("stride", "padding", "act", "dw_act")),
    Op("conv2d_nchwc_pw_dw_pw", "nn", ("x", "weight", "bias", "dw_weight", "dw_bias", "proj_weight", "proj_bias",
                                       "residual"), ("stride", "padding", "act", "dw_act", "proj_act")),
    Op("to_nchwc", "nn", _X),
    Op("from_nchwc", "nn", _X, ("channels",)),
    Op("max_pool2d_nchwc", "nn", _X, ("kernel_size", "stride", "padding", "dilation", "ceil_mode")),
    Op("conv_transpose2d", "nn", ("x", "weight", "bias"),
       ("stride", "padding", "output_padding", "dilation", "groups")),
    Op("conv3d", "nn", ("x", "weight", "bias"), ("stride", "padding", "dilation", "groups"),
       fallback="conv3d"),
    Op("conv_transpose3d", "nn", ("x", "weight", "bias"),
       ("stride", "padding", "output_padding", "dilation", "groups"), fallback="conv_transpose3d"),
    Op("lstm_cell", "nn", ("gx", "h", "c", "w_hh", "b_hh"), fallback="lstm_cell"),
    Op("rnn_cell", "nn", ("gx", "h", "w_hh", "b_hh"), ("nonlinearity",), fallback="rnn_cell"),
    Op("attention", "nn", ("q", "k", "v", "mask"), ("scale",), fallback="attention"),
    Op("max_pool2d", "nn", _X, ("kernel_size", "stride", "padding", "dilation", "ceil_mode")),
    Op("avg_pool2d", "nn", _X, ("kernel_size", "stride", "padding", "ceil_mode",
                                "count_include_pad")),
    Op("adaptive_avg_pool2d", "nn", _X, ("output_size",)),
    Op("adaptive_max_pool2d", "nn", _X, ("output_size",)),
    Op("interpolate", "nn", _X, ("size", "scale_factor", "mode", "align_corners")),
    Op("pad", "nn", _X, ("pad_width", "mode", "value")),
]

OPS = {op.name: op for op in _ROWS}
GROUPS = {g: tuple(op.name for op in _ROWS if op.group == g)
          for g in dict.fromkeys(op.group for op in _ROWS)}
# the groups whose kernels are mt_ops.h's, by number of inputs
ELEMENTWISE = {n: tuple(op.name for op in _ROWS if op.arity == n and op.group in (
    "unary", "activation", "predicate", "bitwise", "binary", "compare", "ternary"))
    for n in (1, 2, 3)}

# Tensor members a stored graph may call that are no core op: "node" ones
# return tensors and graph nodes record them; "value" ones leave the graph
# or move it ("shape" is the attribute read the tracer records); ``__pos__``
# is the identity, spelled as Python's unary plus.
TENSOR_ONLY_METHODS = {
    "copy": "node", "contiguous": "node", "view": "node", "flatten": "node", "permute": "node",
    "detach": "node",       # identity in a graph; stops gradients (mgtrace.autodiff)
    "to": "value", "item": "value", "numpy": "value", "tolist": "value", "shape": "value",
}
POS = Op("pos", "identity", _X, method="__pos__", symbol="+", pyop="pos")
# groups whose method takes the params positionally (``x.reshape(shape)``),
# the others take them as keywords (``x.sum(axis=1)``)
POSITIONAL_PARAMS = ("cast", "view")
GRAPH_METHODS = ("view", "cast", "reduce")      # tensor methods graph nodes record


def by_method():
    """``{method or dunder: (Op, role)}``, role ``"method"``, ``"reflected"``
    or ``"inplace"``, for every op Tensor applies by a member."""
    out = {}
    for role in ("method", "reflected", "inplace"):     # ``__gt__`` is gt's, not lt's reflection
        for op in _ROWS + [POS]:
            m = getattr(op, role)
            if m is not None:
                out.setdefault(m, (op, role))
    return out


def forms(name):
    """The dunders that apply op ``name`` out of place: ``("__add__", "__radd__")``."""
    op = OPS[name]
    return tuple(m for m in (op.method, op.reflected) if m)


def inplace_methods():
    """Tensor methods that write into their self tensor: ``x += y``, ``x[i] = v``."""
    return frozenset({op.inplace for op in _ROWS if op.inplace} | {OPS["setitem"].method})


def tensor_methods():
    """Every Tensor method and operator a stored graph may call (schema/ops.json's
    ``tensor_methods``; ``__pos__`` is not one: the tracer never records it)."""
    names = {m for m in by_method() if m != "__pos__"}
    return frozenset(names | set(TENSOR_ONLY_METHODS))


def node_methods():
    """Tensor methods a TensorNode records inside ``insert_exprs`` (each returns tensors)."""
    return frozenset({op.method for op in _ROWS if op.group in GRAPH_METHODS and op.method}
                     | {m for m, k in TENSOR_ONLY_METHODS.items() if k == "node"})


def operator_functions():
    """Names of the :mod:`operator` functions tensors overload (``and_``, ``add``...)."""
    return tuple(op.pyop for op in _ROWS + [POS] if op.pyop)
