"""The contexts module codecs work through while saving and loading.

:class:`EncodeContext` builds the header's tables (tensors, modules, ops) and
tracks the ``min_reader_version`` the archive needs; :class:`DecodeContext`
hands out what the tables describe, resolving names through the registry
only, and keeps the bounds of limits.py. The package docstring shows how a
module codec uses them.
"""
import math
from collections import namedtuple

import numpy as np

from mgtrace._core.dtype import qdtype_str
from mgtrace.errors import ArchiveError
from mgtrace.module import Module
from mgtrace.serialization import header as H
from mgtrace.serialization import aliases, registry, tensors, unknown, values
from mgtrace.serialization.codecs import codec_for_kind, codec_for_module
from mgtrace.serialization import limits
from mgtrace.serialization.version import FORMAT_VERSION, fmt, released_names

__all__ = ["EncodeContext", "DecodeContext", "Op"]

Op = namedtuple("Op", "name version fn upgrade")
Op.__doc__ = """An op-table entry resolved on load: stable ``name``, stored ``version``,
the current function ``fn``, and ``upgrade(args_by_name) -> args_by_name``,
which rewrites arguments stored at ``version`` for ``fn``."""


class EncodeContext:
    """Collects the tables of an archive being written.

    Attributes:
        tensors: the Tensors of the tensor table, in index order.
        modules: the module entries (dicts), in index order.
        ops: the op entries ``{"name", "version"}``, in index order.
        target_version: the newest format the archive may use (``save``'s
            ``target_version``; default FORMAT_VERSION).
        format_version: the newest format whose features were used so far.
        min_reader_version: the lowest format version that reads what was
            encoded so far.
    """

    def __init__(self, target_version=None):
        self.tensors, self.modules, self.ops = [], [], []
        self.target_version = FORMAT_VERSION if target_version is None else tuple(target_version)
        self.format_version = self.min_reader_version = (1, 0)
        self._tensor_index, self._module_index, self._op_index = {}, {}, {}
        self._alive = []      # objects whose id() keys an index stay alive until the save ends
        self.namedtuple_types = set()      # as the reader counts them (limits.py)
        self.build_elements = 0            # what loading will charge to its build budget
        self._stack = []      # names of the modules being encoded, for messages

    def require(self, version, feature="a feature"):
        """Note that the archive uses ``feature``, introduced in format
        ``version``, which a reader must understand.

        Raises:
            ValueError: ``version`` is above the target version (the message
                names the feature and both versions).
        """
        version = tuple(version)
        if version > self.target_version:
            raise ValueError(f"{feature} needs archive format {fmt(version)}, but the target "
                             f"version is {fmt(self.target_version)}")
        self.min_reader_version = max(self.min_reader_version, version)
        self.format_version = max(self.format_version, version)

    def allows(self, version):
        """Whether an optional field of format ``version`` (one an older
        reader ignores) may be written; when it may, the archive is marked
        as using that format. Codecs write such fields only ``if
        ctx.allows((1, 1)):``."""
        version = tuple(version)
        if version > self.target_version:
            return False
        self.format_version = max(self.format_version, version)
        return True

    def tensor(self, t):
        """Index of Tensor ``t`` in the tensor table. Views with the same
        storage, offset, shape, strides and dtype share one entry."""
        key = unknown.tensor_key(t)
        i = self._tensor_index.get(key)
        if i is None:
            tensors.require_dtype(self, t.dtype.name, "a tensor")
            if t._qdtype is not None:
                self.require((1, 2), f"a quantized tensor ({qdtype_str(t._qdtype)})")
            i = self._tensor_index[key] = len(self.tensors)
            self.tensors.append(t)
        return i

    def _check_build(self):
        """Refuse what a load would refuse as allocating too much: the
        elements builtin constructors make (``build_elements``) against the
        budget of the tensors stored (limits.build_budget)."""
        stored = sum(t.size for t in self.tensors if not isinstance(t, aliases.View))
        limits.check_build(self.build_elements, limits.build_budget(stored),
                           "cannot save: building its builtin modules", ValueError)

    def _share_views(self, names=None):
        """Once every value is encoded: keep the memory that tensors of the
        table share (aliases.py; format 1.2). ``names(t) -> str | None``
        names tensors in messages.

        Raises:
            ValueError: the target version cannot keep it (the message names
                two tensors that share memory).
        """
        aliases.share_views(self.tensors, self.require, names)

    def value(self, v, *, node_id=None, where="value"):
        """The tagged form of ``v`` (see values.py); ``node_id(obj) -> int | None``
        turns graph nodes into ``{"node": id}``; ``where`` names ``v`` in
        messages (``config()``). Raises TypeError for values an archive
        cannot hold, naming the module being saved and the value's path."""
        return values.encode(v, self, node_id, where)

    def op(self, fn_or_name):
        """Index in the op table of a registered function (or stable name).

        Raises:
            TypeError: the function is not registered (the message says how).
        """
        name = fn_or_name if isinstance(fn_or_name, str) else registry.function_name(fn_or_name)
        i = self._op_index.get(name)
        if i is None:
            try:
                version = registry.function_version(name)
            except KeyError:
                raise TypeError(f"{name!r} is not a registered function name") from None
            self._note_name("functions", name, version, "function")
            i = self._op_index[name] = len(self.ops)
            self.ops.append({"name": name, "version": version})
        return i

    def _check_released(self, table, name, version, what):
        """Refuse one of mgtrace's own names that the target format's release
        did not have, or had at an older version (there are no downgraders:
        a call stored at a newer version means something the old reader
        would misread)."""
        old = released_names(self.target_version)
        if old is None or not name.startswith("mgtrace."):
            return
        had = old[table].get(name)
        if had is None:
            raise ValueError(f"{what} {name!r} is new since format "
                             f"{fmt(self.target_version)}; an archive that uses it cannot be "
                             f"written for that version (target_version)")
        if had < version:
            raise ValueError(f"{what} {name!r} is at version {version}, format "
                             f"{fmt(self.target_version)} knew version {had} and there is no "
                             "downgrader; drop target_version or avoid it")

    def builtin_type(self, name, version):
        """Note a builtin or container module type stored by ``name`` at
        ``version`` (refused when the target format's release lacks it)."""
        self._note_name("module_types", name, version, "module type")

    def _note_name(self, table, name, version, what):
        """Check a stable name against the target format, and require the
        format that introduced it: a reader of an older format would not
        find it (so it must refuse the archive by version, not fail on the
        name)."""
        self._check_released(table, name, version, what)
        self.require(_introduced(table, name), f"{what} {name}")

    def module(self, m, name=None):
        """Index of Module ``m`` in the module table; a module met twice is
        stored once. ``name`` (e.g. ``"layer1.0"``) only improves messages.

        Raises:
            TypeError: no codec stores ``m`` (the message says to trace it).
            ValueError: modules nest deeper than limits.MAX_MODULE_DEPTH.
        """
        i = self._module_index.get(id(m))
        if i is not None:
            return i
        where = ".".join(self._stack + [name or type(m).__name__])
        limits.check_module_depth(len(self._stack), where, ValueError)
        codec = codec_for_module(m, where)
        i = self._module_index[id(m)] = len(self.modules)
        self._alive.append(m)
        self.modules.append(None)
        self._stack.append(name or type(m).__name__)
        try:
            fields = codec.encode(m, self)
        except values.UnstorableError as e:
            if e.module is None:        # the innermost module is the one that holds it
                path = ".".join(self._stack[1:])        # below the saved module
                e.module = f"{path} ({_type_name(m)})" if path else _type_name(m)
            raise
        finally:
            self._stack.pop()
        self.modules[i] = {"kind": codec.kind, "training": bool(m.training), **fields}
        self.require(codec.since, f"module kind {codec.kind!r}")
        return i


def _introduced(table, name):
    """The format whose release first had mgtrace's own stable ``name`` (the
    current format for one no release had yet); (1, 0) for other names (a
    user's registrations are the user's to version)."""
    if not name.startswith("mgtrace."):
        return (1, 0)
    v = (FORMAT_VERSION[0], 0)
    while v < FORMAT_VERSION:
        names = released_names(v)
        if names is not None and name in names[table]:
            return v
        v = (v[0], v[1] + 1)
    return FORMAT_VERSION


def _type_name(m):
    """The stable name of a registered module type, else the class (a traced
    module: the class that was traced)."""
    name = getattr(m, "builtin_name", None)
    if isinstance(name, str):
        return name
    return getattr(m, "_orig_name", None) or type(m).__qualname__


class DecodeContext:
    """Hands out what an archive's tables describe, each built once.

    Creating one resolves the op table and checks every module entry, so an
    unknown name fails the load before any code runs.

    Attributes:
        format_version: the archive's ``(major, minor)``.
        device: the Device tensors and modules go to (None: the CPU).
        header: the validated header (values still tagged).
    """

    def __init__(self, header, source, data_start, *, mmap=False, device=None, verify=True):
        self.header, self.device = header, device
        self._run_once = False      # reader._load_archive(run_once=True) sets it: see there
        self.format_version = tuple(header["format_version"])
        self._source, self._data_start = source, data_start
        self._mmap, self._verify = mmap and source.can_view, verify
        self._host, self._placed, self._params, self._modules, self._building = {}, {}, {}, {}, []
        self.namedtuple_types = set()      # (module, qualname, fields) made: bounded per archive
        self.traced_built = []             # traced modules built, not numbered yet (traced_codec)
        self.blueprints = {}               # (type, config) -> Blueprint or None (builtin_modules)
        self.signatures = {}               # stored parameter lists -> Signature (traced_codec)
        self.module_types = {}             # (type, version) -> resolved (builtin_modules)
        # a lazy load (mmap, verify off: trusted bytes that stay mapped): traced graphs are
        # read on first use (traced_codec.LazyGraphs); lazy_graphs lists what waits
        self.lazy_graphs = [] if self._mmap and not verify else None
        self.finish_lazy = None            # (guard) -> None: hands lazy_graphs over (traced_codec)
        self.numbering = []                # id numberings that wait for lazy graphs (traced_codec)
        stored = sum(math.prod(e["shape"]) for e in header["tensors"] if "view" not in e)
        self._budget = limits.build_budget(stored)
        self._ops = [self._resolve_op(i, e) for i, e in enumerate(header["ops"])]
        for i, entry in enumerate(header["modules"]):
            where = f"header.modules[{i}]"
            codec = codec_for_kind(entry["kind"], where)
            H.check(entry, codec.fields, where)
            if codec.check is not None:
                codec.check(entry, self, where)

    # ---------------------------------------------------------------- tables
    def _resolve_op(self, i, entry):
        fn, upgrade = registry.resolve_function(entry["name"], entry["version"])
        return Op(entry["name"], entry["version"], fn, upgrade)

    def op(self, i):
        """The resolved :class:`Op` at index ``i``. Raises ArchiveError when
        ``i`` is out of range."""
        self.check_index(i, len(self._ops), "header.ops")
        return self._ops[i]

    def check_index(self, i, n, table):
        """Raise ArchiveError unless ``i`` is an int in ``range(n)``."""
        if type(i) is not int or not 0 <= i < n:
            raise ArchiveError(f"index {i!r} is out of range for {table} ({n} entries)")

    def host_tensor(self, i):
        """Tensor ``i`` on the CPU: read-only and backed by the file with
        ``mmap``, else a fresh copy. Its checksum is verified (unless the
        load turned that off). Raises ArchiveError."""
        self.check_index(i, len(self.header["tensors"]), "header.tensors")
        t = self._host.get(i)
        if t is None:
            e = self.header["tensors"][i]
            if "view" in e:         # a view of its base's memory (format 1.2, aliases.py)
                t = aliases.make_view(self.host_tensor(e["view"]["base"]), e)
            else:
                t = self._read_tensor(i, e)
            if "quant" in e or t._qdtype is not None:
                t = tensors.mark_quantized(t, e, f"header.tensors[{i}]")
            self._host[i] = t
        return t

    def tensor(self, i):
        """Tensor ``i`` on the load's device (see :meth:`host_tensor`); a
        view entry (format 1.2) is a view of its base's tensor there."""
        t = self._placed.get(i)
        if t is None:
            self.check_index(i, len(self.header["tensors"]), "header.tensors")
            e = self.header["tensors"][i]
            if "view" in e:
                t = aliases.make_view(self.tensor(e["view"]["base"]), e)
                if "quant" in e or t._qdtype is not None:
                    t = tensors.mark_quantized(t, e, f"header.tensors[{i}]")
            else:
                t = self.host_tensor(i)
                if self.device is not None and t.device != self.device:
                    t = t.to(self.device)       # any device, cpu:1 included
            self._placed[i] = t
        return t

    def parameter(self, i):
        """Tensor ``i`` on the load's device as a Parameter that shares its
        memory (:func:`~mgtrace.serialization.tensors.as_parameter`): with
        ``mmap`` a read-only view of the file, else the one copy the load
        read. The same ``i`` gives the same Parameter. Raises ArchiveError as
        :meth:`host_tensor`."""
        p = self._params.get(i)
        if p is None:               # one Parameter per tensor: tied weights stay one object
            p = self._params[i] = tensors.as_parameter(self.tensor(i))
        return p

    def _read_tensor(self, i, e):
        where, start = f"header.tensors[{i}]", self._data_start + e["offset"]
        dtype = tensors.DTYPES_BY_NAME[e["dtype"]]
        if self._mmap:
            # (a mapping is read-only and this reader's own: a file changed
            # under a live mmap load is outside what the archive promises)
            t = self._source.wrap(start, e["nbytes"], e["shape"], e["dtype"], not self._run_once)
            buf = self._source.view(start, e["nbytes"]) if t is None or self._verify else None
            if t is None:           # bytes not aligned for the dtype (an archive in memory)
                t = tensors.tensor_from_array(np.frombuffer(buf, np.uint8).view(dtype).reshape(e["shape"]),
                                              immutable=not self._run_once)
        else:
            if dtype.name != "bfloat16":
                # read into memory mgtrace owns, so that conv2d may cache the
                # weights' packed copies (a tensor wrapping NumPy's memory is
                # one others may write unseen: never cached)
                t, buf = tensors.fresh_tensor(e["shape"], dtype)
            else:
                buf = tensors.aligned_empty(e["nbytes"])
                t = tensors.tensor_from_array(buf.view(dtype).reshape(e["shape"]))
            # the checksum of each piece as it is read: the bytes are read from memory once
            crc = self._source.readinto(start, buf, 0 if self._verify else None)
            if self._verify:
                tensors.verify(crc, e, where)
            return t
        if self._verify:
            tensors.verify(memoryview(buf), e, where)
        return t

    def value(self, x, *, node=None, where="value"):
        """The Python value of tagged ``x``; ``node(id) -> object`` resolves
        ``{"node": id}``. ``where`` names ``x`` in messages (inside a module
        entry, relative to it). Raises ArchiveError."""
        if type(x) in values.SCALARS:       # untagged: itself (no path to spell)
            return x
        if self._building and not where.startswith("header"):
            where = f"header.modules[{self._building[-1]}].{where}"
        return values.decode(x, self, node, where)

    def module(self, i):
        """Module ``i``, built on first use by its kind's codec (on the
        load's device, with its training flag).

        Raises:
            ArchiveError: bad index, a module containing itself, nesting
                deeper than limits.MAX_MODULE_DEPTH, or anything the codec
                raised (chained).
        """
        self.check_index(i, len(self.header["modules"]), "header.modules")
        m = self._modules.get(i)
        if m is not None:
            return m
        where = f"header.modules[{i}]"
        if i in self._building:
            raise ArchiveError(f"{where} contains itself")
        limits.check_module_depth(len(self._building), where, ArchiveError)
        entry = self.header["modules"][i]
        self._building.append(i)
        try:
            m = codec_for_kind(entry["kind"], where).decode(entry, self)
        except ArchiveError:
            raise
        except Exception as e:   # codecs build modules: report, never crash the load
            raise ArchiveError(f"{where}: {type(e).__name__}: {e}") from e
        finally:
            self._building.pop()
        if not isinstance(m, Module):
            raise ArchiveError(f"{where}: the {entry['kind']!r} codec returned a "
                               f"{type(m).__name__}, not a Module")
        m.training = entry["training"]
        self._modules[i] = m
        return m

    def reserve_elements(self, n, what):
        """Count ``n`` tensor elements a constructor is about to allocate.

        Loading may allocate at most twice the elements the archive stores
        plus limits.BUILD_SLACK_ELEMENTS, so a config that asks for a huge
        module is refused before it is built.

        Raises:
            ArchiveError: the budget is exceeded.
        """
        limits.check_build(n, self._budget, what, ArchiveError)
        self._budget -= n
