"""Module: the base class of every network block.

State lives in three ordered tables that attribute assignment keeps up to
date (PyTorch's model, which users of MegEngine and torch.fx both expect):

* ``_parameters``: :class:`Parameter` values (learnable),
* ``_buffers``: tensors registered with :meth:`Module.register_buffer`
  (running statistics and the like; ``persistent=False`` ones stay out of
  :meth:`Module.state_dict`),
* ``_modules``: child modules.

The rule for ``module.name = value`` (MegEngine's module rules):

===========================================  ==================================
value                                        effect
===========================================  ==================================
a Parameter                                  registered as parameter ``name``
a Module                                     registered as child ``name``
a Tensor (not a Parameter)                   registered as (persistent) buffer
                                             ``name``
None, ``name`` is registered                 stays registered, holds None
                                             (skipped by the iterators and
                                             state_dict, like an absent bias)
a plain Tensor, ``name`` is a parameter      TypeError (wrap it in Parameter,
                                             or ``del`` the parameter first)
a list, tuple or dict                        a plain attribute whose Modules
                                             and Tensors (nested too) are
                                             submodules, parameters and
                                             buffers named by their place:
                                             ``layers.0``, ``heads.cls.1``
anything else                                a plain attribute; a registration
                                             under ``name`` is dropped
===========================================  ==================================

``del module.name`` drops the registration. Modules and tensors in plain
lists, tuples and dicts (OrderedDict too) held as attributes are found each
time the module is walked (``named_modules``, ``parameters``,
``state_dict``, ``to``, tracing, saving), so appending to such a list later
works too; dict keys holding them must be strings without dots.
:class:`ModuleList` and :class:`ModuleDict` work as well. PyTorch differs:
it ignores modules in plain Python containers and keeps plain tensor
attributes out of ``state_dict`` (``register_buffer`` is the only way in).

Forward hooks (:meth:`Module.register_forward_pre_hook`,
:meth:`Module.register_forward_hook`) are kept outside the instance
``__dict__``, in a table keyed weakly by module: they belong to the module
object, not to its state, so a TracedModule made from it (whose graph
already holds what the hooks did while it was traced) does not run them a
second time; ``copy.deepcopy`` carries them over, as in PyTorch.
"""
import copy
import itertools
import weakref
from collections import OrderedDict, namedtuple

import numpy as np

from mgtrace.errors import Error
from mgtrace._core import Tensor, as_device, as_dtype
from mgtrace._core import trace_hooks as _hooks
from mgtrace.module.parameter import Parameter

__all__ = ["Module", "StateDictError", "IncompatibleKeys", "RemovableHandle"]


class StateDictError(Error, ValueError):
    """``load_state_dict`` refused a state dict.

    Attributes:
        missing_keys: keys the module has and the state dict lacks.
        unexpected_keys: keys the state dict has and the module lacks.
        mismatched: ``(key, what, expected, actual)`` tuples for shape and
            dtype mismatches (``what`` is ``"shape"``, ``"dtype"`` or ``"type"``).
    """

    def __init__(self, message, missing_keys=(), unexpected_keys=(), mismatched=()):
        super().__init__(message)
        self.missing_keys = list(missing_keys)
        self.unexpected_keys = list(unexpected_keys)
        self.mismatched = list(mismatched)


IncompatibleKeys = namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])
IncompatibleKeys.__doc__ = """What ``load_state_dict`` did not match: lists of keys."""


_FLOATS = frozenset(["float16", "bfloat16", "float32", "float64"])


class RemovableHandle:
    """What :meth:`Module.register_forward_pre_hook` and
    :meth:`Module.register_forward_hook` return (PyTorch's
    ``RemovableHandle``): ``remove()`` unregisters the hook (a second call
    does nothing); as a context manager it removes the hook on exit.

    Attributes:
        id: the hook's key in its module's table (unique in the process).
    """

    _ids = itertools.count()

    def __init__(self, table, module=None):
        self._table = weakref.ref(table)
        self._module = None if module is None else weakref.ref(module)
        self.id = next(RemovableHandle._ids)

    def remove(self):
        table = self._table()
        if table is not None:
            table.pop(self.id, None)
        module = self._module() if self._module is not None else None
        hooks = _HOOKS.get(module) if module is not None else None
        if hooks is not None and not hooks.pre and not hooks.post:
            del _HOOKS[module]      # no hooks left: traced modules take their fast path again

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()

    def __repr__(self):
        return f"RemovableHandle(id={self.id})"


class _Hooks:
    """One module's forward hooks, in call order: ``pre`` and ``post`` map a
    handle id to ``(hook, with_kwargs, always_call)``."""
    __slots__ = ("pre", "post")

    def __init__(self):
        self.pre, self.post = OrderedDict(), OrderedDict()

    def copy(self):
        new = _Hooks()
        new.pre.update(self.pre)
        new.post.update(self.post)
        return new


_HOOKS = weakref.WeakKeyDictionary()    # Module -> _Hooks

_TABLE_NAMES = ("_parameters", "_buffers", "_modules")

STATE_EPOCH = 0
"""A count of the changes made to the tables of every module (parameters,
buffers, children): a TracedModule resolves the attribute paths its graph
reads once and reuses them while this stays the same (traced_module.py)."""


def _bump():
    global STATE_EPOCH
    STATE_EPOCH += 1


class _Table(OrderedDict):
    """A module's table of parameters, buffers or child modules: an
    OrderedDict whose every change, by whatever code, bumps STATE_EPOCH
    (after the change: a thread that reads the new epoch sees it)."""
    __slots__ = ()

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        _bump()

    def __delitem__(self, key):
        super().__delitem__(key)
        _bump()

    def clear(self):
        super().clear()
        _bump()

    def pop(self, *args):
        try:
            return super().pop(*args)
        finally:
            _bump()

    def popitem(self, last=True):
        try:
            return super().popitem(last)
        finally:
            _bump()

    def setdefault(self, key, default=None):
        try:
            return super().setdefault(key, default)
        finally:
            _bump()

    def update(self, *args, **kwargs):
        super().update(*args, **kwargs)
        _bump()

    def __ior__(self, other):
        self.update(other)
        return self


def _register_hook(module, kind, hook, prepend, with_kwargs, always_call=False):
    fn = f"{type(module).__name__}.register_forward{'_pre' if kind == 'pre' else ''}_hook"
    if not callable(hook):
        raise TypeError(f"{fn}: hook must be callable, got {type(hook).__name__}")
    for name, v in (("prepend", prepend), ("with_kwargs", with_kwargs), ("always_call", always_call)):
        if not isinstance(v, bool):
            raise TypeError(f"{fn}: {name} must be a bool, got {type(v).__name__}")
    hooks = _HOOKS.get(module)
    if hooks is None:
        hooks = _HOOKS[module] = _Hooks()
    table = getattr(hooks, kind)
    handle = RemovableHandle(table, module)
    table[handle.id] = (hook, with_kwargs, always_call)
    if prepend:
        table.move_to_end(handle.id, last=False)
    return handle


def _hook_name(hook):
    return getattr(hook, "__qualname__", None) or repr(hook)


def _check_name(kind, name):
    if not isinstance(name, str):
        raise TypeError(f"{kind} name must be a str, got {type(name).__name__}")
    if name == "":
        raise ValueError(f"{kind} name cannot be empty")
    if "." in name:
        raise ValueError(f"{kind} name cannot contain '.', got {name!r} "
                         "(dots separate the levels of state_dict keys)")


def _addindent(text, spaces):
    lines = text.split("\n")
    if len(lines) == 1:
        return text
    pad = " " * spaces
    return lines[0] + "\n" + "\n".join(pad + line for line in lines[1:])


def _view(t):
    """A plain Tensor sharing ``t``'s storage (what state_dict hands out)."""
    return t.reshape(t.shape)


_STRUCTURES = (list, tuple, dict)
_MAX_NESTING = 32


def _structure_leaves(path, value, depth=0):
    """``(dotted path, leaf)`` for each Module or Tensor inside the list,
    tuple or dict ``value`` (nested), in order: ``("layers.0", m)``.

    Raises:
        TypeError: a dict holding one is keyed by something not a str.
        ValueError: such a key is empty or has a dot; nesting too deep.
    """
    if depth > _MAX_NESTING:
        raise ValueError(f"{path}: containers nest deeper than {_MAX_NESTING} levels")
    items = value.items() if isinstance(value, dict) else enumerate(value)
    out = []
    for k, v in items:
        if isinstance(v, (Module, Tensor)):
            out.append((f"{path}.{_structure_key(path, k)}", v))
        elif isinstance(v, _STRUCTURES) and v:
            inner = _structure_leaves(f"{path}.{k}", v, depth + 1)
            if inner:
                _structure_key(path, k)
                out += inner
    return out


def _structure_key(path, k):
    if isinstance(k, int) and not isinstance(k, bool):
        return str(k)
    if not isinstance(k, str):
        raise TypeError(f"{path}: a dict holding modules or tensors must have str keys, got "
                        f"{type(k).__name__} {k!r} (MegEngine's rule)")
    if not k or "." in k:
        raise ValueError(f"{path}: key {k!r} of a dict holding modules or tensors must be a "
                         "non-empty str without '.' (dots separate the levels of names)")
    return k


_ALIASES_DONE = ("mgtrace", "storage copied")     # memo key: modules whose tree was scanned


def _copy_shared_storage(module, memo):
    """Put in ``memo`` one copy of each storage that two or more tensors of
    ``module``'s tree view, and each of those tensors as the same view of
    it (same class, shape, strides and offset), so that deepcopy keeps
    what eager code shares instead of copying every view apart. Once per
    tree: submodules see their root's work in ``memo``."""
    from mgtrace._core.tensor import share_as, storage_spans, strided_view
    done = memo.setdefault(_ALIASES_DONE, set())
    if id(module) in done:
        return
    found = {}
    for m in type(module).modules(module):
        done.add(id(m))
        d = m.__dict__
        members = list(d.get("_parameters", {}).values()) + list(d.get("_buffers", {}).values())
        members += list(d.values()) + [t for _, t in m._structure_members()]
        for t in members:
            if isinstance(t, Tensor) and id(t) not in memo:
                found.setdefault(id(t), t)
    tensors = list(found.values())
    for span, views in storage_spans(tensors):
        copied = span.copy()
        for i, offset in views:
            t = tensors[i]
            view = share_as(strided_view(copied, t.shape, t.strides, offset), type(t))
            attrs = getattr(t, "__dict__", None)
            if attrs:
                view.__dict__.update(copy.deepcopy(attrs, memo))
            memo[id(t)] = view



def _shadow(module, name):
    """A parameter, buffer or submodule whose name is also a class attribute
    of the module (``self.children = M.ReLU()``, a user's name for a
    ``Module`` method) is kept in the instance's ``__dict__`` too, so that
    ``module.children`` is the user's member, as in MegEngine (whose modules
    keep members in ``__dict__``); mgtrace's own code calls such methods
    through the class (``type(m).children(m)``), never the instance."""
    if hasattr(type(module), name):
        d = module.__dict__
        for table in ("_parameters", "_buffers", "_modules"):
            t = d.get(table)
            if t is not None and name in t:
                d[name] = t[name]
                return

class Module:
    """Base class of network blocks: parameters, buffers, child modules, forward.

    Subclasses call ``super().__init__()`` first, assign Parameters, Modules
    and buffers in ``__init__``, and define ``forward``. Calling the module
    runs ``forward``.

    >>> import mgtrace as mt, mgtrace.module as M
    >>> class Net(M.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.fc = M.Linear(4, 2)
    ...         self.register_buffer("scale", mt.tensor([2.0]))
    ...     def forward(self, x):
    ...         return self.fc(x) * self.scale
    >>> list(Net().state_dict())
    ['scale', 'fc.weight', 'fc.bias']
    >>> Net()(mt.tensor([[1.0, 2.0, 3.0, 4.0]])).shape
    (1, 2)
    """

    training: bool
    name = None           # a label given to __init__ (MegEngine's Module(name=...))
    # attributes of the instance that are bookkeeping, not state: never searched
    # for modules and tensors (TracedModule adds its own)
    _NOT_STATE = frozenset()

    def __init__(self, name=None):
        """Args:
            name: an optional label for the module (MegEngine's ``name``):
                a non-empty str, readable as ``module.name`` (None when not
                given). It names nothing else: state_dict keys and graph
                names come from attribute paths and class names.

        Raises:
            TypeError: name is not a str. ValueError: name is empty or blank.
        """
        if name is not None:
            if not isinstance(name, str):
                raise TypeError(f"{type(self).__name__}: name must be a str, got "
                                f"{type(name).__name__}")
            if not name.strip():
                raise ValueError(f"{type(self).__name__}: name must be a non-empty str")
        d = self.__dict__
        d["training"] = True
        d["_parameters"] = _Table()
        d["_buffers"] = _Table()
        d["_non_persistent_buffers"] = set()
        d["_modules"] = _Table()
        if name is not None:
            d["name"] = name

    # ------------------------------------------------------------ forward
    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} has no forward(); define "
                                  "forward(self, ...) in the subclass")

    def __call__(self, *args, **kwargs):
        hook = _hooks.active
        if hook is not None and _hooks.owner == _hooks.get_ident():   # this thread traces: the tracer runs it
            return hook.on_module_call(self, args, kwargs)
        return self._call_impl(args, kwargs)

    def _call_impl(self, args, kwargs):
        """What calling the module does (the tracer calls this too): forward
        pre-hooks, ``forward``, forward hooks."""
        hooks = _HOOKS.get(self) if _HOOKS else None
        if hooks is None or not (hooks.pre or hooks.post):
            return self.forward(*args, **kwargs)
        for hook, with_kwargs, _ in list(hooks.pre.values()):
            if with_kwargs:
                result = hook(self, args, kwargs)
                if result is not None:
                    if not (isinstance(result, tuple) and len(result) == 2
                            and isinstance(result[1], dict)):
                        raise TypeError(
                            f"forward pre-hook {_hook_name(hook)} of {type(self).__name__} was "
                            "registered with_kwargs=True, so it must return None or a tuple "
                            f"(args, kwargs), got {type(result).__name__}")
                    args, kwargs = result
                    args = args if isinstance(args, tuple) else (args,)
            else:
                result = hook(self, args)
                if result is not None:
                    args = result if isinstance(result, tuple) else (result,)
        post = list(hooks.post.values())
        try:
            out = self.forward(*args, **kwargs)
        except BaseException:
            for hook, with_kwargs, always_call in post:
                if always_call:
                    try:
                        hook(self, args, kwargs, None) if with_kwargs else hook(self, args, None)
                    except Exception:
                        pass            # the forward's error is the one to report
            raise
        for hook, with_kwargs, _ in post:
            result = hook(self, args, kwargs, out) if with_kwargs else hook(self, args, out)
            if result is not None:
                out = result
        return out

    def register_forward_pre_hook(self, hook, *, prepend=False, with_kwargs=False):
        """Run ``hook`` before every ``forward`` of this module (PyTorch's API).

        Args:
            hook: ``hook(module, args)`` returning None (inputs unchanged) or
                the new positional arguments (a tuple; any other value is
                taken as the single argument). With ``with_kwargs=True``:
                ``hook(module, args, kwargs)`` returning None or a tuple
                ``(args, kwargs)``.
            prepend: run before the hooks already registered (default after).
            with_kwargs: pass the keyword arguments too.

        Returns:
            :class:`RemovableHandle`; ``handle.remove()`` unregisters the hook.

        Raises:
            TypeError: hook not callable; prepend/with_kwargs not bools. When
                called, a with_kwargs hook returning something else than None
                or an (args, kwargs) tuple.

        Hooks run in eager calls and while the module is traced: the graph
        of a traced-into module records what they did, and the TracedModule
        made from it does not run them again. A builtin (leaf) module keeps
        its hooks on the object; hooks are never saved in archives.

        >>> import mgtrace as mt, mgtrace.module as M
        >>> relu = M.ReLU()
        >>> h = relu.register_forward_pre_hook(lambda m, args: (args[0] - 1,))
        >>> relu(mt.tensor([0.5, 3.0])).tolist()
        [0.0, 2.0]
        >>> h.remove(); relu(mt.tensor([0.5, 3.0])).tolist()
        [0.5, 3.0]
        """
        return _register_hook(self, "pre", hook, prepend, with_kwargs)

    def register_forward_hook(self, hook, *, prepend=False, with_kwargs=False, always_call=False):
        """Run ``hook`` after every ``forward`` of this module (PyTorch's API).

        Args:
            hook: ``hook(module, args, output)`` returning None (output
                unchanged) or the new output; ``args`` are the positional
                arguments forward got (after any pre-hook). With
                ``with_kwargs=True``: ``hook(module, args, kwargs, output)``.
            prepend: run before the hooks already registered (default after).
            with_kwargs: pass the keyword arguments too.
            always_call: also run (with output None) when forward raises;
                the forward's exception is then re-raised.

        Returns:
            :class:`RemovableHandle`; ``handle.remove()`` unregisters the hook.

        Raises:
            TypeError: hook not callable; a flag that is not a bool.

        >>> import mgtrace as mt, mgtrace.module as M
        >>> seen = []
        >>> fc = M.Linear(3, 2)
        >>> with fc.register_forward_hook(lambda m, args, out: seen.append(out.shape)):
        ...     _ = fc(mt.tensor([[1.0, 2.0, 3.0]]))
        >>> _ = fc(mt.tensor([[1.0, 2.0, 3.0]]))      # removed on leaving the with block
        >>> seen
        [(1, 2)]
        """
        return _register_hook(self, "post", hook, prepend, with_kwargs, always_call)

    # ------------------------------------------------------- registration
    def _tables(self):
        try:
            d = self.__dict__
            return d["_parameters"], d["_buffers"], d["_modules"]
        except KeyError:
            raise AttributeError(f"{type(self).__name__}.__init__ must call "
                                 "super().__init__() before assigning attributes") from None

    def _check_new_name(self, kind, name):
        _check_name(kind, name)
        params, buffers, modules = self._tables()
        if name in self.__dict__ or (hasattr(type(self), name) and name not in params
                                     and name not in buffers and name not in modules):
            raise KeyError(f"attribute {name!r} already exists on {type(self).__name__}")

    def register_parameter(self, name, param):
        """Register ``param`` (a Parameter, or None for an absent one) as ``name``.

        Raises TypeError for a value that is not a Parameter or None,
        KeyError when ``name`` is already a plain attribute."""
        if param is not None and not isinstance(param, Parameter):
            raise TypeError(f"cannot register {type(param).__name__} as parameter {name!r}: "
                            "mgtrace.module.Parameter or None expected")
        self._check_new_name("parameter", name)
        self._drop(name, keep=self._parameters)
        self._parameters[name] = param

    def register_buffer(self, name, tensor, persistent=True):
        """Register ``tensor`` (a Tensor, or None) as buffer ``name``.

        Buffers are state that is not learned (running statistics). A
        persistent buffer appears in ``state_dict``; a non-persistent one
        only in ``named_buffers``.

        Raises TypeError for a value that is not a Tensor or None,
        KeyError when ``name`` is already a plain attribute."""
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(f"cannot register {type(tensor).__name__} as buffer {name!r}: "
                            "mgtrace.Tensor or None expected")
        self._check_new_name("buffer", name)
        self._drop(name, keep=self._buffers)
        self._buffers[name] = tensor
        if persistent:
            self._non_persistent_buffers.discard(name)
        else:
            self._non_persistent_buffers.add(name)

    def add_module(self, name, module):
        """Register ``module`` (a Module, or None) as child ``name``."""
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"cannot register {type(module).__name__} as child module {name!r}: "
                            "mgtrace.module.Module or None expected")
        self._check_new_name("module", name)
        self._drop(name, keep=self._modules)
        self._modules[name] = module

    register_module = add_module

    def _drop(self, name, keep=None):
        """Forget ``name`` everywhere except the table ``keep`` (so that
        re-registering a name keeps its position, as PyTorch's dicts do)."""
        for table in self._tables():
            if table is not keep:
                table.pop(name, None)
        if keep is not self._buffers:
            self._non_persistent_buffers.discard(name)
        self.__dict__.pop(name, None)

    def __setattr__(self, name, value):
        if name in _TABLE_NAMES and isinstance(value, dict) and not isinstance(value, _Table):
            value = _Table(value)       # a table put in place whole still reports its changes
        self._assign(name, value)
        if name in self.__dict__.get("_modules", ()) or name in self.__dict__.get(
                "_parameters", ()) or name in self.__dict__.get("_buffers", ()):
            _shadow(self, name)
        _bump()         # a plain attribute may now hide a table entry, or a table is new

    def _assign(self, name, value):
        params, buffers, modules = self._tables()
        if isinstance(value, Parameter):
            self._drop(name, keep=params)
            params[name] = value
        elif isinstance(value, Module):
            self._drop(name, keep=modules)
            modules[name] = value
        elif isinstance(value, Tensor) and name not in params:
            self._drop(name, keep=buffers)          # a buffer keeps its place and persistence
            buffers[name] = value
        elif name in params:
            if value is None:
                params[name] = None
            elif isinstance(value, Tensor):
                raise TypeError(
                    f"cannot assign a plain Tensor to parameter {name!r} of "
                    f"{type(self).__name__}: wrap it as mgtrace.module.Parameter(value), "
                    f"or `del module.{name}` first to make it an ordinary attribute")
            else:
                self._drop(name)
                object.__setattr__(self, name, value)
        elif name in buffers and (value is None or isinstance(value, Tensor)):
            buffers[name] = value
        elif name in modules and value is None:
            modules[name] = None
        else:
            if isinstance(value, _STRUCTURES) and value and not name.startswith("_"):
                _structure_leaves(name, value)      # bad keys fail here, not later
            if name in buffers or name in modules:
                self._drop(name)
            object.__setattr__(self, name, value)

    def __getattr__(self, name):
        # only reached when normal lookup fails
        d = self.__dict__
        for table in ("_parameters", "_buffers", "_modules"):
            t = d.get(table)
            if t is not None and name in t:
                return t[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __delattr__(self, name):
        d = self.__dict__
        for table in ("_parameters", "_buffers", "_modules"):
            t = d.get(table)
            if t is not None and name in t:
                del t[name]
                self._non_persistent_buffers.discard(name)
                d.pop(name, None)               # its copy shadowing a method (_shadow)
                return
        object.__delattr__(self, name)
        _bump()

    def __deepcopy__(self, memo):
        """copy.deepcopy: a module with copies of every tensor (the core's
        Tensor does not pickle, so buffers and tensor attributes are copied
        here; a tensor shared by several modules stays shared in the copy,
        and tensors that view one storage, e.g. a buffer that is a slice of
        a parameter, view one copy of it, as in PyTorch)."""
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        _copy_shared_storage(self, memo)
        d = self.__dict__
        tensors = list(d.get("_buffers", {}).values()) + list(d.values())
        tensors += [t for _, t in self._structure_members()]
        for t in tensors:
            if isinstance(t, Tensor) and not isinstance(t, Parameter) and id(t) not in memo:
                memo[id(t)] = t.copy()
        for k, v in d.items():
            new.__dict__[k] = copy.deepcopy(v, memo)
        hooks = _HOOKS.get(self)
        if hooks is not None:      # the same hook functions; the handles stay with self
            _HOOKS[new] = hooks.copy()
        return new

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(self._parameters) | set(self._buffers)
                      | set(self._modules))

    # ----------------------------------------------------------- iteration
    def _structure_members(self):
        """``(dotted path, Module or Tensor)`` for what the plain list, tuple
        and dict attributes hold (MegEngine's rule), in attribute order."""
        out = []
        skip = self._NOT_STATE
        for name, value in self.__dict__.items():
            if type(value) in _STRUCTURES or isinstance(value, _STRUCTURES):
                if value and not name.startswith("_") and name not in skip:
                    out += _structure_leaves(name, value)
        return out

    def _child_items(self):
        """(name, module or None) of the registered children, then the
        modules held in list/tuple/dict attributes (``"layers.0"``)."""
        items = list(self._modules.items())
        items += [(k, v) for k, v in self._structure_members() if isinstance(v, Module)]
        return items

    def _set_member(self, path, value):
        """Replace what dotted ``path`` names (a table entry, or an element of
        a list/tuple/dict attribute: tuples are rebuilt) by ``value``."""
        head, _, last = path.partition(".")
        if not last:
            for table in self._tables():
                if head in table:
                    table[head] = value
                    _shadow(self, head)
                    return
            self.__dict__[head] = value
            return
        self.__dict__[head] = _replaced(self.__dict__[head], last.split("."), value)

    def named_children(self):
        """(name, module) for each direct child, in registration order, then
        the modules in list/tuple/dict attributes (``"layers.0"``); a child
        reached under two names is given once."""
        seen = set()
        for name, m in self._child_items():
            if m is not None and id(m) not in seen:
                seen.add(id(m))
                yield name, m

    def children(self):
        for _, m in type(self).named_children(self):
            yield m

    def named_modules(self, memo=None, prefix="", remove_duplicate=True):
        """(qualified name, module) for self and every descendant, depth first.

        Args:
            prefix: prepended to every name (self is ``prefix``, ``""`` by default).
            remove_duplicate: give a module reached by several paths (a
                shared submodule) only once, under the first path.
        """
        if memo is None:
            memo = set()
        if remove_duplicate:
            if id(self) in memo:
                return
            memo.add(id(self))
        yield prefix, self
        for name, m in self._child_items():
            if m is None:
                continue
            yield from type(m).named_modules(m, memo, prefix + ("." if prefix else "") + name,
                                             remove_duplicate)

    def modules(self):
        for _, m in type(self).named_modules(self):
            yield m

    def _named_members(self, table, prefix, recurse, remove_duplicate):
        mods = type(self).named_modules(self, prefix=prefix, remove_duplicate=remove_duplicate) \
            if recurse else [(prefix, self)]
        seen = set()
        for mod_prefix, m in mods:
            for name, t in m._own_members(table):
                if t is None:
                    continue
                if remove_duplicate:
                    if id(t) in seen:
                        continue
                    seen.add(id(t))
                yield mod_prefix + ("." if mod_prefix else "") + name, t

    def _own_members(self, table):
        """(name, tensor) of this module's own ``table`` ("_parameters" or
        "_buffers"), then the Parameters (resp. other Tensors) held in its
        list/tuple/dict attributes."""
        items = list(getattr(self, table).items())
        want_param = table == "_parameters"
        items += [(k, v) for k, v in self._structure_members()
                  if isinstance(v, Tensor) and isinstance(v, Parameter) == want_param]
        return items

    def named_parameters(self, prefix="", recurse=True, remove_duplicate=True):
        """(qualified name, Parameter) pairs; a shared parameter is given once."""
        return self._named_members("_parameters", prefix, recurse, remove_duplicate)

    def parameters(self, recurse=True):
        for _, p in type(self).named_parameters(self, recurse=recurse):
            yield p

    def named_buffers(self, prefix="", recurse=True, remove_duplicate=True):
        """(qualified name, Tensor) for every buffer, persistent or not."""
        return self._named_members("_buffers", prefix, recurse, remove_duplicate)

    def buffers(self, recurse=True):
        for _, b in type(self).named_buffers(self, recurse=recurse):
            yield b

    # ----------------------------------------------------------- state dict
    def state_dict(self, destination=None, prefix="", keep_vars=False, *, layout="mgtrace"):
        """An ordered dict from qualified name to tensor.

        Order (PyTorch's): own parameters, own persistent buffers, then each
        child's entries in registration order, recursively. Keys look like
        ``"layer1.0.conv1.weight"``. A shared submodule appears under each of
        its names. None-valued entries are left out.

        Values share memory with the module's tensors (plain Tensor views;
        the Parameter objects themselves with ``keep_vars=True``): copy them
        (``{k: v.numpy() ...}``) to keep a snapshot.

        ``layout="megengine"`` gives MegEngine's shapes instead, so that
        ``megengine.Module.load_state_dict`` takes the dict (as NumPy
        arrays): conv and conv-transpose biases (1, C, 1, 1), grouped conv
        weights (groups, C_out/groups, C_in/groups, kh, kw), and no
        ``num_batches_tracked`` (see :meth:`load_state_dict`); values are
        then views of the module's tensors in that shape (Parameters too,
        with ``keep_vars``: ``Tensor.reshape`` views). RNN and LSTM give
        MegEngine's ``_flatten_weights`` and ``cells.*`` entries (new
        tensors, not views). Raises ValueError for
        another layout.
        """
        if layout != "mgtrace":
            table = self._layout_table(layout)
            flat = type(self).state_dict(self, destination, prefix, keep_vars)
            for key, shapes in table.items():
                key = prefix + key
                if key in flat:
                    if shapes is None:
                        del flat[key]
                    else:
                        flat[key] = flat[key].reshape(shapes[0])
            for path, hook in self._layout_hooks(layout, "_to_megengine_state"):
                flat = hook(flat, prefix + path)
            return flat
        if destination is None:
            destination = OrderedDict()
        for name, p in self._parameters.items():
            if p is not None:
                destination[prefix + name] = p if keep_vars else _view(p)
        for name, b in self._buffers.items():
            if b is not None and name not in self._non_persistent_buffers:
                destination[prefix + name] = b if keep_vars else _view(b)
        for name, m in self._modules.items():
            if m is not None:
                type(m).state_dict(m, destination, prefix + name + ".", keep_vars)
        for name, value in self.__dict__.items():
            if isinstance(value, _STRUCTURES) and value and not name.startswith("_") \
                    and name not in self._NOT_STATE:
                _structure_state(value, destination, f"{prefix}{name}.", keep_vars)
        return destination

    def _layout_hooks(self, layout, name):
        """``(key prefix, bound hook)`` of each builtin module that converts
        whole groups of keys to or from MegEngine's names (hook ``name``:
        ``_from_megengine_state(state, prefix) -> state`` /
        ``_to_megengine_state(state, prefix) -> state``)."""
        if layout != "megengine":
            return []
        out = []
        for path, m in type(self).named_modules(self, remove_duplicate=False):
            hook = getattr(type(m), name, None)
            if hook is not None:
                out.append((f"{path}." if path else "", hook.__get__(m)))
        return out

    def _layout_table(self, layout):
        """{state_dict key: MegEngine's accepted shapes (the first is the one
        written), or None where MegEngine has no such tensor}, from each
        builtin module's ``_megengine_layout`` hook."""
        if layout not in ("mgtrace", "megengine"):
            raise ValueError(f"layout must be 'mgtrace' or 'megengine', got {layout!r}")
        table = {}
        if layout == "megengine":
            for path, m in type(self).named_modules(self, remove_duplicate=False):
                hook = getattr(type(m), "_megengine_layout", None)
                for name, shapes in (hook(m) if hook is not None else {}).items():
                    table[f"{path}.{name}" if path else name] = shapes
        return table

    def load_state_dict(self, state_dict, strict=True, *, layout="mgtrace"):
        """Copy values from ``state_dict`` into this module's tensors, in place.

        Args:
            state_dict: mapping from qualified name (as :meth:`state_dict`
                gives) to a Tensor, NumPy array or anything ``np.asarray``
                takes (a CPU ``torch.Tensor`` works).
            strict: when True, a key the module has and ``state_dict`` lacks
                (missing) or the reverse (unexpected) is an error.
            layout: "mgtrace" (the default), or "megengine" for a state dict
                MegEngine wrote (``megengine.Module.state_dict``, read with
                :func:`mgtrace.megengine.load`): then each tensor may have
                MegEngine's shape or mgtrace's (conv biases (1, C, 1, 1);
                grouped conv weights (groups, C_out/groups, C_in/groups,
                kh, kw), transposed (groups, C_in/groups, C_out/groups, kh,
                kw); BatchNorm's tensors (C,) or (1, C, 1, 1)) and is
                reshaped on load, and a missing ``num_batches_tracked``
                is not an error (the module keeps its own). The shapes
                come from each builtin module's ``_megengine_layout``.
                RNN and LSTM take MegEngine's one ``_flatten_weights``
                (split into ``weight_ih_l0``, ...; MegEngine's unused
                ``cells.*`` entries are dropped).

        Returns:
            ``IncompatibleKeys(missing_keys, unexpected_keys)``: empty lists
            when strict.

        Raises:
            StateDictError (a ValueError): a shape or dtype mismatch (always;
            no casting), or missing/unexpected keys when strict. Every
            problem is listed, and nothing is copied unless all checks pass.
        """
        own = type(self).state_dict(self, keep_vars=True)
        table = self._layout_table(layout)
        for path, hook in self._layout_hooks(layout, "_from_megengine_state"):
            state_dict = hook(state_dict, path)     # keys MegEngine names otherwise (RNN, LSTM)
        if table:
            state_dict = _from_layout(state_dict, own, table)
        optional = {k for k, shapes in table.items() if shapes is None}
        missing = [k for k in own if k not in state_dict and k not in optional]
        unexpected = [k for k in state_dict if k not in own]
        mismatched, plan = [], []
        for key, target in own.items():
            if key not in state_dict:
                continue
            value = state_dict[key]
            if not isinstance(value, Tensor):
                kind = type(value).__name__
                try:
                    value = np.asarray(value)
                except Exception as e:  # e.g. a CUDA or bfloat16 torch tensor
                    mismatched.append((key, "type", "a Tensor or array", f"{kind} ({e})"))
                    continue
                if value.dtype == object:
                    mismatched.append((key, "type", "a Tensor or array", kind))
                    continue
            if tuple(value.shape) != target.shape:
                mismatched.append((key, "shape", target.shape, tuple(value.shape)))
            elif np.dtype(value.dtype) != target.dtype:
                mismatched.append((key, "dtype", target.dtype.name, np.dtype(value.dtype).name))
            else:
                plan.append((target, value))
        problems = [f"{key}: {what} mismatch, expected "
                    f"{_expected_shapes(exp, table.get(key)) if what == 'shape' else exp}, got {act}"
                    for key, what, exp, act in mismatched]
        if strict:
            if missing:
                problems.append("missing keys: " + ", ".join(missing))
            if unexpected:
                problems.append("unexpected keys: " + ", ".join(unexpected))
        if problems:
            hint = ("\n(pass strict=False to load the matching keys and skip "
                    "missing/unexpected ones)" if strict and (missing or unexpected) else "")
            raise StateDictError(
                f"error loading state dict into {type(self).__name__}:\n  "
                + "\n  ".join(problems) + hint, missing, unexpected, mismatched)
        for target, value in plan:
            target[...] = value
        return IncompatibleKeys(missing if not strict else [], unexpected if not strict else [])

    # ----------------------------------------------------------- modes, misc
    def train(self, mode=True):
        """Set ``training`` on self and every descendant; returns self."""
        if not isinstance(mode, bool):
            raise TypeError(f"train(mode) takes a bool, got {type(mode).__name__}")
        for m in type(self).modules(self):
            m.__dict__["training"] = mode
        return self

    def eval(self):
        """``train(False)``: dropout off, batch norm uses running statistics."""
        return type(self).train(self, False)

    def disable_quantize(self, value=True):
        """Set ``quantize_disabled = value`` on self and every descendant
        (MegEngine's ``Module.disable_quantize``); returns self.
        :func:`mgtrace.quantization.quantize_qat` leaves such modules float,
        and the quantization flow functions skip them."""
        def mark(m):
            m.quantize_disabled = bool(value)
        return type(self).apply(self, mark)

    def apply(self, fn):
        """Call ``fn(m)`` on every descendant, then on self (children first, as
        PyTorch does); returns self. Typical use: custom initialisation."""
        for m in type(self).children(self):
            type(m).apply(m, fn)
        fn(self)
        return self

    def to(self, *args, **kwargs):
        """Move and/or cast every parameter and buffer, in place on the
        module (PyTorch's ``Module.to``). Returns self.

        Forms: ``to(device)``, ``to(dtype)``, ``to(device, dtype)``,
        ``to(tensor)`` (its device and dtype), and the keywords ``device=``,
        ``dtype=``. ``device`` is a Device or its name ("cpu", "cuda:0", ...);
        ``dtype`` a floating dtype (float16, bfloat16, float32, float64, by
        name, NumPy type or dtype).

        Only floating-point parameters and buffers change dtype (integer
        ones, like BatchNorm's ``num_batches_tracked``, keep theirs); all
        move to the device. A tensor already as asked is kept (the same
        Parameter object); otherwise it is replaced by a converted copy,
        once per tensor, so parameters shared by several modules stay shared.

        Raises:
            TypeError: a dtype that is not floating, an argument that is
                neither a device nor a dtype, more than two positional
                arguments, an unknown keyword, an argument given twice.
            ValueError: an unknown device name.
            DeviceUnavailable: a device this process cannot use (``cuda:0``
                without the CUDA build or a GPU); nothing has moved then.

        >>> import mgtrace.module as M
        >>> bn = M.BatchNorm2d(4).to("float16")
        >>> bn.weight.dtype.name, bn.num_batches_tracked.dtype.name
        ('float16', 'int64')
        """
        device, dtype = self._to_args(args, kwargs)
        if device is not None:      # refused before anything moves (DeviceUnavailable)
            from mgtrace._core.tensor import require_device
            device = require_device(device)
        converted = {}              # id(old tensor) -> new, so shared tensors stay shared

        def convert(t, is_param):
            new = converted.get(id(t))
            if new is not None:
                return new
            new = t
            if dtype is not None and new.dtype.name in _FLOATS and new.dtype != dtype:
                new = new.astype(dtype)
            if device is not None:
                new = new.to(device)
            if new is not t and is_param:
                new = Parameter(new, device=new.device)
            converted[id(t)] = new
            return new

        for m in type(self).modules(self):
            for table in ("_parameters", "_buffers"):
                for name, t in m._own_members(table):
                    if t is not None:
                        new = convert(t, table == "_parameters")
                        if new is not t:
                            m._set_member(name, new)
        return self

    def _to_args(self, args, kwargs):
        """``(device or None, dtype or None)`` from :meth:`to`'s arguments."""
        unknown = set(kwargs) - {"device", "dtype"}
        if unknown:
            raise TypeError(f"Module.to() got an unexpected keyword argument {sorted(unknown)[0]!r} "
                            "(it takes device and dtype)")
        if len(args) > 2:
            raise TypeError(f"Module.to() takes at most 2 positional arguments (device, dtype), "
                            f"got {len(args)}")
        device, dtype = kwargs.get("device"), kwargs.get("dtype")
        if len(args) == 2:
            if device is not None or dtype is not None:
                raise TypeError("Module.to(): device and dtype given both by position and by keyword")
            device, dtype = args
        elif len(args) == 1:
            arg = args[0]
            if isinstance(arg, Tensor):
                device, dtype = arg.device, arg.dtype
            else:
                try:
                    as_dtype(arg)
                except TypeError:
                    slot = "device"
                else:
                    slot = "dtype"
                if (device if slot == "device" else dtype) is not None:
                    raise TypeError(f"Module.to(): {slot} given both by position and by keyword")
                if slot == "device":
                    device = arg
                else:
                    dtype = arg
        if dtype is not None:
            try:
                dtype = as_dtype(dtype)
            except TypeError:
                raise TypeError(f"Module.to(): dtype must be a floating dtype (float16, bfloat16, "
                                f"float32, float64), got {dtype!r}") from None
            if dtype.name not in _FLOATS:
                raise TypeError(f"Module.to(): dtype must be a floating dtype (float16, bfloat16, "
                                f"float32, float64), got {dtype.name}; PyTorch's Module.to "
                                "refuses integer dtypes too (cast single tensors with astype)")
        if device is not None:
            try:
                device = as_device(device)
            except TypeError:
                raise TypeError(f"Module.to(): expected a device (like 'cpu' or 'cuda:0') or a "
                                f"floating dtype, got {device!r}") from None
        return device, dtype

    # --------------------------------------------------------------- repr
    def extra_repr(self):
        """One line (or several) describing this module's own configuration,
        shown in ``repr`` after the class name. Override in subclasses."""
        return ""

    def _get_name(self):
        return type(self).__name__

    def __repr__(self):
        extra = self.extra_repr()
        lines = extra.split("\n") if extra else []
        children = self._child_items()
        for name, m in children:
            lines.append(f"({name}): " + _addindent(repr(m), 2))
        if not children:
            return f"{self._get_name()}({extra})"
        body = "\n  ".join(lines)
        return f"{self._get_name()}(\n  {body}\n)"


def _expected_shapes(own_shape, layout_shapes):
    """The shapes a state dict entry may have, as a mismatch message says
    them: the module's own, and the layout's where it has others (MegEngine's
    (1, C, 1, 1) conv bias beside mgtrace's (C,))."""
    others = [s for s in layout_shapes or () if tuple(s) != own_shape]
    if not others:
        return own_shape
    return " or ".join(str(tuple(s)) for s in others) + f" (this layout), or {own_shape}"


def _from_layout(state_dict, own, table):
    """``state_dict`` with each value whose shape is one of ``table``'s
    shapes for its key reshaped to the module's own shape."""
    out = dict(state_dict)
    for key, shapes in table.items():
        value = out.get(key)
        if shapes is None or value is None or key not in own:
            continue
        shape = getattr(value, "shape", None)
        if shape is not None and tuple(shape) in shapes and tuple(shape) != own[key].shape:
            out[key] = value.reshape(own[key].shape)
    return out


def _structure_state(value, destination, prefix, keep_vars, depth=0):
    """state_dict entries of a list/tuple/dict attribute, in the order its
    TracedModule (a container module) gives them: its Parameters, its other
    Tensors, then its modules and inner containers, by position."""
    if depth > _MAX_NESTING:
        return
    items = [(str(k), v) for k, v in (value.items() if isinstance(value, dict)
                                      else enumerate(value))]
    for k, v in items:
        if isinstance(v, Parameter):
            destination[prefix + k] = v if keep_vars else _view(v)
    for k, v in items:
        if isinstance(v, Tensor) and not isinstance(v, Parameter):
            destination[prefix + k] = v if keep_vars else _view(v)
    for k, v in items:
        if isinstance(v, Module):
            v.state_dict(destination, f"{prefix}{k}.", keep_vars)
        elif isinstance(v, _STRUCTURES) and v:
            _structure_state(v, destination, f"{prefix}{k}.", keep_vars, depth + 1)


def _replaced(container, keys, value):
    """``container`` with the element at path ``keys`` replaced by
    ``value`` (lists and dicts in place, tuples rebuilt)."""
    k = keys[0]
    if isinstance(container, dict):
        key = next(x for x in container if str(x) == k)
    else:
        key = int(k)
    new = value if len(keys) == 1 else _replaced(container[key], keys[1:], value)
    if isinstance(container, tuple):
        items = list(container)
        items[key] = new
        return type(container)(*items) if hasattr(container, "_fields") else type(container)(items)
    container[key] = new
    return container
