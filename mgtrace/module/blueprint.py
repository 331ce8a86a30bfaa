"""Blueprints: modules built again without running their ``__init__``.

A :class:`Blueprint` records what a freshly constructed module looks like,
less its tensors: its class, its plain attributes, the names (in order) of
its parameters, buffers and children, and the shapes of its state. Building
from it makes a module whose every attribute is what ``__init__`` gave,
with ``None`` standing where each tensor of the state dict goes, for the
caller to fill (the archive reader installs a file's tensors there). No
initialiser runs, so nothing is allocated or randomly initialised only to
be overwritten.

Only a module whose state is plain can have one: attributes that are
immutable values (bool, int, float, str, None, tuples and frozensets of
them, NumPy dtypes), no tensor outside its state dict (a non-persistent
buffer, a tensor attribute), children that are plain in turn. Anything else
(a list, a bound method, an observer object) could be shared between
copies, so :meth:`Blueprint.of` gives None for it and the caller runs the
constructor.
"""
import numpy as np

from mgtrace.module.module import _Table

__all__ = ["Blueprint", "plain_value"]

_IMMUTABLE = (bool, int, float, str, type(None), np.dtype)
_TABLES = ("_parameters", "_buffers", "_modules", "_non_persistent_buffers")


def plain_value(v):
    """Whether ``v`` is an immutable value a blueprint may share between
    modules: bool, int, float, str, None, a NumPy dtype, or a tuple or
    frozenset of such values."""
    if isinstance(v, _IMMUTABLE):
        return True
    if type(v) in (tuple, frozenset):
        return all(map(plain_value, v))
    return False


class Blueprint:
    """A fresh module's structure, less its tensors (see the module docstring).

    Attributes:
        state_shapes: ``{state_dict key: shape}`` of the module it was taken
            from, in state_dict order.
    """
    __slots__ = ("_cls", "_plain", "_params", "_buffers", "_children", "state_shapes")

    @classmethod
    def of(cls, module):
        """The blueprint of ``module`` (just constructed: its values are
        those every copy gets), or None when its state is not plain."""
        bp = cls._take(module)
        if bp is None:
            return None
        bp.state_shapes = {k: t.shape for k, t in
                           type(module).state_dict(module, keep_vars=True).items()}
        return bp

    @classmethod
    def _take(cls, module):
        d = module.__dict__
        if d.get("_non_persistent_buffers"):
            return None
        # every attribute in the original's order (tables: None here, made by build)
        plain = {k: None if k in _TABLES else v for k, v in d.items()}
        if not all(map(plain_value, plain.values())):
            return None
        children = []
        for name, child in d["_modules"].items():
            sub = None if child is None else cls._take(child)
            if child is not None and sub is None:
                return None
            children.append((name, sub))
        bp = cls.__new__(cls)
        bp._cls, bp._plain, bp._children = type(module), plain, children
        bp._params, bp._buffers = tuple(d["_parameters"]), tuple(d["_buffers"])
        return bp

    def build(self):
        """A new module of the blueprint's class and attributes, ``__init__``
        not run: parameters and buffers the original had are None, to be
        set (every key of :attr:`state_shapes`) before the module is used."""
        m = self._cls.__new__(self._cls)
        d = m.__dict__
        d.update(self._plain)
        d["_parameters"] = _Table.fromkeys(self._params)
        d["_buffers"] = _Table.fromkeys(self._buffers)
        d["_non_persistent_buffers"] = set()
        d["_modules"] = _Table((k, None if sub is None else sub.build()) for k, sub in self._children)
        return m
