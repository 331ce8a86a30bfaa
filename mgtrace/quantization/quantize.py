"""The quantization flow's switches: observers and fake quantizers of a
whole model on or off (MegEngine's ``quantization/quantize.py``)."""
from mgtrace.quantization.fake_quant import _FakeQuantize
from mgtrace.quantization.observer import Observer

__all__ = ["enable_observer", "disable_observer", "enable_fake_quant", "disable_fake_quant"]


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
