"""A restricted reader of the pickles MegEngine writes (``megengine.save``).

A pickle is a program: each global it names is imported and each REDUCE
calls it, so reading one with :mod:`pickle` runs whatever the file says.
This reader runs none of it. Its ``find_class`` gives out only the globals of
one table (:data:`ALLOWED`), each mapped to something of mgtrace's own:

* MegEngine's classes (Tensor, Parameter, the traced-module graph, expr, node,
  pytree and module-state classes) to :class:`Stub` subclasses: inert records
  of the arguments and the state the file gives them;
* NumPy's array, scalar and dtype reconstruction to builders that accept
  plain numeric dtypes only and copy exactly the bytes the file holds;
* ``collections.OrderedDict`` / ``defaultdict`` to plain dict subclasses;
* types and functions the file uses as data (``builtins.tuple`` in a pytree
  definition, MegEngine's builtin module classes and functional functions by
  qualified name, op classes) to inert :class:`Global` names.

Any other global is refused with :class:`ForbiddenGlobalError` naming it.
Before the unpickler runs, the opcode stream is scanned once: its size, the
number of opcodes and memo indices are bounded (a memo index of 2**32 would
make the unpickler allocate its memo table to that size), and persistent ids
and extension codes, which this format never uses, are refused. Whatever the
unpickler itself raises on a malformed stream becomes
:class:`MegEngineFileError`.
"""
import collections
import io
import pickle
import pickletools

import numpy as np

from mgtrace.errors import Error

__all__ = ["MegEngineFileError", "ForbiddenGlobalError", "Stub", "Global", "read_pickle",
           "array_of", "allow_names", "allow_classes", "ALLOWED", "MAX_BYTES", "MAX_OPCODES",
           "MAX_MEMO", "MAX_NDIM", "MAX_INT"]

MAX_BYTES = 1 << 34          # 16 GiB: a file larger than this is refused before it is read
MAX_OPCODES = 1 << 22        # opcodes of one pickle (a ResNet-50 .tm has about 60,000)
MAX_MEMO = 1 << 22           # memo index (the unpickler grows its memo table to the index)
MAX_NDIM = 16                # dimensions of one array (mgtrace's own limit)
MAX_ELEMENTS = 1 << 40       # elements of one array (the bytes must be in the file anyway)
MAX_INT = 1 << 61            # ints and floats of this magnitude hash alike (Python hashes
                             # numbers modulo 2**61 - 1): a dict of many is quadratic to build

# the dtypes an array or scalar may have: plain numbers and bool
_DTYPE_CODES = {"b1": "bool", "?": "bool", "i1": "int8", "u1": "uint8", "i2": "int16",
                "u2": "uint16", "i4": "int32", "u4": "uint32", "i8": "int64", "u8": "uint64",
                "f2": "float16", "f4": "float32", "f8": "float64"}
_DTYPE_CODES.update({v: v for v in set(_DTYPE_CODES.values())})

# opcodes the format never needs: persistent ids (torch's storages) and the
# copyreg extension registry
_REFUSED_OPCODES = {"PERSID", "BINPERSID", "EXT1", "EXT2", "EXT4", "NEXT_BUFFER",
                    "READONLY_BUFFER", "INST", "OBJ"}
_MEMO_PUTS = {"PUT", "BINPUT", "LONG_BINPUT"}


class MegEngineFileError(Error, ValueError):
    """A MegEngine file (a ``.pkl`` state dict or a ``.tm`` traced module)
    cannot be read or converted: malformed, truncated, over a bound, or
    holding something with no mgtrace counterpart. The message says what
    and where."""


class ForbiddenGlobalError(MegEngineFileError):
    """The pickle names a global outside the reader's allowlist (``os.system``,
    ``builtins.eval``, a class of another library...). Nothing it names is
    imported or called; the message names the global."""


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
    """collections.OrderedDict with no BUILD (its state is items only)."""

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
        self.state = {}


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
]

# types and functions a file names as data only
_DATA_GLOBALS = [
    "builtins.tuple", "builtins.list", "builtins.dict", "builtins.int", "builtins.float",
    "builtins.bool", "builtins.str", "builtins.bytes", "builtins.bytearray",
    "builtins.slice", "collections.OrderedDict",
    "megengine.module.module.Module", "megengine.traced_module.node.Node",
    "megengine.traced_module.node.NodeMixin", "megengine.core._imperative_rt.core2.Tensor",
    "megengine.core._imperative_rt.OpDef", "megengine.core._imperative_rt.ops.GetVarShape",
    "megengine.core._wrap.Device", "numpy.ndarray", "numpy.dtype", "numpy.number",
    "numpy.bool_",
]


def _allowed():
    table = {}
    for q in _OBJECT_CLASSES:
        table[tuple(q.rsplit(".", 1))] = _stub_class(q)
    for q in _DATA_GLOBALS:
        table[tuple(q.rsplit(".", 1))] = Global(*q.rsplit(".", 1))
    for np_core in ("numpy.core.multiarray", "numpy._core.multiarray"):
        table[(np_core, "_reconstruct")] = _Array
        table[(np_core, "scalar")] = _scalar
    for np_numeric in ("numpy.core.numeric", "numpy._core.numeric"):
        table[(np_numeric, "_frombuffer")] = _frombuffer
    table[("numpy", "dtype")] = _DType
    table[("collections", "OrderedDict")] = _OrderedDict
    table[("collections", "defaultdict")] = _DefaultDict
    table[("builtins", "type")] = _type_of
    return table


#: (module, name) -> what ``find_class`` gives for it; everything else is refused.
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


class _Unpickler(pickle.Unpickler):
    def find_class(self, module, name):
        try:
            return ALLOWED[(module, name)]
        except (KeyError, TypeError):
            pass
        raise ForbiddenGlobalError(
            f"the pickle names the global {module}.{name}, which is not on the list of "
            "MegEngine and NumPy names this reader knows; it was neither imported nor called")

    def persistent_load(self, pid):
        raise MegEngineFileError("the pickle uses persistent ids (MegEngine never writes them)")


def _scan(data, where):
    """One pass over the opcodes: bounds and refused opcodes, before anything
    is built."""
    count = 0
    try:
        for op, arg, pos in pickletools.genops(data):
            count += 1
            if count > MAX_OPCODES:
                raise MegEngineFileError(f"{where}: more than {MAX_OPCODES} pickle opcodes")
            if op.name in _REFUSED_OPCODES:
                raise MegEngineFileError(f"{where}: opcode {op.name} at byte {pos} (not used "
                                         "by MegEngine's files) is refused")
            if op.name in _MEMO_PUTS and not (isinstance(arg, int) and 0 <= arg <= MAX_MEMO):
                raise MegEngineFileError(f"{where}: memo index {str(arg)[:30]} at byte {pos} is "
                                         f"over {MAX_MEMO}")
            if op.name == "FRAME" and arg > len(data) - pos:
                raise MegEngineFileError(f"{where}: a frame of {arg} bytes at byte {pos}, past "
                                         f"the end of the {len(data)}-byte pickle")
            if type(arg) is int and abs(arg) >= MAX_INT:
                raise MegEngineFileError(f"{where}: an int of more than 61 bits at byte {pos} "
                                         "(ints that large collide in dicts; MegEngine's files "
                                         "hold none)")
            if type(arg) is float and MAX_INT <= abs(arg) < float("inf"):
                raise MegEngineFileError(f"{where}: a float of magnitude 2**61 or more at "
                                         f"byte {pos} (such floats collide in dicts)")
            if op.name == "STOP":
                return
    except MegEngineFileError:
        raise
    except Exception as e:   # genops: ValueError/EOFError on truncated or unknown opcodes
        raise MegEngineFileError(f"{where}: not a pickle: {type(e).__name__}: {e}") from None
    raise MegEngineFileError(f"{where}: not a pickle: no STOP opcode")


def read_pickle(data, where="<bytes>"):
    """Read a MegEngine pickle from ``data`` (bytes) into plain values,
    :class:`Stub` records, :class:`Global` names and NumPy arrays.

    Raises:
        ForbiddenGlobalError: a global outside :data:`ALLOWED`.
        MegEngineFileError: anything else wrong with the bytes.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"read_pickle takes bytes, got {type(data).__name__}")
    if len(data) > MAX_BYTES:
        raise MegEngineFileError(f"{where}: {len(data)} bytes, more than {MAX_BYTES}")
    data = bytes(data)
    _scan(data, where)
    try:
        value = _Unpickler(io.BytesIO(data)).load()
    except ForbiddenGlobalError as e:
        raise ForbiddenGlobalError(f"{where}: {e}") from None
    except MegEngineFileError as e:
        raise MegEngineFileError(f"{where}: {e}") from None
    except RecursionError:
        raise MegEngineFileError(f"{where}: nested too deeply to read") from None
    except MemoryError:
        raise MegEngineFileError(f"{where}: needs more memory than this machine has") from None
    except Exception as e:
        raise MegEngineFileError(f"{where}: a malformed pickle: {type(e).__name__}: "
                                 f"{str(e)[:200]}") from None
    return _unwrap(value)


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
