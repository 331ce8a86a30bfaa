"""schema/golden/: every archive written by every format version still loads
and gives its expected values and outputs, forever; golden files are never
rewritten (manifest.json holds their hashes)."""
import hashlib
import importlib.util
import json
import pathlib

import numpy as np
import pytest

import mgtrace as mt

from .helpers import assert_same

GOLDEN = pathlib.Path(__file__).resolve().parents[2] / "schema" / "golden"
ARCHIVES = sorted(GOLDEN.glob("*/*.tmod"))


def _script(folder):
    spec = importlib.util.spec_from_file_location(f"golden_{folder.name}", folder / "make_golden.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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
    archive = mt.serialization.load_archive(path, mmap=mmap)
    if archive.example_inputs is not None:
        got = archive.obj(*archive.example_inputs)
        np.testing.assert_allclose(got.numpy(), archive.example_outputs.numpy(),
                                   rtol=1e-5, atol=1e-6)
    else:
        assert_same(archive.obj, _script(path.parent).expected(path.name))
