"""What the passes share besides the matchers (``match.py``): walking a
module's graphs, reading constant operands, inserting constants, and who
reads and writes a module's state (:class:`StateUses`).

Nothing here edits a graph; the passes do (through the graph's own editing
API: ``insert_exprs``, ``replace_node``, ``compile``).
"""
import numpy as np

from mgtrace._core import Tensor, op_table
from mgtrace._core.tensor import storage_spans
from mgtrace.functional._trace import mutated_arguments
from mgtrace.traced_module.codegen import member
from mgtrace.traced_module.expr import (CallFunction, CallMethod, Constant, GetAttr, Input,
                                        called_graph, is_node)
from mgtrace.traced_module.node import ModuleNode, TensorNode
from mgtrace.traced_module.passes.match import bound_args, module_call, unwrap
from mgtrace.traced_module.pytree import tree_flatten

__all__ = ["graphs_of", "attr_value", "const_value", "call_counts", "insert_constant",
           "float_node", "StateUses"]


def graphs_of(tm):
    """The graphs a call of ``tm`` can run, each once: its own and, through
    module calls, those of the traced submodules it calls (a submodule left
    behind by flatten() or an edit, which nothing calls, is not visited)."""
    seen, todo = set(), list(tm._graphs)
    while todo:
        g = todo.pop(0)
        if id(g) in seen:
            continue
        seen.add(id(g))
        yield g
        todo.extend(sub for sub in map(called_graph, list(g._exprs)) if sub is not None)


def attr_value(node):
    """The object a GetAttr node reads from its graph's owner (None when
    ``node`` is not such a read)."""
    e = node.expr
    if not isinstance(e, GetAttr) or e.args[0] is not node.graph._inputs[0]:
        return None
    obj = node.graph.owner
    try:
        for p in e.name.split("."):
            obj = member(obj, p)
    except AttributeError:
        return None
    return obj


def const_value(v):
    """The value of a constant operand, else None: a Python int or float, a
    tensor held by a Constant expr, or a tensor attribute (parameter or
    buffer) read by GetAttr (constants for inference: an optimized module's
    weights are not expected to change)."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return v
    if isinstance(v, TensorNode):
        if isinstance(v.expr, Constant) and isinstance(v.expr.value, Tensor):
            return v.expr.value
        t = attr_value(v)
        if isinstance(t, Tensor):
            return t
    return None


def call_counts(tm):
    """``{id(module): number of call exprs}`` over every graph of ``tm``: a
    pass may rewrite a module's weights only when one call uses it."""
    counts = {}
    for g in graphs_of(tm):
        for e in g._exprs:
            if isinstance(e, CallMethod) and e.method == "__call__" and isinstance(e.args[0], ModuleNode):
                k = id(e.args[0].owner)
                counts[k] = counts.get(k, 0) + 1
    return counts


def insert_constant(graph, before, value, name):
    """A new Constant expr holding ``value`` right before expr ``before``;
    returns its TensorNode."""
    c = Constant(value, name)
    node = TensorNode(name=name, shape=tuple(value.shape), dtype=np.dtype(value.dtype.name))
    graph._add_node(node, name)
    node.expr = c
    c.outputs = [node]
    graph._append(c, at=graph._exprs.index(before))
    return node


def float_node(n):
    """Whether ``n`` is a TensorNode of a floating dtype."""
    return isinstance(n, TensorNode) and n.dtype is not None and np.dtype(n.dtype).kind == "f" \
        or (isinstance(n, TensorNode) and getattr(n.dtype, "name", "") == "bfloat16")


# ------------------------------------------------------------------- state

# tensor methods whose result may share storage with the tensor they are
# called on, so that a write into the result writes into it (op table: the
# view and cast groups, indexing, the in-place forms; the tensor-only
# methods that return a node)
_ALIASING_METHODS = frozenset(
    {op.method for op in op_table.OPS.values() if op.group in ("view", "cast") and op.method}
    | {op_table.OPS["getitem"].method} | op_table.inplace_methods()
    | {m for m, k in op_table.TENSOR_ONLY_METHODS.items() if k == "node" and m != "copy"})
# mgtrace.functional's spellings of the views
_ALIASING_FUNCTIONS = frozenset(
    {op.name for op in op_table.OPS.values() if op.group == "view"} | {"flatten", "permute"})


def _written_nodes(e):
    """The nodes expr ``e`` writes into: an in-place method's self tensor,
    an ``out=`` argument, a function's arguments declared with
    :func:`mgtrace.functional._trace.mutates`."""
    out = []
    if isinstance(e, CallMethod) and e.method in CallMethod.IN_PLACE:
        out.append(e.args[0])
    if "out" in e.kwargs:
        out += tree_flatten(e.kwargs["out"], is_node)[0]
    if isinstance(e, CallFunction):
        names = mutated_arguments(e.func, e.args, e.kwargs)
        if names:
            a = bound_args(e)
            if a is None:
                out += list(e._inputs)          # cannot tell which: all of them
            else:
                for n in names:
                    out += tree_flatten(a.get(n), is_node)[0]
    return [n for n in out if isinstance(n, TensorNode)]


def _alias_source(e):
    """The tensor node whose storage the result of ``e`` may share (a view,
    an in-place method's result), else None."""
    if isinstance(e, CallMethod) and e.method in _ALIASING_METHODS:
        return e.args[0]
    if isinstance(e, CallFunction) and unwrap(e.func).__name__ in _ALIASING_FUNCTIONS \
            and (getattr(unwrap(e.func), "__module__", "") or "").startswith("mgtrace.functional"):
        return e._inputs[0] if e._inputs else None
    return None


def _module_tensors(m):
    """The tensors a builtin module holds (parameters and buffers, by name)."""
    d = getattr(m, "__dict__", {})
    return [t for table in ("_parameters", "_buffers") for t in (d.get(table) or {}).values()
            if isinstance(t, Tensor)]


class StateUses:
    """Who reads and who writes the modules and tensors of a TracedModule,
    over every graph a call of it runs: the one rule the passes ask before
    they fold a value or rewrite a parameter.

    Mutable state is what a forward writes into, in any graph, in any mode:
    the self tensor of an in-place method (the op table's in-place forms and
    ``__setitem__``), an ``out=`` argument, the arguments a function
    declares with :func:`mgtrace.functional._trace.mutates`, and every
    tensor of a builtin module whose call updates its state
    (``mutates_state``, a BatchNorm in training). A write through a view
    (``buf.reshape(-1)[0] = v``) or inside a traced submodule (into one of
    its inputs) is a write into the tensor the view or the caller's
    argument reads. Such a tensor is no constant (:meth:`constant`) and a
    pass never bakes its value in.

    A pass that gives a layer new weights (FuseConvBn, BackwardFoldScale)
    gives the module new Parameter objects (the old ones, which other
    modules may hold, are left as they were), and does so only where
    :meth:`may_rewrite` says that the one call it fuses is the layer's only
    reader: no second call of the module (a shared or twice-called layer),
    no attribute read of the module elsewhere (``F.conv2d(x,
    self.conv.weight)``, the module under another name), none of its
    tensors read by an attribute read or a constant, none of them written.

    Computed once per pass run: a pass's own edits (constants it inserts)
    are not counted.
    """

    def __init__(self, tm):
        self.calls = {}          # id(module) -> number of module-call exprs
        self.reads = {}          # id(module or tensor) -> reads other than those calls
        self.written = set()     # ids of written tensors and of the nodes holding them
        self.opaque = False      # an attribute read this class cannot follow
        objects, callers, writes = {}, {}, []
        for g in graphs_of(tm):
            for e in g._exprs:
                if isinstance(e, GetAttr):
                    self._attr_read(e, objects)
                elif isinstance(e, Constant) and isinstance(e.value, Tensor):
                    self._count(e.value)
                    objects[id(e.outputs[0])] = e.value
                m = module_call(e)
                if isinstance(e, CallMethod) and e.method == "__call__" \
                        and isinstance(e.args[0], ModuleNode):
                    owner = e.args[0].owner
                    self.calls[id(owner)] = self.calls.get(id(owner), 0) + 1
                    sub = called_graph(e)
                    if sub is not None:
                        callers.setdefault(id(sub), []).append(e)
                if m is not None and getattr(m, "mutates_state", False):
                    self.written.update(id(t) for t in _module_tensors(m))
                writes += _written_nodes(e)
        self._resolve(writes, objects, callers)
        self._shared_storage(tm, objects)

    def _count(self, obj):
        self.reads[id(obj)] = self.reads.get(id(obj), 0) + 1

    def _attr_read(self, e, objects):
        """Count GetAttr ``e``'s read of a tensor, or of a module used other
        than as the callee of a call (passed to a function, returned)."""
        src = e.args[0]
        base = objects.get(id(src))
        if base is None and src is src.graph._inputs[0]:
            base = src.graph.owner
        obj = None
        if base is not None:
            obj = base
            try:
                for p in e.name.split("."):
                    obj = member(obj, p)
            except AttributeError:
                obj = None
        if obj is None:
            self.opaque = True
            return
        out = e.outputs[0]
        objects[id(out)] = obj
        if isinstance(obj, Tensor):
            self._count(obj)
        elif isinstance(out, ModuleNode):
            for u in out.users:
                callee = isinstance(u, CallMethod) and u.method == "__call__" and u.args[0] is out
                if not callee and not isinstance(u, GetAttr):
                    self._count(obj)
        elif isinstance(obj, (list, tuple, dict)):
            self.opaque = True          # a container of modules or tensors: not followed

    def _resolve(self, writes, objects, callers):
        """Mark the written nodes, the tensors they hold, and through views
        and traced-submodule inputs the nodes and tensors they alias."""
        todo = list(writes)
        while todo:
            n = todo.pop()
            if id(n) in self.written:
                continue
            self.written.add(id(n))
            obj = objects.get(id(n))
            if isinstance(obj, Tensor):
                self.written.add(id(obj))
            e = n.expr
            if isinstance(e, Input):
                # an input of a traced submodule's graph: what its callers pass
                for call in callers.get(id(n.graph), ()):
                    todo += [a for a in call._inputs if isinstance(a, TensorNode)]
                continue
            src = _alias_source(e) if e is not None else None
            if isinstance(src, TensorNode):
                todo.append(src)

    def _shared_storage(self, tm, objects):
        """A tensor that shares storage with a written one (``self.head =
        self.stat[:2]`` beside ``self.stat += v``) is written too, and so is
        every node that reads it."""
        tensors, seen = [], set()
        for t in [o for o in objects.values() if isinstance(o, Tensor)] + \
                [t for m in type(tm).modules(tm) for t in _module_tensors(m)]:
            if id(t) not in seen:
                seen.add(id(t))
                tensors.append(t)
        for _, members in storage_spans(tensors):
            group = [tensors[i] for i, _ in members]
            if any(id(t) in self.written for t in group):
                self.written.update(id(t) for t in group)
        self.written.update(k for k, o in objects.items()
                            if isinstance(o, Tensor) and id(o) in self.written)

    def is_written(self, v):
        """Whether ``v`` (a tensor, or a node) is written by some run of the
        module (see the class docstring)."""
        return id(v) in self.written

    def constant(self, v):
        """:func:`const_value` of ``v``, None where ``v`` is mutable state:
        a written node, or one that reads a written tensor."""
        if isinstance(v, TensorNode) and id(v) in self.written:
            return None
        c = const_value(v)
        return None if isinstance(c, Tensor) and id(c) in self.written else c

    def may_rewrite(self, mod, *others):
        """Whether a pass may give builtin module ``mod`` new weights folded
        from the one call of it it rewrites (and values read from the
        modules ``others``, e.g. the BatchNorm folded in): see the class
        docstring."""
        if self.opaque or self.calls.get(id(mod)) != 1 or self.reads.get(id(mod)):
            return False
        if any(self.reads.get(id(t)) or id(t) in self.written for t in _module_tensors(mod)):
            return False
        return not any(id(t) in self.written for o in others for t in _module_tensors(o))
