"""The checks :func:`~mgtrace.traced_module.trace_module` runs on what it
made, and the module state it puts back (MegEngine's ``tm_config`` and
``TracedModuleChecker``).

- The default checker (on unless :func:`disable_default_checker`): the new
  TracedModule runs on the trace inputs and every output is compared with
  the eager result; a difference raises :class:`TraceCheckError` naming the
  first differing output.
- The expr checker (off unless :func:`enable_expr_checker`): the same run
  compares the value of every node of every graph with the value seen while
  tracing, and names the first expr that does not reproduce its value;
  nodes then keep their traced values (``TensorNode.value``).

Both runs start from the state the trace started from: the module's buffers
and attributes (:class:`ModuleState`), copies of the inputs, and the random
stream, so a module in training mode (BatchNorm statistics, dropout) gives
the same values again. Afterwards the caller's module is put back exactly as
it was before tracing.
"""
import numpy as np

from mgtrace import random as _random
from mgtrace._core import Tensor
from mgtrace._core.tensor import storage_spans
from mgtrace.module.snapshot import ModuleSnapshot
from mgtrace.traced_module.errors import TraceCheckError
from mgtrace.traced_module.node import TensorNode, ValueNode
from mgtrace.traced_module.pytree import LeafDef, _Root, tree_flatten, tree_map

__all__ = ["enable_expr_checker", "disable_default_checker", "TraceCheckError", "ModuleState"]

_settings = {"default": True, "expr": False}


def enable_expr_checker(enabled=True):
    """Make every later :func:`trace_module` also compare the value of every
    expr of the new graphs with the value seen while tracing (slower, keeps
    a copy of every traced value on its node as ``TensorNode.value``; for
    debugging a trace). MegEngine's ``enable_expr_checker``. Returns the
    previous setting; ``enable_expr_checker(False)`` turns it off again."""
    was = _settings["expr"]
    _settings["expr"] = bool(enabled)
    return was


def disable_default_checker(disabled=True):
    """Stop :func:`trace_module` from running the new TracedModule on the
    trace inputs and comparing its outputs with the eager result (needed
    when forward is not repeatable, e.g. it reads the clock). MegEngine's
    ``disable_default_checker``. Returns the previous setting (True when
    the check was off); ``disable_default_checker(False)`` turns it on."""
    was = not _settings["default"]
    _settings["default"] = not disabled
    return was


def default_check_on():
    return _settings["default"]


def expr_check_on():
    return _settings["expr"]


# ----------------------------------------------------------- module state
class ModuleState:
    """What a run of ``module`` may change, taken now, put back by
    :meth:`restore`: every module's attributes, tables and list/dict
    contents (:class:`~mgtrace.module.snapshot.ModuleSnapshot`: the objects
    they hold, so an attribute rebound in forward gets its old tensor back,
    and a list appended to loses what was appended), the
    values of its buffers and other non-parameter tensors (in place), and
    the global random stream.

    Parameters are not copied up front (a model's weights are most of its
    memory, and copying them doubled ResNet-18's trace time): the tracer
    calls :meth:`before_write` ahead of each core op that writes a tensor
    (``self.gain *= 0.5``, ``self.w[...] = v``, ``self.w.view(-1)[0] += 1``),
    and the value of each parameter it writes or views is taken then, once."""

    def __init__(self, module):
        self.snapshot = ModuleSnapshot(module)
        self.values = []
        self.params = {}          # id -> parameter not yet copied (copied on its first write)
        seen = set()
        for m in type(module).modules(module):
            d = m.__dict__
            for t in d.get("_parameters", {}).values():
                if isinstance(t, Tensor) and not getattr(t, "readonly", False):
                    self.params.setdefault(id(t), t)
            for t in _tensors(list(d.get("_buffers", {}).values()) + list(d.values())):
                if id(t) not in seen and not getattr(t, "readonly", False) \
                        and type(t).__name__ != "Parameter":
                    seen.add(id(t))
                    self.values.append((t, t.copy()))
        self.rng = _random.get_rng().get_state()

    def before_write(self, t):
        """Take the value of each parameter ``t`` is, or views, before this
        first write into it."""
        p = self.params.pop(id(t), None)
        if p is not None:
            self.values.append((p, p.copy()))
        elif self.params:               # a view of a parameter (w.view(-1)[0] += 1)
            held = list(self.params.values())
            for _, members in storage_spans([t] + held):
                if any(i == 0 for i, _ in members):
                    for i, _ in members:
                        if i:
                            self.values.append((held[i - 1], held[i - 1].copy()))
                            del self.params[id(held[i - 1])]

    def restore(self, rng=True):
        """Put the modules back as they were (``rng``: the random stream too)."""
        self.snapshot.restore()
        for t, saved in self.values:
            t[...] = saved
        if rng:
            _random.get_rng().set_state(self.rng)


def _tensors(values, depth=0):
    """The Tensors among ``values``, looking into lists, tuples and dicts."""
    for v in values:
        if isinstance(v, Tensor):
            yield v
        elif isinstance(v, (list, tuple)) and depth < 16:
            yield from _tensors(v, depth + 1)
        elif isinstance(v, dict) and depth < 16:
            yield from _tensors(v.values(), depth + 1)


def copy_inputs(tree):
    """``tree`` with every Tensor copied (one copy per tensor object, so an
    argument passed twice stays one tensor)."""
    copies = {}

    def cp(t):
        if id(t) not in copies:
            copies[id(t)] = t.copy()
        return copies[id(t)]
    return tree_map(cp, tree, lambda v: isinstance(v, Tensor))


def snapshot(value):
    """A NumPy copy of a Tensor; other values as they are."""
    if isinstance(value, Tensor):
        return np.array(value.numpy(), copy=True)
    return value


# ------------------------------------------------------------ comparisons
def difference(got, want):
    """None when ``got`` (a run's value) matches ``want`` (a snapshot), else
    a short description of how they differ. Floats compare to 1e-5
    relative, 1e-6 absolute (NaNs equal); ints, bools and other values
    exactly."""
    if isinstance(want, np.ndarray):
        if not isinstance(got, Tensor):
            return f"expected a tensor, got {type(got).__name__}"
        g = got.numpy()
        if g.shape != want.shape:
            return f"shape {g.shape}, expected {want.shape}"
        if g.dtype != want.dtype:
            return f"dtype {g.dtype}, expected {want.dtype}"
        if want.dtype.kind == "f" or want.dtype.name == "bfloat16":
            a, b = g.astype(np.float64), want.astype(np.float64)
            close = np.isclose(a, b, rtol=1e-5, atol=1e-6, equal_nan=True)
        else:
            close = g == want
        if close.all():
            return None
        bad = np.argwhere(~close)[0]
        where = tuple(int(i) for i in bad)
        return (f"{int((~close).sum())} of {close.size} elements differ, first at index "
                f"{where}: {g[where].item()!r}, expected {want[where].item()!r}")
    g = int(got) if isinstance(got, int) and not isinstance(got, bool) else got
    if g != want and not (isinstance(want, float) and np.isnan(want) and np.isnan(g)):
        return f"{got!r}, expected {want!r}"
    return None


def check_outputs(tm, got, want_leaves, out_def):
    """Raise TraceCheckError naming the first output leaf of ``got`` that
    differs from ``want_leaves`` (snapshots of the eager outputs)."""
    leaves, tdef = tree_flatten(got, lambda v: isinstance(v, (Tensor, int, float)))
    if tdef != out_def or len(leaves) != len(want_leaves):
        raise TraceCheckError(
            f"trace_module: the traced {tm._orig_name} returns {tdef}, but the eager forward "
            f"returned {out_def}")
    paths = _leaf_paths(out_def)
    for i, (g, w) in enumerate(zip(leaves, want_leaves)):
        diff = difference(g, w)
        if diff is not None:
            where = paths[i] if paths else f"out[{i}]"
            what = "the output" if where == "out" else f"output {where}"
            raise TraceCheckError(
                f"trace_module: the traced {tm._orig_name} does not reproduce the eager result: "
                f"{what} differs: {diff}. Something forward did was not recorded (a "
                "value computed outside mgtrace, a global that changed); "
                "mgtrace.traced_module.enable_expr_checker() finds the first expr that differs, "
                "disable_default_checker() turns this check off")


def _leaf_paths(tdef, prefix="out"):
    """``out[0]``, ``out['logits']``... for each leaf slot of ``tdef``."""
    if isinstance(tdef, LeafDef):
        return [prefix] if tdef.is_slot else []
    if tdef.type is _Root:
        return _leaf_paths(tdef.children[0], prefix)
    keys = tdef.aux if isinstance(tdef.aux, (list, tuple)) and \
        len(tdef.aux) == len(tdef.children) else range(len(tdef.children))
    out = []
    for k, c in zip(keys, tdef.children):
        out += _leaf_paths(c, f"{prefix}[{k!r}]")
    return out


class ExprCheck:
    """Compares the value of each node, the first time a run computes it,
    with the one seen while tracing (``recorded``: ``{id(node): (node,
    snapshot)}``)."""

    def __init__(self, recorded):
        self.recorded = recorded
        self.seen = set()

    def watched(self, graph):
        """The nodes of ``graph`` that have a traced value."""
        return [n for e in graph._exprs for n in e.outputs
                if id(n) in self.recorded and isinstance(n, (TensorNode, ValueNode))]

    def watcher(self, graph):
        """The ``watch(node_id, value)`` callback for ``graph``'s generated code."""
        by_id = {n.id: n for n in self.watched(graph)}

        def watch(node_id, value):
            n = by_id[node_id]
            if id(n) in self.seen:
                return
            self.seen.add(id(n))
            diff = difference(value, self.recorded[id(n)][1])
            if diff is not None:
                e = n.expr
                where = f", traced at {e.source}" if e.source else ""
                raise TraceCheckError(
                    f"trace_module: expr {e!r} in {graph.qualname}{where} does not reproduce its "
                    f"traced value: {n.qualname} {diff}")
        return watch
