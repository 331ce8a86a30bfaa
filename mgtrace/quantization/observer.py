"""Observers: modules that watch the float tensors passing through them and
turn their range into quantization parameters (MegEngine's
``quantization/observer.py``, same names and defaults).

When an observer observes (``enabled``), with MegEngine's rule kept and made
exact: whichever came last of ``enable()``/``disable()`` (also through
:func:`~mgtrace.quantization.enable_observer`) and a change of training mode
by ``train()``/``eval()`` on the observer or any ancestor decides. So
``eval()`` stops observing, ``train()`` resumes it, and ``model.eval();
enable_observer(model)`` calibrates in eval mode, as in MegEngine.

Two MegEngine bugs are fixed, not copied: its ``SyncMinMaxObserver`` tests
the bound method ``self.enable`` (always true) and its ``HistogramObserver``
never looks at the flag, so both always observe; here every observer,
Histogram included, observes only when enabled. On one process the Sync
variants are aliases of the plain ones (there is no all-reduce to do).

Per-channel scales (beyond MegEngine, as ONNX's per-axis QuantizeLinear):
``MinMaxObserver(axis=0, channels=C)`` keeps ``[C]`` running minima/maxima over every
axis but ``axis`` and yields a ``[C]`` scale (and zero point); use it as a
weight observer (``axis=0`` for Linear and Conv2d weights).
"""
import math

import numpy as np

import mgtrace.functional as F
from mgtrace._core import tensor as _tensor
from mgtrace.module.builtin import register_as_builtin
from mgtrace.module.module import Module
from mgtrace.quantization.utils import (QParams, QuantMode, QuantizationError,
                                        create_qparams, quant_dtype)

__all__ = ["Observer", "MinMaxObserver", "SyncMinMaxObserver",
           "ExponentialMovingAverageObserver", "SyncExponentialMovingAverageObserver",
           "HistogramObserver", "PassiveObserver"]


def _f32(value):
    return _tensor(np.asarray(value, dtype=np.float32))


class Observer(Module):
    """Base class of observers.

    Args:
        dtype: a quantized dtype name (``"qint8"``, ``"qint8_narrow"``,
            ``"quint8"``, ``"qint4"``, ``"quint4"``, ``"qint32"``) or a
            :class:`~mgtrace.quantization.QuantDtypeMeta`.

        enable: start observing (default) or not.
        enable_mode: the training mode ``enable`` was set in (default True,
            a new module's mode); ``config()`` records it so that an
            archive's observer observes, after its training mode is
            restored, exactly when the saved one did.

    Raises QuantizationError for an unknown dtype. ``forward(x)`` returns x
    unchanged; ``get_qparams()`` returns the current :class:`QParams`.

    Every observer is a builtin (a leaf for the tracer), stored in archives
    by ``config()`` (format 1.2).
    """

    def __init__(self, dtype, **kwargs):
        super().__init__()
        kwargs.pop("narrow_range", None)    # MegEngine accepts and ignores it
        enable = kwargs.pop("enable", True)
        enable_mode = kwargs.pop("enable_mode", True)
        if kwargs:
            raise TypeError(f"{type(self).__name__} got unexpected arguments {sorted(kwargs)}")
        meta = quant_dtype(dtype)
        self.dtype_name = meta.name
        self.qmin = meta.qmin
        self.qmax = meta.qmax
        self._enabled = bool(enable)
        self._mode_at_toggle = bool(enable_mode)

    def config(self):
        """Constructor arguments (plain values) that rebuild this observer,
        its enabled state included (see ``enable_mode``)."""
        return {"dtype": self.dtype_name, "enable": self.enabled,
                "enable_mode": self.__dict__.get("training", True)}

    @property
    def dtype(self):
        """The :class:`QuantDtypeMeta` this observer computes qparams for."""
        return quant_dtype(self.dtype_name)

    @property
    def enabled(self):
        """Whether forward observes (see the module docstring for the rule)."""
        mode = self.__dict__.get("training", True)
        if mode != self._mode_at_toggle:
            return mode
        return self._enabled

    @enabled.setter
    def enabled(self, value):
        self.__dict__["_enabled"] = bool(value)
        self.__dict__["_mode_at_toggle"] = self.__dict__.get("training", True)

    def enable(self):
        self.enabled = True

    def disable(self):
        self.enabled = False

    def get_qparams(self):
        raise NotImplementedError

    def forward(self, x):
        raise NotImplementedError


def _has_values(x):
    """False for a tensor with a zero-sized axis (nothing to observe: min and
    max have no identity), as HistogramObserver already skips it."""
    return all(not (isinstance(d, int) and d == 0) for d in x.shape)


def _mode(mode):
    """A QuantMode from a QuantMode or its name (as ``config()`` stores it)."""
    if isinstance(mode, str) and mode in QuantMode.__members__:
        return QuantMode[mode]
    if not isinstance(mode, QuantMode):
        raise QuantizationError(f"mode must be a QuantMode, got {mode!r}")
    return mode


class MinMaxObserver(Observer):
    """Records the running minimum and maximum of its inputs (buffers
    ``min_val``, ``max_val``) and derives qparams from them.

    Args:
        mode: QuantMode.SYMMERTIC (zero point 0, ``scale = max(|min|, max) /
            ((qmax - qmin) / 2)``) or ASYMMERTIC (``scale = (max - min) /
            (qmax - qmin)``, ``zero_point = qmin - rint(min / scale)``);
            the range always includes 0, and the scale is at least ``eps``.
        eps: the smallest scale (avoids dividing by zero before any input).
        dtype: the quantized dtype, as for :class:`Observer`.
        axis: None for one scale per tensor; an int for one scale per index
            of that axis (per-channel; beyond MegEngine).
        channels: with ``axis``, the size of that axis. Given, the buffers
            are ``[channels]`` from the start (so a saved state loads into a
            fresh observer) and an input of another size raises
            QuantizationError; None, they are scalars until the first input
            sets the size.

    Raises QuantizationError for a bad mode, ``channels`` without ``axis``, or
    (in forward) an input whose ``axis`` is out of range or of another size.
    """

    def __init__(self, mode=QuantMode.SYMMERTIC, eps=0.00001, dtype="qint8", axis=None,
                 channels=None, **kwargs):
        super().__init__(dtype, **kwargs)
        mode = _mode(mode)
        if channels is not None and axis is None:
            raise QuantizationError("channels= needs axis= (the channel axis)")
        self.mode = mode
        self.scale_limit = float(eps)
        self.axis = axis
        self.channels = channels
        shape = () if channels is None else (int(channels),)
        self.min_val = _f32(np.full(shape, np.finfo(np.float32).max))
        self.max_val = _f32(np.full(shape, np.finfo(np.float32).min))

    def config(self):
        cfg = super().config()
        channels = self.channels
        if channels is None and self.min_val.ndim:      # sized by its first input
            channels = int(self.min_val.shape[0])
        cfg.update(mode=self.mode.name, eps=self.scale_limit, axis=self.axis,
                   channels=channels)
        return cfg

    def _reduce(self, x):
        """Per-tensor or per-channel (min, max) of x."""
        if self.axis is None:
            return x.min(), x.max()
        if not -x.ndim <= self.axis < x.ndim:
            raise QuantizationError(f"{type(self).__name__}(axis={self.axis}) got an input "
                                    f"of shape {tuple(x.shape)}")
        axis = self.axis % x.ndim
        if self.min_val.ndim and x.shape[axis] != self.min_val.shape[0]:
            raise QuantizationError(
                f"{type(self).__name__} keeps {self.min_val.shape[0]} channels along axis "
                f"{self.axis}, got an input of shape {tuple(x.shape)}")
        others = tuple(i for i in range(x.ndim) if i != axis)
        if not others:
            return x, x
        return F.min(x, axis=others), F.max(x, axis=others)

    def _calculate_qparams(self, inp_min_val, inp_max_val):
        min_val = F.minimum(0.0, inp_min_val)
        max_val = F.maximum(0.0, inp_max_val)
        eps = self.scale_limit
        if self.mode == QuantMode.SYMMERTIC:
            bound = F.maximum(-min_val, max_val)
            scale = F.maximum(bound / ((self.qmax - self.qmin) / 2), eps)
            zero_point = None
        else:
            scale = F.maximum((max_val - min_val) / float(self.qmax - self.qmin), eps)
            zero_point = float(self.qmin) - F.round(min_val / scale)
        axis = None if self.axis is None or scale.ndim == 0 else self.axis
        return create_qparams(self.mode, self.dtype, scale=scale, zero_point=zero_point,
                              axis=axis)

    def get_qparams(self):
        return self._calculate_qparams(self.min_val, self.max_val)

    def forward(self, x):
        if self.enabled and _has_values(x):       # an empty batch has no min or max
            lo, hi = self._reduce(x)
            self.min_val = F.minimum(self.min_val, lo)
            self.max_val = F.maximum(self.max_val, hi)
        return x


class ExponentialMovingAverageObserver(MinMaxObserver):
    """A :class:`MinMaxObserver` whose min/max follow an exponential moving
    average: ``v = v * m + (1 - m) * batch_v``, where m is 0 for the first
    observed batch (so it is taken as is) and ``momentum`` afterwards
    (buffer ``runtime_momentum``)."""

    def __init__(self, momentum=0.9, mode=QuantMode.SYMMERTIC, eps=0.00001, dtype="qint8",
                 axis=None, channels=None, **kwargs):
        super().__init__(mode, eps, dtype, axis, channels, **kwargs)
        self.momentum = float(momentum)
        self.runtime_momentum = _f32(0.0)

    def config(self):
        return dict(super().config(), momentum=self.momentum)

    def set_momentum(self, momentum):
        self.momentum = float(momentum)

    def _from_megengine_state(self, state, prefix):
        """MegEngine's state dict holds the momentum as a tensor, mgtrace's
        observer as a setting: a ``momentum`` entry equal to it (in float32)
        is dropped (load_state_dict(layout="megengine")'s hook); another
        value raises StateDictError (a ValueError) naming set_momentum."""
        key = prefix + "momentum"
        if key not in state:
            return state
        v = state[key]
        v = np.asarray(v.numpy() if hasattr(v, "numpy") else v)
        if v.size != 1 or np.float32(v.reshape(())) != np.float32(self.momentum):
            from mgtrace.module.module import StateDictError
            raise StateDictError(f"{key}: momentum {v.reshape(-1)[:2].tolist()} in the state "
                                 f"dict, {self.momentum} here (set it with set_momentum)",
                                 [], [], [(key, "value", self.momentum, v.tolist())])
        return {k: x for k, x in state.items() if k != key}

    def _to_megengine_state(self, state, prefix):
        """``state`` with MegEngine's ``momentum`` tensor added."""
        state[prefix + "momentum"] = _f32(self.momentum)
        return state

    def forward(self, x):
        if self.enabled and _has_values(x):       # an empty batch moves no average
            lo, hi = self._reduce(x)
            m = self.runtime_momentum
            one_minus = 1.0 - m
            self.min_val = self.min_val * m + one_minus * lo
            self.max_val = self.max_val * m + one_minus * hi
            self.runtime_momentum = _f32(self.momentum)
        return x


def _l2(begin, end, density):
    """density * integral of t^2 over [begin, end]."""
    return density * (end ** 3 - begin ** 3) / 3


# the most fine bins HistogramObserver._resample lays out (float64: 128 MiB)
_FINE_MAX = 1 << 24


class HistogramObserver(MinMaxObserver):
    """A :class:`MinMaxObserver` that keeps a running histogram of its inputs
    (buffer ``histogram``, ``bins`` bins over ``[min_val, max_val]``) and
    picks the min/max that minimise an L2 estimate of the quantization error
    (MegEngine's, after PyTorch's, non-linear parameter search), which clips
    outliers. Used for post-training calibration. Per tensor only.

    Args:
        bins: number of histogram bins.
        upsample_rate: how finely an old histogram is resampled when the
            range grows.
        mode, eps, dtype: as :class:`MinMaxObserver`.
    """

    def __init__(self, bins=2048, upsample_rate=128, mode=QuantMode.SYMMERTIC, eps=0.00001,
                 dtype="qint8", **kwargs):
        if kwargs.get("axis") is not None or kwargs.get("channels") is not None:
            raise QuantizationError("HistogramObserver is per tensor only: use "
                                    "MinMaxObserver(axis=..., channels=...) per channel")
        kwargs.pop("axis", None)
        kwargs.pop("channels", None)
        super().__init__(mode, eps, dtype, **kwargs)
        self.bins = int(bins)
        self.upsample_rate = int(upsample_rate)
        self.dst_nbins = self.qmax - self.qmin + 1
        self.histogram = _f32([-1.0] + [0.0] * (self.bins - 1))

    def config(self):
        cfg = super().config()
        del cfg["axis"], cfg["channels"]
        return dict(cfg, bins=self.bins, upsample_rate=self.upsample_rate)

    # ---- search
    def _quantization_error(self, hist, bin_width, start, end):
        dst_w = bin_width * (end - start + 1) / self.dst_nbins
        if dst_w == 0.0:
            return 0.0
        src_begin = (np.arange(self.bins, dtype=np.float64) - start) * bin_width
        src_end = src_begin + bin_width
        last = self.dst_nbins - 1
        d_begin = np.clip(np.floor(src_begin / dst_w), 0, last)
        d_end = np.clip(np.floor(src_end / dst_w), 0, last)
        c_begin = d_begin * dst_w + dst_w / 2
        c_end = d_end * dst_w + dst_w / 2
        density = hist / bin_width
        inside = _l2(src_begin - c_begin, src_end - c_begin, density)
        across = (_l2(src_begin - c_begin, dst_w / 2, density)
                  + (d_end - d_begin - 1) * _l2(-dst_w / 2, dst_w / 2, density)
                  + _l2(-dst_w / 2, src_end - c_end, density))
        return float(np.sum(np.where(d_begin == d_end, inside, across)))

    def _non_linear_param_search(self):
        lo = float(self.min_val.numpy())
        hi = float(self.max_val.numpy())
        hist = self.histogram.numpy().astype(np.float64)
        bin_width = (hi - lo) / self.bins
        total = hist.sum()
        csum = np.cumsum(hist)
        step, alpha, beta = 1e-5, 0.0, 1.0
        start, end = 0, self.bins - 1
        best = math.inf
        while alpha < beta:
            next_alpha, next_beta = alpha + step, beta - step
            left = min(end, max(start, int(np.searchsorted(csum, next_alpha * total, "left"))))
            right = max(start, min(end, int(np.searchsorted(csum, next_beta * total,
                                                            "right")) - 1))
            new_start, new_end = start, end
            if left - start > end - right:
                new_start, alpha = left, next_alpha
            else:
                new_end, beta = right, next_beta
            if (new_start, new_end) == (start, end):
                continue
            err = self._quantization_error(hist, bin_width, new_start, new_end)
            if err > best:
                break
            best, start, end = err, new_start, new_end
        return _f32(lo + bin_width * start), _f32(lo + bin_width * (end + 1))

    def get_qparams(self):
        if float(self.histogram.numpy()[0]) == -1.0:    # nothing observed yet
            return self._calculate_qparams(self.min_val, self.max_val)
        return self._calculate_qparams(*self._non_linear_param_search())

    # ---- observing
    def _resample(self, old, old_lo, old_hi, new_lo, new_hi):
        """``old`` (bins over [old_lo, old_hi]) spread over bins of
        [new_lo, new_hi], assuming uniform density inside each old bin."""
        up = self.upsample_rate
        fine_w = (old_hi - old_lo) / (self.bins * up)
        down = int(np.ceil((new_hi - new_lo) / (self.bins * fine_w)))
        pad = down * self.bins * fine_w - (new_hi - new_lo)
        new_lo, new_hi = new_lo - pad / 2, new_hi + pad / 2
        if self.bins * down > _FINE_MAX:
            # a range grown by orders of magnitude (1 then 3e38): the fine
            # grid would not fit in memory (NumPy's "Maximum allowed
            # dimension exceeded"); spread each old bin over the new bins
            # it overlaps instead, the same uniform density
            cdf = np.concatenate([[0.0], np.cumsum(old, dtype=np.float64)])
            mass = np.interp(np.linspace(new_lo, new_hi, self.bins + 1),
                             np.linspace(old_lo, old_hi, self.bins + 1), cdf)
            return np.diff(mass), new_lo, new_hi
        offset = int(np.round((old_lo - new_lo) / fine_w))
        fine = np.zeros(self.bins * down)
        fine[offset:offset + self.bins * up] = np.repeat(old, up) / up
        out = np.add.reduceat(fine, np.arange(0, self.bins * down, down))
        return out, new_lo, new_hi

    def forward(self, x):
        if not self.enabled:
            return x
        data = x.numpy().astype(np.float64).ravel()
        if data.size == 0:
            return x
        lo, hi = float(data.min()), float(data.max())
        if not (math.isfinite(lo) and math.isfinite(hi)):
            raise QuantizationError(f"HistogramObserver got non-finite values (min {lo}, "
                                    f"max {hi}); a histogram needs finite inputs")
        hist = self.histogram.numpy().astype(np.float64)
        old_lo, old_hi = float(self.min_val.numpy()), float(self.max_val.numpy())
        if hist[0] == -1.0:
            new = np.histogram(data, self.bins, (lo, hi))[0].astype(np.float64)
        else:
            lo, hi = min(lo, old_lo), max(hi, old_hi)
            if (lo, hi) == (old_lo, old_hi):
                new = np.histogram(data, self.bins, (lo, hi))[0] + hist
            elif old_hi == old_lo:      # the old range is one point: put its count there
                new = np.histogram(data, self.bins, (lo, hi))[0].astype(np.float64)
                new += np.histogram(np.full(1, old_lo), self.bins, (lo, hi))[0] * hist.sum()
            else:
                spread, lo, hi = self._resample(hist, old_lo, old_hi, lo, hi)
                new = np.histogram(data, self.bins, (lo, hi))[0] + spread
        self.histogram = _f32(new)
        self.min_val = _f32(lo)
        self.max_val = _f32(hi)
        return x


class PassiveObserver(Observer):
    """An observer whose qparams are set, not observed: by
    ``set_qparams`` (from another observer) or its ``scale`` property, as
    EasyQuant's search does. ``forward`` returns its input."""

    def __init__(self, dtype, **kwargs):
        super().__init__(dtype, **kwargs)
        self.qparams = None
        self.orig_scale = None

    @property
    def scale(self):
        return self.qparams.scale

    @scale.setter
    def scale(self, value):
        value = np.asarray(value, dtype=np.float32)
        if not np.all(value > 0):
            raise QuantizationError(f"a scale must be positive, got {value}")
        self.qparams.scale = _f32(value)

    def get_qparams(self):
        return self.qparams

    def set_qparams(self, qparams):
        """Take a copy of ``qparams`` (which must have a scale and, if it has
        a dtype, this observer's)."""
        if qparams.scale is None:
            raise QuantizationError("PassiveObserver.set_qparams needs qparams with a scale")
        if qparams.dtype_meta is not None and qparams.dtype_meta != self.dtype:
            raise QuantizationError(f"qparams are for {qparams.dtype_meta.name}, "
                                    f"this observer for {self.dtype.name}")
        new = type(qparams).__new__(type(qparams))
        new.update(qparams)
        if new.dtype_meta is None:
            new.dtype_meta = self.dtype
        self.qparams = new
        self.orig_scale = qparams.scale.numpy().copy()

    def forward(self, x):
        return x


SyncMinMaxObserver = MinMaxObserver
SyncExponentialMovingAverageObserver = ExponentialMovingAverageObserver

# Builtins (tracer leaves) stored by config() in archives of format 1.2. A
# PassiveObserver is not one: its qparams are not module state, so a trace
# keeps them as a FakeQuantize's (see mgtrace.module.qat's trace rule).
for _cls in (MinMaxObserver, ExponentialMovingAverageObserver, HistogramObserver):
    register_as_builtin(_cls, name=f"mgtrace.quantization.{_cls.__name__}")
del _cls
