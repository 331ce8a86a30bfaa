"""A traced module that makes a tensor from a constant in its forward
(``x * mt.tensor(2.0)``, ``mt.tensor(np.array(...))``) compiles. The trace
keeps the value as a graph Constant and its code runs
``mgtrace.tensor(const)``; compile refused that as "builds a tensor from
tensor values: its contents depend on the inputs", though the eager module
compiled. A tensor made from an input, or from what the forward computed,
is still refused. Reference: the traced module itself, bitwise, on inputs
other than the compile-time ones."""
import numpy as np
import pytest

import mgtrace as mt
import mgtrace.module as M
from mgtrace.plan import PlanError


class Consts(M.Module):
    def __init__(self):
        super().__init__()
        self.fc = M.Linear(6, 4)

    def forward(self, x):
        y = self.fc(x) * mt.tensor(np.array(0.5, np.float32))
        return y + mt.tensor(np.arange(4, dtype=np.float32)), y - mt.tensor(np.float32(3.0))


class FromInput(M.Module):
    def forward(self, x):
        return x + mt.tensor(x)


class FromComputed(M.Module):
    def forward(self, x):
        return x + mt.tensor(x * 2.0)


def _x(seed, n=3):
    return mt.tensor(np.random.default_rng(seed).standard_normal((n, 6)).astype(np.float32))


def test_a_traced_module_with_constant_tensors_compiles_and_matches():
    mt.random.seed(0)
    net = Consts().eval()
    tm = mt.trace_module(net, _x(0))
    plan = mt.compile(tm, _x(0))
    assert plan.misses == 0
    for seed in (1, 2):
        x = _x(seed)
        for g, w in zip(plan(x), tm(x)):
            assert g.numpy().tobytes() == w.numpy().tobytes()
    assert plan.misses == 0
    # the eager module gives the same plan outputs
    x = _x(3)
    want = net(x)
    for g, w in zip(mt.compile(net, x)(x), want):
        np.testing.assert_array_equal(g.numpy(), w.numpy())


@pytest.mark.parametrize("cls", [FromInput, FromComputed])
def test_a_tensor_made_from_the_inputs_is_still_refused(cls):
    for m in (cls().eval(), mt.trace_module(cls().eval(), _x(0))):
        with pytest.raises(PlanError, match="builds a tensor from tensor values|reads a tensor's value"):
            mt.compile(m, _x(0))
