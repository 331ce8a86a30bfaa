"""Every script in examples/ runs as a user would run it (small inputs), in
order, in one folder: trace and save, load and run in a fresh process, edit,
re-trace the folder, export to NumPy. Their outputs are checked."""
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EX = os.path.join(ROOT, "examples")


def run(script, *args, cwd):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, os.path.join(EX, script), *args], cwd=cwd, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, f"{script} failed:\n{p.stdout}\n{p.stderr}"
    return p.stdout


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    d = tmp_path_factory.mktemp("examples")
    out = run("trace_and_save.py", "--size", "32", cwd=d)
    assert "max |traced - eager| = 0.0" in out
    return d


def test_load_and_run_in_a_fresh_process(folder):
    out = run("load_and_run.py", "resnet18.tmod", cwd=folder)
    assert "max |run - stored| = 0.0" in out
    assert "batch of 2 -> (2, 1000)" in out


def test_edit_graph(folder):
    out = run("edit_graph.py", "resnet18.tmod", "--out", "edited.tmod", cwd=folder)
    assert "fused 20 conv+bn pairs" in out
    change = float(out.split("max |change| = ")[1].split()[0])
    assert change < 1e-4
    assert "swapped 17 ReLU calls" in out and "(dropped 40 modules)" in out
    assert "output (1, 128, 4, 4)" in out
    original = (folder / "resnet18.tmod").stat().st_size
    assert (folder / "edited.tmod").stat().st_size < 1.01 * original      # no dead weights
    assert (folder / "edited_cut.tmod").stat().st_size < 0.2 * original
    assert (folder / "edited_relu6.tmod").exists()


def test_retrace_folder(folder, tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    (models / "a.tmod").write_bytes((folder / "resnet18.tmod").read_bytes())
    (models / "broken.tmod").write_bytes(b"not an archive")
    p = subprocess.run([sys.executable, os.path.join(EX, "retrace_folder.py"), str(models),
                        "--out", str(tmp_path / "new")], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=ROOT), timeout=300)
    assert p.returncode == 1                      # one bad archive: reported, not fatal
    assert "1 re-traced, 1 failed" in p.stdout
    assert (tmp_path / "new" / "a.tmod").exists()
    assert not (tmp_path / "new" / "broken.tmod").exists()


def test_export_numpy(folder):
    out = run("export_numpy.py", "resnet18.tmod", "--out", "o.npz", cwd=folder)
    assert "wrote o.npz" in out
    data = np.load(folder / "o.npz")
    assert data["output"].shape == (1, 1000)
    assert data["ResNet.layer4.[out]"].shape == (1, 512, 1, 1)
