"""What a call of a module may rebind, taken before and put back after:
every submodule's attributes, its parameter, buffer and child tables, and
the contents of the lists and dicts it holds (the objects, not their
values: a tensor written in place is the caller's to copy).

``trace_module`` puts the traced module back with it, and ``mgtrace.compile``
puts the compiled one back and refuses a forward that changed its tensors
(a plan replays kernels; it would not redo ``self.n = self.n + 1`` or
``self.hist.append(x)``).
"""
from mgtrace._core import Tensor

__all__ = ["ModuleSnapshot"]

_TABLES = ("_parameters", "_buffers", "_modules")


def _holds_state(v):
    """Whether a value is module state a plan or a trace must not lose: a
    tensor, a module, or a list, tuple or dict holding one."""
    from mgtrace.module.module import Module
    if isinstance(v, (Tensor, Module)):
        return True
    if isinstance(v, (list, tuple)):
        return any(_holds_state(x) for x in v)
    if isinstance(v, dict):
        return any(_holds_state(x) for x in v.values())
    return False


def _same(a, b):
    """Equal as held objects: the same object, or containers of the same
    objects (compared by identity, element by element)."""
    if a is b:
        return True
    if isinstance(a, list) and isinstance(b, list) or isinstance(a, dict) and isinstance(b, dict):
        if len(a) != len(b):
            return False
        if isinstance(a, dict):
            return a.keys() == b.keys() and all(a[k] is b[k] for k in a)
        return all(x is y for x, y in zip(a, b))
    return False


class ModuleSnapshot:
    """Every submodule's ``__dict__``, tables and list/dict attributes of
    ``module``, as held now."""

    def __init__(self, module):
        self.modules = []
        for path, m in type(module).named_modules(module):
            d = m.__dict__
            tables = {k: dict(d[k]) for k in _TABLES if isinstance(d.get(k), dict)}
            # lists and dicts held as plain attributes: their contents, so
            # an append in forward can be undone in the same object
            contents = {k: (v, list(v) if isinstance(v, list) else dict(v))
                        for k, v in d.items() if k not in _TABLES and isinstance(v, (list, dict))}
            self.modules.append((path, m, dict(d), tables, contents))

    def restore(self):
        """Put every module back as held at the snapshot; returns (names of
        the changed members that hold state (tensors, modules, containers
        of them), names of the other changed attributes). Private names
        (``_packed``: a layer's cache of its packed weights, made on its
        first call) are put back but not named."""
        state, other = [], []
        for path, m, d, tables, contents in self.modules:
            md = m.__dict__
            changed = []
            for k in set(md) | set(d):
                if k in _TABLES:
                    continue
                if k not in md or k not in d or md[k] is not d[k]:
                    changed.append((k, d.get(k), md.get(k)))
                elif k in contents and not _same(contents[k][1], md[k]):
                    changed.append((k, contents[k][1], md[k]))
            for t, old in tables.items():
                now = md.get(t, {})
                for k in set(now) | set(old):
                    if k not in now or k not in old or now[k] is not old[k]:
                        changed.append((k, old.get(k), now.get(k)))
            for k, old, new in changed:
                if k.startswith("_"):
                    continue
                name = f"{path}.{k}" if path else k
                (state if _holds_state(old) or _holds_state(new) else other).append(name)
            md.clear()
            md.update(d)
            for t, old in tables.items():
                md[t].clear()
                md[t].update(old)
            for k, (obj, held) in contents.items():
                if _same(held, obj):
                    continue
                obj.clear()
                if isinstance(obj, list):
                    obj.extend(held)
                else:
                    obj.update(held)
        return sorted(set(state)), sorted(set(other))
