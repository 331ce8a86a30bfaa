"""`mgtrace export --format onnx` on the batch engine, and `mgtrace import`."""
import io
import json

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="needs onnx (pip install 'mgtrace[onnx]')")
pytest.importorskip("onnxruntime", reason="needs onnxruntime (pip install 'mgtrace[onnx]')")

import mgtrace as mt  # noqa: E402
from mgtrace.cli import main  # noqa: E402
from mgtrace.onnx.exporter import run_ort  # noqa: E402

from .conftest import digests  # noqa: E402


def _run(*argv):
    out = io.StringIO()
    return main([str(a) for a in argv], out=out), out.getvalue()


def test_export_folder_keeps_going_writes_checked_files_and_resumes(tree, tmp_path):
    out, report = tmp_path / "onnx", tmp_path / "r.json"
    before = digests(tree)
    rc, text = _run("export", tree / "good", tree / "bad", tree / "noex", "-o", out,
                    "--format", "onnx", "--report", report)
    assert rc == 1, text                               # the bad archives fail
    recs = {r["path"].split("archives/")[-1]: r for r in json.loads(report.read_text())["records"]}
    assert recs["good/net0.tmod"]["status"] == "ok"
    assert recs["good/state.tmod"]["status"] == "skipped"
    assert recs["bad/corrupt.tmod"]["status"] == "failed"
    # stored outputs off by 1e-3: ONNX Runtime does not reproduce them, nothing written
    assert "does not reproduce the stored outputs" in recs["bad/mismatch.tmod"]["reason"]
    assert not (out / "mismatch.onnx").exists()
    assert digests(tree) == before                     # the inputs are never touched
    model = onnx.load(str(out / "net0.onnx"))
    onnx.checker.check_model(model, full_check=True)
    arc = mt.serialization.load_archive(tree / "good/net0.tmod")
    x = arc.example_inputs[0].numpy()
    np.testing.assert_allclose(run_ort(model, [x])[0], arc.example_outputs.numpy(),
                               rtol=1e-5, atol=1e-6)
    assert (out / "sub/net2.onnx").exists() and (out / "noex.onnx").exists()
    rc, text = _run("export", tree / "good", tree / "bad", tree / "noex", "-o", out,
                    "--format", "onnx", "--report", report)
    assert "skipped (ok in an earlier run" in text


def test_a_failed_export_never_replaces_an_existing_output(tree, tmp_path):
    out = tmp_path / "onnx"
    out.mkdir()
    (out / "mismatch.onnx").write_bytes(b"the old file")
    rc, text = _run("export", tree / "bad/mismatch.tmod", "-o", out, "--format", "onnx")
    assert rc == 1 and "FAILED" in text
    assert (out / "mismatch.onnx").read_bytes() == b"the old file"
    assert [p.name for p in out.iterdir()] == ["mismatch.onnx"]     # no temporary left


def test_export_opset_option_and_usage_errors(tree, tmp_path):
    rc, text = _run("export", tree / "good/net0.tmod", "-o", tmp_path, "--format", "onnx",
                    "--opset", "13")
    assert rc == 0, text
    assert onnx.load(str(tmp_path / "net0.onnx")).opset_import[0].version == 13
    assert _run("export", tree / "good/net0.tmod", "-o", tmp_path, "--format", "onnx",
                "--opset", "9")[0] == 2
    assert _run("export", tree / "good/net0.tmod", "-o", tmp_path)[0] == 2     # no --format


def test_import_writes_a_verified_archive(tree, tmp_path):
    _run("export", tree / "good/net0.tmod", "-o", tmp_path, "--format", "onnx")
    rc, text = _run("import", tmp_path / "net0.onnx", "-o", tmp_path / "back.tmod")
    assert rc == 0, text
    arc = mt.serialization.load_archive(tmp_path / "back.tmod")
    src = mt.serialization.load_archive(tree / "good/net0.tmod")
    x = src.example_inputs[0]
    np.testing.assert_allclose(arc.obj(x).numpy(), src.obj(x).numpy(), rtol=1e-5, atol=1e-6)
    rc, text = _run("verify", tmp_path / "back.tmod")
    assert rc == 0, text


def test_import_of_a_broken_file_writes_nothing(tmp_path):
    (tmp_path / "bad.onnx").write_bytes(b"\x08\x07garbage\xff\xff\xff\xff")
    rc, text = _run("import", tmp_path / "bad.onnx", "-o", tmp_path / "x.tmod")
    assert rc == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.onnx"]


def test_export_contrib_ops_option(tmp_path):
    from mgtrace.models import mobilenet_v2
    from mgtrace.traced_module.passes import optimize
    rng = np.random.default_rng(31)
    x = mt.tensor(rng.standard_normal((1, 3, 32, 32)).astype(np.float32))
    tm = optimize(mt.trace_module(mobilenet_v2(num_classes=10).eval(), x), "all", flatten=True)
    mt.save(tm, tmp_path / "m.tmod", example_inputs=(x,))
    for flag, out in (([], tmp_path / "plain"), (["--contrib-ops"], tmp_path / "fused")):
        rc, text = _run("export", tmp_path / "m.tmod", "-o", out, "--format", "onnx", *flag)
        assert rc == 0, text                # checked in ONNX Runtime against the stored outputs
    fused = onnx.load(str(tmp_path / "fused/m.onnx"))
    assert any(n.domain == "com.microsoft" and n.op_type == "FusedConv" for n in fused.graph.node)
    assert not any(n.domain for n in onnx.load(str(tmp_path / "plain/m.onnx")).graph.node)


def test_export_of_quantized_and_qat_archives(tmp_path):
    """Archives of a quantized and a QAT model (with stored examples) export
    as QDQ files that ONNX Runtime runs to the stored outputs."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "onnx"))
    from test_export_quantized import _net
    qat, qnet = _net("per_channel_quint8")
    x = mt.tensor(np.random.default_rng(7).standard_normal((2, 3, 8, 8)).astype(np.float32))
    src = tmp_path / "models"
    src.mkdir()
    for name, net in (("q", qnet), ("qat", qat)):
        mt.save(mt.trace_module(net, x), src / f"{name}.tmod", example_inputs=(x,))
    rc, text = _run("export", src, "-o", tmp_path / "out", "--format", "onnx")
    assert rc == 0, text
    rc, text = _run("export", src / "q.tmod", "-o", tmp_path / "qop", "--format", "onnx",
                    "--quant-format", "qoperator")
    assert rc == 0, text
    ops = {n.op_type for n in onnx.load(str(tmp_path / "qop" / "q.onnx")).graph.node}
    assert "QLinearConv" in ops and "Conv" not in ops
    for name, net in (("q", qnet), ("qat", qat)):
        model = onnx.load(str(tmp_path / "out" / f"{name}.onnx"))
        assert "QuantizeLinear" in {n.op_type for n in model.graph.node}
        from mgtrace.onnx.exporter import compare, output_quantum
        got, want = run_ort(model, [x.numpy()])[0], net(x).numpy()
        assert compare(got, want, quantum=output_quantum(model)) is None      # <= 1 quantum
