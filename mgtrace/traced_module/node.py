"""Nodes: the values of a graph, each produced by one expr and used by others.

Three kinds (one closed set, :data:`NODE_KINDS`):

- ``TensorNode``: a tensor; remembers the shape and dtype it had when traced.
- ``ModuleNode``: a module (``self`` of a graph, or a submodule reached by
  GetAttr); ``module_type`` and ``owner`` (the module object).
- ``ValueNode``: a Python int computed while running, e.g. ``x.shape[0]``
  and arithmetic on it (how shapes stay symbolic). MegEngine keeps such
  values in tensors; a plain int is cheaper and prints better.
"""
import itertools

__all__ = ["Node", "TensorNode", "ModuleNode", "ValueNode", "NODE_KINDS"]

_ids = itertools.count()


class Node:
    """A value in an InternalGraph.

    Attributes:
        name: unique within its graph (what generated code calls it).
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
        self._name = value

    @property
    def qualname(self):
        """Where the value lives in the module tree, e.g. ``Net.layer1.0.conv1``
        for a module node or ``Net.layer1.0.conv1.[out]`` for its output."""
        if self._qualname is not None:
            return self._qualname
        g = self.graph
        return f"{g.qualname}.{self._name}" if g is not None else self._name

    @qualname.setter
    def qualname(self, value):
        self._qualname = value

    def _add_user(self, expr):
        if not any(u is expr for u in self.users):
            self.users.append(expr)

    def _remove_user(self, expr):
        self.users = [u for u in self.users if u is not expr]

    def __repr__(self):
        return f"%{self._id}:{self._name}"


class TensorNode(Node):
    """A tensor value.

    Attributes:
        shape: tuple of ints, the shape seen while tracing (a run at another
            batch size gives other shapes; this is a record, not a constraint).
        dtype: the NumPy dtype seen while tracing.
    """
    kind = "tensor"

    def __init__(self, expr=None, name=None, shape=None, dtype=None):
        super().__init__(expr, name)
        self.shape = shape
        self.dtype = dtype


class ModuleNode(Node):
    """A module. ``owner`` is the module object (for a graph's ``self``, the
    TracedModule that owns the graph) and ``module_type`` its class."""
    kind = "module"

    def __init__(self, expr=None, name=None, owner=None):
        super().__init__(expr, name)
        self.owner = owner

    @property
    def module_type(self):
        return type(self.owner)


class ValueNode(Node):
    """A Python int known only when the graph runs (a shape entry, or
    arithmetic on shape entries). ``value`` is the one seen while tracing."""
    kind = "value"

    def __init__(self, expr=None, name=None, value=None):
        super().__init__(expr, name)
        self.value = value


NODE_KINDS = {cls.kind: cls for cls in (TensorNode, ModuleNode, ValueNode)}
