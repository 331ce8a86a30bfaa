"""The benchmarks run the mgtrace that is built: this checkout when it is
built in place, else the installed one, never the uncompiled sources (after a
plain `pip install .` the child processes used to import those and fail)."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

PROBE = """
import subprocess, sys
sys.path.insert(0, {bench!r})
import _checkout
print(_checkout.which())
child = subprocess.run([sys.executable, "-c", "import mgtrace; print(mgtrace.__file__)"],
                       cwd=_checkout.CHILD_CWD, capture_output=True, text=True)
print(child.stdout.strip() or child.stderr.strip().splitlines()[-1])
"""


def _fake_checkout(tmp_path, built):
    """A repository folder with the benchmarks and an mgtrace that is only sources."""
    root = tmp_path / "repo"
    (root / "benchmarks").mkdir(parents=True)
    shutil.copy(REPO / "benchmarks/_checkout.py", root / "benchmarks")
    (root / "mgtrace/_core").mkdir(parents=True)
    (root / "mgtrace/__init__.py").write_text(
        "__version__ = 'sources'\nraise ImportError('the uncompiled source tree')\n")
    if built:       # what build_ext --inplace leaves beside the sources
        import importlib.machinery
        suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
        (root / f"mgtrace/_core/tensor{suffix}").write_bytes(b"")
    return root


def _probe(root):
    # the "installed" mgtrace is this repository's, on PYTHONPATH as an installed one is on sys.path;
    # the run starts in the repository folder, as `python benchmarks/bench_models.py` does
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), str(REPO)]))
    p = subprocess.run([sys.executable, "-c", PROBE.format(bench=str(root / "benchmarks"))],
                       cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return p.stdout.splitlines()


def test_an_unbuilt_checkout_runs_the_installed_mgtrace(tmp_path):
    root = _fake_checkout(tmp_path, built=False)
    which, child = _probe(root)
    assert which.endswith(f"(installed at {REPO})"), which
    assert child == str(REPO / "mgtrace/__init__.py")        # not the sources in root


def test_a_checkout_built_in_place_runs_itself(tmp_path):
    root = _fake_checkout(tmp_path, built=True)
    p = subprocess.run([sys.executable, "-c", PROBE.format(bench=str(root / "benchmarks"))],
                       cwd=root, env=dict(os.environ, PYTHONPATH=str(REPO)),
                       capture_output=True, text=True, timeout=120)
    # the fake checkout's mgtrace is first: importing it fails with its own message
    assert "the uncompiled source tree" in p.stdout + p.stderr


def test_the_real_checkout_is_built_in_place():
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import _checkout
        assert _checkout.ROOT == str(REPO)
        assert _checkout.is_built() == any((REPO / "mgtrace/_core").glob("tensor.*.so"))
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
