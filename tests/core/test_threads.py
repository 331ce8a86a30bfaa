"""Thread policy under contention: the OpenMP wait policy mgtrace sets
before libgomp loads, and the adaptive thread count (mgtrace._flags,
kernels/cpu/iter.c)."""
import os
import subprocess
import sys

import numpy as np

import mgtrace as mt
import mgtrace.functional as F
from mgtrace import _flags
from mgtrace._core import dispatch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_openmp_defaults_leave_a_users_choice_alone():
    env = {}
    assert _flags.set_openmp_defaults(env) == {"GOMP_SPINCOUNT": _flags.SPINCOUNT}
    assert env == {"GOMP_SPINCOUNT": _flags.SPINCOUNT}
    for mine in ({"OMP_WAIT_POLICY": "active"}, {"GOMP_SPINCOUNT": "infinite"}):
        env = dict(mine)
        assert _flags.set_openmp_defaults(env) == {} and env == mine


def test_importing_mgtrace_sets_the_spin_count_before_openmp_starts():
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    code = "import os, mgtrace; print(os.environ.get('GOMP_SPINCOUNT'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=ROOT)
    assert out.stdout.strip() == _flags.SPINCOUNT, out.stderr
    env["OMP_WAIT_POLICY"] = "active"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=ROOT)
    assert out.stdout.strip() == "None", out.stderr


def test_adaptive_thread_count_stays_within_the_configured_one():
    n = mt.get_num_threads()
    assert 1 <= dispatch.run_threads() <= n
    old = dispatch.set_adaptive_threads(False)
    try:
        assert dispatch.run_threads() == n
        x = mt.tensor(np.arange(200000, dtype=np.float32) - 1e5)
        np.testing.assert_array_equal(F.relu(x).numpy(), np.maximum(x.numpy(), 0))
    finally:
        dispatch.set_adaptive_threads(old)
    assert dispatch.set_adaptive_threads(old) == old


def test_adaptive_threads_are_off_unless_asked():
    """Outputs must not depend on the machine's load: the load-following
    thread count (which can change a conv's split) is opt-in."""
    import os
    from mgtrace import _flags
    if os.environ.get("MGTRACE_ADAPTIVE_THREADS") in (None, ""):
        assert _flags.ADAPTIVE_THREADS is False
