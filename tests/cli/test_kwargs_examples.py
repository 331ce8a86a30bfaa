"""Archives whose example call has keyword arguments verify and re-trace."""
import numpy as np

import mgtrace as mt
import mgtrace.module as M

from .conftest import cli


class Scaled(M.Module):
    def __init__(self):
        super().__init__()
        self.fc = M.Linear(3, 2)

    def forward(self, x, scale=2):
        return self.fc(x) * scale


def test_verify_and_retrace_use_the_stored_keywords(tmp_path):
    x = mt.tensor(np.random.default_rng(0).random((2, 3), np.float32))
    tm = mt.trace_module(Scaled(), x, scale=3)
    (tmp_path / "in").mkdir()
    mt.save(tm, tmp_path / "in" / "s.tmod", example_inputs=(x,), example_kwargs={"scale": 3})
    assert cli("verify", tmp_path / "in").returncode == 0
    p = cli("retrace", tmp_path / "in", "-o", tmp_path / "out")
    assert p.returncode == 0, p.stdout + p.stderr
    arc = mt.serialization.load_archive(tmp_path / "out" / "s.tmod")
    assert arc.example_kwargs == {"scale": 3}
    np.testing.assert_array_equal(arc.obj(x, scale=3).numpy(), tm(x, scale=3).numpy())
