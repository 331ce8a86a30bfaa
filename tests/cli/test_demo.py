"""`mgtrace demo`, README's main job, runs in a subprocess and checks itself."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_demo_quick(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT)
    p = subprocess.run([sys.executable, "-m", "mgtrace", "demo", "--quick", "--out", str(tmp_path)],
                       capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "OK: every max error is within 0.0001" in p.stdout
    for name in ("resnet18", "minilm_l6_v2"):
        assert (tmp_path / f"{name}.tmod").stat().st_size > 1_000_000
        row = next(line for line in p.stdout.splitlines() if line.startswith(name))
        errs = [float(v) for v in row.split()[-2:]]
        assert max(errs) <= 1e-4
    assert not list(tmp_path.glob("*.npy"))            # scratch files are removed
    assert "the best of 5 calls; other work on the machine slows every timing" in p.stdout
