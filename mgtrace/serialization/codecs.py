"""Module codecs: how each kind of module is stored in the module table.

A module entry is ``{"kind": ..., "training": ..., <fields of the kind>}``.
Each kind has a codec, registered with :func:`register_module_codec`:

* ``"builtin"``: a leaf module of a registered builtin type, stored by
  stable type name, type version, config and tensors (builtin_modules.py);
* ``"container"``: Sequential / ModuleList / ModuleDict of stored modules;
* ``"traced"``: a TracedModule with its graphs (registered by the tracing
  layer; see the package docstring for the interface).

Saving picks the first codec, in registration order, whose ``python_type``
matches the module; loading picks the codec by ``kind``. A module no codec
takes raises TypeError saying to trace it first.
"""
from collections import namedtuple

from mgtrace.errors import ArchiveError
from mgtrace.serialization.header import Field
from mgtrace.serialization.version import FORMAT_VERSION

__all__ = ["ModuleCodec", "register_module_codec", "codec_for_module", "codec_for_kind", "codecs"]

ModuleCodec = namedtuple("ModuleCodec", "kind matches encode decode check fields since")
_CODECS = {}   # kind -> ModuleCodec, in registration order


def register_module_codec(kind, python_type, encode, decode, *, check=None, fields=(),
                          since=(1, 0)):
    """Store modules of ``python_type`` as entries of ``kind``.

    Args:
        kind: the entry's ``"kind"`` string, e.g. ``"traced"``.
        python_type: a class (instances of it and of its subclasses match) or a
            predicate ``f(module) -> bool``.
        encode: ``f(module, ctx) -> dict``, the entry's fields (without
            ``kind`` and ``training``, which the context adds), with
            string keys and msgpack-able values: tagged values from
            ``ctx.value``, indices from ``ctx.tensor`` / ``ctx.op`` / ``ctx.module``.
        decode: ``f(entry, ctx) -> Module``, the inverse; ``entry`` has passed
            ``fields`` and ``check``. Anything it raises becomes an ArchiveError.
        check: optional ``f(entry, ctx, where)``, run on every entry of this
            kind before anything is built (resolve names there, so an unknown
            one fails the load before code runs). Raise ArchiveError.
        fields: a tuple of :class:`~mgtrace.serialization.header.Field`, the
            entry's fields; checked on load and listed in schema.json.
        since: the format version that introduced this kind; archives using
            it get at least this ``min_reader_version``.

    Raises:
        ValueError: ``kind`` is already registered; ``since`` is above
            FORMAT_VERSION.
        TypeError: arguments of the wrong type.
    """
    if not isinstance(kind, str) or not kind:
        raise TypeError(f"a module kind is a non-empty str, got {kind!r}")
    if kind in _CODECS:
        raise ValueError(f"module kind {kind!r} already has a codec")
    if isinstance(python_type, type):
        cls = python_type
        matches = lambda m: isinstance(m, cls)   # noqa: E731
    elif callable(python_type):
        matches = python_type
    else:
        raise TypeError(f"python_type is a class or a predicate, got {python_type!r}")
    if not (callable(encode) and callable(decode) and (check is None or callable(check))):
        raise TypeError("encode, decode and check must be callable")
    if not all(isinstance(f, Field) for f in fields):
        raise TypeError("fields is a tuple of mgtrace.serialization.header.Field")
    if tuple(since) > FORMAT_VERSION:
        raise ValueError(f"since={tuple(since)} is newer than this writer's format "
                         f"{FORMAT_VERSION}; raise FORMAT_VERSION first")
    _CODECS[kind] = ModuleCodec(kind, matches, encode, decode, check, tuple(fields), tuple(since))


def codec_for_module(module, where="module"):
    """The codec that stores ``module``.

    Raises:
        TypeError: no codec takes it; the message says to trace it.
    """
    for codec in _CODECS.values():
        if codec.matches(module):
            return codec
    cls = type(module)
    raise TypeError(
        f"cannot save {where} ({cls.__module__}.{cls.__qualname__}): an archive stores builtin "
        "modules (mgtrace.module.is_builtin), Sequential/ModuleList/ModuleDict of storable "
        "modules, and traced modules, never pickled code. Trace it first and save the result: "
        "mgtrace.save(mgtrace.trace_module(module, *example_inputs), f); or, for a leaf class "
        "of your own, register it with mgtrace.serialization.register_module(cls)")


def codec_for_kind(kind, where):
    """The codec of an archive's module entry ``kind``.

    Raises:
        ArchiveError: no codec is registered for ``kind``.
    """
    codec = _CODECS.get(kind)
    if codec is None:
        hint = " (pickled data is never loaded)" if "pickle" in kind.lower() else ""
        known = ", ".join(map(repr, _CODECS))
        raise ArchiveError(f"{where}.kind: unknown module kind {kind[:80]!r}{hint}; this "
                           f"reader knows {known}")
    return codec


def codecs():
    """``{kind: ModuleCodec}``, in matching order (schema.json lists them)."""
    return dict(_CODECS)
