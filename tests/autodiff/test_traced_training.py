"""Traced modules train: a TracedModule (traced, and loaded back from an
archive) called under a GradManager gives the eager module's gradients,
BatchNorm in training mode included; and it trains on after a save/load."""
import numpy as np

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module as M
from mgtrace.autodiff import GradManager
from mgtrace.optimizer import SGD


class Net(M.Module):
    def __init__(self):
        super().__init__()
        self.conv = M.Conv2d(2, 4, 3, padding=1, bias=False)
        self.bn = M.BatchNorm2d(4)
        self.dw = M.Conv2d(4, 4, 3, stride=2, padding=1, groups=4)
        self.ln = M.LayerNorm(4 * 4 * 4)
        self.fc = M.Linear(4 * 4 * 4, 3)

    def forward(self, x):
        x = F.relu(self.bn(self.conv(x)))
        x = F.max_pool2d(F.relu6(self.dw(x)), 2, stride=1, padding=1)
        x = self.ln(F.flatten(x, 1))
        return self.fc(F.gelu(x))


def _data():
    rng = np.random.default_rng(0)
    return (mt.tensor(rng.normal(size=(4, 2, 6, 6)).astype(np.float32)),
            mt.tensor(rng.integers(0, 3, size=4).astype(np.int32)))


def _grads(model, x, y):
    params = dict(model.named_parameters())
    for p in params.values():       # a traced module shares its module's parameters
        p.grad = None
    gm = GradManager().attach(list(params.values()))
    with gm:
        loss = F.cross_entropy(model(x), y)
        gm.backward(loss)
    return loss.item(), {k: p.grad.numpy() for k, p in params.items()}


def _same(a, b):
    (la, ga), (lb, gb) = a, b
    assert la == lb
    assert sorted(ga) == sorted(gb)
    for k in ga:
        scale = max(np.abs(ga[k]).max(), 1e-6)
        np.testing.assert_allclose(gb[k], ga[k], rtol=0, atol=1e-5 * scale, err_msg=k)


def test_traced_and_loaded_modules_give_the_eager_gradients(tmp_path):
    mt.random.seed(0)
    net = Net()
    x, y = _data()
    tm = mt.trace_module(net, x)
    eager = _grads(net, x, y)
    traced = _grads(tm, x, y)
    _same(eager, traced)
    mt.save(tm, tmp_path / "net.tmod")
    loaded = mt.load(tmp_path / "net.tmod")
    _same(eager, _grads(loaded, x, y))


def test_train_save_load_continue(tmp_path):
    mt.random.seed(1)
    x, y = _data()
    tm = mt.trace_module(Net(), x)
    opt = SGD(tm.parameters(), lr=0.1, momentum=0.9)
    gm = GradManager().attach(tm.parameters())
    losses = []
    for _ in range(8):
        with gm:
            loss = F.cross_entropy(tm(x), y)
            gm.backward(loss)
        opt.step().clear_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0] * 0.5
    mt.save(tm, tmp_path / "t.tmod")
    back = mt.load(tmp_path / "t.tmod")
    gm2 = GradManager().attach(back.parameters())
    opt2 = SGD(back.parameters(), lr=0.1, momentum=0.9)
    opt2.load_state_dict(opt.state_dict())
    for _ in range(3):
        with gm2:
            loss = F.cross_entropy(back(x), y)
            gm2.backward(loss)
        opt2.step().clear_grad()
    assert loss.item() < losses[-1]


class FusableNet(M.Module):
    """conv + relu, conv + residual + silu, attention and linear + gelu:
    what optimize()'s training-safe fusions rewrite."""

    def __init__(self):
        super().__init__()
        self.c1 = M.Conv2d(2, 8, 3, padding=1)
        self.c2 = M.Conv2d(8, 8, 3, padding=1)
        self.qkv = M.Linear(8, 24)
        self.fc1 = M.Linear(8, 16)
        self.fc2 = M.Linear(16, 3)

    def forward(self, x):
        a = F.relu(self.c1(x))
        b = F.silu(self.c2(a) + a)
        t = b.reshape(b.shape[0], 8, -1).transpose(0, 2, 1)          # [n, 36, 8] tokens
        q, k, v = F.split(self.qkv(t).reshape(t.shape[0], 1, t.shape[1], 24), 3, axis=3)
        s = F.softmax(F.matmul(q, k, transpose_b=True) * 0.35, axis=-1)
        o = F.matmul(s, v).reshape(t.shape[0], t.shape[1], 8).mean(axis=1)
        return self.fc2(F.gelu(self.fc1(o)))


def test_training_safe_passes_keep_the_gradients():
    from mgtrace.traced_module import optimize
    mt.random.seed(2)
    net = FusableNet()
    x, y = _data()
    tm = mt.trace_module(net, x)
    fast, report = optimize(tm, "all", return_report=True)
    fused = {n for n, r in report.items() if r.changed}
    assert {"FuseConvAct", "FuseLinearAct", "FuseAttention"} <= fused, report
    names = {e.func.__name__ for e in fast.graph._exprs if hasattr(e, "func")}
    assert {"conv2d_act", "linear_act", "attention"} <= names, names
    _same(_grads(net, x, y), _grads(fast, x, y))
