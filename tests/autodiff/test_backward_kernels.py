"""The C backward kernels (kernels/grad.c through nn.pyx) against NumPy
references written independently here (np.add.at over the forward's
windows), in float32 and float64, on shapes large enough to take the
threaded paths, with ties and NaN where the rule for them matters."""
import ast
import inspect
import itertools
import math

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
from mgtrace._core import nn as _nn
from mgtrace._core import reduce as R
from mgtrace.autodiff import rules


def _windows(n_out, k, s, p, d):
    return np.arange(n_out)[:, None] * s - p + np.arange(k)[None, :] * d


def _max_pool_ref(x, gy, k, s, p, d):
    """gy to each window's first maximum (first NaN), float64."""
    n, c, h, w = x.shape
    oh, ow = gy.shape[2:]
    gx = np.zeros(x.shape)
    for b, ch, i, j in itertools.product(range(n), range(c), range(oh), range(ow)):
        best, arg = None, None
        for a, e in itertools.product(range(k[0]), range(k[1])):
            r, q = i * s[0] - p[0] + a * d[0], j * s[1] - p[1] + e * d[1]
            if not (0 <= r < h and 0 <= q < w):
                continue
            v = x[b, ch, r, q]
            if best is None or (not np.isnan(best) and (v > best or np.isnan(v))):
                best, arg = v, (r, q)
        gx[b, ch][arg] += gy[b, ch, i, j]
    return gx


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("k,s,p,d,ceil", [((3, 3), (2, 2), (1, 1), (1, 1), False),
                                           ((2, 3), (1, 2), (1, 0), (2, 1), True)])
def test_max_pool_backward(dtype, k, s, p, d, ceil):
    rng = np.random.default_rng(1)
    x = rng.integers(-3, 3, (2, 3, 9, 8)).astype(dtype)      # many ties
    x[0, 1, 2, 3] = np.nan
    y = F.max_pool2d(mt.tensor(x), k, s, p, d, ceil)
    gy = rng.uniform(-1, 1, y.shape).astype(dtype)
    got = _nn.pool2d_backward("max", mt.tensor(x), mt.tensor(gy), k, s, p, d, ceil).numpy()
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_allclose(got, _max_pool_ref(x, gy, k, s, p, d), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("k,s,p,d", [((3, 3), (2, 2), (1, 1), (1, 1)), ((3, 2), (1, 1), (1, 0), (1, 2)),
                                     ((2, 2), (2, 2), (0, 0), (1, 1))])
def test_max_pool_backward_wide_rows(k, s, p, d):
    # rows of 20 to 68 outputs: float32's vector path (16 outputs at a time,
    # the scalar loop for the edges and the rest of the row; at stride 2 the
    # last rows of a plane, whose vector loads would read past it, are
    # scalar too) gives the reference's choice on ties and NaN, bitwise
    rng = np.random.default_rng(21)
    x = rng.integers(-2, 3, (2, 3, 7, 69)).astype(np.float32)
    x[0, 0, 1, 20] = x[1, 2, 4, 33] = x[1, 2, 4, 34] = x[0, 1, 6, 60] = np.nan
    y = F.max_pool2d(mt.tensor(x), k, s, p, d)
    gy = rng.uniform(-1, 1, y.shape).astype(np.float32)
    got = _nn.pool2d_backward("max", mt.tensor(x), mt.tensor(gy), k, s, p, d).numpy()
    # one output's gradient per input element in each window here except
    # where windows overlap: the reference adds in float64, so compare to
    # float32 rounding
    np.testing.assert_allclose(got, _max_pool_ref(x, gy, k, s, p, d), rtol=1e-6, atol=1e-6)
    g2 = rng.uniform(-1, 1, (2, 3) + tuple(y.shape[2:]))
    np.testing.assert_array_equal(
        _nn.pool2d_backward("max", mt.tensor(x.astype(np.float64)), mt.tensor(g2), k, s, p, d).numpy() != 0,
        _nn.pool2d_backward("max", mt.tensor(x), mt.tensor(g2.astype(np.float32)), k, s, p, d).numpy() != 0)


@pytest.mark.parametrize("include", [True, False])
def test_avg_pool_backward(include):
    rng = np.random.default_rng(2)
    x = rng.uniform(-1, 1, (2, 2, 7, 6))
    k, s, p = (3, 2), (2, 2), (1, 1)
    y = F.avg_pool2d(mt.tensor(x), k, s, p, ceil_mode=True,
                     mode="average" if include else "average_count_exclude_padding")
    gy = rng.uniform(-1, 1, y.shape)
    # the reference: the forward is linear, so its transpose is the Jacobian's
    jac = np.zeros((y.numpy().size, x.size))
    for i in range(x.size):
        e = np.zeros(x.size)
        e[i] = 1
        jac[:, i] = F.avg_pool2d(mt.tensor(e.reshape(x.shape)), k, s, p, ceil_mode=True,
                                 mode="average" if include else
                                 "average_count_exclude_padding").numpy().ravel()
    got = _nn.pool2d_backward("avg", x.shape, mt.tensor(gy), k, s, p, 1, True, include).numpy()
    np.testing.assert_allclose(got.ravel(), gy.ravel() @ jac, rtol=1e-12, atol=1e-12)


def test_adaptive_backward():
    rng = np.random.default_rng(3)
    x = rng.integers(-2, 2, (2, 3, 7, 5)).astype(np.float64)
    gy = rng.uniform(-1, 1, (2, 3, 3, 4))
    ref_max, ref_avg = np.zeros(x.shape), np.zeros(x.shape)
    for i, j in itertools.product(range(3), range(4)):
        hs, he = i * 7 // 3, -(-(i + 1) * 7 // 3)
        ws, we = j * 5 // 4, -(-(j + 1) * 5 // 4)
        win = x[:, :, hs:he, ws:we].reshape(2, 3, -1)
        r, q = np.divmod(win.argmax(-1), we - ws)
        nn_, cc = np.indices((2, 3))
        np.add.at(ref_max, (nn_, cc, r + hs, q + ws), gy[:, :, i, j])
        ref_avg[:, :, hs:he, ws:we] += (gy[:, :, i, j] / ((he - hs) * (we - ws)))[:, :, None, None]
    got = _nn.adaptive_pool2d_backward("max", mt.tensor(x), mt.tensor(gy)).numpy()
    np.testing.assert_allclose(got, ref_max, rtol=1e-12, atol=1e-12)
    got = _nn.adaptive_pool2d_backward("avg", x.shape, mt.tensor(gy)).numpy()
    np.testing.assert_allclose(got, ref_avg, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kw", [dict(size=(5, 9), mode="bilinear", align_corners=False),
                                dict(size=(2, 3), mode="bilinear", align_corners=True),
                                dict(scale_factor=1.7, mode="nearest"),
                                dict(scale_factor=(2, 0.5), mode="bilinear")])
def test_interpolate_backward(kw):
    rng = np.random.default_rng(4)
    shape = (1, 2, 4, 6)
    y0 = F.interpolate(mt.tensor(np.zeros(shape)), **kw)
    gy = rng.uniform(-1, 1, y0.shape)
    jac = np.zeros((gy.size, int(np.prod(shape))))
    for i in range(jac.shape[1]):
        e = np.zeros(jac.shape[1])
        e[i] = 1
        jac[:, i] = F.interpolate(mt.tensor(e.reshape(shape)), **kw).numpy().ravel()
    got = _nn.interpolate_backward(mt.tensor(gy), shape, kw.get("scale_factor"), kw["mode"],
                                   kw.get("align_corners")).numpy()
    np.testing.assert_allclose(got.ravel(), gy.ravel() @ jac, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype,tol", [("float32", 2e-5), ("float64", 1e-12)])
@pytest.mark.parametrize("n,c,o,k,s,p,d,groups", [(3, 4, 6, (3, 2), (2, 1), (1, 2), (1, 2), 2),
                                                   (2, 3, 3, (3, 3), (1, 1), (1, 1), (1, 1), 3),
                                                   (2, 8, 5, (1, 1), (1, 1), (0, 0), (1, 1), 1),
                                                   # im2col's runs: zeros, a strided copy, zeros
                                                   (2, 4, 4, (3, 3), (2, 2), (1, 1), (1, 1), 1),
                                                   (2, 3, 2, (2, 3), (1, 3), (0, 4), (1, 2), 1)])
def test_conv_weight_backward(dtype, tol, n, c, o, k, s, p, d, groups):
    rng = np.random.default_rng(5)
    x = rng.uniform(-1, 1, (n, c, 9, 8)).astype(dtype)
    w_shape = (o, c // groups) + k
    y = F.conv2d(mt.tensor(x), mt.tensor(np.zeros(w_shape, dtype)), None, s, p, d, groups)
    gy = rng.uniform(-1, 1, y.shape).astype(dtype)
    # reference: sum over images and output pixels of gy times the tapped input
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (p[0],) * 2, (p[1],) * 2))
    og, cg = o // groups, c // groups
    ref = np.zeros(w_shape)
    oh, ow = y.shape[2:]
    for a, e in itertools.product(range(k[0]), range(k[1])):
        patch = xp[:, :, a * d[0]:a * d[0] + s[0] * (oh - 1) + 1:s[0],
                   e * d[1]:e * d[1] + s[1] * (ow - 1) + 1:s[1]]
        for gi in range(groups):
            ref[gi * og:(gi + 1) * og, :, a, e] = np.einsum(
                "nohw,nchw->oc", gy[:, gi * og:(gi + 1) * og], patch[:, gi * cg:(gi + 1) * cg])
    got = _nn.conv2d_backward_weight(mt.tensor(x), mt.tensor(gy), w_shape, s, p, d, groups).numpy()
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_allclose(got, ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype,tol", [("float32", 1e-4), ("float64", 1e-10)])
@pytest.mark.parametrize("threads", [1, 2])
def test_conv_weight_backward_stride_2_rows(dtype, tol, threads):
    # ResNet's stem (7x7, stride 2, padding 3) on rows wide enough that
    # im2col's stride-2 copy runs whole vectors, with the padding's zeros
    # at both ends of each row
    rng = np.random.default_rng(17)
    x = rng.uniform(-1, 1, (2, 3, 40, 70)).astype(dtype)
    w_shape = (5, 3, 7, 7)
    y = F.conv2d(mt.tensor(x), mt.tensor(np.zeros(w_shape, dtype)), None, 2, 3)
    gy = rng.uniform(-1, 1, y.shape).astype(dtype)
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (3, 3), (3, 3)))
    oh, ow = y.shape[2:]
    ref = np.zeros(w_shape)
    for a, e in itertools.product(range(7), range(7)):
        ref[:, :, a, e] = np.einsum("nohw,nchw->oc", gy, xp[:, :, a:a + 2 * (oh - 1) + 1:2, e:e + 2 * (ow - 1) + 1:2])
    before = mt.get_num_threads()
    mt.set_num_threads(threads)
    try:
        got = _nn.conv2d_backward_weight(mt.tensor(x), mt.tensor(gy), w_shape, 2, 3, 1, 1).numpy()
    finally:
        mt.set_num_threads(before)
    np.testing.assert_allclose(got, ref, rtol=tol, atol=tol)


def _conv_dw_ref(x, gy, k, p, groups):
    # stride 1: sum over images and output pixels of gy times the tapped input, float64
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (p, p), (p, p)))
    o, c, oh, ow = gy.shape[1], x.shape[1], gy.shape[2], gy.shape[3]
    og, cg = o // groups, c // groups
    ref = np.zeros((o, cg, k, k))
    for a, e in itertools.product(range(k), range(k)):
        for gi in range(groups):
            ref[gi * og:(gi + 1) * og, :, a, e] = np.einsum(
                "nohw,nchw->oc", gy[:, gi * og:(gi + 1) * og].astype(np.float64),
                xp[:, gi * cg:(gi + 1) * cg, a:a + oh, e:e + ow])
    return ref


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n,c,o,h,groups", [(9, 512, 4, 6, 1),     # 7 images a piece, then 2
                                            (3, 64, 6, 47, 2)])    # five pieces an image, split mid-row
def test_conv_weight_backward_pieces(n, c, o, h, groups, threads):
    # the output pixels are cut into pieces of about 1 MiB of columns (at
    # least 256 columns) shared over threads: whole images grouped, or an
    # image's pixels split; every cut gives the reference's sums
    rng = np.random.default_rng(14)
    x = rng.uniform(-1, 1, (n, c, h, h)).astype(np.float32)
    gy = rng.uniform(-1, 1, (n, o, h, h)).astype(np.float32)
    before = mt.get_num_threads()
    mt.set_num_threads(threads)
    try:
        got = _nn.conv2d_backward_weight(mt.tensor(x), mt.tensor(gy), (o, c // groups, 3, 3), 1, 1, 1,
                                         groups).numpy()
    finally:
        mt.set_num_threads(before)
    np.testing.assert_allclose(got, _conv_dw_ref(x, gy, 3, 1, groups), rtol=1e-4, atol=1e-4)


def test_conv_weight_backward_chunks_images():
    # 40 images of 3*9 x 200*200 float64: nine pieces an image (about 1 MiB
    # of columns each), cut in the middle of output rows
    rng = np.random.default_rng(6)
    x = rng.uniform(-1, 1, (40, 3, 200, 200))
    gy = rng.uniform(-1, 1, (40, 2, 200, 200))
    got = _nn.conv2d_backward_weight(mt.tensor(x), mt.tensor(gy), (2, 3, 3, 3), 1, 1, 1, 1).numpy()
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    ref = np.stack([np.stack([np.einsum("nohw,nchw->oc", gy, xp[:, :, a:a + 200, e:e + 200])
                              for e in range(3)], -1) for a in range(3)], -2)
    np.testing.assert_allclose(got, ref, rtol=1e-10, atol=1e-9)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_index_add_repeats_and_negatives(dtype):
    rng = np.random.default_rng(7)
    idx = rng.integers(-10, 10, 500)
    src = rng.uniform(-1, 1, (500, 130)).astype(dtype)
    ref = np.zeros((10, 130))
    np.add.at(ref, idx, src.astype(np.float64))
    got = _nn.index_add((10, 130), mt.tensor(idx), mt.tensor(src)).numpy()
    assert got.dtype == np.dtype(dtype)
    tol = {"float16": 2e-2, "float32": 1e-5, "float64": 1e-12}[dtype]
    np.testing.assert_allclose(got.astype(np.float64), ref, rtol=tol, atol=tol)


def _act_prime(act, x):
    """act'(x) in float64, PyTorch's subgradients at the kinks."""
    s = 1 / (1 + np.exp(-x))
    erf = np.vectorize(math.erf)
    return {"relu": (x > 0) * 1.0, "relu6": ((x > 0) & (x < 6)) * 1.0,
            "silu": s * (1 + x * (1 - s)), "sigmoid": s * (1 - s),
            "hardswish": np.where(x < -3, 0.0, np.where(x > 3, 1.0, (2 * x + 3) / 6)),
            "gelu": 0.5 * (1 + erf(x / math.sqrt(2))) + x * np.exp(-x * x / 2) / math.sqrt(2 * math.pi)}[act]


@pytest.mark.parametrize("act", ["relu", "relu6", "silu", "sigmoid", "hardswish", "gelu"])
@pytest.mark.parametrize("dtype,tol", [("float32", 1e-6), ("float64", 1e-14)])
def test_act_backward(act, dtype, tol):
    rng = np.random.default_rng(8)
    x = np.concatenate([rng.uniform(-8, 8, 40000), [0.0, 6.0, -3.0, 3.0, -0.0]]).astype(dtype)
    gy = rng.uniform(-1, 1, x.shape).astype(dtype)
    got = _nn.act_backward(act, mt.tensor(x), mt.tensor(gy)).numpy()
    assert got.dtype == np.dtype(dtype)
    want = gy.astype(np.float64) * _act_prime(act, x.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    with pytest.raises(ValueError, match="act must be"):
        _nn.act_backward("none", mt.tensor(x), mt.tensor(gy))


def test_index_add_refuses_out_of_range():
    with pytest.raises(IndexError, match="outside"):
        _nn.index_add((4, 2), mt.tensor([0, 4]), mt.tensor(np.ones((2, 2))))
    with pytest.raises(ValueError, match="elements"):
        _nn.index_add((4, 2), mt.tensor([0, 1]), mt.tensor(np.ones((3, 2))))
    with pytest.raises(TypeError, match="integer"):
        _nn.index_add((4, 2), mt.tensor([0.0, 1.0]), mt.tensor(np.ones((2, 2))))


def test_no_rule_runs_numpy():
    # every rule is core ops and C kernels (through the device's tables): none
    # imports NumPy or copies a tensor to the host with .numpy()
    tree = ast.parse(inspect.getsource(rules))
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                for a in n.names} | {n.module.split(".")[0] for n in ast.walk(tree)
                                     if isinstance(n, ast.ImportFrom) and n.module}
    assert "numpy" not in imported
    host = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr in ("numpy", "tolist")
            and not (isinstance(n.value, ast.Name) and n.value.id == "pw")]
    assert host == []


def _grads(fn, arrays):
    from mgtrace.autodiff import GradManager
    ts = [mt.tensor(a) for a in arrays]
    gm = GradManager().attach(ts)
    with gm:
        y = fn(*ts)
        w = mt.tensor(np.random.default_rng(9).uniform(-1, 1, y.shape).astype(np.float32))
        gm.backward((y * w).sum())
    return [t.grad.numpy() for t in ts]


def _nchw_to_blocked(fn):
    return lambda x, *rest: fn(F.to_nchwc(x), *rest)


@pytest.mark.parametrize("case", ["conv", "conv_plain", "pw_dw", "pw_dw_pw", "pool"])
def test_nchwc_rules_match_the_nchw_ops(case):
    # the NCHW16c ops (float32 only, what optimize()'s NCHWc pass emits) give
    # the gradients their NCHW counterparts give, through the same weights
    rng = np.random.default_rng(10)

    def u(*shape):
        return rng.uniform(-1, 1, shape).astype(np.float32)

    x = u(2, 20, 6, 6)
    if case == "conv":
        arrays = [x, u(18, 20, 3, 3), u(18), u(2, 18, 6, 6)]
        fast = lambda x, w, b, r: F.from_nchwc(F.conv2d_nchwc(F.to_nchwc(x), w, b, padding=1, act="silu",
                                                              residual=F.to_nchwc(r)), 18)
        ref = lambda x, w, b, r: F.silu(F.conv2d(x, w, b, padding=1) + r)
    elif case == "conv_plain":
        arrays = [u(2, 3, 6, 6), u(17, 3, 3, 3), u(17)]
        fast = lambda x, w, b: F.from_nchwc(F.conv2d_nchwc(x, w, b, stride=2, padding=1, act="relu"), 17)
        ref = lambda x, w, b: F.relu(F.conv2d(x, w, b, stride=2, padding=1))
    elif case == "pw_dw":
        arrays = [x, u(32, 20, 1, 1), u(32), u(32, 1, 3, 3), u(32)]
        fast = lambda x, w, b, dw, db: F.from_nchwc(F.conv2d_nchwc_pw_dw(
            F.to_nchwc(x), w, b, dw, db, stride=2, padding=1, act="relu6", dw_act="relu6"), 32)
        ref = lambda x, w, b, dw, db: F.relu6(F.conv2d(F.relu6(F.conv2d(x, w, b)), dw, db, stride=2,
                                                       padding=1, groups=32))
    elif case == "pw_dw_pw":
        arrays = [x, u(32, 20, 1, 1), u(32), u(32, 1, 3, 3), u(32), u(20, 32, 1, 1), u(20), u(2, 20, 6, 6)]
        fast = lambda x, w, b, dw, db, pw, pb, r: F.from_nchwc(F.conv2d_nchwc_pw_dw_pw(
            F.to_nchwc(x), w, b, dw, db, pw, pb, stride=1, padding=1, act="relu6", dw_act="relu6",
            residual=F.to_nchwc(r)), 20)
        ref = lambda x, w, b, dw, db, pw, pb, r: F.conv2d(F.relu6(F.conv2d(F.relu6(F.conv2d(x, w, b)), dw, db,
                                                                            padding=1, groups=32)), pw, pb) + r
    else:
        arrays = [x]
        fast = lambda x: F.from_nchwc(F.max_pool2d_nchwc(F.to_nchwc(x), 3, 2, 1), 20)
        ref = lambda x: F.max_pool2d(x, 3, 2, 1)
    for got, want in zip(_grads(fast, arrays), _grads(ref, arrays)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * max(1.0, np.abs(want).max()))


@pytest.fixture
def second_device():
    """cuda:0 as a stand-in device with every CPU kernel table, its memory
    treated as a GPU's (tests/core/test_backend_seam.py's fake device)."""
    import importlib
    core_tensor = importlib.import_module("mgtrace._core.tensor")
    core_tensor._install_test_backend("cuda", ("elementwise", "reduce", "linalg", "nn", "index"), False)
    yield mt.Device("cuda:0")
    core_tensor._remove_test_backend("cuda")


def rng_w(shape):
    return np.random.default_rng(12).uniform(-1, 1, shape)


INDEXED = {
    "embedding": (lambda w, d: F.embedding(mt.tensor([[0, 2, 2], [4, 1, 0]], device=d), w), [((5, 3), None)]),
    "gather": (lambda x, d: F.gather(x, 1, mt.tensor([[0, 0, 2], [1, 3, 3]], device=d)), [((2, 4), None)]),
    "getitem": (lambda x, d: x[1:, mt.tensor([0, 2, 0], device=d)], [((3, 4), None)]),
    "getitem_rows": (lambda x, d: x[mt.tensor([2, 0, 2], device=d)], [((3, 4), None)]),
    "sort": (lambda x, d: F.sort(x)[0], [((3, 5), None)]),
    "pad_reflect": (lambda x, d: F.pad(x, ((1, 2), (2, 1)), mode="reflect"), [((4, 5), None)]),
    "cumprod": (lambda x, d: R.cumprod(x, 1), [((3, 4), None)]),
}


@pytest.mark.parametrize("name", ["max_pool2d", "avg_pool2d", "adaptive_max_pool2d", "adaptive_avg_pool2d",
                                  "interpolate", "conv2d", "gelu", "prod", "split"] + sorted(INDEXED))
def test_backward_kernels_run_through_the_devices_table(name, second_device):
    # the rules reach their kernels through the tensor's device backend, as
    # forward ops do: on a second device type carrying the CPU's tables the
    # gradients are the CPU's
    from mgtrace.autodiff import GradManager
    from .test_rules_fd import CASES
    fn, specs = CASES.get(name, (None, None))
    dev = second_device
    if name in INDEXED:        # the index on the inputs' device
        fn, specs = INDEXED[name]
    rng = np.random.default_rng(11)
    arrays = [rng.uniform(-2, 2, shape) for shape, _ in specs]

    def grads(device):
        ts = [mt.tensor(a, device=device) for a in arrays]
        gm = GradManager().attach(ts)
        with gm:
            y = fn(*ts, device) if name in INDEXED else fn(*ts)
            gm.backward((y * mt.tensor(rng_w(y.shape), device=device)).sum())
        return [t.grad.numpy() for t in ts], {str(t.grad.device) for t in ts}

    want, _ = grads("cpu")
    got, where = grads(second_device)
    assert where == {"cuda:0"}
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def _layer_norm_grads_ref(x, w, gy, eps):
    """dx, dweight, dbias of layer norm over the last axis, float64, from the
    formula's pieces (xhat = (x - mean) / sqrt(var + eps), y = xhat w + b)."""
    x, gy = x.astype(np.float64), gy.astype(np.float64)
    n = x.shape[-1]
    mean = x.mean(-1, keepdims=True)
    rstd = 1 / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + eps)
    xhat = (x - mean) * rstd
    g = gy * (w.astype(np.float64) if w is not None else 1.0)
    dxhat_sum = g.sum(-1, keepdims=True)
    dxhat_xhat = (g * xhat).sum(-1, keepdims=True)
    dx = rstd * (n * g - dxhat_sum - xhat * dxhat_xhat) / n
    return dx, (gy * xhat).reshape(-1, n).sum(0), gy.reshape(-1, n).sum(0)


@pytest.mark.parametrize("dtype,tol", [("float32", 2e-5), ("float64", 1e-12)])
@pytest.mark.parametrize("weighted", [True, False])
def test_layer_norm_backward(dtype, tol, weighted):
    # rows enough to take the threaded path (per-thread weight sums added at the end)
    rng = np.random.default_rng(12)
    x = (rng.standard_normal((6, 33, 200)) * 3 + 1).astype(dtype)
    gy = rng.uniform(-1, 1, x.shape).astype(dtype)
    w = rng.uniform(0.5, 1.5, 200).astype(dtype) if weighted else None
    gx, gw, gb = _nn.layer_norm_backward_rows(mt.tensor(x), None if w is None else mt.tensor(w),
                                              mt.tensor(gy), 200, 1e-5)
    dx, dw, db = _layer_norm_grads_ref(x, w, gy, 1e-5)
    assert gx.dtype == dtype and gx.shape == x.shape
    np.testing.assert_allclose(gx.numpy(), dx, rtol=tol, atol=tol)
    np.testing.assert_allclose(gb.numpy(), db, rtol=tol, atol=tol * 100)
    if weighted:
        np.testing.assert_allclose(gw.numpy(), dw, rtol=tol, atol=tol * 100)
    else:
        assert gw is None
    _, gw, gb = _nn.layer_norm_backward_rows(mt.tensor(x), None if w is None else mt.tensor(w),
                                             mt.tensor(gy), 200, 1e-5, False, False)
    assert gw is None and gb is None


def test_layer_norm_backward_refuses_bad_operands():
    x = mt.tensor(np.ones((4, 6), np.float32))
    with pytest.raises(ValueError, match="differ in shape"):
        _nn.layer_norm_backward_rows(x, None, mt.tensor(np.ones((4, 5), np.float32)), 6, 1e-5)
    with pytest.raises(TypeError, match="gy must be"):
        _nn.layer_norm_backward_rows(x, None, mt.tensor(np.ones((4, 6))), 6, 1e-5)
    with pytest.raises(ValueError, match="do not divide"):
        _nn.layer_norm_backward_rows(x, None, x, 5, 1e-5)
    with pytest.raises(ValueError, match="6 elements"):
        _nn.layer_norm_backward_rows(x, mt.tensor(np.ones(5, np.float32)), x, 6, 1e-5)
    with pytest.raises(TypeError, match="float32 or float64"):
        _nn.layer_norm_backward_rows(mt.tensor(np.ones((4, 6), np.int32)), None, x, 6, 1e-5)


def test_layer_norm_is_one_recorded_node_with_its_saved_input_guarded():
    # under a GradManager F.layer_norm runs its fused forward and records one
    # node (not the composite's eight); the gradients are the composite's
    # (the FD and PyTorch cases check the values), and x written in place
    # after the forward makes backward refuse, as for any saved input
    from mgtrace.autodiff import GradManager
    from mgtrace.errors import AutodiffError
    rng = np.random.default_rng(13)
    xs = rng.standard_normal((5, 3, 8)).astype(np.float32)
    x, w, b = mt.tensor(xs), mt.tensor(np.full(8, 1.5, np.float32)), mt.tensor(np.zeros(8, np.float32))
    gm = GradManager().attach([x, w, b])
    with gm:
        y = F.layer_norm(x, 8, w, b)
        assert y.__dict__["_ad"][0].name == "layer_norm"
        gm.backward(y.sum())
    dx, dw, db = _layer_norm_grads_ref(xs, np.full(8, 1.5), np.ones_like(xs), 1e-5)
    np.testing.assert_allclose(x.grad.numpy(), dx, atol=1e-5)
    np.testing.assert_allclose(w.grad.numpy(), dw, atol=1e-4)
    np.testing.assert_allclose(b.grad.numpy(), db, atol=1e-5)
    x2 = mt.tensor(xs)
    gm2 = GradManager().attach([x2])
    with gm2:
        h = x2 * 2.0
        y = F.layer_norm(h, 8)
        h[0] = 0.0
        with pytest.raises(AutodiffError, match="written in place"):
            gm2.backward(y.sum())


def _softmax_grads_ref(x, gy, axis):
    """softmax's and log_softmax's input gradients, float64, from the
    Jacobian written out per line: d softmax_i / d x_j = y_i (delta_ij - y_j),
    d log_softmax_i / d x_j = delta_ij - y_j."""
    x, gy = np.moveaxis(x.astype(np.float64), axis, -1), np.moveaxis(gy.astype(np.float64), axis, -1)
    e = np.exp(x - x.max(-1, keepdims=True))
    y = e / e.sum(-1, keepdims=True)
    eye = np.eye(x.shape[-1])
    jac = y[..., :, None] * (eye - y[..., None, :])              # [..., i, j]
    gx = np.einsum("...i,...ij->...j", gy, jac)
    lgx = np.einsum("...i,...ij->...j", gy, eye - y[..., None, :])
    return np.moveaxis(gx, -1, axis), np.moveaxis(lgx, -1, axis), np.moveaxis(y, -1, axis)


# (shape, axis): rows of one to 300 columns; the last two take the threaded path
SOFTMAX_CASES = [((7,), 0), ((3, 5), -1), ((4, 6, 1), 1), ((2, 1, 33), 2), ((96, 128), -1),
                 ((8, 12, 40, 70), -1), ((300, 301), 1)]


@pytest.mark.parametrize("dtype,tol", [("float32", 2e-6), ("float64", 1e-13)])
@pytest.mark.parametrize("shape,axis", SOFTMAX_CASES)
def test_softmax_backward_kernel(dtype, tol, shape, axis):
    rng = np.random.default_rng(14)
    x = (rng.standard_normal(shape) * 3).astype(dtype)
    gy = rng.uniform(-1, 1, shape).astype(dtype)
    gx_ref, lgx_ref, y = _softmax_grads_ref(x, gy, axis)
    with_threads = mt.get_num_threads()
    for nt in (1, 2):
        mt.set_num_threads(nt)
        try:
            gx = _nn.softmax_backward(mt.tensor(y.astype(dtype)), mt.tensor(gy), axis)
            lgx = _nn.softmax_backward(mt.tensor(np.log(y).astype(dtype)), mt.tensor(gy), axis, log=True)
        finally:
            mt.set_num_threads(with_threads)
        assert gx.dtype == dtype and gx.shape == shape and lgx.dtype == dtype
        np.testing.assert_allclose(gx.numpy(), gx_ref, rtol=tol, atol=tol)
        np.testing.assert_allclose(lgx.numpy(), lgx_ref, rtol=tol, atol=tol * 4)


def test_softmax_backward_kernel_reads_views_and_promotes():
    rng = np.random.default_rng(15)
    x = rng.standard_normal((6, 9))
    gy = rng.uniform(-1, 1, (9, 6))
    gx_ref, lgx_ref, y = _softmax_grads_ref(x, gy.T, 1)
    # a transposed gy (copied contiguous), y float32 beside gy float64: float64 out
    gx = _nn.softmax_backward(mt.tensor(y.astype(np.float32)), mt.tensor(gy).transpose(1, 0), -1)
    assert gx.dtype == "float64"
    np.testing.assert_allclose(gx.numpy(), gx_ref, atol=1e-7)
    # float16 computed in float32, rounded back
    h = _nn.softmax_backward(mt.tensor(np.log(y).astype(np.float16)), mt.tensor(gy.T.astype(np.float16)), 1,
                             log=True)
    assert h.dtype == "float16"
    np.testing.assert_allclose(h.numpy().astype(np.float64), lgx_ref, atol=3e-3)
    e = _nn.softmax_backward(mt.tensor(np.zeros((0, 4), np.float32)), mt.tensor(np.zeros((0, 4), np.float32)), 1)
    assert e.shape == (0, 4)


def test_softmax_backward_refuses_bad_operands():
    y = mt.tensor(np.full((4, 6), 1 / 6, np.float32))
    with pytest.raises(ValueError, match="differ in shape"):
        _nn.softmax_backward(y, mt.tensor(np.ones((4, 5), np.float32)), 1)
    with pytest.raises(ValueError, match="not the last axis"):
        _nn.softmax_backward(y, y, 0)
    with pytest.raises(ValueError, match="out of range"):
        _nn.softmax_backward(y, y, 2)
    with pytest.raises(TypeError, match="floating-point"):
        _nn.softmax_backward(mt.tensor(np.ones((4, 6), np.int32)), y, 1)


@pytest.mark.parametrize("fn", ["softmax", "log_softmax"])
@pytest.mark.parametrize("shape,axis", [((3, 4, 5), -1), ((3, 4, 5), 1), ((2, 5, 1), 1)])
def test_softmax_rules_match_the_jacobian_on_and_off_the_kernel(fn, shape, axis):
    # the last axis (or one followed by size-1 axes) takes the kernel; an
    # inner axis (axis 1 of [3, 4, 5]) the composed rule: both give the
    # Jacobian's product
    from mgtrace.autodiff import GradManager
    rng = np.random.default_rng(16)
    xs = rng.standard_normal(shape)
    w = rng.uniform(-1, 1, shape)
    x = mt.tensor(xs)
    gm = GradManager().attach([x])
    with gm:
        y = getattr(F, fn)(x, axis=axis)
        gm.backward((y * mt.tensor(w)).sum())
    gx_ref, lgx_ref, _ = _softmax_grads_ref(xs, w, axis)
    np.testing.assert_allclose(x.grad.numpy(), gx_ref if fn == "softmax" else lgx_ref, atol=1e-12)


@pytest.mark.parametrize("fn", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dy_dtype", [np.int32, np.bool_])
def test_softmax_rules_take_an_integer_output_gradient(fn, dy_dtype):
    # backward(y, dy) with an integer or bool dy: the composed rule promoted
    # it; the kernel refused it ("softmax: expected floating-point tensors")
    from mgtrace.autodiff import GradManager
    rng = np.random.default_rng(31)
    x_np = rng.standard_normal((3, 5))
    dy = (rng.integers(-3, 4, (3, 5)) if dy_dtype is np.int32
          else rng.integers(0, 2, (3, 5))).astype(dy_dtype)
    gx_ref, lgx_ref, _ = _softmax_grads_ref(x_np, dy.astype(np.float64), 1)
    x = mt.tensor(x_np.astype(np.float32))
    gm = GradManager().attach([x])
    with gm:
        gm.backward(getattr(F, fn)(x, axis=1), mt.tensor(dy))
    assert x.grad.dtype == np.float32
    np.testing.assert_allclose(x.grad.numpy(), gx_ref if fn == "softmax" else lgx_ref,
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dy_dtype", [np.int32, np.bool_])
def test_an_integer_output_gradient_is_taken_in_ys_dtype(dy_dtype):
    # GradManager.backward casts an integer or bool dy Tensor to y's dtype, as it does a
    # list or array: relu's rule (and conv's, the pools') refused it with a TypeError
    from mgtrace.autodiff import GradManager
    rng = np.random.default_rng(32)
    x_np = rng.standard_normal((4, 6)).astype(np.float32)
    dy = rng.integers(0, 2 if dy_dtype is np.bool_ else 5, (4, 6)).astype(dy_dtype)
    x = mt.tensor(x_np)
    gm = GradManager().attach([x])
    with gm:
        gm.backward(F.relu(x), mt.tensor(dy))
    assert x.grad.dtype == np.float32
    np.testing.assert_array_equal(x.grad.numpy(), np.where(x_np > 0, dy.astype(np.float32), 0))


@pytest.mark.parametrize("fn", ["softmax", "log_softmax"])
@pytest.mark.parametrize("axis", [0, -1, None])
def test_softmax_rules_of_a_0d_tensor_give_zero(fn, axis):
    # the forward takes a 0-d x (over its one element: softmax 1, log_softmax
    # 0, as MegEngine); its backward summed over axis 0 of the 0-d gradient
    # ("sum: axis 0 is out of bounds"). Both outputs are constants: d/dx = 0
    from mgtrace.autodiff import GradManager
    x = mt.tensor(np.float32(2.5))
    gm = GradManager().attach([x])
    with gm:
        y = getattr(F, fn)(x, axis=axis)
        gm.backward(y * 3)
    assert y.item() == (1.0 if fn == "softmax" else 0.0)
    assert x.grad.shape == () and x.grad.item() == 0.0
