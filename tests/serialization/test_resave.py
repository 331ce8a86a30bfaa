"""save(load_archive(f), out, target_version=v): an archive written again
as it was read (schema/golden's byte-exact check rests on it)."""
import io

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.module as M
from mgtrace.serialization import load_archive, read_header


class Counting(M.Module):
    calls = 0

    def __init__(self):
        super().__init__()
        self.fc = M.Linear(3, 2)

    def forward(self, x):
        Counting.calls += 1
        return self.fc(x) * 2.0


def _archive(producer="0.2.0"):
    mt.random.seed(3)
    x = mt.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    tm = mt.trace_module(Counting().eval(), x)
    buf = io.BytesIO()
    mt.save(tm, buf, example_inputs=(x,), metadata={"run": 7}, target_version=(1, 1))
    arc = load_archive(io.BytesIO(buf.getvalue()))
    arc.producer = {"library": "mgtrace", "version": producer}   # as if an older release wrote it
    return buf.getvalue(), arc


def test_saved_again_at_its_version_it_is_the_same_archive():
    data, arc = _archive(producer=mt.__version__)
    before = Counting.calls
    out = io.BytesIO()
    mt.save(arc, out, target_version=arc.format_version)
    assert out.getvalue() == data
    assert Counting.calls == before          # the stored outputs, not a new call


def test_the_producer_is_kept_only_at_the_archive_own_version():
    _, arc = _archive(producer="0.2.0")
    out = io.BytesIO()
    mt.save(arc, out, target_version=(1, 1))
    out.seek(0)
    h = read_header(out)
    assert h["producer"] == {"library": "mgtrace", "version": "0.2.0"}
    assert h["metadata"] == {"dict": [["run", 7]]} and "examples" in h
    for kwargs in ({}, {"target_version": (1, 2)}):     # a new archive by this writer
        out = io.BytesIO()
        mt.save(arc, out, **kwargs)
        out.seek(0)
        h = read_header(out)
        assert h["producer"] == {"library": "mgtrace", "version": mt.__version__}
        assert h["format_version"] == [1, 1]


def test_new_metadata_or_examples_for_an_archive_are_refused():
    _, arc = _archive()
    for kwargs in ({"metadata": {}}, {"example_inputs": (1,)}, {"example_kwargs": {}}):
        with pytest.raises(TypeError, match="writes the archive's own metadata and examples"):
            mt.save(arc, io.BytesIO(), **kwargs)
