"""Pytrees: the structures of forward's arguments and results.

Unit tests of tree_flatten / TreeDef (flatten, unflatten, match, equality),
then traces whose arguments and results are tuples, lists, dicts, namedtuples,
None and constants, a registered user container, and forward's positional,
keyword and default arguments; each traced run is checked against eager.
"""
import collections

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.module as M
from mgtrace.traced_module import (TraceWarning, TreeDef, register_supported_type, tree_flatten,
                                   tree_map)
from mgtrace.traced_module.pytree import TreeMismatch

Pt = collections.namedtuple("Pt", "x y")


def _is_float(v):
    return isinstance(v, float)


def _t(a):
    return mt.tensor(np.asarray(a, dtype="float32"))


def _rand(*shape, seed=0):
    return _t(np.random.default_rng(seed).standard_normal(shape))


def _same(a, b):
    """Equal pytrees: same structure and types, equal tensors."""
    if isinstance(a, mt.Tensor):
        assert isinstance(b, mt.Tensor) and a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_array_equal(a.numpy(), b.numpy())
        return
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for u, v in zip(a, b):
            _same(u, v)
    else:
        assert a == b


# ------------------------------------------------------------------- units
def test_flatten_unflatten_roundtrip_keeps_types_order_and_constants():
    value = (1.0, [2.0, "s", None], {"b": 3.0, "a": (4.0,)}, Pt(5.0, 7), slice(1, 6.0))
    leaves, tdef = tree_flatten(value, _is_float)
    assert leaves == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert tdef.num_leaves == 6
    back = tdef.unflatten([10.0, 20.0, 30.0, 40.0, 50.0, 60.0])
    assert back == (10.0, [20.0, "s", None], {"b": 30.0, "a": (40.0,)}, Pt(50.0, 7),
                    slice(1, 60.0))
    assert list(back[2]) == ["b", "a"] and type(back[3]) is Pt
    assert tree_map(lambda v: v * 2, value, _is_float)[1] == [4.0, "s", None]


def test_a_bare_leaf_and_a_bare_constant():
    leaves, tdef = tree_flatten(2.0, _is_float)
    assert leaves == [2.0] and tdef.unflatten([3.0]) == 3.0
    leaves, tdef = tree_flatten("const", _is_float)
    assert leaves == [] and tdef.unflatten([]) == "const"


def test_treedef_equality_and_hash_see_structure_and_constants():
    a = tree_flatten((1.0, {"k": 2}), _is_float)[1]
    b = tree_flatten((9.0, {"k": 2}), _is_float)[1]
    c = tree_flatten((9.0, {"k": 3}), _is_float)[1]
    d = tree_flatten([9.0, {"k": 2}], _is_float)[1]
    e = tree_flatten((9.0, {"k": 2.0}), lambda v: False)[1]
    assert a == b and hash(a) == hash(b)
    assert a != c and a != d and a != e
    # a bool constant is not an int constant
    assert tree_flatten((1, True), _is_float)[1] != tree_flatten((1, 1), _is_float)[1]


def test_match_binds_dicts_by_key_and_names_the_first_difference():
    _, tdef = tree_flatten(({"a": 1.0, "b": 2.0}, 5), _is_float)
    assert tdef.match(({"b": 20.0, "a": 10.0}, 5), _is_float) == [10.0, 20.0]
    with pytest.raises(TreeMismatch, match=r"args\[1\]: the module was traced with 5, got 6"):
        tdef.match(({"a": 1.0, "b": 2.0}, 6), _is_float)
    with pytest.raises(TreeMismatch, match=r"args\[0\]: expected keys"):
        tdef.match(({"a": 1.0}, 5), _is_float)
    with pytest.raises(TreeMismatch, match=r"args\[0\]\['b'\]: expected a tensor, got 'x'"):
        tdef.match(({"a": 1.0, "b": "x"}, 5), _is_float)
    with pytest.raises(TreeMismatch, match="expected dict, got list"):
        tdef.match(([1.0, 2.0], 5), _is_float)
    assert issubclass(TreeMismatch, TypeError)


class Box:
    def __init__(self, items, tag):
        self.items, self.tag = list(items), tag


register_supported_type(Box, lambda b: (b.items, b.tag), lambda c, tag: Box(c, tag))


def test_register_supported_type():
    leaves, tdef = tree_flatten(Box([1.0, "k", 2.0], "t"), _is_float)
    assert leaves == [1.0, 2.0]
    back = tdef.unflatten([3.0, 4.0])
    assert type(back) is Box and back.items == [3.0, "k", 4.0] and back.tag == "t"
    assert tdef != tree_flatten(Box([1.0, "k", 2.0], "u"), _is_float)[1]     # aux counts
    assert tdef.slot_values(Box([5.0, "k", 6.0], "t")) == [5.0, 6.0]
    with pytest.raises(TypeError, match="needs flatten and unflatten"):
        register_supported_type(dict.__class__)


def test_treedef_is_exported():
    assert isinstance(tree_flatten((1.0,), _is_float)[1], TreeDef)


# ----------------------------------------------------------------- tracing
class Structured(M.Module):
    def forward(self, pair, named, feats, scale=3, mode="sum", extra=None):
        a, b = pair
        out = {"second": b * scale, "first": a + named.x}
        if mode == "sum":
            out["feats"] = [feats["img"] + feats["txt"], None]
        else:
            out["feats"] = [feats["img"] * feats["txt"], None]
        out["named"] = Pt(named.y - 1, 7)
        if extra is not None:
            out["extra"] = extra
        return out, 11, None


def _args(seed):
    r = lambda s: _rand(2, 3, seed=seed + s)        # noqa: E731
    return (r(0), r(1)), Pt(r(2), r(3)), {"img": r(4), "txt": r(5)}


def test_structured_arguments_and_results():
    net = Structured()
    tm = mt.trace_module(net, *_args(0))
    pair, named, feats = _args(10)
    got, want = tm(pair, named, feats), net(pair, named, feats)
    _same(got, want)
    assert list(got[0]) == ["second", "first", "feats", "named"]       # key order of the trace
    assert type(got[0]["named"]) is Pt and got[0]["named"].y == 7


def test_dict_inputs_are_bound_by_key_not_position():
    net = Structured()
    tm = mt.trace_module(net, *_args(0))
    pair, named, feats = _args(20)
    swapped = {"txt": feats["txt"] * 2, "img": feats["img"]}            # other order, new values
    _same(tm(pair, named, swapped), net(pair, named, swapped))


def test_defaults_keywords_and_constant_arguments():
    net = Structured()
    tm = mt.trace_module(net, *_args(0))                 # scale=3, mode="sum" by default
    pair, named, feats = _args(30)
    want = net(pair, named, feats)
    _same(tm(pair, named, feats, 3), want)                # positional, same value
    _same(tm(pair, named, feats, scale=3, mode="sum"), want)
    _same(tm(pair=pair, named=named, feats=feats), want)
    with pytest.raises(TypeError, match=r"scale: the module was traced with 3, got 4"):
        tm(pair, named, feats, scale=4)
    with pytest.raises(TypeError, match=r"mode: the module was traced with 'sum', got 'prod'"):
        tm(pair, named, feats, mode="prod")
    with pytest.raises(TypeError, match=r"extra: the module was traced with None"):
        tm(pair, named, feats, extra=_rand(1))
    with pytest.raises(TypeError, match="missing a required argument: 'feats'"):
        tm(pair, named)
    with pytest.raises(TypeError, match=r"pair: expected tuple, got list"):
        tm(list(pair), named, feats)


def test_a_keyword_traced_value_is_kept():
    net = Structured()
    tm = mt.trace_module(net, *_args(0), scale=2, mode="prod")
    pair, named, feats = _args(40)
    _same(tm(pair, named, feats, scale=2, mode="prod"), net(pair, named, feats, 2, "prod"))
    _same(tm(pair, named, feats, 2, "prod"), net(pair, named, feats, 2, "prod"))
    with pytest.raises(TypeError, match="scale: the module was traced with 2, got 3"):
        tm(pair, named, feats, mode="prod")              # the default differs from the trace


class Boxed(M.Module):
    def forward(self, box):
        return Box([box.items[0] * 2, box.items[1] + 1], box.tag + "!")


def test_registered_container_in_and_out():
    net = Boxed()
    tm = mt.trace_module(net, Box([_rand(2), _rand(2, seed=1)], "t"))
    arg = Box([_rand(3, seed=2), _rand(3, seed=3)], "t")
    got, want = tm(arg), net(arg)
    assert type(got) is Box and got.tag == "t!"
    for g, w in zip(got.items, want.items):
        np.testing.assert_array_equal(g.numpy(), w.numpy())
    with pytest.raises(TypeError, match="a Box whose flatten gave aux 't', got 'other'"):
        tm(Box(arg.items, "other"))


class Varargs(M.Module):
    def forward(self, x, *rest, k=1.0, **named):
        out = x * k
        for r in rest:
            out = out + r
        return out - named["bias"]


def test_varargs_and_var_keywords():
    net = Varargs()
    x, r1, r2, b = (_rand(2, seed=s) for s in range(4))
    tm = mt.trace_module(net, x, r1, r2, k=2.0, bias=b)
    assert [n.name for n in tm.graph.inputs[1:]] == ["x", "rest_0", "rest_1", "named_bias"]
    x, r1, r2, b = (_rand(2, seed=s) for s in range(10, 14))
    np.testing.assert_array_equal(tm(x, r1, r2, k=2.0, bias=b).numpy(),
                                  net(x, r1, r2, k=2.0, bias=b).numpy())
    with pytest.raises(TypeError, match="match no traced call"):
        tm(x, r1, k=2.0, bias=b)                          # one *rest entry fewer


class TwoInputs(M.Module):
    def forward(self, a, b):
        return a * 2 + b


def test_one_tensor_passed_twice_warns_and_reads_the_first_input():
    net = TwoInputs()
    x = _rand(3)
    with pytest.warns(TraceWarning, match="passed as both a and b"):
        tm = mt.trace_module(net, x, x)
    a, b = tm.graph.inputs[1:]
    assert len(a.users) == 2 and not b.users       # the graph cannot tell them apart
    y = _rand(3, seed=1)
    np.testing.assert_allclose(tm(y, y).numpy(), net(y, y).numpy(), rtol=1e-6)
    np.testing.assert_allclose(tm(y, x).numpy(), 3 * y.numpy(), rtol=1e-6)


class WithDefault(M.Module):
    def forward(self, x, y, scale=3, *, mode="add"):
        return x * scale + y if mode == "add" else x * y


def test_the_fast_path_binds_as_bind_and_match_do():
    net = WithDefault()
    x, y = _rand(2), _rand(2, seed=1)
    tm = mt.trace_module(net, x, y)
    assert tm._plain_graph((x, y)) is tm.graph                 # plain positional tensors
    assert tm._plain_graph((x, 2)) is None                     # not a tensor: the full check
    assert tm._plain_graph((x,)) is None
    a, b = _rand(3, seed=2), _rand(3, seed=3)
    want = net(a, b).numpy()
    np.testing.assert_array_equal(tm(a, b).numpy(), want)
    np.testing.assert_array_equal(tm(a, b, 3).numpy(), want)
    np.testing.assert_array_equal(tm(a, y=b, mode="add").numpy(), want)
    with pytest.raises(TypeError, match="scale: the module was traced with 3, got 4"):
        tm(a, b, 4)
    with pytest.raises(TypeError, match="missing a required argument: 'y'"):
        tm(a)
    with pytest.raises(TypeError, match="too many positional arguments"):
        tm(a, b, 3, "add")
    # traced with a non-default: no fast path for two tensors, the check still runs
    tm2 = mt.trace_module(net, x, y, 5)
    assert tm2._plain_graph((a, b)) is None
    with pytest.raises(TypeError, match="scale: the module was traced with 5, got 3"):
        tm2(a, b)
    np.testing.assert_array_equal(tm2(a, b, 5).numpy(), net(a, b, 5).numpy())


def test_the_fast_path_follows_graph_edits():
    net = TwoInputs()
    tm = mt.trace_module(net, _rand(2), _rand(2, seed=1))
    a, b, c = _rand(2, seed=2), _rand(2, seed=3), _rand(2, seed=4)
    tm(a, b)                                                    # fills the fast-path table
    node = tm.graph.add_input_node(shape=(2,), name="c")
    out = tm.graph.outputs[0]
    with tm.graph.insert_exprs():
        new_out = out + node
    tm.graph.reset_outputs(new_out)
    np.testing.assert_allclose(tm(a, b, c).numpy(), net(a, b).numpy() + c.numpy(), rtol=1e-6)
    with pytest.raises(TypeError, match="missing a required argument: 'c'"):
        tm(a, b)
