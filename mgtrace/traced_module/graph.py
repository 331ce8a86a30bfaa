"""InternalGraph: the exprs of one traced ``forward``, and the tools to query
and edit it.

A graph belongs to a TracedModule (``graph.owner``); its first input is the
``self`` ModuleNode, the others are the tensors (and symbolic ints) of the
call's arguments, whose structure is ``in_def`` (a TreeDef of the bound
arguments of forward, one slot per input node). ``outputs`` with
``out_def`` give the result.

Queries return a :class:`NodeFilter` / :class:`ExprFilter` that can be
narrowed and read with ``as_list()``, ``as_unique()``, ``as_dict()`` or
``as_count()``. Edits (``insert_exprs``, ``insert_function``,
``replace_node``, ``compile``, ``reset_inputs``/``reset_outputs``,
``add_input_node``/``add_output_node``) keep node users consistent; run
``lint()`` after editing to be sure.
"""
import contextlib
import fnmatch
import inspect

from mgtrace.traced_module.expr import (CallFunction, CallMethod, Constant, Expr, GetAttr,
                                        Input, is_node)
from mgtrace.traced_module.node import ModuleNode, Node, TensorNode
from mgtrace.traced_module.pytree import LeafDef, SLOT, TreeDef, tree_flatten

__all__ = ["InternalGraph", "GraphError", "NodeFilter", "ExprFilter"]


class GraphError(ValueError):
    """A graph is malformed, or an edit would make it so."""


class InternalGraph:
    """The graph of one traced forward (see the module docstring)."""

    def __init__(self, name, qualname, owner=None):
        self._name = name
        self._qualname = qualname
        self.owner = owner
        self._exprs = []
        self._inputs = []
        self._outputs = []
        self._in_def = None
        self._out_def = None
        self._names = {}          # name -> node
        self._version = 0         # bumped by every edit; compiled code is cached per version

    # ---------------------------------------------------------------- basics
    @property
    def name(self):
        return self._name

    @property
    def qualname(self):
        return self._qualname

    @property
    def inputs(self):
        return list(self._inputs)

    @property
    def outputs(self):
        return list(self._outputs)

    @property
    def in_def(self):
        return self._in_def

    @property
    def out_def(self):
        return self._out_def

    def _touch(self):
        self._version += 1

    def _unique_name(self, base):
        base = base or "v"
        if base not in self._names:
            return base
        i = 1
        while f"{base}_{i}" in self._names:
            i += 1
        return f"{base}_{i}"

    def _add_node(self, node, base=None):
        node._name = self._unique_name(base if base is not None else node._name)
        node.graph = self
        self._names[node._name] = node
        return node

    def _rename(self, node, new):
        if new in self._names and self._names[new] is not node:
            raise GraphError(f"graph {self._qualname} already has a node named {new!r}")
        self._names.pop(node._name, None)
        self._names[new] = node
        self._touch()

    def _append(self, expr, at=None):
        """Put ``expr`` in the graph (at index ``at``, default the end) and
        register it as a user of its inputs."""
        expr.graph = self
        for n in expr._inputs:
            n._add_user(expr)
        if at is None:
            self._exprs.append(expr)
        else:
            self._exprs.insert(at, expr)
        self._touch()
        return expr

    def _add_input(self, node):
        e = Input(node.name)
        e.outputs = [node]
        node.expr = e
        self._append(e)
        self._inputs.append(node)
        return node

    # ------------------------------------------------------------- traversal
    def exprs(self, recursive=True):
        """ExprFilter over the exprs in order; with ``recursive`` also those
        of the graphs of called TracedModules (each called graph once)."""
        return ExprFilter(self._walk_exprs(recursive, set()))

    def _walk_exprs(self, recursive, seen):
        seen.add(id(self))
        for e in self._exprs:
            yield e
            if recursive:
                sub = called_graph(e)
                if sub is not None and id(sub) not in seen:
                    yield from sub._walk_exprs(True, seen)

    def nodes(self, recursive=True):
        """NodeFilter over the nodes (inputs, then each expr's outputs)."""
        def gen():
            for e in self.exprs(recursive):
                yield from e.outputs
        return NodeFilter(gen())

    # -------------------------------------------------------------- queries
    def get_function_by_type(self, func=None, recursive=True):
        """CallFunction exprs (of ``func`` when given)."""
        return self.exprs(recursive).call_function(func)

    def get_method_by_type(self, method=None, recursive=True):
        """CallMethod exprs (named ``method`` when given, e.g. ``"__call__"``)."""
        return self.exprs(recursive).call_method(method)

    def get_module_by_type(self, module_cls, recursive=True):
        """ModuleNodes whose module is an instance of ``module_cls``."""
        return self.nodes(recursive).type(ModuleNode).filter(
            lambda n: n.expr.kind != "input" and isinstance(n.owner, module_cls))

    def get_node_by_name(self, name=None, ignorecase=True, recursive=True):
        """Nodes whose qualname (or plain name) matches ``name``; shell
        wildcards (``*``, ``?``, ``[...]``) allowed: ``"*conv1*"``."""
        return self.nodes(recursive).name(name, ignorecase)

    def get_node_by_id(self, node_id, recursive=True):
        return self.nodes(recursive).filter(lambda n: n.id == node_id)

    def get_expr_by_id(self, expr_id, recursive=True):
        return self.exprs(recursive).filter(lambda e: e.id == expr_id)

    # ---------------------------------------------------------------- edits
    @contextlib.contextmanager
    def insert_exprs(self, expr=None):
        """Record ordinary Python on this graph's nodes as new exprs.

        Inside the ``with`` block, calling mgtrace.functional functions,
        tensor operators and methods, or the owner's submodules with Nodes
        of this graph creates exprs and returns new Nodes. They are
        inserted after ``expr`` (default: after the last expr).

        >>> # with graph.insert_exprs(conv_out.expr):
        >>> #     act = F.relu(conv_out)
        """
        from mgtrace.traced_module.tracer import insertion
        if expr is not None and expr.graph is not self:
            raise GraphError(f"expr {expr!r} is not in graph {self._qualname}")
        pos = len(self._exprs) if expr is None else self._exprs.index(expr) + 1
        with insertion(self, pos):
            yield self
        self._touch()

    def insert_function(self, func, *args, **kwargs):
        """Insert a call ``func(*args, **kwargs)`` (args may hold Nodes of this
        graph) right after the last expr that defines one of its inputs;
        return its output Node(s). ``func`` should be an
        ``mgtrace.functional`` function or one made traceable with ``wrap``."""
        from mgtrace.traced_module.tracer import traceable_call
        nodes = tree_flatten((args, kwargs), is_node)[0]
        for n in nodes:
            if n.graph is not self:
                raise GraphError(f"node {n!r} is not in graph {self._qualname}")
        last = max((self._exprs.index(n.expr) for n in nodes), default=-1)
        after = self._exprs[last] if last >= 0 else None
        with self.insert_exprs(after):
            return traceable_call(func)(*args, **kwargs)

    def replace_node(self, repl):
        """Make every user (and graph output) of each key node read its value
        node instead: ``graph.replace_node({old: new})``. Users that come
        before ``new`` is defined are left alone (no cycles)."""
        for old, new in repl.items():
            if old.graph is not self or new.graph is not self:
                raise GraphError("replace_node: both nodes must belong to this graph")
            start = self._position_after(new)
            for e in list(old.users):
                if e is new.expr:
                    continue
                if self._exprs.index(e) >= start:
                    e.replace_input(old, new)
            self._outputs = [new if o is old else o for o in self._outputs]
        self._touch()

    def _position_after(self, node):
        return self._exprs.index(node.expr) + 1 if node.expr in self._exprs else 0

    def compile(self):
        """Remove exprs whose results nobody uses (dead code), except those
        with side effects (writes such as ``x[i] = v`` and ``x += y``)."""
        live = {id(n) for n in self._outputs}
        keep = []
        for e in reversed(self._exprs):
            if isinstance(e, Input) or _has_side_effect(e) or any(id(o) in live for o in e.outputs):
                keep.append(e)
                live.update(id(n) for n in e._inputs)
            else:
                for n in e._inputs:
                    n._remove_user(e)
                for o in e.outputs:
                    self._names.pop(o._name, None)
        self._exprs = keep[::-1]
        self._touch()
        return self

    def reset_outputs(self, outputs):
        """Make ``outputs`` (a Node or a pytree of Nodes of this graph) the
        graph's result, e.g. to cut the graph at a node. Top graphs only."""
        self._check_top("reset_outputs")
        leaves, out_def = tree_flatten(outputs, is_node)
        for n in leaves:
            if n.graph is not self:
                raise GraphError(f"reset_outputs: {n!r} is not a node of {self._qualname}")
        self._outputs = leaves
        self._out_def = out_def
        self._touch()

    def add_output_node(self, node):
        """Append ``node`` to the outputs (a single output becomes a tuple)."""
        self._check_top("add_output_node")
        old = self._out_def.unflatten(self._outputs)
        new = old + (node,) if isinstance(old, tuple) else (old, node)
        self.reset_outputs(new)

    def add_input_node(self, shape, dtype="float32", name="args"):
        """A new tensor input (appended as a positional parameter of forward,
        named ``name``); returns its TensorNode. Top graphs only."""
        import numpy as np
        self._check_top("add_input_node")
        owner = self.owner
        pname = name
        params = list(owner._signature.parameters.values())
        if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.KEYWORD_ONLY) for p in params):
            raise GraphError("add_input_node: forward takes *args, **kwargs or keyword-only "
                             "parameters; reset_inputs instead")
        names = {p.name for p in params}
        i = 1
        while pname in names:
            pname = f"{name}_{i}"
            i += 1
        params.append(inspect.Parameter(pname, inspect.Parameter.POSITIONAL_OR_KEYWORD))
        node = self._add_node(TensorNode(name=pname, shape=tuple(shape), dtype=np.dtype(dtype)), pname)
        e = Input(pname)
        e.outputs = [node]
        node.expr = e
        n_in = sum(isinstance(x, Input) for x in self._exprs)
        self._append(e, at=n_in)
        self._inputs.append(node)
        d = self._in_def
        self._in_def = TreeDef(d.type, d.aux, d.children + (LeafDef(SLOT),))
        owner._signature = owner._signature.replace(parameters=params)
        return node

    def reset_inputs(self, *args, **kwargs):
        """Give forward a new argument structure: ``args``/``kwargs`` are
        bound to forward's parameters; their leaves are existing input nodes
        of this graph (kept) or example Tensors (each becomes a new input).
        Old inputs left out must have no users. Returns the input nodes."""
        from mgtrace._core import Tensor
        self._check_top("reset_inputs")
        bound = self.owner._signature.bind(*args, **kwargs)
        bound.apply_defaults()
        canon = tuple(bound.arguments.values())
        leaves, in_def = tree_flatten(canon, lambda v: isinstance(v, (Node, Tensor)))
        nodes = []
        for i, v in enumerate(leaves):
            if isinstance(v, Node):
                if v not in self._inputs[1:]:
                    raise GraphError(f"reset_inputs: {v!r} is not an input of this graph")
                nodes.append(v)
            else:
                nodes.append(self._add_node(TensorNode(shape=v.shape, dtype=v.dtype), f"arg{i}"))
        dropped = [n for n in self._inputs[1:] if n not in nodes]
        for n in dropped:
            if n.users:
                raise GraphError(f"reset_inputs: input {n.name!r} is still used by {n.users[0]!r}")
        self._exprs = [e for e in self._exprs
                       if not (isinstance(e, Input) and e.outputs[0] in dropped)]
        for n in dropped:
            self._names.pop(n._name, None)
        for n in nodes:
            if n.expr is None:
                e = Input(n.name)
                e.outputs = [n]
                n.expr = e
                self._append(e, at=sum(isinstance(x, Input) for x in self._exprs))
        self._inputs = [self._inputs[0]] + nodes
        self._in_def = in_def
        self._touch()
        return nodes

    def _check_top(self, what):
        owner = self.owner
        if owner is None or not getattr(owner, "_is_top", False):
            raise GraphError(f"{what} works on the top graph of a TracedModule (this is "
                             f"{self._qualname}); flatten() first to edit inner graphs")

    # ----------------------------------------------------------------- lint
    def check(self, recursive=True):
        """A list of problems (empty when the graph is sound): undefined or
        foreign inputs, inconsistent users, duplicate names, missing outputs."""
        problems = []
        self._check_into(problems, recursive, set())
        return problems

    def lint(self, recursive=True):
        """Raise GraphError listing every problem :meth:`check` finds."""
        problems = self.check(recursive)
        if problems:
            raise GraphError(f"graph {self._qualname} is broken:\n  " + "\n  ".join(problems))
        return self

    def _check_into(self, problems, recursive, seen):
        seen.add(id(self))
        q = self._qualname
        defined = set()
        names = {}
        for e in self._exprs:
            if e.graph is not self:
                problems.append(f"{q}: expr {e!r} says it belongs to another graph")
            for n in e._inputs:
                if id(n) not in defined:
                    problems.append(f"{q}: {e!r} reads {n!r} before it is defined (or from another graph)")
                if not any(u is e for u in n.users):
                    problems.append(f"{q}: {n!r} is read by {e!r} but does not list it as a user")
            for o in e.outputs:
                if o.graph is not self:
                    problems.append(f"{q}: node {o!r} says it belongs to another graph")
                if o.expr is not e:
                    problems.append(f"{q}: node {o!r} is an output of {e!r} but names another producer")
                if o.name in names:
                    problems.append(f"{q}: two nodes are named {o.name!r}")
                names[o.name] = o
                defined.add(id(o))
                for u in o.users:
                    if u.graph is not self or u not in self._exprs:
                        problems.append(f"{q}: {o!r} lists a user that is not in the graph: {u!r}")
                    elif not any(i is o for i in u._inputs):
                        problems.append(f"{q}: {o!r} lists {u!r} as a user, but it does not read it")
            if recursive:
                sub = called_graph(e)
                if sub is not None and id(sub) not in seen:
                    sub._check_into(problems, True, seen)
        for n in self._inputs:
            if id(n) not in defined:
                problems.append(f"{q}: input {n!r} has no Input expr")
        for n in self._outputs:
            if id(n) not in defined:
                problems.append(f"{q}: output {n!r} is not defined in the graph")
        if self._out_def is not None and self._out_def.num_leaves != len(self._outputs):
            problems.append(f"{q}: out_def has {self._out_def.num_leaves} slots for "
                            f"{len(self._outputs)} outputs")

    # ------------------------------------------------------------- printing
    def __repr__(self):
        lines = [f"{self._qualname}.Graph (self, " + ", ".join(map(repr, self._inputs[1:])) + ") {"]
        for e in self._exprs:
            if isinstance(e, Input):
                continue
            lines.append(f"\t{e!r}")
        out = self._out_def.unflatten(self._outputs) if self._out_def is not None else self._outputs
        lines.append(f"\treturn {out!r}")
        lines.append("}")
        return "\n".join(lines)


def _has_side_effect(e):
    if isinstance(e, CallMethod):
        return e.method == "__setitem__" or (e.method.startswith("__i") and e.method.endswith("__"))
    return not e.outputs and not isinstance(e, (GetAttr, Constant))


def called_graph(e):
    """The graph a module-call expr runs, when the callee is a TracedModule."""
    if isinstance(e, CallMethod) and e.method == "__call__" and e.arg_def is not None:
        mod = e.args[0].owner if isinstance(e.args[0], ModuleNode) else None
        graphs = getattr(mod, "_graphs", None)
        if graphs:
            for g in graphs:
                if g._in_def == e.arg_def:
                    return g
    return None


class _Filter:
    """Shared read-out of NodeFilter and ExprFilter."""

    def __init__(self, items):
        self._items = items if isinstance(items, list) else list(items)

    def __iter__(self):
        return iter(self._items)

    def __len__(self):
        return len(self._items)

    def filter(self, pred):
        return type(self)(x for x in self._items if pred(x))

    def as_list(self):
        return list(self._items)

    def as_count(self):
        return len(self._items)

    def as_unique(self):
        """The only item; ValueError when there are none or several."""
        if len(self._items) != 1:
            raise ValueError(f"expected exactly one match, found {len(self._items)}: "
                             f"{self._items[:5]!r}")
        return self._items[0]

    def as_dict(self):
        """``{id: item}``."""
        return {x.id: x for x in self._items}

    def __repr__(self):
        return f"{type(self).__name__}({self._items!r})"


class NodeFilter(_Filter):
    """Nodes, narrowed by ``type(cls)`` or ``name(pattern)``."""

    def type(self, cls):
        return self.filter(lambda n: isinstance(n, cls))

    def name(self, pattern, ignorecase=True):
        if pattern is None:
            return self
        pat = pattern.lower() if ignorecase else pattern

        def hit(n):
            names = (n.qualname, n.name)
            if ignorecase:
                names = tuple(s.lower() for s in names)
            return any(fnmatch.fnmatchcase(s, pat) for s in names)
        return self.filter(hit)


class ExprFilter(_Filter):
    """Exprs, narrowed by ``call_function(fn)`` or ``call_method(name)``."""

    def call_function(self, func=None):
        def hit(e):
            if not isinstance(e, CallFunction):
                return False
            return func is None or e.func is func or getattr(e.func, "__wrapped__", None) is func
        return self.filter(hit)

    def call_method(self, method=None):
        return self.filter(lambda e: isinstance(e, CallMethod) and (method is None or e.method == method))

    def expr_type(self, cls):
        return self.filter(lambda e: isinstance(e, cls))

