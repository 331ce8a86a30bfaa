"""schema/golden/: every archive written by every format version still loads
and gives its expected values and outputs, forever; golden files of a
released format are never rewritten (manifest.json holds their hashes).

Each folder's make_golden.py is imported before its archives load (it
registers the user functions they call). A value archive is compared with
``expected(name)`` bit for bit; a model's stored example inputs are run and
compared with its stored outputs: integer and bool outputs exactly, float
outputs within a bound in ULPs of each output's scale (its largest
magnitude), stated per op family in :data:`ULPS` (kernels may change their
rounding between releases, never their results). The loaded archive saved
again at its own version (``mt.save(load_archive(f), out,
target_version=archive.format_version)``) must give the committed bytes,
and the loaded model saved again loads and gives the same outputs."""
import hashlib
import importlib.util
import io
import json
import pathlib
import re
import sys

import ml_dtypes
import numpy as np
import pytest

import mgtrace as mt

from .helpers import assert_same

GOLDEN = pathlib.Path(__file__).resolve().parents[2] / "schema" / "golden"
ARCHIVES = sorted(GOLDEN.glob("*/*.tmod"))


def _script(folder):
    """The folder's make_golden.py, imported once under the name the makers
    import each other by (it registers the user functions its archives call)."""
    name = f"golden_{folder.name.replace('.', '_')}"
    mod = sys.modules.get(name)
    if mod is None:
        spec = importlib.util.spec_from_file_location(name, folder / "make_golden.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return mod


# Float bounds per op family, in ULPs of the output's scale: |got - want| <=
# ULPS * eps(dtype) * max|want| for each output tensor (float32's eps is
# 2**-23, so 1 ULP of scale is 1.2e-7 of the largest magnitude; float16's
# 2**-10, bfloat16's 2**-7). Today's kernels give the stored outputs exactly
# on the machine that wrote them; the bounds leave room for another
# summation order (threads, SIMD width, a conv algorithm: Winograd against
# im2col) and another libm. The old bound was 1e-5 relative per element.
ULPS = {
    "elementwise": 4,      # one rounding of a libm function or two of arithmetic
    "reduction": 32,       # sums and norms over a few hundred terms, any order
    "model": 64,           # convolutions, matmuls, attention and their chains
}
# the family of each output: by the functional archives' output key, else "model"
ELEMENTWISE = {"abs", "ceil", "cos", "erf", "exp", "expm1", "floor", "neg", "relu", "relu6",
               "round", "sigmoid", "sign", "silu", "sin", "softplus", "square", "tan", "tanh",
               "trunc", "hardsigmoid", "hardswish", "gelu", "log", "log1p", "log2", "rsqrt",
               "sqrt", "acos", "asin", "atan", "add", "sub", "mul", "div", "maximum", "minimum",
               "atan2", "pow", "floor_div", "mod", "clip", "where", "leaky_relu", "gelu_tanh",
               "reshape", "transpose", "flatten", "expand_dims", "squeeze", "broadcast_to",
               "concat", "stack", "split", "repeat", "tile", "pad", "gather", "scatter",
               "astype", "copy", "zeros_like", "ones_like", "full_like", "zeros", "ones",
               "full", "eye", "arange", "linspace", "max_pool2d", "adaptive_max_pool2d",
               "sort", "topk", "embedding", "dropout", "to_nchwc", "max", "min"}
REDUCTION = {"sum", "mean", "prod", "std", "var", "norm", "normalize", "softmax",
             "log_softmax", "cumsum", "dot", "avg_pool2d", "adaptive_avg_pool2d",
             "interpolate", "batch_norm", "layer_norm", "group_norm", "matinv",
             "warp_perspective"}


def _family(path):
    """The op family of the output at ``path`` (``"outputs['exp']"``): its last key's."""
    keys = re.findall(r"\['([a-z0-9_]+)'\]", path)
    if keys and keys[-1] in ELEMENTWISE:
        return "elementwise"
    if keys and keys[-1] in REDUCTION:
        return "reduction"
    return "model"


def _ulps(got, want):
    """max |got - want| in ULPs of want's scale (float64 arithmetic); NaNs
    and infinities must stay where they are."""
    # float64 outputs of the golden models are float32 results cast: float32's ULPs
    eps = 2.0 ** -7 if want.dtype == ml_dtypes.bfloat16 else \
        float(max(np.finfo(want.dtype).eps, np.finfo(np.float32).eps))
    g, w = got.astype(np.float64), want.astype(np.float64)
    same = (g == w) | (np.isnan(g) & np.isnan(w))
    if same.all():
        return 0.0
    finite = np.isfinite(w)
    if not (np.isfinite(g) == finite).all():
        return float("inf")
    scale = float(np.max(np.abs(w[finite]), initial=0.0)) or 1e-300
    return float(np.max(np.abs(g - w)[~same])) / (eps * scale)


def _assert_close(got, want, path="outputs"):
    """Same structure (namedtuples by name and fields), same dtypes and
    shapes, ints and bools exactly, floats within their family's ULPS."""
    if isinstance(want, mt.Tensor):
        assert isinstance(got, mt.Tensor), f"{path}: {type(got).__name__}"
        assert got.dtype == want.dtype and got.shape == want.shape, path
        g, w = got.numpy(), want.numpy()
        if w.dtype.kind in "biu":
            np.testing.assert_array_equal(g, w, err_msg=path)
        else:
            family = _family(path)
            ulps = _ulps(g, w)
            assert ulps <= ULPS[family], (f"{path}: {ulps:.1f} ULPs of its scale from the "
                                         f"stored output, above the {family} bound "
                                         f"{ULPS[family]}")
    elif isinstance(want, tuple) and hasattr(want, "_fields"):
        assert type(got).__name__ == type(want).__name__ and got._fields == want._fields, path
        for f in want._fields:
            _assert_close(getattr(got, f), getattr(want, f), f"{path}.{f}")
    elif isinstance(want, (list, tuple)):
        assert type(got) is type(want) and len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want)):
            _assert_close(g, w, f"{path}[{i}]")
    elif isinstance(want, dict):
        assert type(got) is type(want) and list(got) == list(want), path
        for k in want:
            _assert_close(got[k], want[k], f"{path}[{k!r}]")
    else:
        assert type(got) is type(want) and got == want, f"{path}: {got!r} != {want!r}"


def test_every_version_folder_has_archives_a_script_and_a_manifest():
    folders = [p for p in GOLDEN.iterdir() if p.is_dir() and re.fullmatch(r"\d+\.\d+", p.name)]
    assert [p.name for p in folders] == ["1.0"] or len(folders) > 1
    for folder in folders:
        manifest = json.loads((folder / "manifest.json").read_text())
        assert sorted(manifest) == sorted(p.name for p in folder.glob("*.tmod"))
        assert (folder / "make_golden.py").exists()


@pytest.mark.parametrize("path", ARCHIVES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_golden_archive_is_unchanged(path):
    manifest = json.loads((path.parent / "manifest.json").read_text())
    digest = "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
    assert digest == manifest[path.name], (
        f"{path} differs from its manifest entry: golden archives of a released format never "
        "change; those of the format in development change only through their maker "
        f"(`python schema/golden/{path.parent.name}/make_golden.py`, which writes both)")


@pytest.mark.parametrize("mmap", [False, True])
@pytest.mark.parametrize("path", ARCHIVES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_golden_archive_loads_and_gives_its_outputs(path, mmap):
    script = _script(path.parent)
    archive = mt.serialization.load_archive(path, mmap=mmap)
    if archive.example_inputs is not None:
        _assert_close(archive.obj(*archive.example_inputs, **archive.example_kwargs),
                      archive.example_outputs)
    else:       # modules as plain data, through the maker's describe()
        describe = getattr(script, "describe", lambda obj: obj)
        assert_same(describe(archive.obj), script.expected(path.name))


VALUES = ("tensor.tmod", "state_dict.tmod", "nested.tmod", "dtypes.tmod",   # no model
          "containers.tmod", "aliased_values.tmod", "quantized_values.tmod")


@pytest.mark.parametrize("path", [p for p in ARCHIVES if p.name not in VALUES],
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_golden_model_saved_again_loads_and_gives_its_outputs(path):
    _script(path.parent)
    archive = mt.serialization.load_archive(path)
    buf = io.BytesIO()
    mt.save(archive.obj, buf)
    buf.seek(0)
    again = mt.load(buf)
    _assert_close(again(*archive.example_inputs, **archive.example_kwargs),
                  archive.example_outputs)


@pytest.mark.parametrize("path", ARCHIVES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_golden_archive_saved_again_at_its_version_is_byte_identical(path):
    """StableHLO's check: what a reader loads, a writer targeting the same
    version writes again, byte for byte (examples, metadata and the
    producer kept as stored), for every format: the config keys builtin
    types gained after 1.0's archives were written are left out again at
    1.0 (builtin_modules.ADDED_KEYS)."""
    from .helpers import split
    _script(path.parent)
    archive = mt.serialization.load_archive(path)
    buf = io.BytesIO()
    mt.save(archive, buf, target_version=archive.format_version)
    again, want = buf.getvalue(), path.read_bytes()
    if again == want:
        return
    (h1, d1), (h2, d2) = split(again), split(want)
    keys = [k for k in h2 if h1.get(k) != h2.get(k)] + [k for k in h1 if k not in h2]
    pytest.fail(f"{path.parent.name}/{path.name} saved again at "
                f"{'.'.join(map(str, archive.format_version))} differs from the committed "
                f"file: header fields {keys}, data {'same' if d1 == d2 else 'differs'}")


def test_a_gather_or_scatter_apply_expr_needs_a_1_2_reader():
    """Release 0.2.0's apply() gave gather's and scatter's kernels the index
    where they take axis: an archive with their Apply exprs is 1.2 and a 1.1
    target refuses it, naming the op (the other core ops: 1.1/core_ops.tmod)."""
    path = GOLDEN / "1.2" / "core_ops_index.tmod"
    _script(path.parent)
    archive = mt.serialization.load_archive(path)
    assert archive.format_version == archive.min_reader_version == (1, 2)
    with pytest.raises(ValueError, match="core op 'gather'.*needs archive format 1.2"):
        mt.save(archive.obj, io.BytesIO(), target_version=(1, 1))


def test_an_apply_expr_of_a_core_op_new_in_1_2_needs_a_1_2_reader():
    """conv3d, conv_transpose3d, lstm_cell and rnn_cell are core ops since 1.2
    (issue 36's kernels): an archive with their Apply exprs is 1.2 and a 1.1
    target refuses it, naming the first."""
    path = GOLDEN / "1.2" / "core_ops_kernels.tmod"
    _script(path.parent)
    archive = mt.serialization.load_archive(path)
    assert archive.format_version == archive.min_reader_version == (1, 2)
    with pytest.raises(ValueError, match="core op 'conv3d' \\(readers before it have no such core "
                                         "op\\).*needs archive format 1.2"):
        mt.save(archive.obj, io.BytesIO(), target_version=(1, 1))
