"""The reader is mgtrace's own pickle machine: it reads MegEngine's files at
every protocol MegEngine can write (2 to 5, data/make_protocols.py) as it
reads protocol 4, names the opcode and byte offset of what it refuses, and
neither imports nor uses Python's pickle machinery."""
import ast
import os
import subprocess
import sys

import numpy as np
import pytest

import mgtrace.megengine as mge
from mgtrace.megengine import reader as U
from .cases import assert_matches, path, stored

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
P4 = b"\x80\x04"


@pytest.mark.parametrize("suffix", [".p2.tm", ".p5.tm"])
def test_traced_module_at_protocols_2_and_5_gives_megengine_outputs(suffix):
    tm = mge.load(path("cnn", suffix))
    for batch, (args, kwargs, want) in stored("cnn").items():
        assert_matches(tm(*args, **kwargs), want)


def test_state_dict_at_protocol_3_equals_protocol_4():
    want, got = mge.load(path("cnn", ".pkl")), mge.load(path("cnn", ".p3.pkl"))
    assert list(got) == list(want)
    for k in want:
        assert got[k].numpy().dtype == want[k].numpy().dtype
        np.testing.assert_array_equal(got[k].numpy(), want[k].numpy())


def test_hand_made_opcodes_give_python_s_values():
    """Values a pickle of Python's would give (written out by hand here)."""
    # protocol 2, 3-tuple of (None, True, -1), a LONG1 and a big-endian float
    data = (b"\x80\x02(N\x88J\xff\xff\xff\xfft" + b"\x8a\x02\x00\x80" + b"G?\xf8" + b"\x00" * 6
            + b"\x87.")
    assert U.read_pickle(data) == ((None, True, -1), -32768, 1.5)
    # memo, DUP, marks, a frozenset and a dict built by SETITEMS
    data = P4 + b"]\x94(K\x01K\x02eh\x00" + b"2" + b"\x86" + b"}(\x8c\x01a(\x91u" + b"\x86."
    (lst_pair, d) = U.read_pickle(data)
    assert lst_pair[0] is lst_pair[1] and lst_pair[0] == [1, 2]
    assert d == {"a": frozenset()}


@pytest.mark.parametrize("data, message", [
    (P4 + b"I1\n.", "opcode INT at byte 2 is refused"),
    (P4 + b"N\x82\x01.", "opcode EXT1 at byte 3 is refused"),
    (P4 + b"N\x97.", "opcode NEXT_BUFFER at byte 3"),
    (P4 + b"\xff.", r"byte 2 \(0xff\) is not a pickle opcode"),
    (P4 + b"N\x8c\x05ab.", "opcode SHORT_BINUNICODE at byte 3: a string of 5 bytes, past the end"),
    (P4 + b"Na.", r"the stack is empty .*\(opcode APPEND at byte 3\)"),
    (P4 + b"}Na.", r"appends to a dict, not a list \(opcode APPEND at byte 4\)"),
    (P4 + b"e.", r"no MARK to pop to \(opcode APPENDS at byte 2\)"),
    (P4 + b"}(]Nu.", r"a key of type list \(opcode SETITEMS at byte 6\)"),
    (P4 + b"}(" + b"(" + b"N" * 65 + b"tNu.", "a key of more than 64 items"),
    (P4 + b"N)R.", r"REDUCE calls a NoneType"),
    (P4 + b"\x80\x01.", "protocol 1"),
    (P4 + b"N", "ends at byte 3 without a STOP opcode"),
])
def test_refusals_name_opcode_and_offset(data, message):
    with pytest.raises(mge.MegEngineFileError, match=message):
        U.read_pickle(data)


def _mgtrace_sources():
    pkg = os.path.join(ROOT, "mgtrace")
    for here, _, files in os.walk(pkg):
        for f in files:
            if f.endswith((".py", ".pyx", ".pxd")) and f != "__init__.pxd":
                yield os.path.join(here, f)


PICKLE_MODULES = {"pickle", "cPickle", "_pickle", "pickletools", "dill", "cloudpickle",
                  "marshal", "shelve", "copyreg", "joblib"}


def test_no_module_of_mgtrace_imports_a_pickle_loader():
    """An AST scan of mgtrace/ (the .py files; .pyx files by their import
    lines): no import of pickle or a pickle-like loader, and no
    ``importlib.import_module`` of one by name."""
    found = []
    for f in _mgtrace_sources():
        src = open(f, encoding="utf-8").read()
        if f.endswith(".py"):
            for node in ast.walk(ast.parse(src, f)):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module]
                elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                    names = [node.value] if node.value in PICKLE_MODULES - {"marshal"} else []
                    names = [n for n in names if f"import_module({node.value!r}" in src
                             or f"__import__({node.value!r}" in src]
                for n in names:
                    if n.split(".")[0] in PICKLE_MODULES:
                        found.append(f"{os.path.relpath(f, ROOT)}:{node.lineno}: {n}")
        else:
            for i, line in enumerate(src.splitlines(), 1):
                words = line.replace(",", " ").split()
                if words[:1] in (["import"], ["cimport"], ["from"]) and any(
                        w.split(".")[0] in PICKLE_MODULES for w in words[1:]):
                    found.append(f"{os.path.relpath(f, ROOT)}:{i}: {line.strip()}")
    assert not found, found


def test_reading_a_file_imports_no_pickle_machinery():
    """In a fresh process: whoever imports pickle (NumPy does, at its own
    import) is recorded; nothing of mgtrace's does, while mgtrace is
    imported and a .tm and a .pkl are read; pickletools is never loaded."""
    script = r"""
import sys, importlib.abc
import numpy                                   # imports pickle itself
for m in ("pickle", "_pickle", "pickletools", "_compat_pickle"):
    sys.modules.pop(m, None)
importers = []
class Watch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name in ("pickle", "_pickle", "pickletools"):
            f = sys._getframe(1)
            while f and f.f_globals.get("__name__", "").startswith(("importlib", "_frozen")):
                f = f.f_back
            importers.append((name, f.f_globals.get("__name__") if f else None))
        return None
sys.meta_path.insert(0, Watch())
import mgtrace, mgtrace.megengine as mge
mge.load(sys.argv[1]); mge.load(sys.argv[2])
ours = [i for i in importers if str(i[1]).startswith("mgtrace")]
assert not ours, ours
assert "pickletools" not in sys.modules, importers
print("ok", len(importers))
"""
    out = subprocess.run([sys.executable, "-c", script, path("cnn", ".tm"), path("cnn", ".pkl")],
                         capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": ROOT})
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith("ok")
