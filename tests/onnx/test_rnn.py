"""RNN and LSTM: exported with and without initial states (ONNX RNN/LSTM
nodes, run in ONNX Runtime against mgtrace), and imported back as
mgtrace's RNN/LSTM modules (export -> import -> run equal)."""
import numpy as np
import pytest

pytest.importorskip("onnx", reason="needs onnx (pip install 'mgtrace[onnx]')")
pytest.importorskip("onnxruntime", reason="needs onnxruntime (pip install 'mgtrace[onnx]')")

import mgtrace as mt  # noqa: E402
import mgtrace.module as M  # noqa: E402
import mgtrace.onnx as mo  # noqa: E402
from mgtrace.onnx.exporter import build_model, compare, run_ort  # noqa: E402
from mgtrace.traced_module.pytree import tree_flatten  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

CASES = {
    "lstm_bi_batch_first": (M.LSTM, dict(num_layers=2, bidirectional=True, batch_first=True)),
    "rnn_relu_bi": (M.RNN, dict(num_layers=2, bidirectional=True, nonlinearity="relu")),
    "lstm": (M.LSTM, {}),
    "rnn": (M.RNN, dict(num_layers=1)),
}


class WithState(M.Module):
    def __init__(self, rnn):
        super().__init__()
        self.rnn = rnn

    def forward(self, x, h0, c0=None):
        return self.rnn(x, (h0, c0) if c0 is not None else h0)


def _flat(v):
    return [t.numpy() for t in tree_flatten(v, lambda t: isinstance(t, mt.Tensor))[0]]


def _net(case, seed=0):
    mt.random.seed(seed)
    cls, kw = CASES[case]
    return cls(5, 7, **kw).eval()


@pytest.mark.parametrize("case", sorted(CASES))
def test_round_trip_imports_rnn_modules(case):
    net = M.Sequential(_net(case)).eval()
    rng = np.random.default_rng(1)
    tm = mt.trace_module(net, mt.tensor(rng.standard_normal((2, 3, 5)).astype(np.float32)))
    model = build_model(tm)
    back = mo.load(model.SerializeToString())
    kinds = {type(m).__name__ for _, m in back.named_modules()}
    assert CASES[case][0].__name__ in kinds
    x = rng.standard_normal((4, 6, 5)).astype(np.float32)
    want = _flat(net(mt.tensor(x)))
    got = _flat(back(mt.tensor(x)))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert compare(g, w) is None, compare(g, w)


@pytest.mark.parametrize("case", sorted(CASES))
def test_initial_states_export_and_round_trip(case):
    rnn = _net(case, 2)
    net = WithState(rnn).eval()
    lstm = isinstance(rnn, M.LSTM)
    rng = np.random.default_rng(3)
    layers = rnn.num_layers * rnn.num_directions

    def inputs(n, t):
        x = rng.standard_normal((n, t, 5) if rnn.batch_first else (t, n, 5)).astype(np.float32)
        states = [rng.standard_normal((layers, n, 7)).astype(np.float32)
                  for _ in range(2 if lstm else 1)]
        return [x] + states
    tm = mt.trace_module(net, *[mt.tensor(a) for a in inputs(2, 3)])
    model = build_model(tm)
    xs = inputs(3, 5)                   # another batch and length
    want = _flat(net(*[mt.tensor(a) for a in xs]))
    for i, (g, w) in enumerate(zip(run_ort(model, xs), want)):
        assert compare(g, w, f"output {i}") is None, compare(g, w, f"output {i}")
    back = mo.load(model.SerializeToString())
    for g, w in zip(_flat(back(*[mt.tensor(a) for a in xs])), want):
        assert compare(g, w) is None, compare(g, w)


def _lstm_model(**attrs):
    h = 3
    rng = np.random.default_rng(4)
    inits = [numpy_helper.from_array(rng.standard_normal((1, 4 * h, 2)).astype(np.float32), "W"),
             numpy_helper.from_array(rng.standard_normal((1, 4 * h, h)).astype(np.float32), "R")]
    ins = ["x", "W", "R"]
    outs = ["y"]
    if attrs.pop("lens", False):
        inits.append(numpy_helper.from_array(np.array([2], np.int32), "lens"))
        ins += ["", "lens"]
        outs += ["", "yc"]
    node = helper.make_node("LSTM", ins, outs, hidden_size=h, **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [4, 1, 2])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])


@pytest.mark.parametrize("direction", ["forward", "reverse"])
def test_lstm_import_matches_ort(direction):
    model = _lstm_model(direction=direction)
    node = model.graph.node[0]
    node.output.extend(["yh", "yc"])
    model.graph.output.extend([helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
                               for n in ("yh", "yc")])
    x = np.random.default_rng(5).standard_normal((4, 1, 2)).astype(np.float32)
    want = run_ort(model, [x])
    got = mo.load(model.SerializeToString())(mt.tensor(x))
    assert len(got) == 3
    for g, w in zip(got, want):
        assert compare(g.numpy(), w) is None, compare(g.numpy(), w)


@pytest.mark.parametrize("attrs, match", [
    (dict(lens=True), "Y_c with sequence_lens"),
    (dict(direction="sideways"), "direction"),
    (dict(clip=1.0), "clip"),
    (dict(input_forget=1), "input_forget"),
    (dict(activations=["Sigmoid", "Relu", "Tanh"]), "activations"),
])
def test_lstm_forms_without_an_mgtrace_module_are_refused(attrs, match):
    with pytest.raises(mo.OnnxImportError, match=match):
        mo.load(_lstm_model(**attrs).SerializeToString())


@pytest.mark.parametrize("opset", [13, None])
@pytest.mark.parametrize("kw", [{}, dict(num_layers=2, bidirectional=True, batch_first=True)])
def test_lstm_with_projection_exports_as_scan(kw, opset):
    """proj_size: ONNX's LSTM has no projection; each layer and direction is
    a Scan whose body is one step, run at another batch and length."""
    mt.random.seed(4)
    rnn = M.LSTM(5, 7, proj_size=3, **kw).eval()
    layers = rnn.num_layers * rnn.num_directions
    rng = np.random.default_rng(6)

    def inputs(n, t, states):
        x = rng.standard_normal((n, t, 5) if rnn.batch_first else (t, n, 5)).astype(np.float32)
        return [x] + ([rng.standard_normal((layers, n, 3)).astype(np.float32),
                       rng.standard_normal((layers, n, 7)).astype(np.float32)] if states else [])
    for states in (False, True):
        net = WithState(rnn).eval() if states else M.Sequential(rnn).eval()
        tm = mt.trace_module(net, *[mt.tensor(a) for a in inputs(2, 3, states)])
        model = build_model(tm, opset=opset)
        assert "Scan" in {n.op_type for n in model.graph.node}
        xs = inputs(4, 6, states)
        want = _flat(net(*[mt.tensor(a) for a in xs]))
        got = run_ort(model, xs)
        assert [g.shape for g in got] == [w.shape for w in want]
        for i, (g, w) in enumerate(zip(got, want)):
            assert compare(g, w, f"output {i}") is None, compare(g, w, f"output {i}")


def test_layout_1_imports_as_batch_first():
    """layout=1 (opset 14: X [N, T, I], Y [N, T, D, H], states [N, D, H]):
    the same weights give layout 0's results, transposed (ORT's CPU LSTM
    has no layout=1 kernel to compare with)."""
    h = 3
    rng = np.random.default_rng(7)
    w = numpy_helper.from_array(rng.standard_normal((2, 4 * h, 2)).astype(np.float32), "W")
    r = numpy_helper.from_array(rng.standard_normal((2, 4 * h, h)).astype(np.float32), "R")

    def model(layout):
        x_shape = ["t", "n", 2] if layout == 0 else ["n", "t", 2]
        s_shape = [2, "n", h] if layout == 0 else ["n", 2, h]
        node = helper.make_node("LSTM", ["x", "W", "R", "", "", "h0", "c0"], ["y", "yh", "yc"],
                                hidden_size=h, direction="bidirectional", layout=layout)
        ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)] + [
            helper.make_tensor_value_info(n, TensorProto.FLOAT, s_shape) for n in ("h0", "c0")]
        outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
                for n in ("y", "yh", "yc")]
        graph = helper.make_graph([node], "g", ins, outs, [w, r])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    x = rng.standard_normal((4, 3, 2)).astype(np.float32)            # [T, N, I]
    h0, c0 = (rng.standard_normal((2, 3, h)).astype(np.float32) for _ in range(2))
    want = run_ort(model(0), [x, h0, c0])
    m1 = mo.load(model(1).SerializeToString())
    assert "LSTM" in {type(m).__name__ for _, m in m1.named_modules()}
    y, yh, yc = (t.numpy() for t in m1(*[mt.tensor(np.ascontiguousarray(a.transpose(1, 0, 2)))
                                         for a in (x, h0, c0)]))
    np.testing.assert_allclose(y, want[0].transpose(2, 0, 1, 3), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(yh, want[1].transpose(1, 0, 2), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(yc, want[2].transpose(1, 0, 2), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op, direction, states", [
    ("LSTM", "bidirectional", False), ("LSTM", "forward", True),
    ("RNN", "bidirectional", True), ("RNN", "forward", False)])
def test_sequence_lens_import_matches_ort(op, direction, states):
    """sequence_lens: Y zero past each sample's length, Y_h at its last step,
    the reverse direction over each sample's own span; ORT's outputs."""
    h, d = 3, 2 if direction == "bidirectional" else 1
    g = 4 if op == "LSTM" else 1
    rng = np.random.default_rng(8)
    inits = [numpy_helper.from_array(
        (rng.standard_normal((d, g * h, 2)) * 0.5).astype(np.float32), "W"),
        numpy_helper.from_array((rng.standard_normal((d, g * h, h)) * 0.5).astype(np.float32),
                                "R"),
        numpy_helper.from_array(rng.standard_normal((d, 2 * g * h)).astype(np.float32), "B")]
    names = ["x", "W", "R", "B", "lens"] + (["h0"] + (["c0"] if op == "LSTM" else [])
                                            if states else [])
    node = helper.make_node(op, names, ["y", "yh"], hidden_size=h, direction=direction)
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["t", "n", 2]),
           helper.make_tensor_value_info("lens", TensorProto.INT32, ["n"])]
    ins += [helper.make_tensor_value_info(n, TensorProto.FLOAT, [d, "n", h])
            for n in names[5:]]
    graph = helper.make_graph([node], "g", ins, [helper.make_tensor_value_info(
        n, TensorProto.FLOAT, None) for n in ("y", "yh")], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    xs = [rng.standard_normal((5, 3, 2)).astype(np.float32), np.array([5, 2, 3], np.int32)]
    xs += [rng.standard_normal((d, 3, h)).astype(np.float32) for _ in names[5:]]
    want = run_ort(model, xs)
    tm = mo.load(model.SerializeToString(), example_inputs=[
        x[:, :2] if i == 0 else x[:2] if i == 1 else x[:, :2] for i, x in enumerate(xs)])
    got = [t.numpy() for t in tm(*[mt.tensor(x) for x in xs])]
    for gv, wv in zip(got, want):
        np.testing.assert_allclose(gv, wv, rtol=1e-5, atol=1e-6)
    assert op in {type(m).__name__ for _, m in tm.named_modules()}
    import io
    buf = io.BytesIO()
    mt.save(tm, buf)
    back = mt.load(io.BytesIO(buf.getvalue()))
    np.testing.assert_array_equal(back(*[mt.tensor(x) for x in xs])[0].numpy(), got[0])
