"""Plans of quantized models (issue 32, mgtrace.compile after
mgtrace.quantization.quantize): small ResNet-18-, MobileNetV2- and
MiniLM-like graphs made with the quantize flow (QAT modules, calibration,
quantize), as modules and traced, with quint8 activations (per-channel
weights) and with qint8 ones, compile. An int8 layer is replayed as the
int8 kernel calls it made, with its packed weights and multipliers as plan
constants and a qint8 input's flipped uint8 bytes and an int8 Concat's
requantizing tables in the arena; the float parts are kernel steps. The plan's outputs are the graph's bit for bit, for inputs other
than the example too, and in two threads at once. A plan whose output is
still quantized returns it with its dtype and qparams."""
import threading

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module as M
import mgtrace.quantization as Q
from mgtrace.quantization.qtensor import dequantize, is_quantized, qparams_of
from mgtrace.quantization.qtensor import quantize as quantize_tensor
from mgtrace.traced_module import trace_module
from tests.plan._bits import same_bits, rand


class BasicBlock(M.Module):
    """ResNet's basic block, MegEngine's way: fused ConvBn(Relu), the
    shortcut an Elemwise add fused with its ReLU."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = M.ConvBnRelu2d(cin, cout, 3, stride, 1, bias=False)
        self.conv2 = M.ConvBn2d(cout, cout, 3, 1, 1, bias=False)
        self.down = M.ConvBn2d(cin, cout, 1, stride, bias=False) if stride != 1 or cin != cout \
            else None
        self.add = M.Elemwise("fuse_add_relu")

    def forward(self, x):
        short = x if self.down is None else self.down(x)
        return self.add(self.conv2(self.conv1(x)), short)


class ResNetLike(M.Module):
    def __init__(self):
        super().__init__()
        self.quant, self.dequant = M.QuantStub(), M.DequantStub()
        self.stem = M.ConvBnRelu2d(3, 8, 3, 2, 1, bias=False)
        self.pool = M.MaxPool2d(3, 2, 1)
        self.layer1, self.layer2 = BasicBlock(8, 8, 1), BasicBlock(8, 16, 2)
        self.gap = M.AdaptiveAvgPool2d(1)
        self.fc = M.Linear(16, 10)

    def forward(self, x):
        x = self.layer2(self.layer1(self.pool(self.stem(self.quant(x)))))
        return self.dequant(self.fc(F.flatten(self.gap(x), 1)))


class InvertedResidual(M.Module):
    def __init__(self, c, hidden, stride):
        super().__init__()
        self.expand = M.ConvBnRelu2d(c, hidden, 1, bias=False)
        self.dw = M.ConvBnRelu2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False)
        self.project = M.ConvBn2d(hidden, c, 1, bias=False)
        self.add = M.Elemwise("add") if stride == 1 else None

    def forward(self, x):
        y = self.project(self.dw(self.expand(x)))
        return y if self.add is None else self.add(x, y)


class MobileNetV2Like(M.Module):
    def __init__(self):
        super().__init__()
        self.quant, self.dequant = M.QuantStub(), M.DequantStub()
        self.stem = M.ConvBnRelu2d(3, 8, 3, 2, 1, bias=False)
        self.b1, self.b2 = InvertedResidual(8, 24, 1), InvertedResidual(8, 24, 2)
        self.head = M.ConvBnRelu2d(8, 32, 1, bias=False)

    def forward(self, x):
        x = self.dequant(self.head(self.b2(self.b1(self.stem(self.quant(x))))))
        return F.mean(x, axis=(2, 3))


class MiniLMLike(M.Module):
    """One encoder layer: int8 projections between stubs, float attention,
    layer norms and residuals (as quantize_layers leaves a transformer)."""

    def __init__(self, d=16, ff=32):
        super().__init__()
        self.d = d
        self.q_in, self.dq_qkv = M.QuantStub(), M.DequantStub()
        self.qkv = M.Linear(d, 3 * d)
        self.q_ff, self.dq_ff = M.QuantStub(), M.DequantStub()
        self.ff1, self.ff2 = M.Linear(d, ff), M.Linear(ff, d)
        self.ln1, self.ln2 = M.LayerNorm(d), M.LayerNorm(d)

    def forward(self, x):
        # (x * 1.0: the stubs' inputs are not the residuals' tensors, which
        # trace_module would otherwise take for the float stub's output)
        qkv = self.dq_qkv(self.qkv(self.q_in(x * 1.0)))
        q, k, v = qkv[..., :self.d], qkv[..., self.d:2 * self.d], qkv[..., 2 * self.d:]
        att = F.softmax(F.matmul(q, k.transpose(0, 2, 1)) / 4.0, axis=-1)
        x = self.ln1(x + F.matmul(att, v))
        return self.ln2(x + self.dq_ff(self.ff2(self.ff1(self.q_ff(x * 1.0)))))


MODELS = {"resnet18_like": (ResNetLike, (2, 3, 16, 16)),
          "mobilenet_v2_like": (MobileNetV2Like, (1, 3, 16, 16)),
          "minilm_like": (MiniLMLike, (2, 8, 16))}


QCONFIGS = {"quint8": Q.per_channel_quint8_qconfig, "qint8": Q.calibration_qconfig}


def _quantized(name, traced, act="quint8"):
    cls, shape = MODELS[name]
    mt.random.seed(32)
    return quantize_net(cls(), shape, QCONFIGS[act], traced), shape


def quantize_net(net, shape, qconfig, traced=False):
    """``net`` (float, with BatchNorms) through MegEngine's flow: BatchNorm
    statistics of random batches, QAT modules, calibration, quantize."""
    net.train()
    for s in (7, 8):                       # BatchNorm statistics of something
        net(rand(*shape, seed=s))
    net.eval()
    if traced:
        net = trace_module(net, rand(*shape, seed=1))
    qat = Q.quantize_qat(net, qconfig=qconfig)
    Q.enable_observer(qat)
    Q.disable_fake_quant(qat)
    for s in (1, 2):
        qat(rand(*shape, seed=s))
    Q.disable_observer(qat)
    Q.enable_fake_quant(qat)
    return Q.quantize(qat)


@pytest.mark.parametrize("act", sorted(QCONFIGS))
@pytest.mark.parametrize("traced", [False, True], ids=["module", "traced"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_quantized_model_compiles_and_matches_the_graph_bitwise(name, traced, act):
    qm, shape = _quantized(name, traced, act)
    x = rand(*shape, seed=3)
    plan = mt.compile(qm, x)
    steps = plan.profile(x)
    int8_steps = [w for k, w, _ in steps if k == "kernel" and ": int8 " in w]
    # every layer and pool an int8 kernel step (MiniLM's softmax: Python, as in float)
    assert any(w.endswith(("int8 conv", "int8 dwconv", "int8 gemm")) for w in int8_steps)
    if name != "minilm_like":
        assert plan.stats()["python_steps"] == 0, steps
    # a qint8 (signed) input reaches the u8 x s8 kernels through a byte flip
    assert any(w.endswith("int8 flip") for w in int8_steps) == (act == "qint8")
    for seed in (3, 4, 5):                  # the example and other inputs
        x = rand(*shape, seed=seed)
        want, got = qm(x), plan(x)
        assert not is_quantized(got)
        assert same_bits(got.numpy(), want.numpy()), (name, seed)
    assert plan.misses == 0


def test_a_quint8_transformer_is_kernel_steps_but_its_softmax():
    qm, shape = _quantized("minilm_like", False)
    plan = mt.compile(qm, rand(*shape))
    steps = plan.profile(rand(*shape))
    # the softmax of strided slices is a Python step as in a float plan;
    # the stubs and the 3 int8 Linear layers are int8 kernel steps
    assert [w for k, w, _ in steps if k == "python"] == ["<top>: softmax"]
    assert [w for k, w, _ in steps if ": int8 " in w] == [
        "q_in: QuantStub: int8 quantize", "qkv: Linear: int8 gemm",
        "dq_qkv: DequantStub: int8 dequantize", "q_ff: QuantStub: int8 quantize",
        "ff1: Linear: int8 gemm", "ff2: Linear: int8 gemm", "dq_ff: DequantStub: int8 dequantize"]
    kernels = [w for k, w, _ in steps if k == "kernel"]
    assert sum("matmul: gemm" in w for w in kernels) == 2
    assert sum("layer_norm" in w for w in kernels) == 2


class Body(M.Module):
    """Ends on a quantized tensor: no DequantStub."""

    def __init__(self):
        super().__init__()
        self.quant = M.QuantStub()
        self.conv = M.ConvRelu2d(3, 4, 3, padding=1)

    def forward(self, x):
        return self.conv(self.quant(x))


def test_a_quantized_output_keeps_its_dtype_and_qparams():
    mt.random.seed(3)
    qat = Q.quantize_qat(Body().eval(), qconfig=Q.calibration_qconfig)
    Q.enable_observer(qat)
    Q.disable_fake_quant(qat)
    qat(rand(1, 3, 6, 6, seed=1))
    Q.disable_observer(qat)
    Q.enable_fake_quant(qat)
    qm = Q.quantize(qat)
    x = rand(1, 3, 6, 6, seed=2)
    want, got = qm(x), mt.compile(qm, x)(x)
    assert is_quantized(got) and got.dtype == want.dtype
    assert qparams_of(got) is qparams_of(want)
    assert same_bits(got.numpy(), want.numpy())
    assert same_bits(dequantize(got).numpy(), dequantize(want).numpy())


def run_concurrently(plan, xs, rounds=5):
    """``{i: [plan(xs[i]) as NumPy, ...]}`` from two threads, each calling
    the plan ``rounds`` times on every other input; raises what a thread
    raised."""
    errors, got = [], {}

    def worker(k):
        try:
            for _ in range(rounds):
                for i in range(k, len(xs), 2):
                    got.setdefault(i, []).append(plan(xs[i]).numpy())
        except BaseException as e:           # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return got


@pytest.mark.parametrize("act", sorted(QCONFIGS))
def test_two_threads_run_one_quantized_plan_concurrently(act):
    qm, shape = _quantized("resnet18_like", False, act)
    plan = mt.compile(qm, rand(*shape))
    xs = [rand(*shape, seed=10 + k) for k in range(4)]
    want = [qm(x).numpy() for x in xs]
    for i, outs in run_concurrently(plan, xs).items():
        assert len(outs) == 5 and all(same_bits(o, want[i]) for o in outs)


class Branches(M.Module):
    """Two int8 convs concatenated by an int8 Concat."""

    def __init__(self):
        super().__init__()
        self.quant, self.dequant = M.QuantStub(), M.DequantStub()
        self.a, self.b = M.ConvRelu2d(3, 4, 3, padding=1), M.ConvRelu2d(3, 4, 1)
        self.cat = M.Concat()

    def forward(self, x):
        x = self.quant(x)
        return self.dequant(self.cat([self.a(x), self.b(x)], 1))


def _quantized_branches(qconfig, seed, net=None, shape=(1, 3, 6, 6)):
    mt.random.seed(seed)
    qat = Q.quantize_qat((net or Branches()).eval(), qconfig=qconfig)
    Q.enable_observer(qat)
    Q.disable_fake_quant(qat)
    qat(rand(*shape, seed=1))
    Q.disable_observer(qat)
    Q.enable_fake_quant(qat)
    return Q.quantize(qat)


@pytest.mark.parametrize("act", ["quint8", "qint8"])
def test_an_int8_concat_is_a_kernel_step(act):
    qm = _quantized_branches(QCONFIGS[act], 4)
    x = rand(1, 3, 6, 6, seed=2)
    plan = mt.compile(qm, x)
    steps = plan.profile(x)
    assert [w for k, w, _ in steps if k == "python"] == []
    kernels = [w for k, w, _ in steps if k == "kernel"]
    assert kernels[-2:] == ["cat: Concat: int8 concat", "dequant: DequantStub: int8 dequantize"]
    assert kernels.count("a: ConvRelu2d: int8 conv") == 1
    for seed in (2, 3):
        x = rand(1, 3, 6, 6, seed=seed)
        assert same_bits(plan(x).numpy(), qm(x).numpy())


class ManyBranches(M.Module):
    """``n`` int8 1x1 convs concatenated by one int8 Concat."""

    def __init__(self, n):
        super().__init__()
        self.quant, self.dequant = M.QuantStub(), M.DequantStub()
        self.n = n
        for j in range(n):
            setattr(self, f"conv{j}", M.Conv2d(3, 2, 1))
        self.cat = M.Concat()

    def forward(self, x):
        x = self.quant(x)
        return self.dequant(self.cat([getattr(self, f"conv{j}")(x) for j in range(self.n)], 1))


@pytest.mark.parametrize("n,python", [(10, []), (11, ["cat: Concat"])])
def test_an_int8_concat_of_more_inputs_than_a_step_takes_is_a_python_step(n, python):
    qm = _quantized_branches(Q.per_channel_quint8_qconfig, 5, ManyBranches(n), (1, 3, 4, 4))
    x = rand(1, 3, 4, 4, seed=2)
    plan = mt.compile(qm, x)
    assert [w for k, w, _ in plan.profile(x) if k == "python"] == python
    for seed in (2, 3):
        x = rand(1, 3, 4, 4, seed=seed)
        assert same_bits(plan(x).numpy(), qm(x).numpy())


def test_undoing_steps_forgets_the_int8_constants_they_made():
    from mgtrace._core import plan as cplan
    from mgtrace.plan._lower import Lowering
    low = Lowering([rand(2)], cplan.next_uid())
    kept = np.arange(4, dtype=np.int8)
    ref = low._const_ref(kept)
    snap = low._snapshot()
    w = np.ones(3, np.float64)
    low._const_ref(w)
    low._restore(snap)                   # a layer after them fell back: its buffers are gone
    assert set(low.quant_consts) == {id(kept)} and low._const_ref(kept) == ref
    again = low._const_ref(w)            # made anew, at a buffer that exists
    assert again[0] < len(low.buffers)
    assert low.buffers[again[0]].const.numpy().tolist() == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("act", ["quint8", "qint8"])
def test_an_int8_layer_compiles_alone_on_a_quantized_input(act):
    # the compiled module itself an int8 layer: recorded whole, as inside a
    # model (it read its input's scale into Python: a PlanError)
    qm = _quantized_branches(QCONFIGS[act], 4)
    xq = qm.quant(rand(1, 3, 6, 6, seed=2))
    plan = mt.compile(qm.a, xq)
    assert plan.stats()["python_steps"] == 0
    got, want = plan(xq), qm.a(xq)
    assert is_quantized(got) and same_bits(got.numpy(), want.numpy())


@pytest.mark.parametrize("act", ["quint8", "qint8"])
@pytest.mark.parametrize("alone", [False, True], ids=["in_sequential", "alone"])
def test_an_input_quantized_with_other_qparams_gets_a_plan_of_its_own(act, alone):
    # the int8 steps' multipliers were made for the example's scale; an
    # input of the same dtype, shape and strides at twice the scale was
    # replayed with them (silently wrong numbers)
    qm = _quantized_branches(QCONFIGS[act], 4)
    net = qm.a if alone else M.Sequential(qm.a)
    x = rand(1, 3, 6, 6, seed=2)
    xq = qm.quant(x)
    qp = qparams_of(xq)
    zp = None if qp.zero_point is None else float(qp.zero_point.numpy())
    x2 = quantize_tensor(x, dtype=qp.dtype_meta.name, scale=2 * float(qp.scale.numpy()),
                         zero_point=zp)
    plan = mt.compile(net, xq)
    want = qm.a(x2)
    got = plan(x2)
    assert same_bits(got.numpy(), want.numpy())
    assert same_bits(dequantize(got).numpy(), dequantize(want).numpy())
    assert len(plan.signatures) == 2 and plan.misses == 0
    assert same_bits(plan(xq).numpy(), qm.a(xq).numpy())      # the first plan still serves xq
