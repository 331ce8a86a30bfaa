"""Nodes: the values of a graph, each produced by one expr and used by others.

Three kinds (one closed set, :data:`NODE_KINDS`):

- ``TensorNode``: a tensor; remembers the shape and dtype it had when traced.
- ``ModuleNode``: a module (``self`` of a graph, or a submodule reached by
  GetAttr); ``module_type`` and ``owner`` (the module object).
- ``ValueNode``: a Python int computed while running, e.g. ``x.shape[0]``
  and arithmetic on it (how shapes stay symbolic). MegEngine keeps such
  values in tensors; a plain int is cheaper and prints better.

Inside ``with graph.insert_exprs():`` TensorNodes and ValueNodes behave like
the values they stand for: operators (``node + 1``, ``a * b``, ``node[0]``,
``-node``) and tensor methods (``node.reshape(2, -1)``, ``node.mean(axis=1)``)
record new exprs in the graph and return new Nodes. Outside that context
they raise :class:`NodeValueError` (a TypeError): a Node has no value of its
own. ``==`` and ``!=`` keep their identity meaning (nodes are dict keys);
use ``F.equal`` in graphs.

>>> import numpy as np, mgtrace as mt, mgtrace.module as M
>>> class Net(M.Module):
...     def forward(self, x):
...         return x * 2
>>> ones = mt.tensor(np.ones((2, 3), np.float32))
>>> tm = mt.trace_module(Net(), ones)
>>> g = tm.graph
>>> x = g.inputs[1]
>>> x.qualname, x.shape
('Net.[x]', (2, 3))
>>> x + 1
Traceback (most recent call last):
    ...
mgtrace.traced_module.node.NodeValueError: `+` on TensorNode %...:x: a graph node has no value, ...
>>> with g.insert_exprs():
...     y = (x + 1).mean(axis=1)
>>> y
%...:mean
>>> g.reset_outputs(y)
>>> tm(ones).tolist()
[2.0, 2.0]
"""
import itertools
import operator
import unicodedata

from mgtrace._core import op_table
from mgtrace.errors import Error

__all__ = ["Node", "TensorNode", "ModuleNode", "ValueNode", "NODE_KINDS", "NodeValueError"]

_ids = itertools.count()

# Set by mgtrace.traced_module.edit.insertion while an ``insert_exprs``
# block runs: ``record_method(node, method, args, kwargs)`` and
# ``record_function(fn, args, kwargs)`` record one expr each and return its
# output Node(s). None outside such a block.
edit_hooks = None


class NodeValueError(Error, TypeError):
    """A Node was used as a value (``node + 1``, ``node.reshape(...)``)
    outside ``with graph.insert_exprs():``."""


def _hooks(node, what):
    hooks = edit_hooks
    if hooks is None:
        raise NodeValueError(
            f"{what} on {type(node).__name__} {node!r}: a graph node has no value, so this is only "
            "recorded inside `with graph.insert_exprs(...):` (which adds the expr to the graph "
            "and returns a new node)")
    return hooks


def python_name(name):
    """``name`` as Python reads an identifier: in NFKC form (``"\ufb01"``,
    the ligature fi, is ``"fi"``). Generated code names locals after nodes
    and reads attributes by name, so two names with one such form would be
    one variable; node names are kept in this form, and the archive reader
    normalizes them alike."""
    return unicodedata.normalize("NFKC", name)


_SCAN_USERS = 16        # Node._add_user scans a users list shorter than this


class Node:
    """A value in an InternalGraph.

    Attributes:
        name: unique within its graph (what generated code calls it), kept
            in NFKC form (:func:`python_name`); renaming a node to a name
            another node of its graph has, in that form, raises GraphError.
        expr: the expr that produces it.
        users: exprs that take it as an input, in graph order (an expr that
            takes the node twice is listed once).
        graph: the InternalGraph it belongs to.
    """
    kind = "node"

    def __init__(self, expr=None, name=None):
        self._id = next(_ids)
        self.expr = expr
        self.users = []
        self.graph = None
        self._name = name
        self._qualname = None

    @property
    def id(self):
        return self._id

    @property
    def name(self):
        return self._name

    @name.setter
    def name(self, value):
        if not isinstance(value, str) or not value:
            raise TypeError(f"a node name must be a non-empty str, not {value!r}")
        if self.graph is not None and value != self._name:
            self.graph._rename(self, value)
        self._name = python_name(value)

    @property
    def top_graph(self):
        """The graph that holds this node (MegEngine's name for :attr:`graph`)."""
        return self.graph

    @property
    def qualname(self):
        """Where the value lives in the module tree, by MegEngine's bracket
        rule: attribute paths are plain, every other name is bracketed, so
        dropping a trailing ``.[...]`` leaves the attribute path.

        A graph's ``self`` is the graph's own qualname (``Net.layer1.0``), a
        module or tensor reached by attribute ``Net.layer1.0.conv1`` or
        ``Net.scale``, the result of calling a module
        ``Net.layer1.0.conv1.[out]`` (``.[out1]``... for a call with several
        results), and any other node ``<graph qualname>.[<name>]``: an
        input ``Net.[x]``, a function's result ``Net.layer1.0.[relu]``.
        """
        if self._qualname is not None:
            return self._qualname
        g = self.graph
        if g is None:
            return self._name
        e = self.expr
        kind = getattr(e, "kind", None)
        if g._inputs and g._inputs[0] is self:
            return g.qualname
        if kind == "getattr" and e.args and e.args[0] is g._inputs[0]:
            return f"{g.qualname}.{e.name}"
        if kind == "call_method" and e.method == "__call__" and e.args \
                and isinstance(e.args[0], ModuleNode) and e.args[0] is not self:
            outs = e.outputs
            tag = "out" if len(outs) <= 1 else f"out{next((i for i, o in enumerate(outs) if o is self), 0)}"
            return f"{e.args[0].qualname}.[{tag}]"
        return f"{g.qualname}.[{self._name}]"

    @qualname.setter
    def qualname(self, value):
        self._qualname = value

    def _add_user(self, expr):
        """List ``expr`` as a user unless it is one: a scan of a short list,
        else a lookup in a set of the users' ids kept beside the list (made
        again whenever ``users`` is another list or another length than when
        it was made), so adding n users costs O(n), not O(n**2)."""
        users = self.users
        if len(users) < _SCAN_USERS:
            if not any(u is expr for u in users):
                users.append(expr)
            return
        index = self.__dict__.get("_user_index")
        if index is None or index[0] is not users or index[1] != len(users):
            index = [users, len(users), {id(u) for u in users}]
            self._user_index = index
        if id(expr) in index[2] and any(u is expr for u in reversed(users)):
            return              # (an id in the set whose object is gone is checked, not trusted)
        users.append(expr)
        index[1] += 1
        index[2].add(id(expr))

    def _remove_user(self, expr):
        self.users = [u for u in self.users if u is not expr]

    def _remove_users(self, ids):
        """Unlist every user whose ``id()`` is in the set ``ids``, in one
        pass: removing k users one call at a time would walk the list k times
        (quadratic when a node loses thousands of users at once)."""
        self.users = [u for u in self.users if id(u) not in ids]

    def __repr__(self):
        return f"%{self._id}:{self._name}"

    def __str__(self):
        return str(self._name)


def unlink_users(exprs):
    """Take ``exprs`` (being removed from a graph) off the users list of
    every node they read: one pass per node, however many of them it loses."""
    gone = {id(e) for e in exprs}
    nodes = {id(n): n for e in exprs for n in e._inputs}
    for n in nodes.values():
        n._remove_users(gone)


# ----------------------------------------------- recording while editing
def _method(name):
    def method(self, *args, **kwargs):
        return _hooks(self, f"{name}()").record_method(self, name, args, kwargs)
    method.__name__ = name
    method.__doc__ = (f"Record ``node.{name}(...)`` (only inside ``graph.insert_exprs()``); "
                      "returns the new node(s).")
    return method


def _operator(name, symbol):
    def method(self, *args):
        return _hooks(self, f"`{symbol}`").record_method(self, name, args, {})
    method.__name__ = name
    return method


def _int_operator(fn, symbol, reflected=False):
    def method(self, other=None):
        if fn is operator.neg:
            args = (self,)
        elif not isinstance(other, (int, ValueNode)) or isinstance(other, bool):
            return NotImplemented
        else:
            args = (other, self) if reflected else (self, other)
        return _hooks(self, f"`{symbol}`").record_function(fn, args, {})
    return method


# operators a TensorNode records: the op table's Tensor dunders, no in-place
# forms (``node += 1`` rebinds the name to a new node instead), and not
# ``==``/``!=`` (nodes are dict keys) nor ``[]=`` (nodes are not written to)
_TENSOR_OPERATORS = {
    m: ("unary -" if m == "__neg__" else op.symbol) for m, (op, role) in op_table.by_method().items()
    if m.startswith("__") and role != "inplace" and op.symbol and m not in ("__eq__", "__ne__")
    and op.name != "pos"}
# tensor methods a TensorNode records (each returns tensors)
TENSOR_METHODS = op_table.node_methods()


class TensorNode(Node):
    """A tensor value.

    Attributes:
        shape: tuple of ints, the shape seen while tracing (a run at another
            batch size gives other shapes; this is a record, not a
            constraint, and stays a plain tuple inside ``insert_exprs``:
            ``node.reshape(node.shape[0], -1)`` there fixes the batch size
            seen while tracing; use ``F.flatten(node, 1)`` to keep it free).
        dtype: the NumPy dtype seen while tracing.

    Inside ``graph.insert_exprs()`` the operators in ``_TENSOR_OPERATORS``
    and the methods in :data:`TENSOR_METHODS` record exprs (see the module
    docstring).
    """
    kind = "tensor"
    __array_ufunc__ = None          # numpy defers to our reflected operators
    _value = None

    def __init__(self, expr=None, name=None, shape=None, dtype=None):
        super().__init__(expr, name)
        self.shape = shape
        self.dtype = dtype

    @property
    def value(self):
        """The Tensor this node held while tracing, when it was kept: traces
        made with ``enable_expr_checker()`` keep every node's; a constant's
        node gives the constant. None otherwise. Settable (MegEngine binds
        values to nodes the same way)."""
        if self._value is None and getattr(self.expr, "kind", None) == "constant":
            return self.expr.value
        return self._value

    @value.setter
    def value(self, v):
        self._value = v

    @property
    def ndim(self):
        return None if self.shape is None else len(self.shape)

    @property
    def T(self):
        """Record ``node.transpose()`` (only inside ``insert_exprs``)."""
        return _hooks(self, ".T").record_method(self, "transpose", (), {})

    def __getattr__(self, name):
        # only reached for names the node does not have
        if name in TENSOR_METHODS:
            m = _method(name)
            return m.__get__(self, type(self))
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}"
                             + ("; graph nodes record these tensor methods inside "
                                "insert_exprs(): " + ", ".join(sorted(TENSOR_METHODS))
                                if not name.startswith("_") else ""))

    def __setitem__(self, index, value):
        raise NodeValueError(f"cannot assign into {self!r}: in-place writes on graph nodes are not "
                             "recorded; build a new value instead (e.g. F.where, F.concat)")

    def __iter__(self):
        raise NodeValueError(f"{self!r} is not iterable; index it (node[0]) inside insert_exprs()")

    def __bool__(self):
        return True


for _name, _sym in _TENSOR_OPERATORS.items():
    setattr(TensorNode, _name, _operator(_name, _sym))
del _name, _sym


class ModuleNode(Node):
    """A module. ``owner`` is the module object (for a graph's ``self``, the
    TracedModule that owns the graph) and ``module_type`` its class."""
    kind = "module"

    def __init__(self, expr=None, name=None, owner=None):
        super().__init__(expr, name)
        self.owner = owner

    @property
    def module_type(self):
        """The module's class; for a traced module, the class that was traced
        (None after loading from an archive, which keeps only its name)."""
        owner = self.owner
        if "_orig_type" in getattr(owner, "__dict__", {}):
            return owner.__dict__["_orig_type"]
        return type(owner)

    def __call__(self, *args, **kwargs):
        """Inside ``graph.insert_exprs()``: record a call of ``owner``, as
        ``owner(*args, **kwargs)`` would."""
        _hooks(self, "calling")
        return self.owner(*args, **kwargs)

    def __getattr__(self, name):
        """Inside ``graph.insert_exprs()`` (MegEngine's graph surgery): a
        submodule of ``owner`` as its ModuleNode (``self_node.fc(x)`` then
        records the call), a parameter or buffer as a TensorNode (one
        GetAttr each), any other attribute as its value."""
        if name.startswith("_") or name in ("owner", "expr", "users", "graph"):
            raise AttributeError(name)
        if edit_hooks is None:
            raise AttributeError(f"{type(self).__name__} {self!r} has no attribute {name!r} "
                                 "(inside `with graph.insert_exprs():` it reaches the "
                                 "module's submodules and attributes)")
        return edit_hooks.record_getattr(self, name)


class ValueNode(Node):
    """A Python int known only when the graph runs (a shape entry, or
    arithmetic on shape entries). ``value`` is the one seen while tracing.

    Inside ``graph.insert_exprs()``, ``+ - * // %`` and unary ``-`` with
    ints or other ValueNodes record ``operator`` calls and return new
    ValueNodes."""
    kind = "value"

    def __init__(self, expr=None, name=None, value=None):
        super().__init__(expr, name)
        self.value = value



# the int arithmetic a ValueNode records (op table rows; int results only)
for _op in map(op_table.OPS.get, ("add", "sub", "mul", "floordiv", "mod", "neg")):
    _fn = getattr(operator, _op.pyop)
    _sym = "unary -" if _op.arity == 1 else _op.symbol
    setattr(ValueNode, _op.method, _int_operator(_fn, _sym))
    if _op.reflected:
        setattr(ValueNode, _op.reflected, _int_operator(_fn, _sym, True))
del _op, _fn, _sym

NODE_KINDS = {cls.kind: cls for cls in (TensorNode, ModuleNode, ValueNode)}
