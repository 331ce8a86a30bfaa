"""FuseSiblingLinear: linear layers reading one input as one GEMM over their
stacked weights, each output a column slice; the bits of the unfused graph."""
import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.models as models
import mgtrace.module as M
from mgtrace._core import dispatch
from mgtrace.traced_module import optimize


class QKV(M.Module):
    """Three linear layers of one input, a functional one beside them, one of
    another input, and one whose width (5) is no multiple of 16."""

    def __init__(self, d=8, bias=True):
        super().__init__()
        rng = np.random.default_rng(3)
        self.q, self.k, self.v = M.Linear(d, 16, bias=bias), M.Linear(d, 48, bias=bias), M.Linear(d, 32, bias=bias)
        self.w = M.Parameter(rng.standard_normal((16, d)).astype("float32"))
        self.b = M.Parameter(rng.standard_normal(16).astype("float32"))
        self.other = M.Linear(16, 4)
        self.odd = M.Linear(d, 5, bias=bias)

    def forward(self, x):
        q, k, v = self.q(x), self.k(x), self.v(x)
        f = F.linear(x, self.w, self.b if self.q.bias is not None else None)
        return F.concat([q, k, v, f], axis=-1) * 2, self.other(q), self.odd(x)


def _bits(out):
    return [o.numpy().tobytes() for o in out]


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(1, 8), (2, 5, 8), (3, 171, 8), (1100, 8)])
def test_siblings_fuse_to_one_gemm_with_the_bits_of_the_unfused_graph_on_one_thread(shape, bias):
    rng = np.random.default_rng(0)
    x = mt.tensor(rng.standard_normal(shape).astype("float32"))
    tm = mt.trace_module(QKV(bias=bias).eval(), x)
    new, report = optimize(tm, ["FuseLinearAct", "FuseSiblingLinear"], return_report=True)
    assert report["FuseSiblingLinear"].counts == {"fusions": 3}          # four calls -> one, odd left
    stacked = [tuple(v.shape) for n, v in new.state_dict().items() if "_stacked_" in n]
    assert sorted(stacked) == ([(112,), (112, 8)] if bias else [(112, 8)])
    assert F.linear_act in [getattr(e, "func", None) for e in new.graph._exprs]
    new.graph.lint()
    before = dispatch.get_num_threads()
    try:
        dispatch.set_num_threads(1)
        for seed in range(2):
            x = mt.tensor(np.random.default_rng(seed).standard_normal(shape).astype("float32"))
            assert _bits(new(x)) == _bits(tm(x))
    finally:
        dispatch.set_num_threads(before)
    # the reference: NumPy's products of the separate weights (within rounding)
    m = tm.state_dict()
    xn = x.numpy()
    ref = np.concatenate([xn @ m[n + ".weight"].numpy().T + (m[n + ".bias"].numpy() if bias else 0)
                          for n in ("q", "k", "v")] + [xn @ m["w"].numpy().T + (m["b"].numpy() if bias else 0)],
                         axis=-1) * 2
    np.testing.assert_allclose(new(x)[0].numpy(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("threads", [2, 3])
def test_siblings_keep_the_bits_on_threads_where_each_product_splits_by_rows(threads):
    """BERT's query, key and value at 8 x 128 tokens (1024 rows, 384 wide):
    one single-threaded GEMM per block of rows either way."""
    rng = np.random.default_rng(4)
    x = mt.tensor(rng.standard_normal((8, 128, 384)).astype("float32"))
    tm = mt.trace_module(QKV(384).eval(), x)
    new = optimize(tm, ["FuseLinearAct", "FuseSiblingLinear"])
    before = dispatch.get_num_threads()
    try:
        dispatch.set_num_threads(threads)
        assert _bits(new(x)) == _bits(tm(x))
    finally:
        dispatch.set_num_threads(before)


def test_only_siblings_alike_fuse():
    """a and c (biases) fuse; b (no bias) is not their kind, and d reads the
    value ``x *= 2`` made, another node."""
    class Mixed(M.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = M.Linear(4, 16), M.Linear(4, 16, bias=False)
            self.c, self.d = M.Linear(4, 16), M.Linear(4, 16)

        def forward(self, x):
            y = self.a(x) + self.b(x).sum()
            c = self.c(x)
            x *= 2
            return y, c, self.d(x)

    def ones():
        return mt.tensor(np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4))

    tm = mt.trace_module(Mixed().eval(), ones())
    new, report = optimize(tm, ["FuseSiblingLinear"], return_report=True)
    assert report["FuseSiblingLinear"].counts == {"fusions": 1}
    assert [tuple(v.shape) for n, v in new.state_dict().items() if "_stacked_" in n] == [(32, 4), (32,)]
    assert _bits(new(ones())) == _bits(tm(ones()))


def test_minilm_fuses_query_key_value_and_its_plan_keeps_the_bits():
    net = models.MiniLM(num_hidden_layers=2).eval()
    rng = np.random.default_rng(1)
    ids = mt.tensor(rng.integers(1, 30000, (2, 12)).astype(np.int32))
    mask = mt.tensor(np.array([[1] * 12, [1] * 7 + [0] * 5], np.int32))
    tm = mt.trace_module(net, ids, mask)
    new, report = optimize(tm, "all", flatten=True, return_report=True)
    assert report["FuseSiblingLinear"].counts == {"fusions": 4}         # 2 layers x (3 -> 1)
    without = optimize(tm, [n for n in report if n != "FuseSiblingLinear"], flatten=True)
    want = without(ids, mask).numpy()
    assert new(ids, mask).numpy().tobytes() == want.tobytes()
    plan = mt.compile(new, ids, mask)
    assert plan.stats()["python_steps"] == 0
    assert plan(ids, mask).numpy().tobytes() == want.tobytes()
    # the attention kernel writes its heads inner: merging them is a view, no copy step
    assert [w for _, w, _ in plan.profile(ids, mask, repeats=1) if "reshape" in w] == []
