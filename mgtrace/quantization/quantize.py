"""The quantization flow's switches: observers and fake quantizers of a
whole model on or off, and the float -> QAT conversion (MegEngine's
``quantization/quantize.py``). The QAT module types are imported when
first needed: :mod:`mgtrace.module.qat` is built on this package."""
import copy

from mgtrace.quantization.fake_quant import _FakeQuantize
from mgtrace.quantization.observer import Observer
from mgtrace.quantization.utils import QuantizationError

__all__ = ["enable_observer", "disable_observer", "enable_fake_quant", "disable_fake_quant",
           "propagate_qconfig", "quantize_qat", "reset_qconfig"]


def _switch(module, kind, on):
    for m in module.modules():
        if isinstance(m, kind):
            m.enabled = on
    return module


def enable_observer(module):
    """Enable every :class:`Observer` in ``module`` (itself included);
    returns module. Holds until the next train()/eval() mode change."""
    return _switch(module, Observer, True)


def disable_observer(module):
    """Disable every :class:`Observer` in ``module``; returns module."""
    return _switch(module, Observer, False)


def enable_fake_quant(module):
    """Enable every fake quantizer (FakeQuantize, TQT, LSQ) in ``module``;
    returns module."""
    return _switch(module, _FakeQuantize, True)


def disable_fake_quant(module):
    """Disable every fake quantizer in ``module``: they pass inputs
    through; returns module."""
    return _switch(module, _FakeQuantize, False)


def _float_to_qat():
    import mgtrace.module as M
    import mgtrace.module.qat as QM
    return {M.Linear: QM.Linear, M.Conv2d: QM.Conv2d, M.ConvRelu2d: QM.ConvRelu2d,
            M.ConvBn2d: QM.ConvBn2d, M.ConvBnRelu2d: QM.ConvBnRelu2d}


def _qat_base():
    from mgtrace.module.qat import QATModule
    return QATModule


def _check_qconfig(qconfig):
    from mgtrace.quantization.qconfig import QConfig
    if not isinstance(qconfig, QConfig):
        raise QuantizationError(f"qconfig must be a mgtrace.quantization.QConfig, "
                                f"got {type(qconfig).__name__}")


def propagate_qconfig(module, qconfig):
    """Call ``set_qconfig(qconfig)`` on every QAT module in ``module``
    (itself included) whose ``quantize_disabled`` attribute is not true:
    each gets fresh observers and fake quantizers. Returns module."""
    _check_qconfig(qconfig)
    for m in module.modules():
        if isinstance(m, _qat_base()) and not getattr(m, "quantize_disabled", False):
            m.set_qconfig(qconfig)
    return module


def quantize_qat(module, inplace=True, qconfig=None, mapping=None):
    """Replace the float modules of ``module`` that have a QAT version by it
    (MegEngine's ``quantize_qat``), then give every QAT module the
    observers and fake quantizers of ``qconfig``.

    Args:
        module: a Module (the root itself is converted if its type maps).
        inplace: convert ``module`` itself; False converts a deep copy.
        qconfig: a QConfig; default :data:`ema_fakequant_qconfig`.
        mapping: ``{float type: QAT type}``, exact types, added to (and
            overriding) the default one: Linear, Conv2d, ConvRelu2d,
            ConvBn2d, ConvBnRelu2d to their :mod:`mgtrace.module.qat`
            versions. A module whose
            ``quantize_disabled`` attribute is true is left float, with
            everything inside it.

    The QAT modules share the float modules' parameters (and BatchNorms).
    Returns the converted module. Raises QuantizationError for a qconfig
    that is not a QConfig.
    """
    from mgtrace.quantization.qconfig import ema_fakequant_qconfig
    qconfig = ema_fakequant_qconfig if qconfig is None else qconfig
    _check_qconfig(qconfig)
    mapping = {**_float_to_qat(), **(mapping or {})}
    if not inplace:
        module = copy.deepcopy(module)

    def convert(m):
        if getattr(m, "quantize_disabled", False) or isinstance(m, _qat_base()):
            return m
        target = mapping.get(type(m))
        if target is not None:
            return target.from_float_module(m)
        for name, child in list(m.named_children()):
            if child is not None:
                new = convert(child)
                if new is not child:
                    setattr(m, name, new)
        return m

    return propagate_qconfig(convert(module), qconfig)


def reset_qconfig(module, qconfig, inplace=True):
    """Give the QAT modules of ``module`` fresh observers and fake
    quantizers from ``qconfig`` that start from the current qparams
    (MegEngine's ``reset_qconfig``): each new one that has ``set_qparams``
    (TQT, LSQ, PassiveObserver) gets the weight's or activation's QParams
    the module had before. Works on a deep copy unless ``inplace``; returns
    the module. Raises QuantizationError for a qconfig that is not a
    QConfig, or qparams the new quantizer cannot take (TQT: symmetric only).
    """
    _check_qconfig(qconfig)
    if not inplace:
        module = copy.deepcopy(module)

    def build(factory, qparams):
        inst = factory() if factory is not None else None
        if inst is not None and qparams is not None and hasattr(inst, "set_qparams"):
            inst.set_qparams(qparams)
        return inst

    for m in list(module.modules()):
        if not isinstance(m, _qat_base()) or getattr(m, "quantize_disabled", False):
            continue
        if m.with_weight:
            qparams = m.get_weight_qparams()
            m.weight_observer = build(qconfig.weight_observer, qparams)
            m.weight_fake_quant = build(qconfig.weight_fake_quant, qparams)
        if m.with_act:
            qparams = m.get_activation_qparams()
            m.act_observer = build(qconfig.act_observer, qparams)
            m.act_fake_quant = build(qconfig.act_fake_quant, qparams)
    return module
