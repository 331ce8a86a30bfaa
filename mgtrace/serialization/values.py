"""Tagged values: how Python values are written in an archive's header.

A value is either a msgpack scalar that needs no tag, or a map with exactly
one key, the tag, whose payload is described in :data:`TAGS`. Nothing is
ambiguous after a round trip: a tuple stays a tuple, ``1`` stays apart from
``True`` and ``1.0``, dict keys may be any hashable value and keep their
order, floats keep their bits (-0.0, NaN payloads), NumPy scalars keep their
dtype. A namedtuple comes back as an instance of a look-alike class made on
load (:func:`namedtuple_type`): same name, fields, ``__module__`` and
``__qualname__``, but never the imported original. Map keys in the header itself are strings only; dicts inside values
are ``{"dict": [[key, value], ...]}``.

Untagged: nil, bool, int in [-2**63, 2**64), float64, str, bin (bytes).

>>> import numpy as np
>>> from mgtrace.serialization.values import encode, decode
>>> encode((1, -0.0, {"a": [None]}, np.float32(2.5)), ctx=None)
{'tuple': [1, -0.0, {'dict': [['a', {'list': [None]}]]}, {'scalar': ['float32', b'\\x00\\x00 @']}]}
>>> decode(_, ctx=None)
(1, -0.0, {'a': [None]}, np.float32(2.5))
"""
import collections
from collections import OrderedDict, namedtuple

import numpy as np

from mgtrace._core import DTYPE_NAMES, Device, Tensor, as_device
from mgtrace._core.dtype import qdtype_name
from mgtrace.errors import ArchiveError, Error
from mgtrace.module import Module
from mgtrace.serialization import limits
from mgtrace.serialization.limits import MAX_DEVICE_STR, MAX_INT_DIGITS
from mgtrace.serialization.tensors import DtypeTable
from mgtrace.serialization.tensors import require_dtype

__all__ = ["TAGS", "UNTAGGED", "UnstorableError", "encode", "decode", "namedtuple_type"]

Tag = namedtuple("Tag", "payload since")

# The closed set of value tags (STYLE.md item 2). Adding one is a format change:
# give it the version that introduces it, so writers raise min_reader_version.
TAGS = {
    # containers, order kept
    "tuple":    Tag("[value, ...]", (1, 0)),
    "list":     Tag("[value, ...]", (1, 0)),
    "dict":     Tag("[[key, value], ...]; keys are values (int, tuple, str, ...)", (1, 0)),
    "odict":    Tag("[[key, value], ...]; a collections.OrderedDict", (1, 0)),
    "namedtuple": Tag("[module, qualname, [field, ...], [value, ...]]; loads as a look-alike "
                      "class with that name and those fields (never imported)", (1, 0)),
    # numbers msgpack cannot hold exactly
    "int":      Tag("decimal str; an int outside [-2**63, 2**64)", (1, 0)),
    "scalar":   Tag("[dtype name, little-endian bytes]; a NumPy scalar, bit-exact", (1, 0)),
    "complex":  Tag("[real, imag]; a Python complex, two float64 (bits kept)", (1, 2)),
    # other Python constants
    "slice":    Tag("[start, stop, step]; each a value", (1, 0)),
    "ellipsis": Tag("nil; the Ellipsis object", (1, 0)),
    # mgtrace values
    "dtype":    Tag("dtype name, one of mgtrace.DTYPES", (1, 0)),
    "qdtype":   Tag("[name, scale, zero_point]; a quantized dtype (qint8, qint8_narrow, "
                    "quint8, qint32, qint4, quint4; mgtrace.quantization.qdtype)", (1, 2)),
    "device":   Tag('device str, e.g. "cpu:0"', (1, 0)),
    # references into the header's tables
    "tensor":   Tag("index into header.tensors", (1, 0)),
    "module":   Tag("index into header.modules", (1, 0)),
    "node":     Tag("node id in the enclosing graph (graph values only)", (1, 0)),
}
UNTAGGED = "nil, bool, int in [-2**63, 2**64), float64 (bits kept), str, bin"

_INT_RANGE = (-(1 << 63), 1 << 64)
# NumPy scalar dtypes a value may hold: mgtrace's dtypes plus NumPy's other fixed-size ints
SCALAR_DTYPES = DtypeTable(DTYPE_NAMES + ("uint32", "uint64"))
_PLAIN = (type(None), bool, str, bytes, float)
SCALARS = frozenset(_PLAIN + (int,))       # untagged: decoded as themselves


class UnstorableError(Error, TypeError):
    """A value ``encode`` cannot write (what ``save`` raises for it: a
    TypeError and an :class:`mgtrace.Error`). While it propagates, ``path`` grows
    (``['layers'][2]``), ``root`` names the value (``metadata``) and
    ``module`` the module being saved (``body.0 (myproject.Scale)``)."""

    def __init__(self, what):
        super().__init__(what)
        self.what, self.path, self.root, self.module = what, "", None, None
        self.saving = False     # save() sets it: the message then starts "cannot save: "

    def grow(self, step):
        """Prefix ``step`` (``[2]``) to the path, until the value is named."""
        if self.root is None:
            self.path = step + self.path

    def __str__(self):
        where = f"{self.root or 'value'}{self.path}"
        return (f"{'cannot save: ' if self.saving else ''}"
                f"{self.module + ' ' if self.module else ''}{where}: {self.what}")


# ------------------------------------------------------------------ encode

def encode(value, ctx, node_id=None, where="value"):
    """The tagged form of ``value``.

    Args:
        value: None, bool, int, float, str, bytes, tuple, list, dict,
            OrderedDict, namedtuples, slice, Ellipsis, NumPy scalars and
            dtypes, mgtrace Devices; Tensors and Modules through ``ctx.tensor`` /
            ``ctx.module``; other objects through ``node_id``.
        ctx: an :class:`~mgtrace.serialization.context.EncodeContext` (may be
            None when no tensor or module occurs).
        node_id: optional ``f(obj) -> int | None``; an int makes ``obj`` a
            ``{"node": id}`` reference (graph encoders pass their node table).
        where: what ``value`` is, for messages (``metadata``, ``config()``).

    Raises:
        TypeError: a value of another type (the message gives its path, e.g.
            ``metadata['layers'][2]``), a set, a tuple subclass that is not a
            namedtuple.
        ValueError: nesting deeper than ``limits.MAX_VALUE_DEPTH`` (or a
            reference cycle).
    """
    try:
        return _enc(value, ctx, node_id, 0)
    except UnstorableError as e:
        if e.root is None:      # the innermost encode names it
            e.root = where
        raise


def _tag(ctx, name, payload):
    if ctx is not None:
        ctx.require(TAGS[name].since, f"value tag {name!r}")
    return {name: payload}


def _enc(v, ctx, node_id, depth):
    limits.check_value_depth(depth, "cannot save: a value (or one that refers to itself)",
                             ValueError)
    t = type(v)
    if t in _PLAIN:
        return v
    if t is int:
        return v if _INT_RANGE[0] <= v < _INT_RANGE[1] else _big_int(v, ctx)
    enc = _ENCODERS.get(t)
    if enc is not None:
        return enc(v, ctx, node_id, depth + 1)
    if isinstance(v, tuple) and hasattr(t, "_fields"):
        return _namedtuple(v, ctx, node_id, depth + 1)
    for base, enc in _BY_BASE:
        if isinstance(v, base):
            return enc(v, ctx, node_id, depth + 1)
    if node_id is not None:
        i = node_id(v)
        if i is not None:
            return _tag(ctx, "node", i)
    if isinstance(v, np.ndarray):
        raise UnstorableError("cannot store a NumPy array in an archive: make it a tensor, "
                          "mgtrace.tensor(array) (an archive stores Tensors, zero-copy on load)")
    raise UnstorableError(f"cannot store a {t.__module__}.{t.__qualname__} in an archive (values "
                      "are None, bool, int, float, str, bytes, tuple, list, dict, "
                      "namedtuple, slice, "
                      "Ellipsis, NumPy scalars, dtypes, devices, Tensors and Modules)")


def _big_int(v, ctx):
    try:
        text = str(v)
    except ValueError:          # past the interpreter's own limit (sys.set_int_max_str_digits)
        text = None
    digits = len(text.lstrip("-")) if text is not None else MAX_INT_DIGITS + 1
    limits.check_int_digits(digits, "cannot save: a value", ValueError)
    return _tag(ctx, "int", text)


def _items(pairs, ctx, node_id, depth):
    out, hashes = [], collections.Counter()
    for k, v in pairs:
        limits.count_hash(hashes, k, "cannot save: a dict", ValueError)
        try:
            out.append([_enc(k, ctx, node_id, depth), _enc(v, ctx, node_id, depth)])
        except UnstorableError as e:
            e.grow(f"[{k!r}]")
            raise
    return out


def _seq(tag):
    def enc(v, ctx, node_id, depth):
        out = []
        for i, x in enumerate(v):
            try:
                out.append(_enc(x, ctx, node_id, depth))
            except UnstorableError as e:
                e.grow(f"[{i}]")
                raise
        return _tag(ctx, tag, out)
    return enc


def _namedtuple(v, ctx, node_id, depth):
    t = type(v)
    limits.check_namedtuple(t.__module__, t.__qualname__, t._fields,
                            f"cannot save: a {t.__qualname__}", ValueError)
    if ctx is not None:
        ctx.namedtuple_types.add((t.__module__, t.__qualname__, tuple(t._fields)))
        limits.check_namedtuple_types(len(ctx.namedtuple_types), "cannot save", ValueError)
    items = _seq("list")(v, ctx, node_id, depth)["list"]      # paths name items as [i]
    return _tag(ctx, "namedtuple", [t.__module__, t.__qualname__, list(t._fields), items])


def _scalar(v, ctx, node_id, depth):
    name = v.dtype.name
    if name not in SCALAR_DTYPES:
        raise UnstorableError(f"cannot store a NumPy {name} scalar (supported: "
                          f"{', '.join(SCALAR_DTYPES)})")
    require_dtype(ctx, name, "a NumPy scalar")
    return _tag(ctx, "scalar", [name, v.astype(v.dtype.newbyteorder("<")).tobytes()])


def _dtype(v, ctx, node_id, depth):
    if qdtype_name(v) is not None:      # a quantized dtype: its scale and zero point too
        from mgtrace.quantization import qdtype
        return _tag(ctx, "qdtype", [qdtype.quantized_meta(v).name, float(qdtype.get_scale(v)),
                                    qdtype.get_zero_point(v)])
    try:
        name = np.dtype(v).name
    except TypeError:
        name = repr(v)
    if name not in DTYPE_NAMES:
        raise UnstorableError(f"cannot store dtype {name} (mgtrace's dtypes: {', '.join(DTYPE_NAMES)})")
    require_dtype(ctx, name, "a dtype value")
    return _tag(ctx, "dtype", name)


def _np_type(v, ctx, node_id, depth):
    if issubclass(v, np.generic):        # np.float32 given where a dtype is meant
        return _dtype(v, ctx, node_id, depth)
    raise UnstorableError(f"cannot store the class {v.__module__}.{v.__qualname__}")


_ENCODERS = {   # exact types
    tuple: _seq("tuple"),
    list: _seq("list"),
    dict: lambda v, ctx, n, d: _tag(ctx, "dict", _items(v.items(), ctx, n, d)),
    OrderedDict: lambda v, ctx, n, d: _tag(ctx, "odict", _items(v.items(), ctx, n, d)),
    slice: lambda v, ctx, n, d: _tag(ctx, "slice", [_enc(x, ctx, n, d)
                                                     for x in (v.start, v.stop, v.step)]),
    type(Ellipsis): lambda v, ctx, n, d: _tag(ctx, "ellipsis", None),
    complex: lambda v, ctx, n, d: _tag(ctx, "complex", [v.real, v.imag]),
    Device: lambda v, ctx, n, d: _tag(ctx, "device", str(v)),
    type: _np_type,
}
_BY_BASE = (    # subclasses too (Parameter is a Tensor, np.float64 is a float)
    (Tensor, lambda v, ctx, n, d: _tag(ctx, "tensor", ctx.tensor(v))),
    (Module, lambda v, ctx, n, d: _tag(ctx, "module", ctx.module(v))),
    (np.generic, _scalar),
    (np.dtype, _dtype),
)


# ------------------------------------------------------------------ decode

def decode(x, ctx, node=None, where="value"):
    """The Python value of tagged ``x`` (as msgpack unpacked it).

    Args:
        ctx: a :class:`~mgtrace.serialization.context.DecodeContext` (for
            tensors and modules; may be None when none occurs).
        node: optional ``f(node_id) -> object`` for ``{"node": id}`` tags.
        where: the path used in error messages (``header.root``).

    Raises:
        ArchiveError: an unknown tag, a payload of the wrong type, an
            unhashable or repeated dict key, nesting deeper than
            ``limits.MAX_VALUE_DEPTH``, a node reference outside a graph.
    """
    return _dec(x, ctx, node, 0, where)


def _fail(where, msg):
    raise ArchiveError(f"{where}: {msg}")


def _describe(x):
    if isinstance(x, dict):
        return f"a map with keys {list(x)[:4]!r}"
    return f"a {type(x).__name__}"


def _dec(x, ctx, node, depth, where):
    limits.check_value_depth(depth, where, ArchiveError)
    t = type(x)
    if t in _PLAIN or t is int:
        return x
    if t is not dict or len(x) != 1:
        _fail(where, f"expected a value ({UNTAGGED}, or a map with one tag), got {_describe(x)}")
    (tag, payload), = x.items()
    dec = _DECODERS.get(tag)
    if dec is None:
        hint = " (pickled data is never loaded)" if "pickle" in str(tag).lower() else ""
        _fail(where, f"unknown value tag {tag!r}{hint}; known tags: {', '.join(TAGS)}")
    return dec(payload, ctx, node, depth + 1, f"{where}.{tag}")


def _expect(payload, kind, where, n=None):
    ok = type(payload) is kind and (n is None or len(payload) == n)
    if not ok:
        what = kind.__name__ if n is None else f"{kind.__name__} of {n}"
        _fail(where, f"expected a {what}, got {_describe(payload)}")
    return payload


def _index(payload, where):
    if type(payload) is not int or payload < 0:
        _fail(where, f"expected an index (a non-negative int), got {payload!r}")
    return payload


def _dec_seq(kind):
    def dec(p, ctx, node, depth, where):
        p = _expect(p, list, where)
        if depth <= limits.MAX_VALUE_DEPTH and all(type(e) in SCALARS for e in p):
            items = list(p)         # untagged items are themselves (a kernel size, a shape)
        else:
            items = [_dec(e, ctx, node, depth, f"{where}[{i}]") for i, e in enumerate(p)]
        return tuple(items) if kind is tuple else items
    return dec


def check_hashes(keys, where, error=ArchiveError):
    """Raise ``error`` when more than limits.MAX_SAME_HASH of ``keys``
    (hashable) share a hash. Keys that share a hash make each insertion into
    a dict or set compare them all: a few is chance (``hash(-1) ==
    hash(-2)``), many is a quadratic-time attack."""
    hashes = collections.Counter()
    for k in keys:
        limits.count_hash(hashes, k, where, error)


def _dec_map(kind):
    def dec(p, ctx, node, depth, where):
        out, hashes = kind(), collections.Counter()
        for i, pair in enumerate(_expect(p, list, where)):
            k, v = _expect(pair, list, f"{where}[{i}]", 2)
            key = _dec(k, ctx, node, depth, f"{where}[{i}][0]")
            try:
                hash(key)
            except TypeError:
                _fail(f"{where}[{i}][0]", f"a dict key must be hashable, got a "
                                          f"{type(key).__name__}")
            limits.count_hash(hashes, key, where, ArchiveError)
            if key in out:
                _fail(where, f"key {_short(key)} appears twice")
            out[key] = _dec(v, ctx, node, depth, f"{where}[{i}][1]")
        return out
    return dec


def _short(v):
    s = repr(v)
    return s if len(s) <= 80 else s[:77] + "..."


_NAMEDTUPLES = {}              # (module, qualname, fields) -> look-alike class
_MAX_NAMEDTUPLES = 4096


def namedtuple_type(module, qualname, fields, where="value"):
    """The look-alike namedtuple class for a stored one: named after the last
    part of ``qualname``, with ``fields``, ``__module__ = module`` and
    ``__qualname__ = qualname``, and ``_mgtrace_lookalike = True``. Made
    here, never imported; the same arguments give the same class.

    Raises:
        ArchiveError: not strings, or a name or field that is not an
            identifier, a keyword, a field starting with '_', a repeated field.
    """
    if not (type(module) is str and type(qualname) is str and type(fields) in (list, tuple)
            and all(type(f) is str for f in fields)):
        _fail(where, "a namedtuple is stored as (module, qualname, fields) strings")
    limits.check_namedtuple(module, qualname, fields, where, ArchiveError)
    key = (module, qualname, tuple(fields))
    t = _NAMEDTUPLES.get(key)
    if t is None:
        try:       # namedtuple checks: identifiers, no keywords, no '_' fields, no repeats
            t = collections.namedtuple(qualname.rsplit(".", 1)[-1], key[2], module=module)
        except (ValueError, TypeError) as e:
            shown = qualname if len(qualname) < 60 else qualname[:57] + "..."
            _fail(where, f"bad namedtuple {shown!r} ({e})")
        t.__qualname__ = qualname
        t._mgtrace_lookalike = True
        if len(_NAMEDTUPLES) >= _MAX_NAMEDTUPLES:
            _NAMEDTUPLES.clear()
        _NAMEDTUPLES[key] = t
    return t


def _dec_namedtuple(p, ctx, node, depth, where):
    module, qualname, fields, items = _expect(p, list, where, 4)
    made = getattr(ctx, "namedtuple_types", None)       # the classes this load made
    if made is not None and type(module) is str and type(qualname) is str \
            and type(fields) is list and all(type(f) is str for f in fields):
        made.add((module, qualname, tuple(fields)))
        limits.check_namedtuple_types(len(made), where, ArchiveError)
    t = namedtuple_type(module, qualname, fields, where)
    items = [_dec(e, ctx, node, depth, f"{where}[3][{i}]")
             for i, e in enumerate(_expect(items, list, f"{where}[3]"))]
    if len(items) != len(t._fields):
        _fail(where, f"{len(items)} values for the {len(t._fields)} fields of {t.__name__}")
    return t(*items)


def _dec_int(p, ctx, node, depth, where):
    s = _expect(p, str, where)
    digits = s[1:] if s[:1] == "-" else s
    if not (0 < len(digits) <= MAX_INT_DIGITS and digits.isascii() and digits.isdigit()):
        _fail(where, f"expected a decimal int of at most {MAX_INT_DIGITS} digits, got {s[:40]!r}")
    return int(s)


def _dec_scalar(p, ctx, node, depth, where):
    name, raw = _expect(p, list, where, 2)
    dt = SCALAR_DTYPES.get(name) if type(name) is str else None
    if dt is None:
        _fail(where, f"unknown scalar dtype {name!r}; known: {', '.join(SCALAR_DTYPES)}")
    if type(raw) is not bytes or len(raw) != dt.itemsize:
        _fail(where, f"a {name} scalar needs {dt.itemsize} bytes, got {_describe(raw)}")
    if name == "bool" and raw not in (b"\x00", b"\x01"):
        _fail(where, f"a bool scalar is byte 0 or 1, got {raw!r}")
    return np.frombuffer(raw, dt.newbyteorder("<")).astype(dt)[0]


def _dec_complex(p, ctx, node, depth, where):
    parts = _expect(p, list, where, 2)
    if not all(type(x) in (float, int) for x in parts):
        _fail(where, f"a complex is two floats, got {_describe(parts)}")
    return complex(*parts)


def _dec_slice(p, ctx, node, depth, where):
    parts = _expect(p, list, where, 3)
    return slice(*(_dec(e, ctx, node, depth, f"{where}[{i}]") for i, e in enumerate(parts)))


def _dec_ellipsis(p, ctx, node, depth, where):
    if p is not None:
        _fail(where, f"expected nil, got {_describe(p)}")
    return Ellipsis


def _dec_dtype(p, ctx, node, depth, where):
    if p not in DTYPE_NAMES:
        _fail(where, f"unknown dtype {p!r}; known: {', '.join(DTYPE_NAMES)}")
    return SCALAR_DTYPES[p]


def _dec_qdtype(p, ctx, node, depth, where):
    if type(p) is not list or len(p) != 3 or type(p[0]) is not str \
            or type(p[1]) is not float or type(p[2]) is not int:
        _fail(where, f"expected [name, scale, zero_point], got {_describe(p)}")
    from mgtrace.quantization import qdtype
    from mgtrace.quantization.utils import QuantizationError
    try:
        return qdtype.create_quantized_dtype(p[0], p[1], p[2])
    except QuantizationError as e:
        _fail(where, str(e))


def _dec_device(p, ctx, node, depth, where):
    if type(p) is not str or len(p) > MAX_DEVICE_STR:
        _fail(where, f"expected a device string, got {_describe(p)}")
    try:
        return as_device(p)
    except (TypeError, ValueError) as e:
        _fail(where, str(e))


def _ref(ctx, table, p, where):
    i = _index(p, where)
    return getattr(ctx, table)(i)


def _dec_node(p, ctx, node, depth, where):
    i = _index(p, where)
    if node is None:
        _fail(where, "a node reference outside a graph")
    return node(i)


_DECODERS = {
    "tuple": _dec_seq(tuple),
    "list": _dec_seq(list),
    "dict": _dec_map(dict),
    "odict": _dec_map(OrderedDict),
    "namedtuple": _dec_namedtuple,
    "int": _dec_int,
    "scalar": _dec_scalar,
    "complex": _dec_complex,
    "slice": _dec_slice,
    "ellipsis": _dec_ellipsis,
    "dtype": _dec_dtype,
    "qdtype": _dec_qdtype,
    "device": _dec_device,
    "tensor": lambda p, ctx, node, depth, where: _ref(ctx, "tensor", p, where),
    "module": lambda p, ctx, node, depth, where: _ref(ctx, "module", p, where),
    "node": _dec_node,
}
assert _DECODERS.keys() == TAGS.keys(), "every tag needs a decoder"
