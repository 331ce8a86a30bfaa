"""A reader of the pickles MegEngine writes (``megengine.save``) that runs
none of them.

A pickle is a program for a small stack machine: Python's unpickler loads
each global the file names and calls it at each REDUCE, so it runs whatever
the file says. This module is its own machine instead: the opcodes are
decoded from the bytes by :mod:`mgtrace.megengine.opcodes` (Python's
pickle and pickletools modules are never loaded) and run by
:class:`_Machine`, which resolves a global only against one closed table
(:data:`ALLOWED`), each name mapped to something of mgtrace's own:

* MegEngine's classes (Tensor, Parameter, the traced-module graph, expr, node,
  pytree and module-state classes) to :class:`Stub` subclasses: inert records
  of the arguments and the state the file gives them;
* NumPy's array, scalar and dtype reconstruction to builders that accept
  plain numeric dtypes only (and MegEngine's quantized ones: a plain
  integer dtype whose metadata, checked as data, is one of
  :data:`QUANTIZED_CNAMES` with its scale and zero point) and copy exactly
  the bytes the file holds;
* ``collections.OrderedDict`` / ``defaultdict`` to plain dict subclasses;
* types and functions the file uses as data (``builtins.tuple`` in a pytree
  definition, MegEngine's builtin module classes and functional functions by
  qualified name, op classes) to inert :class:`Global` names.

Any other global is refused with :class:`ForbiddenGlobalError` naming it.
REDUCE and NEWOBJ call only the table's record classes and builders, BUILD
gives state only to records, APPEND(S) and SET(ITEM)S add only to the file's
own lists and dicts; anything else, and every opcode outside
:data:`~mgtrace.megengine.opcodes.OPCODES`, is a :class:`MegEngineFileError`
naming the opcode and its byte offset.

Bounds: the file's size (MAX_BYTES), its opcodes (MAX_OPCODES), memo indices
(MAX_MEMO), ints and floats (MAX_INT: larger ones collide in dicts) and
dict keys (MAX_KEY_ITEMS items, so that no key is costly to hash). Each
opcode makes at most one object, and the bytes of a string or an array are
those of the file, so memory is linear in the file and time in its opcodes;
the machine keeps no Python recursion (a deeply nested file is read as one).
"""
import collections

import numpy as np

from mgtrace.megengine.errors import ForbiddenGlobalError, MegEngineFileError
from mgtrace.megengine.opcodes import OPCODES, read_opcode

__all__ = ["MegEngineFileError", "ForbiddenGlobalError", "Stub", "Global", "Builder",
           "read_pickle", "array_of", "allow_names", "allow_classes", "ALLOWED", "MAX_BYTES",
           "MAX_OPCODES", "MAX_MEMO", "MAX_NDIM", "MAX_INT", "MAX_KEY_ITEMS",
           "QUANTIZED_CNAMES"]

MAX_BYTES = 1 << 34          # 16 GiB: a file larger than this is refused before it is read
MAX_OPCODES = 1 << 22        # opcodes of one pickle (a ResNet-50 .tm has about 60,000)
MAX_MEMO = 1 << 22           # memo index
MAX_NDIM = 16                # dimensions of one array (mgtrace's own limit)
MAX_ELEMENTS = 1 << 40       # elements of one array (the bytes must be in the file anyway)
MAX_INT = 1 << 61            # ints and floats of this magnitude hash alike (Python hashes
                             # numbers modulo 2**61 - 1): a dict of many is quadratic to build
MAX_KEY_ITEMS = 64           # values in one dict key (MegEngine's keys are strs)

# the dtypes an array or scalar may have: plain numbers and bool
_DTYPE_CODES = {"b1": "bool", "?": "bool", "i1": "int8", "u1": "uint8", "i2": "int16",
                "u2": "uint16", "i4": "int32", "u4": "uint32", "i8": "int64", "u8": "uint64",
                "f2": "float16", "f4": "float32", "f8": "float64"}
_DTYPE_CODES.update({v: v for v in set(_DTYPE_CODES.values())})


class Global:
    """A type or function the file names as data (``builtins.tuple`` in a
    pytree definition, a MegEngine module class). Inert: calling it,
    or building state into it, is refused."""

    __slots__ = ("module", "name")

    def __init__(self, module, name):
        self.module, self.name = module, name

    @property
    def qualname(self):
        return f"{self.module}.{self.name}"

    def __setstate__(self, state):
        raise MegEngineFileError(f"the pickle builds state into the global {self.qualname}")

    def __eq__(self, other):
        return isinstance(other, Global) and (self.module, self.name) == (other.module,
                                                                          other.name)

    def __hash__(self):
        return hash((self.module, self.name))

    def __repr__(self):
        return f"Global({self.qualname})"


class Builder(Global):
    """A name of the table that REDUCE may call: ``build(*args)`` makes the
    value (a NumPy scalar, an array from a protocol-5 buffer, an
    OrderedDict...) from plain arguments, checking them. As data it is the
    :class:`Global` of its name."""

    __slots__ = ("build",)

    def __init__(self, module, name, build):
        super().__init__(module, name)
        self.build = build


class Stub:
    """An inert record of one MegEngine object: ``kind`` (its class's
    qualified name), ``args`` (what NEWOBJ/REDUCE gave) and ``state`` (what
    BUILD gave: a dict, or None). Nothing is called on the values."""

    __slots__ = ("args", "state")
    kind = None
    state_type = dict      # CompNode's state is its name, a str

    def __new__(cls, *args, **kwargs):
        if kwargs:
            raise MegEngineFileError(f"{cls.kind} made with keyword arguments")
        self = object.__new__(cls)
        self.args = args
        self.state = None
        return self

    def __init__(self, *args, **kwargs):
        pass

    def __setstate__(self, state):
        if self.state is not None:
            raise MegEngineFileError(f"the pickle builds the state of a {self.kind} twice")
        if isinstance(state, tuple) and len(state) == 2 and state[0] is None:
            state = state[1]         # (None, slotstate): what __slots__ classes write
        if type(state) is not self.state_type and not (
                self.state_type is dict and isinstance(state, dict)):
            raise MegEngineFileError(f"the state of a {self.kind} is a {type(state).__name__}, "
                                     f"not a {self.state_type.__name__}")
        self.state = state

    def get(self, key, default=None):
        """``state[key]``, or default when the state lacks it."""
        return self.state.get(key, default) if isinstance(self.state, dict) else default

    def __repr__(self):
        return f"<{self.kind}>"


class _OrderedDict(collections.OrderedDict):
    """collections.OrderedDict with no BUILD (its state is items only,
    given by SETITEMS: pickle writes ``OrderedDict()`` then the items)."""

    def __init__(self, *args):
        if args:
            raise MegEngineFileError("an OrderedDict made with arguments")
        super().__init__()

    def __setstate__(self, state):
        raise MegEngineFileError("the pickle builds state into an OrderedDict")

    def __reduce__(self):
        return (collections.OrderedDict, (list(self.items()),))


class _DefaultDict(dict):
    """collections.defaultdict(factory) read as a plain dict (the factory, a
    Global, is never called)."""

    def __init__(self, factory=None, *args):
        if not isinstance(factory, Global) and factory is not None or args:
            raise MegEngineFileError("a defaultdict with a factory that is not a type name")
        super().__init__()

    def __setstate__(self, state):
        raise MegEngineFileError("the pickle builds state into a defaultdict")


def _dtype_of(code, where):
    name = _DTYPE_CODES.get(code) if isinstance(code, str) else None
    if name is None:
        raise MegEngineFileError(f"{where}: dtype {code!r} is not a plain numeric dtype "
                                 f"(one of {', '.join(sorted(set(_DTYPE_CODES.values())))})")
    return np.dtype(name)


class _DType(Stub):
    """numpy.dtype(code, align, copy) then BUILD (version, byteorder, ...):
    a numeric dtype only (no fields, no subarrays, no objects)."""

    __slots__ = ("dtype",)
    kind = "numpy.dtype"

    def __new__(cls, *args, **kwargs):
        self = super().__new__(cls, *args, **kwargs)
        if not args:
            raise MegEngineFileError("numpy.dtype made without a type code")
        self.dtype = _dtype_of(args[0], "numpy.dtype")
        return self

    def __setstate__(self, state):
        if not (isinstance(state, tuple) and len(state) >= 2 and state[1] in "<>|="
                and all(s is None for s in state[2:5])):
            raise MegEngineFileError(f"numpy.dtype state {str(state)[:80]} is not that of a "
                                     "plain numeric dtype")
        if state[1] in "<>" and self.dtype.itemsize > 1:
            self.dtype = self.dtype.newbyteorder(state[1])
        if len(state) > 9:
            raise MegEngineFileError(f"numpy.dtype state of {len(state)} items")
        if len(state) == 9 and state[8] is not None:       # version 4: the metadata
            self.dtype = np.dtype(self.dtype, metadata=_quantized_metadata(state[8],
                                                                           self.dtype))
        self.state = {}


#: MegEngine's quantized dtypes as its NumPy dtypes name them in their
#: metadata (``{"mgb_dtype": {"name": ..., "scale": ..., "zero_point": ...}}``,
#: megengine/core/tensor/dtype.py): C name -> (storage dtype, zero point?)
QUANTIZED_CNAMES = {"QuantizedS8": ("int8", False), "Quantized8Asymm": ("uint8", True),
                    "QuantizedS32": ("int32", False), "QuantizedS4": ("int8", False),
                    "Quantized4Asymm": ("uint8", True)}


def _quantized_metadata(meta, storage):
    """The metadata of a MegEngine quantized dtype, checked as data: one key
    ``mgb_dtype`` whose dict has a C name of :data:`QUANTIZED_CNAMES` that
    ``storage`` stores, a finite positive float scale and (for the
    asymmetric ones only) an int zero point. A copy of plain values."""
    if not (type(meta) is dict and set(meta) == {"mgb_dtype"}
            and type(meta["mgb_dtype"]) is dict):
        raise MegEngineFileError(f"numpy.dtype metadata {str(meta)[:80]} is not MegEngine's "
                                 "{'mgb_dtype': {...}} of a quantized dtype")
    mgb = meta["mgb_dtype"]
    name = mgb.get("name")
    if not isinstance(name, str) or name not in QUANTIZED_CNAMES:
        raise MegEngineFileError(f"quantized dtype {str(name)[:40]!r} is not one of "
                                 f"{', '.join(QUANTIZED_CNAMES)}")
    store, asymmetric = QUANTIZED_CNAMES[name]
    if storage != np.dtype(store):
        raise MegEngineFileError(f"quantized dtype {name} stored as {storage}, not {store}")
    keys = {"name", "scale", "zero_point"} if asymmetric else {"name", "scale"}
    if set(mgb) != keys:
        raise MegEngineFileError(f"quantized dtype {name} with the fields {sorted(mgb)}, not "
                                 f"{sorted(keys)}")
    scale = mgb["scale"]
    if type(scale) not in (float, int) or not (0 < scale < float("inf")):
        raise MegEngineFileError(f"quantized dtype {name}: scale {scale!r} is not a finite "
                                 "positive number")
    out = {"name": name, "scale": float(scale)}
    if asymmetric:
        zp = mgb["zero_point"]
        info = np.iinfo(store)
        if type(zp) is not int or not info.min <= zp <= info.max:
            raise MegEngineFileError(f"quantized dtype {name}: zero point {zp!r} is not an "
                                     f"int in {info.min}..{info.max}")
        out["zero_point"] = zp
    return {"mgb_dtype": out}


def _check_dtype(d, where):
    if isinstance(d, _DType):
        return d.dtype
    raise MegEngineFileError(f"{where}: a dtype is a {type(d).__name__}, not numpy.dtype")


class _Array(Stub):
    """numpy.core.multiarray._reconstruct(ndarray, (0,), b'b') then BUILD
    (version, shape, dtype, is_fortran, raw bytes): a copy of exactly those
    bytes as an array of a numeric dtype, or an error."""

    __slots__ = ("array",)
    kind = "numpy.ndarray"

    def __new__(cls, *args, **kwargs):
        self = super().__new__(cls, *args, **kwargs)
        self.array = None
        return self

    def __setstate__(self, state):
        if self.array is not None:
            raise MegEngineFileError("the pickle builds the state of an array twice")
        if not (isinstance(state, tuple) and len(state) == 5):
            raise MegEngineFileError("an array's state is not (version, shape, dtype, "
                                     "is_fortran, data)")
        _, shape, dtype, fortran, raw = state
        self.array = _array_from(shape, dtype, fortran is True, raw)
        self.state = {}


def _array_from(shape, dtype, fortran, raw):
    """A copy of the bytes ``raw`` as an array of ``shape`` and ``dtype`` (a
    numpy.dtype record), checked: a numeric dtype, at most MAX_NDIM sizes,
    exactly the bytes the shape needs."""
    dtype = _check_dtype(dtype, "array")
    if not (isinstance(shape, tuple) and len(shape) <= MAX_NDIM
            and all(type(n) is int and 0 <= n <= MAX_ELEMENTS for n in shape)):
        raise MegEngineFileError(f"an array's shape {str(shape)[:80]} is not a tuple of at "
                                 f"most {MAX_NDIM} sizes")
    count = 1
    for n in shape:
        count *= n
    if not isinstance(raw, (bytes, bytearray)):
        raise MegEngineFileError(f"an array's data is a {type(raw).__name__}, not bytes")
    if count * dtype.itemsize != len(raw):
        raise MegEngineFileError(f"an array of shape {shape} and dtype {dtype} needs "
                                 f"{count * dtype.itemsize} bytes, the file gives {len(raw)}")
    flat = np.frombuffer(raw, dtype=dtype).copy()
    if dtype.kind == "b":
        flat = flat.view(np.uint8) != 0      # a bool byte other than 0 or 1 read as True
    array = flat.reshape(shape, order="F" if fortran else "C")
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    return array


def _frombuffer(buf=None, dtype=None, shape=None, order=None, *rest):
    """numpy.core.numeric._frombuffer(buffer, dtype, shape, order): how NumPy
    pickles an array at protocol 5 (``megengine.save(..., pickle_protocol=5)``),
    the buffer in-band. The same checks as an array's BUILD."""
    if rest or order not in ("C", "F"):
        raise MegEngineFileError("numpy _frombuffer called with arguments other than "
                                 "(buffer, dtype, shape, 'C' or 'F')")
    self = _Array()
    self.array = _array_from(shape, dtype, order == "F", buf)
    self.state = {}
    return self


def _scalar(dtype, raw=None):
    """numpy.core.multiarray.scalar(dtype, bytes): a NumPy scalar."""
    dtype = _check_dtype(dtype, "numpy scalar")
    if not isinstance(raw, bytes) or len(raw) != dtype.itemsize:
        raise MegEngineFileError(f"a numpy {dtype} scalar needs {dtype.itemsize} bytes")
    if dtype.kind == "b":
        return np.bool_(raw != b"\x00")     # a bool byte other than 0 or 1 read as True
    return np.frombuffer(raw, dtype=dtype)[0]


def _type_of(value):
    """builtins.type(None) and friends: what pickle writes for NoneType."""
    for v in (None, Ellipsis, NotImplemented):
        if value is v:
            return Global("builtins", type(v).__name__)
    raise MegEngineFileError("builtins.type called on something other than None, ... or "
                             "NotImplemented")


def _stub_class(qualname):
    module, _, name = qualname.rpartition(".")
    state_type = str if name == "CompNode" else dict
    return type(name, (Stub,), {"__slots__": (), "kind": qualname, "state_type": state_type,
                                "__module__": "mgtrace.megengine.stubs"})


# MegEngine's classes whose objects a file holds: each becomes a Stub class
_OBJECT_CLASSES = [
    "megengine.tensor.Tensor", "megengine.tensor.Parameter",
    "megengine.core._imperative_rt.common.CompNode",
    "megengine.traced_module.traced_module.TracedModule",
    "megengine.traced_module.traced_module.InternalGraph",
    "megengine.traced_module.traced_module.NameSpace",
    "megengine.traced_module.serialization._ModuleState",
    "megengine.traced_module.expr.Input", "megengine.traced_module.expr.GetAttr",
    "megengine.traced_module.expr.CallMethod", "megengine.traced_module.expr.CallFunction",
    "megengine.traced_module.expr.Apply", "megengine.traced_module.expr.Constant",
    "megengine.traced_module.node.ModuleNode", "megengine.traced_module.node.TensorNode",
    "megengine.traced_module.pytree.TreeDef", "megengine.traced_module.pytree.LeafDef",
    "megengine.traced_module.pytree.ArgsIndex",
    "inspect.FullArgSpec",
    # the quantization records of QAT modules, observers and graph nodes
    "megengine.core.tensor.dtype.QuantDtypeMeta", "megengine.quantization.utils.QuantMode",
    "megengine.quantization.utils.QParams", "megengine.quantization.utils.LSQParams",
]

# types and functions a file names as data only
_DATA_GLOBALS = [
    "builtins.tuple", "builtins.list", "builtins.dict", "builtins.int", "builtins.float",
    "builtins.bool", "builtins.str", "builtins.bytes", "builtins.bytearray",
    "builtins.slice", "collections.OrderedDict",
    "megengine.module.module.Module", "megengine.traced_module.node.Node",
    "megengine.traced_module.node.NodeMixin", "megengine.core._imperative_rt.core2.Tensor",
    "megengine.core._imperative_rt.OpDef", "megengine.core._imperative_rt.ops.GetVarShape",
    "megengine.core._imperative_rt.ops.FakeQuant",
    "megengine.core._wrap.Device", "numpy.ndarray", "numpy.dtype", "numpy.number",
    "numpy.bool_",
] + [f"numpy.dtypes.{n}DType" for n in (
    # NumPy >= 1.25's dtype classes: a pytree leaf's type where a dtype is an argument
    "Bool", "Int8", "UInt8", "Int16", "UInt16", "Int32", "UInt32", "Int64", "UInt64",
    "Float16", "Float32", "Float64")]


def _latin1(text, encoding=None):
    """_codecs.encode(text, "latin1"): how protocol 2 writes bytes."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise MegEngineFileError("_codecs.encode called with other than (str, 'latin1')")
    return text.encode("latin-1")


def _bytes(*args):
    """builtins.bytes(): how protocol 2 writes b''."""
    if args:
        raise MegEngineFileError("builtins.bytes called with arguments")
    return b""


def _bytearray(raw=b""):
    """builtins.bytearray(bytes): how protocols 2 to 4 write a bytearray."""
    if not isinstance(raw, bytes):
        raise MegEngineFileError("builtins.bytearray called with other than bytes")
    return bytearray(raw)


def _allowed():
    table = {}
    for q in _OBJECT_CLASSES:
        table[tuple(q.rsplit(".", 1))] = _stub_class(q)
    for q in _DATA_GLOBALS:
        table[tuple(q.rsplit(".", 1))] = Global(*q.rsplit(".", 1))
    builders = {"collections.OrderedDict": _OrderedDict,
                "collections.defaultdict": _DefaultDict,
                "builtins.type": _type_of, "builtins.bytes": _bytes,
                "builtins.bytearray": _bytearray, "_codecs.encode": _latin1}
    for np_core in ("numpy.core.multiarray", "numpy._core.multiarray"):
        table[(np_core, "_reconstruct")] = _Array
        builders[np_core + ".scalar"] = _scalar
    for np_numeric in ("numpy.core.numeric", "numpy._core.numeric"):
        builders[np_numeric + "._frombuffer"] = _frombuffer
    table[("numpy", "dtype")] = _DType
    for q, build in builders.items():
        module, name = q.rsplit(".", 1)
        table[(module, name)] = Builder(module, name, build)
    return table


#: (module, name) -> what a GLOBAL or STACK_GLOBAL of that name gives (a Stub class,
#: a Global or a Builder); every other name is refused.
ALLOWED = _allowed()


def allow_names(qualnames):
    """Let the reader give out each of ``qualnames`` (MegEngine's functional
    functions, from the mapping table) as an inert :class:`Global`."""
    for q in qualnames:
        module, _, name = q.rpartition(".")
        ALLOWED.setdefault((module, name), Global(module, name))


def allow_classes(qualnames):
    """Let the reader build objects of each of ``qualnames`` (MegEngine's
    builtin module classes, from the mapping table: a fused module holds
    its parts as plain module objects) as inert :class:`Stub` records."""
    for q in qualnames:
        module, _, name = q.rpartition(".")
        ALLOWED.setdefault((module, name), _stub_class(q))


# Python 2's names of the builtins the table holds, as Python 3's pickler
# writes them at protocol 2 (Python's unpickler maps them back likewise)
_PY2_NAMES = {("__builtin__", "long"): ("builtins", "int"),
              ("__builtin__", "unicode"): ("builtins", "str")}


def _find(module, name, protocol=4):
    """What the table gives for the global ``module.name``, or
    ForbiddenGlobalError. Nothing is imported."""
    if not (isinstance(module, str) and isinstance(name, str)):
        raise MegEngineFileError("a global named by something other than two strings")
    if protocol < 3:
        module, name = _PY2_NAMES.get((module, name), (module, name))
        module = "builtins" if module == "__builtin__" else module
    found = ALLOWED.get((module, name))
    if found is None:
        raise ForbiddenGlobalError(
            f"the pickle names the global {module}.{name}, which is not on the list of "
            "MegEngine and NumPy names this reader knows; it was neither imported nor called")
    return found


def _is_stub_class(v):
    return isinstance(v, type) and issubclass(v, Stub)


def _check_key(key, where, budget=None):
    """A dict key or set item the reader accepts: a str, bytes, number, None,
    a record (hashed by identity) or a tuple of them, at most MAX_KEY_ITEMS
    in all (a large tuple hashed at every use would make building a dict
    quadratic)."""
    budget = budget if budget is not None else [MAX_KEY_ITEMS]
    budget[0] -= 1
    if budget[0] < 0:
        raise MegEngineFileError(f"{where}: a key of more than {MAX_KEY_ITEMS} items")
    if isinstance(key, tuple):
        for k in key:
            _check_key(k, where, budget)
    elif not (key is None or isinstance(key, (str, bytes, int, float, Global, Stub, np.generic))):
        raise MegEngineFileError(f"{where}: a key of type {type(key).__name__}")


class _Machine:
    """The pickle machine: a stack, its marks and the memo, run one opcode
    at a time over the bytes by the handlers below (``_NAME`` for opcode
    NAME). Containers are built of plain values, :class:`Stub` records,
    :class:`Global` names and arrays only; the only things called are the
    table's record classes and :class:`Builder` functions."""

    def __init__(self):
        self.stack, self.marks, self.memo = [], [], {}
        self.result, self.protocol = _NOTHING, 2

    # -- the stack
    def push(self, v):
        self.stack.append(v)

    def pop(self):
        if len(self.stack) <= (self.marks[-1] if self.marks else 0):
            raise MegEngineFileError("the stack is empty (above the last MARK)")
        return self.stack.pop()

    def top(self):
        if len(self.stack) <= (self.marks[-1] if self.marks else 0):
            raise MegEngineFileError("the stack is empty (above the last MARK)")
        return self.stack[-1]

    def pop_mark(self):
        if not self.marks:
            raise MegEngineFileError("no MARK to pop to")
        at = self.marks.pop()
        items = self.stack[at:]
        del self.stack[at:]
        return items

    # -- framing and the end
    def _PROTO(self, arg):
        if not 2 <= arg <= 5:
            raise MegEngineFileError(f"protocol {arg} (the reader reads protocols 2 to 5)")
        self.protocol = arg

    def _FRAME(self, arg):
        pass    # frames only group the bytes; their length was checked against the file

    def _STOP(self, arg):
        self.result = self.pop()

    # -- constants
    def _NONE(self, arg):
        self.push(None)

    def _NEWTRUE(self, arg):
        self.push(True)

    def _NEWFALSE(self, arg):
        self.push(False)

    def _const(self, arg):
        self.push(arg)

    _BININT = _BININT1 = _BININT2 = _LONG1 = _LONG4 = _BINFLOAT = _const
    _SHORT_BINBYTES = _BINBYTES = _BINBYTES8 = _BYTEARRAY8 = _const
    _SHORT_BINUNICODE = _BINUNICODE = _BINUNICODE8 = _const

    # -- containers
    def _EMPTY_LIST(self, arg):
        self.push([])

    def _EMPTY_TUPLE(self, arg):
        self.push(())

    def _EMPTY_DICT(self, arg):
        self.push({})

    def _EMPTY_SET(self, arg):
        self.push(set())

    def _TUPLE(self, arg):
        self.push(tuple(self.pop_mark()))

    def _tuple_of(self, n):
        items = [self.pop() for _ in range(n)]
        self.push(tuple(reversed(items)))

    def _TUPLE1(self, arg):
        self._tuple_of(1)

    def _TUPLE2(self, arg):
        self._tuple_of(2)

    def _TUPLE3(self, arg):
        self._tuple_of(3)

    def _FROZENSET(self, arg):
        items = self.pop_mark()
        for k in items:
            _check_key(k, "a frozenset item")
        self.push(frozenset(items))

    def _list(self):
        target = self.top()
        if type(target) is not list:
            raise MegEngineFileError(f"appends to a {_name_of(target)}, not a list")
        return target

    def _APPEND(self, arg):
        v = self.pop()
        self._list().append(v)

    def _APPENDS(self, arg):
        items = self.pop_mark()
        self._list().extend(items)

    def _ADDITEMS(self, arg):
        items = self.pop_mark()
        target = self.top()
        if type(target) is not set:
            raise MegEngineFileError(f"adds set items to a {_name_of(target)}, not a set")
        for k in items:
            _check_key(k, "a set item")
        target.update(items)

    def _dict(self, items):
        target = self.top()
        if type(target) not in (dict, _OrderedDict, _DefaultDict):
            raise MegEngineFileError(f"sets items of a {_name_of(target)}, not a dict")
        if len(items) % 2:
            raise MegEngineFileError("an odd number of keys and values")
        for i in range(0, len(items), 2):
            _check_key(items[i], "a dict key")
            target[items[i]] = items[i + 1]     # our own dict types: nothing runs

    def _SETITEM(self, arg):
        value = self.pop()
        key = self.pop()
        self._dict([key, value])

    def _SETITEMS(self, arg):
        self._dict(self.pop_mark())

    # -- the stack, its marks and the memo
    def _MARK(self, arg):
        self.marks.append(len(self.stack))

    def _POP(self, arg):
        if len(self.stack) > (self.marks[-1] if self.marks else 0):
            self.stack.pop()
        else:
            self.pop_mark()

    def _POP_MARK(self, arg):
        self.pop_mark()

    def _DUP(self, arg):
        self.push(self.top())

    def _put(self, index):
        if not 0 <= index <= MAX_MEMO:
            raise MegEngineFileError(f"memo index {index} is over {MAX_MEMO}")
        self.memo[index] = self.top()

    def _BINPUT(self, arg):
        self._put(arg)

    _LONG_BINPUT = _BINPUT

    def _MEMOIZE(self, arg):
        self._put(len(self.memo))

    def _BINGET(self, arg):
        if arg not in self.memo:
            raise MegEngineFileError(f"memo index {arg} was never set")
        self.push(self.memo[arg])

    _LONG_BINGET = _BINGET

    # -- names and objects
    def _GLOBAL(self, arg):
        self.push(_find(*arg, self.protocol))

    def _STACK_GLOBAL(self, arg):
        name = self.pop()
        module = self.pop()
        self.push(_find(module, name, self.protocol))

    def _REDUCE(self, arg):
        args = self.pop()
        fn = self.pop()
        if not isinstance(args, tuple):
            raise MegEngineFileError(f"REDUCE with arguments in a {_name_of(args)}, not a tuple")
        if _is_stub_class(fn):
            self.push(fn(*args))
        elif isinstance(fn, Builder):
            self.push(fn.build(*args))
        else:
            raise MegEngineFileError(f"REDUCE calls a {_name_of(fn)}; only MegEngine's record "
                                     "classes and NumPy's builders of the reader's table are "
                                     "called")

    def _new(self, cls, args, kwargs):
        if not _is_stub_class(cls):
            raise MegEngineFileError(f"NEWOBJ of a {_name_of(cls)}; only MegEngine's record "
                                     "classes of the reader's table are made")
        if not isinstance(args, tuple) or not isinstance(kwargs, dict):
            raise MegEngineFileError("NEWOBJ with arguments other than a tuple and a dict")
        self.push(cls.__new__(cls, *args, **kwargs))

    def _NEWOBJ(self, arg):
        args = self.pop()
        cls = self.pop()
        self._new(cls, args, {})

    def _NEWOBJ_EX(self, arg):
        kwargs = self.pop()
        args = self.pop()
        cls = self.pop()
        self._new(cls, args, kwargs)

    def _BUILD(self, arg):
        state = self.pop()
        target = self.top()
        if not isinstance(target, (Stub, Global, _OrderedDict, _DefaultDict)):
            raise MegEngineFileError(f"BUILD on a {_name_of(target)}: only MegEngine's records "
                                     "take state")
        target.__setstate__(state)       # a Stub's records it; the others refuse


_NOTHING = object()
_HANDLERS = {name: getattr(_Machine, "_" + name) for name, _ in OPCODES.values()}
# byte -> (name, handler) of the opcodes without an argument (the loop's fast path)
_PLAIN = [None] * 256
for _code, (_name, _read) in OPCODES.items():
    if _read is None:
        _PLAIN[_code] = (_name, _HANDLERS[_name])


def _name_of(v):
    if isinstance(v, Global):
        return v.qualname
    if isinstance(v, Stub):
        return v.kind
    return type(v).__name__


def _run(data, where):
    """The value the pickle ``data`` leaves at STOP."""
    machine, pos, count, n = _Machine(), 0, 0, len(data)
    plain, handlers = _PLAIN, _HANDLERS
    while machine.result is _NOTHING:
        count += 1
        if count > MAX_OPCODES:
            raise MegEngineFileError(f"{where}: more than {MAX_OPCODES} pickle opcodes")
        entry = plain[data[pos]] if pos < n else None
        if entry is not None:               # an opcode without an argument
            name, handler = entry
            arg, end = None, pos + 1
        else:
            try:
                name, arg, end = read_opcode(data, pos)
            except MegEngineFileError as e:
                raise MegEngineFileError(f"{where}: {e}") from None
            handler = handlers[name]
            if name == "FRAME" and arg > n - end:
                raise MegEngineFileError(f"{where}: a frame of {arg} bytes at byte {pos}, past "
                                         f"the end of the {n}-byte pickle")
            if type(arg) is int and abs(arg) >= MAX_INT:
                raise MegEngineFileError(f"{where}: an int of more than 61 bits at byte {pos} "
                                         "(ints that large collide in dicts; MegEngine's files "
                                         "hold none)")
            if type(arg) is float and MAX_INT <= abs(arg) < float("inf"):
                raise MegEngineFileError(f"{where}: a float of magnitude 2**61 or more at "
                                         f"byte {pos} (such floats collide in dicts)")
        try:
            handler(machine, arg)
        except MegEngineFileError as e:
            raise type(e)(f"{where}: {e} (opcode {name} at byte {pos})") from None
        except RecursionError:
            raise MegEngineFileError(f"{where}: nested too deeply to read (opcode {name} at "
                                     f"byte {pos})") from None
        except MemoryError:
            raise MegEngineFileError(f"{where}: needs more memory than this machine has") \
                from None
        except Exception as e:   # e.g. TypeError of a Stub called with bad arguments
            raise MegEngineFileError(f"{where}: a malformed pickle: {type(e).__name__}: "
                                     f"{str(e)[:200]} (opcode {name} at byte {pos})") from None
        pos = end
    return machine.result


def read_pickle(data, where="<bytes>"):
    """Read a MegEngine pickle from ``data`` (bytes) into plain values,
    :class:`Stub` records, :class:`Global` names and NumPy arrays.

    Raises:
        ForbiddenGlobalError: a global outside :data:`ALLOWED`.
        MegEngineFileError: anything else wrong with the bytes, naming the
            opcode and its byte offset.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"read_pickle takes bytes, got {type(data).__name__}")
    if len(data) > MAX_BYTES:
        raise MegEngineFileError(f"{where}: {len(data)} bytes, more than {MAX_BYTES}")
    return _unwrap(_run(bytes(data), where))


def _unwrap(value):
    """The arrays of array builders (only at the top: deeper ones are
    unwrapped by whoever walks the structure, through :func:`array_of`)."""
    return value.array if isinstance(value, _Array) else value


def array_of(value, where):
    """The NumPy array ``value`` stands for (an array builder, a NumPy array or
    scalar), or MegEngineFileError."""
    if isinstance(value, _Array):
        if value.array is None:
            raise MegEngineFileError(f"{where}: an array without its data")
        return value.array
    if isinstance(value, np.ndarray) and value.dtype.name in _DTYPE_CODES:
        return value
    if isinstance(value, np.generic) and value.dtype.name in _DTYPE_CODES:
        return np.asarray(value)
    raise MegEngineFileError(f"{where}: expected an array, got {type(value).__name__}")
