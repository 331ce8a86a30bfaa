"""Core ops that compute refuse a quantized tensor (issue 32): matmul, the nn
ops, reductions, sort/topk, gather-like ops and setitem would otherwise run
on the raw integers and give wrong numbers with no error. Layout ops keep the
quantized dtype (test_qdtype.py); the int8 kernels take quantized inputs on
purpose (test_int8_kernels.py)."""
import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
from mgtrace.quantization import QuantizationError
from mgtrace.quantization import qdtype as Q

F32 = np.float32
X4 = np.linspace(-1, 1, 2 * 4 * 6 * 6, dtype=F32).reshape(2, 4, 6, 6)
QD = Q.qint8(0.05)
QNAME = r"qint8\(scale=0.05\)"


def _f(shape=(2, 4, 6, 6)):
    return mt.tensor(X4.reshape(-1)[:int(np.prod(shape))].reshape(shape))


def _q(shape=(2, 4, 6, 6)):
    return _f(shape).astype(QD)


IDX = lambda: mt.tensor(np.array([0, 1], np.int32))

# (what, the call on quantized operands, the core op the error names)
OPS = [
    ("matmul", lambda: _q((4, 6)) @ _f((6, 3)), "matmul"),
    ("matmul rhs", lambda: F.matmul(_f((4, 6)), _q((6, 3))), "matmul"),
    ("linear", lambda: F.linear(_q((2, 8)), _f((3, 8))), "matmul"),
    ("linear weight", lambda: F.linear(_f((2, 8)), _q((3, 8))), "matmul"),
    ("conv2d", lambda: F.conv2d(_q(), _f((3, 4, 3, 3))), "conv2d"),
    ("conv2d weight", lambda: F.conv2d(_f(), _q((3, 4, 3, 3))), "conv2d"),
    # max_pool2d, avg_pool2d and adaptive_avg_pool2d pool a quantized tensor's
    # integers (test_int8_maxpool.py, test_int8_avgpool.py); max_pool2d's
    # indices form still refuses one
    ("max_pool2d indices", lambda: F.max_pool2d(_q(), 2, return_indices=True), "max_pool2d"),
    ("interpolate", lambda: F.nn.interpolate(_q(), scale_factor=2), "interpolate"),
    ("pad", lambda: F.pad(_q(), ((0, 0), (0, 0), (1, 1), (1, 1))), "pad"),
    ("batch_norm", lambda: F.nn.batch_norm(_q(), _f((4,)), _f((4,)), training=False), "batch_norm"),
    ("sum", lambda: _q().sum(), "sum"),
    ("F.sum", lambda: F.sum(_q(), axis=1), "sum"),
    ("mean", lambda: F.mean(_q()), "mean"),
    ("max", lambda: _q().max(), "max"),
    ("min", lambda: F.min(_q(), 0), "min"),
    ("prod", lambda: F.prod(_q()), "prod"),
    ("var", lambda: F.var(_q()), "var"),
    ("argmax", lambda: F.argmax(_q(), 1), "argmax"),
    ("argmin", lambda: _q().argmin(), "argmin"),
    ("cumsum", lambda: F.cumsum(_q(), 1), "cumsum"),
    ("softmax", lambda: F.softmax(_q(), axis=1), "softmax"),
    ("log_softmax", lambda: F.logsoftmax(_q(), axis=1) if hasattr(F, "logsoftmax")
     else F.log_softmax(_q(), axis=1), "log_softmax"),
    ("sort", lambda: F.sort(_q((10,))), "sort"),
    ("argsort", lambda: F.argsort(_q((10,))), "argsort"),
    ("topk", lambda: F.topk(_q((10,)), 3), "topk"),
    ("indexing_one_hot", lambda: F.indexing_one_hot(_q((2, 8)), IDX(), 1), "gather"),
    ("gather", lambda: F.gather(_q((2, 8)), 1, mt.tensor(np.zeros((2, 1), np.int32))), "gather"),
    ("embedding", lambda: F.nn.embedding(IDX(), _q((4, 8))), "embedding"),
    ("norm (int -> float32 cast)", lambda: F.norm(_q()), "astype"),
    ("logsumexp (int -> float32 cast)", lambda: F.logsumexp(_q(), 1), "astype"),
    ("setitem float value", lambda: _q().__setitem__(0, _f((4, 6, 6))), "setitem"),
    ("setitem scalar", lambda: _q().__setitem__((0, 0), 1.5), "setitem"),
    ("setitem other qdtype", lambda: _q().__setitem__(0, _f((4, 6, 6)).astype(Q.qint8(0.1))),
     "setitem"),
    ("setitem into float", lambda: _f().__setitem__(0, _q((4, 6, 6))), "setitem"),
    # its integers (here up to 20) are no class indices: refused before its range check
    ("one_hot", lambda: F.one_hot(_q((8,)), 3), "one_hot"),
]


@pytest.mark.parametrize("what, call, op", OPS, ids=[o[0] for o in OPS])
def test_op_refuses_quantized(what, call, op):
    with pytest.raises(QuantizationError, match=rf"^{op}: .*{QNAME}") as e:
        call()
    assert "dequantize" in str(e.value) or "quantize it first" in str(e.value)


def test_setitem_same_qdtype_writes_integers_as_is():
    q = _q((4, 6))
    v = _f((6,)).astype(QD)
    q[2] = v
    q[3, 1:3] = v[4:]
    assert Q.same_dtype(q.dtype, QD)
    got = Q.int_repr(q).numpy()
    assert got[2].tolist() == Q.int_repr(v).numpy().tolist()
    assert got[3, 1:3].tolist() == Q.int_repr(v).numpy()[4:].tolist()


def test_layout_ops_still_keep_the_qdtype():
    q = _q((2, 8))
    for y in [q[1], F.concat([q, q]), F.stack([q, q]), *F.split(q, 2, axis=1)]:
        assert Q.same_dtype(y.dtype, QD)
    np.testing.assert_array_equal(F.dequantize(F.stack([q, q], 1)).numpy(),
                                  np.stack([F.dequantize(q).numpy()] * 2, 1))


@pytest.mark.parametrize("qd, fill", [(QD, 0), (Q.quint8(0.05, 200), 200)])
def test_nchwc_blocking_keeps_the_qdtype_and_pads_with_the_zero_point(qd, fill):
    q = mt.tensor(np.linspace(-3, 3, 2 * 20 * 9, dtype=F32).reshape(2, 20, 3, 3)).astype(qd)
    b = F.to_nchwc(q)
    assert Q.same_dtype(b.dtype, qd) and b.shape == (2, 2, 3, 3, 16)
    ints, bi = Q.int_repr(q).numpy(), Q.int_repr(b).numpy()
    want = np.full((2, 32, 3, 3), fill, ints.dtype)          # NumPy's blocking
    want[:, :20] = ints
    np.testing.assert_array_equal(bi, want.reshape(2, 2, 16, 3, 3).transpose(0, 1, 3, 4, 2))
    back = F.from_nchwc(b, 20)
    assert Q.same_dtype(back.dtype, qd)
    np.testing.assert_array_equal(Q.int_repr(back).numpy(), ints)


def test_float_ops_unchanged():
    x = _f((4, 6))
    np.testing.assert_allclose(x.sum().numpy(), X4.reshape(-1)[:24].sum(), rtol=1e-5)
    x[0] = _f((6,))
    assert (x @ _f((6, 3))).shape == (4, 3)


def test_apply_refuses_too():
    from mgtrace._core.dispatch import OpDef, apply
    with pytest.raises(QuantizationError, match=rf"^sum: .*{QNAME}"):
        apply(OpDef("sum", {"axis": None, "keepdims": False}), _q())
    with pytest.raises(QuantizationError, match=rf"^matmul: .*{QNAME}"):
        apply(OpDef("matmul", {}), _q((4, 6)), _f((6, 3)))
    assert float(apply(OpDef("sum", {"axis": None, "keepdims": False}), _f((4,)))) == \
        pytest.approx(float(X4.reshape(-1)[:4].sum()))
