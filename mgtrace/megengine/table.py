"""The one table from MegEngine 1.13's names to mgtrace's.

Three closed sets, each keyed by MegEngine's qualified name:

* :data:`MODULES`: builtin module classes (``megengine.module.conv.Conv2d``)
  -> how to build the mgtrace module from the state MegEngine saved (the
  module's ``__dict__``); also the QAT and quantized modules
  (``megengine.module.qat.*``, ``megengine.module.quantized.*``) and the
  observers and fake quantizers (``megengine.quantization.*``), which a QAT
  module holds as children;
* :data:`FUNCTIONS`: functional functions (``megengine.functional.nn.relu``)
  -> the mgtrace function and how MegEngine's parameters map onto it;
* :data:`TENSOR_METHODS`: Tensor method names (``reshape``, ``__add__``)
  that mgtrace's Tensor has with MegEngine's meaning.

Anything outside them is an error naming it (:class:`UnsupportedError`):
nothing a file names is looked up anywhere else.
"""
import inspect

import numpy as np

import mgtrace.functional as F
import mgtrace.module as M
import mgtrace.module.qat as _QAT
import mgtrace.module.quantized as _QM
import mgtrace.quantization as _Q
from mgtrace._core import tensor as _tensor
from mgtrace.megengine.reader import (MegEngineFileError, Stub, allow_classes, allow_names,
                                      array_of)

__all__ = ["UnsupportedError", "MODULES", "FUNCTIONS", "TENSOR_METHODS", "module_rule",
           "module_record", "function_rule", "tensor_array"]


class UnsupportedError(MegEngineFileError):
    """The file uses a MegEngine module class, function, Tensor method or
    op that has no mgtrace counterpart in :mod:`mgtrace.megengine.table`
    (or a setting of one that mgtrace cannot reproduce); the message names
    it."""


# ------------------------------------------------------------------ modules

class ModuleRule:
    """How one MegEngine builtin module class becomes an mgtrace module:
    ``make(state, where)`` builds it from MegEngine's saved ``__dict__``
    (its tensors are loaded afterwards, in MegEngine's layout); ``tensors``
    names the state entries that are its parameters and buffers (or is a
    function ``(state, where) -> {name: array}`` making them), and
    ``children`` the entries that are modules of its own (a fused module's
    ``conv`` and ``bn``, a QAT module's observers; None where absent), whose
    tensors load under their name. With ``own_tensors`` (the quantized
    modules), ``make`` gives the module its tensors itself."""

    def __init__(self, cls, make, tensors=("weight", "bias"), children=(), own_tensors=False):
        self.cls, self.make, self.tensors, self.children = cls, make, tensors, children
        self.own_tensors = own_tensors


_STATE = "megengine.traced_module.serialization._ModuleState"


def module_record(v, where):
    """``(qualname, state)`` of a MegEngine builtin module as a file holds
    it: a ``_ModuleState`` (what a TracedModule saves) or the module object
    itself (the parts of a fused module)."""
    if isinstance(v, Stub) and v.kind == _STATE:
        typ, state = v.get("module"), v.get("state")
        if not (isinstance(typ, tuple) and len(typ) == 2 and all(isinstance(t, str)
                                                                  for t in typ)):
            raise MegEngineFileError(f"{where}: a module state without its (module, class)")
        qualname = ".".join(typ)
    elif isinstance(v, Stub) and v.kind in MODULES:
        qualname, state = v.kind, v.state
    else:
        raise MegEngineFileError(f"{where}: expected a MegEngine module, got "
                                 f"{v.kind if isinstance(v, Stub) else type(v).__name__}")
    if not isinstance(state, dict):
        raise MegEngineFileError(f"{where}: a module whose state is not a dict")
    return qualname, state


_QMETA = "megengine.core.tensor.dtype.QuantDtypeMeta"
_QMODE = "megengine.quantization.utils.QuantMode"
_QPARAMS = ("megengine.quantization.utils.QParams", "megengine.quantization.utils.LSQParams")
_TENSOR_KINDS = ("megengine.tensor.Tensor", "megengine.tensor.Parameter")


def tensor_array(stub, where):
    """The array of a MegEngine Tensor / Parameter record (its first
    argument; a quantized one's dtype carries MegEngine's metadata). The
    ``qparams`` MegEngine keeps on a fake-quantized float tensor are
    metadata of the value that made it and are dropped; anything else in a
    tensor's state is an error."""
    if isinstance(stub, Stub) and stub.kind in _TENSOR_KINDS:
        state = stub.state or {}
        if set(state) - {"qparams"}:
            raise MegEngineFileError(f"{where}: a Tensor with the state {sorted(state)}")
        q = state.get("qparams")
        if q is not None and not (isinstance(q, Stub) and q.kind in _QPARAMS):
            raise MegEngineFileError(f"{where}: a Tensor whose qparams are a "
                                     f"{getattr(q, 'kind', type(q).__name__)}")
        if not stub.args:
            raise MegEngineFileError(f"{where}: a Tensor without data")
        return array_of(stub.args[0], where)
    return array_of(stub, where)


_tensor_array = tensor_array


def _part(s, key, where):
    """The mgtrace module made from MegEngine module ``s[key]`` (a fused
    module's part)."""
    qualname, state = module_record(_need(s, key, where), f"{where}.{key}")
    return module_rule(qualname).make(state, f"{where}.{key}")


def _new(cls, *args, **kwargs):
    """``cls(*args, **kwargs)`` without its parameters' initialisation: the
    file's tensors replace them at once, and sizes that do not fit the
    file's tensors cost no time or touched memory before load_state_dict
    says so (a file cannot make the converter fill gigabytes)."""
    m = cls.__new__(cls)
    m.__dict__["reset_parameters"] = lambda: None
    try:
        cls.__init__(m, *args, **kwargs)
    finally:
        m.__dict__.pop("reset_parameters", None)
    return m


def _need(state, key, where):
    if key not in state:
        raise MegEngineFileError(f"{where}: the saved module has no {key!r}")
    return state[key]


def _only(state, key, allowed, where, default=None):
    value = state.get(key, default)
    if value not in allowed:
        raise UnsupportedError(f"{where}: {key}={value!r} has no mgtrace counterpart "
                               f"(supported: {', '.join(map(repr, allowed))})")
    return value


def _conv(cls):
    def make(s, where):
        _only(s, "conv_mode", ("cross_correlation", "CROSS_CORRELATION"), where,
              "cross_correlation")
        kw = dict(in_channels=_need(s, "in_channels", where),
                  out_channels=_need(s, "out_channels", where),
                  kernel_size=_need(s, "kernel_size", where), stride=s.get("stride", 1),
                  padding=s.get("padding", 0), dilation=s.get("dilation", 1),
                  groups=s.get("groups", 1), bias=s.get("bias") is not None)
        if issubclass(cls, M.ConvTranspose2d):
            kw["output_padding"] = s.get("output_padding", 0)
        else:
            kw["padding_mode"] = _only(s, "padding_mode", ("zeros", "reflect", "replicate"),
                                       where, "zeros")
        return _new(cls, **kw)
    return ModuleRule(cls, make)


def _batch_norm(cls):
    def make(s, where):
        momentum = s.get("momentum", 0.9)
        return _new(cls, _need(s, "num_features", where), eps=s.get("eps", 1e-5),
                   # MegEngine's momentum weighs the old running value: PyTorch's is 1 - it
                   momentum=None if momentum is None else 1.0 - momentum,
                   affine=s.get("affine", True),
                   track_running_stats=s.get("track_running_stats", True))
    return ModuleRule(cls, make, ("weight", "bias", "running_mean", "running_var"))


def _avg_pool(s, where):
    mode = _only(s, "mode", ("average_count_exclude_padding", "average"), where,
                 "average_count_exclude_padding")
    return M.AvgPool2d(_need(s, "kernel_size", where), stride=s.get("stride"),
                       padding=s.get("padding", 0), count_include_pad=mode == "average")


def _embedding(s, where):
    if s.get("max_norm") is not None:
        raise UnsupportedError(f"{where}: Embedding(max_norm=...) has no mgtrace counterpart")
    return _new(M.Embedding, _need(s, "num_embeddings", where),
                _need(s, "embedding_dim", where), padding_idx=s.get("padding_idx"))


def _conv_bn(cls, key="conv", layer=M.Conv2d, norm=M.BatchNorm2d):
    """A fused module of parts ``key`` (a ``layer``) and ``bn`` (a ``norm``):
    ConvBn2d's conv, ConvTransposeBn2d's conv_transpose2d, LinearBn1d's
    linear."""
    def make(s, where):
        part, bn = _part(s, key, where), _part(s, "bn", where)
        if type(part) is not layer or type(bn) is not norm:
            raise UnsupportedError(f"{where}: a fused module of a {type(part).__name__} and a "
                                   f"{type(bn).__name__}")
        return _new(cls, **part.config(), eps=bn.eps, momentum=bn.momentum, affine=bn.affine,
                   track_running_stats=bn.track_running_stats)
    return ModuleRule(cls, make, (), (key, "bn"))


def _batch_matmul(cls):
    def make(s, where):
        mode = _only(s, "nonlinear_mode", ("identity", "relu"), where, "identity")
        return _new(cls, _need(s, "batch", where), _need(s, "in_features", where),
                   _need(s, "out_features", where), bias=s.get("bias") is not None,
                   nonlinear_mode=mode)
    return ModuleRule(cls, make)


def _stateless(cls):
    return ModuleRule(cls, lambda s, where: cls(), ())


def _linear(cls):
    return ModuleRule(cls, lambda s, w: _new(cls, _need(s, "in_features", w),
                                             _need(s, "out_features", w),
                                             bias=s.get("bias") is not None))


_MM = "megengine.module."

#: MegEngine builtin module class -> ModuleRule
MODULES = {
    _MM + "linear.Linear": _linear(M.Linear),
    _MM + "conv.Conv1d": _conv(M.Conv1d),
    _MM + "conv.Conv2d": _conv(M.Conv2d),
    _MM + "conv.ConvTranspose2d": _conv(M.ConvTranspose2d),
    _MM + "batchnorm.BatchNorm1d": _batch_norm(M.BatchNorm1d),
    _MM + "batchnorm.BatchNorm2d": _batch_norm(M.BatchNorm2d),
    _MM + "normalization.LayerNorm": ModuleRule(M.LayerNorm, lambda s, w: _new(M.LayerNorm,
        tuple(_need(s, "normalized_shape", w)), eps=s.get("eps", 1e-5),
        elementwise_affine=s.get("affine", True))),
    _MM + "normalization.GroupNorm": ModuleRule(M.GroupNorm, lambda s, w: _new(M.GroupNorm,
        _need(s, "num_groups", w), _need(s, "num_channels", w), eps=s.get("eps", 1e-5),
        affine=s.get("affine", True))),
    _MM + "embedding.Embedding": ModuleRule(M.Embedding, _embedding, ("weight",)),
    _MM + "pooling.MaxPool2d": ModuleRule(M.MaxPool2d, lambda s, w: M.MaxPool2d(
        _need(s, "kernel_size", w), stride=s.get("stride"), padding=s.get("padding", 0)), ()),
    _MM + "pooling.AvgPool2d": ModuleRule(M.AvgPool2d, _avg_pool, ()),
    _MM + "adaptive_pooling.AdaptiveAvgPool2d": ModuleRule(
        M.AdaptiveAvgPool2d, lambda s, w: M.AdaptiveAvgPool2d(_need(s, "oshp", w)), ()),
    _MM + "dropout.Dropout": ModuleRule(
        M.Dropout, lambda s, w: M.Dropout(s.get("drop_prob", 0.0)), ()),
    _MM + "activation.Softmax": ModuleRule(
        M.Softmax, lambda s, w: M.Softmax(s.get("axis")), ()),
    _MM + "activation.ReLU": _stateless(M.ReLU),
    _MM + "activation.LeakyReLU": ModuleRule(
        M.LeakyReLU, lambda s, w: M.LeakyReLU(s.get("negative_slope", 0.01)), ()),
    _MM + "activation.PReLU": ModuleRule(
        M.PReLU, lambda s, w: _new(M.PReLU, s.get("num_parameters", 1), s.get("init", 0.25)),
        ("weight",)),
    _MM + "activation.Sigmoid": _stateless(M.Sigmoid),
    _MM + "activation.SiLU": _stateless(M.SiLU),
    _MM + "activation.GELU": _stateless(M.GELU),
    _MM + "identity.Identity": _stateless(M.Identity),
    _MM + "quant_dequant.QuantStub": _stateless(M.QuantStub),
    _MM + "quant_dequant.DequantStub": _stateless(M.DequantStub),
    _MM + "conv.ConvRelu2d": _conv(M.ConvRelu2d),
    _MM + "conv_bn.ConvBn2d": _conv_bn(M.ConvBn2d),
    _MM + "conv_bn.ConvBnRelu2d": _conv_bn(M.ConvBnRelu2d),
    _MM + "elemwise.Elemwise": ModuleRule(
        M.Elemwise, lambda s, w: M.Elemwise(_need(s, "method", w)), ()),
    _MM + "batch_matmul_activation.BatchMatMulActivation": _batch_matmul(
        M.BatchMatMulActivation),
    _MM + "conv.ConvTransposeRelu2d": _conv(M.ConvTransposeRelu2d),
    **{_MM + "conv_transpose_bn." + c.__name__: _conv_bn(c, "conv_transpose2d",
                                                         M.ConvTranspose2d)
       for c in (M.ConvTransposeBn2d, M.ConvTransposeBnRelu2d)},
    **{_MM + "linear_bn." + c.__name__: _conv_bn(c, "linear", M.Linear, M.BatchNorm1d)
       for c in (M.LinearBn1d, M.LinearBnRelu1d)},
    _MM + "concat.Concat": _stateless(M.Concat),
}


# ------------------------------------------------------------ quantization
# MegEngine's observers and fake quantizers (megengine.quantization), QAT
# modules (megengine.module.qat) and quantized modules
# (megengine.module.quantized), each to mgtrace's class of the same name.
# A QAT module's state is its float module's plus the four quantization
# children (each a module object, or None); a quantized module's is its
# settings, its int8 ``weight`` (the scale in the weight's dtype), a float
# ``bias`` and ``output_dtype``, a quantized dtype (or None: float out).

def _meta_name(v, where):
    """The quantized dtype name of MegEngine's QuantDtypeMeta record ``v``
    (``QuantDtypeMeta(name, cname, np_dtype, qmin, qmax, is_unsigned)``),
    checked against mgtrace's table of the same dtypes."""
    args = v.args if isinstance(v, Stub) and v.kind == _QMETA else None
    if not (isinstance(args, tuple) and len(args) == 6 and isinstance(args[0], str)):
        raise MegEngineFileError(f"{where}: a quantized dtype that is not a QuantDtypeMeta "
                                 "(name, cname, np_dtype, qmin, qmax, is_unsigned)")
    meta = _Q.QUANT_DTYPES.get(args[0])
    if meta is None or tuple(args[1:]) != (meta.cname, meta.np_dtype_str, meta.qmin,
                                           meta.qmax, meta.is_unsigned):
        raise UnsupportedError(f"{where}: quantized dtype {str(args)[:120]} is not one of "
                               f"mgtrace's ({', '.join(_Q.QUANT_DTYPES)})")
    return meta.name


def _quant_mode(v, where, default=None):
    """QuantMode of MegEngine's QuantMode record (``QuantMode(1)``: symmetric,
    ``QuantMode(2)``: asymmetric)."""
    if v is None and default is not None:
        return default
    if not (isinstance(v, Stub) and v.kind == _QMODE and v.args in ((1,), (2,))):
        raise MegEngineFileError(f"{where}: a mode that is not QuantMode(1) or QuantMode(2)")
    return _Q.QuantMode(v.args[0])


def _scalar_of(v, where):
    """A finite Python float from a MegEngine Tensor record of one value (an
    observer's momentum, LSQ's eps) or a plain number."""
    value = None
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        value = float(v)
    elif isinstance(v, Stub) and v.kind in _TENSOR_KINDS and v.args:
        a = array_of(v.args[0], where)
        if a.size == 1 and a.dtype.kind == "f":
            value = float(a.reshape(()))
    if value is None or not np.isfinite(value):
        raise MegEngineFileError(f"{where}: expected one finite float")
    return value


def _flag(s, key, where, default=True):
    v = s.get(key, default)
    if type(v) is not bool:
        raise MegEngineFileError(f"{where}: {key} is a {type(v).__name__}, not a bool")
    return v


def _observer(cls, extra=()):
    def make(s, where):
        kw = dict(dtype=_meta_name(_need(s, "dtype", where), f"{where}.dtype"),
                  enable=_flag(s, "enabled", where),
                  enable_mode=_flag(s, "training", where))
        if cls is not _Q.PassiveObserver:
            eps = s.get("scale_limit", 1e-5)
            if type(eps) not in (int, float) or not eps >= 0:
                raise MegEngineFileError(f"{where}: scale_limit {eps!r} is not a number >= 0")
            kw.update(mode=_quant_mode(s.get("mode"), f"{where}.mode"), eps=float(eps))
        if "momentum" in extra:
            kw["momentum"] = _scalar_of(_need(s, "momentum", where), f"{where}.momentum")
        if "bins" in extra:
            for k in ("bins", "upsample_rate"):
                if type(s.get(k)) is not int or not 0 < s[k] <= 1 << 20:
                    raise MegEngineFileError(f"{where}: {k} {s.get(k)!r} is not an int in "
                                             "1..2**20")
                kw[k] = s[k]
        return cls(**kw)
    tensors = {(): ("min_val", "max_val"), ("momentum",): ("min_val", "max_val",
                                                           "runtime_momentum"),
               ("bins",): ("min_val", "max_val", "histogram")}[tuple(extra)]
    return ModuleRule(cls, make, tensors)


def _qparams_of(v, where, meta_name):
    """mgtrace QParams of MegEngine's QParams record (state: mode,
    dtype_meta, scale, zero_point), for an observer of dtype ``meta_name``."""
    if not (isinstance(v, Stub) and v.kind == _QPARAMS[0] and isinstance(v.state, dict)):
        raise MegEngineFileError(f"{where}: qparams that are not a QParams record")
    mode = _quant_mode(v.state.get("mode"), f"{where}.mode")
    meta = v.state.get("dtype_meta")
    if meta is not None and _meta_name(meta, f"{where}.dtype_meta") != meta_name:
        raise MegEngineFileError(f"{where}: qparams for another dtype than {meta_name}")
    scale = tensor_array(v.state.get("scale"), f"{where}.scale")
    zp = v.state.get("zero_point")
    zp = None if zp is None else tensor_array(zp, f"{where}.zero_point")
    if scale.dtype.kind != "f" or scale.size != 1 or not np.all(
            np.isfinite(scale) & (scale > 0)):
        raise MegEngineFileError(f"{where}: a scale that is not one finite positive float")
    if zp is not None and (zp.size != 1 or zp.dtype.kind not in "fiu"
                           or not np.all(np.isfinite(zp))):
        raise MegEngineFileError(f"{where}: a zero point that is not one number")
    return _Q.create_qparams(mode, meta_name, scale=np.float32(scale.reshape(())),
                             zero_point=None if zp is None else np.float32(zp.reshape(())))


def _passive(s, where):
    """MegEngine's PassiveObserver (EasyQuant's): the qparams it holds (and
    the scale they started from) are its state; not a builtin, so a trace
    keeps them as a FakeQuantize's, as for any observer mgtrace does not
    store."""
    name = _meta_name(_need(s, "dtype", where), f"{where}.dtype")
    m = _Q.PassiveObserver(name, enable=_flag(s, "enabled", where),
                           enable_mode=_flag(s, "training", where))
    if s.get("qparams") is not None:
        m.set_qparams(_qparams_of(s["qparams"], f"{where}.qparams", name))
        orig = s.get("orig_scale")
        if orig is not None:
            orig = np.asarray(array_of(orig, f"{where}.orig_scale"), np.float32)
            if orig.size != 1:
                raise MegEngineFileError(f"{where}: orig_scale of {orig.size} values")
            m.orig_scale = orig.reshape(())
    return m


def _carrier(s, where):
    """MegEngine's traced-module FakeQuantize (what its trace puts where a
    QAT module had a user's observer or fake quantizer): mgtrace's
    FakeQuantize carrying the same qparams (what mgtrace's trace puts
    there)."""
    name = _meta_name(_need(s, "dtype", where), f"{where}.dtype")
    m = _Q.FakeQuantize(name, enable=_flag(s, "enabled", where))
    if s.get("qparams") is not None:
        m.set_qparams(_qparams_of(s["qparams"], f"{where}.qparams", name))
    return m


def _carrier_tensors(s, where):
    """The carrier's buffers as set_qparams makes them (the rule's tensors)."""
    if s.get("qparams") is None:
        return {}
    m = _carrier(s, where)
    return {"scale": m.scale.numpy(), "zero_point": m.zero_point.numpy()}


def _fake_quant(cls, tensors=()):
    def make(s, where):
        kw = dict(dtype=_meta_name(_need(s, "dtype", where), f"{where}.dtype"),
                  enable=_flag(s, "enabled", where))
        if cls is _Q.LSQ:
            kw["eps"] = _scalar_of(_need(s, "eps", where), f"{where}.eps")
            mode = s.get("mode")
            kw["mode"] = None if mode is None else _quant_mode(mode, f"{where}.mode")
        return cls(**kw)
    return ModuleRule(cls, make, tensors)


_QUANT_CHILDREN = ("weight_observer", "weight_fake_quant", "act_observer", "act_fake_quant")
_QUANTIZERS = (_Q.Observer, _Q.FakeQuantize, _Q.TQT, _Q.LSQ)


def _qat(rule, cls):
    """The rule of a QAT module: ``rule`` (its float module's, building
    ``cls``) and the quantization children MegEngine saved (None, or an
    observer or fake quantizer of :data:`MODULES`)."""
    def make(s, where):
        m = rule.make(s, where)
        for name in _QUANT_CHILDREN:
            # (a child the module never uses, as a Concat's weight observer, is kept too,
            # as MegEngine keeps it: its state dict has its tensors)
            v = s.get(name)
            if v is None:
                setattr(m, name, None)
                continue
            qualname, state = module_record(v, f"{where}.{name}")
            child = module_rule(qualname).make(state, f"{where}.{name}")
            if not isinstance(child, _QUANTIZERS):
                raise MegEngineFileError(f"{where}.{name} is a {qualname}, not an observer or "
                                         "fake quantizer")
            setattr(m, name, child)
        return m
    return ModuleRule(cls, make, rule.tensors, rule.children + _QUANT_CHILDREN)


def _output_qparams(s, where):
    """``act_qparams`` (mgtrace's config form) of a quantized module's
    ``output_dtype``: None (float out), or qint8 / quint8 with its scale and
    zero point."""
    d = s.get("output_dtype")
    if d is None:
        return None
    dtype = d.dtype if isinstance(d, Stub) and d.kind == "numpy.dtype" else None
    mgb = (dtype.metadata or {}).get("mgb_dtype") if dtype is not None else None
    if mgb is None:
        got = dtype if dtype is not None else getattr(d, "kind", type(d).__name__)
        raise UnsupportedError(f"{where}: output_dtype {str(got)[:60]} is not a quantized "
                               "dtype")
    name = {"QuantizedS8": "qint8", "Quantized8Asymm": "quint8"}.get(mgb["name"])
    if name is None:
        raise UnsupportedError(f"{where}: quantized modules output qint8 or quint8, not "
                               f"{mgb['name']}")
    return {"dtype": name, "scale": mgb["scale"], "zero_point": mgb.get("zero_point", 0)}


def _int8_weight(s, key, shape, where):
    """A quantized module's int8 weight (array) and its scale (float32),
    reshaped to ``shape`` (a grouped conv's weight comes with its groups
    split out)."""
    a = _tensor_array(_need(s, key, where), f"{where}.{key}")
    mgb = (a.dtype.metadata or {}).get("mgb_dtype")
    if mgb is None or mgb["name"] != "QuantizedS8":
        raise UnsupportedError(f"{where}: a {a.dtype} weight; quantized modules take qint8 "
                               "weights (QuantizedS8)")
    if int(np.prod(a.shape)) != int(np.prod(shape)):
        raise MegEngineFileError(f"{where}: weight of shape {a.shape}, expected {shape}")
    return np.ascontiguousarray(a).view(np.int8).reshape(shape), np.float32(mgb["scale"])


def _float_bias(s, n, where):
    """A quantized module's bias as float32 [n]: MegEngine 1.13 keeps it
    float ((1, C, 1, 1) for a conv); one stored as qint32 is dequantized."""
    v = s.get("bias")
    if v is None:
        return None
    a = _tensor_array(v, f"{where}.bias")
    mgb = (a.dtype.metadata or {}).get("mgb_dtype")
    if mgb is not None:
        if mgb["name"] != "QuantizedS32":
            raise UnsupportedError(f"{where}: a bias of {mgb['name']}, not qint32 or float")
        a = a.view(np.int32).astype(np.float64) * mgb["scale"]
    if a.dtype.kind != "f" or a.size != n:
        raise MegEngineFileError(f"{where}: bias of {a.dtype} {a.shape}, expected {n} floats")
    return np.asarray(a, np.float32).reshape(n)


def _fits(s, where, *sizes, groups=1):
    """Whether the sizes a quantized module's settings give its weight
    (each an int, or a sequence of ints: a kernel size; divided by
    ``groups``) multiply to the size of the weight the file holds: checked
    before the module (and its zero weight) is made."""
    n = 1
    for v in sizes:
        for d in (v if isinstance(v, (tuple, list)) else (v,)):
            if type(d) is not int or d < 1:
                raise MegEngineFileError(f"{where}: a size {d!r} that is not a positive int")
            n *= d
    if type(groups) is not int or groups < 1 or n % groups:
        raise MegEngineFileError(f"{where}: groups {groups!r}")
    w = _tensor_array(_need(s, "weight", where), f"{where}.weight")
    if n // groups != w.size:
        raise MegEngineFileError(f"{where}: its settings give a weight of {n // groups} "
                                 f"values, the file's has {w.size}")


def _fill(m, weight, scale, bias):
    """Quantized module ``m`` with MegEngine's int8 ``weight`` (in m's
    shape), its ``weight_scale`` and float ``bias`` (or None)."""
    m.weight = _tensor(weight)
    m.weight_scale = _tensor(scale)
    m.bias = None if bias is None else _tensor(bias)
    return m


def _quantized_conv(cls):
    def make(s, where):
        _only(s, "conv_mode", ("cross_correlation", "CROSS_CORRELATION"), where,
              "cross_correlation")
        _only(s, "padding_mode", ("zeros",), where, "zeros")
        kw = dict(stride=s.get("stride", 1), padding=s.get("padding", 0),
                  dilation=s.get("dilation", 1), groups=s.get("groups", 1),
                  bias=s.get("bias") is not None, act_qparams=_output_qparams(s, where))
        if issubclass(cls, _QM.ConvTranspose2d):
            kw["output_padding"] = s.get("output_padding", 0)
        cin, cout, k = (_need(s, "in_channels", where), _need(s, "out_channels", where),
                        _need(s, "kernel_size", where))
        _fits(s, where, cin, cout, k, k if isinstance(k, int) else 1,
              groups=kw["groups"])
        m = cls(cin, cout, k, **kw)
        # a grouped weight comes with its groups split out (MegEngine's layout): the
        # same values in the same order
        w, scale = _int8_weight(s, "weight", tuple(m.weight.shape), where)
        return _fill(m, w, scale, _float_bias(s, m.out_channels, where))
    return ModuleRule(cls, make, (), own_tensors=True)


def _quantized_batch_matmul(s, where):
    """MegEngine's quantized BatchMatMulActivation: weight (batch, out, in,
    1, 1), a bias (1, out, 1, 1) that it adds along axis 1 where its float
    and QAT modules, and mgtrace's, add theirs along the last axis: only a
    zero bias (what quantize makes of a module without one) means the
    same in both."""
    mode = _only(s, "nonlinear_mode", ("identity", "relu"), where, "identity")
    _fits(s, where, _need(s, "batch", where), _need(s, "in_features", where),
          _need(s, "out_features", where))
    m = _QM.BatchMatMulActivation(_need(s, "batch", where), _need(s, "in_features", where),
                                  _need(s, "out_features", where), bias=False,
                                  nonlinear_mode=mode, act_qparams=_output_qparams(s, where))
    w, scale = _int8_weight(s, "weight", tuple(m.weight.shape), where)
    bias = _float_bias(s, m.out_features, where)
    if bias is not None and np.any(bias):
        raise UnsupportedError(f"{where}: MegEngine's quantized BatchMatMulActivation adds its "
                               "bias along axis 1, mgtrace's (as the float module) along the "
                               "last axis: a nonzero bias has no mgtrace counterpart")
    return _fill(m, w, scale, None)


def _quantized_linear(cls):
    def make(s, where):
        w = _tensor_array(_need(s, "weight", where), f"{where}.weight")
        if w.ndim != 2:
            raise MegEngineFileError(f"{where}: a Linear weight of shape {w.shape}")
        m = cls(w.shape[1], w.shape[0], bias=s.get("bias") is not None,
                act_qparams=_output_qparams(s, where))
        w, scale = _int8_weight(s, "weight", w.shape, where)
        return _fill(m, w, scale, _float_bias(s, m.out_features, where))
    return ModuleRule(cls, make, (), own_tensors=True)


def _quantized_elemwise(s, where):
    method = _need(s, "method", where)
    if not (isinstance(method, str) and method.startswith("q")):
        raise MegEngineFileError(f"{where}: quantized Elemwise method {method!r} (MegEngine "
                                 "writes 'q' + the float method)")
    return _QM.Elemwise(method[1:], _output_qparams(s, where))


_MQ, _MQT = "megengine.quantization.", "megengine.module.qat."
_MQZ = "megengine.module.quantized."

MODULES.update({
    _MQ + "observer.MinMaxObserver": _observer(_Q.MinMaxObserver),
    _MQ + "observer.SyncMinMaxObserver": _observer(_Q.SyncMinMaxObserver),
    _MQ + "observer.ExponentialMovingAverageObserver": _observer(
        _Q.ExponentialMovingAverageObserver, ("momentum",)),
    _MQ + "observer.SyncExponentialMovingAverageObserver": _observer(
        _Q.SyncExponentialMovingAverageObserver, ("momentum",)),
    _MQ + "observer.HistogramObserver": _observer(_Q.HistogramObserver, ("bins",)),
    _MQ + "observer.PassiveObserver": ModuleRule(_Q.PassiveObserver, _passive, ()),
    _MQ + "fake_quant.FakeQuantize": _fake_quant(_Q.FakeQuantize),
    "megengine.traced_module.fake_quant.FakeQuantize": ModuleRule(_Q.FakeQuantize, _carrier,
                                                                  _carrier_tensors),
    _MQ + "fake_quant.TQT": _fake_quant(_Q.TQT, ("scale",)),
    _MQ + "fake_quant.LSQ": _fake_quant(_Q.LSQ, ("eps", "step_size", "zero_point",
                                                 "grad_scale")),
    _MQT + "quant_dequant.QuantStub": _qat(_stateless(_QAT.QuantStub), _QAT.QuantStub),
    _MQT + "quant_dequant.DequantStub": _qat(_stateless(_QAT.DequantStub), _QAT.DequantStub),
    _MQT + "conv.Conv2d": _qat(_conv(_QAT.Conv2d), _QAT.Conv2d),
    _MQT + "conv.ConvRelu2d": _qat(_conv(_QAT.ConvRelu2d), _QAT.ConvRelu2d),
    _MQT + "conv_bn.ConvBn2d": _qat(_conv_bn(_QAT.ConvBn2d), _QAT.ConvBn2d),
    _MQT + "conv_bn.ConvBnRelu2d": _qat(_conv_bn(_QAT.ConvBnRelu2d), _QAT.ConvBnRelu2d),
    _MQT + "linear.Linear": _qat(_linear(_QAT.Linear), _QAT.Linear),
    _MQT + "linear.LinearRelu": _qat(_linear(_QAT.LinearRelu), _QAT.LinearRelu),
    _MQT + "elemwise.Elemwise": _qat(ModuleRule(_QAT.Elemwise, lambda s, w: _QAT.Elemwise(
        _need(s, "method", w)), ()), _QAT.Elemwise),
    _MQT + "concat.Concat": _qat(_stateless(_QAT.Concat), _QAT.Concat),
    _MQT + "conv.ConvTranspose2d": _qat(_conv(_QAT.ConvTranspose2d), _QAT.ConvTranspose2d),
    _MQT + "conv.ConvTransposeRelu2d": _qat(_conv(_QAT.ConvTransposeRelu2d),
                                            _QAT.ConvTransposeRelu2d),
    **{_MQT + "conv_transpose_bn." + c.__name__: _qat(_conv_bn(
        c, "conv_transpose2d", M.ConvTranspose2d), c)
       for c in (_QAT.ConvTransposeBn2d, _QAT.ConvTransposeBnRelu2d)},
    # MegEngine's LinearBn1d also keeps a bias of its own that it never uses (zeros)
    **{_MQT + "linear_bn." + c.__name__: _qat(_conv_bn(c, "linear", M.Linear,
                                                         M.BatchNorm1d), c)
       for c in (_QAT.LinearBn1d, _QAT.LinearBnRelu1d)},
    _MQT + "batch_matmul_activation.BatchMatMulActivation": _qat(
        _batch_matmul(_QAT.BatchMatMulActivation), _QAT.BatchMatMulActivation),
    _MQZ + "quant_dequant.QuantStub": ModuleRule(_QM.QuantStub, lambda s, w: _QM.QuantStub(
        _output_qparams(s, w)), (), own_tensors=True),
    _MQZ + "quant_dequant.DequantStub": ModuleRule(_QM.DequantStub,
                                                   lambda s, w: _QM.DequantStub(), ()),
    _MQZ + "conv.Conv2d": _quantized_conv(_QM.Conv2d),
    _MQZ + "conv.ConvRelu2d": _quantized_conv(_QM.ConvRelu2d),
    _MQZ + "conv_bn.ConvBn2d": _quantized_conv(_QM.ConvBn2d),
    _MQZ + "conv_bn.ConvBnRelu2d": _quantized_conv(_QM.ConvBnRelu2d),
    _MQZ + "linear.Linear": _quantized_linear(_QM.Linear),
    _MQZ + "linear.LinearRelu": _quantized_linear(_QM.LinearRelu),
    _MQZ + "conv.ConvTranspose2d": _quantized_conv(_QM.ConvTranspose2d),
    _MQZ + "conv.ConvTransposeRelu2d": _quantized_conv(_QM.ConvTransposeRelu2d),
    _MQZ + "conv_transpose_bn.ConvTransposeBn2d": _quantized_conv(_QM.ConvTransposeBn2d),
    _MQZ + "conv_transpose_bn.ConvTransposeBnRelu2d": _quantized_conv(
        _QM.ConvTransposeBnRelu2d),
    _MQZ + "linear_bn.LinearBn1d": _quantized_linear(_QM.LinearBn1d),
    _MQZ + "linear_bn.LinearBnRelu1d": _quantized_linear(_QM.LinearBnRelu1d),
    _MQZ + "batch_matmul_activation.BatchMatMulActivation": ModuleRule(
        _QM.BatchMatMulActivation, _quantized_batch_matmul, (), own_tensors=True),
    _MQZ + "elemwise.Elemwise": ModuleRule(_QM.Elemwise, _quantized_elemwise, (),
                                           own_tensors=True),
    _MQZ + "concat.Concat": ModuleRule(_QM.Concat, lambda s, w: _QM.Concat(
        _output_qparams(s, w)), (), own_tensors=True),
})


def fake_quant_range(state, where):
    """The quantized dtype name of MegEngine's ``FakeQuant`` op state
    (``qmin``, ``qmax``): the one of mgtrace's with that range (qint32 for a
    bias, qint8...); UnsupportedError for another range."""
    lo, hi = state.get("qmin"), state.get("qmax")
    if type(lo) is not int or type(hi) is not int:
        raise MegEngineFileError(f"{where}: FakeQuant without int qmin / qmax")
    for name, meta in _Q.QUANT_DTYPES.items():
        if (meta.qmin, meta.qmax) == (lo, hi):
            return name
    raise UnsupportedError(f"{where}: FakeQuant to {lo}..{hi}, the range of no quantized dtype "
                           "mgtrace has")


def fake_quant_op(x, scale, zero_point, name, where):
    """MegEngine's ``FakeQuant`` op (what its trace records where a user's
    QAT module fake-quantizes its bias): ``x`` fake-quantized with the
    tensors ``scale`` and ``zero_point`` into dtype ``name``'s range
    (rounding ties to even: mgtrace's rule)."""
    for v, what in ((x, "input"), (scale, "scale"), (zero_point, "zero point")):
        if not hasattr(v, "numpy"):
            raise MegEngineFileError(f"{where}: FakeQuant's {what} is a {type(v).__name__}")
    zp = np.asarray(zero_point.numpy())
    meta = _Q.QUANT_DTYPES[name]
    mode = _Q.QuantMode.ASYMMERTIC if meta.is_unsigned or np.any(zp) else _Q.QuantMode.SYMMERTIC
    q = _Q.create_qparams(mode, meta, scale=scale,
                          zero_point=zero_point if mode == _Q.QuantMode.ASYMMERTIC else None)
    return _Q.fake_quant_tensor(x, q)


def apply_fakequant_with_observer(module, target, fake_quant, observer):
    """MegEngine's ``QATModule._apply_fakequant_with_observer`` as its trace
    records it in a user's QAT module: ``target`` through ``observer`` (or
    not), then ``fake_quant``. The converter gives such a module carrying
    fake quantizers (observer None), as mgtrace's trace does."""
    out = target if observer is None else observer(target)
    if fake_quant is None:
        return out
    if observer is None or getattr(fake_quant, "learns_qparams", False):
        return fake_quant(out)
    return fake_quant(out, observer.get_qparams())


def module_rule(qualname):
    """The ModuleRule of MegEngine class ``qualname``, or UnsupportedError."""
    rule = MODULES.get(qualname)
    if rule is None:
        raise UnsupportedError(f"MegEngine module {qualname} has no mgtrace counterpart in "
                               "mgtrace.megengine.table.MODULES")
    return rule


# ---------------------------------------------------------------- functions

class FunctionRule:
    """A MegEngine function -> ``fn``: MegEngine's parameters in order
    (``params``), renamed where mgtrace's differ (``rename``); parameters in
    ``fixed`` must have that value (or be left out) and are not passed;
    those in ``dropped`` (MegEngine's compute_mode: a precision hint) are
    not passed; ``defaults`` are MegEngine's defaults where mgtrace's
    differ."""

    def __init__(self, fn, params, rename=None, fixed=None, dropped=(), defaults=None):
        self.fn, self.params = fn, params.split()
        self.rename = {"inp": "x", "src": "x", **(rename or {})}
        self.fixed, self.dropped, self.defaults = fixed or {}, set(dropped), defaults or {}
        self.accepts = set(inspect.signature(fn).parameters)

    def call(self, name, args, kwargs):
        """``fn`` applied to MegEngine's ``args`` and ``kwargs``."""
        if len(args) > len(self.params):
            raise UnsupportedError(f"{name}: {len(args)} positional arguments, MegEngine's "
                                   f"function takes {len(self.params)}")
        given = dict(zip(self.params, args))
        for k, v in kwargs.items():
            if k not in self.params or k in given:
                raise UnsupportedError(f"{name}: keyword argument {k!r} is not one of "
                                       f"MegEngine's parameters {self.params}")
            given[k] = v
        for k, v in self.defaults.items():
            given.setdefault(k, v)
        out = {}
        for k, v in given.items():
            if k in self.dropped:
                continue
            if k in self.fixed:
                if v != self.fixed[k]:
                    raise UnsupportedError(f"{name}: {k}={v!r} has no mgtrace counterpart "
                                           f"(only {self.fixed[k]!r})")
                continue
            target = self.rename.get(k, k)
            if target not in self.accepts:
                raise UnsupportedError(f"{name}: parameter {k!r} has no counterpart in "
                                       f"mgtrace.functional.{self.fn.__name__}")
            out[target] = v
        return self.fn(**out)


_FE, _FN, _FT, _FM = ("megengine.functional.elemwise.", "megengine.functional.nn.",
                      "megengine.functional.tensor.", "megengine.functional.math.")
_DEV = {"device": None}


def _unary(prefix, *names):
    return {prefix + n: FunctionRule(getattr(F, n), "x") for n in names}


def _binary(prefix, *names):
    return {prefix + n: FunctionRule(getattr(F, n), "x y") for n in names}


#: MegEngine function (module.qualname) -> FunctionRule
FUNCTIONS = {
    **_unary(_FE, "abs", "ceil", "cos", "exp", "floor", "log", "log1p", "neg", "round", "sin",
             "sqrt", "square", "tanh", "erf", "expm1", "logical_not"),
    **_binary(_FE, "add", "sub", "mul", "div", "pow", "maximum", "minimum", "floor_div",
              "mod", "equal", "not_equal", "less", "less_equal", "greater", "greater_equal",
              "logical_and", "logical_or", "logical_xor"),
    _FE + "clip": FunctionRule(F.clip, "x lower upper"),
    **_unary(_FN, "relu", "relu6", "sigmoid", "silu", "gelu"),
    _FN + "leaky_relu": FunctionRule(F.leaky_relu, "inp negative_slope"),
    _FN + "softmax": FunctionRule(F.softmax, "inp axis"),
    _FN + "linear": FunctionRule(F.linear, "inp weight bias compute_mode",
                                 dropped=("compute_mode",)),
    _FN + "conv2d": FunctionRule(F.conv2d, "inp weight bias stride padding dilation groups "
                                 "conv_mode compute_mode",
                                 fixed={"conv_mode": "cross_correlation"},
                                 dropped=("compute_mode",)),
    _FN + "max_pool2d": FunctionRule(F.max_pool2d, "inp kernel_size stride padding"),
    _FN + "avg_pool2d": FunctionRule(F.avg_pool2d, "inp kernel_size stride padding mode"),
    _FN + "adaptive_avg_pool2d": FunctionRule(F.adaptive_avg_pool2d, "inp oshp"),
    _FN + "dropout": FunctionRule(F.dropout, "inp drop_prob training"),
    _FN + "one_hot": FunctionRule(F.one_hot, "inp num_classes"),
    _FT + "concat": FunctionRule(F.concat, "inps axis device", fixed=_DEV),
    _FT + "stack": FunctionRule(F.stack, "inps axis device", fixed=_DEV),
    _FT + "expand_dims": FunctionRule(F.expand_dims, "inp axis"),
    _FT + "squeeze": FunctionRule(F.squeeze, "inp axis"),
    _FT + "flatten": FunctionRule(F.flatten, "inp start_axis end_axis"),
    _FT + "reshape": FunctionRule(F.reshape, "inp target_shape"),
    _FT + "transpose": FunctionRule(F.transpose, "inp pattern"),
    _FT + "broadcast_to": FunctionRule(F.broadcast_to, "inp shape"),
    _FT + "split": FunctionRule(F.split, "inp nsplits_or_sections axis"),
    _FT + "where": FunctionRule(F.where, "mask x y"),
    _FT + "gather": FunctionRule(F.gather, "inp axis index"),
    **{_FM + n: FunctionRule(getattr(F, n), "inp axis keepdims")
       for n in ("sum", "mean", "max", "min", "prod", "argmax", "argmin")},
    _FM + "matmul": FunctionRule(F.matmul, "inp1 inp2 transpose_a transpose_b compute_mode",
                                 rename={"inp1": "a", "inp2": "b"}, dropped=("compute_mode",)),
}


# a user's QAT module (traced into) calls its QAT base class's helper
FUNCTIONS["megengine.module.qat.module.QATModule._apply_fakequant_with_observer"] = FunctionRule(
    apply_fakequant_with_observer, "module target fake_quant observer")


def function_rule(qualname):
    """The FunctionRule of MegEngine function ``qualname`` (``module.name``),
    or UnsupportedError."""
    rule = FUNCTIONS.get(qualname)
    if rule is None:
        raise UnsupportedError(f"MegEngine function {qualname} has no mgtrace counterpart in "
                               "mgtrace.megengine.table.FUNCTIONS")
    return rule


#: Tensor methods MegEngine's graphs call that mgtrace's Tensor has with the
#: same meaning and parameters
TENSOR_METHODS = frozenset("""
    __add__ __radd__ __sub__ __rsub__ __mul__ __rmul__ __truediv__ __rtruediv__
    __floordiv__ __rfloordiv__ __mod__ __rmod__ __pow__ __rpow__ __neg__ __abs__ __pos__
    __matmul__ __rmatmul__ __lt__ __le__ __gt__ __ge__ __eq__ __ne__ __and__ __or__
    __xor__ __invert__ __getitem__
    reshape flatten transpose astype sum mean max min prod argmax argmin expand_dims
    squeeze broadcast_to
""".split())


allow_classes(MODULES)          # a fused module's parts are pickled as module objects
allow_names(FUNCTIONS)
