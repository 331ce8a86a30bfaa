"""Int8-specific fusions of quantized graphs (``mgtrace.module.quantized``).

- ``FuseQuantStub``: a quantized Conv2d or Linear whose output stays float
  (no ``act_qparams``: :func:`mgtrace.quantization.quantize_layers` with
  ``float_outputs=True``, or a QAT layer without an activation observer),
  followed by a DequantStub, a ReLU or ReLU6 or nothing, and a QuantStub,
  becomes that layer writing the QuantStub's quantized output itself, the
  ReLU fused into its saturation (the layer's ``*Relu*`` form)::

      QuantStub(relu(DequantStub(conv(x))))   ->   ConvRelu2d'(x)

  A max pool may sit between the activation (or the DequantStub) and the
  QuantStub (ResNet's stem: ``maxpool(relu(bn(conv(x))))``): the layer then
  writes the stub's integers and the pool runs on them
  (``F.max_pool2d`` of a quantized tensor, qparams kept), exactly the
  float pool quantized, since quantizing is monotone::

      QuantStub(maxpool(relu(DequantStub(conv(x)))))   ->   maxpool(ConvRelu2d'(x))

  Activations then stay int8 from one layer to the next: no float32
  tensor, no dequantize / quantize pass between them. The fused layer
  computes ``clip(rint(acc * (x_scale * w_scale / y_scale)) + y_zp)``
  (:mod:`mgtrace.quantization.int8`) where the unfused graph computed
  ``clip(rint(float32(acc * x_scale * w_scale + bias) / y_scale) + y_zp)``:
  one rounding to float32 fewer (and the bias as MegEngine's qint32
  ``rint(bias / (x_scale * w_scale))``), so an output integer differs from
  the unfused graph's by at most one (a value within a float32 rounding of
  a .5 tie); most are equal. A ReLU6 fuses only where its clip at 6 is
  the output's saturation already (``rint(6 / y_scale) + y_zp >= qmax``,
  as when the stub's observer saw the ReLU6's outputs); elsewhere the
  pattern stays.

The layer, its DequantStub and the activation must each be read by the
next call alone, and the layer module called once in the whole module (its
class and ``act_qparams`` change). The value before the QuantStub may be
read by several QuantStubs of equal qparams (a residual block's input: its
first conv's stub and the shortcut add's, :func:`mgtrace.quantization.quantize_adds`):
all of them then read the layer's output.

- ``EliminateRequantize``: ``QuantStub(DequantStub(z))`` where ``z`` is
  written by a quantized module whose ``act_qparams`` are the stub's (per
  tensor qint8 / quint8, equal dtype, scale and zero point) is ``z``
  itself: ``rint((q - zp) * s / s) + zp`` is ``q`` for every int8 / uint8
  ``q`` (the float32 product and quotient are within a few ulps of the
  integer ``q - zp``, far from a .5 tie), so the pair goes, bitwise. With
  the int8 Elemwise adds, the sum flows into the next block's conv and
  shortcut as int8. Other readers of the DequantStub keep it. And
  QuantStubs of equal qparams reading one value (BERT's query, key and
  value layers read one hidden state; a residual block's first conv and
  shortcut) quantize it once: the later ones read the first's output.
  Neither happens across an expr with a side effect (``x[0] = v``, an
  in-place op on a view): a stub after one quantizes its input anew.

Patterns spanning traced submodules need ``optimize(..., flatten=True)``.
"""
import numpy as np

import mgtrace.functional as F
import mgtrace.module as M
import mgtrace.module.quantized as MQ
from mgtrace.traced_module.graph import has_side_effect
from mgtrace.traced_module.passes.match import (activation, bound_args, is_function, module_call,
                                                side_effect_between, sole_user)
from mgtrace.traced_module.passes.util import call_counts, graphs_of

__all__ = ["fuse_quant_stub", "eliminate_requantize"]

# a float-output layer -> its form with the ReLU in the saturation
_RELU_FORM = {MQ.Conv2d: MQ.ConvRelu2d, MQ.ConvRelu2d: MQ.ConvRelu2d,
              MQ.ConvBn2d: MQ.ConvBnRelu2d, MQ.ConvBnRelu2d: MQ.ConvBnRelu2d,
              MQ.Linear: MQ.LinearRelu, MQ.LinearRelu: MQ.LinearRelu}
_QMAX = {"qint8": 127, "quint8": 255}


def _stub_qparams(stub):
    """``(qparams, scale, zero point, qmax)`` of a QuantStub whose output the
    int8 layers can write (per-tensor qint8 or quint8), else None."""
    q = stub.act_qparams
    if q is None or q.dtype_meta.name not in _QMAX:
        return None
    scale = np.asarray(q.scale.numpy())
    if scale.ndim:
        return None
    zp = 0 if q.zero_point is None else int(np.asarray(q.zero_point.numpy()))
    return q, np.float32(scale), zp, _QMAX[q.dtype_meta.name]


def _same_qparams(a, b):
    """Whether two per-tensor QParams quantize alike (dtype, scale, zero point)."""
    if a is b:
        return True
    if a is None or b is None or a.dtype_meta.name != b.dtype_meta.name:
        return False
    za = None if a.zero_point is None else np.asarray(a.zero_point.numpy())
    zb = None if b.zero_point is None else np.asarray(b.zero_point.numpy())
    return np.array_equal(np.asarray(a.scale.numpy()), np.asarray(b.scale.numpy())) and \
        (za is None) == (zb is None) and (za is None or np.array_equal(za, zb))


def _stub_call(e):
    """The QuantStub ``e`` calls on one tensor, else None."""
    stub = module_call(e, MQ.QuantStub)
    if stub is None or len(e.args) != 2 or e.kwargs:
        return None
    return stub


def _stub_readers(x, q):
    """The QuantStub calls reading node ``x``, when only such calls read it
    and all quantize with ``q``; else None."""
    if not x.users or id(x) in x.graph._kept_ids():
        return None
    for u in x.users:
        stub = _stub_call(u)
        if stub is None or u.args[1] is not x or not _same_qparams(stub.act_qparams, q):
            return None
    return list(x.users)


def _match(e, counts):
    """``(layer, act, layer output node, qparams, stub calls)`` when ``e``
    is a QuantStub call ending the pattern, else None."""
    stub = _stub_call(e)
    if stub is None:
        return None
    target = _stub_qparams(stub)
    x, act = e.args[1], None
    if target is None or x.expr is None:
        return None
    stubs = _stub_readers(x, stub.act_qparams)
    if stubs is None:
        return None
    pooled, pool_in = None, _max_pool_input(x.expr)
    if pool_in is not None:
        if pool_in.expr is None or sole_user(pool_in) is not x.expr:
            return None
        pooled, x = x, pool_in
    hit = activation(x.expr)
    if hit is not None:
        act, inner = hit
        if act not in ("relu", "relu6") or inner.expr is None or sole_user(inner) is not x.expr:
            return None
        x = inner
    if module_call(x.expr, MQ.DequantStub) is None or len(x.expr.args) != 2:
        return None
    y = x.expr.args[1]
    layer = module_call(y.expr) if y.expr is not None else None
    if type(layer) not in _RELU_FORM or layer.act_qparams is not None or \
            sole_user(y) is not x.expr or counts.get(id(layer), 0) != 1:
        return None
    q, scale, zp, qmax = target
    if act == "relu6" and np.rint(np.float32(6) / scale) + zp < qmax:
        return None
    return layer, act, y, q, stubs, (pooled, pool_in) if pooled is not None else None


def _max_pool_input(e):
    """The tensor node a max pool expr (``M.MaxPool2d`` call or
    ``F.max_pool2d``, values only) reads, else None."""
    m = module_call(e, M.MaxPool2d)
    if m is not None:
        if len(e.args) != 2 or e.kwargs or m.return_indices:
            return None
        x = e.args[1]
    elif is_function(e, F.max_pool2d):
        args = bound_args(e)
        if args is None or args.get("return_indices") is not False:
            return None
        x = args["x"]
    else:
        return None
    return x if getattr(x, "kind", None) == "tensor" else None


def fuse_quant_stub(tm):
    """The quantized layers with float outputs that feed a QuantStub
    (through a DequantStub and a ReLU / ReLU6 or nothing) write its
    quantized output themselves (see the module docstring); returns the
    number of fusions."""
    counts = call_counts(tm)
    done = 0
    for g in list(graphs_of(tm)):
        changed = False
        for e in list(g._exprs):
            hit = _match(e, counts)
            if hit is None:
                continue
            layer, act, y, q, stubs, pool = hit
            layer.act_qparams = q
            if act is not None:
                layer.__class__ = _RELU_FORM[type(layer)]
            y.dtype = e.outputs[0].dtype        # the stub's int8 / uint8 (ONNX export reads it)
            if pool is None:
                g.replace_node({s.outputs[0]: y for s in stubs})
            else:                               # the pool reads the integers, the stubs' readers it
                pooled, pool_in = pool
                pooled.dtype = y.dtype
                g.replace_node({pool_in: y})
                g.replace_node({s.outputs[0]: pooled for s in stubs})
            changed = True
            done += 1
        if changed:
            g.compile()
    return done


def _quantized_by(z):
    """The act_qparams of the quantized module writing node ``z``, else None."""
    m = module_call(z.expr) if z.expr is not None else None
    if not isinstance(m, MQ.QuantizedModule) or getattr(m, "act_qparams", None) is None:
        return None
    return m.act_qparams if _stub_qparams(m) is not None else None


def eliminate_requantize(tm):
    """Each ``QuantStub(DequantStub(z))`` whose stub quantizes as the
    module writing ``z`` does is ``z``, and a QuantStub quantizing a value
    an earlier stub of equal qparams quantized is that stub's output (see
    the module docstring); returns the number of stubs dropped."""
    done = 0
    for g in list(graphs_of(tm)):
        changed, quantized = False, {}      # id(node) -> [(qparams, its integers' node)]
        for e in list(g._exprs):
            if has_side_effect(e):
                # an in-place write (x[0] = 5, a view's *= 2) may change any
                # value quantized so far: a later stub quantizes it anew
                quantized.clear()
            stub = _stub_call(e)
            x = e.args[1] if stub is not None else None
            if x is None or getattr(x, "kind", None) != "tensor":
                continue
            q = stub.act_qparams
            same = quantized.setdefault(id(x), [])
            # the integers z a DequantStub read, when z has the stub's qparams
            # and nothing wrote in place since; else those an earlier stub of
            # equal qparams made of x
            new = _requantized(x, q)
            if new is not None and side_effect_between(g, x.expr, e):
                new = None
            if new is None:
                new = next((n for p, n in same if _same_qparams(p, q)), None)
            if new is None:
                same.append((q, e.outputs[0]))
                continue
            new.dtype = e.outputs[0].dtype
            g.replace_node({e.outputs[0]: new})
            if not any(_same_qparams(p, q) for p, _ in same):
                same.append((q, new))
            changed = True
            done += 1
        if changed:
            g.compile()
    return done


def _requantized(x, q):
    """Node z when ``x`` is ``DequantStub(z)`` and the module writing z
    quantizes with ``q``, else None."""
    if x.expr is None or module_call(x.expr, MQ.DequantStub) is None or \
            len(x.expr.args) != 2 or x.expr.kwargs:
        return None
    z = x.expr.args[1]
    if getattr(z, "kind", None) != "tensor":
        return None
    zq = _quantized_by(z)
    return z if zq is not None and _same_qparams(zq, q) else None
