"""Upgraders end to end on traced graphs: save with version 1 of a user
function or builtin module type, register version 2, load.

What is proved: calls are stored by parameter name, so after an upgrader
(a positional parameter inserted mid-signature, a parameter renamed, a
config field added with a default) the loaded graph calls the new version
with every argument bound to the right parameter and gives the old outputs;
without an upgrader the load fails naming both versions; a version bump
forgotten (new signature, old version) fails instead of shifting arguments.
"""
import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module as M
import mgtrace.traced_module as tmod
from mgtrace.errors import ArchiveError, VersionError
from mgtrace.serialization import register_function, register_module, registry

from .helpers import load_bytes, save_bytes, split

_CURRENT = {}         # name -> the version of the user function the nets call now


@pytest.fixture(autouse=True)
def fresh_names():
    before = set(registry._FUNCTIONS)
    yield
    for name in set(registry._FUNCTIONS) - before:
        registry._unregister_function(name)
    _CURRENT.clear()


def _define(name, fn, version, upgraders=None):
    """Register ``fn`` (made traceable) as version ``version`` of
    ``tests.upgraders.<name>``, as a new release of the same code would:
    same module and qualname, so it replaces the previous version."""
    fn.__qualname__ = fn.__name__ = name
    fn.__module__ = __name__
    w = tmod.wrap(fn)
    register_function(w, name=f"tests.upgraders.{name}", version=version, upgraders=upgraders)
    _CURRENT[name] = w
    return w


def _x(batch=2):
    return mt.tensor(np.linspace(-2, 2, 4 * batch, dtype=np.float32).reshape(batch, 4))


def _saved(net):
    return save_bytes(mt.trace_module(net, _x()))


# ------------------------------------------------ a parameter inserted mid-signature

class UsesAffine(M.Module):
    def forward(self, x):
        return _CURRENT["affine"](x, 3.0)            # v1: affine(x, w)


def affine_v1(x, w):
    return x * w


def affine_v2(x, shift, w):                          # shift inserted before w
    return x * w + shift


def test_inserted_parameter_is_filled_by_the_upgrader_and_nothing_shifts():
    _define("affine", affine_v1, 1)
    data = _saved(UsesAffine())
    header, _ = split(data)
    call = next(e for m in header["modules"] if m["kind"] == "traced"
                for e in m["graphs"][0]["exprs"] if e["kind"] == "call_function")
    assert call["args"] == {"x": {"node": 1}, "w": 3.0}          # stored by name
    want = affine_v1(_x(5), 3.0)

    _define("affine", affine_v2, 2, upgraders={1: lambda a: {**a, "shift": 0.0}})
    loaded = load_bytes(data)
    e = next(e for e in loaded.graph.exprs() if e.kind == "call_function")
    assert e.func.__wrapped__ is affine_v2 and e.args[1:] == (0.0, 3.0)   # shift=0, w=3
    assert loaded(_x(5)).numpy().tobytes() == want.numpy().tobytes()
    # by position, v1's (x, 3.0) would have bound 3.0 to `shift` and left `w` unset


def test_inserted_parameter_without_an_upgrader_names_both_versions():
    _define("affine", affine_v1, 1)
    data = _saved(UsesAffine())
    _define("affine", affine_v2, 2)
    with pytest.raises(VersionError, match=r"'tests.upgraders.affine' is version 1 in this "
                                           r"archive and version 2 here.*no upgrader from "
                                           r"version 1.*register_function"):
        load_bytes(data)


def test_a_forgotten_version_bump_fails_instead_of_shifting():
    def affine_v2_no_bump(x, w_new, shift=0.0):
        return x * w_new + shift
    _define("affine", affine_v1, 1)
    data = _saved(UsesAffine())
    _define("affine", affine_v2_no_bump, 1)            # new signature, same version
    with pytest.raises(ArchiveError,
                       match=r"stored arguments \['w'\] are not parameters.*upgrader"):
        load_bytes(data)


# ------------------------------------------------------------ a renamed parameter

class UsesScale(M.Module):
    def forward(self, x):
        return _CURRENT["scale"](x, factor=2.0) - _CURRENT["scale"](x, 0.5)


def scale_v1(x, factor=1.0):
    return x * factor


def scale_v2(x, k=1.0):                                # factor renamed k
    return x * k


def _rename(args):
    args["k"] = args.pop("factor")
    return args


def test_renamed_parameter_is_rebound_by_its_new_name():
    _define("scale", scale_v1, 1)
    net = UsesScale()
    data = _saved(net)
    want = net(_x(3))
    _define("scale", scale_v2, 2, upgraders={1: _rename})
    loaded = load_bytes(data)
    calls = [e for e in loaded.graph.exprs() if e.kind == "call_function"]
    assert [e.kwargs for e in calls] == [{"k": 2.0}, {"k": 0.5}]
    assert "k=2.0" in loaded.code and "factor" not in loaded.code
    assert loaded(_x(3)).numpy().tobytes() == want.numpy().tobytes()
    # saved again, the archive holds version 2 and the new name
    header, _ = split(save_bytes(loaded))
    assert {"name": "tests.upgraders.scale", "version": 2} in header["ops"]


def test_renamed_parameter_without_an_upgrader_names_both_versions():
    _define("scale", scale_v1, 1)
    data = _saved(UsesScale())
    _define("scale", scale_v2, 2)
    with pytest.raises(VersionError, match="version 1 in this archive and version 2 here"):
        load_bytes(data)


def test_upgrader_chains_run_on_traced_graphs():
    def scale_v3(x, shift, k=1.0):                     # v3 also inserts `shift` first
        return x * k + shift
    _define("scale", scale_v1, 1)
    net = UsesScale()
    data = _saved(net)
    want = net(_x(2))
    _define("scale", scale_v3, 3, upgraders={1: _rename, 2: lambda a: {**a, "shift": 0.0}})
    loaded = load_bytes(data)
    assert loaded(_x(2)).numpy().tobytes() == want.numpy().tobytes()
    assert "scale(x, 0.0, k=2.0)" in loaded.code


def test_a_failing_upgrader_is_an_archive_error():
    _define("scale", scale_v1, 1)
    data = _saved(UsesScale())
    _define("scale", scale_v2, 2, upgraders={1: lambda a: a["nope"]})
    with pytest.raises(ArchiveError, match="from version 1 to 2 failed: KeyError"):
        load_bytes(data)


# ------------------------------------ a builtin module type that gained a config field

def _gate(version):
    """Version 1 of tests.upgraders.Gate is relu(x) * weight; version 2
    gained ``slope`` (default 0.01), where slope=0 is version 1."""
    class Gate(M.Module):
        def __init__(self, features, slope=0.01):
            super().__init__()
            self.features, self.slope = features, slope
            self.weight = M.Parameter(np.linspace(0.5, 2.0, features).astype(np.float32))

        def config(self):
            return {"features": self.features, "slope": self.slope}

        def forward(self, x):
            return F.where(x > 0, x, x * self.slope) * self.weight

    class GateV1(M.Module):
        def __init__(self, features):
            super().__init__()
            self.features = features
            self.weight = M.Parameter(np.linspace(0.5, 2.0, features).astype(np.float32))

        def config(self):
            return {"features": self.features}

        def forward(self, x):
            return F.relu(x) * self.weight

    cls = GateV1 if version == 1 else Gate
    cls.__qualname__ = cls.__name__ = "Gate"
    cls.__module__ = __name__
    return cls


class UsesGate(M.Module):
    def __init__(self, gate_cls):
        super().__init__()
        self.fc = M.Linear(4, 4)
        self.gate = gate_cls(4)

    def forward(self, x):
        return self.gate(self.fc(x)) + 1.0


def test_new_config_field_is_filled_by_the_module_upgrader():
    v1 = register_module(_gate(1), name="tests.upgraders.Gate", version=1)
    mt.random.seed(4)
    net = UsesGate(v1)
    data = _saved(net)
    header, _ = split(data)
    entry = next(m for m in header["modules"] if m.get("type") == "tests.upgraders.Gate")
    assert entry["type_version"] == 1 and entry["config"] == {"features": 4}
    want = net(_x(3))

    v2 = register_module(_gate(2), name="tests.upgraders.Gate", version=2,
                         upgraders={1: lambda c: {**c, "slope": 0.0}})
    loaded = load_bytes(data)
    assert type(loaded.gate) is v2 and loaded.gate.config() == {"features": 4, "slope": 0.0}
    assert loaded(_x(3)).numpy().tobytes() == want.numpy().tobytes()
    assert v2(4).slope == 0.01                        # new modules get the new default
    header, _ = split(save_bytes(loaded))
    entry = next(m for m in header["modules"] if m.get("type") == "tests.upgraders.Gate")
    assert entry["type_version"] == 2 and entry["config"] == {"features": 4, "slope": 0.0}


def test_new_config_field_without_an_upgrader_names_both_versions():
    v1 = register_module(_gate(1), name="tests.upgraders.Gate", version=1)
    data = _saved(UsesGate(v1))
    register_module(_gate(2), name="tests.upgraders.Gate", version=2)
    with pytest.raises(VersionError, match=r"module type 'tests.upgraders.Gate' is version 1 in "
                                           r"this archive and version 2 here.*register_module"):
        load_bytes(data)
