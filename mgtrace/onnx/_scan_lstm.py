"""An LSTM with a projection (``proj_size``) as ONNX ``Scan`` nodes: ONNX's
LSTM op has no projection, so each layer and direction is a Scan over the
sequence whose body is one step of :class:`mgtrace.module.LSTM` (torch's
gate order: input, forget, cell, output)::

    g = x_t @ W_ih^T + h @ W_hh^T + (b_ih + b_hh)
    c = sigmoid(f) * c + sigmoid(i) * tanh(g_cell)
    h = (sigmoid(o) * tanh(c)) @ W_hr^T

The sequence length stays symbolic (Scan runs every step); the reverse
direction scans and writes its outputs from the end. Weights are
initializers of the main graph (transposed once at export, named
``<module>.<weight>_T<suffix>``), read by the body from the outer scope.
"""
import numpy as np

from mgtrace.onnx._builder import Builder, V

__all__ = ["lstm_proj"]


def _body(b, dt, w_ih, w_hh, bias, w_hr, hid):
    """The Scan body graph: (h, c, x_t) -> (h, c, y_t)."""
    from onnx import helper
    sub = Builder(b.opset, b.contrib)
    sub._names = b._names            # one namespace: body names never shadow outer ones
    sub.scope = f"{b.scope}/step"
    tt = helper.np_dtype_to_tensor_dtype(dt)
    names = [sub.fresh(f"{b.scope}/step/{n}") for n in ("h_in", "c_in", "x_t")]
    h, c, x = (V(n, dt, (0, 0)) for n in names)
    g = sub.op("MatMul", [x, w_ih], dt, (0, 0))
    g = sub.op("Add", [g, sub.op("MatMul", [h, w_hh], dt, (0, 0))], dt, (0, 0))
    if bias is not None:
        g = sub.op("Add", [g, bias], dt, (0, 0))
    parts = [sub.op("Slice", [g, sub.ints([k * hid]), sub.ints([(k + 1) * hid]),
                              sub.ints([1])], dt, (0, 0)) for k in range(4)]
    i, f, o = (sub.op("Sigmoid", [parts[k]], dt, (0, 0)) for k in (0, 1, 3))
    cell = sub.op("Tanh", [parts[2]], dt, (0, 0))
    c2 = sub.op("Add", [sub.op("Mul", [f, c], dt, (0, 0)), sub.op("Mul", [i, cell], dt, (0, 0))],
                dt, (0, 0))
    h2 = sub.op("Mul", [o, sub.op("Tanh", [c2], dt, (0, 0))], dt, (0, 0))
    h2 = sub.op("MatMul", [h2, w_hr], dt, (0, 0))
    y = sub.op("Identity", [h2], dt, (0, 0))
    info = lambda n: helper.make_tensor_value_info(n, tt, None)   # noqa: E731
    return helper.make_graph(sub.nodes, sub.fresh(f"{b.scope}/step"),
                             [info(n) for n in names],
                             [info(v.name) for v in (h2, c2, y)], sub.initializers)


def lstm_proj(b, m, x, hx, path, dt):
    """The layers of LSTM ``m`` (``proj_size`` > 0) on ``x`` [T, N, I]
    (time first): ``(y [T, N, D * P], [h_n parts], [c_n parts])``, one part
    [1, N, P] / [1, N, H] per layer and direction. ``hx``: (h_0, c_0) Vs or
    (None, None)."""
    hid, proj, ndir = m.hidden_size, m.proj_size, m.num_directions
    n = b.op("Gather", [b.shape_of(x), b.const(np.int64(1))], np.int64, (), axis=0)
    hs, cs = [], []

    def zeros(size):
        shape = b.op("Concat", [b.op("Unsqueeze", [n, b.ints([0])], np.int64, (1,)),
                                b.ints([size])], np.int64, (2,), axis=0)
        from onnx import helper
        return b.op("ConstantOfShape", [shape], dt, (0, 0),
                    value=helper.make_tensor("zero", helper.np_dtype_to_tensor_dtype(dt), [1],
                                             [0]))

    def weight(name, sfx):
        a = np.asarray(getattr(m, name + sfx).numpy(), np.float32)
        return b.const(np.ascontiguousarray(a.T).astype(dt), name=f"{path}.{name}_T{sfx}")

    for layer in range(m.num_layers):
        ys = []
        for k, sfx in enumerate(m._suffixes(layer)):
            bias = None
            if m.bias:
                s = (np.asarray(getattr(m, f"bias_ih{sfx}").numpy(), np.float32)
                     + np.asarray(getattr(m, f"bias_hh{sfx}").numpy(), np.float32))
                bias = b.const(s.astype(dt), name=f"{path}.bias_sum{sfx}")
            body = _body(b, dt, weight("weight_ih", sfx), weight("weight_hh", sfx), bias,
                         weight("weight_hr", sfx), hid)
            row = b.ints([layer * ndir + k])
            states = []
            for h0, size in zip(hx, (proj, hid)):
                if h0 is None:
                    states.append(zeros(size))
                else:
                    s = b.op("Gather", [b.cast(h0, dt), row], dt, (1, 0, 0), axis=0)
                    states.append(b.op("Squeeze", [s, b.ints([0])], dt, (0, 0)))
            outs = b.node("Scan", states + [x], n_out=3, body=body, num_scan_inputs=1,
                          scan_input_directions=[k], scan_output_directions=[k])
            h_n, c_n, y = (V(o, dt, s) for o, s in zip(outs, ((0, 0), (0, 0), (0, 0, 0))))
            hs.append(b.op("Unsqueeze", [h_n, b.ints([0])], dt, (1, 0, 0)))
            cs.append(b.op("Unsqueeze", [c_n, b.ints([0])], dt, (1, 0, 0)))
            ys.append(y)
        x = ys[0] if len(ys) == 1 else b.op("Concat", ys, dt, (0, 0, 0), axis=2)
    return x, hs, cs
