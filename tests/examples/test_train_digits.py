"""examples/train_digits.py as a user runs it: train a traced CNN on
scikit-learn's bundled digits to >= 97% held-out accuracy, load the saved
archive in a fresh process (same accuracy), resume training from it (the
loss keeps falling)."""
import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("sklearn")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "examples", "train_digits.py")


def run(*args, cwd):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, SCRIPT, *args], cwd=cwd, env=env, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, f"train_digits.py {' '.join(args)} failed:\n{p.stdout}\n{p.stderr}"
    return p.stdout


def number(pattern, text):
    return float(re.search(pattern, text).group(1))


def test_train_save_load_resume(tmp_path):
    out = run("train", "--out", "digits.tmod", cwd=tmp_path)
    acc = number(r"held-out accuracy (\d\.\d+)", out)
    assert acc >= 0.97, out
    losses = [float(v) for v in re.findall(r"train loss (\d+\.\d+)", out)]
    assert losses[-1] < losses[0] / 5, out

    out = run("eval", "digits.tmod", cwd=tmp_path)          # a fresh process
    assert number(r"held-out accuracy (\d\.\d+)", out) == acc

    out = run("resume", "digits.tmod", "--out", "digits2.tmod", "--epochs", "2", cwd=tmp_path)
    before = number(r"train loss before resuming (\d+\.\d+)", out)
    after = number(r"train loss after resuming (\d+\.\d+)", out)
    assert after < before, out
