"""The one table from MegEngine 1.13's names to mgtrace's.

Three closed sets, each keyed by MegEngine's qualified name:

* :data:`MODULES`: builtin module classes (``megengine.module.conv.Conv2d``)
  -> how to build the mgtrace module from the state MegEngine saved (the
  module's ``__dict__``);
* :data:`FUNCTIONS`: functional functions (``megengine.functional.nn.relu``)
  -> the mgtrace function and how MegEngine's parameters map onto it;
* :data:`TENSOR_METHODS`: Tensor method names (``reshape``, ``__add__``)
  that mgtrace's Tensor has with MegEngine's meaning.

Anything outside them is an error naming it (:class:`UnsupportedError`):
nothing a file names is looked up anywhere else.
"""
import inspect

import mgtrace.functional as F
import mgtrace.module as M
from mgtrace.megengine.reader import MegEngineFileError, Stub, allow_classes, allow_names

__all__ = ["UnsupportedError", "MODULES", "FUNCTIONS", "TENSOR_METHODS", "module_rule",
           "module_record", "function_rule"]


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
    names the state entries that are its parameters and buffers, and
    ``children`` the entries that are modules of its own (a fused module's
    ``conv`` and ``bn``), whose tensors load under their name."""

    def __init__(self, cls, make, tensors=("weight", "bias"), children=()):
        self.cls, self.make, self.tensors, self.children = cls, make, tensors, children


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


def _part(s, key, where):
    """The mgtrace module made from MegEngine module ``s[key]`` (a fused
    module's part)."""
    qualname, state = module_record(_need(s, key, where), f"{where}.{key}")
    return module_rule(qualname).make(state, f"{where}.{key}")


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
        if cls is M.ConvTranspose2d:
            kw["output_padding"] = s.get("output_padding", 0)
        else:
            kw["padding_mode"] = _only(s, "padding_mode", ("zeros", "reflect", "replicate"),
                                       where, "zeros")
        return cls(**kw)
    return ModuleRule(cls, make)


def _batch_norm(cls):
    def make(s, where):
        momentum = s.get("momentum", 0.9)
        return cls(_need(s, "num_features", where), eps=s.get("eps", 1e-5),
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
    return M.Embedding(_need(s, "num_embeddings", where), _need(s, "embedding_dim", where),
                       padding_idx=s.get("padding_idx"))


def _conv_bn(cls):
    def make(s, where):
        conv, bn = _part(s, "conv", where), _part(s, "bn", where)
        if type(conv) is not M.Conv2d or type(bn) is not M.BatchNorm2d:
            raise UnsupportedError(f"{where}: a fused module of a {type(conv).__name__} and a "
                                   f"{type(bn).__name__}")
        return cls(**conv.config(), eps=bn.eps, momentum=bn.momentum, affine=bn.affine,
                   track_running_stats=bn.track_running_stats)
    return ModuleRule(cls, make, (), ("conv", "bn"))


def _stateless(cls):
    return ModuleRule(cls, lambda s, where: cls(), ())


_MM = "megengine.module."

#: MegEngine builtin module class -> ModuleRule
MODULES = {
    _MM + "linear.Linear": ModuleRule(M.Linear, lambda s, w: M.Linear(
        _need(s, "in_features", w), _need(s, "out_features", w), bias=s.get("bias") is not None)),
    _MM + "conv.Conv1d": _conv(M.Conv1d),
    _MM + "conv.Conv2d": _conv(M.Conv2d),
    _MM + "conv.ConvTranspose2d": _conv(M.ConvTranspose2d),
    _MM + "batchnorm.BatchNorm1d": _batch_norm(M.BatchNorm1d),
    _MM + "batchnorm.BatchNorm2d": _batch_norm(M.BatchNorm2d),
    _MM + "normalization.LayerNorm": ModuleRule(M.LayerNorm, lambda s, w: M.LayerNorm(
        tuple(_need(s, "normalized_shape", w)), eps=s.get("eps", 1e-5),
        elementwise_affine=s.get("affine", True))),
    _MM + "normalization.GroupNorm": ModuleRule(M.GroupNorm, lambda s, w: M.GroupNorm(
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
        M.PReLU, lambda s, w: M.PReLU(s.get("num_parameters", 1), s.get("init", 0.25)),
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
}


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
