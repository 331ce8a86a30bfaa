"""The quantization flow's switches: observers and fake quantizers of a
whole model on or off, and the float -> QAT conversion (MegEngine's
``quantization/quantize.py``). The QAT module types are imported when
first needed: :mod:`mgtrace.module.qat` is built on this package."""
import copy

import numpy as np

from mgtrace.quantization.fake_quant import _FakeQuantize
from mgtrace.quantization.observer import Observer
from mgtrace.quantization.utils import QuantizationError

__all__ = ["enable_observer", "disable_observer", "enable_fake_quant", "disable_fake_quant",
           "propagate_qconfig", "quantize_qat", "reset_qconfig", "apply_easy_quant",
           "quantize_layers", "quantize_adds"]


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
            M.ConvBn2d: QM.ConvBn2d, M.ConvBnRelu2d: QM.ConvBnRelu2d, M.Elemwise: QM.Elemwise,
            M.QuantStub: QM.QuantStub, M.DequantStub: QM.DequantStub,
            M.LinearBn1d: QM.LinearBn1d, M.LinearBnRelu1d: QM.LinearBnRelu1d,
            M.Concat: QM.Concat, M.BatchMatMulActivation: QM.BatchMatMulActivation,
            M.ConvTranspose2d: QM.ConvTranspose2d, M.ConvTransposeRelu2d: QM.ConvTransposeRelu2d,
            M.ConvTransposeBn2d: QM.ConvTransposeBn2d,
            M.ConvTransposeBnRelu2d: QM.ConvTransposeBnRelu2d}


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
            ConvBn2d, ConvBnRelu2d, Elemwise, QuantStub, DequantStub,
            LinearBn1d, LinearBnRelu1d, Concat, BatchMatMulActivation,
            ConvTranspose2d, ConvTransposeRelu2d, ConvTransposeBn2d,
            ConvTransposeBnRelu2d to their :mod:`mgtrace.module.qat`
            versions (MegEngine's mapping). A module whose
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
    (TQT, LSQ, PassiveObserver; not a FakeQuantize) gets the weight's or activation's QParams
    the module had before. Works on a deep copy unless ``inplace``; returns
    the module. Raises QuantizationError for a qconfig that is not a
    QConfig, or qparams the new quantizer cannot take (TQT: symmetric only).
    """
    _check_qconfig(qconfig)
    if not inplace:
        module = copy.deepcopy(module)

    def build(factory, qparams):
        from mgtrace.quantization.fake_quant import FakeQuantize
        inst = factory() if factory is not None else None
        # a FakeQuantize takes its observer's qparams on every call (its own,
        # set_qparams, are a traced model's carrier of a user observer's)
        if inst is not None and qparams is not None and hasattr(inst, "set_qparams") \
                and not isinstance(inst, FakeQuantize):
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


def _cosine(a, b):
    """Mean over the batch (axis 0) of the cosine similarity of the rows."""
    a = a.reshape(a.shape[0], -1).astype(np.float64)
    b = b.reshape(b.shape[0], -1).astype(np.float64)
    den = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return float(np.nanmean(np.sum(a * b, axis=1) / den))


def apply_easy_quant(module, data, start=0.8, stop=1.2, num=40):
    """EasyQuant (arXiv:2006.16669; MegEngine's ``apply_easy_quant``): for
    every QAT module, try ``num`` scales from ``start`` to ``stop`` times its
    weight observer's original scale, keep the one whose output is closest
    (mean cosine similarity over the batch) to the float output; then the
    same for the activation observers.

    Args:
        module: a model converted with ``quantize_qat`` whose observers are
            :class:`PassiveObserver` s holding qparams (``reset_qconfig(model,
            easyquant_qconfig)`` after calibration does that).
        data: a batch of inputs ``[N, ...]``, the model's first argument.
        start, stop, num: the search grid, relative to each original scale.

    Each layer sees the float and the fake-quantized outputs of the layers
    before it (as MegEngine: the model runs on the batch twice, stacked).
    Returns module. Raises QuantizationError when a QAT module's observer is
    not a PassiveObserver with qparams.
    """
    from mgtrace.quantization.observer import PassiveObserver
    import mgtrace.functional as F
    qat = [m for m in module.modules() if isinstance(m, _qat_base())]
    for m in qat:
        for ob in (m.weight_observer, m.act_observer):
            if ob is not None and not (isinstance(ob, PassiveObserver) and ob.qparams):
                raise QuantizationError(
                    f"apply_easy_quant needs PassiveObservers holding qparams, found "
                    f"{type(ob).__name__}: run reset_qconfig(model, easyquant_qconfig) after "
                    "calibration first")
    batch = data.shape[0]
    both = F.concat([data, data], axis=0)

    def search(mod, args, output, where, handle):
        handle.remove()                             # the calls below must not recurse
        float_in = [a[:batch] for a in args]
        fq_in = [a[batch:] for a in args]
        mod.set_fake_quant(False)
        float_out = mod(*float_in)
        mod.set_fake_quant(True)
        ob = getattr(mod, where)
        if ob is None:
            return None
        best, best_scale = -np.inf, None
        reference = float_out.numpy()
        for scale in np.linspace(start * ob.orig_scale, stop * ob.orig_scale, num):
            ob.scale = scale
            sim = _cosine(reference, mod(*fq_in).numpy())
            if sim > best:
                best, best_scale = sim, scale
        ob.scale = best_scale if best_scale is not None else ob.orig_scale
        return F.concat([float_out, output[batch:]], axis=0)

    for where in ("weight_observer", "act_observer"):
        handles = []
        for m in qat:
            box = []
            handle = m.register_forward_hook(
                lambda mod, args, out, where=where, box=box: search(mod, args, out, where,
                                                                    box[0]))
            box.append(handle)
            handles.append(handle)
        try:
            module(both)
        finally:
            for h in handles:
                h.remove()
    return module


def _qat_to_quantized():
    import mgtrace.module.qat as QM
    import mgtrace.module.quantized as MQ
    return {QM.QuantStub: MQ.QuantStub, QM.DequantStub: MQ.DequantStub,
            QM.Linear: MQ.Linear, QM.LinearRelu: MQ.LinearRelu, QM.Conv2d: MQ.Conv2d,
            QM.ConvRelu2d: MQ.ConvRelu2d, QM.ConvBn2d: MQ.ConvBn2d,
            QM.ConvBnRelu2d: MQ.ConvBnRelu2d, QM.Elemwise: MQ.Elemwise, QM.Concat: MQ.Concat,
            QM.ConvTranspose2d: MQ.ConvTranspose2d,
            QM.ConvTransposeRelu2d: MQ.ConvTransposeRelu2d,
            QM.ConvTransposeBn2d: MQ.ConvTransposeBn2d,
            QM.ConvTransposeBnRelu2d: MQ.ConvTransposeBnRelu2d,
            QM.LinearBn1d: MQ.LinearBn1d, QM.LinearBnRelu1d: MQ.LinearBnRelu1d,
            QM.BatchMatMulActivation: MQ.BatchMatMulActivation}


def quantize(module, inplace=True, mapping=None):
    """Replace the QAT modules of ``module`` by their int8 versions in
    :mod:`mgtrace.module.quantized` (MegEngine's ``quantize``), each built
    with ``from_qat_module``: weights quantized once with their QAT qparams,
    BatchNorms folded, outputs with the activation qparams.

    Args:
        module: a model after :func:`quantize_qat` and calibration (or QAT
            training); put it in eval mode first for BatchNorm folding.
        inplace: convert ``module`` itself; False converts a deep copy.
        mapping: ``{QAT type: quantized type}`` added to the default one
            (exact types). A QAT module with no quantized version here (a
            user's own) or whose ``quantize_disabled`` is true stays as it
            is.

    Returns the converted module. Raises QuantizationError for a QAT module
    without weight or activation qparams, or with qparams the int8 kernels
    do not take (weights qint8/qint8_narrow symmetric; activations per
    tensor qint8 or quint8).
    """
    mapping = {**_qat_to_quantized(), **(mapping or {})}
    if not inplace:
        module = copy.deepcopy(module)

    def convert(m):
        target = mapping.get(type(m))
        if target is None or getattr(m, "quantize_disabled", False):
            return None
        return target.from_qat_module(m).train(False)

    root = convert(module)
    if root is not None:
        return root
    for parent in list(module.modules()):
        if getattr(parent, "quantize_disabled", False):
            continue
        for name, child in list(parent._modules.items()):
            if child is None:
                continue
            new = convert(child)
            if new is not None:
                setattr(parent, name, new)
    return module


def _add_operands(e):
    """``(a, b)`` when expr ``e`` adds two float32 tensor nodes of its
    output's shape (``a + b``, ``F.add(a, b)``): what the int8 add kernel
    takes; else None."""
    import mgtrace.functional as F
    from mgtrace.traced_module.passes.match import ADD, bound_args, is_function
    if e.kind == "call_method" and e.method in ADD and len(e.args) == 2 and not e.kwargs:
        a, b = e.args
    elif is_function(e, F.add):
        args = bound_args(e)
        if args is None or len(args) != 2:
            return None
        a, b = args.values()
    else:
        return None
    y = e.outputs[0] if len(e.outputs) == 1 else None
    for n in (a, b, y):
        if getattr(n, "kind", None) != "tensor" or n.dtype != np.float32 or n.shape != y.shape:
            return None
    return a, b


def _free_name(owner, base):
    i = 0
    while hasattr(owner, f"{base}{i}"):
        i += 1
    return f"{base}{i}"


def quantize_adds(tm):
    """Rewrite the tensor additions of a TracedModule's graphs for int8:
    each ``a + b`` (or ``F.add(a, b)``) of two float32 tensors of one shape
    becomes ``DequantStub(Elemwise("add")(QuantStub(a), QuantStub(b)))``,
    and ``relu(a + b)`` (the add read by the ReLU alone, module or function
    form) ``Elemwise("fuse_add_relu")`` the same way: float modules that
    :func:`quantize_qat` turns into MegEngine's QAT Elemwise (an activation
    observer on the sum) and :func:`quantize` into the int8 add of
    :mod:`mgtrace.module.quantized` (qelemwise.c). The new modules are
    attributes of the graph's owner, ``qadd<i>`` (the Elemwise),
    ``qadd<i>_q0`` / ``qadd<i>_q1`` (the stubs of its operands) and
    ``qadd<i>_dq``.

    What :func:`quantize_layers` does with ``adds=True``; after it,
    ``optimize``'s FuseQuantStub and EliminateRequantize make the layers
    before an add write its int8 operands and the layers after it read
    its int8 sum, so a residual CNN (ResNet, MobileNetV2) runs int8 from
    conv to conv. Broadcasting adds, other dtypes and in-place ``+=`` stay
    as they are.

    The float QuantStub / DequantStub are builtins (format 1.2), so the
    rewritten float model saves, loads and runs as it is.

    Returns the number of adds rewritten. Raises TypeError for ``tm`` not a
    TracedModule (trace it first: ``mgtrace.trace_module``).
    """
    import mgtrace.module as M
    from mgtrace.traced_module.passes.match import activation, sole_user
    from mgtrace.traced_module.passes.util import graphs_of
    from mgtrace.traced_module.traced_module import TracedModule
    if not isinstance(tm, TracedModule):
        raise TypeError(f"quantize_adds rewrites a TracedModule's graph; got "
                        f"{type(tm).__name__} (trace it first: mgtrace.trace_module)")
    done = 0
    for g in list(graphs_of(tm)):
        owner, changed = g.owner, False
        for e in list(g._exprs):
            ops = _add_operands(e)
            if ops is None:
                continue
            y, last, method = e.outputs[0], e, "add"
            user = sole_user(y)
            hit = activation(user) if user is not None else None
            if hit is not None and hit[0] == "relu" and hit[1] is y:
                last, method = user, "fuse_add_relu"
            name = _free_name(owner, "qadd")
            for suffix, stub in (("_q0", M.QuantStub()), ("_q1", M.QuantStub()),
                                 ("_dq", M.DequantStub())):
                setattr(owner, name + suffix, stub)
            setattr(owner, name, M.Elemwise(method))
            with g.insert_exprs(last):
                qa = getattr(owner, name + "_q0")(ops[0])
                qb = getattr(owner, name + "_q1")(ops[1])
                new = getattr(owner, name + "_dq")(getattr(owner, name)(qa, qb))
            g.replace_node({last.outputs[0]: new})
            changed = True
            done += 1
        if changed:
            g.compile()
    return done


def quantize_layers(model, calibrate, types=None, qconfig=None, float_outputs=False,
                    adds=False):
    """Post-training int8 quantization of chosen layers, each on its own:
    every module of ``types`` in ``model`` becomes ``Sequential(QuantStub,
    layer, DequantStub)``, so the rest of the model stays float; the
    model is converted by :func:`quantize_qat`, calibrated by
    ``calibrate(qat)`` in eval mode (observers on, fake quantization off)
    and converted by :func:`quantize`. What the MiniLM figures (int8
    linears), the int8 benchmarks and their ONNX exports run.

    Args:
        model: a float Module, changed in place (its layers are wrapped).
        calibrate: a callable given the QAT model; it runs it on the
            calibration data (e.g. ``lambda m: m(ids, mask)``).
        types: the exact layer types to quantize; default (M.Linear,
            M.Conv2d). The model's layers of other types stay float (its
            own stubs, Elemwise and Concat modules are converted).
        qconfig: default :data:`per_channel_quint8_qconfig`.
        float_outputs: the layers keep float32 outputs (their accumulator
            times ``x_scale * w_scale``, as ONNX's MatMulInteger / ConvInteger),
            no output quantization: BERT's outlier features lose less.
        adds: ``model`` being a TracedModule, its float32 tensor additions
            (and ReLUs of them) become int8 Elemwise adds first
            (:func:`quantize_adds`): with ``optimize(..., flatten=True)``
            after, a residual CNN's activations stay int8 through its
            shortcuts. Off by default: a transformer's residual adds feed
            LayerNorms, which run in float (MiniLM would only lose
            accuracy). TypeError for a model that is no TracedModule.

    Returns the quantized model (``model`` itself, or, when ``model`` is
    one of ``types``, a new Sequential of it between stubs). Raises
    QuantizationError as :func:`quantize` does.

    >>> import numpy as np, mgtrace as mt, mgtrace.module as M
    >>> import mgtrace.quantization as Q
    >>> net = M.Sequential(M.Linear(4, 3), M.ReLU())
    >>> x = mt.tensor(np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4))
    >>> q = Q.quantize_layers(net, lambda m: m(x), float_outputs=True)
    >>> type(q[0][1]).__module__, q(x).dtype == np.float32
    ('mgtrace.module.quantized.modules', True)
    """
    import mgtrace.module as M
    from mgtrace.traced_module.traced_module import TracedModule
    types = tuple(types) if types is not None else (M.Linear, M.Conv2d)
    # the model's own layers of other types stay float: quantize_qat would
    # convert them too (types=(Conv2d,) turned a Linear int8 with no
    # QuantStub before it, which then refused its float input); stubs,
    # Elemwise and Concat, which a model places itself, MegEngine's way,
    # are converted as before
    kept = (M.QuantStub, M.DequantStub, M.Elemwise, M.Concat)
    others = [m for m in model.modules() if type(m) not in types and type(m) not in kept
              and type(m) in _float_to_qat() and not getattr(m, "quantize_disabled", False)]
    if adds:
        if not isinstance(model, TracedModule):
            raise TypeError(f"quantize_layers(adds=True) rewrites a TracedModule's graph; got "
                            f"{type(model).__name__} (trace it with mgtrace.trace_module first)")
        quantize_adds(model)
    if type(model) in types:
        model = M.Sequential(M.QuantStub(), model, M.DequantStub())
    else:
        for parent in list(model.modules()):
            for name, child in list(parent._modules.items()):
                if type(child) in types:
                    setattr(parent, name, M.Sequential(M.QuantStub(), child, M.DequantStub()))
    from mgtrace.quantization.qconfig import per_channel_quint8_qconfig
    for m in others:
        m.quantize_disabled = True
    try:
        qat = quantize_qat(model, qconfig=qconfig or per_channel_quint8_qconfig)
    finally:
        for m in others:
            del m.quantize_disabled
    if float_outputs:
        for m in qat.modules():
            if isinstance(m, _qat_base()) and m.with_weight:
                m.act_observer = m.act_fake_quant = None
    qat.eval()
    enable_observer(qat)
    disable_fake_quant(qat)
    calibrate(qat)
    disable_observer(qat)
    enable_fake_quant(qat)
    return quantize(qat)

