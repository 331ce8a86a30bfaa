"""MultiHeadAttention and SlidingWindow: export -> import -> run equal, at
a batch size and length (or image size) other than the traced ones."""
import numpy as np
import pytest

pytest.importorskip("onnx", reason="needs onnx (pip install 'mgtrace[onnx]')")
pytest.importorskip("onnxruntime", reason="needs onnxruntime (pip install 'mgtrace[onnx]')")

import mgtrace as mt  # noqa: E402
import mgtrace.module as M  # noqa: E402
import mgtrace.onnx as mo  # noqa: E402
from mgtrace.onnx.exporter import build_model, compare, run_ort  # noqa: E402


class Attention(M.Module):
    def __init__(self):
        super().__init__()
        self.mha = M.MultiHeadAttention(8, 2)

    def forward(self, q, k, v):
        return self.mha(q, k, v)[0]


class Windows(M.Module):
    def __init__(self):
        super().__init__()
        self.sw = M.SlidingWindow(3, padding=1, stride=2)

    def forward(self, x):
        return self.sw(x)


CASES = {
    "multi_head_attention": (Attention, lambda rng, n, t: [
        rng.standard_normal((t, n, 8)).astype(np.float32) for _ in range(3)]),
    "sliding_window": (Windows, lambda rng, n, t: [
        rng.standard_normal((n, 2, t, t + 1)).astype(np.float32)]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_export_import_run_equal(case):
    cls, make = CASES[case]
    mt.random.seed(0)
    rng = np.random.default_rng(0)
    net = cls().eval()
    tm = mt.trace_module(net, *[mt.tensor(a) for a in make(rng, 1, 4)])
    model = build_model(tm)
    back = mo.load(model.SerializeToString())
    xs = make(rng, 3, 6)
    want = net(*[mt.tensor(a) for a in xs]).numpy()
    got = back(*[mt.tensor(a) for a in xs]).numpy()
    assert compare(got, want) is None, compare(got, want)
    assert compare(run_ort(model, xs)[0], want) is None
