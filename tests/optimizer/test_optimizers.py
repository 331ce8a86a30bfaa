"""SGD / Adam / AdamW steps against the update formulas written out in
NumPy (MegEngine's = PyTorch's), clipping, schedules and state_dict."""
import math

import numpy as np
import pytest

import mgtrace as mt
from mgtrace import optimizer as optim


def _run(opt_cls, kw, steps=3, seed=0):
    rng = np.random.default_rng(seed)
    p0 = rng.normal(size=(3, 2))
    grads = [rng.normal(size=(3, 2)) for _ in range(steps)]
    p = mt.tensor(p0.astype(np.float64))
    opt = opt_cls([p], **kw)
    for g in grads:
        p.grad = mt.tensor(g)
        opt.step()
    return p0, grads, p.numpy(), opt


@pytest.mark.parametrize("momentum,nesterov,wd", [(0.0, False, 0.0), (0.9, False, 0.1),
                                                  (0.9, True, 0.0)])
def test_sgd(momentum, nesterov, wd):
    p0, grads, got, _ = _run(optim.SGD, dict(lr=0.1, momentum=momentum, nesterov=nesterov,
                                             weight_decay=wd))
    p, buf = p0.copy(), None
    for g in grads:
        g = g + wd * p
        if momentum:
            buf = g.copy() if buf is None else momentum * buf + g
            g = g + momentum * buf if nesterov else buf
        p = p - 0.1 * g
    np.testing.assert_allclose(got, p, rtol=1e-12)


@pytest.mark.parametrize("cls,wd", [(optim.Adam, 0.0), (optim.Adam, 0.1), (optim.AdamW, 0.1)])
def test_adam(cls, wd):
    p0, grads, got, _ = _run(cls, dict(lr=0.01, betas=(0.8, 0.9), eps=1e-8, weight_decay=wd))
    p, m, v = p0.copy(), 0.0, 0.0
    for t, g in enumerate(grads, 1):
        if cls is optim.Adam:
            g = g + wd * p
        m = 0.8 * m + 0.2 * g
        v = 0.9 * v + 0.1 * g * g
        upd = (m / (1 - 0.8 ** t)) / (np.sqrt(v / (1 - 0.9 ** t)) + 1e-8)
        if cls is optim.AdamW:
            p = p * (1 - 0.01 * wd)
        p = p - 0.01 * upd
    np.testing.assert_allclose(got, p, rtol=1e-10)


def test_state_dict_round_trip_continues_identically():
    p0, grads, _, opt = _run(optim.Adam, dict(lr=0.01), steps=2)
    sd = opt.state_dict()
    q = mt.tensor(np.ones((3, 2)))
    r = mt.tensor(np.ones((3, 2)))
    o1, o2 = optim.Adam([q], lr=0.5), optim.Adam([r], lr=0.5)
    o1.load_state_dict(sd)
    o2.load_state_dict(optim.Adam([mt.tensor(np.ones((3, 2)))], lr=0.5).state_dict() | sd)
    for o, t in ((o1, q), (o2, r)):
        t.grad = mt.tensor(np.full((3, 2), 0.5))
        o.step()
    np.testing.assert_allclose(q.numpy(), r.numpy())
    assert o1.param_groups[0]["lr"] == 0.01
    with pytest.raises(ValueError, match="buffer"):
        optim.Adam([mt.tensor(np.ones(4))], lr=0.1).load_state_dict(sd)


def test_clear_grad_and_skip_without_grad():
    p = mt.tensor([1.0])
    opt = optim.SGD([p], lr=1.0)
    opt.step()                                 # no grad: unchanged
    assert p.numpy().tolist() == [1.0]
    p.grad = mt.tensor([2.0])
    opt.step().clear_grad()
    assert p.numpy().tolist() == [-1.0] and p.grad is None


def test_clip_grad_norm_and_value():
    a, b = mt.tensor([3.0, 0.0]), mt.tensor([4.0])
    a.grad, b.grad = mt.tensor([3.0, 0.0]), mt.tensor([4.0])
    total = optim.clip_grad_norm([a, b], 1.0)
    assert total == pytest.approx(5.0)
    np.testing.assert_allclose(a.grad.numpy(), [0.6, 0.0], rtol=1e-5)
    np.testing.assert_allclose(b.grad.numpy(), [0.8], rtol=1e-5)
    optim.clip_grad_value([a, b], -0.7, 0.7)
    np.testing.assert_allclose(a.grad.numpy(), [0.6, 0.0], rtol=1e-5)
    np.testing.assert_allclose(b.grad.numpy(), [0.7], rtol=1e-6)


def test_schedules():
    p = mt.tensor([1.0])
    opt = optim.SGD([p], lr=1.0)
    s = optim.MultiStepLR(opt, [2, 4], gamma=0.5)
    lrs = []
    for _ in range(6):
        lrs.append(opt.param_groups[0]["lr"])
        s.step()
    assert lrs == [1.0, 1.0, 0.5, 0.5, 0.25, 0.25]
    opt2 = optim.SGD([mt.tensor([1.0])], lr=2.0)
    c = optim.CosineAnnealingLR(opt2, T_max=4, eta_min=0.0)
    got = []
    for _ in range(6):
        got.append(opt2.param_groups[0]["lr"])
        c.step()
    want = [2.0 * (1 + math.cos(math.pi * min(t, 4) / 4)) / 2 for t in range(6)]
    np.testing.assert_allclose(got, want)


def test_bad_arguments():
    with pytest.raises(ValueError, match="nesterov"):
        optim.SGD([mt.tensor([1.0])], lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="needs 'lr'"):
        optim.SGD([mt.tensor([1.0])])
    with pytest.raises(ValueError, match="no parameters"):
        optim.Adam([], lr=0.1)
    with pytest.raises(ValueError, match="betas"):
        optim.Adam([mt.tensor([1.0])], lr=0.1, betas=(1.0, 0.9))


@pytest.mark.parametrize("kw", [dict(lr=float("nan")), dict(lr=0.1, momentum=float("nan")),
                                dict(lr=0.1, weight_decay=float("nan"))])
def test_sgd_refuses_nan_hyperparameters(kw):
    """A NaN learning rate passed the ``v < 0`` check and turned every
    parameter into NaN at the first step."""
    p = mt.tensor(np.ones(3, np.float32))
    with pytest.raises(ValueError, match="must be >= 0, got nan"):
        optim.SGD([p], **kw)


@pytest.mark.parametrize("cls", [optim.SGD, optim.Adam, optim.AdamW])
@pytest.mark.parametrize("dtype", ["int32", "int8", "bool"])
def test_integer_parameters_are_refused(cls, dtype):
    """SGD on an int32 tensor truncated each update to the integers
    ([1, 2, 3] - 0.5 * 1 gave [0, 1, 2]) without a word; GradManager.attach
    refuses such tensors, and so does every optimizer now."""
    p = mt.tensor(np.array([1, 2, 3]).astype(dtype))
    with pytest.raises(ValueError, match=f"only floating-point tensors can be optimized, got a "
                                         f"{dtype} tensor of shape \\(3,\\)"):
        cls([p], lr=0.5)
    assert p.numpy().tolist() == np.array([1, 2, 3]).astype(dtype).tolist()


def test_float16_parameters_are_optimized():
    p = mt.tensor(np.array([1.0, 2.0], np.float16))
    p.grad = mt.tensor(np.array([1.0, 1.0], np.float16))
    optim.SGD([p], lr=0.5).step()
    np.testing.assert_array_equal(p.numpy(), np.array([0.5, 1.5], np.float16))


@pytest.mark.parametrize("cls", [optim.SGD, optim.Adam, optim.AdamW])
@pytest.mark.parametrize("key, value, err, match", [
    ("lr", -1.0, ValueError, "lr must be >= 0, got -1.0"),
    ("lr", "0.1", TypeError, "lr must be a real number, got '0.1'"),
    ("lr", None, TypeError, "lr must be a real number, got None"),
    ("lr", True, TypeError, "lr must be a real number, got True"),
    ("lr", float("inf"), ValueError, "lr must be finite, got inf"),
    ("weight_decay", float("inf"), ValueError, "weight_decay must be finite, got inf"),
    ("weight_decay", -0.5, ValueError, "weight_decay must be >= 0, got -0.5")])
def test_hyperparameters_are_checked_in_the_constructor_and_in_each_group(cls, key, value, err,
                                                                          match):
    """A group's own hyperparameters were not checked at all ({"lr": -1}
    trained uphill, {"lr": "x"} failed at the first step with float()'s
    message), and the constructor let inf (every parameter inf or NaN after
    one step) and strings or None (a raw '>=' TypeError) through."""
    p, q = mt.tensor(np.ones(3, np.float32)), mt.tensor(np.ones(2, np.float32))
    kw = {"lr": 0.1, key: value}
    with pytest.raises(err, match=f"{cls.__name__}: {match}"):
        cls([p], **kw)
    with pytest.raises(err, match=f"{cls.__name__}: {match}"):
        cls([{"params": [p]}, {"params": [q], **kw}], lr=0.1)
    opt = cls([p], lr=0.1)
    with pytest.raises(err, match=match):
        opt.add_param_group({"params": [q], **kw})
    assert len(opt.param_groups) == 1


def test_group_momentum_and_betas_are_checked():
    p = mt.tensor(np.ones(3, np.float32))
    with pytest.raises(ValueError, match="SGD: momentum must be >= 0, got -2"):
        optim.SGD([{"params": [p], "momentum": -2}], lr=1.0)
    with pytest.raises(ValueError, match="SGD: nesterov needs momentum > 0"):
        optim.SGD([{"params": [p], "nesterov": True}], lr=1.0)
    for betas in [(0.9,), (0.9, 0.99, 0.9), 0.9, (0.9, float("nan"))]:
        with pytest.raises((TypeError, ValueError), match=r"Adam: betas must be a pair of "
                                                          r"numbers in \[0, 1\)"):
            optim.Adam([{"params": [p], "betas": betas}], lr=0.1)
        with pytest.raises((TypeError, ValueError), match=r"Adam: betas must be a pair"):
            optim.Adam([p], lr=0.1, betas=betas)
    # a valid group's values stay as given, and step uses them: p -= lr * g
    p.grad = mt.tensor(np.full(3, 2.0, np.float32))
    optim.SGD([{"params": [p], "lr": 0.25}], lr=1.0).step()
    assert p.numpy().tolist() == [0.5, 0.5, 0.5]


def test_zero_d_arrays_and_numpy_betas_are_hyperparameters():
    # np.array(0.1) as lr and np.array([0.9, 0.999]) as betas (torch takes
    # both) were refused as "not a real number" / "not a pair"; they are
    # the numbers they hold, in the constructor and in a group
    p = mt.tensor(np.array([1.0, -2.0], np.float32))
    opt = optim.SGD([p], lr=np.array(0.5), momentum=np.array(0.0))
    p.grad = mt.tensor(np.array([0.5, 1.0], np.float32))
    opt.step()
    assert p.numpy().tolist() == [0.75, -2.5]             # p - 0.5 * g
    assert type(opt.param_groups[0]["lr"]) is float
    q = mt.tensor(np.array([1.0], np.float32))
    adam = optim.Adam([q], lr=0.1, betas=np.array([0.9, 0.999]))
    adam.add_param_group({"params": [mt.tensor(np.array([2.0], np.float32))],
                          "betas": [np.array(0.5), np.float32(0.25)], "lr": np.array(1)})
    assert adam.param_groups[0]["betas"] == (0.9, 0.999)
    assert adam.param_groups[1]["betas"] == (0.5, 0.25) and adam.param_groups[1]["lr"] == 1
    q.grad = mt.tensor(np.array([3.0], np.float32))
    adam.step()
    # Adam's first step moves by lr * g / (|g| + eps): 1 - 0.1
    assert abs(q.numpy()[0] - 0.9) < 1e-6
    with pytest.raises(ValueError, match="betas"):
        optim.Adam([q], lr=0.1, betas=np.array([0.9, 0.999, 0.5]))
    with pytest.raises(TypeError, match="lr must be a real number"):
        optim.SGD([q], lr=np.array([0.1]))
