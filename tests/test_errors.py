"""One exception root: every exception class mgtrace defines subclasses
mgtrace.Error and a builtin, so callers catch either; unknown names get one
"did you mean" hint."""
import importlib
import pkgutil

import mgtrace
from mgtrace.errors import did_you_mean


def _mgtrace_exceptions():
    found = set()
    for info in pkgutil.walk_packages(mgtrace.__path__, "mgtrace."):
        if info.name.endswith(("__main__", ".demo", ".cli")):
            continue
        mod = importlib.import_module(info.name)
        for obj in vars(mod).values():
            if isinstance(obj, type) and issubclass(obj, Exception) and not issubclass(obj, Warning) and \
                    obj.__module__.startswith("mgtrace") and not obj.__name__.startswith("_"):
                found.add(obj)
    return found


def test_every_mgtrace_exception_has_the_root_and_a_builtin():
    found = _mgtrace_exceptions()
    names = {c.__name__ for c in found}
    assert {"ArchiveError", "RegistryError", "VersionError", "TraceError", "GraphError",
            "StateDictError"} <= names
    for cls in found:
        assert issubclass(cls, mgtrace.Error), cls
        builtin = [b for b in cls.__mro__ if b.__module__ == "builtins" and b is not object]
        assert builtin[0] is not Exception or cls is mgtrace.Error, cls


def test_what_save_refuses_is_an_mgtrace_error():
    import io
    import pytest
    with pytest.raises(mgtrace.Error) as info:
        mgtrace.save({"f": lambda: 0}, io.BytesIO())
    assert isinstance(info.value, TypeError)


def test_did_you_mean():
    assert did_you_mean("mgtrace.functional.rleu", ["mgtrace.functional.relu", "x"]) == \
        " Did you mean 'mgtrace.functional.relu'?"
    assert did_you_mean("zzz", ["abc"]) == ""
