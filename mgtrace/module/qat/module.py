"""QATModule: the base of the QAT modules (MegEngine's ``module/qat/module.py``).

mgtrace's QAT modules are builtins (leaves for the tracer, stored in
archives of format 1.2): ``config()`` is the float module's plus ``quant``,
which describes the four quantization children (each ``None`` or
``{"type": builtin name, "config": its config()}``), and every QAT class
takes that ``quant=`` keyword beside the float module's arguments, so that
``type(m)(**m.config())`` rebuilds the module with its observers and fake
quantizers (their tensors come from the state dict). A child that is not a
builtin (a user's own observer) cannot be described; tracing replaces it
first (see :func:`plain_quant_children`).
"""
import functools

from mgtrace.module.builtin import builtin_type, is_builtin
from mgtrace.module.module import Module
from mgtrace.quantization.utils import QuantMode, create_qparams, fake_quant_tensor

__all__ = ["QATModule", "build_uninitialized", "sharing_float_weights", "plain_quant_children",
           "bias_qparams"]

QUANT_CHILDREN = ("weight_observer", "weight_fake_quant", "act_observer", "act_fake_quant")


def _takes_quant(init):
    """``init`` that also takes the keyword ``quant`` (children to build)."""
    @functools.wraps(init)
    def __init__(self, *args, quant=None, **kwargs):
        init(self, *args, **kwargs)
        if quant is not None:
            self._build_quant_children(quant)
    __init__._takes_quant = True
    return __init__


def _config_with_quant(config):
    @functools.wraps(config)
    def config_with_quant(self):
        cfg = dict(config(self))
        cfg["quant"] = self._quant_spec()
        return cfg
    config_with_quant._with_quant = True
    return config_with_quant


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

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if not getattr(cls.__init__, "_takes_quant", False):
            cls.__init__ = _takes_quant(cls.__init__)
        if hasattr(cls, "config") and not getattr(cls.config, "_with_quant", False):
            cls.config = _config_with_quant(cls.config)

    def _quant_spec(self):
        """``config()["quant"]``: each quantization child's builtin type and
        config, or None. Raises TypeError for a child that is not a builtin."""
        spec = {}
        # in the order of the module's children (its state_dict's order)
        held = [n for n, m in self._modules.items() if m is not None]
        order = sorted(QUANT_CHILDREN, key=lambda n: (
            held.index(n) if n in held else len(held), QUANT_CHILDREN.index(n)))
        for name in order:
            child = getattr(self, name, None)
            if child is None:
                spec[name] = None
                continue
            if not is_builtin(child):
                raise TypeError(
                    f"{type(self).__name__}.{name} is a {type(child).__qualname__}, not a "
                    "builtin observer or fake quantizer, so its config cannot be stored; "
                    "trace the model (mgtrace.trace_module replaces it by a FakeQuantize "
                    "carrying its qparams)")
            spec[name] = {"type": child.builtin_name, "config": child.config()}
        return spec

    def _build_quant_children(self, quant):
        if not isinstance(quant, dict) or not set(quant) <= set(QUANT_CHILDREN):
            raise TypeError(f"quant= takes a dict with keys among {QUANT_CHILDREN}, got "
                            f"{quant!r}")
        for name, entry in quant.items():
            if entry is None:
                setattr(self, name, None)
                continue
            if not isinstance(entry, dict) or set(entry) != {"type", "config"}:
                raise TypeError(f"quant[{name!r}] must be None or a dict with keys type and "
                                f"config, got {entry!r}")
            cls = builtin_type(entry["type"])
            if not name.endswith(("observer", "fake_quant")):
                raise TypeError(f"quant has an unknown child {name!r}")
            setattr(self, name, cls(**entry["config"]))

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.weight_observer = None
        self.act_observer = None
        self.weight_fake_quant = None
        self.act_fake_quant = None

    def __repr__(self):
        return "QAT." + super().__repr__()

    def config(self):
        """The constructor arguments (a QAT class whose float module takes
        none: the stubs); ``quant`` is added by every QAT class."""
        return {}

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
        if _learns(fake_quant) or observer is None:    # TQT, LSQ, a carrier: their own
            y = fake_quant(out)
        else:
            y = fake_quant(out, observer.get_qparams())
        if y is not out and _enabled(fake_quant):
            _mark(y, fake_quant, observer)
        return y

    def apply_quant_bias(self, bias, inp, w_qat, channel_axis=0):
        """``bias`` fake-quantized to qint32 at ``scale = s_in * s_w``
        (MegEngine's ``QATModule.apply_quant_bias`` / ``fake_quant_bias``),
        the bias an int8 layer adds to its int32 accumulator.

        It applies when both this module's activation and weight fake
        quantizers are enabled and ``inp`` and ``w_qat`` are the outputs of
        enabled fake quantizers of symmetric 8-bit dtypes (qint8,
        qint8_narrow; ``inp`` per tensor): a QAT layer fed by another QAT
        layer or a QuantStub, as MegEngine's tensors carry their qparams.
        Per-channel weight scales along ``channel_axis`` (the output
        channels: 0 for Linear and Conv2d, 1 for ConvTranspose2d's weight)
        give one bias scale per channel; along another axis, or with any
        other input (a float tensor, a quint8 one, a reshaped one: MegEngine
        drops the qparams there too), ``bias`` is returned as it is.

        A user's subclass of a QAT module (traced into, not a builtin) keeps
        its bias float, traced or not: its input's qparams belong to another
        module's call, no value of its graph (departure from MegEngine)."""
        if bias is None or not (_enabled(self.act_fake_quant)
                                and _enabled(self.weight_fake_quant)):
            return bias
        if type(self).__dict__.get("builtin_name") is None:
            return bias
        bq = bias_qparams(_marked(inp), _marked(w_qat), bias.shape, w_qat.ndim, channel_axis)
        return bias if bq is None else fake_quant_tensor(bias, bq)

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
                q = m.get_qparams()
                if q is not None:
                    return q
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


def bias_qparams(iq, wq, bias_shape, w_ndim, channel_axis=0):
    """The qint32 QParams of a bias (scale ``s_in * s_w``, per channel along
    the bias's axis 0 for per-channel weights) for input qparams ``iq`` and
    weight qparams ``wq`` of a ``w_ndim``-d weight whose output channels
    are ``channel_axis`` (None: per-tensor weights only); None where
    :meth:`QATModule.apply_quant_bias` keeps the bias float (either None,
    not both symmetric 8-bit, a per-channel input, weight scales along
    another axis). The ONNX exporter reads the same rule."""
    if iq is None or wq is None or iq.scale is None or wq.scale is None:
        return None
    if iq.mode != QuantMode.SYMMERTIC or wq.mode != iq.mode:
        return None
    if iq.dtype_meta is None or wq.dtype_meta is None or \
            iq.dtype_meta.np_dtype_str != "int8" or wq.dtype_meta.np_dtype_str != "int8":
        return None
    if iq.scale.ndim:
        return None
    axis = None
    if wq.scale.ndim:
        if channel_axis is None or wq.axis is None or wq.axis % w_ndim != channel_axis or \
                len(bias_shape) != 1 or wq.scale.shape[0] != bias_shape[0]:
            return None
        axis = 0
    return create_qparams(QuantMode.SYMMERTIC, "qint32", scale=iq.scale * wq.scale, axis=axis)


_MARK = "_fq_qparams"


def _mark(t, fake_quant, observer):
    """Record on ``t`` (a fake quantizer's output) where the QParams it was
    fake-quantized with come from, as MegEngine's ``Tensor.qparams`` (a
    separate attribute: ``qparams`` on a Tensor means a per-channel
    QuantizedTensor). The modules, not the values: the next layer reads
    the qparams only when it fake-quantizes a bias (:func:`_marked`)."""
    if isinstance(getattr(t, "__dict__", None), dict):
        t.__dict__[_MARK] = (fake_quant, observer)


def _marked(t):
    """The QParams recorded by :func:`_mark` on ``t``, or None."""
    d = getattr(t, "__dict__", None)
    source = d.get(_MARK) if isinstance(d, dict) else None
    if source is None:
        return None
    fake_quant, observer = source
    if _learns(fake_quant) or observer is None:
        return fake_quant.get_qparams() if hasattr(fake_quant, "get_qparams") else None
    return observer.get_qparams()


def _enabled(fake_quant):
    return fake_quant is not None and bool(getattr(fake_quant, "enabled", False))


def _learns(fake_quant):
    """Whether ``fake_quant`` has qparams of its own (TQT, LSQ, a FakeQuantize
    after set_qparams) rather than taking its observer's."""
    return fake_quant is not None and (getattr(fake_quant, "learns_qparams", False) or (
        hasattr(fake_quant, "get_qparams") and fake_quant.get_qparams() is not None))


def _carrier(observer, fake_quant):
    """A FakeQuantize carrying the current qparams of ``observer`` (or of
    ``fake_quant``), fake-quantizing when ``fake_quant`` did."""
    from mgtrace.quantization.fake_quant import FakeQuantize
    source = observer if observer is not None else fake_quant
    qparams = source.get_qparams()
    fq = FakeQuantize(source.dtype, enable=fake_quant is not None and bool(fake_quant.enabled))
    if qparams is not None:
        fq.set_qparams(qparams)
    return fq


def plain_quant_children(qat):
    """What tracing does to a QAT module's quantization children (MegEngine's
    ``_check_qat_module``), as a dict ``{child name: new child}`` of the
    changes to make (empty when none are needed).

    A pair (observer, fake quantizer) in which either is not a builtin (a
    user's own class), or, in a QAT module that is not a builtin itself
    (a user subclass, traced into), an observer feeding a FakeQuantize (the
    qparams it hands over are no graph value), becomes ``observer None``
    and a :class:`~mgtrace.quantization.FakeQuantize` carrying the pair's
    current qparams (enabled when the fake quantizer was): the traced model
    then loads without the user's classes and fake-quantizes as the
    original did at trace time; that pair observes no more."""
    changes = {}
    for kind in ("weight", "act"):
        if not getattr(qat, f"with_{kind}", True):
            continue
        obs = getattr(qat, f"{kind}_observer", None)
        fq = getattr(qat, f"{kind}_fake_quant", None)
        foreign = any(m is not None and not is_builtin(m) for m in (obs, fq))
        handover = (obs is not None and fq is not None and not _learns(fq)
                    and not is_builtin(qat))
        if foreign or handover:
            if obs is None and fq is None:
                continue
            changes[f"{kind}_observer"] = None
            changes[f"{kind}_fake_quant"] = _carrier(obs, fq)
    return changes
