"""Passes that simplify arithmetic and remove work.

- ``FuseAddMul`` (MegEngine's): chains of additions and multiplications by
  constants become one of each: ``(x + a) + b`` is ``x + (a + b)``,
  ``(x * a) * b`` is ``x * (a * b)``, ``(x + a) * b`` is ``x * b + a * b``
  (so that a following ``+ c`` merges too); ``x - a`` counts as ``x + (-a)``
  and ``x / a`` as ``x * (1 / a)``.
- ``FoldConstant``: an expr whose inputs are all constants (Constant exprs,
  parameters and buffers) is computed once, here, and becomes a Constant.
- ``EliminateIdentity``: Identity modules, and Dropout modules and
  ``F.dropout(..., training=False)`` in inference, are dropped (their users
  read the input).
- ``EliminateDeadCode``: exprs whose results nobody uses go (``compile()``
  on every graph), then the submodules no graph reads any more.

Constants here are for inference: an optimized module's parameters are
folded as values, so later changes to the original parameters do not reach
the folded copies. What the forward itself writes into (a buffer updated
with ``+=``, ``buf[...] = v``, a step counter, a function declared with
``mutates``; in any mode, in any graph of the module) is no constant:
both passes ask :class:`~mgtrace.traced_module.passes.util.StateUses`,
the one rule for what is mutable, and leave such reads to run.
"""
import numpy as np

import mgtrace.functional as F
import mgtrace.module as M
from mgtrace._core import Tensor, op_table
from mgtrace.traced_module.expr import CallFunction, CallMethod, is_node
from mgtrace.traced_module.graph import has_side_effect
from mgtrace.traced_module.node import TENSOR_METHODS, TensorNode, ValueNode
from mgtrace.traced_module.pytree import tree_map
from mgtrace.traced_module.passes.match import bound_args, is_function, module_call, sole_user
from mgtrace.traced_module.passes.util import StateUses, float_node, graphs_of, insert_constant

__all__ = ["fuse_add_mul", "fold_constants", "eliminate_identity", "eliminate_dead_code"]


# ------------------------------------------------------------------ FuseAddMul

_OP_KIND = {"add": "add", "sub": "sub", "mul": "mul", "truediv": "div"}
# the ops' operator dunders (op table); reflected only where the order does not matter
_METHOD_KIND = {m: _OP_KIND[op.name] for m, (op, role) in op_table.by_method().items()
                if op.name in _OP_KIND and (role == "method"
                                             or role == "reflected" and op.name in ("add", "mul"))}
_FUNCTION_KIND = (("add", F.add), ("sub", F.sub), ("mul", F.mul), ("div", F.div))


def _neg(c):
    return -c


def _inv(c):
    if isinstance(c, (int, float)):
        return None if c == 0 else 1.0 / c
    return 1.0 / c


def affine_step(e, uses):
    """``("add" | "mul", node, constant)`` when ``e`` adds a constant to a
    float tensor node or multiplies one by a constant (``node - c`` and
    ``node / c`` in those forms), else None. A tensor constant must have the
    node's dtype (so the result's dtype does not depend on the order), and
    must not be mutable state (``uses``, a :class:`StateUses`)."""
    kind = None
    if isinstance(e, CallMethod) and e.method in _METHOD_KIND and len(e.args) == 2 and not e.kwargs:
        kind, (a, b) = _METHOD_KIND[e.method], e.args
    elif isinstance(e, CallFunction):
        for k, fn in _FUNCTION_KIND:
            if is_function(e, fn):
                args = bound_args(e)
                if args is not None and len(args) == 2:
                    kind, (a, b) = k, args.values()
                break
    if kind is None or len(e.outputs) != 1:
        return None
    pairs = ((a, b), (b, a)) if kind in ("add", "mul") else ((a, b),)
    for node, c in pairs:
        if not isinstance(node, TensorNode) or not float_node(node):
            continue
        v = uses.constant(c)
        if v is None or (isinstance(v, Tensor) and v.dtype.name != np.dtype(node.dtype).name):
            continue
        if kind == "sub":
            return "add", node, _neg(v)
        if kind == "div":
            v = _inv(v)
            return None if v is None else ("mul", node, v)
        return kind, node, v
    return None


def _fold_pair(g, e1, e2, uses):
    """Merge the steps e1 (x op1 c1) and e2 ((e1's result) op2 c2); True when
    the graph changed."""
    k1, x, c1 = affine_step(e1, uses)
    k2, _, c2 = affine_step(e2, uses)
    with g.insert_exprs(e2):
        if k1 == k2 == "add":
            new = x + (c1 + c2)
        elif k1 == k2 == "mul":
            new = x * (c1 * c2)
        elif k1 == "add" and k2 == "mul":
            new = x * c2 + c1 * c2
        else:
            return False
    g.replace_node({e2.outputs[0]: new})
    return True


def fuse_add_mul(tm):
    """Merge chains of constant additions and multiplications (see the module
    docstring). Returns the number of merges."""
    done, uses = 0, StateUses(tm)
    for g in list(graphs_of(tm)):
        changed = True
        while changed:
            changed = False
            for e2 in list(g._exprs):
                s2 = affine_step(e2, uses) if e2.top_graph is g else None
                if s2 is None or s2[1].expr is None:
                    continue
                e1 = s2[1].expr
                s1 = affine_step(e1, uses)
                if s1 is None or sole_user(s2[1]) is not e2:
                    continue
                if (s1[0], s2[0]) == ("mul", "add"):
                    continue                      # already x * a + b
                if _fold_pair(g, e1, e2, uses):
                    done += 1
                    changed = True
                    g.compile()
                    break
    return done


# ---------------------------------------------------------------- FoldConstant

_IMPURE = frozenset({"dropout"})     # functions whose result is not a function of their inputs


def _pure(e):
    if has_side_effect(e) or len(e.outputs) != 1 or not isinstance(e.outputs[0], TensorNode):
        return False
    if isinstance(e, CallFunction):
        mod = getattr(e.func, "__module__", "") or ""
        return (mod.startswith("mgtrace.functional") or mod in ("operator", "_operator")) \
            and getattr(e.func, "__name__", "") not in _IMPURE
    if isinstance(e, CallMethod):       # the table's methods and operators, none in place
        return e.method in TENSOR_METHODS or (
            e.method in op_table.by_method() and e.method not in CallMethod.IN_PLACE)
    return False


def _run(e, values):
    args, kwargs = e.args, e.kwargs
    args, kwargs = tree_map(lambda n: values[id(n)], (args, kwargs), is_node)
    if isinstance(e, CallFunction):
        return e.func(*args, **kwargs)
    return getattr(args[0], e.method)(*args[1:], **kwargs)


def fold_constants(tm):
    """Compute exprs whose inputs are all constant once (see the module
    docstring). Returns the number of exprs folded."""
    done, uses = 0, StateUses(tm)
    for g in list(graphs_of(tm)):
        for e in list(g._exprs):
            if e.top_graph is not g or not _pure(e) or not e._inputs:
                continue
            out = e.outputs[0]
            if any(o is out for o in g._outputs) or uses.is_written(out):
                continue        # a value written into (in place, or through a view) changes
            values = {}
            for n in e._inputs:
                v = uses.constant(n) if not isinstance(n, ValueNode) else None
                if not isinstance(v, Tensor):
                    break
                values[id(n)] = v
            else:
                try:
                    result = _run(e, values)
                except Exception:               # leave an expr that fails to the run
                    continue
                if not isinstance(result, Tensor):
                    continue
                node = insert_constant(g, e, result, out.name + "_folded")
                g.replace_node({out: node})
                done += 1
        if done:
            g.compile()
    return done


# ------------------------------------------------------------ EliminateIdentity

def _identity_input(e):
    m = module_call(e)
    if m is not None and len(e.args) == 2 and not e.kwargs:
        if type(m) is M.Identity or (type(m) is M.Dropout and not m.training):
            return e.args[1]
        return None
    if is_function(e, F.dropout):
        a = bound_args(e)
        if a is not None and a.get("training") is False:
            return a["x"]
    return None


def eliminate_identity(tm):
    """Drop Identity and inference-mode Dropout (see the module docstring).
    Returns the number of calls dropped."""
    done = 0
    for g in list(graphs_of(tm)):
        for e in list(g._exprs):
            x = _identity_input(e) if len(e.outputs) == 1 else None
            if x is None or x.kind != e.outputs[0].kind:
                continue
            g.replace_node({e.outputs[0]: x})
            done += 1
        if done:
            g.compile()
    return done


# ------------------------------------------------------------ EliminateDeadCode

def eliminate_dead_code(tm):
    """``compile()`` every graph, then delete the submodules no graph reads.
    Returns the number of exprs removed."""
    before = sum(len(g._exprs) for g in graphs_of(tm))
    for g in list(graphs_of(tm)):
        g.compile()
    tm.delete_unused_submodules()
    return before - sum(len(g._exprs) for g in graphs_of(tm))
