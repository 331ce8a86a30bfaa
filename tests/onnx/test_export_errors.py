"""export's contract: what it writes, the names it gives, and clear
ExportErrors (op, node, source line) with nothing written."""
import io

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="needs onnx (pip install 'mgtrace[onnx]')")
pytest.importorskip("onnxruntime", reason="needs onnxruntime (pip install 'mgtrace[onnx]')")

import mgtrace as mt  # noqa: E402
import mgtrace.functional as F  # noqa: E402
import mgtrace.module as M  # noqa: E402
import mgtrace.onnx as mo  # noqa: E402
from mgtrace.onnx.exporter import run_ort  # noqa: E402


def _trace(fn, *shapes, dtype=np.float32):
    class Net(M.Module):
        def __init__(self):
            super().__init__()
            self.lin = M.Linear(4, 4)

        def forward(self, x):
            return fn(self, x)
    xs = [mt.tensor(np.arange(np.prod(s), dtype=dtype).reshape(s) % 7) for s in shapes]
    return mt.trace_module(Net().eval(), *xs)


def test_export_writes_a_checked_model_with_traced_names(tmp_path):
    tm = _trace(lambda self, x: F.relu(self.lin(x)).reshape(x.shape[0], 2, 2), (1, 4))
    path = tmp_path / "m.onnx"
    model = mo.export(tm, path, input_names=["features"], output_names=["y"],
                      example_inputs=(np.ones((1, 4), np.float32),))
    loaded = onnx.load(str(path))
    onnx.checker.check_model(loaded, full_check=True)
    assert loaded == model
    assert [i.name for i in loaded.graph.input] == ["features"]
    assert [o.name for o in loaded.graph.output] == ["y"]
    assert {i.name for i in loaded.graph.initializer} >= {"lin.weight", "lin.bias"}
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    want = np.maximum(x @ tm.lin.weight.numpy().T + tm.lin.bias.numpy(), 0).reshape(5, 2, 2)
    np.testing.assert_allclose(run_ort(loaded, [x])[0], want, rtol=1e-5, atol=1e-6)


def test_export_to_a_file_object_and_fixed_shapes():
    tm = _trace(lambda self, x: x * 2, (2, 3))
    buf = io.BytesIO()
    model = mo.export(tm, buf, dynamic=False)
    assert buf.getvalue() == model.SerializeToString()
    dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert dims == [2, 3]


def test_unsupported_op_names_op_node_and_line(tmp_path):
    tm = _trace(lambda self, x: F.matinv(x), (3, 3))     # ONNX has no matrix inverse
    path = tmp_path / "m.onnx"
    with pytest.raises(mo.ExportError) as err:
        mo.export(tm, path)
    msg = str(err.value)
    assert "function F.matinv has no ONNX equivalent: ONNX's default domain has no matrix " \
           "inverse (node Net.[matinv] at " in msg, msg
    assert "test_export_errors.py:" in msg, msg
    assert not path.exists() and list(tmp_path.iterdir()) == []


def test_unsupported_module_is_named(tmp_path):
    @M.register_as_builtin(name="tests.onnx.Scale")
    class Scale(M.Module):
        def forward(self, x):
            return x * 3

    class Net(M.Module):
        def __init__(self):
            super().__init__()
            self.s = Scale()

        def forward(self, x):
            return self.s(x)
    tm = mt.trace_module(Net(), mt.tensor(np.ones((2, 2), np.float32)))
    with pytest.raises(mo.ExportError, match=r"module .*Scale has no ONNX mapping"):
        mo.export(tm, tmp_path / "m.onnx")
    assert list(tmp_path.iterdir()) == []


def test_too_old_opset_says_which_op_needs_which(tmp_path):
    tm = _trace(lambda self, x: x & 6, (2, 3), dtype=np.int32)
    with pytest.raises(mo.ExportError, match=r"op bitwise_and needs opset 18 .*opset 13"):
        mo.export(tm, tmp_path / "m.onnx", opset=13)
    assert list(tmp_path.iterdir()) == []
    mo.export(tm, tmp_path / "m.onnx", opset=18)
    assert (tmp_path / "m.onnx").exists()


@pytest.mark.parametrize("opset", [12, 10_000])
def test_opset_outside_the_supported_range(tmp_path, opset):
    tm = _trace(lambda self, x: x + 1, (2, 3))
    with pytest.raises(mo.ExportError, match=f"opset {opset} is not supported: mgtrace exports "
                                             f"opsets 13 to {mo.max_opset()}"):
        mo.export(tm, tmp_path / "m.onnx", opset=opset)


def test_dynamic_value_onnx_cannot_express(tmp_path):
    tm = _trace(lambda self, x: F.adaptive_avg_pool2d(x, (3, 2)), (1, 2, 4, 4))
    with pytest.raises(mo.ExportError, match=r"adaptive_avg_pool2d from \(4, 4\) to \(3, 2\): "
                                             r"the output does not divide the input"):
        mo.export(tm, tmp_path / "m.onnx")
    tm = _trace(lambda self, x: F.split(x, x.shape[0], axis=1), (2, 4))
    with pytest.raises(mo.ExportError, match="split's sections is computed from a shape"):
        mo.export(tm, tmp_path / "m.onnx")
    assert list(tmp_path.iterdir()) == []


def test_adaptive_pool_to_a_size_that_divides_runs_at_other_sizes():
    rng = np.random.default_rng(3)
    tm = _trace(lambda self, x: (F.adaptive_avg_pool2d(x, (2, 3)),
                                 F.adaptive_max_pool2d(x, (None, 2))), (1, 2, 4, 6))
    model = mo.export(tm, io.BytesIO())
    x = rng.standard_normal((3, 2, 8, 12)).astype(np.float32)      # windows 4x4, 8x6 here
    for got, want in zip(run_ort(model, [x]), tm(mt.tensor(x))):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-6, atol=1e-6)


def test_example_inputs_that_disagree_write_nothing(tmp_path, monkeypatch):
    tm = _trace(lambda self, x: x * 2, (2, 3))
    from mgtrace.onnx import exporter as ex
    monkeypatch.setattr(ex, "run_ort", lambda model, xs: [np.zeros((2, 3), np.float32)])
    with pytest.raises(mo.ExportError, match="ONNX Runtime's result differs"):
        mo.export(tm, tmp_path / "m.onnx", example_inputs=(np.ones((2, 3), np.float32),))
    assert list(tmp_path.iterdir()) == []


def test_training_mode_batch_norm_is_refused(tmp_path):
    class Net(M.Module):
        def __init__(self):
            super().__init__()
            self.bn = M.BatchNorm2d(2)

        def forward(self, x):
            return self.bn(x)
    tm = mt.trace_module(Net().eval(), mt.tensor(np.ones((1, 2, 3, 3), np.float32)))
    tm.train()
    with pytest.raises(mo.ExportError, match="training mode"):
        mo.export(tm, tmp_path / "m.onnx")


def test_not_a_traced_module():
    with pytest.raises(TypeError, match="export takes a TracedModule"):
        mo.export(M.Linear(2, 2), io.BytesIO())


def test_coverage_table_lists_every_rule():
    table = mo.coverage()
    from mgtrace.onnx.mapping import RULES
    from mgtrace.onnx._quant import TABLES
    assert table.count("\n") == len(RULES) + sum(map(len, TABLES.values())) + 1
    assert "| module | `quantized.Conv2d` | QuantizeLinear, DequantizeLinear, Conv" in table
    assert "| op | `conv2d` | Conv | 13 |" in table
    assert "| op | `bitwise_and` | BitwiseAnd | 18 |" in table
    assert "| module | `BatchNorm2d` | BatchNormalization |" in table


def test_coverage_doc_is_generated_from_the_table():
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[2] / "scripts" / "onnx_coverage.py"
    spec = importlib.util.spec_from_file_location("onnx_coverage", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.DOC.read_text(encoding="utf-8") == mod.text(), \
        "docs/onnx_coverage.md is out of date: python scripts/onnx_coverage.py"


@pytest.mark.parametrize("kw, err, msg", [
    ({"input_names": ["a", "b"]}, ValueError, "input_names has 2 names, but the graph has 1"),
    ({"input_names": ["a"], "output_names": ["a"]}, ValueError, "the name 'a' is given twice"),
    ({"input_names": [3]}, TypeError, "input_names holds names \\(non-empty str\\), got 3"),
    ({"output_names": "y"}, TypeError, "output_names must be a list of str"),
])
def test_bad_input_and_output_names_are_refused_and_nothing_is_written(tmp_path, kw, err, msg):
    tm = _trace(lambda self, x: x * 2.0, (1, 3))
    path = tmp_path / "m.onnx"
    with pytest.raises(err, match="export: " + msg):
        mo.export(tm, str(path), **kw)
    assert not path.exists()
    # one name for one input is fine, and the model computes x * 2
    mo.export(tm, str(path), input_names=["a"], output_names=["b"])
    got = run_ort(onnx.load(str(path)), [np.array([[1.0, -2.0, 3.5]], np.float32)])
    np.testing.assert_array_equal(got[0], np.array([[2.0, -4.0, 7.0]], np.float32))


def test_example_inputs_of_another_dtype_or_rank_are_export_errors(tmp_path):
    tm = _trace(lambda self, x: x * 2, (2, 3))
    with pytest.raises(mo.ExportError, match=r"example input 0 \('x'\) is int32, but the graph "
                                             r"was traced with float32 there"):
        mo.export(tm, tmp_path / "m.onnx", example_inputs=(np.ones((2, 3), np.int32),))
    with pytest.raises(mo.ExportError, match=r"example input 0 \('x'\) has 1 axes"):
        mo.export(tm, tmp_path / "m.onnx", example_inputs=(np.ones(3, np.float32),))
    with pytest.raises(mo.ExportError, match="example_inputs has 2 arrays, but the graph has 1"):
        mo.export(tm, tmp_path / "m.onnx", example_inputs=(np.ones((2, 3), np.float32),) * 2)
    assert list(tmp_path.iterdir()) == []


def test_every_builtin_module_has_a_row():
    """Each builtin module type of mgtrace.module (float, QAT, quantized)
    has an export row (or a row saying why not): a new builtin without one
    fails here, not in a user's export. Observers and fake quantizers run
    inside QAT modules and are read through them."""
    from mgtrace.module.builtin import builtin_types
    from mgtrace.onnx import _quant, mapping
    missing = []
    for name in builtin_types():
        prefix, _, cls = name.rpartition(".")
        if prefix == "mgtrace.module":
            ok = mapping.rule_for("module", cls) is not None
        elif prefix in _quant.TABLES:
            ok = cls in _quant.TABLES[prefix]
        else:
            ok = not prefix.startswith("mgtrace.module")
        if not ok:
            missing.append(name)
    assert missing == []


@pytest.mark.parametrize("kw, err, msg", [
    ({"quant_format": "QDQ"}, mo.ExportError, r"got 'QDQ'\. Did you mean 'qdq'"),
    ({"quant_format": "qoperater"}, mo.ExportError, "Did you mean 'qoperator'"),
    ({"dynamic": "no"}, TypeError, "dynamic must be True or False, got 'no'"),
    ({"example_inputs": np.ones((1, 4), np.float32)}, TypeError, r"pass \(x,\)"),
])
def test_bad_export_arguments_are_named_and_nothing_is_written(tmp_path, kw, err, msg):
    # quant_format typos were a bare ValueError without a hint; dynamic="no" was
    # taken as True; one array as example_inputs was iterated into its rows
    tm = _trace(lambda self, x: self.lin(x), (1, 4))
    with pytest.raises(err, match=msg):
        mo.export(tm, tmp_path / "m.onnx", **kw)
    assert list(tmp_path.iterdir()) == []


def test_export_to_an_empty_path_or_a_folder_names_it(tmp_path, monkeypatch):
    # "" renamed the temporary file over the working folder: IsADirectoryError
    # naming the temporary file
    monkeypatch.chdir(tmp_path)
    tm = _trace(lambda self, x: self.lin(x), (1, 4))
    with pytest.raises(FileNotFoundError, match="empty path; give a file name such as "
                                                "model.onnx"):
        mo.export(tm, "")
    (tmp_path / "d").mkdir()
    with pytest.raises(IsADirectoryError, match="model.onnx"):
        mo.export(tm, tmp_path / "d")
    assert [p.name for p in tmp_path.iterdir()] == ["d"]
    assert list((tmp_path / "d").iterdir()) == []


def test_an_output_name_taken_by_an_initializer_is_refused(tmp_path):
    # output_names=["lin.weight"] wrote an output named "lin.weight_2"
    tm = _trace(lambda self, x: self.lin(x), (1, 4))
    with pytest.raises(mo.ExportError, match=r"output_names\[0\] 'lin.weight' is already"):
        mo.export(tm, tmp_path / "m.onnx", output_names=["lin.weight"])
    assert list(tmp_path.iterdir()) == []


def test_example_inputs_the_model_refuses_are_an_export_error(tmp_path):
    # the Linear's ValueError about 5 features leaked as a bare ValueError
    tm = _trace(lambda self, x: self.lin(x), (1, 4))
    with pytest.raises(mo.ExportError, match="does not run on example_inputs.*5 features"):
        mo.export(tm, tmp_path / "m.onnx", example_inputs=(np.ones((1, 5), np.float32),))
    assert list(tmp_path.iterdir()) == []
