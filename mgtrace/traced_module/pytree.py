"""Pytrees: nested containers flattened to a list of leaves and a TreeDef.

The tracer flattens the arguments and results of every call so that the
tensors in them become graph nodes, wherever they sit. A ``TreeDef``
records the container structure and the *constant* leaves (ints, strings,
None, ...) by value, so two calls match only when their structure and
constants match; the other leaves (tensors, nodes, symbolic ints) are the
slots that ``flatten`` returns and ``unflatten`` fills.

Supported containers: tuple, list, dict (keys kept in order), namedtuples,
``slice`` (its start/stop/step may be symbolic), and the types added with
:func:`register_supported_type`. Anything else is a leaf.

>>> is_float = lambda v: isinstance(v, float)
>>> leaves, tdef = tree_flatten(((1, "a"), {"k": [2.0, None]}), is_float)
>>> leaves
[2.0]
>>> tdef.unflatten([5.0])
((1, 'a'), {'k': [5.0, None]})
"""
import collections
import functools

from mgtrace.errors import Error

__all__ = ["TreeDef", "LeafDef", "tree_flatten", "tree_map", "register_supported_type",
           "TreeMismatch"]


class TreeMismatch(Error, TypeError):
    """A value does not have the structure a TreeDef expects."""


def _dict_flatten(d):
    return list(d.values()), tuple(d.keys())


def _dict_unflatten(values, keys):
    return dict(zip(keys, values))


def _odict_unflatten(values, keys):
    return collections.OrderedDict(zip(keys, values))


# type -> (flatten(obj) -> (children, aux), unflatten(children, aux) -> obj)
_SUPPORTED = {
    tuple: (lambda t: (list(t), None), lambda c, _: tuple(c)),
    list: (lambda t: (list(t), None), lambda c, _: list(c)),
    dict: (_dict_flatten, _dict_unflatten),
    collections.OrderedDict: (_dict_flatten, _odict_unflatten),
    slice: (lambda s: ([s.start, s.stop, s.step], None), lambda c, _: slice(*c)),
}


def register_supported_type(cls, flatten=None, unflatten=None):
    """Let the tracer look inside instances of ``cls`` (exactly that type,
    not subclasses), so tensors in them become graph nodes.

    Args:
        cls: the container type.
        flatten: ``obj -> (children: list, aux)``; aux must be hashable and
            comparable with ``==`` (it is part of the TreeDef, so two values
            with different aux are different structures).
        unflatten: ``(children: list, aux) -> obj``.

    Raises:
        TypeError: flatten/unflatten missing for a class that is not a
            namedtuple (namedtuples need neither).

    >>> class Pair:
    ...     def __init__(self, a, b):
    ...         self.a, self.b = a, b
    >>> register_supported_type(Pair, lambda p: ([p.a, p.b], None),
    ...                         lambda c, aux: Pair(*c))
    >>> tree_flatten(Pair(1.0, "x"), is_leaf=lambda v: isinstance(v, float))[0]
    [1.0]
    """
    if flatten is None or unflatten is None:
        if not hasattr(cls, "_fields"):
            raise TypeError(f"register_supported_type({cls.__name__}) needs flatten and "
                            "unflatten functions (only namedtuples work without them)")
        flatten, unflatten = _namedtuple_handler(cls)
    _SUPPORTED[cls] = (flatten, unflatten)


@functools.lru_cache(maxsize=None)
def _namedtuple_handler(t):
    return (lambda v: (list(v), None), lambda c, _aux: t(*c))


def _handler(obj):
    t = type(obj)
    h = _SUPPORTED.get(t)
    if h is None and isinstance(obj, tuple) and hasattr(t, "_fields"):   # any namedtuple
        h = _namedtuple_handler(t)
    return h


class LeafDef:
    """A leaf: a slot (``const is SLOT``) or a constant kept by value."""
    __slots__ = ("const",)

    def __init__(self, const):
        self.const = const

    @property
    def is_slot(self):
        return self.const is SLOT

    def __eq__(self, other):
        if not isinstance(other, LeafDef):
            return False
        a, b = self.const, other.const
        return type(a) is type(b) and (a is b or _const_equal(a, b))

    def __hash__(self):
        try:
            return hash((type(self.const), self.const))
        except TypeError:        # an unhashable constant (a list): equal ones still collide
            return hash(type(self.const))

    def __repr__(self):
        return "*" if self.is_slot else repr(self.const)


def _const_equal(a, b):
    try:
        return bool(a == b)
    except Exception:        # e.g. NumPy arrays (ambiguous truth): equal only if identical
        return False


class _Slot:
    """The marker of a slot in a LeafDef (one object, compared by identity)."""

    def __repr__(self):
        return "SLOT"

    def __reduce__(self):    # copy/deepcopy/pickle give back the module's SLOT itself
        return "SLOT"


SLOT = _Slot()


class TreeDef:
    """The structure of a pytree: a container type with aux data and child
    TreeDefs, or a LeafDef. ``num_leaves`` counts the slots."""
    __slots__ = ("type", "aux", "children", "num_leaves", "_hash")

    def __init__(self, type_, aux, children):
        self.type = type_
        self.aux = aux
        self.children = tuple(children)
        self.num_leaves = sum(c.num_leaves if isinstance(c, TreeDef) else int(c.is_slot)
                              for c in self.children)
        self._hash = None

    def unflatten(self, leaves):
        """The value with this structure, slots filled from ``leaves`` in order."""
        return self._build(iter(leaves))

    def slot_values(self, obj):
        """The values at this TreeDef's slots in ``obj``, which must have
        this structure (not checked: see :meth:`match` for that)."""
        out = []
        self._slots_of(obj, out)
        return out

    def _slots_of(self, obj, out):
        if self.type is _Root:
            kids = [obj]
        elif self.type in (dict, collections.OrderedDict):
            kids = [obj[k] for k in self.aux]
        else:
            kids = _handler_for_type(self.type)[0](obj)[0]
        for c, v in zip(self.children, kids):
            if isinstance(c, TreeDef):
                c._slots_of(v, out)
            elif c.is_slot:
                out.append(v)

    def _build(self, it):
        vals = []
        for c in self.children:
            if isinstance(c, TreeDef):
                vals.append(c._build(it))
            else:
                vals.append(next(it) if c.is_slot else c.const)
        return _handler_for_type(self.type)[1](vals, self.aux)

    def match(self, obj, is_leaf, path="args"):
        """Leaves of ``obj`` in this TreeDef's slot order, checking that its
        structure and constants equal this one's; dict entries are bound by
        key, so key order does not matter.

        Raises:
            TreeMismatch: naming the first place (e.g. ``args[1]['scale']``)
                that differs and what was expected there.
        """
        out = []
        self._match(obj, is_leaf, path, out)
        return out

    def _match(self, obj, is_leaf, path, out):
        if self.type is _Root:
            children = [(path, obj)]
        elif type(obj) is not self.type:
            raise TreeMismatch(f"{path}: expected {self.type.__name__}, got {type(obj).__name__}")
        elif self.type in (dict, collections.OrderedDict):
            if set(obj) != set(self.aux):
                raise TreeMismatch(f"{path}: expected keys {sorted(map(repr, self.aux))}, "
                                   f"got {sorted(map(repr, obj))}")
            children = [(f"{path}[{k!r}]", obj[k]) for k in self.aux]
        else:
            kids, aux = _handler(obj)[0](obj)
            if len(kids) != len(self.children):
                raise TreeMismatch(f"{path}: expected {len(self.children)} items, got {len(kids)}")
            if aux != self.aux:
                raise TreeMismatch(f"{path}: the module was traced with a {self.type.__name__} "
                                   f"whose flatten gave aux {_short(self.aux)}, got "
                                   f"{_short(aux)}; trace it again with this value")
            children = [(f"{path}[{i}]", k) for i, k in enumerate(kids)]
        for c, (p, v) in zip(self.children, children):
            if isinstance(c, TreeDef):
                c._match(v, is_leaf, p, out)
            elif c.is_slot:
                if not is_leaf(v):
                    raise TreeMismatch(f"{p}: expected a tensor, got {_short(v)}; "
                                       "pass mgtrace.tensor(value)")
                out.append(v)
            elif not LeafDef(v) == c:
                raise TreeMismatch(f"{p}: the module was traced with {_short(c.const)}, "
                                   f"got {_short(v)}; trace it again with this value")

    def __eq__(self, other):
        return (isinstance(other, TreeDef) and self.type is other.type and self.aux == other.aux
                and self.children == other.children)

    def __hash__(self):
        if self._hash is None:
            try:
                aux_h = hash(self.aux)
            except TypeError:
                aux_h = 0
            self._hash = hash((self.type, aux_h, self.children))
        return self._hash

    def __repr__(self):
        inner = ", ".join(map(repr, self.children))
        if self.type in (dict, collections.OrderedDict):
            inner = ", ".join(f"{k!r}: {c!r}" for k, c in zip(self.aux, self.children))
            return "{" + inner + "}"
        if self.type is _Root:
            return inner
        if self.type is tuple:
            return f"({inner}{',' if len(self.children) == 1 else ''})"
        if self.type is list:
            return f"[{inner}]"
        return f"{self.type.__name__}({inner})"


class _Root:
    """The container type of a TreeDef whose whole value is one leaf."""


_SUPPORTED[_Root] = (lambda v: ([v], None), lambda c, _aux: c[0])


def _handler_for_type(t):
    h = _SUPPORTED.get(t)
    if h is not None:
        return h
    if hasattr(t, "_fields"):
        return _namedtuple_handler(t)
    raise TypeError(f"{t.__name__} is not a supported pytree container")


def _short(v):
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def tree_flatten(obj, is_leaf):
    """``(leaves, treedef)``: the values for which ``is_leaf(v)`` is true,
    depth first, and the structure with every other leaf kept as a constant."""
    leaves = []
    tdef = _flatten(obj, is_leaf, leaves)
    if isinstance(tdef, LeafDef):
        tdef = TreeDef(_Root, None, [tdef])
    return leaves, tdef


def _flatten(obj, is_leaf, leaves):
    if is_leaf(obj):
        leaves.append(obj)
        return LeafDef(SLOT)
    h = _handler(obj)
    if h is None:
        return LeafDef(obj)
    kids, aux = h[0](obj)
    return TreeDef(type(obj), aux, [_flatten(k, is_leaf, leaves) for k in kids])


def tree_leaves(obj, is_leaf):
    """The leaves :func:`tree_flatten` gives, in its order, without
    building the TreeDef (an expr's input nodes: made for every expr a
    trace or a load creates)."""
    leaves = []
    _leaves(obj, is_leaf, leaves)
    return leaves


def _leaves(obj, is_leaf, out):
    if is_leaf(obj):
        out.append(obj)
        return
    h = _handler(obj)
    if h is not None:
        for k in h[0](obj)[0]:
            _leaves(k, is_leaf, out)


def tree_map(fn, obj, is_leaf):
    """``obj`` with every leaf ``v`` for which ``is_leaf(v)`` replaced by ``fn(v)``."""
    leaves, tdef = tree_flatten(obj, is_leaf)
    return tdef.unflatten([fn(v) for v in leaves])
