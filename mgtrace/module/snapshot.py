"""What a call of a module may rebind, taken before and put back after:
every submodule's attributes, its parameter, buffer and child tables, and
the contents of the lists and dicts it holds, nested ones included (the
objects, not their values: a tensor written in place is the caller's to
copy).

``trace_module`` puts the traced module back with it, and ``mgtrace.compile``
puts the compiled one back and refuses a forward that changed its tensors
(a plan replays kernels; it would not redo ``self.n = self.n + 1`` or
``self.hist.append(x)``).

Only what differs is written back: another thread may be iterating over the
same tables meanwhile (a server's eager calls while a plan records a new
input signature), and a table cleared and refilled under it raised
"OrderedDict mutated during iteration".
"""
from mgtrace._core import Tensor
from mgtrace.module.module import _MAX_NESTING as _DEPTH, _TABLE_NAMES as _TABLES, Module

__all__ = ["ModuleSnapshot"]

_MISSING = object()


def _holds_state(v, depth=0):
    """Whether a value is module state a plan or a trace must not lose: a
    tensor, a module, or a list, tuple or dict holding one."""
    if isinstance(v, (Tensor, Module)):
        return True
    if depth < _DEPTH and isinstance(v, (list, tuple)):
        return any(_holds_state(x, depth + 1) for x in v)
    if depth < _DEPTH and isinstance(v, dict):
        return any(_holds_state(x, depth + 1) for x in v.values())
    return False


def _containers(v, out, depth=0):
    """(container, shallow copy of its contents) for ``v`` and every list or
    dict inside it (through tuples too)."""
    if depth >= _DEPTH:
        return
    if isinstance(v, list):
        out.append((v, list(v)))
    elif isinstance(v, dict):
        out.append((v, dict(v)))
    elif not isinstance(v, tuple):
        return
    for x in (v.values() if isinstance(v, dict) else v):
        _containers(x, out, depth + 1)


def _diff_keys(now, held):
    """The keys added to, removed from or rebound in dict ``now`` against
    the ``held`` copy of it (by identity)."""
    return [k for k in now if k not in held] + [k for k in held if now.get(k, _MISSING) is not held[k]]


def _changed_entries(held, obj):
    """The values added, removed or replaced between the held contents and
    the container now (by identity)."""
    if isinstance(obj, dict):
        return [v for k in _diff_keys(obj, held) for v in (held.get(k), obj.get(k))]
    if len(held) == len(obj) and all(a is b for a, b in zip(held, obj)):
        return []
    now = {id(x) for x in obj}
    before = {id(x) for x in held}
    # (the same objects in another order: any of them counts)
    return [x for x in held if id(x) not in now] + [x for x in obj if id(x) not in before] or list(obj)


def _put(table, key, held, missing):
    """table[key] back to ``held`` (``missing``: it was not there)."""
    if missing:
        table.pop(key, None)
    else:
        table[key] = held


class ModuleSnapshot:
    """Every submodule's ``__dict__``, tables and (nested) list/dict
    attributes of ``module``, as held now."""

    def __init__(self, module):
        self.modules = []
        for path, m in type(module).named_modules(module):
            d = m.__dict__
            tables = {k: dict(d[k]) for k in _TABLES if isinstance(d.get(k), dict)}
            contents = []       # (attribute name, container, its contents)
            for k, v in d.items():
                if k not in _TABLES:
                    found = []
                    _containers(v, found)
                    contents += [(k, c, held) for c, held in found]
            self.modules.append((path, m, dict(d), tables, contents))

    def restore(self):
        """Put back what a call changed; returns (names of the changed
        members that hold state (tensors, modules, containers of them),
        names of the other changed attributes). A private attribute
        (``_packed``: a layer's cache of its packed weights, made on its
        first call) is put back but not named; a private parameter, buffer
        or submodule is state like any other."""
        state, other = set(), set()

        def note(path, k, values, table):
            if not table and k.startswith("_"):
                return
            name = f"{path}.{k}" if path else k
            (state if any(_holds_state(v) for v in values) else other).add(name)

        for path, m, d, tables, contents in self.modules:
            md = m.__dict__
            for k, obj, held in contents:
                entries = _changed_entries(held, obj)
                if not entries:
                    continue
                note(path, k, entries, False)
                obj.clear()
                if isinstance(obj, list):
                    obj.extend(held)
                else:
                    obj.update(held)
            for k in _diff_keys(md, d):
                if k in _TABLES:
                    continue
                note(path, k, (d.get(k), md.get(k)), False)
                _put(md, k, d.get(k), k not in d)
            for t, old in tables.items():
                now = md.get(t)
                if not isinstance(now, dict):
                    continue
                for k in _diff_keys(now, old):
                    note(path, k, (old.get(k), now.get(k)), True)
                    _put(now, k, old.get(k), k not in old)
        return sorted(state), sorted(other)
