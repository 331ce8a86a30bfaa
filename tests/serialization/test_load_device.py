"""load(device=...) places once on any device (cpu:1 included) and refuses
an unusable device up front; Module.to refuses one before moving anything."""
import io

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.module as M
from mgtrace.errors import DeviceUnavailable


def _saved(obj):
    buf = io.BytesIO()
    mt.save(obj, buf)
    return buf.getvalue()


def test_load_onto_a_logical_cpu_places_every_tensor_there():
    m = M.Sequential(M.Linear(3, 2), M.BatchNorm1d(2))
    x = mt.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    tm = mt.trace_module(m.eval(), x)
    got = mt.load(io.BytesIO(_saved(tm)), device="cpu:1")
    state = got.state_dict()
    assert state and all(t.device == mt.Device("cpu:1") for t in state.values())
    np.testing.assert_allclose(got(x.to("cpu:1")).numpy(), tm(x).numpy(), rtol=1e-6)
    plain = mt.load(io.BytesIO(_saved(tm)))          # no device: where it was saved from
    assert all(t.device == mt.Device("cpu") for t in plain.state_dict().values())


def test_load_onto_an_unusable_device_is_refused_before_decoding():
    if mt.cuda_available():
        pytest.skip("a GPU is present")
    with pytest.raises(DeviceUnavailable, match=r"^device cuda:0 is not available: "):
        mt.load(io.BytesIO(b"not an archive at all"), device="cuda:0")


def test_module_to_an_unusable_device_moves_nothing():
    if mt.cuda_available():
        pytest.skip("a GPU is present")
    m = M.Linear(3, 2)
    w = m.weight
    with pytest.raises(DeviceUnavailable):
        m.to("cuda:0")
    assert m.weight is w and w.device == mt.Device("cpu")
    with pytest.raises(NotImplementedError):        # DeviceUnavailable is one too
        M.Module().to("cuda:0")
