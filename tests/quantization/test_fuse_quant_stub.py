"""optimize's FuseQuantStub on a quantize_layers(float_outputs=True) model:
which layers it fuses (ReLU, ReLU6 where its clip is the saturation,
nothing between), that each fused layer is bitwise the NumPy integer
reference and within one integer of the unfused graph's QuantStub on the
same input, that the fused graph lints, saves and loads, and what it
leaves alone."""
import io
import warnings

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module as M
import mgtrace.module.quantized as MQ
import mgtrace.quantization as Q
from mgtrace.traced_module import optimize
from mgtrace.quantization.qtensor import qparams_of
from mgtrace.quantization.utils import QuantMode, create_qparams, quant_dtype

from tests.quantization.test_int8_kernels import ref_bias, ref_conv, ref_linear, ref_requant


class Net(M.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = M.Conv2d(3, 8, 3, padding=1)
        self.act1 = M.ReLU()
        self.conv2 = M.Conv2d(8, 8, 3, stride=2, padding=1, groups=8)
        self.act2 = M.ReLU6()
        self.conv3 = M.Conv2d(8, 6, 1)
        self.conv4 = M.Conv2d(6, 4, 3)
        self.fc1 = M.Linear(4 * 2 * 2, 10)
        self.fc2 = M.Linear(10, 5)

    def forward(self, x):
        x = self.conv4(self.conv3(self.act2(self.conv2(self.act1(self.conv1(x))))))
        return self.fc2(F.relu(self.fc1(F.flatten(x, 1))))


def _data(seed, n=4):
    return (np.random.default_rng(seed).standard_normal((n, 3, 8, 8)) * 2).astype(np.float32)


def _quantized(seed=0):
    mt.random.seed(seed)
    net = Net().eval()
    for m in (net.conv1, net.conv2):        # outputs past 6: the ReLU6 clips
        m.weight = M.Parameter(m.weight.numpy() * 4)
    calib = [mt.tensor(_data(s)) for s in (1, 2)]
    q = Q.quantize_layers(net, lambda m: [m(x) for x in calib], float_outputs=True)
    x = mt.tensor(_data(3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tm = mt.trace_module(q, x)
    return tm, x


def _flat(tm):
    return optimize(tm, [], flatten=True)


def _layers(tm):
    """The quantized layers a flat graph calls, in order."""
    return [e.args[0].owner for e in tm.graph._exprs
            if e.kind == "call_method" and e.method == "__call__"
            and isinstance(e.args[0].owner, (MQ.Conv2d, MQ.Linear))]


def _record(modules):
    """Forward hooks keeping each module's (input, output) of the last call."""
    seen = {}
    for m in modules:
        m.register_forward_hook(lambda mod, args, out: seen.__setitem__(id(mod), (args[0], out)))
    return seen


def test_fuses_relu_relu6_and_bare_chains_into_the_layers():
    tm, x = _quantized()
    fused, report = optimize(tm, "FuseQuantStub", flatten=True, return_report=True)
    assert report["FuseQuantStub"].counts == {"fusions": 4}
    kinds = [type(m) for m in _layers(fused)]
    # conv1 (ReLU), conv2 (ReLU6), conv3 (nothing between) and fc1 (F.relu)
    # write quint8; conv4 feeds a flatten, fc2 the output: float32 stays
    assert kinds == [MQ.ConvRelu2d, MQ.ConvRelu2d, MQ.Conv2d, MQ.Conv2d, MQ.LinearRelu,
                     MQ.Linear]
    outs = [m.act_qparams is not None for m in _layers(fused)]
    assert outs == [True, True, True, False, True, False]
    names = [type(e.args[0].owner).__name__ for e in fused.graph._exprs
             if e.kind == "call_method" and e.method == "__call__"]
    assert names.count("QuantStub") == 2 and names.count("ReLU") == 0 and \
        names.count("ReLU6") == 0
    fused.graph.lint()
    # the input graph is untouched
    assert [type(m) for m in _layers(_flat(tm))] == [MQ.Conv2d] * 4 + [MQ.Linear] * 2


def test_each_fused_layer_is_the_integer_reference_and_within_one_of_the_stub():
    tm, x = _quantized()
    flat = _flat(tm)
    fused = optimize(tm, "FuseQuantStub", flatten=True)
    # the unfused graph: each layer's input and the QuantStub output after it
    stubs = [e.args[0].owner for e in flat.graph._exprs
             if e.kind == "call_method" and e.method == "__call__"
             and isinstance(e.args[0].owner, MQ.QuantStub)]
    seen = _record(_layers(flat) + stubs)
    flat(x)
    layer_in = [seen[id(m)][0] for m in _layers(flat)]
    stub_out = [np.asarray(seen[id(s)][1].numpy()) for s in stubs[1:]]  # stubs[0]: the input's
    fused_layers = _layers(fused)
    compared = 0
    for i in (0, 1, 2, 4):                  # the fused ones, each on the unfused input
        m = fused_layers[i]
        xin = layer_in[i]
        got = m(xin)
        q = m.act_qparams
        got_q = np.asarray(got.numpy())
        assert got_q.dtype == np.uint8
        want = stub_out[i]
        diff = np.abs(got_q.astype(np.int32) - want.astype(np.int32))
        assert diff.max() <= 1 and (diff == 0).mean() > 0.97, (i, diff.max(), (diff == 0).mean())
        compared += 1
        # bitwise the NumPy integer reference (int8.py's arithmetic)
        xq = np.asarray(xin.numpy())
        xs = float(np.asarray(qparams_of(xin).scale.numpy()))
        xzp = int(np.asarray(qparams_of(xin).zero_point.numpy()))
        w = np.asarray(m.weight.numpy())
        ws = np.asarray(m.weight_scale.numpy()).astype(np.float32)
        bias = np.asarray(m.bias.numpy())
        ys = float(np.asarray(q.scale.numpy()))
        yzp = int(np.asarray(q.zero_point.numpy()))
        if isinstance(m, MQ.Linear):
            ref = ref_linear(xq, xzp, w, ws, bias, xs, ys, yzp, np.uint8, m.relu)
        else:
            acc = ref_conv(xq, xzp, w, m.groups, m.stride, m.padding, m.dilation)
            acc += ref_bias(bias, xs, ws)[None, :, None, None]
            mult = np.float64(np.float32(xs)) * ws.astype(np.float64) / np.float64(np.float32(ys))
            ref = ref_requant(acc, mult[None, :, None, None], yzp, yzp if m.relu else 0, 255,
                              np.uint8)
        np.testing.assert_array_equal(got_q, ref)
    assert compared == 4
    # the model's output moves by what those roundings carry
    a, b = flat(x).numpy(), fused(x).numpy()
    cos = np.sum(a * b) / np.linalg.norm(a) / np.linalg.norm(b)
    assert cos > 0.999 and np.abs(a - b).max() < 0.05 * np.abs(a).max()


def test_fused_graph_saves_loads_and_runs_the_same_bits():
    tm, x = _quantized()
    fused = optimize(tm, "all", flatten=True)
    want = fused(x).numpy()
    f = io.BytesIO()
    mt.save(fused, f)
    f.seek(0)
    back = mt.load(f)
    back.graph.lint()
    assert [type(m) for m in _layers(back)] == [type(m) for m in _layers(fused)]
    np.testing.assert_array_equal(back(x).numpy(), want)


def _qp(scale, zp):
    return create_qparams(QuantMode.ASYMMERTIC, quant_dtype("quint8"), scale, float(zp))


def test_leaves_what_it_cannot_fuse():
    tm, x = _quantized()
    flat = _flat(tm)
    stubs = [e.args[0].owner for e in flat.graph._exprs
             if e.kind == "call_method" and e.method == "__call__"
             and isinstance(e.args[0].owner, MQ.QuantStub)]
    # the stub after the ReLU6 with a range past 6: its clip is not the saturation
    stubs[2].act_qparams = _qp(8.0 / 255, 0)
    fused, report = optimize(flat, "FuseQuantStub", return_report=True)
    assert report["FuseQuantStub"].counts == {"fusions": 3}
    assert type(_layers(fused)[1]) is MQ.Conv2d and _layers(fused)[1].act_qparams is None
    names = [type(e.args[0].owner).__name__ for e in fused.graph._exprs
             if e.kind == "call_method" and e.method == "__call__"]
    assert names.count("ReLU6") == 1 and names.count("ReLU") == 0


def test_a_layer_output_read_twice_stays():
    class Two(M.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = M.Conv2d(3, 4, 1), M.Conv2d(4, 4, 1)

        def forward(self, x):
            y = self.a(x)
            return self.b(F.relu(y)) + y

    mt.random.seed(1)
    calib = mt.tensor(_data(1))
    q = Q.quantize_layers(Two().eval(), lambda m: m(calib), float_outputs=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tm = mt.trace_module(q, calib)
    fused, report = optimize(tm, "FuseQuantStub", flatten=True, return_report=True)
    assert report["FuseQuantStub"].counts == {"fusions": 0}
    np.testing.assert_array_equal(fused(calib).numpy(), tm(calib).numpy())


@pytest.mark.parametrize("relu_first", [False, True])
def test_a_module_called_twice_stays(relu_first):
    conv = M.Conv2d(3, 3, 1)

    class Shared(M.Module):
        def __init__(self):
            super().__init__()
            self.c = conv

        def forward(self, x):
            y = self.c(x)
            return self.c(F.relu(y) if relu_first else y)

    mt.random.seed(2)
    calib = mt.tensor(_data(2))
    q = Q.quantize_layers(Shared().eval(), lambda m: m(calib), float_outputs=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tm = mt.trace_module(q, calib)
    _, report = optimize(tm, "FuseQuantStub", flatten=True, return_report=True)
    assert report["FuseQuantStub"].counts == {"fusions": 0}


def test_fused_graph_exports_to_onnx():
    ort = pytest.importorskip("onnxruntime")
    from mgtrace.onnx import export
    tm, x = _quantized()
    fused = optimize(tm, "all", flatten=True)
    # the fused layers' outputs are the stubs' integers in the graph too
    dtypes = [e.outputs[0].dtype for e in fused.graph._exprs
              if e.kind == "call_method" and e.method == "__call__"
              and isinstance(e.args[0].owner, (MQ.Conv2d, MQ.Linear))]
    assert dtypes == [np.uint8] * 3 + [np.float32, np.uint8, np.float32]
    f = io.BytesIO()
    export(fused, f, opset=17)
    sess = ort.InferenceSession(f.getvalue(), providers=["CPUExecutionProvider"])
    got = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0]
    want = fused(x).numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())
