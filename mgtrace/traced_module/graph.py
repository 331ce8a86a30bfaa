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
``add_input_node``/``add_output_node``) keep node users consistent, bump
``graph._version`` (so the owner's generated code is rebuilt on the next
call and ``tm.code`` shows the change); run ``lint()`` after editing to be
sure.

Which graph to edit: each traced submodule has its own (``tm.layer1.graph``,
or ``node.graph`` / ``expr.top_graph`` of what a recursive query found). Edits
that change a graph's signature or result (``reset_inputs``,
``reset_outputs``, ``add_input_node``, ``add_output_node``) work on the top
graph only; ``flatten()`` first to reach inside submodules with them.

Insert a relu after a module call, rewire its users, drop dead code:

>>> import numpy as np, mgtrace as mt, mgtrace.functional as F, mgtrace.module as M
>>> class Net(M.Module):
...     def __init__(self):
...         super().__init__()
...         self.fc = M.Linear(3, 3)
...     def forward(self, x):
...         return self.fc(x) * 2
>>> net = Net()
>>> x = mt.tensor(np.arange(6, dtype=np.float32).reshape(2, 3) - 3)
>>> tm = mt.trace_module(net, x)
>>> g = tm.graph
>>> call = g.get_module_by_type(M.Linear).as_unique().users[0]
>>> out = call.outputs[0]
>>> with g.insert_exprs(call):
...     act = F.relu(out) + 1
>>> g.replace_node({out: act})
>>> g.compile().lint() is g
True
>>> "F.relu(fc_out)" in tm.code
True
>>> bool(np.allclose(tm(x).numpy(), ((F.relu(net.fc(x)) + 1) * 2).numpy()))
True
>>> g.get_node_by_name("Net.fc.[[]out]").as_unique() is out
True
"""
import contextlib
import fnmatch
import inspect
import weakref

import numpy as np

from mgtrace._core import Tensor
from mgtrace.functional._trace import mutated_arguments
from mgtrace.traced_module.errors import GraphError
from mgtrace.traced_module.expr import (CallFunction, CallMethod, Constant, GetAttr,
                                        Input, called_graph, is_node)
from mgtrace.traced_module.node import ModuleNode, Node, TensorNode, python_name, unlink_users
from mgtrace.traced_module.pytree import LeafDef, SLOT, TreeDef, tree_flatten

__all__ = ["InternalGraph", "GraphError", "NodeFilter", "ExprFilter"]


class IdSource:
    """The node and expr ids of one traced module tree (MegEngine numbers
    them from 0 per traced module): every graph of the tree shares one.
    :func:`reset_ids` numbers what a trace (or a load) made in walk order;
    nodes and exprs added later take the next numbers. ``dirty`` says the
    ids may differ from that walk order (the graphs were edited), which is
    when an archive stores them."""
    __slots__ = ("next_node", "next_expr", "dirty", "root")

    def __init__(self, next_node=0, next_expr=0, dirty=False):
        self.next_node, self.next_expr, self.dirty = next_node, next_expr, dirty
        self.root = None        # weakref to the tree's root module (graph renames see the tree)

    def node_id(self):
        self.next_node += 1
        return self.next_node - 1

    def expr_id(self):
        self.next_expr += 1
        return self.next_expr - 1


def walk_tree(root):
    """Every expr of the traced module ``root``, each graph once, in MegEngine's
    id order: the top graphs' exprs, each call followed by its callee's exprs,
    then the graphs no call reaches (a signature traced but not called)."""
    seen = set()
    for g in root._graphs:
        yield from g._walk_exprs(True, seen)
    for m in type(root).modules(root):
        for g in getattr(m, "_graphs", ()):
            if id(g) not in seen:
                yield from g._walk_exprs(True, seen)


def reset_ids(root, src=None):
    """Number the nodes and exprs of the traced module ``root`` (and its
    traced submodules) in :func:`walk_tree` order, from 0 or, given ``src``
    (the IdSource of a tree ``root`` joins), from where it stands, and give
    all their graphs that one IdSource."""
    src = IdSource() if src is None else src
    if src.root is None:
        src.root = weakref.ref(root)
    for e in walk_tree(root):
        e._id = src.expr_id()
        for o in e.outputs:
            o._id = src.node_id()
    for m in type(root).modules(root):
        for g in getattr(m, "_graphs", ()):
            g._ids = src
    return src


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
        self._next_suffix = {}    # base name -> first suffix to try (see _unique_name)
        self._version = 0         # bumped by every edit; compiled code is cached per version
        self._ids = None          # the IdSource of the traced module tree (reset_ids)

    # ---------------------------------------------------------------- basics
    @property
    def name(self):
        """The graph's name (MegEngine's: ``Net`` for the top graph,
        ``Net_layer1_0`` for the graph of ``net.layer1[0]``); settable.
        :meth:`get_node_by_name` also matches ``"<graph name>_<node name>"``."""
        return self._name

    @name.setter
    def name(self, value):
        if not isinstance(value, str) or not value:
            raise TypeError(f"a graph name must be a non-empty str, not {value!r}")
        form = python_name(value)
        for g in self._tree_graphs():
            # the graphs of one module (one per call signature) share its name
            if g is self or g.owner is self.owner and g._name == value:
                continue
            if python_name(g._name) == form:
                how = "" if g._name == value else \
                    " as Python reads identifiers (NFKC form)"
                raise GraphError(f"graph {self._qualname}: the name {value!r} is graph "
                                 f"{g._qualname}'s name {g._name!r}{how}, so get_node_by_name "
                                 "would find the nodes of both by one name; choose another name")
        self._name = value
        self._touch()

    def _tree_graphs(self):
        """The graphs of the module tree the owner belongs to (from the root
        its ids came from, while the owner is still in that tree; else the
        owner's and those below it)."""
        owner = self.owner
        if owner is None:
            return [self]
        root = self._ids.root() if self._ids is not None and self._ids.root is not None else None
        mods = list(type(root).modules(root)) if root is not None else []
        if not any(m is owner for m in mods):
            mods = list(type(owner).modules(owner))
        return [g for m in mods for g in getattr(m, "_graphs", ())]

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
        if self._ids is not None:
            self._ids.dirty = True

    def _unique_name(self, base):
        base = python_name(base or "v")
        if base not in self._names:
            return base
        i = self._next_suffix.get(base, 1)     # where the last search for base ended: linear
        while f"{base}_{i}" in self._names:
            i += 1
        self._next_suffix[base] = i + 1
        return f"{base}_{i}"

    def _add_node(self, node, base=None):
        node._name = self._unique_name(base if base is not None else node._name)
        node.graph = self
        if self._ids is not None:
            node._id = self._ids.node_id()
        self._names[node._name] = node
        return node

    def _rename(self, node, new):
        key = python_name(new)
        other = self._names.get(key)
        if other is not None and other is not node:
            raise GraphError(f"graph {self._qualname} already has a node named {key!r}"
                             + _same_to_python(new, key) + "; choose another name")
        self._names.pop(node._name, None)
        self._names[key] = node
        self._touch()

    def _append(self, expr, at=None):
        """Put ``expr`` in the graph (at index ``at``, default the end) and
        register it as a user of its inputs."""
        expr._top_graph = self
        if self._ids is not None:
            expr._id = self._ids.expr_id()
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
        """ModuleNodes whose module is an instance of ``module_cls``; a traced
        submodule matches the class it was traced from (after loading from an
        archive, a class of the same name)."""
        def hit(n):
            if n.expr.kind == "input":
                return False
            if isinstance(n.owner, module_cls):
                return True
            t = n.module_type
            if t is None:
                return getattr(n.owner, "_orig_name", None) == module_cls.__name__
            return isinstance(t, type) and issubclass(t, module_cls)
        return self.nodes(recursive).type(ModuleNode).filter(hit)

    def get_node_by_name(self, name=None, ignorecase=True, recursive=True):
        """Nodes whose qualname (or plain name) matches ``name``; shell
        wildcards (``*``, ``?``, ``[...]``) allowed: ``"*conv1*"``."""
        return self.nodes(recursive).name(name, ignorecase)

    def get_node_by_id(self, node_id, recursive=True):
        """Nodes whose ``id`` is ``node_id`` (an int or a list of ints)."""
        return self.nodes(recursive).node_id(node_id)

    def get_expr_by_id(self, expr_id, recursive=True):
        """Exprs whose ``id`` is ``expr_id`` (an int or a list of ints)."""
        return self.exprs(recursive).expr_id(expr_id)

    # ---------------------------------------------------------------- edits
    @contextlib.contextmanager
    def insert_exprs(self, expr=None):
        """Record ordinary Python on this graph's nodes as new exprs.

        Inside the ``with`` block, these each add an expr and return new
        Node(s) of this graph:

        - mgtrace.functional calls taking Nodes: ``F.relu(node)``;
        - operators and tensor methods on TensorNodes: ``node + 1``,
          ``a * b``, ``node[0]``, ``node.reshape(2, -1)``,
          ``node.mean(axis=1)`` (see mgtrace.traced_module.node);
        - calls of the owner's submodules, including a module assigned to
          the TracedModule just before (``tm.act = M.ReLU()``, then
          ``tm.act(node)``); a traced submodule must be called with the
          argument structure it was traced with.

        Tensor operations that touch no node, parameter or buffer run as
        usual, unrecorded (so a module can be built inside the block).

        The new exprs go right after ``expr``, in the order they run; only
        nodes defined before it may be used. Without ``expr`` (MegEngine's
        automatic position) they go right after the last expr that defines
        a node they read (after the graph inputs if they read none). If the
        block raises, the graph is left as it was. Nothing else uses the new
        nodes until you call :meth:`replace_node` (or make them outputs).

        Raises:
            GraphError: ``expr`` is not in this graph; a node of another graph
                or one defined after the insertion point is used; a called
                module is not a submodule of the owner.

        Example (see the module docstring for one that runs)::

            with graph.insert_exprs(conv_out.expr):
                act = F.relu(conv_out)
            graph.replace_node({conv_out: act})
        """
        if expr is None:
            pos = len(self._exprs)
        else:
            pos = self._index_of(expr, "insert_exprs") + 1
        with self._inserting(max(pos, self._n_leading_inputs())):
            yield self
        if expr is None:
            self._settle_block(pos)

    def _settle_block(self, start):
        """Move the exprs appended from index ``start`` on to right after the
        last earlier expr that defines a node they read."""
        block = self._exprs[start:]
        if not block:
            return
        inside = {id(e) for e in block}
        index = {id(e): i for i, e in enumerate(self._exprs[:start])}
        at = self._n_leading_inputs() - 1
        for e in block:
            for n in e._inputs:
                if id(n.expr) not in inside:
                    at = max(at, index[id(n.expr)])
        head = self._exprs[:start]
        self._exprs = head[:at + 1] + block + head[at + 1:]
        self._touch()

    def insert_exprs_after(self, expr=None):
        """MegEngine's spelling of :meth:`insert_exprs`."""
        return self.insert_exprs(expr)

    def insert_exprs_before(self, expr=None):
        """Like :meth:`insert_exprs`, but the new exprs go right before
        ``expr`` (default: before the first expr that is not an input)."""
        if expr is None:
            return self._inserting(self._n_leading_inputs())
        pos = self._index_of(expr, "insert_exprs_before")
        if isinstance(expr, Input):
            raise GraphError("insert_exprs_before: cannot insert before a graph input")
        return self._inserting(max(pos, self._n_leading_inputs()))

    @contextlib.contextmanager
    def _inserting(self, pos):
        # a real cycle: the edit recorder is a Tracer, which builds graphs
        from mgtrace.traced_module.edit import insertion
        before_exprs = list(self._exprs)
        before_names = dict(self._names)
        ok = False
        try:
            with insertion(self, pos):
                yield self
            ok = True
        finally:
            if not ok:              # undo a block that raised
                old = {id(e) for e in before_exprs}
                unlink_users([e for e in self._exprs if id(e) not in old])
                self._exprs = before_exprs
                self._names = before_names
            self._touch()

    def _index_of(self, expr, what):
        if isinstance(expr, Node):      # a common slip: the node, not the expr that makes it
            raise GraphError(f"{what}: expected an expr, got the node {expr!r}; pass "
                             f"its defining expr ({expr.name}.expr)")
        for i, e in enumerate(self._exprs):
            if e is expr:
                return i
        where = expr.top_graph.qualname if getattr(expr, "top_graph", None) is not None \
            else "no graph"
        raise GraphError(f"{what}: expr {expr!r} is not in graph {self._qualname} (it is in "
                         f"{where}); edit that graph instead")

    def _n_leading_inputs(self):
        n = 0
        for e in self._exprs:
            if not isinstance(e, Input):
                break
            n += 1
        return n

    def insert_function(self, func, *args, **kwargs):
        """Call ``func(*args, **kwargs)`` (args may hold Nodes of this graph)
        as if inside :meth:`insert_exprs`, right after the last expr that
        defines one of its input nodes (after the graph inputs when there
        are none); return what it returns (its output Node(s)).

        An mgtrace.functional function, or one made traceable with
        ``mgtrace.traced_module.wrap``, becomes one CallFunction; any other
        callable runs on the Nodes, so each operation of its body is
        recorded (``lambda x: F.relu(x) * 2`` gives two exprs).

        Example::

            act = graph.insert_function(F.relu, conv_out)
            graph.replace_node({conv_out: act})
        """
        # a real cycle: the edit recorder is a Tracer, which builds graphs
        from mgtrace.traced_module.edit import traceable_call
        call = traceable_call(func)
        nodes = tree_flatten((args, kwargs), is_node)[0]
        for n in nodes:
            if n.graph is not self:
                raise GraphError(f"insert_function: node {n!r} is not in graph {self._qualname}")
        last = max((self._index_of(n.expr, "insert_function") for n in nodes), default=-1)
        pos = max(last + 1, self._n_leading_inputs())
        with self._inserting(pos):
            return call(*args, **kwargs)

    def replace_node(self, repl):
        """Make the users (and graph outputs) of each key node read its value
        node instead: ``graph.replace_node({old: new})``.

        As in MegEngine, only the users that come after ``new`` is defined
        switch to it; users before that point (the relu in ``new =
        F.relu(old)`` among them) keep reading ``old``. The owner's watch
        and end points on ``old`` move to ``new``. Dead code is left
        for :meth:`compile`, which also removes such early users when
        nothing reads their results any more.

        Raises:
            GraphError: a node is not in this graph, ``old`` is ``self``, the
                two are of different kinds (tensor / module / int), or
                ``new`` has no defining expr in this graph.
        """
        if not isinstance(repl, dict):
            raise TypeError(f"replace_node takes a dict {{old_node: new_node}}, not "
                            f"{type(repl).__name__}")
        for old, new in repl.items():
            for n in (old, new):
                if not isinstance(n, Node):
                    raise TypeError(f"replace_node: expected Nodes, got {type(n).__name__}")
                if n.graph is not self:
                    where = n.graph.qualname if n.graph is not None else "no graph"
                    raise GraphError(f"replace_node: {n!r} is in {_graph_label(n.graph)}, not this graph "
                                     f"{_graph_label(self)}: a node of another trace or copy?")
            if old is self._inputs[0]:
                raise GraphError("replace_node: cannot replace the graph's self node")
            if old.kind != new.kind:
                raise GraphError(f"replace_node: {old!r} is a {old.kind} node but {new!r} is a "
                                 f"{new.kind} node")
        for old, new in repl.items():
            if old is new:
                continue
            index = {id(e): i for i, e in enumerate(self._exprs)}
            if id(new.expr) not in index:
                raise GraphError(f"replace_node: {new!r} has no defining expr in {self._qualname}")
            at_new = index[id(new.expr)]
            _move_users(old, new, [u for u in old.users if index[id(u)] > at_new])
            self._outputs = [new if o is old else o for o in self._outputs]
            self._replace_points(old, new)
        self._touch()

    def _kept_ids(self):
        """ids of the nodes whose values leave the graph however nothing in
        it reads them: its outputs and its owner's watch and end points."""
        owner = self.owner
        points = list(getattr(owner, "watch_points", ())) + list(getattr(owner, "end_points", ()))
        return {id(n) for n in self._outputs} | {id(n) for n in points if n.graph is self}

    def _replace_points(self, old, new):
        """The owner's watch and end points on ``old`` move to ``new``, as
        the graph's outputs do (a fused call that replaces a watched value
        is watched instead)."""
        owner = self.owner
        moved = False
        for attr in ("watch_points", "end_points"):
            points = getattr(owner, attr, None)
            if points and any(p is old for p in points):
                owner.__dict__[attr] = [new if p is old else p for p in points]
                moved = True
        if moved:
            owner.__dict__["_points_version"] = owner._points_version + 1

    def compile(self):
        """Remove exprs whose results nobody uses (dead code), keeping the
        inputs and exprs with side effects (:func:`has_side_effect`):
        in-place writes (``x[i] = v``, ``x += y``, ``out=`` arguments),
        calls without results, functions that write into their arguments
        (declared with ``mgtrace.functional._trace.mutates``: ``F.batch_norm``
        in training), calls of builtin modules that update their state (a
        BatchNorm in training mode), and calls of traced submodules whose
        graphs have side effects. The owner's watch and end points stay
        computed. Returns the graph. Lints before and after."""
        self.lint(recursive=False)
        self._drop_dead()
        self.lint(recursive=False)
        return self

    def _live(self, cut=frozenset()):
        """``(ids of the nodes read, ids of the exprs kept)`` by what
        :meth:`compile` keeps; the nodes with ids in ``cut`` are taken as
        given (what produces them is not needed for them)."""
        live, kept = self._kept_ids(), set()
        for e in reversed(self._exprs):
            if isinstance(e, Input) or has_side_effect(e) or \
                    any(id(o) in live and id(o) not in cut for o in e.outputs):
                kept.add(id(e))
                live.update(id(n) for n in e._inputs)
        return live, kept

    def _drop_dead(self):
        """Remove the exprs :meth:`compile` removes (no lint)."""
        _, kept = self._live()
        unlink_users([e for e in self._exprs if id(e) not in kept])
        for e in self._exprs:
            if id(e) not in kept:
                for o in e.outputs:
                    if self._names.get(o._name) is o:
                        del self._names[o._name]
        self._exprs = [e for e in self._exprs if id(e) in kept]
        self._touch()

    def reset_outputs(self, outputs):
        """Make ``outputs`` (a Node or a pytree of Nodes of this graph) the
        graph's result, e.g. to cut the graph at a node; follow with
        :meth:`compile` to drop what is no longer needed. Top graphs only
        (an inner graph's result is what its callers receive).

        Raises:
            GraphError: not the top graph; a node of another graph or a
                module node among ``outputs``.
        """
        self._check_top("reset_outputs")
        leaves, out_def = tree_flatten(outputs, is_node)
        consts = _const_leaves(out_def)
        if not leaves or consts:
            what = f"a constant {consts[0]!r}" if consts else "no node"
            raise GraphError(f"reset_outputs takes Nodes of this graph (or tuples, lists, dicts of "
                             f"them), got {what}: a graph whose result does not depend on its "
                             "inputs is almost certainly a mistake")
        for n in leaves:
            if n.graph is not self:
                where = n.graph.qualname if n.graph is not None else "no graph"
                raise GraphError(f"reset_outputs: {n!r} is in {_graph_label(n.graph)}, not this graph "
                                 f"{_graph_label(self)}: a node of another trace or copy?")
            if isinstance(n, ModuleNode):
                raise GraphError(f"reset_outputs: {n!r} is a module, not a value")
        self._outputs = leaves
        self._out_def = out_def
        self._touch()

    def add_output_node(self, node):
        """Return ``node``'s value too: the result becomes
        ``(previous_result, value)`` (MegEngine's nesting: a forward that
        returned ``(a, b)`` now returns ``((a, b), value)``). Top graphs
        only."""
        self._check_top("add_output_node")
        old = self._out_def.unflatten(self._outputs)
        self.reset_outputs((old, node))

    def add_input_node(self, shape, dtype="float32", name="args"):
        """Add a tensor input: a new last positional parameter of forward,
        named ``name`` (made unique). Returns its TensorNode; use it inside
        :meth:`insert_exprs`. Callers then pass one more tensor. Top graphs
        only.

        Args:
            shape: the shape to record on the node (what placeholders use
                while inserting exprs that read it).
            dtype: its dtype (default float32).
            name: the parameter name.

        Raises:
            GraphError: not the top graph; the owner has several graphs;
                forward takes ``*args``/``**kwargs``/keyword-only
                parameters, or has parameters with defaults (a new
                positional parameter cannot follow them): use
                :meth:`reset_inputs`.
        """
        self._check_top("add_input_node")
        owner = self.owner
        if len(owner._graphs) != 1:
            raise GraphError(f"add_input_node: {owner._qualname} has {len(owner._graphs)} graphs "
                             "(one per call signature); a new parameter would break the others")
        params = list(owner._signature.parameters.values())
        if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.KEYWORD_ONLY) for p in params):
            raise GraphError("add_input_node: forward takes *args, **kwargs or keyword-only "
                             "parameters; use reset_inputs instead")
        if any(p.default is not p.empty for p in params):
            raise GraphError("add_input_node: forward has parameters with defaults, which a new "
                             "positional parameter cannot follow; use reset_inputs instead")
        if not isinstance(name, str) or not name.isidentifier():
            raise GraphError(f"add_input_node: name {name!r} is not a Python identifier")
        names = {p.name for p in params} | set(self._names)
        pname, i = name, 1
        while pname in names:
            pname = f"{name}_{i}"
            i += 1
        params.append(inspect.Parameter(pname, inspect.Parameter.POSITIONAL_OR_KEYWORD))
        node = self._add_node(TensorNode(name=pname, shape=tuple(shape), dtype=np.dtype(dtype)),
                              pname)
        e = Input(pname)
        e.outputs = [node]
        node.expr = e
        self._append(e, at=self._n_leading_inputs())
        self._inputs.append(node)
        d = self._in_def
        self._in_def = TreeDef(d.type, d.aux, d.children + (LeafDef(SLOT),))
        owner._signature = owner._signature.replace(parameters=params)
        return node

    def reset_inputs(self, *args, **kwargs):
        """Give forward a new argument structure: ``args``/``kwargs`` are
        bound to forward's parameters; their leaves are existing input nodes
        of this graph (kept), example Tensors (each becomes a new input,
        named after its parameter), or other tensor nodes of this graph:
        the graph is cut there (a new input takes the node's place, and the
        exprs that only computed it are removed, as :meth:`compile` would),
        so ``g.reset_inputs(feat)`` makes a model that starts at ``feat``.
        Old inputs left out are dropped; the outputs must not need them any
        more (``replace_node`` them first, or cut after them). Returns the
        input nodes. Top graphs only.

        Raises:
            GraphError: not the top graph; the arguments do not fit forward's
                signature; a node is neither an input nor a tensor node of
                this graph; a node is given twice; a dropped input is still
                needed; another graph of the owner already has this
                structure.
        """
        self._check_top("reset_inputs")
        owner = self.owner
        sig = owner._signature
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError as e:
            raise GraphError(f"reset_inputs: forward{sig}: {e}; add a parameter with "
                             "add_input_node") from None
        bound.apply_defaults()
        canon = tuple(bound.arguments.values())
        is_leaf = lambda v: isinstance(v, (Node, Tensor))          # noqa: E731
        leaves, in_def = tree_flatten(canon, is_leaf)
        for g in owner._graphs:
            if g is not self and g._in_def == in_def:
                raise GraphError("reset_inputs: another graph of this module already has this "
                                 "argument structure")
        names = []
        for pname, value in bound.arguments.items():
            k = len(tree_flatten(value, is_leaf)[0])
            names += [pname] if k == 1 else [f"{pname}_{j}" for j in range(k)]
        current = self._inputs[1:]
        nodes, cuts = [], []        # cuts: (node the graph starts at, the input taking its place)
        for v, pname in zip(leaves, names):
            if isinstance(v, Node) and any(v is n for n in nodes + [c for c, _ in cuts]):
                raise GraphError(f"reset_inputs: {v!r} is given twice")
            if isinstance(v, Node) and any(v is c for c in current):
                nodes.append(v)
                continue
            if isinstance(v, Node):
                self._check_cut(v)
            nodes.append(TensorNode(name=pname, shape=tuple(v.shape), dtype=v.dtype))
            if isinstance(v, Node):
                cuts.append((v, nodes[-1]))
        dropped = [n for n in current if not any(n is m for m in nodes)]
        self._check_dropped(dropped, cuts)
        for old, new in cuts:             # the users of the cut node read the new input
            _move_users(old, new, list(old.users))
            self._outputs = [new if o is old else o for o in self._outputs]
            self._replace_points(old, new)
        if cuts or any(n.users for n in dropped):
            self._drop_dead()
        self._exprs = [e for e in self._exprs
                       if not (isinstance(e, Input) and any(e.outputs[0] is n for n in dropped))]
        for n in dropped:
            if self._names.get(n._name) is n:
                del self._names[n._name]
        for n in nodes:
            if n.graph is None:
                self._add_node(n, n.name)
                e = Input(n.name)
                e.outputs = [n]
                n.expr = e
                self._append(e, at=self._n_leading_inputs())
        # Input exprs in the new argument order, ahead of everything else
        inputs = [self._inputs[0]] + nodes
        rank = {id(n.expr): i for i, n in enumerate(inputs)}
        head = sorted((e for e in self._exprs if id(e) in rank), key=lambda e: rank[id(e)])
        self._exprs = head + [e for e in self._exprs if id(e) not in rank]
        self._inputs = inputs
        self._in_def = in_def
        self._touch()
        return nodes

    def _check_cut(self, node):
        """``node`` can start the graph: a tensor node of this graph."""
        if node.graph is not self:
            raise GraphError(f"reset_inputs: {node!r} is in {_graph_label(node.graph)}, not "
                             f"{_graph_label(self)}")
        if not isinstance(node, TensorNode):
            raise GraphError(f"reset_inputs: {node!r} is a {node.kind} node; the graph can be "
                             "cut only at a tensor node")

    def _check_dropped(self, dropped, cuts):
        """Refuse to drop an input that the outputs still need once the
        graph starts at the cut nodes."""
        live, kept = self._live(frozenset(id(c) for c, _ in cuts))
        for n in dropped:
            if id(n) in live:
                user = next((repr(u) for u in n.users if id(u) in kept),
                            "the graph's outputs (or a watch or end point)")
                raise GraphError(f"reset_inputs: input {n.name!r} is still used by {user}; "
                                 "replace_node it first, or cut the graph after it (pass the "
                                 "node where the graph should start)")

    def _check_top(self, what):
        owner = self.owner
        if owner is None or not getattr(owner, "_is_top", False):
            raise GraphError(f"{what} works on the top graph of a TracedModule (this is "
                             f"{self._qualname}); flatten() first to edit inner graphs")

    # ----------------------------------------------------------------- lint
    def check(self, recursive=True):
        """A list of problems (empty when the graph is sound), one line each,
        starting with the graph's qualname:

        - an expr reads a node before it is defined, or one of another graph
          ("reads ... before it is defined");
        - users out of step: a node read by an expr that it does not list as
          a user, or listing a user that is not in the graph or does not read
          it ("lists a user that is not in the graph");
        - an expr or node that names another graph or producer;
        - two nodes with one name, or the name table out of step;
        - inputs without Input exprs, Input exprs that are not inputs, a
          first input that is not the ``self`` module node, an ``in_def``
          whose slots do not match the inputs;
        - outputs not defined in the graph, an ``out_def`` whose slots do
          not match the outputs;
        - an expr listed twice.
        """
        problems = []
        self._check_into(problems, recursive, set())
        return problems

    def lint(self, recursive=True):
        """Raise GraphError listing every problem :meth:`check` finds;
        return the graph when there are none (run it after every edit)."""
        problems = self.check(recursive)
        if problems:
            raise GraphError(f"graph {self._qualname} is broken:\n  " + "\n  ".join(problems))
        return self

    def _check_into(self, problems, recursive, seen):
        seen.add(id(self))
        q = self._qualname
        add = problems.append
        in_graph = set()
        for e in self._exprs:
            if id(e) in in_graph:
                add(f"{q}: expr {e!r} is listed twice")
            in_graph.add(id(e))
        defined = set()
        names = {}
        input_ids = {id(n) for n in self._inputs}
        users_of = {}       # id(node) -> ids of the exprs it lists as users (each list read once)
        for e in self._exprs:
            if e.top_graph is not self:
                add(f"{q}: expr {e!r} says it belongs to another graph")
            if isinstance(e, Input) and not any(id(o) in input_ids for o in e.outputs):
                add(f"{q}: {e!r} is an Input expr but its node is not a graph input")
            for n in e._inputs:
                if id(n) not in defined:
                    add(f"{q}: {e!r} reads {n!r} before it is defined (or from another graph)")
                users = users_of.get(id(n))
                if users is None:
                    users = users_of[id(n)] = {id(u) for u in n.users}
                if id(e) not in users:
                    add(f"{q}: {n!r} is read by {e!r} but does not list it as a user")
            for o in e.outputs:
                if o.graph is not self:
                    add(f"{q}: node {o!r} says it belongs to another graph")
                if o.expr is not e:
                    add(f"{q}: node {o!r} is an output of {e!r} but names another producer")
                if o.name in names:
                    add(f"{q}: two nodes are named {o.name!r}")
                elif self._names.get(o.name) is not o:
                    add(f"{q}: node {o!r} is missing from the graph's name table")
                names[o.name] = o
                defined.add(id(o))
            if recursive:
                sub = called_graph(e)
                if sub is not None and id(sub) not in seen:
                    sub._check_into(problems, True, seen)
        # users are checked once every expr is known (a user may come later);
        # each expr's inputs as a set, so that a node with many users (or an
        # expr with many inputs) costs linear time, not quadratic
        reads = {id(e): {id(i) for i in e._inputs} for e in self._exprs}
        for e in self._exprs:
            for o in e.outputs:
                for u in o.users:
                    if id(u) not in in_graph:
                        add(f"{q}: {o!r} lists a user that is not in the graph: {u!r}")
                    elif id(o) not in reads[id(u)]:
                        add(f"{q}: {o!r} lists {u!r} as a user, but it does not read it")
        for n in self._inputs:
            if id(n) not in defined or not isinstance(n.expr, Input):
                add(f"{q}: input {n!r} has no Input expr")
        if not self._inputs or not isinstance(self._inputs[0], ModuleNode):
            add(f"{q}: the first input must be the self module node")
        if self._in_def is not None and self._in_def.num_leaves != len(self._inputs) - 1:
            add(f"{q}: in_def has {self._in_def.num_leaves} slots for "
                f"{len(self._inputs) - 1} inputs")
        for n in self._outputs:
            if id(n) not in defined:
                add(f"{q}: output {n!r} is not defined in the graph")
        if self._out_def is not None and self._out_def.num_leaves != len(self._outputs):
            add(f"{q}: out_def has {self._out_def.num_leaves} slots for "
                f"{len(self._outputs)} outputs")
        stale = [k for k, n in self._names.items() if id(n) not in defined]
        if stale:
            add(f"{q}: the name table lists nodes that are not in the graph: {stale[:5]}")

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


def _same_to_python(name, form):
    """The clause that says ``name`` reads as ``form`` (its NFKC form)."""
    if name == form:
        return ""
    return (f"; {name!r} is that name as Python reads identifiers (NFKC form), so generated "
            "code would take one for the other")


def has_side_effect(e, seen=None):
    """Whether removing ``e`` could change what a run does besides its
    results: in-place methods (``__setitem__``, ``__iadd__``...), an
    ``out=`` argument, a call without results, a function that writes into
    graph values it is given (declared with
    :func:`mgtrace.functional._trace.mutates`, e.g. ``F.batch_norm`` in
    training), a call of a builtin module that updates its own state
    (``mutates_state``, e.g. BatchNorm's running statistics), or a call of a
    traced module whose graph has such an expr."""
    if isinstance(e, (Input, GetAttr, Constant)):
        return False
    if isinstance(e, CallMethod) and e.method in CallMethod.IN_PLACE:
        return True
    if "out" in e.kwargs or not e.outputs:
        return True
    if isinstance(e, CallFunction) and _writes_graph_values(e):
        return True
    if isinstance(e, CallMethod) and e.method == "__call__" and isinstance(e.args[0], ModuleNode) \
            and getattr(e.args[0].owner, "mutates_state", False):
        return True
    sub = called_graph(e)
    if sub is not None:
        seen = set() if seen is None else seen
        if id(sub) in seen:
            return False
        seen.add(id(sub))
        return any(has_side_effect(x, seen) for x in sub._exprs)
    return False


def _writes_graph_values(e):
    """Whether the CallFunction ``e`` writes into one of its node arguments."""
    names = mutated_arguments(e.func, e.args, e.kwargs)
    if not names:
        return False
    try:
        bound = inspect.signature(e.func).bind(*e.args, **e.kwargs).arguments
    except (TypeError, ValueError):
        return True
    return any(tree_flatten(bound.get(n), is_node)[0] for n in names)


def _move_users(old, new, exprs):
    """Make every expr of ``exprs`` (users of ``old``) read ``new`` instead:
    :meth:`Expr.replace_input` for each, with ``old``'s users list rewritten
    once rather than once per expr."""
    for e in exprs:
        e._swap_input(old, new)
    old._remove_users({id(e) for e in exprs})
    for e in exprs:
        new._add_user(e)


def _graph_label(g):
    """A graph's qualname, with its id when names alone would not tell two
    graphs apart (e.g. the same model traced twice)."""
    if g is None:
        return "no graph"
    return f"{g.qualname} (graph @{id(g):x})"


def _const_leaves(tdef):
    """The constant (non-node) leaves of a TreeDef, None allowed."""
    out = []
    for c in tdef.children:
        if hasattr(c, "children"):
            out += _const_leaves(c)
        elif not c.is_slot and c.const is not None:
            out.append(c.const)
    return out




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


def _id_set(ids):
    return {ids} if isinstance(ids, int) else set(ids)


class NodeFilter(_Filter):
    """Nodes, narrowed by ``type(cls)``, ``node_id(ids)`` or ``name(pattern)``."""

    def type(self, cls):
        return self.filter(lambda n: isinstance(n, cls))

    def node_id(self, node_id):
        ids = _id_set(node_id)
        return self.filter(lambda n: n.id in ids)

    def name(self, pattern, ignorecase=True):
        """Nodes whose qualname, name, or ``"<graph name>_<name>"``
        (MegEngine's full name, ``Net_layer1_0_relu``) matches the shell
        pattern ``pattern`` (``*``, ``?``, ``[seq]``). Brackets also match
        literally, so ``"*.conv1.[out]"`` finds module-call results."""
        if pattern is None:
            return self
        if not isinstance(pattern, str):
            raise TypeError(f"a node name pattern must be a str, not {type(pattern).__name__}")
        pat = pattern.lower() if ignorecase else pattern
        pats = {pat, pat.replace("[", "\0").replace("]", "[]]").replace("\0", "[[]")}

        def hit(n):
            names = (n.qualname, n.name, f"{n.graph.name}_{n.name}" if n.graph else n.name)
            if ignorecase:
                names = tuple(s.lower() for s in names)
            return any(fnmatch.fnmatchcase(s, p) for s in names for p in pats)
        return self.filter(hit)


class ExprFilter(_Filter):
    """Exprs, narrowed by ``call_function(fn)``, ``call_method(name)``,
    ``expr_id(ids)`` or ``expr_type(cls)``."""

    def expr_id(self, expr_id):
        ids = _id_set(expr_id)
        return self.filter(lambda e: e.id in ids)

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

