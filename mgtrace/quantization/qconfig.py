"""QConfig: which observer and fake quantizer a QAT module builds for its
weight and its activation, and MegEngine's presets (same names, same
choices: narrow-range ``qint8_narrow`` for weights, ``qint8`` for
activations)."""
import collections
from functools import partial

from mgtrace.module.module import Module
from mgtrace.quantization.fake_quant import TQT, FakeQuantize
from mgtrace.quantization.observer import (ExponentialMovingAverageObserver,
                                           HistogramObserver, MinMaxObserver, PassiveObserver,
                                           SyncExponentialMovingAverageObserver,
                                           SyncMinMaxObserver)
from mgtrace.quantization.utils import QuantMode, QuantizationError

__all__ = ["QConfig", "min_max_fakequant_qconfig", "ema_fakequant_qconfig",
           "sync_ema_fakequant_qconfig", "ema_lowbit_fakequant_qconfig", "calibration_qconfig",
           "tqt_qconfig", "passive_qconfig", "easyquant_qconfig", "per_channel_quint8_qconfig"]


class QConfig(collections.namedtuple(
        "QConfig", ["weight_observer", "act_observer", "weight_fake_quant", "act_fake_quant"])):
    """Four factories (classes or ``functools.partial`` of them, or None):
    ``weight_observer``, ``act_observer``, ``weight_fake_quant``,
    ``act_fake_quant``. Raises QuantizationError when given a module
    instance instead of a factory (each QAT module needs its own).

    >>> from functools import partial
    >>> from mgtrace.quantization import QConfig, MinMaxObserver, FakeQuantize
    >>> q = QConfig(partial(MinMaxObserver, dtype="qint8_narrow"),
    ...             partial(MinMaxObserver, dtype="qint8"),
    ...             partial(FakeQuantize, dtype="qint8_narrow"),
    ...             partial(FakeQuantize, dtype="qint8"))
    >>> q.act_observer().qmin
    -128
    """

    def __new__(cls, weight_observer, act_observer, weight_fake_quant, act_fake_quant):
        for name, f in (("weight_observer", weight_observer), ("act_observer", act_observer),
                        ("weight_fake_quant", weight_fake_quant),
                        ("act_fake_quant", act_fake_quant)):
            if isinstance(f, Module):
                raise QuantizationError(
                    f"QConfig.{name} got a {type(f).__name__} instance: pass a factory, e.g. "
                    f"functools.partial({type(f).__name__}, dtype=...)")
            if f is not None and not callable(f):
                raise QuantizationError(f"QConfig.{name} must be callable or None, got {f!r}")
        return super().__new__(cls, weight_observer, act_observer, weight_fake_quant,
                               act_fake_quant)


def _fq(weight_dtype, act_dtype, weight_observer, act_observer, fake=FakeQuantize):
    return QConfig(
        weight_observer=weight_observer and partial(weight_observer, dtype=weight_dtype),
        act_observer=act_observer and partial(act_observer, dtype=act_dtype),
        weight_fake_quant=fake and partial(fake, dtype=weight_dtype),
        act_fake_quant=fake and partial(fake, dtype=act_dtype))


min_max_fakequant_qconfig = _fq("qint8_narrow", "qint8", MinMaxObserver, MinMaxObserver)
#: the default QConfig of quantize_qat
ema_fakequant_qconfig = _fq("qint8_narrow", "qint8", MinMaxObserver,
                            ExponentialMovingAverageObserver)
sync_ema_fakequant_qconfig = _fq("qint8_narrow", "qint8", SyncMinMaxObserver,
                                 SyncExponentialMovingAverageObserver)
ema_lowbit_fakequant_qconfig = _fq("qint4", "qint4", MinMaxObserver,
                                   ExponentialMovingAverageObserver)
calibration_qconfig = _fq("qint8_narrow", "qint8", MinMaxObserver, HistogramObserver, None)
tqt_qconfig = _fq("qint8_narrow", "qint8", None, None, TQT)
passive_qconfig = _fq("qint8_narrow", "qint8", PassiveObserver, PassiveObserver)
easyquant_qconfig = passive_qconfig
#: beyond MegEngine: per-output-channel qint8_narrow weights (MinMax, ``axis=0``)
#: and asymmetric quint8 activations (MinMax), ONNX Runtime's static int8 form;
#: the default of :func:`mgtrace.quantization.quantize_layers`
per_channel_quint8_qconfig = QConfig(
    weight_observer=partial(MinMaxObserver, dtype="qint8_narrow", axis=0),
    act_observer=partial(MinMaxObserver, mode=QuantMode.ASYMMERTIC, dtype="quint8"),
    weight_fake_quant=partial(FakeQuantize, dtype="qint8_narrow"),
    act_fake_quant=partial(FakeQuantize, dtype="quint8"))
