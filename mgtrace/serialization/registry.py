"""Stable names: the only way an archive refers to code.

An archive names functions (its op table) and module types by stable dotted
names with versions. Loading looks each name up here, in dicts filled by
mgtrace itself and by explicit registrations; it never imports a module or
calls anything because an archive names it. An unknown name raises
:class:`~mgtrace.RegistryError` before anything runs, naming the target and
how to register it.

mgtrace registers:

* every public function of :mod:`mgtrace.functional` as
  ``"mgtrace.functional.<name>"`` (resolved by name at use, so a function
  wrapped later, e.g. by the tracer, is the one called);
* Python's :mod:`operator` functions that tensors overload
  (:data:`OPERATOR_FUNCTIONS`, from the core's op table) as ``"operator.<name>"``;
* :func:`mgtrace.tensor` as ``"mgtrace.tensor"`` (tensors made inside a
  traced forward, format 1.1);
* every builtin module type of :mod:`mgtrace.module` (``"mgtrace.module.Conv2d"``)
  and the containers Sequential, ModuleList, ModuleDict.

All at version 1. Users add their own with :func:`register_function` and
:func:`register_module`; version changes come with upgraders (upgraders.py).
"""
import operator
from collections import namedtuple
from functools import partial

import mgtrace._core as _core
from mgtrace._core import op_table
import mgtrace.functional as F
import mgtrace.module as M
import mgtrace.module.qat  # noqa: F401  (registers the QAT, observer and fake-quant builtins)
import mgtrace.quantization  # noqa: F401
import mgtrace.module.quantized  # noqa: F401  (the int8 builtins)
from mgtrace.errors import RegistryError, did_you_mean
from mgtrace.serialization import upgraders as U

__all__ = ["register_function", "register_module", "function_name", "resolve_function",
           "module_type", "resolve_module_type", "upgrade_call", "upgrade_config",
           "own_functions", "own_module_types", "OPERATOR_FUNCTIONS", "CONTAINERS"]

# Python operators on tensors, registered as "operator.<name>"
OPERATOR_FUNCTIONS = op_table.operator_functions()
CONTAINERS = {f"mgtrace.module.{c.__name__}": c for c in (M.Sequential, M.ModuleList, M.ModuleDict)}

FunctionEntry = namedtuple("FunctionEntry", "name version get upgraders own")
_FUNCTIONS = {}        # stable name -> FunctionEntry
_MODULE_UPGRADERS = {}  # stable module type name -> {old version: upgrader} (user types)
_BY_FN = {}            # function -> stable name (refreshed on a miss, see function_name)


def _own(name, get):
    _FUNCTIONS[name] = FunctionEntry(name, 1, get, U.FUNCTION_UPGRADERS.get(name, {}), True)


for _n in F.__all__:
    _own(f"mgtrace.functional.{_n}", partial(getattr, F, _n))
for _n in OPERATOR_FUNCTIONS:
    _own(f"operator.{_n}", partial(getattr, operator, _n))
_own("mgtrace.tensor", lambda: _core.tensor)       # a tensor made inside a traced forward


def _shown(name):
    s = repr(name)
    return s if len(s) <= 120 else s[:117] + "..."


def _check_name(name, kind):
    if not isinstance(name, str):
        raise TypeError(f"a stable {kind} name must be a str, got {type(name).__name__}")
    if not name or not all(p.isidentifier() for p in name.split(".")):
        raise ValueError(f"a stable {kind} name is dotted Python identifiers "
                         f"(like 'acme.ops.swish'), got {name!r}")


def _check_upgraders(upgraders, version, kind):
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise TypeError(f"a {kind} version must be a positive int, got {version!r}")
    upgraders = dict(upgraders or {})
    for v, fn in upgraders.items():
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v < version:
            raise ValueError(f"upgraders are keyed by the old version they upgrade from, an int "
                             f"in 1..{version - 1}; got {v!r}")
        if not callable(fn):
            raise TypeError(f"the upgrader from version {v} is not callable: {fn!r}")
    return upgraders


def _default_name(obj, kind, how):
    name = f"{obj.__module__}.{obj.__qualname__}"
    if "<locals>" in name or "<lambda>" in name:
        raise ValueError(f"{obj.__qualname__} has no stable name (it is defined inside a "
                         f"function or is a lambda); give one: {how}(..., name=\"yourpackage."
                         f"{getattr(obj, '__name__', kind)}\")")
    return name


def register_function(fn=None, *, name=None, version=1, upgraders=None):
    """Let archives call ``fn`` under a stable name.

    Usable as ``register_function(fn)``, ``@register_function`` or
    ``@register_function(name="acme.swish", version=2, upgraders={1: up})``.

    Args:
        fn: a callable.
        name: stable dotted name stored in archives; default
            ``f"{fn.__module__}.{fn.__qualname__}"``. Give one to keep archives
            loadable after moving the function.
        version: positive int, bumped when the signature or meaning changes.
        upgraders: ``{old_version: f(args_by_name) -> args_by_name}`` for the
            versions before ``version`` (see upgraders.py).

    Returns:
        fn.

    Raises:
        TypeError: fn not callable, bad version or upgrader types.
        ValueError: the name is taken by another function (re-registering a
            function of the same module and qualname replaces it), fn is
            registered under another name, or the name is not dotted
            identifiers.
    """
    if fn is None:
        return lambda f: register_function(f, name=name, version=version, upgraders=upgraders)
    if not callable(fn):
        raise TypeError(f"register_function takes a callable, got {fn!r}")
    name = _default_name(fn, "function", "register_function") if name is None else name
    _check_name(name, "function")
    upgraders = _check_upgraders(upgraders, version, "function")
    old = _FUNCTIONS.get(name)
    if old is not None and old.own:
        raise ValueError(f"{name!r} is one of mgtrace's own function names; choose another name")
    if old is not None:
        owner = old.get()
        if owner is not fn and _qual(owner) != _qual(fn):   # same qualname: a redefinition
            raise ValueError(f"function name {name!r} is already taken by {_qual(owner)}; "
                             "choose another name")
    other = function_name(fn, missing=None)
    if other is not None and other != name:
        raise ValueError(f"{_qual(fn)} is already registered as {other!r}")
    _FUNCTIONS[name] = FunctionEntry(name, version, lambda: fn, upgraders, False)
    _BY_FN.clear()
    return fn


def _qual(fn):
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def _unregister_function(name):
    """Drop a user registration (tests use this to stage version changes)."""
    if _FUNCTIONS[name].own:
        raise ValueError(f"{name!r} is one of mgtrace's own functions")
    del _FUNCTIONS[name]
    _BY_FN.clear()


def _unwrapped(fn):
    """fn, then what it wraps (functools.wraps' __wrapped__), hashable ones only."""
    seen = 0
    while fn is not None and seen < 100:
        try:
            hash(fn)
        except TypeError:
            return
        yield fn
        fn, seen = getattr(fn, "__wrapped__", None), seen + 1


def _reindex():
    _BY_FN.clear()
    for n, e in _FUNCTIONS.items():
        for f in reversed(list(_unwrapped(e.get()))):   # the outermost wrapper wins
            _BY_FN[f] = n


def function_name(fn, missing=...):
    """The stable name of a registered function (or of what it wraps).

    Raises:
        TypeError: ``fn`` is not registered (unless ``missing`` is given,
            which is then returned).
    """
    for _ in range(2):
        for f in _unwrapped(fn):
            name = _BY_FN.get(f)
            if name is not None:
                return name
        _reindex()              # the functions behind the names may have been rewrapped
    if missing is not ...:
        return missing
    raise TypeError(f"{_qual(fn)} is not a registered function, so an archive cannot refer to "
                    "it; register it with mgtrace.serialization.register_function(fn, "
                    "name=\"yourpackage.name\")")


def function_version(name):
    """The current version of registered function ``name``."""
    return _FUNCTIONS[name].version


def resolve_function(name, version):
    """``(fn, upgrade)`` for an archive's op ``name`` at ``version``.

    ``upgrade(args_by_name) -> args_by_name`` rewrites a call stored at
    ``version`` for the current one.

    Raises:
        RegistryError: no function is registered as ``name``.
        VersionError: ``version`` is newer than the registered one, or an
            upgrader in between is missing.
    """
    entry = _FUNCTIONS.get(name) if isinstance(name, str) else None
    if entry is None:
        hint = did_you_mean(name, _FUNCTIONS)
        raise RegistryError(
            f"this archive calls {_shown(name)}, which is not a registered function.{hint} "
            "Loading never imports or runs code an archive names; if it is your function, "
            "import the code that defines it and register it before loading: "
            f"mgtrace.serialization.register_function(fn, name={_shown(name)})")
    U.check_chain("function", name, version, entry.version, entry.upgraders, "register_function")
    return entry.get(), partial(U.run_chain, "function", name, version, entry.version,
                                entry.upgraders)


def upgrade_call(name, version, args_by_name):
    """Arguments of a call to ``name`` stored at ``version``, rewritten for the
    current version through the upgrader chain.

    Raises:
        RegistryError, VersionError: as :func:`resolve_function`.
        ArchiveError: an upgrader failed.
    """
    return resolve_function(name, version)[1](args_by_name)


# ------------------------------------------------------------------ module types

def register_module(cls=None, *, name=None, version=1, upgraders=None):
    """Let archives store instances of Module class ``cls`` by stable name,
    version and config, as builtin (leaf) modules.

    Delegates to :func:`mgtrace.module.register_as_builtin` (which says what
    ``config()`` must return) and records ``upgraders``:
    ``{old_version: f(config) -> config}``. Usable as a decorator.

    Returns:
        cls.

    Raises:
        TypeError, ValueError: as ``register_as_builtin``; bad upgraders.
    """
    if cls is None:
        return lambda c: register_module(c, name=name, version=version, upgraders=upgraders)
    upgraders = _check_upgraders(upgraders, version, "module type")
    if name is None and isinstance(cls, type):
        name = _default_name(cls, "module", "register_module")
    M.register_as_builtin(cls, name=name, version=version)
    _MODULE_UPGRADERS[cls.builtin_name] = upgraders
    return cls


def module_type(name):
    """The registered builtin or container class named ``name``.

    Raises:
        RegistryError: nothing is registered under ``name``.
    """
    cls = CONTAINERS.get(name) if isinstance(name, str) else None
    if cls is not None:
        return cls
    try:
        return M.builtin_type(name)
    except M.UnknownBuiltinError:
        pass
    hint = did_you_mean(name, list(M.builtin_types()) + list(CONTAINERS))
    raise RegistryError(
        f"this archive holds a module of type {_shown(name)}, which is not a registered module "
        f"type.{hint} Loading never imports or runs code an archive names; if it is your "
        "class, import the code that defines it and register it before loading: "
        f"mgtrace.serialization.register_module(cls, name={_shown(name)})")


def resolve_module_type(name, version):
    """``(cls, upgrade)`` for a stored module type ``name`` at ``version``;
    ``upgrade(config) -> config`` rewrites its stored config.

    Raises:
        RegistryError, VersionError: as :func:`resolve_function`.
    """
    cls = module_type(name)
    current = getattr(cls, "builtin_version", 1)
    chain = _MODULE_UPGRADERS.get(name) or U.MODULE_UPGRADERS.get(name, {})
    U.check_chain("module type", name, version, current, chain, "register_module")
    return cls, partial(U.run_chain, "module type", name, version, current, chain)


def upgrade_config(type_name, version, config):
    """Config of module type ``type_name`` stored at ``version``, rewritten for
    the current version. Raises as :func:`resolve_module_type`."""
    return resolve_module_type(type_name, version)[1](config)


# ------------------------------------------------------------------ listings

def own_functions():
    """``{name: version}`` of mgtrace's own functions, sorted (ops.json)."""
    return {n: e.version for n, e in sorted(_FUNCTIONS.items()) if e.own}


def own_module_types():
    """``{name: version}`` of mgtrace's own module types, sorted (ops.json)."""
    types = {n: c.builtin_version for n, c in M.builtin_types().items()
             if n.startswith("mgtrace.")}
    types.update((n, 1) for n in CONTAINERS)
    return dict(sorted(types.items()))
