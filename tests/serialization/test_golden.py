"""schema/golden/: every archive written by every format version still loads
and gives its expected values and outputs, forever; golden files are never
rewritten (manifest.json holds their hashes).

Each folder's make_golden.py is imported before its archives load (it
registers the user functions they call). A model's stored example inputs
are run and compared with its stored outputs (to float tolerance: kernels
may change their rounding between releases, never their results); the
loaded model saved again loads and gives the same outputs."""
import hashlib
import importlib.util
import io
import json
import pathlib

import numpy as np
import pytest

import mgtrace as mt

from .helpers import assert_same

GOLDEN = pathlib.Path(__file__).resolve().parents[2] / "schema" / "golden"
ARCHIVES = sorted(GOLDEN.glob("*/*.tmod"))


_SCRIPTS = {}


def _script(folder):
    """The folder's make_golden.py, imported once (it registers the user
    functions its archives call)."""
    mod = _SCRIPTS.get(folder)
    if mod is None:
        spec = importlib.util.spec_from_file_location(f"golden_{folder.name.replace('.', '_')}",
                                                      folder / "make_golden.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        _SCRIPTS[folder] = mod
    return mod


def _assert_close(got, want, path="outputs"):
    """Same structure (namedtuples by name and fields), same dtypes and
    shapes, values to float tolerance (ints and bools exactly)."""
    if isinstance(want, mt.Tensor):
        assert isinstance(got, mt.Tensor), f"{path}: {type(got).__name__}"
        assert got.dtype == want.dtype and got.shape == want.shape, path
        g, w = got.numpy(), want.numpy()
        if w.dtype.kind in "biu":
            np.testing.assert_array_equal(g, w, err_msg=path)
        else:
            tol = 2e-3 if w.dtype.itemsize == 2 else 1e-5
            np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64),
                                       rtol=tol, atol=tol / 10, err_msg=path)
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
    folders = [p for p in GOLDEN.iterdir() if p.is_dir()]
    assert [p.name for p in folders] == ["1.0"] or len(folders) > 1
    for folder in folders:
        manifest = json.loads((folder / "manifest.json").read_text())
        assert sorted(manifest) == sorted(p.name for p in folder.glob("*.tmod"))
        assert (folder / "make_golden.py").exists()


@pytest.mark.parametrize("path", ARCHIVES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_golden_archive_is_unchanged(path):
    manifest = json.loads((path.parent / "manifest.json").read_text())
    digest = "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
    assert digest == manifest[path.name], f"{path} was rewritten; golden archives never change"


@pytest.mark.parametrize("mmap", [False, True])
@pytest.mark.parametrize("path", ARCHIVES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_golden_archive_loads_and_gives_its_outputs(path, mmap):
    script = _script(path.parent)
    archive = mt.serialization.load_archive(path, mmap=mmap)
    if archive.example_inputs is not None:
        _assert_close(archive.obj(*archive.example_inputs), archive.example_outputs)
    else:
        assert_same(archive.obj, script.expected(path.name))


VALUES = ("tensor.tmod", "state_dict.tmod", "nested.tmod", "aliased_values.tmod")  # no model


@pytest.mark.parametrize("path", [p for p in ARCHIVES if p.name not in VALUES],
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_golden_model_saved_again_loads_and_gives_its_outputs(path):
    _script(path.parent)
    archive = mt.serialization.load_archive(path)
    buf = io.BytesIO()
    mt.save(archive.obj, buf)
    buf.seek(0)
    again = mt.load(buf)
    _assert_close(again(*archive.example_inputs), archive.example_outputs)
