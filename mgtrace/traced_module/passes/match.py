"""The matchers the passes share: what an expr computes, read off the
graph without changing it.

- calls: :func:`module_call` (a builtin module's ``__call__``),
  :func:`is_function` and :func:`bound_args` (a function call and its
  arguments by name), :func:`sole_user` (the one reader of a value);
- layers: :func:`conv_module`, :func:`conv_call` (a Conv2d call or
  ``F.conv2d``), :func:`linear_call` (a Linear call or ``F.linear``);
- what follows a layer: :func:`activation` (the activations the fused
  kernels take, module or function form), :func:`residual_add`
  (``layer(x) + r``), :func:`scaled_operand` (``x * c``, ``x / c``);
- :func:`side_effect_between` (an in-place write between two exprs, which a
  fusion would move the layer across).

FuseConvBn, BackwardFoldScale, FuseConvAct, FuseLinearAct, FuseLinearAddNorm, FuseAttention
(``fuse.py``), FuseAddMul, EliminateIdentity (``fold.py``), NCHWc and
FusePointwiseDepthwise (``layout.py``) and the state bookkeeping in
``util.py`` use them. Why these are hand-written matchers and not
:func:`~mgtrace.traced_module.replace_pattern` patterns: one matcher covers
a module call and its functional form, six activations and optional
arguments, where a pattern is one exact spelling (see ``fuse.py``).
"""
import inspect

import numpy as np

import mgtrace.functional as F
import mgtrace.module as M
from mgtrace._core import Tensor, op_table, tensor
from mgtrace.traced_module.expr import CallFunction, CallMethod
from mgtrace.traced_module.graph import has_side_effect
from mgtrace.traced_module.node import ModuleNode
from mgtrace.traced_module.traced_module import TracedModule

__all__ = ["module_call", "unwrap", "is_function", "bound_args", "sole_user", "activation",
           "conv_module", "conv_call", "linear_call", "residual_add", "scaled_operand",
           "side_effect_between", "float64", "ADD", "MUL", "DIV"]

# the operator forms of add, mul and true division (op table); x / c is no c / x
ADD, MUL, DIV = op_table.forms("add"), op_table.forms("mul"), (op_table.OPS["truediv"].method,)
# activation modules and functions the fusions take, by the kernels' names
_ACT_MODULES = {M.ReLU: "relu", M.ReLU6: "relu6", M.SiLU: "silu", M.Hardswish: "hardswish",
                M.Sigmoid: "sigmoid"}
_ACT_FUNCTIONS = (("relu", F.relu), ("relu6", F.relu6), ("silu", F.silu),
                  ("hardswish", F.hardswish), ("sigmoid", F.sigmoid), ("gelu", F.gelu))


def float64(t):
    """A tensor's values as a float64 NumPy array (what folds compute in)."""
    return t.numpy().astype(np.float64)


# ------------------------------------------------------------------ calls

def module_call(e, cls=None):
    """The builtin module ``e`` calls (``module(x)``), when it calls one (an
    instance of ``cls`` when given, of exactly that class), else None."""
    if not (isinstance(e, CallMethod) and e.method == "__call__" and e.args
            and isinstance(e.args[0], ModuleNode)):
        return None
    m = e.args[0].owner
    if isinstance(m, TracedModule) or (cls is not None and type(m) is not cls):
        return None
    return m


def unwrap(fn):
    """The function a traceable wrapper (``__wrapped__`` chain) wraps."""
    while hasattr(fn, "__wrapped__"):
        fn = fn.__wrapped__
    return fn


def is_function(e, fn):
    """Whether ``e`` calls ``fn`` (or what the traceable wrapper ``fn`` wraps)."""
    return isinstance(e, CallFunction) and (e.func is fn or unwrap(e.func) is unwrap(fn))


def bound_args(e):
    """A CallFunction's arguments by parameter name, defaults filled in
    (None when they do not bind)."""
    try:
        b = inspect.signature(unwrap(e.func)).bind(*e.args, **e.kwargs)
    except (TypeError, ValueError):
        return None
    b.apply_defaults()
    return dict(b.arguments)


def sole_user(node):
    """The one expr that reads ``node``, when nothing else does: not another
    expr, not the graph's result, not a watch or end point; else None."""
    if len(node.users) != 1 or id(node) in node.graph._kept_ids():
        return None
    return node.users[0]


# ---------------------------------------------------- layers and what follows them

def activation(e):
    """``(act name, input node)`` when ``e`` applies a fusable activation to
    one tensor, else None."""
    m = module_call(e)
    if m is not None and len(e.args) == 2 and not e.kwargs:
        name = _ACT_MODULES.get(type(m))
        if type(m) is M.GELU and getattr(m, "approximate", "none") == "none":
            name = "gelu"
        return (name, e.args[1]) if name else None
    for name, fn in _ACT_FUNCTIONS:
        if is_function(e, fn):
            args = bound_args(e)
            if args is None or set(args) - {"x", "approximate"}:
                return None
            if args.get("approximate", "none") != "none":
                return None
            return name, args["x"]
    return None


def conv_module(e):
    """The Conv2d module ``e`` calls with one tensor (zero padding), else None."""
    m = module_call(e, M.Conv2d)
    if m is None or len(e.args) != 2 or e.kwargs or m.padding_mode != "zeros":
        return None
    return m


def scaled_operand(e, uses=None):
    """``(node, constant)`` when ``e`` multiplies a node by a constant (or
    divides it by one: the constant is then 1/c), else None. With ``uses``
    (a :class:`StateUses`), a tensor the forward writes into is no
    constant; without, only Python numbers are."""
    div = False
    if e.kind == "call_method" and e.method in MUL + DIV and len(e.args) == 2:
        a, b = e.args
        div = e.method in DIV
    elif is_function(e, F.mul) or is_function(e, F.div):
        args = bound_args(e)
        if args is None or len(args) != 2:
            return None
        a, b = args.values()
        div = is_function(e, F.div)
    else:
        return None
    for node, c in ((a, b), (b, a)):
        if getattr(node, "kind", None) != "tensor":
            continue
        v = uses.constant(c) if uses is not None else c if isinstance(c, (int, float)) \
            and not isinstance(c, bool) else None
        if v is None or (div and node is b):
            continue
        if isinstance(v, Tensor) and v.dtype.name not in ("float32", "float64"):
            return None
        if div:
            v = 1.0 / v if isinstance(v, (int, float)) else tensor(1.0 / float64(v))
        return node, v
    return None


def conv_call(e):
    """``(x, weight, bias, stride, padding, dilation, groups)`` of a conv2d
    that ``e`` computes (a Conv2d module call or an F.conv2d call), where
    weight and bias are nodes, module parameters or None; else None."""
    m = conv_module(e)
    if m is not None:
        return (e.args[1], m.weight, m.bias, m.stride, m.padding, m.dilation, m.groups)
    if is_function(e, F.conv2d):
        a = bound_args(e)
        if a is not None:
            return (a["x"], a["weight"], a["bias"], a["stride"], a["padding"], a["dilation"],
                    a["groups"])
    return None


def residual_add(y, match_layer):
    """``(layer call, r, layer expr)`` when node ``y`` is ``layer(...) + r``
    with the layer's output used only there and ``r`` a tensor of y's shape
    and dtype (no broadcasting), else None."""
    e = y.expr
    if e is None or not (e.kind == "call_method" and e.method in ADD
                         and len(e.args) == 2 and not e.kwargs):
        return None
    a, b = e.args
    for c, r in ((a, b), (b, a)):
        if getattr(c, "kind", None) != "tensor" or getattr(r, "kind", None) != "tensor" or \
                c.expr is None or sole_user(c) is not e:
            continue
        call = match_layer(c.expr)
        if call is not None and r.shape == c.shape == y.shape and r.dtype == c.dtype == y.dtype:
            return call, r, c.expr
    return None


def side_effect_between(g, first, last):
    """Whether an expr of ``g`` after ``first`` and before ``last`` has a
    side effect: the fused call replaces ``last`` there, so it would run
    the layer after an in-place write to its input (``x *= -1`` between a
    conv and its activation)."""
    inside = False
    for x in g._exprs:
        if x is last:
            return False
        if inside and has_side_effect(x):
            return True
        inside = inside or x is first
    return False


def linear_call(e):
    m = module_call(e, M.Linear)
    if m is not None and len(e.args) == 2 and not e.kwargs:
        return (e.args[1], m.weight, m.bias)
    if is_function(e, F.linear):
        a = bound_args(e)
        if a is not None:
            return (a["x"], a["weight"], a["bias"])
    return None
