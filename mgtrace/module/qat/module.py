"""QATModule: the base of the QAT modules (MegEngine's ``module/qat/module.py``)."""
from mgtrace.module.module import Module

__all__ = ["QATModule", "build_uninitialized", "sharing_float_weights"]


def build_uninitialized(cls, **config):
    """``cls(**config)`` without running its ``reset_parameters`` (the
    caller replaces the parameters at once; mgtrace.random's stream is left
    alone)."""
    m = cls.__new__(cls)
    m.__dict__["reset_parameters"] = lambda: None
    try:
        cls.__init__(m, **config)
    finally:
        m.__dict__.pop("reset_parameters", None)
    return m


def sharing_float_weights(cls, float_module):
    """A ``cls`` built from ``float_module``'s config that holds the same
    weight and bias Parameters (so a float state dict still loads), in the
    float module's mode: ``from_float_module`` of the weighted QAT modules."""
    qmod = build_uninitialized(cls, **float_module.config())
    qmod.weight = float_module.weight
    qmod.bias = float_module.bias
    return qmod.train(float_module.training)


class QATModule(Module):
    """Base class of the QAT modules. ``with_weight`` / ``with_act`` say
    whether it has a weight and an activation to quantize.

    Children set by :meth:`set_qconfig` (None until then, or where the
    QConfig has None): ``weight_observer``, ``weight_fake_quant``,
    ``act_observer``, ``act_fake_quant``.
    """

    with_weight = True
    with_act = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.weight_observer = None
        self.act_observer = None
        self.weight_fake_quant = None
        self.act_fake_quant = None

    def __repr__(self):
        return "QAT." + super().__repr__()

    def set_qconfig(self, qconfig):
        """Build fresh observers and fake quantizers from ``qconfig``'s
        factories (replacing any there were)."""
        def build(factory):
            return factory() if factory is not None else None
        if self.with_act:
            self.act_observer = build(qconfig.act_observer)
            self.act_fake_quant = build(qconfig.act_fake_quant)
        if self.with_weight:
            self.weight_observer = build(qconfig.weight_observer)
            self.weight_fake_quant = build(qconfig.weight_fake_quant)

    def set_fake_quant(self, enable):
        for m in (self.act_fake_quant, self.weight_fake_quant):
            if m is not None:
                m.enabled = bool(enable)

    def set_observer(self, enable):
        for m in (self.act_observer, self.weight_observer):
            if m is not None:
                m.enabled = bool(enable)

    def _apply_fakequant_with_observer(self, target, fake_quant, observer):
        out = target if observer is None else observer(target)
        if fake_quant is None:
            return out
        if hasattr(fake_quant, "get_qparams"):       # TQT, LSQ: their own qparams
            return fake_quant(out)
        return fake_quant(out, observer.get_qparams() if observer is not None else None)

    def apply_quant_weight(self, target):
        """``target`` through the weight observer, then fake-quantized."""
        return self._apply_fakequant_with_observer(target, self.weight_fake_quant,
                                                   self.weight_observer)

    def apply_quant_activation(self, target):
        """``target`` through the activation observer, then fake-quantized."""
        return self._apply_fakequant_with_observer(target, self.act_fake_quant,
                                                   self.act_observer)

    @staticmethod
    def _qparams(fake_quant, observer):
        for m in (fake_quant, observer):
            if m is not None and hasattr(m, "get_qparams"):
                return m.get_qparams()
        return None

    def get_weight_qparams(self):
        """The weight's QParams: the fake quantizer's own (TQT, LSQ) or the
        observer's; None without either."""
        return self._qparams(self.weight_fake_quant, self.weight_observer)

    def get_activation_qparams(self):
        """The output activation's QParams, as :meth:`get_weight_qparams`."""
        return self._qparams(self.act_fake_quant, self.act_observer)

    @classmethod
    def from_float_module(cls, float_module):
        """A QAT module sharing ``float_module``'s parameters (and, for the
        conv+BN modules, its ``conv`` and ``bn``), in its training mode."""
        raise NotImplementedError
