# cython: language_level=3, boundscheck=False, wraparound=False
"""dtypes and MegEngine's promotion rule.

A dtype is a NumPy dtype object (bfloat16 comes from ml_dtypes); inside the
core it is a small integer code, whose order matches kernels/contract/mt_types.h.
ml_dtypes is imported on first need only (a bfloat16 tensor, array or dtype
met or asked for: :func:`np_dtype`), since importing it registers NumPy
ufuncs and costs about half of ``import mgtrace``.

Promotion (MegEngine's rule, as DESIGN.md states it): every operand has a
category, complex (4) > float (3) > integer (2) > bool (1). Tensors, NumPy
arrays and NumPy scalars count as *tensors*; Python ``bool``/``int``/
``float``/``complex`` count as *scalars* and stand for bool/int32/float32/
complex64. If the highest scalar category is
above the highest tensor category, the result is the promotion of the scalars
of that category; otherwise it is the NumPy ``promote_types`` of the tensors
of the highest tensor category. Examples (the table tests/core/test_promotion
checks, and the docs show)::

    int8 tensor + 3             -> int8
    int8 tensor + 3.0           -> float32
    float16 tensor * 3.0        -> float16
    int32 tensor + float16 tensor -> float16
    uint8 tensor + int8 tensor  -> int16
    bool tensor + bool tensor   -> bool
    bool tensor + 1             -> int32
    float32 tensor + 1j         -> complex64
    float64 tensor + complex64 tensor -> complex64
    complex64 tensor + complex128 tensor -> complex128

Complex (complex64, complex128; MegEngine 1.13 has complex64) is the
category above float: the rule above applies unchanged, so a complex
operand wins over every real one and a Python complex stands for complex64
(MegEngine's only complex dtype) as a Python float stands for float32.

A Python int that does not fit the chosen integer dtype raises OverflowError
(NumPy 2 does the same); an in-range one takes the tensor's dtype and the
arithmetic wraps.
"""
import sys

import numpy as np

from mgtrace._core.kernels cimport MT_NDTYPES, MT_BFLOAT16

NDTYPES = MT_NDTYPES
NAMES = ("bool", "int8", "uint8", "int16", "uint16", "int32", "int64",
         "float16", "bfloat16", "float32", "float64", "complex64", "complex128")
cdef int BFLOAT16 = MT_BFLOAT16
# NumPy dtypes by code; bfloat16's (None here) is made by np_dtype on first need
NP_DTYPES = [None if n == "bfloat16" else np.dtype(n) for n in NAMES]

cdef dict _lookup = {}
for _code, _name in enumerate(NAMES):
    _lookup[_name] = _code
    _dt = NP_DTYPES[_code]
    if _dt is None:         # bfloat16: 2 bytes, a float
        ITEMSIZE[_code], CATEGORY[_code] = 2, 3
        continue
    ITEMSIZE[_code] = _dt.itemsize
    CATEGORY[_code] = 1 if _code == 0 else {"f": 3, "c": 4}.get(_dt.kind, 2)
    _lookup[_dt] = _code
    _lookup[_dt.type] = _code


cdef object _load_bfloat16():
    import ml_dtypes
    dt = np.dtype(ml_dtypes.bfloat16)
    _lookup[dt] = BFLOAT16
    _lookup[dt.type] = BFLOAT16
    NP_DTYPES[BFLOAT16] = dt
    return dt


cdef object np_dtype(int code):
    """The NumPy dtype of core code ``code`` (bfloat16's imports ml_dtypes
    the first time it is needed)."""
    dt = NP_DTYPES[code]
    return dt if dt is not None else _load_bfloat16()


def __getattr__(name):
    # DTYPES (every dtype as a NumPy dtype) is made when first asked for, so
    # that importing the core does not import ml_dtypes (PEP 562)
    if name == "DTYPES":
        return tuple([np_dtype(c) for c in range(MT_NDTYPES)])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

# NumPy's promote_types within a category; bfloat16 is not in NumPy's table:
# bfloat16 with float16 needs float32 to hold both, as in JAX and PyTorch.
for _i in range(MT_NDTYPES):
    for _j in range(MT_NDTYPES):
        if CATEGORY[_i] != CATEGORY[_j]:
            # read only within one category (promote_operands); kept sane anyway
            _res = NAMES[_i] if CATEGORY[_i] > CATEGORY[_j] else NAMES[_j]
        elif _i == BFLOAT16 or _j == BFLOAT16:
            _other = NAMES[_j] if NAMES[_i] == "bfloat16" else NAMES[_i]
            _res = {"bfloat16": "bfloat16", "float16": "float32",
                    "float32": "float32", "float64": "float64"}.get(_other, "bfloat16")
        else:
            _res = np.promote_types(NP_DTYPES[_i], NP_DTYPES[_j]).name
        # uint16 + int8/int16 stays within the table; unsigned 64 never occurs
        PROMOTE[_i][_j] = NAMES.index(_res) if _res in NAMES else 6


cdef int dtype_code(object dtype) except -1:
    """The core's code for ``dtype`` (a NumPy dtype, a name, or a type)."""
    code = _lookup.get(dtype)
    if code is not None:
        return code
    if NP_DTYPES[BFLOAT16] is None and "ml_dtypes" in sys.modules:
        # the caller imported ml_dtypes: its bfloat16 type or dtype may be meant
        _load_bfloat16()
        code = _lookup.get(dtype)
        if code is not None:
            return code
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"not a dtype: {dtype!r}; expected one of {', '.join(NAMES)}") from None
    code = _lookup.get(dt)
    if code is None and not dt.isnative and _lookup.get(dt.newbyteorder("=")) is not None:
        # tensors hold native byte order; data in another one is converted where it is copied
        raise TypeError(f"dtype {dt.str!r} ({dt.name}) is not in native byte order; mgtrace "
                        f"holds {dt.newbyteorder('=').str!r}: pass {dt.name!r}, or convert an "
                        f"array with arr.astype(arr.dtype.newbyteorder('='))")
    if code is None:
        raise TypeError(f"unsupported dtype {dt.name!r}; mgtrace supports {', '.join(NAMES)}")
    return code


cdef object native_order(object dt):
    """``dt`` (a NumPy dtype) in native byte order: the dtype an array of it
    becomes when it is copied into a tensor."""
    return dt if dt.isnative else dt.newbyteorder("=")


def as_dtype(dtype):
    """Normalise ``dtype`` (name, type or NumPy dtype) to a NumPy dtype.

    Raises TypeError for anything that is not one of mgtrace's dtypes."""
    return np_dtype(dtype_code(dtype))


cdef int scalar_code(object value) noexcept:
    """Code a Python scalar stands for, or -1 if ``value`` is not one."""
    cdef type t = type(value)
    if t is float:
        return 9
    if t is int:
        return 5
    if t is bool:
        return 0
    if isinstance(value, bool):
        return 0
    if isinstance(value, int) and not isinstance(value, np.integer):
        return 5
    if isinstance(value, float) and not isinstance(value, np.floating):
        return 9
    if isinstance(value, complex) and not isinstance(value, np.complexfloating):
        return 11
    return -1


cdef int float_result(int code) noexcept:
    """dtype of a FLOAT-rule op (true division, exp, mean...) on ``code``:
    float and complex dtypes keep theirs, integers and bool give float32."""
    return code if CATEGORY[code] >= 3 else 9


cdef dict _INT_RANGE = {}
for _code, _dt in enumerate(NP_DTYPES):
    if _dt is not None and _dt.kind in "iu":
        _info = np.iinfo(_dt)
        _INT_RANGE[_code] = (int(_info.min), int(_info.max))


cdef void check_scalar_fits(object value, int code) except *:
    """OverflowError when a Python int does not fit integer dtype ``code``."""
    rng = _INT_RANGE.get(code)
    if rng is None or type(value) is bool:
        return
    lo, hi = rng
    if not lo <= value <= hi:
        raise OverflowError(
            f"Python integer {value} out of bounds for {NAMES[code]} "
            f"(range {lo}..{hi}); cast the tensor to a wider dtype first")


cdef int _operand_code(object x, bint *is_scalar) except -1:
    code = scalar_code(x)
    if code >= 0:
        is_scalar[0] = True
        return code
    is_scalar[0] = False
    dt = getattr(x, "dtype", None)
    if dt is None:
        if isinstance(x, (list, tuple)):
            # Python data gets MegEngine's defaults, as when ops convert it
            kind = np.asarray(x).dtype.kind if len(x) else "f"
            if kind in "iu":
                return 5
            if kind == "b":
                return 0
            if kind == "f":
                return 9
            if kind == "c":
                return 11
            raise TypeError(f"operand list of {np.asarray(x).dtype} has no mgtrace dtype")
        raise TypeError(f"operand of type {type(x).__name__} has no dtype")
    # an array operand is copied into a tensor (dispatch.coerce), in native byte order
    return dtype_code(native_order(dt) if isinstance(dt, np.dtype) else dt)


cdef int promote_operands(tuple operands) except -1:
    cdef int best_t = -1, best_s = -1, code, cat_t = 0, cat_s = 0
    cdef bint is_scalar
    for x in operands:
        if x is None:
            continue
        code = _operand_code(x, &is_scalar)
        if is_scalar:
            if CATEGORY[code] > cat_s:
                cat_s = CATEGORY[code]
                best_s = code
        else:
            if CATEGORY[code] > cat_t:
                cat_t = CATEGORY[code]
                best_t = code
            elif CATEGORY[code] == cat_t:
                best_t = PROMOTE[best_t][code]
    if best_t < 0 and best_s < 0:
        raise TypeError("dtype promotion needs at least one operand with a dtype")
    if cat_s > cat_t:
        return best_s
    return best_t


def dtype_promotion(*operands):
    """Result dtype of an op on ``operands`` by MegEngine's promotion rule.

    Args:
        *operands: Tensors, NumPy arrays or scalars ("tensors"), and Python
            bool/int/float ("scalars").

    Returns:
        numpy.dtype: see the module docstring for the rule and examples.

    Raises:
        TypeError: no operand carries a dtype, or one has an unsupported dtype.

    >>> import mgtrace as mt
    >>> mt.dtype_promotion(mt.tensor([1, 2], dtype="int16"), 1.0)
    dtype('float32')
    """
    return np_dtype(promote_operands(operands))


# MegEngine's C names of the quantized dtypes -> mgtrace's (and MegEngine's
# Python) names; qint8_narrow shares QuantizedS8 and is told apart by the
# "mgtrace" entry of the metadata (mgtrace.quantization.qdtype makes them)
_QUANTIZED_NAMES = {"QuantizedS8": "qint8", "Quantized8Asymm": "quint8",
                    "QuantizedS32": "qint32", "QuantizedS4": "qint4",
                    "Quantized4Asymm": "quint4"}


def qdtype_name(dtype):
    """The quantized dtype name (``"qint8"``, ``"qint8_narrow"``,
    ``"quint8"``, ``"qint32"``, ``"qint4"``, ``"quint4"``) of a NumPy dtype
    carrying MegEngine's ``{"mgb_dtype": {...}}`` metadata, else None."""
    meta = getattr(dtype, "metadata", None)
    if meta is None or "mgb_dtype" not in meta:
        return None
    return meta.get("mgtrace") or _QUANTIZED_NAMES.get(meta["mgb_dtype"].get("name"))


def qdtype_str(dtype):
    """``"qint8(scale=0.1)"``, ``"quint8(scale=0.1, zero_point=128)"`` for a
    quantized dtype; the plain name (``"float32"``) for any other."""
    name = qdtype_name(dtype)
    if name is None:
        return np.dtype(dtype).name if dtype is not None else "None"
    m = dtype.metadata["mgb_dtype"]
    text = f"{name}(scale={str(np.float32(m['scale']))}"
    if "zero_point" in m:
        text += f", zero_point={m['zero_point']}"
    return text + ")"
