"""einsum, conv3d / conv_transpose3d, local_conv2d, sliding_window and its
transpose, warp_affine, remap and multi_head_attention (issue 36) against
NumPy loops and einsums written here (PyTorch too where installed)."""
import math

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F

RNG = np.random.default_rng(1336)


def t(a):
    return mt.tensor(np.asarray(a))


def randn(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


# ------------------------------------------------------------------ einsum

EINSUMS = [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("ij,kj", [(3, 4), (5, 4)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("bhqd,bhkd->bhqk", [(2, 3, 4, 5), (2, 3, 6, 5)]),
    ("i,i->", [(7,), (7,)]),
    ("i,j->ij", [(3,), (4,)]),
    ("ii->i", [(4, 4)]),
    ("ii", [(4, 4)]),
    ("iji->j", [(3, 2, 3)]),
    ("ij->", [(3, 4)]),
    ("ij->ji", [(3, 4)]),
    ("ijk->kj", [(2, 3, 4)]),
    ("...ij,...jk->...ik", [(2, 1, 3, 4), (5, 4, 2)]),
    ("...ij,jk", [(2, 3, 4), (4, 2)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),
    ("abc,cd,bd->a", [(2, 3, 4), (4, 5), (3, 5)]),
    ("bn,anm,bm->ba", [(2, 3), (4, 3, 5), (2, 5)]),
    ("i,i,i->i", [(3,), (3,), (3,)]),
    ("ab,ab->ab", [(1, 4), (3, 4)]),
    ("b i j , b j k -> b i k", [(2, 2, 3), (2, 3, 2)]),
]


@pytest.mark.parametrize("eq, shapes", EINSUMS, ids=[e for e, _ in EINSUMS])
def test_einsum_against_numpy(eq, shapes):
    ops = [RNG.standard_normal(s) for s in shapes]
    got = F.einsum(eq, *[t(o) for o in ops])
    want = np.einsum(eq.replace(" ", ""), *ops)
    assert got.shape == want.shape
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-10, atol=1e-12)


def test_einsum_dtypes():
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    got = F.einsum("ij,kj->ik", t(a), t(a))
    assert got.dtype == np.int32 and got.tolist() == (a @ a.T).tolist()
    assert F.einsum("ij,j", t(a.astype(np.float32)), t(np.ones(3, np.int8))).dtype == np.float32
    b = np.array([[True, False], [True, True]])
    assert F.einsum("ij->i", t(b)).tolist() == [1, 2]
    assert F.einsum("ij->j", t(np.zeros((0, 3), np.float32))).tolist() == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("eq, shapes, match", [
    ("ij,jk", [(2, 3)], "names 2 operands, 1 given"),
    ("ij,jk->ik", [(2, 3), (4, 5)], "label 'j' stands for sizes 3 and 4"),
    ("ijk->ij", [(2, 3)], "term 'ijk' names 3 axes of an operand with 2"),
    ("ij->ii", [(2, 2)], "output label 'i' repeats"),
    ("ij->k", [(2, 2)], "output label 'k' of 'ij->k' is in no operand"),
    ("i1->i", [(2, 2)], "each term is letters and at most one '...'"),
    ("ij->i->j", [(2, 2)], "more than one '->'"),
    ("ii->i", [(2, 3)], "label 'i' stands for"),
])
def test_einsum_errors(eq, shapes, match):
    with pytest.raises(ValueError, match=match):
        F.einsum(eq, *[t(np.ones(s)) for s in shapes])


def test_einsum_bad_types():
    with pytest.raises(TypeError, match="einsum: equation must be a str"):
        F.einsum(3, t(np.ones(2)))
    with pytest.raises(ValueError, match="einsum: give at least one operand"):
        F.einsum("i")


# ------------------------------------------------------------------ conv3d

def _triple(v):
    return (v,) * 3 if isinstance(v, int) else tuple(v)


def conv3d_ref(x, w, b, stride, padding, dilation, groups):
    s, p, d = _triple(stride), _triple(padding), _triple(dilation)
    x = np.pad(x.astype(np.float64), ((0, 0), (0, 0)) + tuple((q, q) for q in p))
    n, c = x.shape[:2]
    o, cg, *k = w.shape
    out_sz = [(x.shape[2 + i] - d[i] * (k[i] - 1) - 1) // s[i] + 1 for i in range(3)]
    out = np.zeros((n, o) + tuple(out_sz))
    og = o // groups
    for g in range(groups):
        xs = x[:, g * cg:(g + 1) * cg]
        for a in range(k[0]):
            for bb in range(k[1]):
                for cc in range(k[2]):
                    patch = xs[:, :, a * d[0]:a * d[0] + (out_sz[0] - 1) * s[0] + 1:s[0],
                               bb * d[1]:bb * d[1] + (out_sz[1] - 1) * s[1] + 1:s[1],
                               cc * d[2]:cc * d[2] + (out_sz[2] - 1) * s[2] + 1:s[2]]
                    out[:, g * og:(g + 1) * og] += np.einsum(
                        "ncdhw,oc->nodhw", patch, w[g * og:(g + 1) * og, :, a, bb, cc])
    return out if b is None else out + b.reshape(1, o, 1, 1, 1)


CONV3D = [((2, 3, 5, 6, 7), (4, 3, 3, 3, 3), 1, 1, 1, 1),
          ((1, 4, 6, 5, 4), (6, 2, 2, 3, 1), (2, 1, 2), (0, 1, 1), (1, 2, 1), 2),
          ((2, 2, 7, 4, 4), (2, 2, 3, 1, 2), 3, (2, 0, 1), (2, 1, 1), 1)]


@pytest.mark.parametrize("xs, ws, stride, padding, dilation, groups", CONV3D)
def test_conv3d_against_numpy(xs, ws, stride, padding, dilation, groups):
    x, w, b = randn(*xs), randn(*ws), randn(ws[0])
    got = F.conv3d(t(x), t(w), t(b), stride, padding, dilation, groups)
    want = conv3d_ref(x, w, b, stride, padding, dilation, groups)
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-4)


def conv_transpose3d_ref(x, w, b, stride, padding, output_padding, dilation, groups):
    s, p, op, d = _triple(stride), _triple(padding), _triple(output_padding), _triple(dilation)
    n, c = x.shape[:2]
    cg, og, *k = w.shape
    full = [(x.shape[2 + i] - 1) * s[i] + d[i] * (k[i] - 1) + 1 + op[i] for i in range(3)]
    out = np.zeros((n, og * groups) + tuple(full))
    cpg = c // groups
    for g in range(groups):
        xs = x[:, g * cpg:(g + 1) * cpg].astype(np.float64)
        for a in range(k[0]):
            for bb in range(k[1]):
                for cc in range(k[2]):
                    contrib = np.einsum("ncdhw,co->nodhw", xs, w[g * cpg:(g + 1) * cpg, :, a, bb, cc])
                    out[:, g * og:(g + 1) * og,
                        a * d[0]:a * d[0] + (x.shape[2] - 1) * s[0] + 1:s[0],
                        bb * d[1]:bb * d[1] + (x.shape[3] - 1) * s[1] + 1:s[1],
                        cc * d[2]:cc * d[2] + (x.shape[4] - 1) * s[2] + 1:s[2]] += contrib
    out = out[:, :, p[0]:full[0] - p[0], p[1]:full[1] - p[1], p[2]:full[2] - p[2]]
    return out if b is None else out + b.reshape(1, -1, 1, 1, 1)


@pytest.mark.parametrize("xs, ws, stride, padding, output_padding, dilation, groups", [
    ((2, 3, 3, 4, 2), (3, 2, 3, 3, 3), 2, 1, 1, 1, 1),
    ((1, 4, 2, 3, 3), (4, 3, 2, 1, 3), (3, 1, 2), (0, 0, 1), (2, 0, 1), (1, 1, 2), 2),
    ((2, 2, 3, 2, 2), (2, 1, 2, 2, 2), 1, 0, 0, (2, 1, 1), 1),
])
def test_conv_transpose3d_against_numpy(xs, ws, stride, padding, output_padding, dilation, groups):
    x, w = randn(*xs), randn(*ws)
    b = randn(ws[1] * groups)
    got = F.conv_transpose3d(t(x), t(w), t(b), stride, padding, output_padding, dilation, groups)
    want = conv_transpose3d_ref(x, w, b, stride, padding, output_padding, dilation, groups)
    assert got.shape == want.shape
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-4)


def test_conv3d_against_torch():
    torch = pytest.importorskip("torch")
    x, w, b = randn(2, 4, 6, 5, 7), randn(6, 2, 3, 2, 3), randn(6)
    want = torch.nn.functional.conv3d(torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b),
                                      (1, 2, 1), (1, 0, 2), (2, 1, 1), 2).numpy()
    got = F.conv3d(t(x), t(w), t(b), (1, 2, 1), (1, 0, 2), (2, 1, 1), 2)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-4)
    wt = randn(4, 3, 2, 3, 2)
    want = torch.nn.functional.conv_transpose3d(torch.from_numpy(x), torch.from_numpy(wt), None,
                                                2, 1, 1, 2, 2).numpy()
    got = F.conv_transpose3d(t(x), t(wt), None, 2, 1, 1, 2, 2)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-4)


def test_conv3d_errors():
    x = t(randn(1, 2, 3, 3, 3))
    with pytest.raises(ValueError, match=r"conv3d: inp must be 5-d \[N, C, D, H, W\]"):
        F.conv3d(t(randn(2, 3, 3, 3)), t(randn(1, 2, 1, 1, 1)))
    with pytest.raises(ValueError, match="conv3d: inp has 2 channels but weight expects 3"):
        F.conv3d(x, t(randn(1, 3, 1, 1, 1)))
    with pytest.raises(ValueError, match=r"conv3d: kernel \(4, 1, 1\) with dilation \(1, 1, 1\) is larger than the padded input \(3, 3, 3\)"):
        F.conv3d(x, t(randn(1, 2, 4, 1, 1)))
    with pytest.raises(ValueError, match="conv3d: conv_mode must be 'cross_correlation'"):
        F.conv3d(x, t(randn(1, 2, 1, 1, 1)), conv_mode="convolution")
    with pytest.raises(TypeError, match="conv3d: inp must be a floating-point tensor"):
        F.conv3d(t(np.ones((1, 2, 3, 3, 3), np.int32)), t(randn(1, 2, 1, 1, 1)))
    with pytest.raises(ValueError, match="stride must be an int or 3 ints"):
        F.conv3d(x, t(randn(1, 2, 1, 1, 1)), stride=(1, 1))
    with pytest.raises(ValueError, match="conv_transpose3d: output_padding"):
        F.conv_transpose3d(x, t(randn(2, 1, 2, 2, 2)), output_padding=1)


# ------------------------------------------------------------------ windows, local conv

def windows_ref(x, k, p, s, d):
    x = np.pad(x, ((0, 0), (0, 0), (p[0], p[0]), (p[1], p[1])))
    n, c, h, w = x.shape
    oh = (h - d[0] * (k[0] - 1) - 1) // s[0] + 1
    ow = (w - d[1] * (k[1] - 1) - 1) // s[1] + 1
    out = np.zeros((n, c, oh, ow, k[0], k[1]), x.dtype)
    for i in range(oh):
        for j in range(ow):
            for a in range(k[0]):
                for b in range(k[1]):
                    out[:, :, i, j, a, b] = x[:, :, i * s[0] + a * d[0], j * s[1] + b * d[1]]
    return out


def windows_transpose_ref(cols, hw, k, p, s, d):
    n, c, oh, ow = cols.shape[:4]
    out = np.zeros((n, c, hw[0] + 2 * p[0], hw[1] + 2 * p[1]), cols.dtype)
    for i in range(oh):
        for j in range(ow):
            for a in range(k[0]):
                for b in range(k[1]):
                    out[:, :, i * s[0] + a * d[0], j * s[1] + b * d[1]] += cols[:, :, i, j, a, b]
    return out[:, :, p[0]:p[0] + hw[0], p[1]:p[1] + hw[1]]


WINDOWS = [((2, 3, 5, 6), (2, 2), (0, 0), (1, 1), (1, 1)),
           ((1, 2, 7, 5), (3, 2), (1, 2), (2, 1), (1, 2)),
           ((1, 1, 4, 4), (4, 4), (0, 0), (1, 1), (1, 1))]


@pytest.mark.parametrize("shape, k, p, s, d", WINDOWS)
def test_sliding_window_and_transpose_against_loops(shape, k, p, s, d):
    x = randn(*shape)
    cols = F.sliding_window(t(x), k, p, s, d)
    want = windows_ref(x, k, p, s, d)
    np.testing.assert_array_equal(cols.numpy(), want)
    back = F.sliding_window_transpose(t(want), shape[2:], k, p, s, d)
    np.testing.assert_allclose(back.numpy(), windows_transpose_ref(want, shape[2:], k, p, s, d),
                               rtol=1e-6, atol=1e-6)
    ints = F.sliding_window(t(np.arange(np.prod(shape)).reshape(shape)), k, p, s, d)
    assert ints.dtype == np.int64 or ints.dtype == np.int32


def test_sliding_window_against_torch_unfold():
    torch = pytest.importorskip("torch")
    x = randn(2, 3, 6, 5)
    cols = F.sliding_window(t(x), (2, 3), (1, 0), (2, 1), (1, 1)).numpy()     # [N, C, OH, OW, KH, KW]
    ref = torch.nn.functional.unfold(torch.from_numpy(x), (2, 3), (1, 1), (1, 0), (2, 1)).numpy()
    n, c, oh, ow, kh, kw = cols.shape
    np.testing.assert_array_equal(cols.transpose(0, 1, 4, 5, 2, 3).reshape(n, c * kh * kw, oh * ow),
                                  ref)


def test_sliding_window_errors():
    with pytest.raises(ValueError, match="sliding_window: kernel .* larger than the padded input"):
        F.sliding_window(t(randn(1, 1, 2, 2)), 3)
    with pytest.raises(ValueError, match=r"sliding_window_transpose: inp must be \[N, C, 2, 2, 2, 2\]"):
        F.sliding_window_transpose(t(randn(1, 1, 2, 3, 2, 2)), 3, 2)


def local_conv_ref(x, w, stride, padding, dilation):
    g, oh, ow, cg, kh, kw, og = w.shape
    cols = windows_ref(x, (kh, kw), padding, stride, dilation).astype(np.float64)   # N C OH OW KH KW
    n = x.shape[0]
    out = np.zeros((n, g * og, oh, ow))
    for gi in range(g):
        out[:, gi * og:(gi + 1) * og] = np.einsum(
            "ncijab,ijcabo->noij", cols[:, gi * cg:(gi + 1) * cg], w[gi])
    return out


@pytest.mark.parametrize("groups, stride, padding, dilation", [(1, (1, 1), (0, 0), (1, 1)),
                                                                (2, (2, 1), (1, 1), (1, 2))])
def test_local_conv2d_against_numpy(groups, stride, padding, dilation):
    x = randn(2, 4, 6, 5)
    kh, kw = 3, 2
    oh = (6 + 2 * padding[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (5 + 2 * padding[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    w = randn(groups, oh, ow, 4 // groups, kh, kw, 6 // groups)
    b = randn(6)
    got = F.local_conv2d(t(x), t(w), t(b), stride, padding, dilation)
    want = local_conv_ref(x, w, stride, padding, dilation) + b.reshape(1, 6, 1, 1)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-5)
    if groups == 1:      # MegEngine's dense 6-d layout
        got = F.local_conv2d(t(x), t(w[0]), None, stride, padding, dilation)
        np.testing.assert_allclose(got.numpy(), want - b.reshape(1, 6, 1, 1), rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="local_conv2d: weight is for a"):
        F.local_conv2d(t(x[:, :, :3]), t(w), None, stride, padding, dilation)


# ------------------------------------------------------------------ warp_affine, remap

def bilinear_ref(img, sx, sy, mode, val):
    """img [C, H, W] at float points -> [C, P]: OpenCV-style borders (constant: val)."""
    c, h, w = img.shape

    def idx(i, n):
        if mode == "replicate":
            return min(max(i, 0), n - 1)
        if mode == "constant":
            return i if 0 <= i < n else None
        if mode == "wrap":
            return i % n
        if mode == "reflect":
            j = i % (2 * n)
            return j if j < n else 2 * n - 1 - j
        j = i % (2 * n - 2) if n > 1 else 0
        return j if j < n else 2 * n - 2 - j

    out = np.zeros((c, len(sx)))
    for p, (x, y) in enumerate(zip(sx, sy)):
        x0, y0 = math.floor(x), math.floor(y)
        for yy, wy in ((y0, 1 - (y - y0)), (y0 + 1, y - y0)):
            for xx, wx in ((x0, 1 - (x - x0)), (x0 + 1, x - x0)):
                i, j = idx(yy, h), idx(xx, w)
                v = np.full(c, val) if i is None or j is None else img[:, i, j]
                out[:, p] += wy * wx * v
    return out


@pytest.mark.parametrize("mode", ["replicate", "constant", "reflect", "reflect_101", "wrap"])
def test_warp_affine_against_numpy(mode):
    x = randn(2, 5, 6, 3)                                    # NHWC, MegEngine's default
    mat = np.array([[[0.9, 0.2, -0.7], [-0.1, 1.1, 0.6]], [[1.3, 0.0, 1.5], [0.2, 0.8, -2.0]]],
                   np.float32)
    got = F.warp_affine(t(x), t(mat), (4, 7), border_mode=mode, border_val=0.5)
    assert got.shape == (2, 4, 7, 3)
    for b in range(2):
        ys, xs = np.meshgrid(np.arange(4), np.arange(7), indexing="ij")
        sx = mat[b, 0, 0] * xs + mat[b, 0, 1] * ys + mat[b, 0, 2]
        sy = mat[b, 1, 0] * xs + mat[b, 1, 1] * ys + mat[b, 1, 2]
        want = bilinear_ref(x[b].transpose(2, 0, 1), sx.ravel(), sy.ravel(), mode, 0.5)
        np.testing.assert_allclose(got.numpy()[b], want.reshape(3, 4, 7).transpose(1, 2, 0),
                                   rtol=1e-5, atol=1e-5)
    nchw = F.warp_affine(t(x.transpose(0, 3, 1, 2).copy()), t(mat), (4, 7), border_mode=mode,
                         border_val=0.5, format="NCHW")
    np.testing.assert_allclose(nchw.numpy(), got.numpy().transpose(0, 3, 1, 2), rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match=r"warp_affine: mat must be \[N, 2, 3\]"):
        F.warp_affine(t(x), t(np.ones((2, 3, 3), np.float32)), (4, 7))


@pytest.mark.parametrize("mode", ["replicate", "constant", "reflect", "reflect_101", "wrap"])
def test_remap_against_numpy(mode):
    x = randn(2, 3, 4, 5)
    xy = (RNG.random((2, 3, 6, 2)) * 9 - 2).astype(np.float32)
    got = F.remap(t(x), t(xy), border_mode=mode, scalar=-1.5)
    assert got.shape == (2, 3, 3, 6)
    for b in range(2):
        want = bilinear_ref(x[b], xy[b, ..., 0].ravel(), xy[b, ..., 1].ravel(), mode, -1.5)
        np.testing.assert_allclose(got.numpy()[b], want.reshape(3, 3, 6), rtol=1e-5, atol=1e-5)


def test_remap_megengine_examples_and_nearest():
    inp = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    xy = np.array([[[1., 0.], [0., 1.]], [[0., 1.], [0., 1.]]], np.float32).reshape(1, 2, 2, 2)
    assert F.remap(t(inp), t(xy)).numpy().ravel().tolist() == [1.0, 4.0, 4.0, 4.0]
    # nearest: coordinates rounded half to even (as MegEngine 1.13 gives)
    pts = np.array([[[[1.5, 0.5], [2.5, 2.5], [0.49, 0.51], [-0.5, -0.6]],
                     [[3.6, 1.2], [-1.4, 1.0], [4.4, 3.5], [5.0, 5.0]]]], np.float32)
    got = F.remap(t(inp), t(pts), interp_mode="nearest").numpy().ravel().tolist()
    assert got == [2.0, 10.0, 4.0, 0.0, 7.0, 4.0, 15.0, 15.0]
    got = F.remap(t(inp), t(pts), border_mode="constant", scalar=-1.0,
                  interp_mode="nearest").numpy().ravel().tolist()
    assert got == [2.0, 10.0, 4.0, -1.0, -1.0, -1.0, -1.0, -1.0]
    with pytest.raises(ValueError, match="remap: interp_mode must be 'linear' or 'nearest'"):
        F.remap(t(inp), t(xy), interp_mode="cubic")
    with pytest.raises(ValueError, match=r"remap: map_xy must be \[1, OH, OW, 2\]"):
        F.remap(t(inp), t(xy[..., :1]))


# ------------------------------------------------------------------ multi_head_attention

def mha_ref(q, k, v, wq, wk, wv, wo, bq, bk, bv, bo, heads, mask=None):
    """Batch-first multi-head attention in float64 (Y = X @ W weights)."""
    q, k, v = (a.astype(np.float64) for a in (q, k, v))
    qp, kp, vp = q @ wq + bq, k @ wk + bk, v @ wv + bv
    n, lq, e = qp.shape
    d = e // heads

    def split(a):
        return a.reshape(n, a.shape[1], heads, d).transpose(0, 2, 1, 3)

    s = split(qp) @ split(kp).transpose(0, 1, 3, 2) / math.sqrt(d)
    if mask is not None:
        s = s + mask
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    o = (p @ split(vp)).transpose(0, 2, 1, 3).reshape(n, lq, e)
    return o @ wo + bo, p


def _packed(e, kdim, vdim, bias=True):
    ws = [randn(e, e), randn(kdim, e), randn(vdim, e), randn(e, e)]
    bs = [randn(e) for _ in range(4)] if bias else [np.zeros(e, np.float32)] * 4
    flat = np.concatenate([w.ravel() for w in ws] + ([b for b in bs] if bias else []))
    return ws, bs, flat[None].astype(np.float32)


def test_multi_head_attention_against_numpy():
    e, heads = 8, 2
    ws, bs, flat = _packed(e, 6, 5)
    q, k, v = randn(3, 4, e), randn(3, 7, 6), randn(3, 7, 5)
    out, weights = F.multi_head_attention(t(q), t(k), t(v), e, heads, 0.0, 0.0, t(flat),
                                          qbias=True, kbias=True, vbias=True, obias=True,
                                          need_weights=True)
    want, p = mha_ref(q, k, v, *ws, *bs, heads)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(weights.numpy(), p.reshape(3 * heads, 4, 7), rtol=1e-4, atol=1e-5)
    # masks: bool True = masked, float added; causal
    pad = np.zeros((3, 7), bool)
    pad[0, 5:] = True
    am = np.where(RNG.random((4, 7)) < 0.3, -np.inf, 0.0).astype(np.float32)
    am[:, 0] = 0.0
    out, avg = F.multi_head_attention(t(q), t(k), t(v), e, heads, 0.0, 0.0, t(flat), qbias=True,
                                      kbias=True, vbias=True, obias=True, key_padding_mask=t(pad),
                                      attn_mask=t(am), need_weights=True,
                                      average_attn_weights=True)
    mask = am[None, None] + np.where(pad, -np.inf, 0.0)[:, None, None, :]
    want, p = mha_ref(q, k, v, *ws, *bs, heads, mask)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(avg.numpy(), p.mean(1), rtol=1e-4, atol=1e-5)
    x = randn(2, 5, e)
    ws2, bs2, flat2 = _packed(e, e, e)
    out, none = F.multi_head_attention(t(x), t(x), t(x), e, heads, 0.0, 0.0, t(flat2), qbias=True,
                                       kbias=True, vbias=True, obias=True, is_causal=True)
    causal = np.triu(np.full((5, 5), -np.inf), 1)
    np.testing.assert_allclose(out.numpy(), mha_ref(x, x, x, *ws2, *bs2, heads, causal)[0],
                               rtol=1e-4, atol=1e-4)
    assert none is None


def test_multi_head_attention_errors():
    e = 4
    _, _, flat = _packed(e, e, e)
    x = t(randn(1, 2, e))
    with pytest.raises(ValueError, match="io_weight_bias has 80 elements; these sizes need 64"):
        F.multi_head_attention(x, x, x, e, 2, 0.0, 0.0, t(flat))
    with pytest.raises(ValueError, match="num_heads=3 must divide"):
        F.multi_head_attention(x, x, x, e, 3, 0.0, 0.0, t(flat), qbias=True, kbias=True,
                               vbias=True, obias=True)
    with pytest.raises(ValueError, match="cuDNN-only"):
        F.multi_head_attention(x, x, x, e, 2, 0.0, 0.0, t(flat), reslink=True)
    with pytest.raises(ValueError, match=r"attn_mask must be \[2, 2\] or \[2, 2, 2\]"):
        F.multi_head_attention(x, x, x, e, 2, 0.0, 0.0, t(flat), qbias=True, kbias=True,
                               vbias=True, obias=True, attn_mask=t(np.zeros((3, 2), np.float32)))


def test_einstein_docstring_examples_run():
    import doctest
    import importlib
    mod = importlib.import_module("mgtrace.functional.einstein")
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0 and result.attempted >= 3


# ------------------------------------------------------------------ deformable, region-restricted

def deformable_ref(x, w, off, mask, b, stride, padding, dilation, groups):
    """A float64 loop: every output, tap and deformable group sampled bilinearly (zeros outside)."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    _, _, oh, ow = off.shape
    k = kh * kw
    dg = off.shape[1] // (2 * k)
    cpd = c // dg
    cols = np.zeros((n, c, k, oh, ow))
    for ni in range(n):
        for d in range(dg):
            for t_ in range(k):
                a, bb = divmod(t_, kw)
                for i in range(oh):
                    for j in range(ow):
                        y = i * stride[0] - padding[0] + a * dilation[0] + off[ni, 2 * (d * k + t_), i, j]
                        xx = j * stride[1] - padding[1] + bb * dilation[1] + off[ni, 2 * (d * k + t_) + 1, i, j]
                        v = bilinear_ref(x[ni, d * cpd:(d + 1) * cpd], [xx], [y], "constant", 0.0)[:, 0]
                        cols[ni, d * cpd:(d + 1) * cpd, t_, i, j] = v * mask[ni, d * k + t_, i, j]
    og = o // groups
    out = np.zeros((n, o, oh, ow))
    for gi in range(groups):
        out[:, gi * og:(gi + 1) * og] = np.einsum(
            "nckij,ock->noij", cols[:, gi * cg:(gi + 1) * cg], w[gi * og:(gi + 1) * og].reshape(og, cg, k))
    return out + b.reshape(1, o, 1, 1)


def test_deformable_conv2d_against_a_loop():
    x = randn(2, 4, 5, 6)
    w = randn(6, 2, 2, 3)
    stride, padding, dilation = (1, 2), (1, 0), (2, 1)
    oh, ow = (5 + 2 - 2 - 1) // 1 + 1, (6 - 2 - 1) // 2 + 1
    off = (RNG.standard_normal((2, 2 * 2 * 6, oh, ow)) * 1.5).astype(np.float32)
    mask = RNG.random((2, 2 * 6, oh, ow)).astype(np.float32)
    b = randn(6)
    got = F.deformable_conv2d(t(x), t(w), t(off), t(mask), t(b), stride, padding, dilation, 2)
    want = deformable_ref(x, w, off, mask, b, stride, padding, dilation, 2)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-4)
    # zero offsets and a mask of ones: an ordinary convolution
    zero, ones = np.zeros((2, 2 * 6, oh, ow), np.float32), np.ones((2, 6, oh, ow), np.float32)
    got = F.deformable_conv2d(t(x), t(w), t(zero), t(ones), None, stride, padding, dilation, 2)
    conv = F.conv2d(t(x), t(w), None, stride, padding, dilation, 2)
    np.testing.assert_allclose(got.numpy(), conv.numpy(), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match=r"deformable_conv2d: mask must be \[2, 12, 5, 2\]"):
        F.deformable_conv2d(t(x), t(w), t(off), t(ones), None, stride, padding, dilation, 2)


def test_region_restricted_conv_against_a_loop():
    x = randn(2, 4, 6, 5)
    w = randn(4, 1, 3, 2)                                       # depthwise, as MegEngine's
    rin = RNG.integers(0, 3, (2, 6, 5)).astype(np.int32)
    rout = RNG.integers(0, 3, (2, 6, 4)).astype(np.int32)
    b = randn(4)
    got = F.region_restricted_conv(t(x), t(w), t(rin), t(rout), t(b), 1, (1, 0), 1, 4)
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (0, 0)))
    rp = np.pad(rin, ((0, 0), (1, 1), (0, 0)), constant_values=-1)
    want = np.zeros((2, 4, 6, 4))
    for n in range(2):
        for c in range(4):
            for i in range(6):
                for j in range(4):
                    keep = rp[n, i:i + 3, j:j + 2] == rout[n, i, j]
                    want[n, c, i, j] = (xp[n, c, i:i + 3, j:j + 2] * w[c, 0] * keep).sum() + b[c]
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)
    # one region everywhere: an ordinary convolution
    same = F.region_restricted_conv(t(x), t(w), t(np.zeros((2, 6, 5), np.int32)),
                                    t(np.zeros((2, 6, 4), np.int32)), None, 1, (1, 0), 1, 4)
    np.testing.assert_allclose(same.numpy(), F.conv2d(t(x), t(w), None, 1, (1, 0), 1, 4).numpy(),
                               rtol=1e-5, atol=1e-5)
    with pytest.raises(TypeError, match="region_restricted_conv: rin must be an integer tensor"):
        F.region_restricted_conv(t(x), t(w), t(rin.astype(np.float32)), t(rout), groups=4)
    with pytest.raises(ValueError, match=r"region_restricted_conv: rout must be \[2, 4, 4\]"):
        F.region_restricted_conv(t(x), t(w), t(rin), t(rout), groups=4)


def psroi_ref(x, rois, trans, no_trans, ph_n, pw_n, sp, scale, std):
    """MegEngine's CPU deformable RoI pooling, a loop per RoI, channel, bin and sample."""
    def c_round(v):
        return math.floor(abs(v) + 0.5) * (1 if v >= 0 else -1)

    n, c, h, w = x.shape
    out = np.zeros((len(rois), c, ph_n, pw_n))
    for r, (bidx, x1, y1, x2, y2) in enumerate(rois):
        left, top = c_round(x1) * scale - 0.5, c_round(y1) * scale - 0.5
        rw = max((c_round(x2) + 1) * scale - 0.5 - left, 0.1)
        rh = max((c_round(y2) + 1) * scale - 0.5 - top, 0.1)
        for i in range(ph_n):
            for j in range(pw_n):
                tx = 0.0 if no_trans else trans[r, 0, i, j] * std
                ty = 0.0 if no_trans else trans[r, 1, i, j] * std
                ws, hs = j * rw / pw_n + left + tx * rw, i * rh / ph_n + top + ty * rh
                vals = []
                for a in range(sp):
                    for b in range(sp):
                        yy, xx = hs + a * rh / ph_n / sp, ws + b * rw / pw_n / sp
                        if xx < -0.5 or xx > w - 0.5 or yy < -0.5 or yy > h - 0.5:
                            continue
                        yy, xx = min(max(yy, 0.0), h - 1.0), min(max(xx, 0.0), w - 1.0)
                        vals.append(bilinear_ref(x[int(bidx)], [xx], [yy], "replicate", 0.0)[:, 0])
                out[r, :, i, j] = np.mean(vals, axis=0) if vals else 0.0
    return out


@pytest.mark.parametrize("no_trans, sp, scale", [(True, 2, 1.0), (False, 3, 0.5), (False, 1, 2.0)])
def test_deformable_psroi_pooling_against_a_loop(no_trans, sp, scale):
    x = randn(2, 3, 7, 9)
    rois = np.array([[0, 1.5, 0.5, 6.2, 5.0], [1, -2, 3, 12, 4], [1, 3, 3, 3, 3],
                     [0, 2.5, 1.5, 7.5, 6.5]], np.float32)
    trans = (RNG.standard_normal((4, 2, 3, 3)) * 2).astype(np.float32)
    got = F.deformable_psroi_pooling(t(x), t(rois), t(trans), no_trans, 3, 3, 3, sp, scale, 0.1)
    want = psroi_ref(x, rois, trans, no_trans, 3, 3, sp, scale, 0.1)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)


def test_deformable_psroi_pooling_errors():
    x, rois = t(randn(1, 2, 4, 4)), t(np.array([[0, 0, 0, 3, 3]], np.float32))
    with pytest.raises(ValueError, match=r"trans must be \[1, 2, 2, 2\]"):
        F.deformable_psroi_pooling(x, rois, t(np.zeros((1, 2, 3, 3), np.float32)), False, 2, 2, 2,
                                   1, 1.0)
    with pytest.raises(ValueError, match="part_size .3. must equal pooled_h and pooled_w"):
        F.deformable_psroi_pooling(x, rois, t(np.zeros((1, 2, 2, 2), np.float32)), False, 3, 2, 2,
                                   1, 1.0)
    with pytest.raises(ValueError, match=r"rois must be \[R, 5\]"):
        F.deformable_psroi_pooling(x, t(np.zeros((1, 4), np.float32)),
                                   t(np.zeros((1, 2, 2, 2), np.float32)), True, 2, 2, 2, 1, 1.0)
