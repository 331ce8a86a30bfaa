"""values.py: every tag round-trips to the same type and bits, the tag set is
closed, and the decoder refuses malformed or too-deep values."""
import math
import struct
from collections import OrderedDict, namedtuple

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mgtrace as mt
from mgtrace.serialization import values
from mgtrace.serialization.limits import MAX_VALUE_DEPTH

from .helpers import assert_same, load_bytes, save_bytes


def roundtrip(v):
    """Through the tag codec and msgpack, as in a header."""
    packed = msgpack.packb(values.encode(v, None), use_bin_type=True)
    return values.decode(msgpack.unpackb(packed, raw=False), None)


def nan(payload):
    return struct.unpack("<d", struct.pack("<Q", 0x7FF8_0000_0000_0000 | payload))[0]


CASES = {
    "none": None, "true": True, "one": 1, "one float": 1.0, "str": "héllo", "bytes": b"\x00\xff",
    "minus zero": -0.0, "nan payload": nan(0xBEEF), "inf": -math.inf,
    "int64 min": -(1 << 63), "uint64 max": (1 << 64) - 1, "big": 1 << 200, "big negative": -(1 << 64),
    "tuple vs list": ((1, 2), [1, 2], ()),
    "dict with int and tuple keys": {3: "a", (1, "x"): "b", "s": None, 2.5: 1, None: 0},
    "ordered dict": OrderedDict([("b", 1), ("a", 2)]),
    "key order kept": {"z": 1, "a": 2, "m": 3},
    "numpy scalars": [np.float32(1.5), np.float16(-0.0), np.int8(-3), np.uint64(2**64 - 1),
                      np.bool_(False), np.float64(nan(7)), np.int64(-1), np.uint32(4)],
    "slices": (slice(None), slice(1, -1, 2), slice(None, 3)),
    "ellipsis": (Ellipsis, 0),
    "dtypes": [np.dtype("int8"), np.dtype("float32"), mt.as_dtype("bfloat16")],
    "device": mt.Device("cpu:0"),
}


@pytest.mark.parametrize("name", CASES)
def test_round_trip_keeps_type_and_bits(name):
    assert_same(roundtrip(CASES[name]), CASES[name])


def test_bfloat16_scalar_and_nan_bits_of_float32():
    bf = mt.as_dtype("bfloat16").type(1.25)
    f32_nan = np.frombuffer(struct.pack("<I", 0x7FC0_1234), np.float32)[0]
    for v in (bf, f32_nan):
        assert_same(roundtrip(v), v)


def test_dtype_type_objects_become_dtypes():
    assert roundtrip(np.float32) == np.dtype("float32")


def test_tags_are_one_declaration():
    # the closed set of STYLE.md item 2: the encoder, decoder and schema all refer to it
    assert set(values.TAGS) == set(values._DECODERS)
    for tag, decl in values.TAGS.items():
        new_in_1_2 = tag in ("complex", "qdtype")
        assert decl.payload and decl.since == ((1, 2) if new_in_1_2 else (1, 0)), tag


@pytest.mark.parametrize("bad", [{1, 2}, frozenset(), object(), np.clongdouble(1),
                                 np.str_("s"), np.datetime64(1, "D")])
def test_unstorable_values_raise_type_error_with_path(bad):
    with pytest.raises(TypeError, match=r"value\['k'\]\[1\]: cannot store"):
        values.encode({"k": [0, bad]}, None)


def test_unsupported_dtype_is_refused():
    with pytest.raises(TypeError, match="dtype"):
        values.encode(np.dtype("clongdouble"), None)


def test_reference_cycle_or_too_deep_is_refused_on_save():
    v = []
    v.append(v)
    with pytest.raises(ValueError, match="deeper than"):
        values.encode(v, None)


def test_nesting_up_to_the_limit_round_trips():
    v = 0
    for _ in range(MAX_VALUE_DEPTH - 1):
        v = (v,)
    assert roundtrip(v) == v


@pytest.mark.parametrize("tagged, reason", [
    ({"pickle": b"\x80\x04K\x01."}, "pickle"),
    ({"tuple": [1], "list": [2]}, "one tag"),
    ({"tuple": "x"}, "expected a list"),
    ([1, 2], "expected a value"),
    ({"dict": [[{"list": [1]}, 2]]}, "hashable"),
    ({"dict": [["a", 1], ["a", 2]]}, "twice"),
    ({"dict": [["a"]]}, "list of 2"),
    ({"int": "12x"}, "decimal"),
    ({"int": "9" * 5000}, "decimal"),
    ({"scalar": ["object", b""]}, "unknown scalar dtype"),
    ({"scalar": ["float32", b"\x00"]}, "4 bytes"),
    ({"scalar": ["bool", b"\x02"]}, "byte 0 or 1"),
    ({"slice": [1, 2]}, "list of 3"),
    ({"ellipsis": 1}, "nil"),
    ({"dtype": "O"}, "unknown dtype"),
    ({"device": "moon:0"}, "unknown device"),
    ({"device": "c" * 1000}, "device string"),
    ({"tensor": -1}, "index"),
    ({"tensor": True}, "index"),
    ({"node": 3}, "outside a graph"),
])
def test_malformed_values_raise_archive_error(tagged, reason):
    with pytest.raises(mt.ArchiveError, match=reason):
        values.decode(tagged, ctx=object())   # checks come before any table lookup


def test_too_deep_values_raise_archive_error():
    v = 0
    for _ in range(MAX_VALUE_DEPTH + 5):
        v = {"list": [v]}
    with pytest.raises(mt.ArchiveError, match="deeper than"):
        values.decode(v, None)


def test_node_tags_go_through_the_given_resolvers():
    class Node:
        def __init__(self, i):
            self.i = i
    a, b = Node(4), Node(9)
    tagged = values.encode((a, [b, 1]), None, node_id=lambda o: o.i if isinstance(o, Node) else None)
    assert tagged == {"tuple": [{"node": 4}, {"list": [{"node": 9}, 1]}]}
    assert values.decode(tagged, None, node=lambda i: f"n{i}") == ("n4", ["n9", 1])


def test_bool_int_float_stay_distinct_in_an_archive():
    out = load_bytes(save_bytes([True, 1, 1.0, np.int32(1), {1: "i", True: "b"}]))
    assert_same(out, [True, 1, 1.0, np.int32(1), {1: "b"}])   # dict({1:..., True:...}) has one key


scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True),
                    st.text(max_size=5), st.binary(max_size=5))
keys = st.one_of(st.integers(), st.text(max_size=3), st.tuples(st.integers(), st.text(max_size=2)))
trees = st.recursive(scalars, lambda c: st.one_of(
    st.lists(c, max_size=3), st.tuples(c, c), st.dictionaries(keys, c, max_size=3)), max_leaves=12)


@settings(max_examples=200, deadline=None)
@given(trees)
def test_random_values_round_trip(v):
    assert_same(roundtrip(v), v)


def test_namedtuples_come_back_as_look_alikes():
    Point = namedtuple("Point", "x y")
    v = {"p": Point(1, (Point(2.0, None), [3]))}
    tagged = values.encode(v, None)
    assert tagged["dict"][0][1]["namedtuple"][:3] == [__name__, "Point", ["x", "y"]]
    out = values.decode(tagged, None)
    p = out["p"]
    assert type(p) is not Point and type(p).__name__ == "Point" and p._fields == ("x", "y")
    assert type(p).__module__ == __name__ and type(p) is type(p.y[0])   # one class per name
    assert p == Point(1, (Point(2.0, None), [3])) and p.y[1] == [3]
    assert values.encode(out, None) == tagged                          # same bytes again


@pytest.mark.parametrize("payload", [
    ["m", "P; import os", ["a"], [1]], ["m", "class", ["a"], [1]], ["m", "P", ["_a"], [1]],
    ["m", "P", ["a", "a"], [1, 2]], ["m", "P", ["a b"], [1]], ["m", "P", ["a"], [1, 2]],
    ["m", "P", "ab", [1]], [1, "P", ["a"], [1]], ["m", "P", ["a"]]])
def test_bad_namedtuples_are_archive_errors(payload):
    with pytest.raises(mt.ArchiveError, match="namedtuple|expected"):
        values.decode({"namedtuple": payload}, None)
