"""mgtrace.quantization: MegEngine's quantization-aware training and
calibration tools on float tensors (observers, fake quantization, QConfig
presets, the flow's switches).

Rounding everywhere is round half to even (NumPy, ONNX QuantizeLinear);
MegEngine's C++ kernels round half away from zero. ``quantize`` turns a
calibrated QAT model into :mod:`mgtrace.module.quantized` modules running
the int8 kernels of :mod:`mgtrace.quantization.int8` on quantized
tensors. Quantized dtypes (:func:`qint8`, :func:`quint8`, ...;
:mod:`mgtrace.quantization.qdtype`) are MegEngine's: NumPy dtypes of the
storage type with the scale and zero point as metadata; the core keeps them
through layout ops, ``astype`` converts to and from them, archives store
them (format 1.2).

>>> import numpy as np, mgtrace as mt
>>> from mgtrace.quantization import MinMaxObserver, FakeQuantize
>>> obs, fq = MinMaxObserver(dtype="qint8"), FakeQuantize("qint8")
>>> x = mt.tensor(np.array([-1.0, 0.3, 2.55], dtype=np.float32))
>>> y = fq(obs(x), obs.get_qparams())
>>> bool(obs.get_qparams().scale.numpy() == np.float32(2.55) / np.float32(127.5))
True
"""
from mgtrace.quantization.utils import (QUANT_DTYPES, LSQParams, QParams, QuantDtypeMeta,
                                        QuantizationError, QuantMode, create_qparams,
                                        fake_quant_tensor, lsq_forward, quant_dtype,
                                        tqt_forward)
from mgtrace.quantization.observer import (ExponentialMovingAverageObserver,
                                           HistogramObserver, MinMaxObserver, Observer,
                                           PassiveObserver,
                                           SyncExponentialMovingAverageObserver,
                                           SyncMinMaxObserver)
from mgtrace.quantization.fake_quant import LSQ, TQT, FakeQuantize
from mgtrace.quantization.qconfig import (QConfig, calibration_qconfig, easyquant_qconfig,
                                          ema_fakequant_qconfig, ema_lowbit_fakequant_qconfig,
                                          min_max_fakequant_qconfig, passive_qconfig,
                                          per_channel_quint8_qconfig, sync_ema_fakequant_qconfig,
                                          tqt_qconfig)
from mgtrace.quantization.quantize import (disable_fake_quant, disable_observer,
                                           enable_fake_quant, enable_observer,
                                           propagate_qconfig, quantize_qat, reset_qconfig,
                                           apply_easy_quant, quantize, quantize_layers,
                                           quantize_adds)
from mgtrace.quantization.qtensor import (QuantizedTensor, dequantize as dequantize_tensor,
                                          quantize as quantize_tensor)
from mgtrace.quantization.qdtype import (create_quantized_dtype, get_scale, get_zero_point,
                                         int_repr, is_quantize, qint4, qint8, qint8_narrow,
                                         qint32, quint4, quint8)

__all__ = [
    "QuantDtypeMeta", "QUANT_DTYPES", "quant_dtype", "QuantMode", "QParams", "LSQParams",
    "QuantizationError", "create_qparams", "fake_quant_tensor", "tqt_forward", "lsq_forward",
    "Observer", "MinMaxObserver", "SyncMinMaxObserver", "ExponentialMovingAverageObserver",
    "SyncExponentialMovingAverageObserver", "HistogramObserver", "PassiveObserver",
    "FakeQuantize", "TQT", "LSQ",
    "QConfig", "min_max_fakequant_qconfig", "ema_fakequant_qconfig",
    "sync_ema_fakequant_qconfig", "ema_lowbit_fakequant_qconfig", "calibration_qconfig",
    "tqt_qconfig", "passive_qconfig", "easyquant_qconfig", "per_channel_quint8_qconfig",
    "enable_observer", "disable_observer", "enable_fake_quant", "disable_fake_quant",
    "propagate_qconfig", "quantize_qat", "reset_qconfig", "apply_easy_quant", "quantize",
    "quantize_layers", "quantize_adds",
    "QuantizedTensor", "quantize_tensor", "dequantize_tensor",
    "create_quantized_dtype", "qint8", "qint8_narrow", "quint8", "qint32", "qint4", "quint4",
    "is_quantize", "get_scale", "get_zero_point", "int_repr",
]
