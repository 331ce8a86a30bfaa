"""The edit recorder: what ``graph.insert_exprs()`` and
``graph.insert_function()`` run under (MegEngine's graph-editing API).

Inside an insert_exprs block a Tracer on the graph's owner has one frame
whose exprs go to a fixed position; Nodes of the graph stand in for values
(``node.py`` forwards their operators and methods to :class:`_EditHooks`),
and module calls are checked against the callee's traced signatures (a user
module called there is traced on first use).
"""
import contextlib

import mgtrace.traced_module.node as node_module
from mgtrace._core import Tensor, apply, tensor as _tensor
from mgtrace.module.builtin import is_builtin
from mgtrace.module.module import Module
from mgtrace.traced_module.codegen import member
from mgtrace.traced_module.errors import GraphError, TraceError
from mgtrace.traced_module.expr import CallMethod, GetAttr
from mgtrace.traced_module.graph import reset_ids
from mgtrace.traced_module.node import ModuleNode, Node
from mgtrace.traced_module.pytree import tree_flatten
from mgtrace.traced_module.signature import bind_arguments, signature_of
from mgtrace.traced_module.symbolic import SymFloat, SymInt, state
from mgtrace.traced_module.traced_module import TracedModule, trace_module
from mgtrace.traced_module.tracer import Tracer, Frame, traced_leaf, core_off

__all__ = ["insertion", "traceable_call"]


class _EditFrame(Frame):
    """The frame of an insert_exprs block: Nodes of the graph may be used
    directly, but only those defined before the insertion point."""

    def node_of(self, v):
        if isinstance(v, Node):
            if v.graph is not self.graph:
                where = v.graph.qualname if v.graph is not None else "no graph"
                raise GraphError(f"insert_exprs on {self.graph.qualname}: {v!r} belongs to "
                                 f"{where}; use nodes of the graph being edited")
            if not any(e is v.expr for e in self.graph._exprs[:self.insert_at]):
                raise GraphError(f"insert_exprs on {self.graph.qualname}: {v!r} is defined after "
                                 f"the insertion point; insert after {v.expr!r} instead")
            return v
        return super().node_of(v)


class _EditTracer(Tracer):
    """Tracer for insert_exprs: module calls are single exprs; a call of a
    traced submodule must match one of its graphs (and records which).

    Work that does not touch the graph runs as usual, unrecorded: tensor
    operations and shape reads on tensors that are neither graph values
    nor parameters/buffers of the owner (so building a module inside the
    block works), and functional calls whose tensors are all such (a call
    without tensor arguments, e.g. ``F.ones((2, 3))``, is recorded)."""

    def _refresh(self):
        """Re-read module paths and attribute tensors: modules and tensors
        may be set on the owner inside the block."""
        fresh = Tracer(self.root, self.converted, self.warn_constants)
        self.paths, self.attrs = fresh.paths, fresh.attrs

    def attr_of(self, t):
        where = self.attrs.get(id(t))
        if where is None:
            self._refresh()
            where = self.attrs.get(id(t))
        return where

    def relpath(self, frame, module):
        if id(module) not in self.paths:
            self._refresh()
        return super().relpath(frame, module)

    def _graph_value(self, v):
        return isinstance(v, Node) or id(v) in self.frame.env or \
            (isinstance(v, Tensor) and self.attr_of(v) is not None)

    def _touches_graph(self, args, kwargs, creation_counts=False):
        leaves = tree_flatten((args, kwargs), traced_leaf)[0]
        if any(self._graph_value(v) for v in leaves):
            return True
        return creation_counts and not any(isinstance(v, Tensor) for v in leaves)

    def on_function(self, wrapper, fn, args, kwargs):
        if self._touches_graph(args, kwargs, creation_counts=True):
            return super().on_function(wrapper, fn, args, kwargs)
        with self.suspended():
            return fn(*args, **kwargs)

    def on_apply(self, opdef, *inputs):
        if self._touches_graph(inputs, opdef.params):
            return super().on_apply(opdef, *inputs)
        with self.suspended():
            return apply(opdef, *inputs)

    def on_method(self, t, method, args):
        if self._touches_graph((t,) + tuple(args), {}):
            return super().on_method(t, method, args)
        with self.suspended():
            return getattr(t, method)(*args)

    def on_shape(self, t):
        if self._graph_value(t):
            return super().on_shape(t)
        with core_off():
            return t.shape

    def on_create(self, target, data, dtype, device):
        # a tensor made from graph values is recorded; one made from plain data
        # (e.g. for a module built inside the block) is not
        if self._touches_graph((data,), {}):
            return super().on_create(target, data, dtype, device)
        with core_off():
            if target is None:
                return _tensor(data, dtype, device)
            Tensor.__init__(target, data, dtype, device)

    def on_bool(self, t):
        if self._graph_value(t):
            super().on_bool(t)

    def on_module_call(self, module, args, kwargs):
        frame = self.frame
        if module is frame.module:
            raise GraphError(f"insert_exprs on {frame.graph.qualname}: a graph cannot call its "
                             "own module (that would recurse forever)")
        try:
            mnode = frame.module_node(module)
        except TraceError as e:
            raise GraphError(f"insert_exprs: {e}") from None
        if is_builtin(module):
            return super().on_module_call(module, args, kwargs)
        graphs = getattr(module, "_graphs", None)
        name = getattr(module, "_qualname", type(module).__name__)
        canon = bind_arguments(signature_of(module), args, kwargs, name)
        arg_def = tree_flatten(canon, lambda v: isinstance(v, (Node, Tensor, SymInt, SymFloat)))[1]
        if not graphs:           # a user module, or a traced one never called: trace it now
            module, mnode = self._trace_on_first_use(frame, module, mnode, args, kwargs)
        elif module._graph_for(arg_def) is None:
            raise GraphError(f"insert_exprs: {name} was traced for arguments "
                             f"{[g.in_def for g in graphs]}, not {arg_def}; call it as it was "
                             "traced")

        def make(a, k):
            e = CallMethod(mnode, "__call__", a, k)
            e.arg_def = arg_def
            return e
        return self._record(make, lambda a, k: module._call_impl(a, k), args, kwargs,
                            f"{mnode.name}_out")

    def _trace_on_first_use(self, frame, module, mnode, args, kwargs):
        """Trace ``module`` (a user module, or a traced submodule that was
        never called) with placeholder values of ``args``, put the new
        TracedModule in its place in the owner's tree (same path, qualnames
        and ids of this tree) and return it with its ModuleNode."""
        source = module
        if isinstance(module, TracedModule):
            ref = module.__dict__.get("_orig_module")
            source = ref() if ref is not None else None
            if source is None:
                raise GraphError(f"insert_exprs: {module._qualname} was never called while "
                                 "tracing, so it has no graph, and the module it was traced "
                                 "from is gone (or it was loaded from an archive): trace the "
                                 "model again with a call of it")
        rel = self.relpath(frame, module)
        with core_off():
            leaves, tdef = tree_flatten((args, kwargs), traced_leaf)
            vargs, vkwargs = tdef.unflatten([frame.value_of(v) for v in leaves])
        with self.suspended():
            new = trace_module(source, *vargs, **vkwargs)
        new._is_top = False
        old_prefix = new._qualname
        prefix = f"{frame.graph.owner._qualname}.{rel}"
        for m in type(new).modules(new):
            if isinstance(m, TracedModule):
                m._qualname = prefix + m._qualname[len(old_prefix):]
                for g in m._graphs:
                    g._qualname = prefix + g._qualname[len(old_prefix):]
                    g._name = g._qualname.replace(".", "_")
        if frame.graph._ids is not None:    # the ids of this tree continue
            reset_ids(new, frame.graph._ids)
        *head, last = rel.split(".")
        parent = frame.module
        for p in head:
            parent = member(parent, p)
        parent._modules[last] = new
        parent.__dict__.pop(last, None)
        self._refresh()
        for n in frame.graph.nodes(False):
            if isinstance(n, ModuleNode) and n.owner is module:
                n.owner = new
        frame.modules.pop(id(module), None)
        frame.modules[id(new)] = mnode
        return new, mnode


class _EditHooks:
    """What node.py calls for an operator or method on a Node."""

    def __init__(self, tracer):
        self.tracer = tracer

    def record_method(self, node, method, args, kwargs):
        if "out" in kwargs:
            raise GraphError(f"{node!r}.{method}(out=...): in-place results are not recorded on "
                             "graph nodes; use the returned node")
        return self.tracer._record(lambda a, k: CallMethod(a[0], method, a[1:], k),
                                   lambda a, k: getattr(a[0], method)(*a[1:], **k),
                                   (node,) + tuple(args), dict(kwargs),
                                   method.strip("_") or "call")

    def record_function(self, fn, args, kwargs):
        return self.tracer.record_function(fn, args, kwargs, ints_out=True)

    def record_getattr(self, node, name):
        """``module_node.<name>``: a ModuleNode for a submodule, a TensorNode
        for a parameter or buffer (a GetAttr from the graph's self), the
        plain value for anything else."""
        owner = node.owner
        try:
            value = member(owner, name)
        except AttributeError:
            raise AttributeError(f"{node!r} ({type(owner).__name__}) has no attribute "
                                 f"{name!r}") from None
        frame = self.tracer.frame
        if isinstance(value, Module):
            try:
                return frame.module_node(value)
            except TraceError as e:
                raise GraphError(f"insert_exprs: {e}") from None
        if isinstance(value, Tensor):
            with core_off():
                return frame.node_of(value)
        return value


@contextlib.contextmanager
def insertion(graph, pos):
    """Record calls on ``graph``'s nodes as exprs inserted at index ``pos``.

    Inside: mgtrace.functional calls, module calls on the owner's
    submodules, and operators / tensor methods on the graph's Nodes each
    add one expr (returning Nodes); other tensor operations are recorded
    too (their tensors as constants). Yields the frame."""
    owner = graph.owner
    if owner is None:
        raise GraphError(f"insert_exprs: graph {graph.qualname} has no owning TracedModule")
    if state.tracer is not None:
        raise GraphError("insert_exprs: another insert_exprs block or trace_module is running; "
                         "finish it before editing a graph")
    tracer = _EditTracer(owner, {}, warn_constants=False)
    frame = _EditFrame(tracer, graph, owner, owner, "", insert_at=pos)
    for e in graph._exprs[:pos]:
        if isinstance(e, GetAttr) and isinstance(e.outputs[0], ModuleNode):
            frame.modules[id(e.outputs[0].owner)] = e.outputs[0]
    tracer.frames.append(frame)
    with tracer.active():
        saved, node_module.edit_hooks = node_module.edit_hooks, _EditHooks(tracer)
        try:
            yield frame
        finally:
            node_module.edit_hooks = saved


def traceable_call(func):
    """``func`` such that calling it on Nodes inside insert_exprs records
    it: functions made traceable (mgtrace.functional, ``wrap``) become one
    CallFunction; any other callable runs on the Nodes, so what its body
    does is recorded expr by expr (MegEngine's insert_function)."""
    if not callable(func):
        raise TypeError(f"insert_function takes a callable, not {type(func).__name__}")
    return func
