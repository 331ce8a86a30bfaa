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
