"""Builtin modules and the registry of builtin (leaf) module types.

A builtin module is a leaf for the tracer: a call to it is recorded as one
call on a module node instead of being traced into, and an archive stores
it by stable type name + type version + constructor config + tensors
(DESIGN.md, "Archive format"). Each builtin class therefore has

* ``builtin_name``: a stable dotted name (``"mgtrace.module.Conv2d"``),
* ``builtin_version``: an int, bumped when the constructor's signature or
  the meaning of the stored tensors changes,
* ``config()``: its constructor arguments as plain Python values (ints,
  floats, bools, strings, None, tuples), such that ``type(m)(**m.config())``
  builds an equivalent module (same parameter and buffer names, shapes and
  dtypes; values come from ``load_state_dict``).

Constructors, defaults, initialisation and state_dict names follow
``torch.nn`` (so PyTorch checkpoints load by key); the computation is that of
:mod:`mgtrace.functional`.

Users make their own module types leaves with :func:`register_as_builtin`.
"""
import functools
import inspect
import math

import numpy as np

from mgtrace.errors import Error, did_you_mean
import mgtrace.functional as F
from mgtrace._core import empty_tensor as _empty_tensor, tensor as _tensor
from mgtrace._core import args as A
from mgtrace.module import init
from mgtrace.module.module import Module
from mgtrace.module.parameter import Parameter

__all__ = [
    "register_as_builtin", "is_builtin", "builtin_type", "builtin_types", "UnknownBuiltinError",
    "Linear", "Conv1d", "Conv2d", "ConvTranspose2d", "BatchNorm1d", "BatchNorm2d", "LayerNorm",
    "GroupNorm", "Embedding", "ReLU", "ReLU6", "GELU", "SiLU", "Sigmoid", "Tanh", "Softmax",
    "MaxPool2d", "AvgPool2d", "AdaptiveAvgPool2d", "Dropout", "Identity", "Flatten",
    "Hardswish", "Hardsigmoid",
]

# ------------------------------------------------------------------ registry

_BY_NAME = {}   # stable name -> class
_BY_TYPE = {}   # class -> stable name


class UnknownBuiltinError(Error, KeyError):
    """No builtin module type has the requested name."""

    def __str__(self):   # KeyError would print the repr of the message
        return str(self.args[0]) if self.args else ""


def _plain(value):
    """True for values config() may hold: None, bool, int, float, str, and
    tuples/lists/dicts (str keys) of those."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, (tuple, list)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return False


def _recorded_config(self):
    """config() of a registered user class: the arguments its __init__ got
    (defaults filled in), recorded when the instance was built."""
    try:
        cfg = self.__dict__["_builtin_config"]
    except KeyError:
        raise RuntimeError(f"{type(self).__name__} was built before it was registered as a "
                           "builtin, so its constructor arguments were not recorded") from None
    return dict(cfg)


def _record_init_args(cls):
    """Wrap cls.__init__ so each instance remembers its constructor arguments."""
    original = cls.__init__
    sig = inspect.signature(original)
    for p in list(sig.parameters.values())[1:]:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise TypeError(f"cannot register {cls.__qualname__} as a builtin: its __init__ takes "
                            f"*{p.name} or **{p.name}, so its config cannot be recorded; "
                            "define config() returning the keyword arguments instead")

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        if type(self) is cls:
            bound = sig.bind(self, *args, **kwargs)
            bound.apply_defaults()
            cfg = dict(list(bound.arguments.items())[1:])
            for k, v in cfg.items():
                if not _plain(v):
                    raise TypeError(
                        f"{cls.__qualname__}({k}=...) got {type(v).__name__}; a builtin module's "
                        "constructor arguments must be plain values (None, bool, int, float, "
                        "str, tuples/lists/dicts of those) so that an archive can store them")
            self.__dict__["_builtin_config"] = cfg
        original(self, *args, **kwargs)

    cls.__init__ = __init__
    cls.config = _recorded_config


def register_as_builtin(cls=None, name=None, version=1):
    """Mark a Module class as a builtin (a leaf for the tracer) with a stable name.

    Usable as ``register_as_builtin(MyBlock)``, ``@register_as_builtin`` or
    ``@register_as_builtin(name="acme.MyBlock", version=2)``.

    Args:
        cls: a subclass of :class:`Module`.
        name: stable dotted name stored in archives; default
            ``f"{cls.__module__}.{cls.__qualname__}"``. Give one explicitly for a
            class defined inside a function, or to keep archives loadable after
            moving the class.
        version: positive int, bumped when the constructor changes.

    If the class defines no ``config()``, its ``__init__`` is wrapped to
    record its arguments, which must then be plain values.

    Returns:
        cls (now with ``builtin_name`` and ``builtin_version``).

    Raises:
        TypeError: cls is not a Module subclass; bad name/version types.
        ValueError: the name is taken by another class, the class is already
            registered under another name, or the name is not dotted
            identifiers.

    >>> import mgtrace.module as M
    >>> @M.register_as_builtin(name="acme.Scale")
    ... class Scale(M.Module):
    ...     def __init__(self, k=2.0):
    ...         super().__init__()
    ...         self.k = k
    ...     def forward(self, x):
    ...         return x * self.k
    >>> Scale(3.0).config(), M.is_builtin(Scale(3.0)), M.builtin_type("acme.Scale") is Scale
    ({'k': 3.0}, True, True)
    """
    if cls is None:
        return lambda c: register_as_builtin(c, name=name, version=version)
    if not (isinstance(cls, type) and issubclass(cls, Module)):
        raise TypeError(f"register_as_builtin takes a subclass of mgtrace.module.Module, "
                        f"got {cls!r}")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise TypeError(f"builtin version must be a positive int, got {version!r}")
    if name is None:
        name = f"{cls.__module__}.{cls.__qualname__}"
        if "<locals>" in name:
            raise ValueError(f"{cls.__qualname__} is defined inside a function; give it a "
                             f"stable name: register_as_builtin({cls.__name__}, "
                             f"name=\"yourpackage.{cls.__name__}\")")
    if not isinstance(name, str):
        raise TypeError(f"builtin name must be a str, got {type(name).__name__}")
    if not name or not all(part.isidentifier() for part in name.split(".")):
        raise ValueError(f"builtin name must be dotted Python identifiers "
                         f"(like 'acme.blocks.Swish'), got {name!r}")
    owner = _BY_NAME.get(name)
    if owner is not None and owner is not cls and \
            (owner.__module__, owner.__qualname__) == (cls.__module__, cls.__qualname__):
        _BY_TYPE.pop(owner, None)   # the same class defined again (module reload, notebook)
        del _BY_NAME[name]
        owner = None
    if owner is not None and owner is not cls:
        raise ValueError(f"builtin name {name!r} is already taken by "
                         f"{owner.__module__}.{owner.__qualname__}; choose another name")
    old = _BY_TYPE.get(cls)
    if old is not None and old != name:
        raise ValueError(f"{cls.__qualname__} is already registered as builtin {old!r}")
    if owner is cls and cls.__dict__.get("builtin_version") != version:
        raise ValueError(f"{cls.__qualname__} is already registered as {name!r} version "
                         f"{cls.__dict__.get('builtin_version')}, not {version}")
    if owner is None and getattr(cls, "config", _recorded_config) is _recorded_config:
        _record_init_args(cls)   # no config() of its own (or only an inherited recorded one)
    cls.builtin_name = name
    cls.builtin_version = version
    _BY_NAME[name] = cls
    _BY_TYPE[cls] = name
    return cls


def is_builtin(module):
    """True when ``module`` (an instance or a class) is of a registered builtin
    type. Exact type: a subclass of a builtin is not one unless registered
    itself (its forward may differ)."""
    cls = module if isinstance(module, type) else type(module)
    return cls in _BY_TYPE


def builtin_type(name):
    """The builtin module class registered as ``name``.

    Raises UnknownBuiltinError (a KeyError) naming the close matches and how
    to register a type."""
    try:
        return _BY_NAME[name]
    except (KeyError, TypeError):
        pass
    hint = did_you_mean(name, _BY_NAME)
    raise UnknownBuiltinError(
        f"no builtin module type is registered as {name!r}.{hint} If it is your own "
        "class, import the code that defines it and register it with "
        "mgtrace.module.register_as_builtin(cls, name=...)")


def builtin_types():
    """A dict of every registered builtin: stable name -> class (sorted by name)."""
    return dict(sorted(_BY_NAME.items()))


def _builtin(cls):
    """Register one of mgtrace's own builtins as ``mgtrace.module.<Name>``."""
    return register_as_builtin(cls, name=f"mgtrace.module.{cls.__name__}", version=1)


# Arguments are checked by mgtrace._core.args, as in mgtrace.functional and the
# core, so a bad argument raises the same exception and message at every layer.
# Sizes (features, channels, kernel sizes, strides, padding, dilation, groups,
# output sizes) are bounded by MAX_GEOMETRY there too: a module that
# constructs also runs, and an archive whose config holds absurd values (a
# stride of 2**62) fails at load with ArchiveError instead of in forward.

def _empty_param(shape):
    """An uninitialized float32 Parameter; reset_parameters() fills it (a load
    from an archive replaces it instead, so its pages are never touched)."""
    return _empty_tensor(shape, "float32", None, Parameter)


def _reset_linear_like(weight, bias):
    """PyTorch's Linear/Conv default: kaiming_uniform(a=sqrt(5)) for the weight
    (bound 1/sqrt(fan_in)), U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for the bias."""
    init.kaiming_uniform_(weight, a=math.sqrt(5))
    if bias is not None:
        fan_in, _ = init.calculate_fan_in_and_fan_out(weight)
        bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0.0
        init.uniform_(bias, -bound, bound)


# ------------------------------------------------------------------ layers

PADDING_MODES = ("zeros", "reflect", "replicate", "circular")
"""Conv1d/Conv2d padding_mode values (torch.nn's; all but "zeros" are F.pad modes)."""


@_builtin
class Linear(Module):
    """y = x @ weight.T + bias.

    Args:
        in_features, out_features: sizes of the last axis of input and output.
        bias: learn an additive bias.

    Shapes: x float32 [..., in_features] -> [..., out_features]. Parameters
    ``weight`` [out_features, in_features], ``bias`` [out_features]
    (initialised U(-1/sqrt(in_features), 1/sqrt(in_features)), as PyTorch).

    >>> import mgtrace as mt, mgtrace.module as M
    >>> fc = M.Linear(3, 2)
    >>> fc(mt.tensor([[1.0, 2.0, 3.0]])).shape, fc.config()
    ((1, 2), {'in_features': 3, 'out_features': 2, 'bias': True})
    >>> type(fc)(**fc.config()).weight.shape
    (2, 3)
    """

    def __init__(self, in_features, out_features, bias=True):
        super().__init__()
        self.in_features = A.to_size("Linear", "in_features", in_features)
        self.out_features = A.to_size("Linear", "out_features", out_features)
        self.weight = _empty_param((self.out_features, self.in_features))
        if A.to_bool("Linear", "bias", bias):
            self.bias = _empty_param((self.out_features,))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self):
        _reset_linear_like(self.weight, self.bias)

    def config(self):
        return {"in_features": self.in_features, "out_features": self.out_features,
                "bias": self.bias is not None}

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}")

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


class _ConvNd(Module):
    _n = 2
    _transposed = False

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0,
                 dilation=1, groups=1, bias=True, output_padding=0, padding_mode="zeros"):
        super().__init__()
        fn, n = type(self).__name__, self._n
        modes = ("zeros",) if self._transposed else PADDING_MODES
        if not isinstance(padding_mode, str) or padding_mode not in modes:
            raise ValueError(f"{fn}: padding_mode must be one of {', '.join(map(repr, modes))}, "
                             f"got {padding_mode!r}")
        self.padding_mode = padding_mode
        self.in_channels = A.to_size(fn, "in_channels", in_channels, 1)
        self.out_channels = A.to_size(fn, "out_channels", out_channels, 1)
        self.kernel_size = A.ntuple(fn, "kernel_size", kernel_size, n, 1)
        self.stride = A.ntuple(fn, "stride", stride, n, 1)
        self.padding = A.ntuple(fn, "padding", padding, n, 0)
        self.dilation = A.ntuple(fn, "dilation", dilation, n, 1)
        self.groups = A.to_size(fn, "groups", groups, 1)
        self.output_padding = A.ntuple(fn, "output_padding", output_padding, n, 0)
        if self.in_channels % self.groups or self.out_channels % self.groups:
            raise ValueError(f"{fn}: in_channels ({self.in_channels}) and out_channels "
                             f"({self.out_channels}) must both be divisible by groups "
                             f"({self.groups})")
        if self._transposed:
            shape = (self.in_channels, self.out_channels // self.groups) + self.kernel_size
        else:
            shape = (self.out_channels, self.in_channels // self.groups) + self.kernel_size
        self.weight = _empty_param(shape)
        if A.to_bool(fn, "bias", bias):
            self.bias = _empty_param((self.out_channels,))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self):
        _reset_linear_like(self.weight, self.bias)

    def _megengine_layout(self):
        """MegEngine's shapes of this module's tensors where they differ
        (the layout hook of Module.state_dict / load_state_dict): the bias
        as (1, C_out, 1, ...), a grouped weight with the groups split out,
        (groups, C_out/groups, C_in/groups, *kernel), or for a transposed
        conv (groups, C_in/groups, C_out/groups, *kernel); MegEngine's
        module/conv.py ``_infer_weight_shape`` / ``_infer_bias_shape``."""
        shapes = {}
        g = self.groups
        if g > 1:
            first, second = ((self.in_channels, self.out_channels) if self._transposed
                             else (self.out_channels, self.in_channels))
            shapes["weight"] = ((g, first // g, second // g) + self.kernel_size,)
        if self.bias is not None:
            shapes["bias"] = ((1, self.out_channels) + (1,) * self._n,)
        return shapes

    def _common_config(self):
        return {"in_channels": self.in_channels, "out_channels": self.out_channels,
                "kernel_size": self.kernel_size, "stride": self.stride,
                "padding": self.padding, "dilation": self.dilation, "groups": self.groups,
                "bias": self.bias is not None, "padding_mode": self.padding_mode}

    def _padded(self, x):
        """x, padded by ``padding`` in ``padding_mode`` unless that is
        "zeros" (which the convolution does itself), as torch.nn does."""
        if self.padding_mode == "zeros" or getattr(x, "ndim", None) != 2 + self._n:
            return x            # (the convolution reports a wrong rank)
        pads = ((0, 0), (0, 0)) + tuple((p, p) for p in self.padding)
        return F.pad(x, pads, mode=self.padding_mode)

    def _conv_padding(self):
        return self.padding if self.padding_mode == "zeros" else (0,) * self._n

    def config(self):
        return self._common_config()

    def extra_repr(self):
        # PyTorch's format: non-default settings only
        s = (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
             f"stride={self.stride}")
        if any(self.padding):
            s += f", padding={self.padding}"
        if any(d != 1 for d in self.dilation):
            s += f", dilation={self.dilation}"
        if any(self.output_padding):
            s += f", output_padding={self.output_padding}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.bias is None:
            s += ", bias=False"
        if self.padding_mode != "zeros":
            s += f", padding_mode={self.padding_mode}"
        return s


@_builtin
class Conv1d(_ConvNd):
    """1-d convolution (cross-correlation) over x float32 [N, C_in, L].

    Args as torch.nn.Conv1d: ``kernel_size``, ``stride``, ``padding``,
    ``dilation`` are ints or 1-tuples (config gives 1-tuples);
    ``padding_mode`` is "zeros", "reflect", "replicate" or "circular" (see
    :class:`Conv2d`). Parameters ``weight`` [C_out, C_in/groups, K], ``bias``
    [C_out].

    Raises ValueError for an unknown padding_mode (and as Conv2d).
    """
    _n = 1

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0,
                 dilation=1, groups=1, bias=True, padding_mode="zeros"):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation,
                         groups, bias, padding_mode=padding_mode)

    def forward(self, x):
        return F.conv1d(self._padded(x), self.weight, self.bias, self.stride[0],
                        self._conv_padding()[0], self.dilation[0], self.groups)


@_builtin
class Conv2d(_ConvNd):
    """2-d convolution (cross-correlation) over x float32 [N, C_in, H, W].

    Args as torch.nn.Conv2d: ``kernel_size``, ``stride``, ``padding``,
    ``dilation`` are ints or pairs (config gives pairs). ``padding_mode``
    says what the ``padding`` rows and columns hold: "zeros" (the default),
    "reflect" (the input mirrored, edge not repeated; padding must be
    smaller than the input), "replicate" (the edge repeated) or "circular"
    (the input wrapped around), as torch.nn.Conv2d: the input goes through
    :func:`mgtrace.functional.pad` first, then an unpadded convolution.
    Parameters ``weight`` [C_out, C_in/groups, KH, KW], ``bias`` [C_out].

    Raises:
        ValueError: non-positive sizes, sizes above 2**31 - 1 (every size
            argument of a builtin module: ``MAX_GEOMETRY``, as the
            functional ops), channels not divisible by groups, an unknown
            padding_mode; in forward, as
            :func:`mgtrace.functional.conv2d` and :func:`~mgtrace.functional.pad`.

    >>> import mgtrace as mt, mgtrace.module as M
    >>> conv = M.Conv2d(1, 1, 3, padding=1, padding_mode="circular", bias=False)
    >>> conv.config()["padding_mode"], conv(mt.tensor([[[[1.0, 2.0], [3.0, 4.0]]]])).shape
    ('circular', (1, 1, 2, 2))
    """
    _n = 2

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0,
                 dilation=1, groups=1, bias=True, padding_mode="zeros"):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation,
                         groups, bias, padding_mode=padding_mode)

    def forward(self, x):
        return F.conv2d(self._padded(x), self.weight, self.bias, self.stride,
                        self._conv_padding(), self.dilation, self.groups)


class _ConvTransposeNd(_ConvNd):
    """What the transposed convolutions share: torch.nn's argument order
    (``output_padding`` before ``groups``, ``dilation`` last) and the rule
    that ``output_padding`` is smaller than ``stride`` or ``dilation``."""
    _transposed = True

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0,
                 output_padding=0, groups=1, bias=True, dilation=1, padding_mode="zeros"):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation,
                         groups, bias, output_padding, padding_mode)
        if any(op >= max(s, d) for op, s, d in zip(self.output_padding, self.stride,
                                                    self.dilation)):
            raise ValueError(f"{type(self).__name__}: output_padding {self.output_padding} must "
                             f"be smaller than stride {self.stride} or dilation {self.dilation}")

    def config(self):
        cfg = self._common_config()
        cfg["output_padding"] = self.output_padding
        return cfg


@_builtin
class ConvTranspose2d(_ConvTransposeNd):
    """2-d transposed convolution over x float32 [N, C_in, H, W].

    Args as torch.nn.ConvTranspose2d (same order: ``output_padding`` before
    ``groups``, ``dilation`` last; ``padding_mode`` only "zeros", as torch's).
    Parameters ``weight`` [C_in, C_out/groups, KH, KW] (PyTorch's layout),
    ``bias`` [C_out].
    """
    _n = 2

    def forward(self, x):
        return F.conv_transpose2d(x, self.weight, self.bias, self.stride, self.padding,
                                  self.output_padding, self.dilation, self.groups)


# ------------------------------------------------------------- normalization

class _BatchNorm(Module):
    _input_ndims = (4,)

    @property
    def mutates_state(self):
        """A call updates the running statistics (graph.compile() keeps it)."""
        return self.training and self.track_running_stats

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, *, bias=True):
        super().__init__()
        fn = type(self).__name__
        self.num_features = A.to_size(fn, "num_features", num_features, 1)
        self.eps = A.to_float(fn, "eps", eps)
        self.momentum = None if momentum is None else A.to_float(fn, "momentum", momentum)
        self.affine = A.to_bool(fn, "affine", affine)
        self.track_running_stats = A.to_bool(fn, "track_running_stats", track_running_stats)
        self.use_bias = A.to_bool(fn, "bias", bias)
        c = self.num_features
        if self.affine:
            self.weight = Parameter(np.ones(c, np.float32))
            if self.use_bias:
                self.bias = Parameter(np.zeros(c, np.float32))
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        if self.track_running_stats:
            self.register_buffer("running_mean", _tensor(np.zeros(c, np.float32)))
            self.register_buffer("running_var", _tensor(np.ones(c, np.float32)))
            self.register_buffer("num_batches_tracked", _tensor(0, dtype="int64"))
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)

    def reset_running_stats(self):
        if self.track_running_stats:
            init.zeros_(self.running_mean)
            init.ones_(self.running_var)
            init.zeros_(self.num_batches_tracked)

    def reset_parameters(self):
        self.reset_running_stats()
        if self.weight is not None:
            init.ones_(self.weight)
        if self.bias is not None:
            init.zeros_(self.bias)

    def _megengine_layout(self):
        """The layout hook (see _ConvNd): MegEngine 1.13's state_dict keeps
        weight, bias and the running statistics as (C,), as mgtrace does,
        while its modules and older state dicts hold them as (1, C, 1, 1):
        either loads; MegEngine has no num_batches_tracked (None)."""
        c = self.num_features
        shapes = {name: ((c,), (1, c, 1, 1)) for name in
                  ("weight", "bias", "running_mean", "running_var")
                  if getattr(self, name) is not None}
        if self.num_batches_tracked is not None:
            shapes["num_batches_tracked"] = None
        return shapes

    def config(self):
        return {"num_features": self.num_features, "eps": self.eps, "momentum": self.momentum,
                "affine": self.affine, "track_running_stats": self.track_running_stats,
                "bias": self.use_bias}

    def extra_repr(self):
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, "
                f"affine={self.affine}, bias={self.bias is not None}, "
                f"track_running_stats={self.track_running_stats}")

    def forward(self, x):
        if x.ndim not in self._input_ndims:
            want = " or ".join(f"{n}D" for n in self._input_ndims)
            raise ValueError(f"{type(self).__name__}: expected {want} input, got {x.ndim}D "
                             f"input of shape {x.shape}")
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            self.num_batches_tracked += 1   # in place
            if self.momentum is None:       # cumulative moving average
                factor = 1.0 / float(self.num_batches_tracked.item())
        use_batch_stats = self.training or self.running_mean is None
        track = not self.training or self.track_running_stats
        # F.batch_norm takes MegEngine's momentum (the weight of the old
        # running value): PyTorch's m is MegEngine's 1 - m
        return F.batch_norm(x, self.running_mean if track else None,
                            self.running_var if track else None, self.weight, self.bias,
                            use_batch_stats, 1.0 - factor, self.eps)


@_builtin
class BatchNorm1d(_BatchNorm):
    """Batch normalization over x [N, C] or [N, C, L] (statistics per channel C).

    Args:
        num_features: C.
        eps: added to the variance.
        momentum: PyTorch's convention (not MegEngine's):
            ``running = (1 - momentum) * running + momentum * batch``, default
            0.1; None: cumulative average over all batches seen. running_var
            is updated with the unbiased batch variance (as PyTorch does).
        affine: learn ``weight`` (ones) and ``bias`` (zeros) [C].
        track_running_stats: keep ``running_mean`` (zeros), ``running_var``
            (ones) [C] and ``num_batches_tracked`` (int64 scalar) buffers.
        bias: (keyword only, as in PyTorch >= 2.10) with affine, learn the bias.

    In training mode it normalizes with the batch statistics and updates the
    buffers in place; in eval mode it uses the running statistics.
    """
    _input_ndims = (2, 3)


@_builtin
class BatchNorm2d(_BatchNorm):
    """Batch normalization over x [N, C, H, W]; arguments and buffers as
    :class:`BatchNorm1d` (momentum in PyTorch's convention, default 0.1:
    ``running = (1 - momentum) * running + momentum * batch``)."""
    _input_ndims = (4,)


@_builtin
class LayerNorm(Module):
    """Normalize over the last ``len(normalized_shape)`` axes.

    Args:
        normalized_shape: int or tuple, the trailing shape (config gives a tuple).
        eps: added to the variance.
        elementwise_affine: learn ``weight`` (ones) and, with ``bias``,
            ``bias`` (zeros), both of shape normalized_shape.
        bias: learn the bias (PyTorch >= 2.1's argument).
    """

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True):
        super().__init__()
        fn = "LayerNorm"
        if isinstance(normalized_shape, (tuple, list)):
            shape = tuple(A.to_size(fn, "normalized_shape", d, 1) for d in normalized_shape)
        else:
            shape = (A.to_size(fn, "normalized_shape", normalized_shape, 1),)
        self.normalized_shape = A.check_numel(fn, "normalized_shape", shape)
        self.eps = A.to_float(fn, "eps", eps)
        self.elementwise_affine = A.to_bool(fn, "elementwise_affine", elementwise_affine)
        self.use_bias = A.to_bool(fn, "bias", bias)
        if self.elementwise_affine:
            self.weight = Parameter(np.ones(shape, np.float32))
            if self.use_bias:
                self.bias = Parameter(np.zeros(shape, np.float32))
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)

    def config(self):
        return {"normalized_shape": self.normalized_shape, "eps": self.eps,
                "elementwise_affine": self.elementwise_affine, "bias": self.use_bias}

    def extra_repr(self):
        return (f"{self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.elementwise_affine}, bias={self.bias is not None}")

    def forward(self, x):
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)


@_builtin
class GroupNorm(Module):
    """Group normalization over x [N, C, *]: C is split into ``num_groups``.

    Parameters (with ``affine``) ``weight`` (ones) and ``bias`` (zeros) [C];
    keyword-only ``bias=False`` leaves the bias out (PyTorch >= 2.10).

    Raises ValueError when num_channels is not divisible by num_groups.
    """

    def __init__(self, num_groups, num_channels, eps=1e-5, affine=True, *, bias=True):
        super().__init__()
        fn = "GroupNorm"
        self.num_groups = A.to_size(fn, "num_groups", num_groups, 1)
        self.num_channels = A.to_size(fn, "num_channels", num_channels, 1)
        if self.num_channels % self.num_groups:
            raise ValueError(f"GroupNorm: num_channels ({self.num_channels}) must be divisible "
                             f"by num_groups ({self.num_groups})")
        self.eps = A.to_float(fn, "eps", eps)
        self.affine = A.to_bool(fn, "affine", affine)
        self.use_bias = A.to_bool(fn, "bias", bias)
        if self.affine:
            self.weight = Parameter(np.ones(self.num_channels, np.float32))
            if self.use_bias:
                self.bias = Parameter(np.zeros(self.num_channels, np.float32))
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)

    def config(self):
        return {"num_groups": self.num_groups, "num_channels": self.num_channels,
                "eps": self.eps, "affine": self.affine, "bias": self.use_bias}

    def extra_repr(self):
        return (f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}, "
                f"bias={self.bias is not None}")

    def forward(self, x):
        return F.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)


@_builtin
class Embedding(Module):
    """A lookup table: integer indices [*] -> rows of ``weight`` [*, embedding_dim].

    ``weight`` [num_embeddings, embedding_dim] starts N(0, 1), with row
    ``padding_idx`` (if given; negative counts from the end) zeroed, as
    PyTorch does. (No gradient, so padding_idx only affects initialisation.)
    """

    def __init__(self, num_embeddings, embedding_dim, padding_idx=None):
        super().__init__()
        fn = "Embedding"
        self.num_embeddings = A.to_size(fn, "num_embeddings", num_embeddings, 1)
        self.embedding_dim = A.to_size(fn, "embedding_dim", embedding_dim, 1)
        if padding_idx is not None:
            padding_idx = A.to_int(fn, "padding_idx", padding_idx)
            if not -self.num_embeddings <= padding_idx < self.num_embeddings:
                raise ValueError(f"Embedding: padding_idx {padding_idx} is out of range for "
                                 f"{self.num_embeddings} embeddings")
            if padding_idx < 0:
                padding_idx += self.num_embeddings
        self.padding_idx = padding_idx
        self.weight = _empty_param((self.num_embeddings, self.embedding_dim))
        self.reset_parameters()

    def reset_parameters(self):
        init.normal_(self.weight)
        if self.padding_idx is not None:
            self.weight[self.padding_idx] = 0

    def config(self):
        return {"num_embeddings": self.num_embeddings, "embedding_dim": self.embedding_dim,
                "padding_idx": self.padding_idx}

    def extra_repr(self):
        s = f"{self.num_embeddings}, {self.embedding_dim}"
        if self.padding_idx is not None:
            s += f", padding_idx={self.padding_idx}"
        return s

    def forward(self, x):
        return F.embedding(x, self.weight)


# -------------------------------------------------------------- activations

class _Stateless(Module):
    """A builtin with no constructor arguments."""

    def config(self):
        return {}


@_builtin
class ReLU(_Stateless):
    """max(x, 0)."""

    def forward(self, x):
        return F.relu(x)


@_builtin
class ReLU6(_Stateless):
    """min(max(x, 0), 6)."""

    def forward(self, x):
        return F.relu6(x)


@_builtin
class GELU(Module):
    """x * Phi(x); ``approximate="tanh"`` uses the tanh approximation."""

    def __init__(self, approximate="none"):
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"GELU: approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def config(self):
        return {"approximate": self.approximate}

    def extra_repr(self):
        return f"approximate={self.approximate!r}"

    def forward(self, x):
        return F.gelu(x, self.approximate)


@_builtin
class SiLU(_Stateless):
    """x * sigmoid(x)."""

    def forward(self, x):
        return F.silu(x)


@_builtin
class Sigmoid(_Stateless):
    """1 / (1 + exp(-x))."""

    def forward(self, x):
        return F.sigmoid(x)


@_builtin
class Tanh(_Stateless):
    """tanh(x)."""

    def forward(self, x):
        return F.tanh(x)


@_builtin
class Hardswish(_Stateless):
    """x * relu6(x + 3) / 6."""

    def forward(self, x):
        return F.hardswish(x)


@_builtin
class Hardsigmoid(_Stateless):
    """relu6(x + 3) / 6."""

    def forward(self, x):
        return F.hardsigmoid(x)


@_builtin
class Softmax(Module):
    """softmax along ``dim``.

    dim=None picks an axis as PyTorch's (and MegEngine's) legacy rule does:
    0 for inputs of 0, 1 or 3 dimensions, else 1.
    """

    def __init__(self, dim=None):
        super().__init__()
        self.dim = None if dim is None else A.to_int("Softmax", "dim", dim)

    def config(self):
        return {"dim": self.dim}

    def extra_repr(self):
        return f"dim={self.dim}"

    def forward(self, x):
        dim = self.dim
        if dim is None:
            dim = 0 if x.ndim in (0, 1, 3) else 1
        return F.softmax(x, dim)


# ------------------------------------------------------------------ pooling

def _pool_arg(fn, name, v, minimum):
    """PyTorch keeps pooling sizes as given (int or tuple); so do we."""
    if isinstance(v, (tuple, list)):
        return A.ntuple(fn, name, v, 2, minimum)
    return A.to_size(fn, name, v, minimum)


@_builtin
class MaxPool2d(Module):
    """Max pooling over x float [N, C, H, W]. stride defaults to kernel_size.

    With ``return_indices=True`` the call returns ``(values, indices)``,
    indices int64 [N, C, OH, OW] holding each maximum's position ``h * W + w``
    in its input plane (torch.nn.MaxPool2d's). Raises as
    :func:`mgtrace.functional.max_pool2d`.
    """

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, return_indices=False,
                 ceil_mode=False):
        super().__init__()
        fn = "MaxPool2d"
        self.kernel_size = _pool_arg(fn, "kernel_size", kernel_size, 1)
        self.stride = self.kernel_size if stride is None else _pool_arg(fn, "stride", stride, 1)
        self.padding = _pool_arg(fn, "padding", padding, 0)
        self.dilation = _pool_arg(fn, "dilation", dilation, 1)
        self.return_indices = A.to_bool(fn, "return_indices", return_indices)
        self.ceil_mode = A.to_bool(fn, "ceil_mode", ceil_mode)

    def config(self):
        return {"kernel_size": self.kernel_size, "stride": self.stride, "padding": self.padding,
                "dilation": self.dilation, "return_indices": self.return_indices,
                "ceil_mode": self.ceil_mode}

    def extra_repr(self):
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
                f"dilation={self.dilation}, ceil_mode={self.ceil_mode}")

    def forward(self, x):
        return F.max_pool2d(x, self.kernel_size, self.stride, self.padding, self.dilation,
                            self.ceil_mode, return_indices=self.return_indices)


@_builtin
class AvgPool2d(Module):
    """Average pooling over x [N, C, H, W]. stride defaults to kernel_size;
    ``count_include_pad`` counts zero padding in the divisor (PyTorch's default)."""

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False,
                 count_include_pad=True):
        super().__init__()
        fn = "AvgPool2d"
        self.kernel_size = _pool_arg(fn, "kernel_size", kernel_size, 1)
        self.stride = self.kernel_size if stride is None else _pool_arg(fn, "stride", stride, 1)
        self.padding = _pool_arg(fn, "padding", padding, 0)
        self.ceil_mode = A.to_bool(fn, "ceil_mode", ceil_mode)
        self.count_include_pad = A.to_bool(fn, "count_include_pad", count_include_pad)

    def config(self):
        return {"kernel_size": self.kernel_size, "stride": self.stride, "padding": self.padding,
                "ceil_mode": self.ceil_mode, "count_include_pad": self.count_include_pad}

    def extra_repr(self):
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"

    def forward(self, x):
        mode = "average" if self.count_include_pad else "average_count_exclude_padding"
        return F.avg_pool2d(x, self.kernel_size, self.stride, self.padding, mode,
                            self.ceil_mode)


@_builtin
class AdaptiveAvgPool2d(Module):
    """Average pooling of x [N, C, H, W] to ``output_size`` (int or pair)."""

    def __init__(self, output_size):
        super().__init__()
        self.output_size = _pool_arg("AdaptiveAvgPool2d", "output_size", output_size, 1)

    def config(self):
        return {"output_size": self.output_size}

    def extra_repr(self):
        return f"output_size={self.output_size}"

    def forward(self, x):
        return F.adaptive_avg_pool2d(x, self.output_size)


# -------------------------------------------------------------------- misc

@_builtin
class Dropout(Module):
    """Zeroes each element with probability ``p`` in training (scaling the
    rest by 1/(1-p)); the identity in eval mode."""

    def __init__(self, p=0.5):
        super().__init__()
        self.p = A.probability("Dropout", "p", p)

    def config(self):
        return {"p": self.p}

    def extra_repr(self):
        return f"p={self.p}"

    def forward(self, x):
        return F.dropout(x, self.p, self.training)


@_builtin
class Identity(Module):
    """Returns its input. Accepts and ignores any constructor arguments (as
    PyTorch's does); config() is always empty."""

    def __init__(self, *args, **kwargs):
        super().__init__()

    def config(self):
        return {}

    def forward(self, x):
        return x


@_builtin
class Flatten(Module):
    """Merge axes ``start_dim`` .. ``end_dim`` into one (default: all but the batch axis)."""

    def __init__(self, start_dim=1, end_dim=-1):
        super().__init__()
        self.start_dim = A.to_int("Flatten", "start_dim", start_dim)
        self.end_dim = A.to_int("Flatten", "end_dim", end_dim)

    def config(self):
        return {"start_dim": self.start_dim, "end_dim": self.end_dim}

    def extra_repr(self):
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"

    def forward(self, x):
        return F.flatten(x, self.start_dim, self.end_dim)


# -------------------------------------------- more of MegEngine 1.13's modules
#
# Constructors take MegEngine's arguments and defaults; parameters keep
# torch.nn's names and layouts where PyTorch has the module (PReLU's weight
# [num_parameters], as torch.nn.PReLU), so PyTorch checkpoints load by key.

__all__ += ["LeakyReLU", "PReLU", "PixelShuffle", "Pad", "AdaptiveMaxPool2d", "InstanceNorm",
            "GeneralNorm", "LocalResponseNorm", "SyncBatchNorm"]


@_builtin
class LeakyReLU(Module):
    """``x if x > 0 else negative_slope * x`` (:func:`mgtrace.functional.leaky_relu`).

    Args:
        negative_slope: float, default 0.01 (MegEngine, PyTorch).
    """

    def __init__(self, negative_slope=0.01):
        super().__init__()
        self.negative_slope = A.to_float("LeakyReLU", "negative_slope", negative_slope)

    def config(self):
        return {"negative_slope": self.negative_slope}

    def extra_repr(self):
        return f"negative_slope={self.negative_slope}"

    def forward(self, x):
        return F.leaky_relu(x, self.negative_slope)


@_builtin
class PReLU(Module):
    """``max(0, x) + a * min(0, x)`` with a learned slope ``a``
    (:func:`mgtrace.functional.prelu`).

    Args:
        num_parameters: 1 (one slope for every channel) or the number of
            channels C of x [N, C, *] (one slope per channel).
        init: the initial slope, default 0.25.

    Parameter ``weight`` [num_parameters] (torch.nn.PReLU's layout;
    MegEngine stores [1, C, 1, 1], the same values), broadcast over axis 1.

    Raises:
        ValueError: num_parameters < 1; in forward, num_parameters > 1 and
            x's axis 1 of another size.
    """

    def __init__(self, num_parameters=1, init=0.25):
        super().__init__()
        fn = "PReLU"
        self.num_parameters = A.to_size(fn, "num_parameters", num_parameters, 1)
        self.init = A.to_float(fn, "init", init)
        self.weight = Parameter(np.full(self.num_parameters, self.init, np.float32))

    def reset_parameters(self):
        init.constant_(self.weight, self.init)

    def config(self):
        return {"num_parameters": self.num_parameters, "init": self.init}

    def _megengine_layout(self):
        """MegEngine's shape of the per-channel weight, [1, C, 1, 1] (its
        module/activation.py; one slope is [1] in both)."""
        if self.num_parameters > 1:
            return {"weight": ((1, self.num_parameters, 1, 1),)}
        return {}

    def extra_repr(self):
        return f"num_parameters={self.num_parameters}"

    def forward(self, x):
        w = self.weight
        if self.num_parameters > 1:
            if x.ndim < 2 or x.shape[1] != self.num_parameters:
                raise ValueError(f"PReLU: x must be [N, {self.num_parameters}, *] for "
                                 f"{self.num_parameters} parameters, got shape {x.shape}")
            w = w.reshape((1, self.num_parameters) + (1,) * (x.ndim - 2))
        return F.prelu(x, w)


@_builtin
class PixelShuffle(Module):
    """[..., C * r * r, H, W] -> [..., C, H * r, W * r]
    (:func:`mgtrace.functional.pixel_shuffle`), r = ``upscale_factor``."""

    def __init__(self, upscale_factor):
        super().__init__()
        self.upscale_factor = A.to_size("PixelShuffle", "upscale_factor", upscale_factor, 1)

    def config(self):
        return {"upscale_factor": self.upscale_factor}

    def extra_repr(self):
        return f"upscale_factor={self.upscale_factor}"

    def forward(self, x):
        return F.pixel_shuffle(x, self.upscale_factor)


@_builtin
class Pad(Module):
    """Pads its input (:func:`mgtrace.functional.pad`; MegEngine's Pad).

    Args:
        pad_width: an int, or one (before, after) pair per axis (config
            gives nested tuples).
        mode: "constant", "reflect", "replicate"/"edge", "circular"/"wrap".
        constant_val: the fill of "constant" (MegEngine's name).

    Raises:
        ValueError: an unknown mode, negative padding. TypeError: non-int
            pad_width.
    """

    def __init__(self, pad_width, mode="constant", constant_val=0.0):
        super().__init__()
        fn = "Pad"
        if isinstance(pad_width, (tuple, list)):
            pad_width = tuple(tuple(A.to_size(fn, "pad_width", v) for v in p)
                              if isinstance(p, (tuple, list)) else A.to_size(fn, "pad_width", p)
                              for p in pad_width)
        else:
            pad_width = A.to_size(fn, "pad_width", pad_width)
        if not isinstance(mode, str) or mode not in F.nn._PAD_MODES:
            raise ValueError(f"{fn}: mode must be one of {', '.join(map(repr, F.nn._PAD_MODES))}, "
                             f"got {mode!r}")
        self.pad_width, self.mode = pad_width, mode
        self.constant_val = A.to_float(fn, "constant_val", constant_val)

    def config(self):
        return {"pad_width": self.pad_width, "mode": self.mode, "constant_val": self.constant_val}

    def extra_repr(self):
        return f"pad_width={self.pad_width}, mode={self.mode}"

    def forward(self, x):
        return F.pad(x, self.pad_width, self.mode, self.constant_val)


@_builtin
class AdaptiveMaxPool2d(Module):
    """Max pooling of x [N, C, H, W] to ``output_size`` (int or pair;
    MegEngine's ``oshp``), :func:`mgtrace.functional.adaptive_max_pool2d`."""

    def __init__(self, output_size):
        super().__init__()
        self.output_size = _pool_arg("AdaptiveMaxPool2d", "output_size", output_size, 1)

    def config(self):
        return {"output_size": self.output_size}

    def extra_repr(self):
        return f"output_size={self.output_size}"

    def forward(self, x):
        return F.adaptive_max_pool2d(x, self.output_size)


def _affine_params(m, shape):
    if m.affine:
        m.weight = Parameter(np.ones(shape, np.float32))
        m.bias = Parameter(np.zeros(shape, np.float32))
    else:
        m.register_parameter("weight", None)
        m.register_parameter("bias", None)


@_builtin
class InstanceNorm(Module):
    """Instance normalization of x [N, C, *] (MegEngine's InstanceNorm,
    :func:`mgtrace.functional.instance_norm`): each sample's channel
    normalized over its spatial axes.

    Args:
        num_channels: C.
        eps: added to the variance, default 1e-5.
        affine: learn ``weight`` (ones) and ``bias`` (zeros) [C].
    """

    def __init__(self, num_channels, eps=1e-5, affine=True):
        super().__init__()
        fn = "InstanceNorm"
        self.num_channels = A.to_size(fn, "num_channels", num_channels, 1)
        self.eps = A.to_float(fn, "eps", eps)
        self.affine = A.to_bool(fn, "affine", affine)
        _affine_params(self, (self.num_channels,))

    def reset_parameters(self):
        if self.affine:
            init.ones_(self.weight)
            init.zeros_(self.bias)

    def config(self):
        return {"num_channels": self.num_channels, "eps": self.eps, "affine": self.affine}

    def extra_repr(self):
        return f"{self.num_channels}, eps={self.eps}, affine={self.affine}"

    def forward(self, x):
        if x.ndim < 2 or x.shape[1] != self.num_channels:
            raise ValueError(f"InstanceNorm: x must be [N, {self.num_channels}, *], got shape "
                             f"{x.shape}")
        return F.instance_norm(x, self.affine, self.weight, self.bias, self.eps)


@_builtin
class GeneralNorm(Module):
    """Normalization over the axes ``normalized_axis`` (MegEngine's
    GeneralNorm, :func:`mgtrace.functional.general_norm`).

    Args:
        normalized_shape: int or tuple, the sizes of the normalized axes in
            order (the shape of ``weight`` and ``bias``); required when
            ``affine``.
        normalized_axis: int or tuple of the same length, ascending once
            negative axes are counted from the end (default 0).
        eps: added to the variance. affine: learn weight (ones), bias (zeros).

    Raises:
        ValueError: normalized_shape missing with affine, lengths that
            differ, repeated axes; in forward, as general_norm.
    """

    def __init__(self, normalized_shape=None, normalized_axis=0, eps=1e-5, affine=True):
        super().__init__()
        fn = "GeneralNorm"
        self.affine = A.to_bool(fn, "affine", affine)
        self.eps = A.to_float(fn, "eps", eps)
        axes = normalized_axis if isinstance(normalized_axis, (tuple, list)) else (normalized_axis,)
        self.normalized_axis = tuple(A.to_int(fn, "normalized_axis", a) for a in axes)
        if len(set(self.normalized_axis)) != len(self.normalized_axis):
            raise ValueError(f"{fn}: normalized_axis {self.normalized_axis} repeats an axis")
        if normalized_shape is None:
            if self.affine:
                raise ValueError(f"{fn}: normalized_shape must be given when affine is True")
            self.normalized_shape = None
        else:
            self.normalized_shape = A.to_shape(fn, "normalized_shape", normalized_shape, False)
            if len(self.normalized_shape) != len(self.normalized_axis):
                raise ValueError(f"{fn}: normalized_shape {self.normalized_shape} and "
                                 f"normalized_axis {self.normalized_axis} differ in length")
        _affine_params(self, self.normalized_shape)

    def reset_parameters(self):
        if self.affine:
            init.ones_(self.weight)
            init.zeros_(self.bias)

    def config(self):
        return {"normalized_shape": self.normalized_shape, "normalized_axis": self.normalized_axis,
                "eps": self.eps, "affine": self.affine}

    def extra_repr(self):
        return (f"normalized_shape={self.normalized_shape}, normalized_axis="
                f"{self.normalized_axis}, eps={self.eps}, affine={self.affine}")

    def forward(self, x):
        return F.general_norm(x, self.normalized_axis, self.affine, self.weight, self.bias,
                              self.eps)


@_builtin
class LocalResponseNorm(Module):
    """Local response normalization across channels (MegEngine's
    LocalResponseNorm, :func:`mgtrace.functional.local_response_norm`:
    alpha is not divided by kernel_size).

    Args:
        kernel_size: odd int, default 5. k: 2.0. alpha: 1e-4. beta: 0.75.
    """

    def __init__(self, kernel_size=5, k=2.0, alpha=1e-4, beta=0.75):
        super().__init__()
        fn = "LocalResponseNorm"
        self.kernel_size = A.to_size(fn, "kernel_size", kernel_size, 1)
        if self.kernel_size % 2 == 0:
            raise ValueError(f"{fn}: kernel_size must be odd, got {self.kernel_size}")
        self.k = A.to_float(fn, "k", k)
        self.alpha = A.to_float(fn, "alpha", alpha)
        self.beta = A.to_float(fn, "beta", beta)

    def config(self):
        return {"kernel_size": self.kernel_size, "k": self.k, "alpha": self.alpha,
                "beta": self.beta}

    def extra_repr(self):
        return f"kernel_size={self.kernel_size}, k={self.k}, alpha={self.alpha}, beta={self.beta}"

    def forward(self, x):
        return F.local_response_norm(x, self.kernel_size, self.k, self.alpha, self.beta)


@_builtin
class SyncBatchNorm(_BatchNorm):
    """Synchronized batch normalization (MegEngine's SyncBatchNorm) in one
    process: :class:`BatchNorm2d`'s arguments, parameters, buffers and
    momentum convention (PyTorch's), over x [N, C] up to [N, C, D, H, W];
    ``eps_mode`` "additive" or "max" as
    :func:`mgtrace.functional.sync_batch_norm`. mgtrace has no process
    group, so the batch is the whole batch.

    Raises:
        ValueError: an unknown eps_mode; and as BatchNorm2d.
    """
    _input_ndims = (2, 3, 4, 5)

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, eps_mode="additive"):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        if eps_mode not in ("additive", "max"):
            raise ValueError(f"SyncBatchNorm: eps_mode must be 'additive' or 'max', got "
                             f"{eps_mode!r}")
        self.eps_mode = eps_mode

    def config(self):
        cfg = super().config()
        del cfg["bias"]
        cfg["eps_mode"] = self.eps_mode
        return cfg

    def forward(self, x):
        if self.eps_mode == "additive":
            return super().forward(x)
        if x.ndim not in self._input_ndims:
            raise ValueError(f"SyncBatchNorm: expected 2D to 5D input, got {x.ndim}D input of "
                             f"shape {x.shape}")
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            self.num_batches_tracked += 1
            if self.momentum is None:
                factor = 1.0 / float(self.num_batches_tracked.item())
        track = not self.training or self.track_running_stats
        return F.sync_batch_norm(x, self.running_mean if track else None,
                                 self.running_var if track else None, self.weight, self.bias,
                                 self.training or self.running_mean is None, 1.0 - factor,
                                 self.eps, "max")


__all__ += ["Conv3d", "ConvTranspose3d", "LocalConv2d", "SlidingWindow", "SlidingWindowTranspose"]


@_builtin
class Conv3d(_ConvNd):
    """3-d convolution (cross-correlation) over x float32 [N, C_in, D, H, W]
    (MegEngine's Conv3d; :func:`mgtrace.functional.conv3d`, composed of
    conv2d).

    Args as torch.nn.Conv3d (MegEngine's are the first eight):
    ``kernel_size``, ``stride``, ``padding``, ``dilation`` are ints or
    triples (config gives triples); ``padding_mode`` as :class:`Conv2d`.
    Parameters ``weight`` [C_out, C_in/groups, KD, KH, KW] (PyTorch's
    layout), ``bias`` [C_out].

    Raises ValueError as :class:`Conv2d`.
    """
    _n = 3

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0,
                 dilation=1, groups=1, bias=True, padding_mode="zeros"):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation,
                         groups, bias, padding_mode=padding_mode)

    def forward(self, x):
        return F.conv3d(self._padded(x), self.weight, self.bias, self.stride,
                        self._conv_padding(), self.dilation, self.groups)


@_builtin
class ConvTranspose3d(_ConvTransposeNd):
    """3-d transposed convolution over x float32 [N, C_in, D, H, W]
    (MegEngine's ConvTranspose3d; :func:`mgtrace.functional.conv_transpose3d`).

    Args as torch.nn.ConvTranspose3d (``output_padding`` before ``groups``,
    ``dilation`` last; ``padding_mode`` only "zeros"). Parameters
    ``weight`` [C_in, C_out/groups, KD, KH, KW], ``bias`` [C_out].
    """
    _n = 3

    def forward(self, x):
        return F.conv_transpose3d(x, self.weight, self.bias, self.stride, self.padding,
                                  self.output_padding, self.dilation, self.groups)


@_builtin
class LocalConv2d(Module):
    """Locally connected 2-d layer (MegEngine's LocalConv2d): a kernel per
    output position, :func:`mgtrace.functional.local_conv2d`.

    Args (MegEngine's):
        in_channels, out_channels: C_in, C_out.
        input_height, input_width: the input size the weights are for.
        kernel_size, stride, padding, dilation: int or pair.
        groups: dividing both channel counts.

    Parameter ``weight`` [groups, OH, OW, C_in/groups, KH, KW,
    C_out/groups] (MegEngine's layout), initialised as a conv of that
    kernel (U(+-1/sqrt(fan_in))); no bias (as MegEngine's).

    Raises:
        ValueError: channels not divisible by groups, a kernel larger than
            the padded input.
    """

    def __init__(self, in_channels, out_channels, input_height, input_width, kernel_size,
                 stride=1, padding=0, dilation=1, groups=1):
        super().__init__()
        fn = "LocalConv2d"
        self.in_channels = A.to_size(fn, "in_channels", in_channels, 1)
        self.out_channels = A.to_size(fn, "out_channels", out_channels, 1)
        self.input_height = A.to_size(fn, "input_height", input_height, 1)
        self.input_width = A.to_size(fn, "input_width", input_width, 1)
        self.kernel_size = A.pair(fn, "kernel_size", kernel_size, 1)
        self.stride = A.pair(fn, "stride", stride, 1)
        self.padding = A.pair(fn, "padding", padding, 0)
        self.dilation = A.pair(fn, "dilation", dilation, 1)
        self.groups = A.to_size(fn, "groups", groups, 1)
        g = self.groups
        if self.in_channels % g or self.out_channels % g:
            raise ValueError(f"{fn}: in_channels ({self.in_channels}) and out_channels "
                             f"({self.out_channels}) must both be divisible by groups ({g})")
        oh, ow = F.nn._windows_out(fn, (self.input_height, self.input_width), self.kernel_size,
                                   self.padding, self.stride, self.dilation)
        self.weight = _empty_param((g, oh, ow, self.in_channels // g) + self.kernel_size
                                   + (self.out_channels // g,))
        self.reset_parameters()

    def reset_parameters(self):
        fan_in = (self.in_channels // self.groups) * self.kernel_size[0] * self.kernel_size[1]
        bound = 1 / math.sqrt(fan_in)
        init.uniform_(self.weight, -bound, bound)

    def config(self):
        return {"in_channels": self.in_channels, "out_channels": self.out_channels,
                "input_height": self.input_height, "input_width": self.input_width,
                "kernel_size": self.kernel_size, "stride": self.stride, "padding": self.padding,
                "dilation": self.dilation, "groups": self.groups}

    def extra_repr(self):
        return (f"{self.in_channels}, {self.out_channels}, input=({self.input_height}, "
                f"{self.input_width}), kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}, dilation={self.dilation}, groups={self.groups}")

    def forward(self, x):
        return F.local_conv2d(x, self.weight, None, self.stride, self.padding, self.dilation)


class _Window(Module):
    def _geometry(self, fn, kernel_size, padding, stride, dilation):
        self.kernel_size = A.pair(fn, "kernel_size", kernel_size, 1)
        self.padding = A.pair(fn, "padding", padding, 0)
        self.stride = A.pair(fn, "stride", stride, 1)
        self.dilation = A.pair(fn, "dilation", dilation, 1)

    def config(self):
        return {"kernel_size": self.kernel_size, "padding": self.padding, "stride": self.stride,
                "dilation": self.dilation}

    def extra_repr(self):
        return ", ".join(f"{k}={v}" for k, v in self.config().items())


@_builtin
class SlidingWindow(_Window):
    """The sliding blocks of x [N, C, H, W] as [N, C, OH, OW, KH, KW]
    (MegEngine's SlidingWindow, :func:`mgtrace.functional.sliding_window`).

    Args: kernel_size, padding=0, stride=1, dilation=1 (ints or pairs;
    config gives pairs).
    """

    def __init__(self, kernel_size, padding=0, stride=1, dilation=1):
        super().__init__()
        self._geometry("SlidingWindow", kernel_size, padding, stride, dilation)

    def forward(self, x):
        return F.sliding_window(x, self.kernel_size, self.padding, self.stride, self.dilation)


@_builtin
class SlidingWindowTranspose(_Window):
    """Sums [N, C, OH, OW, KH, KW] windows back into [N, C, H, W] images
    (MegEngine's SlidingWindowTranspose,
    :func:`mgtrace.functional.sliding_window_transpose`).

    Args: output_size (int or (h, w)), kernel_size, padding=0, stride=1,
    dilation=1.
    """

    def __init__(self, output_size, kernel_size, padding=0, stride=1, dilation=1):
        super().__init__()
        self.output_size = A.pair("SlidingWindowTranspose", "output_size", output_size, 1)
        self._geometry("SlidingWindowTranspose", kernel_size, padding, stride, dilation)

    def config(self):
        return {"output_size": self.output_size, **super().config()}

    def forward(self, x):
        return F.sliding_window_transpose(x, self.output_size, self.kernel_size, self.padding,
                                          self.stride, self.dilation)


__all__ += ["DeformableConv2d", "RegionRestrictedConv"]


def _conv_modes(fn, conv_mode, compute_mode):
    if not isinstance(conv_mode, str) or conv_mode.lower() != "cross_correlation":
        raise ValueError(f"{fn}: conv_mode must be 'cross_correlation', got {conv_mode!r}")
    if compute_mode not in ("default", "float32"):
        raise ValueError(f"{fn}: compute_mode must be 'default' or 'float32', got "
                         f"{compute_mode!r}")


@_builtin
class DeformableConv2d(_ConvNd):
    """Modulated deformable 2-d convolution (MegEngine's DeformableConv2d,
    :func:`mgtrace.functional.deformable_conv2d`); forward(inp [N, C, H, W],
    offset [N, 2 * dg * KH * KW, OH, OW], mask [N, dg * KH * KW, OH, OW]).

    Args (MegEngine's): in_channels, out_channels, kernel_size, stride=1,
    padding=0, dilation=1, groups=1, bias=True, conv_mode
    ("cross_correlation"), compute_mode ("default" or "float32").
    Parameters ``weight`` [O, C/groups, KH, KW] and ``bias`` [O] (PyTorch's
    and torchvision's layouts; MegEngine keeps [groups, O/groups, C/groups,
    KH, KW] and [1, O, 1, 1], the same values).
    """
    _n = 2

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
                 groups=1, bias=True, conv_mode="cross_correlation", compute_mode="default"):
        _conv_modes("DeformableConv2d", conv_mode, compute_mode)
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation,
                         groups, bias)
        self.conv_mode, self.compute_mode = conv_mode, compute_mode

    def config(self):
        cfg = self._common_config()
        del cfg["padding_mode"]
        cfg["conv_mode"], cfg["compute_mode"] = self.conv_mode, self.compute_mode
        return cfg

    def forward(self, inp, offset, mask):
        return F.deformable_conv2d(inp, self.weight, offset, mask, self.bias, self.stride,
                                   self.padding, self.dilation, self.groups, self.conv_mode,
                                   self.compute_mode)


@_builtin
class RegionRestrictedConv(_ConvNd):
    """Region-restricted 2-d convolution (MegEngine's RegionRestrictedConv,
    :func:`mgtrace.functional.region_restricted_conv`); forward(inp [N, C,
    H, W], rin [N, H, W], rout [N, OH, OW]).

    Args (MegEngine's order: ``groups`` right after ``kernel_size``):
    in_channels, out_channels, kernel_size, groups=1, bias=True, stride=1,
    padding=0, dilation=1, conv_mode, compute_mode, padding_mode (only
    "zeros": padded pixels belong to no region). Parameters as
    :class:`DeformableConv2d`.
    """
    _n = 2

    def __init__(self, in_channels, out_channels, kernel_size, groups=1, bias=True, stride=1,
                 padding=0, dilation=1, conv_mode="cross_correlation", compute_mode="default",
                 padding_mode="zeros"):
        fn = "RegionRestrictedConv"
        _conv_modes(fn, conv_mode, compute_mode)
        if padding_mode != "zeros":
            raise ValueError(f"{fn}: padding_mode must be 'zeros' (padded pixels belong to no "
                             f"region), got {padding_mode!r}")
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation,
                         groups, bias)
        self.conv_mode, self.compute_mode = conv_mode, compute_mode

    def config(self):
        cfg = self._common_config()
        cfg["conv_mode"], cfg["compute_mode"] = self.conv_mode, self.compute_mode
        return cfg

    def forward(self, inp, rin, rout):
        return F.region_restricted_conv(inp, self.weight, rin, rout, self.bias, self.stride,
                                        self.padding, self.dilation, self.groups, self.conv_mode,
                                        self.compute_mode)


__all__ += ["DeformablePSROIPooling"]


@_builtin
class DeformablePSROIPooling(Module):
    """Deformable RoI pooling (MegEngine's DeformablePSROIPooling,
    :func:`mgtrace.functional.deformable_psroi_pooling`); forward(inp
    [N, C, H, W], rois [R, 5], trans [R, 2, pooled_h, pooled_w]) ->
    [R, C, pooled_h, pooled_w]. No parameters.

    Args (MegEngine's): no_trans, part_size, pooled_h, pooled_w,
    sample_per_part, spatial_scale, trans_std=0.1.
    """

    def __init__(self, no_trans, part_size, pooled_h, pooled_w, sample_per_part, spatial_scale,
                 trans_std=0.1):
        super().__init__()
        fn = "DeformablePSROIPooling"
        self.no_trans = A.to_bool(fn, "no_trans", no_trans)
        self.part_size = A.to_size(fn, "part_size", part_size, 1)
        self.pooled_h = A.to_size(fn, "pooled_h", pooled_h, 1)
        self.pooled_w = A.to_size(fn, "pooled_w", pooled_w, 1)
        self.sample_per_part = A.to_size(fn, "sample_per_part", sample_per_part, 1)
        self.spatial_scale = A.to_float(fn, "spatial_scale", spatial_scale)
        self.trans_std = A.to_float(fn, "trans_std", trans_std)

    def config(self):
        return {"no_trans": self.no_trans, "part_size": self.part_size,
                "pooled_h": self.pooled_h, "pooled_w": self.pooled_w,
                "sample_per_part": self.sample_per_part, "spatial_scale": self.spatial_scale,
                "trans_std": self.trans_std}

    def extra_repr(self):
        return ", ".join(f"{k}={v}" for k, v in self.config().items())

    def forward(self, inp, rois, trans):
        return F.deformable_psroi_pooling(inp, rois, trans, self.no_trans, self.part_size,
                                          self.pooled_h, self.pooled_w, self.sample_per_part,
                                          self.spatial_scale, self.trans_std)
