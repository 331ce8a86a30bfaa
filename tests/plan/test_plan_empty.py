"""Plans and matmul on empty batches (the breaker's cases): matmul broadcast
a 0 batch axis against a 1 to 1 (``(0, 3, 4) @ (4, 3)`` gave (1, 3, 3) read
from the empty operand), and a plan whose intermediates are all empty (arena
of 0 bytes) dereferenced a missing arena: a segfault on the first call."""
import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module as M
from mgtrace.plan import compile as compile_plan


@pytest.mark.parametrize("a, b", [((0, 3, 4), (4, 3)), ((2, 0, 3, 4), (4, 5)),
                                  ((0, 3, 4), (1, 4, 5)), ((1, 3, 4), (0, 4, 5)),
                                  ((0, 1, 3, 4), (1, 2, 4, 5))])
def test_matmul_zero_batch_broadcasts_as_numpy(a, b):
    x, y = np.ones(a, np.float32), np.ones(b, np.float32)
    assert F.matmul(mt.tensor(x), mt.tensor(y)).shape == np.matmul(x, y).shape


def test_linear_empty_3d_batch():
    m = M.Linear(4, 3)
    assert m(mt.tensor(np.zeros((0, 3, 4), np.float32))).shape == (0, 3, 3)


class _EmbLinear(M.Module):
    def __init__(self):
        super().__init__()
        self.e = M.Embedding(10, 4)
        self.l = M.Linear(4, 3)

    def forward(self, i):
        return self.l(self.e(i))


@pytest.mark.parametrize("first_empty", [True, False])
def test_plan_empty_batch(first_empty):
    mt.random.seed(0)
    m = _EmbLinear()
    m.eval()
    empty = mt.tensor(np.zeros((0, 3), np.int32))
    full = mt.tensor(np.array([[1, 2, 3], [9, 0, 4]], np.int32))
    plan = compile_plan(m, empty if first_empty else full)
    assert plan(empty).shape == (0, 3, 3)
    y = plan(full).numpy()
    e, w, b = m.e.weight.numpy(), m.l.weight.numpy(), m.l.bias.numpy()
    np.testing.assert_allclose(y, e[full.numpy()] @ w.T + b, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(y, m(full).numpy())
