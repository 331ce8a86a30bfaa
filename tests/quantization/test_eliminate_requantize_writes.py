"""EliminateRequantize keeps a QuantStub that reads a value written in place
since it was quantized: ``a = q1(x); x[0] = 5; b = q2(x)`` merged q2 into
q1 (b came out as a, without the 5), and ``QuantStub(DequantStub(z))``
became z even where z was written between the two. Reference: the eager
module's own output."""
import warnings

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.module as M
import mgtrace.module.quantized as MQ
from mgtrace.traced_module import optimize

QP = {"dtype": "qint8", "scale": 0.05, "zero_point": 0}


class Stubs(M.Module):
    def __init__(self, write):
        super().__init__()
        self.q1, self.q2 = MQ.QuantStub(QP), MQ.QuantStub(QP)
        self.write = write

    def forward(self, x):
        y = x * 1
        a = self.q1(y)
        if self.write == "setitem":
            y[0] = 5.0
        elif self.write == "view":
            v = y[1:]
            v *= 2
        return a, self.q2(y)


class Requant(M.Module):
    def __init__(self, write):
        super().__init__()
        self.q1, self.dq, self.q2 = MQ.QuantStub(QP), MQ.DequantStub(), MQ.QuantStub(QP)
        self.write = write

    def forward(self, x):
        z = self.q1(x)
        f = self.dq(z)
        if self.write:
            z[0] = z[1]          # z written after it was dequantized
        return self.q2(f), z


def _run(module, dropped):
    x = np.linspace(-1, 1, 6).astype(np.float32).reshape(2, 3)
    want = [o.numpy() for o in module(mt.tensor(x.copy()))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tm = mt.trace_module(module, mt.tensor(x.copy()))
    new, report = optimize(tm, ["EliminateRequantize"], return_report=True)
    assert report["EliminateRequantize"].counts == {"dropped": dropped}
    for w, g in zip(want, new(mt.tensor(x.copy()))):
        np.testing.assert_array_equal(g.numpy(), w)
    return want


@pytest.mark.parametrize("write", ["setitem", "view"])
def test_a_stub_after_an_in_place_write_quantizes_anew(write):
    a, b = _run(Stubs(write), dropped=0)
    assert not np.array_equal(a, b)         # the write shows in b
    # x quantized at scale 0.05: -1 -> -20 ... 1 -> 20; 5.0 saturates at 100
    assert a.tolist() == [[-20, -12, -4], [4, 12, 20]]


def test_stubs_of_one_value_without_a_write_still_merge():
    a, b = _run(Stubs(None), dropped=1)
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("write, dropped", [(False, 1), (True, 0)])
def test_requantize_is_dropped_only_without_a_write_between(write, dropped):
    y, z = _run(Requant(write), dropped)
    assert y.tolist() == [[-20, -12, -4], [4, 12, 20]]
    assert z.tolist() == ([[4, 12, 20], [4, 12, 20]] if write else y.tolist())
