"""Fake quantization modules (MegEngine's ``quantization/fake_quant.py``):
quantize a float tensor and dequantize it back in the forward, so that a
float model sees the rounding and saturation its int8 deployment will.

The rounding rule is round half to even (see :mod:`mgtrace.quantization.utils`).
FakeQuantize, TQT and LSQ are builtins (leaves for the tracer), stored in
archives of format 1.2 by ``config()`` and their tensors.
"""
import math

import numpy as np

import mgtrace.functional as F
from mgtrace._core import tensor as _tensor
from mgtrace.module.builtin import register_as_builtin
from mgtrace.module.module import Module
from mgtrace.module.parameter import Parameter
from mgtrace.quantization.utils import (LSQParams, QuantMode, QuantizationError,
                                        create_qparams, fake_quant_tensor, lsq_forward,
                                        quant_dtype, tqt_forward)

__all__ = ["FakeQuantize", "TQT", "LSQ"]


def _f32(value):
    return _tensor(np.asarray(value, dtype=np.float32))


def _per_tensor(who, qparams):
    if getattr(qparams, "axis", None) is not None or qparams.scale.ndim != 0:
        raise QuantizationError(f"{who} learns one scale per tensor; got per-channel qparams "
                                f"(axis {qparams.axis}, scale shape {tuple(qparams.scale.shape)})")


class _FakeQuantize(Module):
    """Base: ``forward(inp, qparams=None)`` fake-quantizes when ``enabled``,
    else returns ``inp``. Unlike observers, ``train()``/``eval()`` do not
    change ``enabled`` (as MegEngine)."""

    def __init__(self, dtype, enable=True, **kwargs):
        super().__init__()
        kwargs.pop("narrow_range", None)    # MegEngine accepts and ignores it
        if kwargs:
            raise TypeError(f"{type(self).__name__} got unexpected arguments {sorted(kwargs)}")
        meta = quant_dtype(dtype)
        self.dtype_name = meta.name
        self.qmin = meta.qmin
        self.qmax = meta.qmax
        self.enabled = bool(enable)

    @property
    def dtype(self):
        """The :class:`QuantDtypeMeta` fake-quantized to."""
        return quant_dtype(self.dtype_name)

    def config(self):
        """Constructor arguments (plain values) that rebuild this module."""
        return {"dtype": self.dtype_name, "enable": self.enabled}

    def enable(self):
        self.enabled = True

    def disable(self):
        self.enabled = False

    def fake_quant_forward(self, inp, qparams=None):
        raise NotImplementedError

    def normal_forward(self, inp, qparams=None):
        return inp

    def forward(self, inp, qparams=None):
        if self.enabled:
            return self.fake_quant_forward(inp, qparams=qparams)
        return self.normal_forward(inp, qparams=qparams)


class FakeQuantize(_FakeQuantize):
    """Fake quantization with the qparams an observer gives,
    ``forward(inp, qparams)``, or with its own: after ``set_qparams(q)``,
    ``forward(inp)`` uses a copy of ``q`` (MegEngine's traced-module
    FakeQuantize; a trace puts one, carrying a user observer's qparams,
    where that observer was).

    Args:
        dtype: quantized dtype name or QuantDtypeMeta.
        enable: start enabled (fake-quantizing) or not.
        qparams_layout: None (no qparams of its own), or what ``config()``
            records of them: ``{"mode": "SYMMERTIC" | "ASYMMERTIC", "axis":
            int | None, "shape": [...]}``; the buffers ``scale`` and
            ``zero_point`` then have that shape (an archive fills them).

    ``inp``: float32, any shape; the result has its shape and dtype. Raises
    QuantizationError when there are no qparams, or they are for another
    dtype.
    """

    def __init__(self, dtype, enable=True, qparams_layout=None, **kwargs):
        super().__init__(dtype, enable, **kwargs)
        self.qparams_mode = None
        self.qparams_axis = None
        if qparams_layout is not None:
            if not isinstance(qparams_layout, dict) or \
                    set(qparams_layout) != {"mode", "axis", "shape"}:
                raise QuantizationError("qparams_layout must be a dict with keys mode, axis "
                                        f"and shape, got {qparams_layout!r}")
            from mgtrace.quantization.observer import _mode
            self.qparams_mode = _mode(qparams_layout["mode"])
            self.qparams_axis = qparams_layout["axis"]
            shape = tuple(int(d) for d in qparams_layout["shape"])
            self.scale = _f32(np.ones(shape))
            self.zero_point = _f32(np.zeros(shape))

    def config(self):
        cfg = super().config()
        cfg["qparams_layout"] = None if self.qparams_mode is None else {
            "mode": self.qparams_mode.name, "axis": self.qparams_axis,
            "shape": list(self.scale.shape)}
        return cfg

    def set_qparams(self, qparams):
        """Keep a copy of ``qparams`` (a scale, and the dtype of this module
        or none) as this module's own, used when forward gets none.
        Raises QuantizationError otherwise."""
        if qparams.scale is None:
            raise QuantizationError("FakeQuantize.set_qparams needs qparams with a scale")
        if qparams.dtype_meta is not None and qparams.dtype_meta != self.dtype:
            raise QuantizationError(f"qparams are for {qparams.dtype_meta.name}, this "
                                    f"FakeQuantize for {self.dtype_name}")
        scale = np.asarray(qparams.scale.numpy(), dtype=np.float32)
        zp = np.zeros_like(scale) if qparams.zero_point is None else \
            np.broadcast_to(np.asarray(qparams.zero_point.numpy(), np.float32), scale.shape)
        self.qparams_mode = qparams.mode
        self.qparams_axis = qparams.axis
        self.scale = _f32(scale.copy())
        self.zero_point = _f32(np.array(zp))

    def get_qparams(self):
        """The qparams set by :meth:`set_qparams` (None before)."""
        if self.qparams_mode is None:
            return None
        zp = self.zero_point if self.qparams_mode == QuantMode.ASYMMERTIC else None
        return create_qparams(self.qparams_mode, self.dtype, scale=self.scale, zero_point=zp,
                              axis=self.qparams_axis)

    def fake_quant_forward(self, inp, qparams=None):
        if qparams is None:
            qparams = self.get_qparams()
        if qparams is None:
            raise QuantizationError("FakeQuantize needs qparams (an observer's get_qparams(), "
                                    "or its own from set_qparams)")
        if qparams.dtype_meta != self.dtype:
            raise QuantizationError(f"qparams are for {getattr(qparams.dtype_meta, 'name', None)}"
                                    f", this FakeQuantize for {self.dtype_name}")
        return fake_quant_tensor(inp, qparams)


class TQT(_FakeQuantize):
    """Trained Quantization Thresholds (arXiv:1903.08066): symmetric fake
    quantization with a learned power-of-two step ``2 ** scale``; the
    parameter ``scale`` holds log2 of the step (initially 0, step 1).
    ``set_qparams`` takes a symmetric observer's qparams."""

    learns_qparams = True

    def __init__(self, dtype, enable=True, **kwargs):
        super().__init__(dtype, enable, **kwargs)
        self.scale = Parameter(_f32(0.0))

    def fake_quant_forward(self, inp, qparams=None):
        return tqt_forward(self.qmin, self.qmax, inp, self.scale)

    def set_qparams(self, qparams):
        if qparams.mode != QuantMode.SYMMERTIC:
            raise QuantizationError("TQT supports symmetric quantization only, "
                                    f"got {qparams.mode}")
        if qparams.scale is None:
            raise QuantizationError("TQT.set_qparams needs qparams with a scale")
        _per_tensor("TQT", qparams)
        self.scale = Parameter(F.log(qparams.scale) / _f32(math.log(2)))

    def get_qparams(self):
        return create_qparams(QuantMode.SYMMERTIC, self.dtype,
                              scale=2.0 ** self.scale)


class LSQ(_FakeQuantize):
    """Learned Step Size Quantization (arXiv:1902.08153): fake quantization
    with the learned step ``|step_size| + eps`` (parameter ``step_size``,
    initially 1) and the zero point of the qparams it was set from.

    Args:
        dtype, enable: as :class:`FakeQuantize`.
        eps: added to ``|step_size|`` so the step is never 0.
        mode: the QuantMode (or its name) of its qparams; ``set_qparams``
            sets it.
    """

    learns_qparams = True

    def __init__(self, dtype, enable=True, eps=1e-5, mode=None, **kwargs):
        super().__init__(dtype, enable, **kwargs)
        self.eps = _f32(eps)
        self.step_size = Parameter(_f32(1.0))
        if mode is not None:
            from mgtrace.quantization.observer import _mode
            mode = _mode(mode)
        self.mode = mode
        self.zero_point = _f32(0.0)
        self.grad_scale = _f32(1.0)

    def config(self):
        return dict(super().config(), eps=float(self.eps.numpy()),
                    mode=None if self.mode is None else self.mode.name)

    def set_qparams(self, qparams):
        if qparams.scale is None:
            raise QuantizationError("LSQ.set_qparams needs qparams with a scale")
        _per_tensor("LSQ", qparams)
        self.mode = qparams.mode
        if qparams.mode == QuantMode.ASYMMERTIC and qparams.zero_point is not None:
            self.zero_point = _f32(qparams.zero_point.numpy())
        else:
            self.zero_point = _f32(0.0)
        scale = qparams.scale.numpy().astype(np.float32)
        eps = self.eps.numpy()
        self.step_size = Parameter(_f32(np.where(scale < eps, np.float32(0), scale - eps)))
        if isinstance(qparams, LSQParams) and qparams.grad_scale is not None:
            self.grad_scale = _f32(qparams.grad_scale.numpy())

    def _step(self):
        return F.abs(self.step_size) + self.eps

    def fake_quant_forward(self, inp, qparams=None):
        return lsq_forward(self.qmin, self.qmax, inp, self._step(), self.zero_point,
                           self.grad_scale)

    def get_qparams(self):
        return LSQParams(self.mode, self.dtype, self._step(), self.zero_point,
                         self.grad_scale)


for _cls in (FakeQuantize, TQT, LSQ):
    register_as_builtin(_cls, name=f"mgtrace.quantization.{_cls.__name__}")
del _cls
