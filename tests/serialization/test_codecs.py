"""codecs.py and context.py: the module-codec plug-in interface end to end,
with a toy kind that stores a chain of function calls the way the traced
codec stores exprs (op-table indices, arguments by parameter name, node
references, tensors); function upgraders then rebind old calls on load."""
import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module as M
from mgtrace.serialization import Field, register_module_codec, registry
from mgtrace.serialization.codecs import codecs

from .helpers import edit, load_bytes, save_bytes, split

PREV = object()     # stands for "the previous call's result", stored as {"node": 0}


class Calls(M.Module):
    """forward(x) runs fn(**args) for each call, PREV bound to the running value."""

    def __init__(self, calls):
        super().__init__()
        self.calls = calls

    def forward(self, x):
        for fn, args in self.calls:
            x = fn(**{k: x if v is PREV else v for k, v in args.items()})
        return x


def encode(m, ctx):
    node_id = lambda obj: 0 if obj is PREV else None   # noqa: E731
    return {"calls": [{"op": ctx.op(fn), "args": {k: ctx.value(v, node_id=node_id)
                                                  for k, v in args.items()}}
                      for fn, args in m.calls]}


def check(entry, ctx, where):
    for i, call in enumerate(entry["calls"]):
        ctx.op(call["op"])                  # bad indices fail before anything is built


def decode(entry, ctx):
    calls = []
    for call in entry["calls"]:
        op = ctx.op(call["op"])
        args = {k: ctx.value(v, node=lambda i: PREV) for k, v in call["args"].items()}
        calls.append((op.fn, op.upgrade(args)))
    return Calls(calls)


if "test_calls" not in codecs():
    register_module_codec("test_calls", Calls, encode, decode, check=check,
                          fields=(Field("calls", "value", True, (1, 0), "the calls"),))


@pytest.fixture
def scale_v1():
    def scale(x, w):
        return x * w
    registry.register_function(scale, name="tests.scale")
    yield scale
    registry._unregister_function("tests.scale")


def chain(scale):
    bias = mt.tensor(np.array([1.0, -1.0], np.float32))
    return Calls([(scale, {"x": PREV, "w": 3.0}), (F.add, {"x": PREV, "y": bias}),
                  (F.relu, {"x": PREV})])


def test_a_plugged_in_kind_round_trips(scale_v1):
    data = save_bytes(chain(scale_v1))
    header, _ = split(data)
    assert header["ops"] == [{"name": "tests.scale", "version": 1},
                             {"name": "mgtrace.functional.add", "version": 1},
                             {"name": "mgtrace.functional.relu", "version": 1}]
    entry = header["modules"][0]
    assert entry["kind"] == "test_calls"
    assert entry["calls"][1]["args"] == {"x": {"node": 0}, "y": {"tensor": 0}}
    out = load_bytes(data)
    assert type(out) is Calls
    assert out(mt.tensor([1.0, 2.0])).tolist() == [4.0, 5.0]


def test_old_calls_are_rebound_by_name_after_a_parameter_is_inserted(scale_v1):
    data = save_bytes(chain(scale_v1))
    registry._unregister_function("tests.scale")

    def scale(x, offset, w):            # version 2 inserted `offset` before `w`
        return x * w + offset
    registry.register_function(scale, name="tests.scale", version=2,
                               upgraders={1: lambda a: {**a, "offset": 0.0}})
    out = load_bytes(data)
    assert out.calls[0][1] == {"x": PREV, "w": 3.0, "offset": 0.0}
    assert out(mt.tensor([1.0, 2.0])).tolist() == [4.0, 5.0]


def test_without_an_upgrader_the_load_fails_before_anything_is_built(scale_v1):
    data = save_bytes(chain(scale_v1))
    registry._unregister_function("tests.scale")
    registry.register_function(lambda x, w: x, name="tests.scale", version=2)
    with pytest.raises(mt.serialization.VersionError, match="'tests.scale' is version 1.*version 2"):
        load_bytes(data)


def test_unregistered_functions_cannot_be_saved_or_loaded(scale_v1):
    def private(x):
        return x
    with pytest.raises(TypeError, match="not a registered function.*register_function"):
        save_bytes(Calls([(private, {"x": PREV})]))
    data = save_bytes(chain(scale_v1))
    registry._unregister_function("tests.scale")
    with pytest.raises(mt.serialization.RegistryError, match="'tests.scale'.*register_function"):
        load_bytes(data)
    registry.register_function(scale_v1, name="tests.scale")   # for the fixture's teardown


def test_bad_op_indices_and_missing_fields_fail_the_check(scale_v1):
    data = save_bytes(chain(scale_v1))
    with pytest.raises(mt.ArchiveError, match=r"index 7 is out of range for header.ops"):
        load_bytes(edit(data, lambda h: h["modules"][0]["calls"][0].update(op=7)))
    with pytest.raises(mt.ArchiveError, match=r"modules\[0\]: the required field 'calls'"):
        load_bytes(edit(data, lambda h: h["modules"][0].pop("calls")))


def test_unknown_kinds_are_refused():
    data = edit(save_bytes(M.ReLU()), lambda h: h["modules"][0].update(kind="pickle"))
    with pytest.raises(mt.ArchiveError, match="unknown module kind 'pickle'.*never loaded"):
        load_bytes(data)


def test_codec_registration_is_checked():
    with pytest.raises(ValueError, match="already has a codec"):
        register_module_codec("builtin", M.Module, encode, decode)
    with pytest.raises(TypeError, match="class or a predicate"):
        register_module_codec("x_bad", 3, encode, decode)
    with pytest.raises(TypeError, match="Field"):
        register_module_codec("x_bad", M.Module, encode, decode, fields=("calls",))
    with pytest.raises(ValueError, match="newer than this writer"):
        register_module_codec("x_bad", M.Module, encode, decode, since=(1, 9))
