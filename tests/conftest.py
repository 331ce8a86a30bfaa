import os

import ml_dtypes
import numpy as np
import pytest

import mgtrace as mt

ALL_DTYPES = ["bool", "int8", "uint8", "int16", "uint16", "int32", "int64",
              "float16", "bfloat16", "float32", "float64"]
INT_DTYPES = ["int8", "uint8", "int16", "uint16", "int32", "int64"]
FLOAT_DTYPES = ["float16", "bfloat16", "float32", "float64"]


def np_dtype(name):
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def random_array(shape, dtype, rng, low=-20, high=20):
    """Values that every dtype holds exactly (small ints, halves)."""
    if dtype == "bool":
        return rng.random(shape) > 0.5
    if dtype.startswith("uint"):
        return rng.integers(0, high, size=shape).astype(dtype)
    if dtype.startswith("int"):
        return rng.integers(low, high, size=shape).astype(dtype)
    return (rng.integers(low * 2, high * 2, size=shape) / 2).astype(np_dtype(dtype))


def tolerance(dtype):
    """(rtol, atol) for comparing against NumPy computed in the same dtype."""
    return {"float16": (2e-3, 2e-3), "bfloat16": (1.6e-2, 1e-2),
            "float32": (2e-6, 1e-6), "float64": (1e-12, 1e-12)}.get(dtype, (0, 0))


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def assert_close(actual, expected, dtype=None, rtol=None, atol=None):
    a = actual.numpy() if isinstance(actual, mt.Tensor) else np.asarray(actual)
    e = np.asarray(expected)
    assert a.shape == e.shape, f"shape {a.shape} != {e.shape}"
    if dtype is not None:
        assert a.dtype == np_dtype(dtype), f"dtype {a.dtype} != {dtype}"
    if a.dtype.kind in "biu" and e.dtype.kind in "biu":
        np.testing.assert_array_equal(a, e)
        return
    r, t = tolerance(str(a.dtype))
    np.testing.assert_allclose(a.astype(np.float64), e.astype(np.float64),
                               rtol=r if rtol is None else rtol, atol=t if atol is None else atol,
                               equal_nan=True)


ISOLATED_PRELUDE = '''
import resource
resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
import numpy as np
import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module as M

def case(name, fn):
    try:
        r = fn()
    except BaseException as e:
        print(f"{name}|{type(e).__name__}|{e}", flush=True)
    else:
        print(f"{name}|ok|{getattr(r, 'shape', r)!r}", flush=True)
'''


@pytest.fixture
def run_isolated():
    """Run Python source in a fresh interpreter with this checkout's mgtrace
    and at most 4 GiB of address space, so that a bad call that crashed would
    kill that process, not pytest (and a huge allocation fails at once).

    The source may call ``case(name, fn)``, which prints ``name|ExcType|msg``
    (or ``name|ok|shape``). Returns ``(returncode, {name: (type, msg)},
    stderr)``; returncode 0 proves no case crashed the process."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(mt.__file__)))

    def run(source, timeout=120):
        env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
        p = subprocess.run([sys.executable, "-c", ISOLATED_PRELUDE + source], env=env, cwd=root,
                           capture_output=True, text=True, timeout=timeout)
        results = {}
        for line in p.stdout.splitlines():
            name, kind, msg = (line.split("|", 2) + ["", ""])[:3]
            results[name] = (kind, msg)
        return p.returncode, results, p.stderr
    return run


def _cuda_skip_reason():
    """Why tests/cuda cannot run here ('' when a GPU is usable)."""
    if mt.cuda.is_available():
        return ""
    from mgtrace._core.tensor import backend_status
    if not backend_status("cuda")[0]:
        return f"needs mgtrace built with CUDA (MGTRACE_CUDA=1 and nvcc): {mt.cuda.load_error()}"
    return f"needs a CUDA GPU: {mt.cuda.load_error() or 'no CUDA device'}"


CUDA_SKIP_REASON = _cuda_skip_reason()
requires_cuda = pytest.mark.skipif(bool(CUDA_SKIP_REASON), reason=CUDA_SKIP_REASON)
"""tests/cuda marks every test with this: they skip, saying why, without a GPU."""


# ---- devices (issue 30): tests/core and tests/functional run once per device ----

def _available_devices():
    """``"cpu"``, then ``"cuda:0"`` where the CUDA backend is built and sees a GPU."""
    devices = ["cpu"]
    if mt.cuda.is_available():
        devices.append("cuda:0")
    return devices


DEVICES = _available_devices()


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "cpu_only(reason): checks a CPU-only feature (the NCHW16c layout, weight "
        "packing, the CPU's conv algorithms); skipped by the device fixture on other devices")


@pytest.fixture(params=DEVICES)
def device(request):
    """Each available device in turn (see DEVICES), made the default device
    for the test (so tensors the test makes live there), as an mt.Device.

    A test marked ``cpu_only`` is skipped on other devices with its reason;
    an op the device has no kernel for (NoKernelError) makes the test a skip
    naming it there, not a failure (tests/cuda checks which ops CUDA has)."""
    name = request.param
    marker = request.node.get_closest_marker("cpu_only")
    if name != "cpu" and marker is not None:
        pytest.skip(f"CPU only: {marker.args[0] if marker.args else marker.kwargs.get('reason', '')}")
    old = mt.get_default_device()
    mt.set_default_device(name)
    try:
        yield mt.Device(name)
    finally:
        mt.set_default_device(old)


# folders whose every test runs once per device, and the tests there of the
# CPU's own machinery, by a word of their name: skipped off the CPU
PER_DEVICE_FOLDERS = ("core", "functional")
CPU_ONLY = {
    "nchwc": "the NCHW16c layout is the CPU's",
    "winograd": "the CPU's Winograd convolutions and their weight cache",
    "packed": "the CPU's packed weights and planes",
    "direct": "the CPU's DIRECT convolution",
    "blocked": "the CPU's BLOCKED convolution",
    "weight_cache": "the CPU's cache of packed weights",
    "threads": "the CPU's thread pool",
    "alloc": "the host allocator",
}
_HERE = os.path.dirname(os.path.abspath(__file__))


def _per_device(path):
    rel = os.path.relpath(str(path), _HERE).split(os.sep)
    return len(rel) > 1 and rel[0] in PER_DEVICE_FOLDERS


def pytest_generate_tests(metafunc):
    """tests/core and tests/functional: every test takes the ``device``
    fixture (runs once per device), whether or not it names it."""
    if not _per_device(metafunc.definition.path):
        return
    if "device" not in metafunc.fixturenames:
        metafunc.fixturenames.append("device")
    if not any("device" in c.params for c in getattr(metafunc, "_calls", [])):
        metafunc.parametrize("device", DEVICES, indirect=True)


@pytest.fixture(autouse=True)
def _each_device(request):
    """Runs ``device`` for a per-device test that does not name it (its
    parameter comes from pytest_generate_tests)."""
    callspec = getattr(request.node, "callspec", None)
    if callspec is not None and "device" in callspec.params and _per_device(request.node.path):
        request.getfixturevalue("device")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if not _per_device(item.path):
            continue
        name = f"{item.name.split('[')[0]} {item.module.__name__}"
        for word, reason in CPU_ONLY.items():
            if word in name:
                item.add_marker(pytest.mark.cpu_only(reason))
                break


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    outcome = yield
    callspec = getattr(item, "callspec", None)
    if outcome.excinfo is None or callspec is None or callspec.params.get("device", "cpu") == "cpu":
        return
    from mgtrace.errors import NoKernelError
    if isinstance(outcome.excinfo[1], NoKernelError):
        outcome.force_exception(pytest.skip.Exception(f"{outcome.excinfo[1]}", _use_item_location=True))
