"""mgtrace.serialization: the ``.tmod`` archive (DESIGN.md, "Archive format").

>>> import io, mgtrace as mt, mgtrace.module as M
>>> net = M.Sequential(M.Linear(4, 3), M.ReLU())
>>> buf = io.BytesIO()
>>> mt.save(net, buf)
>>> _ = buf.seek(0)
>>> net2 = mt.load(buf)
>>> type(net2[0]).__name__, net2[0].config()
('Linear', {'in_features': 4, 'out_features': 3, 'bias': True})

Modules, one concept each, in the order a load uses them::

    layout.py          the bytes: magic, header length, padding, 64-byte aligned data
    version.py         FORMAT_VERSION and the rules for reading across versions
    header.py          the header's fields, declared once, and their check
    values.py          TAGS: tagged values (tuple, dict with any keys, NumPy scalars...)
    tensors.py         the tensor table: entries, checksums, zero-copy tensors
    aliases.py         tensors that share memory: views of one stored base (format 1.2)
    registry.py        stable names of functions and module types (never imports)
    upgraders.py       rewriting what old versions of a function / module type stored
    codecs.py          module codecs by kind; builtin_modules.py: "builtin", "container";
                       traced_codec.py: "traced" (TracedModules and their graphs)
    context.py         EncodeContext / DecodeContext, what codecs work through
    writer.py          save();  atomic.py: temp file, fsync, rename
    reader.py          load(), load_archive(), read_header();  source.py: path/file/bytes/mmap
    limits.py          every bound the reader enforces

Plugging in a module codec (how traced modules are stored)
----------------------------------------------------------
A kind of module is stored by a codec registered with
:func:`register_module_codec`::

    register_module_codec("traced", TracedModule, encode, decode,
                          check=check, fields=TRACED_FIELDS, since=(1, 0))

``encode(module, ctx) -> dict`` returns the entry's fields (``kind`` and
``training`` are added for it); ``ctx`` is an :class:`EncodeContext`:

* ``ctx.tensor(t) -> int``: index in the tensor table (equal views dedupe;
  views of one storage are kept views of it, aliases.py);
* ``ctx.value(v, node_id=None) -> tagged``: a tagged value; ``node_id(obj)
  -> int | None`` turns graph nodes into ``{"node": id}``;
* ``ctx.op(fn_or_stable_name) -> int``: index in the op table, an entry
  ``{name, version}``; raises TypeError naming ``register_function`` for an
  unregistered function. Store call arguments **by parameter name**
  (``{"x": ..., "weight": ...}``) so that upgraders can rebind them;
* ``ctx.module(m, name=None) -> int``: index of a submodule's entry (any
  kind; a module met twice is stored once);
* ``ctx.require((major, minor))``: the archive uses a newer format feature.

``decode(entry, ctx) -> Module`` inverts it; ``ctx`` is a
:class:`DecodeContext`:

* ``ctx.tensor(i)`` (on the load's device) / ``ctx.host_tensor(i)`` (CPU);
  ``ctx.parameter(i)``: a Parameter sharing tensor ``i``'s memory (give
  modules these, not ``Parameter(ctx.tensor(i))``, which copies; with
  ``mmap`` they are read-only views of the file);
* ``ctx.value(tagged, node=None, where=...)``: ``node(id) -> object``
  resolves ``{"node": id}``;
* ``ctx.op(i) -> Op(name, version, fn, upgrade)``: ``fn`` is the current
  function, ``upgrade(args_by_name) -> args_by_name`` rewrites arguments
  stored at ``version``; all ops were resolved before any decode ran;
* ``ctx.module(i)``: a submodule, built once (cycles and depth checked);
* ``ctx.check_index(i, n, table)``, ``ctx.reserve_elements(n, what)``
  (charge an allocation a constructor will make), ``ctx.format_version``,
  ``ctx.device``, ``ctx.header``.

``check(entry, ctx, where)`` runs for every entry of the kind before
anything is built: resolve its names there (``registry.resolve_function``,
``registry.resolve_module_type``) so an unknown name fails first. ``fields``
(a tuple of :class:`~mgtrace.serialization.header.Field`) are validated
before ``check`` and appear in ``schema/schema.json``. Anything ``decode``
raises becomes an ArchiveError. traced_codec.py is the codec of the
"traced" kind; its docstring describes the entry and what loading checks.
"""
from mgtrace.errors import ArchiveError, RegistryError, VersionError
from mgtrace.serialization.codecs import register_module_codec
from mgtrace.serialization.context import DecodeContext, EncodeContext, Op
from mgtrace.serialization.header import Field
from mgtrace.serialization.reader import Archive, load, load_archive, read_header
from mgtrace.serialization.registry import (register_function, register_module,
                                            resolve_function, resolve_module_type,
                                            upgrade_call, upgrade_config)
from mgtrace.serialization.version import FORMAT_VERSION
from mgtrace.serialization.writer import save
from mgtrace.serialization import builtin_modules  # noqa: F401  (registers "builtin", "container")
from mgtrace.serialization import traced_codec  # noqa: F401,E402  (registers "traced")

__all__ = ["save", "load", "load_archive", "read_header", "Archive", "FORMAT_VERSION",
           "ArchiveError", "RegistryError", "VersionError",
           "register_function", "register_module", "register_module_codec",
           "resolve_function", "resolve_module_type", "upgrade_call", "upgrade_config",
           "EncodeContext", "DecodeContext", "Op", "Field"]
