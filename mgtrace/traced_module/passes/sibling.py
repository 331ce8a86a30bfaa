"""FuseSiblingLinear: linear layers that read the same input as one GEMM.

BERT's self-attention computes its query, key and value as three linear
layers of the same hidden state ``h``: three products of ``h`` [B, S, E]
with an [E, E] weight, each reading ``h`` again, each one GEMM call and
one bias pass (a parallel region each, where the threads meet). Stacked,
the weights make one [3E, E] weight and the three are one GEMM of ``h``
and one bias pass; each former output is a column slice of the product (a
view: its rows 3E apart, which the attention kernel and the reshapes after
it read as they are).

Each output element is the same dot product of a row of ``h`` and a row
of one weight, plus the same bias element. On one thread the BLAS sums it
in the same order whatever N is, so the fused graph gives the bits of the
unfused one; on more, wherever each product is split by rows into one
single-threaded GEMM per thread (from 128 rows, over 2^22 multiply-adds:
BERT's at 128 tokens or more, mgtrace's gemm.c). Where a smaller product
is left to OpenBLAS's own threading, that splits the stacked product
otherwise than the separate ones and the last bits may differ, as they
differ between thread counts there (tests/traced_module/test_sibling_linear.py).

What is fused: in one graph, two or more ``F.linear`` calls, Linear module
calls, or ``F.linear_act`` calls with the same ``act`` (FuseLinearAct's
forms), reading the same float32 tensor node, whose weights (and biases:
all or none) are constants (parameters or buffers read by the graph, or
Constant exprs) of that dtype on the CPU with the same input features and
a multiple of 16 output features each, and with no side effect between
the first and the last of them. The stacked weight
and bias are new parameters of the graph's owner (``<name>_stacked_weight``,
``_bias``; the module keeps the originals, EliminateDeadCode drops the
exprs that read them): for inference, as the other weight-rewriting
passes, so not training-safe.
"""
import numpy as np

import mgtrace.functional as F
import mgtrace.module as M
from mgtrace.module.parameter import Parameter
from mgtrace._core import Tensor, tensor
from mgtrace.traced_module.node import TensorNode
from mgtrace.traced_module.passes.match import (bound_args, is_function, module_call,
                                                side_effect_between)
from mgtrace.traced_module.passes.util import const_value, graphs_of

__all__ = ["fuse_sibling_linear"]


# Each layer's output features a multiple of this: a single row (batch 1)
# is a GEMV, whose kernels take the output features in blocks of up to 16
# and the tail beyond a block in another order of additions; so stacked,
# each layer's columns keep their place within a block.
_WIDTH = 16


def _linear(e):
    """``(x, weight, bias, act)`` of a linear call ``e`` (a Linear module,
    ``F.linear`` or ``F.linear_act``), else None."""
    m = module_call(e, M.Linear)
    if m is not None:
        if len(e.args) == 2 and not e.kwargs:
            return e.args[1], m.weight, m.bias, "none"
        return None
    for fn in (F.linear, F.linear_act):
        if is_function(e, fn):
            a = bound_args(e)
            if a is None:
                return None
            return a["x"], a["weight"], a["bias"], a["act"] if fn is F.linear_act else "none"
    return None


def _f32(t):
    return isinstance(t, Tensor) and np.dtype(t.dtype) == np.float32 and t.device.type == "cpu"


def _member(e):
    """``(x node, key, weight, bias)`` when ``e`` can join a group: its
    input a float32 node, weight [N, K] and bias [N] (or None) float32
    constants on the CPU; ``key`` what its group shares besides ``x``."""
    call = _linear(e) if len(e.outputs) == 1 else None
    if call is None:
        return None
    x, w, b, act = call
    w = w if isinstance(w, Tensor) else const_value(w)
    b = None if b is None else b if isinstance(b, Tensor) else const_value(b)
    if not isinstance(x, TensorNode) or x.shape is None or len(x.shape) < 1 or x.dtype is None \
            or np.dtype(x.dtype) != np.float32 or not isinstance(act, str):
        return None
    if not _f32(w) or w.ndim != 2 or w.shape[1] != x.shape[-1] or w.shape[0] % _WIDTH:
        return None
    if call[2] is not None and (not _f32(b) or b.ndim != 1 or b.shape[0] != w.shape[0]):
        return None
    return x, (act, call[2] is None, tuple(w.shape[1:])), w, b


def _fuse_group(g, members):
    """Replace the linear calls of ``members`` ([(expr, x, w, b)], in graph
    order) with one call over their stacked weights and a slice each."""
    first, x = members[0][0], members[0][1]
    act = _linear(first)[3]
    ws = [m[2].numpy() for m in members]
    owner, base = g.owner, f"{first.outputs[0].name}_stacked"
    name, i = base, 1
    while hasattr(owner, name + "_weight") or hasattr(owner, name + "_bias"):
        name, i = f"{base}_{i}", i + 1
    # parameters of the graph's owner, read by the graph as its others are
    # (a re-trace of the optimized module sees them as state, not as
    # tensors made outside its calls)
    wn = Parameter(tensor(np.ascontiguousarray(np.concatenate(ws))))
    setattr(owner, name + "_weight", wn)
    bn = None
    if members[0][3] is not None:
        bn = Parameter(tensor(np.concatenate([m[3].numpy() for m in members])))
        setattr(owner, name + "_bias", bn)
    lead = (slice(None),) * (len(x.shape) - 1)
    with g.insert_exprs(first):
        y = F.linear_act(x, wn, bn, act=act)
        parts, lo = [], 0
        for w in ws:
            parts.append(y[lead + (slice(lo, lo + w.shape[0]),)])
            lo += w.shape[0]
    g.replace_node({m[0].outputs[0]: p for m, p in zip(members, parts)})


def fuse_sibling_linear(tm):
    """Linear calls reading the same input (BERT's query, key and value) to
    one ``F.linear_act`` over their stacked weights and a column slice of
    it each (see the module docstring); returns the number of calls fused
    away (two for each group of three)."""
    done = 0
    for g in list(graphs_of(tm)):
        groups = {}
        for e in list(g._exprs):
            hit = _member(e) if e.top_graph is g else None
            if hit is not None:
                x, key, w, b = hit
                groups.setdefault((id(x), key), []).append((e, x, w, b))
        n = 0
        for members in groups.values():
            if len(members) < 2 or side_effect_between(g, members[0][0], members[-1][0]):
                continue
            _fuse_group(g, members)
            n += len(members) - 1
        if n:
            g.compile()
        done += n
    return done
