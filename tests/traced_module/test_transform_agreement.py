"""Every transformation gives the eager answer (the project's first promise):
trace_module, optimize (default, "all", flattened), save/load (copy and
mmap), copy.deepcopy and to_folder, each compared with eager on values,
dtypes, shapes and devices. One test per construct that once broke
silently, each with the smallest model that showed it."""
import copy
import importlib
import io
import sys

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.module as M
from mgtrace.traced_module import optimize


def _load(tm, **kw):
    buf = io.BytesIO()
    mt.save(tm, buf)
    return mt.load(io.BytesIO(buf.getvalue()), **kw)


def _load_mmap(tm, path):
    mt.save(tm, path)
    return mt.load(path, mmap=True)


def _to_folder(tm, path):
    folder = path / f"pkg_{abs(hash(str(path))) % 10**8}"
    tm.to_folder(folder, "Net")
    sys.path.insert(0, str(folder.parent))
    try:
        importlib.invalidate_caches()
        return importlib.import_module(folder.name).Net()
    finally:
        sys.path.remove(str(folder.parent))


def variants(tm, tmp_path):
    """name -> a module derived from the trace ``tm``, each way a user gets one."""
    return {
        "traced": tm,
        "optimize": optimize(tm),
        "optimize_all": optimize(tm, "all"),
        "optimize_all_flat": optimize(tm, "all", flatten=True),
        "load_copy": _load(tm),
        "load_mmap": _load_mmap(tm, tmp_path / "m.tmod"),
        "deepcopy": copy.deepcopy(tm),
        "optimized_loaded": _load(optimize(tm, "all", flatten=True)),
        "to_folder": _to_folder(tm, tmp_path),
    }


def leaves(out):
    """The tensors and plain values of a nested output, in order."""
    if isinstance(out, dict):
        return [v for k in out for v in leaves(out[k])]
    if isinstance(out, (list, tuple)):
        return [v for o in out for v in leaves(o)]
    return [out]


def assert_same(got, want, where):
    """Bitwise: the same kernels run in every variant."""
    assert type(got) is type(want), where
    g, w = leaves(got), leaves(want)
    assert len(g) == len(w), where
    for i, (a, b) in enumerate(zip(g, w)):
        if isinstance(b, mt.Tensor):
            assert isinstance(a, mt.Tensor), f"{where}[{i}]"
            assert (a.dtype, a.shape, str(a.device)) == (b.dtype, b.shape, str(b.device)), \
                f"{where}[{i}]: {a.dtype} {a.shape} {a.device} != {b.dtype} {b.shape} {b.device}"
            np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=f"{where}[{i}]")
        else:
            assert a == b, f"{where}[{i}]"


def assert_all_agree(make, inputs, tmp_path, run_inputs=None):
    """Every variant of ``trace_module(make(), *inputs)`` gives what
    ``make()`` gives eagerly on ``run_inputs`` (default ``inputs``)."""
    run_inputs = inputs if run_inputs is None else run_inputs
    want = make()(*run_inputs())
    tm = mt.trace_module(make(), *inputs())
    for name, m in variants(tm, tmp_path).items():
        assert_same(m(*run_inputs()), want, name)


# ------------------------------------------------------------ device moves
class _Move(M.Module):
    def forward(self, x):
        return x.to("cpu:1") * 2, x.to(mt.Device("cpu:1")).to("cpu") + 1


def _x():
    return (mt.tensor(np.arange(6, dtype=np.float32).reshape(2, 3)),)


def test_a_move_to_another_device_is_recorded_with_its_device(tmp_path):
    """x.to("cpu:1") was recorded as astype("float32") (the host copy it
    makes), so every transformation answered on cpu:0."""
    tm = mt.trace_module(_Move(), *_x())
    calls = [(e.method, tuple(e.args[1:])) for e in tm.graph.exprs() if getattr(e, "method", None) == "to"]
    assert calls == [("to", ("cpu:1",)), ("to", ("cpu:1",)), ("to", ("cpu:0",))]
    a, b = _Move()(*_x())
    assert str(a.device) == "cpu:1" and str(b.device) == "cpu:0"
    assert_all_agree(_Move, _x, tmp_path)


def test_a_move_to_the_tensors_own_device_records_nothing():
    class Net(M.Module):
        def forward(self, x):
            return x.to("cpu:0") + 1

    tm = mt.trace_module(Net(), *_x())
    assert not [e for e in tm.graph.exprs() if getattr(e, "method", None) in ("to", "astype")]
