"""The user's scripts (``--import FILE.py``, ``--inputs FILE.py:fn``) run from
their source as it is now: no bytecode cache is read or written."""
import importlib.util
import os
import py_compile

import pytest

from mgtrace.cli import tasks


@pytest.fixture
def fresh(monkeypatch):
    """load_user_code runs each script once per process: forget earlier runs."""
    monkeypatch.setattr(tasks, "_USER_CODE", {})


def _rewrite_same_size_same_mtime(path, text):
    st = os.stat(path)
    assert len(text.encode()) == st.st_size
    path.write_text(text)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))   # as a rewrite within the same second


def test_a_stale_pyc_of_a_same_size_same_second_rewrite_is_not_run(tmp_path, fresh, monkeypatch):
    script = tmp_path / "make_inputs.py"
    script.write_text("VALUE = 1\n")
    # the cache a bytecode-writing import of the first version leaves; it matches the
    # rewritten file's size and mtime, which is all a .pyc is checked against
    py_compile.compile(str(script), cfile=importlib.util.cache_from_source(str(script)),
                       invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP)
    _rewrite_same_size_same_mtime(script, "VALUE = 2\n")
    assert tasks.load_user_code(str(script)).VALUE == 2
    monkeypatch.setattr(tasks, "_USER_CODE", {})                  # a later job in this process
    _rewrite_same_size_same_mtime(script, "VALUE = 3\n")
    assert tasks.load_user_code(str(script)).VALUE == 3


def test_running_a_script_writes_no_bytecode(tmp_path, fresh, monkeypatch):
    monkeypatch.setattr("sys.dont_write_bytecode", False)
    script = tmp_path / "register.py"
    script.write_text("def make(path, module):\n    return 7\n")
    mod = tasks.load_user_code(str(script))
    assert mod.make("a.tmod", None) == 7
    assert mod.__file__ == str(script)
    assert not (tmp_path / "__pycache__").exists()


def test_a_script_that_fails_names_itself_and_the_error(tmp_path, fresh):
    script = tmp_path / "broken.py"
    script.write_text("x = 1\nraise RuntimeError('no inputs here')\n")
    with pytest.raises(ValueError, match=r"--import .*broken.py: importing it failed: "
                                         r"RuntimeError: no inputs here"):
        tasks.load_user_code(str(script))
    bad = tmp_path / "syntax.py"
    bad.write_text("def f(:\n")
    with pytest.raises(ValueError, match=r"importing it failed: SyntaxError"):
        tasks.load_user_code(str(bad))
