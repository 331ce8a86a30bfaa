"""registry.py and upgraders.py: mgtrace's own stable names, user
registrations, lookups that never import, and upgrader chains for renamed
and inserted parameters (functions) and new config fields (module types)."""
import inspect
import operator

import pytest

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module as M
from mgtrace.serialization import registry, upgrade_call, upgrade_config

from .helpers import edit, load_bytes, save_bytes


@pytest.fixture
def fresh_names():
    """Names registered by a test are dropped after it."""
    before = set(registry._FUNCTIONS)
    yield
    for name in set(registry._FUNCTIONS) - before:
        registry._unregister_function(name)


def test_every_public_functional_function_is_registered_at_version_1():
    own = registry.own_functions()
    for name in F.__all__:
        assert own[f"mgtrace.functional.{name}"] == 1
        fn, upgrade = registry.resolve_function(f"mgtrace.functional.{name}", 1)
        assert fn is getattr(F, name)
        assert upgrade({"x": 1}) == {"x": 1}
        assert registry.function_name(getattr(F, name)) == f"mgtrace.functional.{name}"


@pytest.mark.parametrize("name", ["add", "sub", "mul", "floordiv", "truediv", "mod", "neg",
                                  "getitem"])
def test_operator_functions_are_registered(name):
    assert registry.resolve_function(f"operator.{name}", 1)[0] is getattr(operator, name)
    assert registry.function_name(getattr(operator, name)) == f"operator.{name}"


def test_functional_names_resolve_to_what_the_module_holds_now(fresh_names, monkeypatch):
    # e.g. the tracer wraps F.relu later: the archive name still finds the current function
    original = F.relu

    def wrapper(*a, **k):
        return original(*a, **k)
    wrapper.__wrapped__ = original
    monkeypatch.setattr(F, "relu", wrapper)
    assert registry.resolve_function("mgtrace.functional.relu", 1)[0] is wrapper
    assert registry.function_name(wrapper) == "mgtrace.functional.relu"
    assert registry.function_name(original) == "mgtrace.functional.relu"


def test_own_module_types_include_builtins_and_containers():
    own = registry.own_module_types()
    assert own["mgtrace.module.Conv2d"] == 1 and own["mgtrace.module.Sequential"] == 1
    assert registry.module_type("mgtrace.module.Linear") is M.Linear
    assert registry.module_type("mgtrace.module.ModuleDict") is M.ModuleDict


@pytest.mark.parametrize("name", ["os.system", "builtins.eval", "subprocess.run",
                                  "collections.OrderedDict", "mgtrace.functional.nope", "", 7])
def test_unknown_function_names_say_how_to_register(name):
    with pytest.raises(mt.serialization.RegistryError, match="not a registered function.*register_function"):
        registry.resolve_function(name, 1)


@pytest.mark.parametrize("name", ["os.system", "collections.OrderedDict", "builtins.object",
                                  "mgtrace.module.Module", "mgtrace.traced_module.TracedModule"])
def test_unknown_module_types_say_how_to_register(name):
    with pytest.raises(mt.serialization.RegistryError, match="not a registered module type.*register_module"):
        registry.module_type(name)


def test_register_function_default_and_explicit_names(fresh_names):
    def swish(x, beta=1.0):
        return x * F.sigmoid(x * beta)
    with pytest.raises(ValueError, match="stable name"):
        registry.register_function(swish)              # defined inside a function
    registry.register_function(swish, name="acme.swish")
    assert registry.function_name(swish) == "acme.swish"
    assert registry.resolve_function("acme.swish", 1)[0] is swish
    with pytest.raises(ValueError, match="already registered as 'acme.swish'"):
        registry.register_function(swish, name="acme.other")
    with pytest.raises(ValueError, match="already taken"):
        registry.register_function(lambda x: x, name="acme.swish")
    with pytest.raises(ValueError, match="mgtrace's own"):
        registry.register_function(lambda x: x, name="mgtrace.functional.relu")
    with pytest.raises(ValueError, match="dotted Python identifiers"):
        registry.register_function(lambda x: x, name="acme swish")
    with pytest.raises(TypeError, match="not a registered function.*register_function"):
        registry.function_name(lambda x: x)


def test_register_function_validates_versions_and_upgraders(fresh_names):
    def f(x):
        return x
    with pytest.raises(TypeError, match="positive int"):
        registry.register_function(f, name="acme.f", version=0)
    with pytest.raises(ValueError, match="1..1"):
        registry.register_function(f, name="acme.f", version=2, upgraders={2: dict})
    with pytest.raises(TypeError, match="not callable"):
        registry.register_function(f, name="acme.f", version=2, upgraders={1: "x"})


# ---- function upgraders: what an old call stored, rebound for the new signature

def test_renamed_parameter_is_renamed_by_its_upgrader(fresh_names):
    def scale_v2(x, k):                 # v1 was scale(x, factor)
        return x * k

    def rename(args):
        args["k"] = args.pop("factor")
        return args
    registry.register_function(scale_v2, name="acme.scale", version=2, upgraders={1: rename})
    args = upgrade_call("acme.scale", 1, {"x": 3, "factor": 2})
    assert args == {"x": 3, "k": 2} and scale_v2(**args) == 6
    assert upgrade_call("acme.scale", 2, {"x": 3, "k": 2}) == {"x": 3, "k": 2}


def test_parameter_inserted_mid_signature_shifts_nothing(fresh_names):
    def affine_v2(x, shift, w):         # v1 was affine(x, w): shift inserted before w
        return x * w + shift
    registry.register_function(affine_v2, name="acme.affine", version=2,
                               upgraders={1: lambda a: {**a, "shift": 0}})
    stored_v1 = {"x": 3, "w": 5}        # arguments are stored by name
    args = upgrade_call("acme.affine", 1, stored_v1)
    assert affine_v2(**args) == 15
    positional = inspect.signature(affine_v2).bind_partial(*stored_v1.values())
    assert positional.arguments == {"x": 3, "shift": 5}   # what storing by position would do


def test_upgrader_chains_run_in_order(fresh_names):
    def f(c):
        return c
    registry.register_function(f, name="acme.chain", version=3, upgraders={
        1: lambda a: {"b": a["a"] + 1}, 2: lambda a: {"c": a["b"] * 10}})
    assert upgrade_call("acme.chain", 1, {"a": 1}) == {"c": 20}
    assert upgrade_call("acme.chain", 2, {"b": 5}) == {"c": 50}


def test_version_errors_name_both_versions(fresh_names):
    def f(x):
        return x
    registry.register_function(f, name="acme.v", version=3, upgraders={2: lambda a: a})
    with pytest.raises(mt.serialization.VersionError, match="version 4 in this archive.*version 3"):
        upgrade_call("acme.v", 4, {})
    with pytest.raises(mt.serialization.VersionError, match="no upgrader from version 1"):
        upgrade_call("acme.v", 1, {})


def test_failing_or_bad_upgraders_raise_archive_error(fresh_names):
    def f(x):
        return x
    registry.register_function(f, name="acme.bad", version=3,
                               upgraders={1: lambda a: a["missing"], 2: lambda a: [a]})
    with pytest.raises(mt.ArchiveError, match="from version 1 to 2 failed: KeyError"):
        upgrade_call("acme.bad", 1, {})
    with pytest.raises(mt.ArchiveError, match="returned a list"):
        upgrade_call("acme.bad", 2, {})


# ---- module-type upgraders: a builtin that gained a config field with a default

class LeakyGate(M.Module):
    """Version 2 gained ``slope`` (version 1 behaved as slope=0.0)."""

    def __init__(self, features, slope=0.01):
        super().__init__()
        self.features, self.slope = features, slope
        self.weight = M.Parameter(mt.tensor([1.0] * features))

    def config(self):
        return {"features": self.features, "slope": self.slope}

    def forward(self, x):
        return F.where(x > 0, x, x * self.slope) * self.weight


registry.register_module(LeakyGate, name="tests.LeakyGate", version=2,
                         upgraders={1: lambda c: {**c, "slope": 0.0}})


def _as_version_1(header):
    entry = header["modules"][0]
    entry["type_version"] = 1
    del entry["config"]["slope"]        # what version 1 wrote


def test_old_module_config_is_upgraded_on_load():
    v1 = edit(save_bytes(LeakyGate(3)), _as_version_1)
    m = load_bytes(v1)
    assert type(m) is LeakyGate and m.slope == 0.0
    assert m(mt.tensor([-1.0, 2.0, -3.0])).tolist() == [0.0, 2.0, 0.0]
    assert upgrade_config("tests.LeakyGate", 1, {"features": 2}) == {"features": 2, "slope": 0.0}
    assert load_bytes(save_bytes(LeakyGate(2, slope=0.5))).slope == 0.5


def test_newer_module_type_version_is_refused():
    newer = edit(save_bytes(LeakyGate(3)), lambda h: h["modules"][0].update(type_version=3))
    with pytest.raises(mt.serialization.VersionError,
                       match="'tests.LeakyGate' is version 3 in this archive.*version 2"):
        load_bytes(newer)


def test_missing_module_upgrader_is_a_version_error():
    class Plain(M.Module):
        def __init__(self, n=1):
            super().__init__()
            self.n = n

        def config(self):
            return {"n": self.n}
    registry.register_module(Plain, name="tests.PlainV2", version=2)
    old = edit(save_bytes(Plain()), lambda h: h["modules"][0].update(type_version=1))
    with pytest.raises(mt.serialization.VersionError, match="no upgrader from version 1.*register_module"):
        load_bytes(old)
