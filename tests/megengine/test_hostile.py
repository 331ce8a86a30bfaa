"""Hostile pickles: every one is refused with an mgtrace error, nothing it
names is imported or called, and the canary file it tries to create never
appears."""
import os
import pickle
import struct
import sys

import pytest

import mgtrace
import mgtrace.megengine as mge
from mgtrace.megengine import reader as U
from .cases import path


def su(s):                       # SHORT_BINUNICODE
    b = s.encode()
    return b"\x8c" + bytes([len(b)]) + b


def glob(module, name):          # STACK_GLOBAL
    return su(module) + su(name) + b"\x93"


P4 = b"\x80\x04"


def call(module, name, *args):   # module.name(*args) through REDUCE
    return glob(module, name) + b"(" + b"".join(args) + b"tR"


class _Reduce:
    def __init__(self, fn, args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


@pytest.fixture
def canary(tmp_path, monkeypatch):
    c = tmp_path / "CANARY"
    yield c
    assert not c.exists(), "a hostile pickle ran code"


def hostile(c):
    """(case name, pickle bytes) for every trick, each aimed at ``c``."""
    cmd = f"touch {c}"
    code = f"open({str(c)!r}, 'w').write('x')"
    cases = {
        "os.system protocol 0": b"cos\nsystem\n(S'" + cmd.encode() + b"'\ntR.",
        "posix.system": P4 + call("posix", "system", su(cmd)) + b".",
        "builtins.eval": P4 + call("builtins", "eval", su(code)) + b".",
        "builtins.exec": P4 + call("builtins", "exec", su(code)) + b".",
        "__import__": P4 + call("builtins", "__import__", su("os")) + b".",
        "builtins.getattr": P4 + glob("builtins", "getattr") + b"(" + glob("os", "path")
        + su("join") + b"tR.",
        "getattr chain through an allowed class": P4 + glob(
            "collections", "OrderedDict.__init__.__globals__") + b".",
        "dotted name on a stub class": P4 + glob("megengine.tensor", "Tensor.__class__") + b".",
        "dunder on numpy": P4 + glob("numpy", "__builtins__") + b".",
        "subprocess.Popen": P4 + call("subprocess", "Popen", su("touch"), su(str(c))) + b".",
        "__reduce__ to os.system": pickle.dumps(_Reduce(os.system, (cmd,)), protocol=4),
        "__reduce__ to eval": pickle.dumps(_Reduce(eval, (code,)), protocol=2),
        "__reduce__ to exec, protocol 5": pickle.dumps(_Reduce(exec, (code,)), protocol=5),
        "copyreg._reconstructor": P4 + call("copyreg", "_reconstructor") + b".",
        "pickle.loads nested": P4 + call("pickle", "loads", b"C\x01x") + b".",
        "numpy.load": P4 + call("numpy", "load", su(str(c))) + b".",
        "numpy.core.multiarray other": P4 + glob("numpy.core.multiarray", "_vec_string") + b".",
        "an import side effect": P4 + glob("mgtrace_hostile_side_effect", "x") + b".",
        "REDUCE on a type name": P4 + call("builtins", "list", su("ab")) + b".",
        "builtins.type(other)": P4 + call("builtins", "type", su("x")) + b".",
        "BUILD on OrderedDict": P4 + glob("collections", "OrderedDict") + b")R}"
        + su("__class__") + su("x") + b"sb.",
        "BUILD on a type name": P4 + glob("builtins", "tuple") + b"}b.",
        "BUILD twice on a stub": P4 + glob("megengine.tensor", "Tensor") + b")\x81}b}b.",
        "__setstate__ trick on an allowed class": P4 + call("megengine.tensor", "Tensor")
        + b"}(" + su("__setstate__") + su("os.system") + su("__class__") + su("builtins.eval")
        + su("__reduce__") + glob("megengine.tensor", "Parameter") + b"ub.",
        "INST opcode": b"(imegengine.tensor\nTensor\n.",
        "persistent id": P4 + su("x") + b"Q.",
        "EXT1": P4 + b"\x82\x01.",
        "memo index 2**32-1": P4 + b"]r\xff\xff\xff\xff.",
        "memo get of nothing": P4 + b"h\x05.",
        "memo get before put": P4 + b"]j\x00\x01\x00\x00.",
        "object dtype": P4 + call("numpy", "dtype", su("O"), b"\x89\x88") + b".",
        "structured dtype": P4 + call("numpy", "dtype", su("V8"), b"\x89\x88") + b".",
        "array with too few bytes": P4 + call("numpy.core.multiarray", "_reconstruct",
                                              glob("numpy", "ndarray"), b"K\x00\x85",
                                              b"C\x01b") + b"(K\x01J\x00\x00\x00\x01\x85"
        + call("numpy", "dtype", su("f4"), b"\x89\x88") + b"(K\x03" + su("<")
        + b"NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb\x89C\x04\x00\x00\x00\x00tb.",
        "array of objects": P4 + call("numpy.core.multiarray", "_reconstruct",
                                      glob("numpy", "ndarray"), b"K\x00\x85", b"C\x01b")
        + b"(K\x01K\x01\x85" + call("numpy", "dtype", su("f4"), b"\x89\x88")
        + b"(K\x03" + su("<") + b"NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb\x89]"
        + su("x") + b"atb.",
        "scalar of the wrong size": P4 + call("numpy.core.multiarray", "scalar",
                                              call("numpy", "dtype", su("f8"), b"\x89\x88"),
                                              b"C\x01x") + b".",
        "huge bytes length": P4 + b"\x8e" + struct.pack("<Q", 1 << 62) + b"xx.",
        "truncated": P4 + su("abc")[:3],
        "no STOP": P4 + b"]",
        "empty": b"",
        "not a pickle": b"MGTRACE\x00 this is an archive, not a pickle",
        "deep lists": P4 + b"]" * 200_000 + b"a" * 199_999 + b".",
        "a list containing itself": P4 + b"]\x94h\x00a.",
        "state dict of a list": P4 + glob("collections", "OrderedDict") + b")R" + su("w")
        + b"]\x94h\x00as.",
        "state dict of a string": P4 + b"}" + su("w") + su("x") + b"s.",
        # what the reader's own machine refuses (it calls nothing but its table's records)
        "NEWOBJ of a builder": P4 + glob("collections", "OrderedDict") + b")\x81.",
        "NEWOBJ_EX with keywords": P4 + glob("megengine.tensor", "Tensor") + b")}"
        + su("k") + b"Ns\x92.",
        "REDUCE on a record": P4 + call("megengine.tensor", "Tensor") + b")R.",
        "BUILD on a list": P4 + b"]}b.",
        "APPEND to a record": P4 + call("megengine.tensor", "Tensor") + b"Na.",
        "SETITEM on a record": P4 + call("megengine.tensor", "Tensor") + b"NNs.",
        "a list as a dict key": P4 + b"}]Ns.",
        "a large tuple key hashed often": P4 + b"(" + b"N" * 5000 + b"t\x94}(" + b"h\x00N" * 50
        + b"u.",
        "STACK_GLOBAL of non-strings": P4 + b"K\x01K\x02\x93.",
        "protocol 0 GLOBAL then a text opcode": b"cmegengine.tensor\nTensor\nI1\n.",
        "int keys colliding": P4 + b"}(" + b"".join(
            b"\x8a\x09" + (k * (2**61 - 1)).to_bytes(9, "little", signed=True) + b"N"
            for k in range(1, 3)) + b"u.",
    }
    return cases


def test_every_hostile_pickle_is_refused(canary, tmp_path, monkeypatch):
    side = tmp_path / "mgtrace_hostile_side_effect.py"
    side.write_text(f"open({str(canary)!r}, 'w').write('imported')\nx = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    before = set(sys.modules)
    failures = []
    for name, data in hostile(canary).items():
        f = tmp_path / "h.pkl"
        f.write_bytes(data)
        try:
            mge.load(str(f))
        except mgtrace.Error as e:
            assert isinstance(e, mge.MegEngineFileError), name
            assert str(f) in str(e), (name, str(e))
        except BaseException as e:          # anything else is a failure of the reader
            failures.append(f"{name}: {type(e).__name__}: {e}")
        else:
            failures.append(f"{name}: accepted")
        assert not canary.exists(), name
    assert not failures, failures
    new = {m for m in set(sys.modules) - before if not m.startswith("mgtrace")}
    assert not {"subprocess", "posix", "mgtrace_hostile_side_effect"} & new


@pytest.mark.parametrize("module, name", [("os", "system"), ("builtins", "eval"),
                                          ("posix", "system"), ("builtins", "getattr"),
                                          ("collections", "OrderedDict.__init__.__globals__")])
def test_forbidden_global_is_named(module, name):
    data = P4 + glob(module, name) + b"."
    with pytest.raises(mge.ForbiddenGlobalError, match=f"the global {module}.{name},"):
        mge.loads(data)


def test_refusals_say_why():
    with pytest.raises(mge.MegEngineFileError, match="memo index 4294967295"):
        mge.loads(P4 + b"]r\xff\xff\xff\xff.")
    with pytest.raises(mge.MegEngineFileError, match="opcode BINPERSID"):
        mge.loads(P4 + su("x") + b"Q.")
    with pytest.raises(mge.MegEngineFileError, match="dtype 'O' is not a plain numeric"):
        mge.loads(P4 + call("numpy", "dtype", su("O"), b"\x89\x88") + b".")
    with pytest.raises(mge.MegEngineFileError, match="an int of more than"):
        mge.loads(P4 + b"}(\x8a\x09" + (2**62).to_bytes(9, "little", signed=True) + b"Nu.")
    # a FRAME longer than the file: said as such (2**63 - 1 was "an int of more than 61 bits")
    for n in (2**63 - 1, 10**6):
        with pytest.raises(mge.MegEngineFileError, match=f"a frame of {n} bytes at byte 2, past "
                                                         "the end of the 13-byte pickle"):
            mge.loads(P4 + b"\x95" + n.to_bytes(8, "little") + b"N.")
    with pytest.raises(mge.MegEngineFileError, match="neither a state dict nor a TracedModule"):
        mge.loads(P4 + b"]" * 100 + b"a" * 99 + b".")
    with pytest.raises(mge.MegEngineFileError, match=r"more than \d+ pickle opcodes"):
        old = U.MAX_OPCODES
        U.MAX_OPCODES = 100
        try:
            mge.loads(P4 + b"N0" * 200 + b"N.")
        finally:
            U.MAX_OPCODES = old


def test_names_in_a_traced_module_are_never_resolved():
    """A .tm whose function record names builtins.eval (same length as the
    nn.relu it replaces): refused by the table, naming it."""
    data = open(path("cnn", ".tm"), "rb").read()
    assert data.count(b"\x8c\x04relu") == 1
    with pytest.raises(mge.UnsupportedError,
                       match="MegEngine function megengine.functional.nn.eval has no mgtrace"):
        mge.loads(data.replace(b"\x8c\x04relu", b"\x8c\x04eval"))
    data = data.replace(b"\x8c\x06Linear", b"\x8c\x06system")
    with pytest.raises(mge.UnsupportedError, match="megengine.module.linear.system"):
        mge.loads(data)


def test_real_files_read_into_inert_records_only():
    obj = U.read_pickle(open(path("cnn", ".tm"), "rb").read())
    seen, stack, kinds = set(), [obj], set()
    while stack:
        v = stack.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        kinds.add(type(v).__module__)
        if isinstance(v, U.Stub):
            stack.extend(v.args)
            stack.extend((v.state or {}).values() if isinstance(v.state, dict) else [])
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
    assert kinds <= {"builtins", "mgtrace.megengine.stubs", "mgtrace.megengine.reader",
                     "numpy"}, kinds


def test_graphs_calling_graphs_have_a_budget(monkeypatch):
    """Graphs that call graphs that call graphs (twice at each level) cannot
    run for ever: a file's conversion runs at most MAX_STEPS exprs."""
    from mgtrace.megengine import convert
    monkeypatch.setattr(convert, "MAX_STEPS", 5)
    with pytest.raises(mge.MegEngineFileError, match="more than 5 exprs run"):
        mge.load(path("cnn", ".tm"))


@pytest.mark.parametrize("field,value", [(0, True), (4, True), (3, [1]), (5, 7), (0, "self")])
def test_a_malformed_argspec_is_ignored_not_a_type_error(field, value):
    """MegEngine's FullArgSpec record of a TracedModule's forward, with a
    field of another type (the fuzzer's case: kwonlyargs True raised a bare
    TypeError): the signature is left unknown, as for any other malformed
    argspec."""
    from mgtrace.megengine import convert
    spec_cls = U.ALLOWED[("inspect", "FullArgSpec")]
    fields = [["self", "x"], None, None, None, [], None, {}]
    fields[field] = value
    assert convert._signature(spec_cls(*fields), "w") == (None, None)
    good = convert._signature(spec_cls(["self", "x"], None, None, None, [], None, {}), "w")
    assert str(good[0]) == "(x)"
