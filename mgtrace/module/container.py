"""Containers: Sequential, ModuleList, ModuleDict.

They hold child modules under string keys (``"0"``, ``"1"``, ... for the
ordered ones), so state_dict keys read ``"layers.0.weight"`` as in PyTorch.
The tracer traces into them; none is a builtin leaf.
"""
import operator
from collections import OrderedDict

from mgtrace.module.module import Module

__all__ = ["Sequential", "ModuleList", "ModuleDict"]


def _index(idx, n, kind):
    try:
        i = operator.index(idx)
    except TypeError:
        raise TypeError(f"{kind} indices must be integers or slices, not "
                        f"{type(idx).__name__}") from None
    if not -n <= i < n:
        raise IndexError(f"index {i} is out of range for a {kind} of length {n}")
    return i + n if i < 0 else i


class _Ordered(Module):
    """Shared code of Sequential and ModuleList: children keyed by position."""

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def _values(self):
        return list(self._modules.values())

    def _reset(self, mods):
        self._modules.clear()
        for i, m in enumerate(mods):
            self.add_module(str(i), m)

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return type(self)._from_items(list(self._modules.items())[idx])
        return self._values()[_index(idx, len(self), type(self).__name__)]

    def __setitem__(self, idx, module):
        key = list(self._modules)[_index(idx, len(self), type(self).__name__)]
        self.add_module(key, module)

    def __delitem__(self, idx):
        mods = self._values()
        if isinstance(idx, slice):
            del mods[idx]
        else:
            del mods[_index(idx, len(self), type(self).__name__)]
        self._reset(mods)

    def append(self, module):
        """Add ``module`` at the end; returns self."""
        self.add_module(str(len(self)), module)
        return self

    def extend(self, modules):
        """Append each module of an iterable; returns self."""
        for m in modules:
            self.append(m)
        return self

    def insert(self, index, module):
        """Insert ``module`` before position ``index`` (list semantics)."""
        mods = self._values()
        mods.insert(index, module)
        self._reset(mods)

    def pop(self, index=-1):
        m = self[index]
        del self[index]
        return m

    def index(self, module):
        """Position of ``module`` (by identity). Raises ValueError if absent."""
        for i, m in enumerate(self._modules.values()):
            if m is module:
                return i
        raise ValueError(f"{type(module).__name__} is not in this {type(self).__name__}")

    def __dir__(self):
        return [k for k in super().__dir__() if not k.isdigit()]


class Sequential(_Ordered):
    """Runs its children in order, each on the previous one's output.

    Build it from modules (``Sequential(a, b)``, keys ``"0"``, ``"1"``) or from
    one OrderedDict of name -> module. Indexing gives a child; a slice gives a
    Sequential of those children (keys kept).

    >>> import mgtrace.module as M
    >>> s = M.Sequential(M.Linear(4, 8), M.ReLU(), M.Linear(8, 2))
    >>> len(s), type(s[1]).__name__, len(s[:2])
    (3, 'ReLU', 2)
    """

    def __init__(self, *args):
        super().__init__()
        if len(args) == 1 and isinstance(args[0], OrderedDict):
            for name, m in args[0].items():
                self.add_module(name, m)
        else:
            for i, m in enumerate(args):
                if not isinstance(m, Module):
                    raise TypeError(f"Sequential takes Modules (or one OrderedDict), "
                                    f"argument {i} is {type(m).__name__}")
                self.add_module(str(i), m)

    @classmethod
    def _from_items(cls, items):
        return cls(OrderedDict(items))

    def forward(self, x):
        for m in self._modules.values():
            x = m(x)
        return x


class ModuleList(_Ordered):
    """A list of child modules, registered (state_dict keys ``"3.weight"``).

    Supports ``append``, ``extend``, ``insert``, ``pop``, ``index``, ``len``,
    iteration, integer indexing and slicing (a new ModuleList of the same
    module objects). It has no ``forward``: iterate it in the owner's.
    """

    def __init__(self, modules=None):
        super().__init__()
        if modules is not None:
            self.extend(modules)

    @classmethod
    def _from_items(cls, items):
        return cls([m for _, m in items])

    def __iadd__(self, modules):
        return self.extend(modules)

    def append(self, module):
        if not isinstance(module, Module):
            raise TypeError(f"ModuleList holds Modules, not {type(module).__name__}")
        return super().append(module)


class ModuleDict(Module):
    """An ordered dict of child modules (string keys, insertion order).

    Supports ``[key]``, ``[key] = m``, ``del``, ``in``, ``len``, iteration
    over keys, ``keys()``, ``items()``, ``values()``, ``update()``, ``pop()``.
    """

    def __init__(self, modules=None):
        super().__init__()
        if modules is not None:
            self.update(modules)

    def __getitem__(self, key):
        if key not in self._modules:
            raise KeyError(f"{key!r} is not in this ModuleDict (keys: {list(self._modules)})")
        return self._modules[key]

    def __setitem__(self, key, module):
        if not isinstance(module, Module):
            raise TypeError(f"ModuleDict holds Modules, not {type(module).__name__} (key {key!r})")
        self.add_module(key, module)

    def __delitem__(self, key):
        del self._modules[key]

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules)

    def __contains__(self, key):
        return key in self._modules

    def keys(self):
        return self._modules.keys()

    def items(self):
        return self._modules.items()

    def values(self):
        return self._modules.values()

    def pop(self, key):
        m = self[key]
        del self[key]
        return m

    def clear(self):
        self._modules.clear()

    def update(self, modules):
        """Add (key, module) pairs from a mapping or an iterable of pairs."""
        items = modules.items() if hasattr(modules, "items") else modules
        for pair in items:
            key, m = pair
            self[key] = m
