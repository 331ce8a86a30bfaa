"""``import mgtrace`` leaves ml_dtypes unimported (it registers NumPy ufuncs
and cost half of the import: every batch worker paid it), and bfloat16
still works wherever it is met or asked for: each case runs in a fresh
interpreter, since this test session has imported ml_dtypes already."""
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(code):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


def test_import_mgtrace_does_not_import_ml_dtypes():
    out = _run("""
        import sys
        import mgtrace as mt, mgtrace.functional, mgtrace.module, mgtrace.traced_module
        import mgtrace.serialization, mgtrace.cli, mgtrace.cli.batch, mgtrace.cli.tasks
        print("ml_dtypes" in sys.modules)
        t = mt.tensor([1.5, 2.0])                     # float32 work loads nothing either
        print(t.dtype, "ml_dtypes" in sys.modules)
    """)
    assert out == ["False", "float32", "False"]


@pytest.mark.parametrize("how", ["name", "DTYPES", "as_dtype", "promotion"])
def test_bfloat16_asked_for_by_name_loads_ml_dtypes(how):
    ask = {"name": "mt.tensor([1.5, -2.25], dtype='bfloat16').dtype",
           "DTYPES": "mt.DTYPES[8]",
           "as_dtype": "mt.as_dtype('bfloat16')",
           "promotion": "mt.dtype_promotion(mt.tensor([1], dtype='bfloat16'), 2.0)"}[how]
    out = _run(f"""
        import sys
        import numpy as np
        import mgtrace as mt
        dt = {ask}
        import ml_dtypes
        print(dt == np.dtype(ml_dtypes.bfloat16), dt.name)
    """)
    assert out == ["True", "bfloat16"]


def test_bfloat16_of_a_caller_that_imported_ml_dtypes_after_mgtrace():
    """ml_dtypes imported by the caller after mgtrace: its bfloat16 arrays,
    type and dtype are recognised (mgtrace had not made its own yet)."""
    out = _run("""
        import numpy as np
        import mgtrace as mt
        import ml_dtypes
        a = np.array([1.5, -2.25, 3.0], dtype=ml_dtypes.bfloat16)
        t = mt.tensor(a)
        print(t.dtype.name, t.numpy().astype(np.float32).tolist() == [1.5, -2.25, 3.0])
        print(mt.as_dtype(ml_dtypes.bfloat16).name, (t * 2).numpy().astype(np.float32)[1])
    """)
    assert out == ["bfloat16", "True", "bfloat16", "-4.5"]


def test_archive_with_bfloat16_loads_in_a_fresh_process(tmp_path):
    """A bfloat16 tensor saved and loaded back where nothing imported
    ml_dtypes before the load."""
    path = tmp_path / "bf16.tmod"
    _run(f"""
        import mgtrace as mt
        mt.save({{"w": mt.tensor([0.5, -1.75, 3.0], dtype="bfloat16")}}, {str(path)!r})
    """)
    for mmap in (False, True):
        out = _run(f"""
            import sys
            import numpy as np
            import mgtrace as mt
            print("ml_dtypes" in sys.modules)
            w = mt.load({str(path)!r}, mmap={mmap})["w"]
            print(w.dtype.name, w.numpy().astype(np.float32).tolist())
        """)
        assert out == ["False", "bfloat16", "[0.5,", "-1.75,", "3.0]"]
