"""Every row of mgtrace.onnx.mapping, exported at the lowest and the highest
opset it supports and run in ONNX Runtime against mgtrace's own output
(float within 1e-5 of the output's scale, integer and bool exactly)."""
import numpy as np
import pytest

pytest.importorskip("onnx", reason="needs onnx (pip install 'mgtrace[onnx]')")
pytest.importorskip("onnxruntime", reason="needs onnxruntime (pip install 'mgtrace[onnx]')")

import mgtrace as mt  # noqa: E402
from mgtrace.onnx import mapping  # noqa: E402
from mgtrace.onnx.exporter import build_model, compare, max_opset, run_ort  # noqa: E402
from mgtrace.traced_module.pytree import tree_flatten  # noqa: E402
from mgtrace import module as M  # noqa: E402

# tests/onnx is on sys.path and has no __init__.py: a package named onnx would hide onnx
from onnx_cases import CASES  # noqa: E402


class _Fn(M.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def _run_case(key, opset):
    fn, inputs = CASES[key]
    mod = fn if isinstance(fn, M.Module) else _Fn(fn)
    args = [mt.tensor(np.asarray(x)) for x in inputs]
    tm = mt.trace_module(mod, *args)
    model = build_model(tm, opset=opset)
    want = tree_flatten(tm(*args), lambda v: isinstance(v, mt.Tensor))[0]
    got = run_ort(model, [np.asarray(x) for x in inputs])
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        w = w.numpy()
        assert g.dtype == w.dtype, f"{key} output {i}: dtype {g.dtype} != {w.dtype}"
        msg = compare(g, w, f"{key} output {i}")
        assert msg is None, msg
    return model


def _refused(rule):
    return getattr(rule.convert, "no_onnx", None)


_KEYS = [(r.kind, r.name) for r in mapping.RULES if not _refused(r)]
_REFUSED = [(r.kind, r.name) for r in mapping.RULES if _refused(r) and (r.kind, r.name) in CASES]


def test_every_rule_has_a_case():
    assert sorted(set(_KEYS) - set(CASES)) == []
    assert sorted(set(CASES) - set(_KEYS) - set(_REFUSED)) == []


@pytest.mark.parametrize("edge", ["lowest", "highest"])
@pytest.mark.parametrize("key", _KEYS, ids=[f"{k}:{n}" for k, n in _KEYS])
def test_rule_exports_and_runs(key, edge):
    rule = mapping.rule_for(*key)
    opset = rule.since if edge == "lowest" else max_opset()
    model = _run_case(key, opset)
    assert model.opset_import[0].version == opset


@pytest.mark.parametrize("key", _REFUSED, ids=[f"{k}:{n}" for k, n in _REFUSED])
def test_row_without_onnx_equivalent_is_refused(key):
    from mgtrace.onnx import ExportError
    with pytest.raises(ExportError, match=f"{key[1]} has no ONNX equivalent: "):
        _run_case(key, max_opset())
