"""What save writes, load reads: every bound and rule the reader enforces
(limits.py) is checked by the writer first, through the same function and
with the same message, before anything is written. Each bound at its
boundary (saved and loaded back) and one past it (refused by save with the
text load gives for an archive edited past it), then a property test:
save succeeds => load succeeds and gives back what was saved."""
import collections
import io
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module as M
from mgtrace.serialization import limits, values
from mgtrace.traced_module.graph import GraphError

from .helpers import assert_same, edit, load_bytes, save_bytes

_M = (1 << 61) - 1            # CPython's int hash modulus: k * _M all hash to 0
X = mt.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))


def _refused_alike(obj, bad_archive, match):
    """save(obj) raises ValueError and load(bad_archive) ArchiveError, both
    matching ``match``; nothing is written to the target file."""
    buf = io.BytesIO()
    with pytest.raises(ValueError, match=match) as saving:
        mt.save(obj, buf)
    assert buf.getvalue() == b""
    with pytest.raises(mt.ArchiveError, match=match) as loading:
        load_bytes(bad_archive)
    return str(saving.value), str(loading.value)


def _same_rule_text(a, b):
    """The rule's text (after the path) is the same on both sides."""
    assert a.rsplit(": ", 1)[-1] == b.rsplit(": ", 1)[-1], (a, b)


# ---------------------------------------------------------------- bounds, one at a time

def test_keys_sharing_a_hash_at_the_bound_and_past_it():
    keys = [k * _M for k in range(1, limits.MAX_SAME_HASH + 2)]
    ok = {"d": {k: i for i, k in enumerate(keys[:-1])}}
    assert load_bytes(save_bytes(ok)) == ok
    too_many = {"d": {k: 0 for k in keys}}

    def fn(h):                          # the archive of `ok` with the one key more
        h["root"]["dict"][0][1]["dict"].append([values.encode(keys[-1], None), 0])
    a, b = _refused_alike(too_many, edit(save_bytes(ok), fn), "more than 16 keys share one hash")
    _same_rule_text(a, b)


class _Child(M.Module):
    def forward(self, x):
        return F.relu(x)


class _Named(M.Module):
    """A child under ``name``: a builtin ReLU (stored by type, so the name is
    only a child name) or, with ``traced``, a traced one (whose qualname
    "_Named.<name>" is a name too)."""

    def __init__(self, name, traced=False):
        super().__init__()
        self.child_name = name
        setattr(self, name, _Child() if traced else M.ReLU())

    def forward(self, x):
        return getattr(self, self.child_name)(x * 2.0) + 1.0


def test_a_submodule_name_at_the_bound_and_past_it():
    n = limits.MAX_NAME_CHARS
    # the longest child name whose names (the child's, its node's, a traced
    # child's qualname "_Named.<name>") all fit saves and loads; one more is refused
    for traced in (False, True):
        k = next(k for k in range(n, n - 20, -1)
                 if _saves(mt.trace_module(_Named("c" * k, traced), X)))
        got = load_bytes(save_bytes(mt.trace_module(_Named("c" * k, traced), X)))
        np.testing.assert_array_equal(got(X).numpy(), X.numpy() * 2 + 1)
        with pytest.raises(ValueError, match=f"characters .*, more than {n}"):
            save_bytes(mt.trace_module(_Named("c" * (k + 1), traced), X))
    with pytest.raises(ValueError, match=f"a name of {n + 1} characters"):
        save_bytes(mt.trace_module(_Named("c" * (n + 1)), X))


def test_a_node_name_at_the_bound_and_past_it():
    n = limits.MAX_NAME_CHARS
    got = load_bytes(save_bytes(_traced_with_node_names("a" * n, "b")))
    np.testing.assert_array_equal(got(X)[0].numpy(), X.numpy() + 1)

    def fn(h):
        h["modules"][0]["graphs"][0]["nodes"][2]["name"] += "a"
    a, b = _refused_alike(_traced_with_node_names("a" * (n + 1), "b"),
                          edit(save_bytes(_traced_with_node_names("a" * n, "b")), fn),
                          f"a name of {n + 1} characters")
    _same_rule_text(a, b)


def _traced_with_node_names(first, second):
    class Two(M.Module):
        def forward(self, x):
            return x + 1.0, x * 3.0
    tm = mt.trace_module(Two(), X)
    add, mul = list(tm.graph.nodes())[2:4]
    add.name, mul.name = first, second
    return tm


def test_node_names_that_are_one_identifier_after_nfkc():
    ok = load_bytes(save_bytes(_traced_with_node_names("\ufb01x", "fix_2")))   # "ﬁx" is "fix"
    assert [o.numpy().tolist() for o in ok(X)] == [(X.numpy() + 1).tolist(),
                                                   (X.numpy() * 3).tolist()]
    # the rename itself refuses the second name (tests/traced_module covers
    # its message); a graph whose names were set past that check is refused
    # by the writer (its lint names the clash) before anything is written
    with pytest.raises(GraphError, match="already has a node named 'fix'"):
        _traced_with_node_names("\ufb01x", "fix")
    forced = _traced_with_node_names("\ufb01x", "fix_2")
    list(forced.graph.nodes())[3]._name = "fix"

    def fn(h):
        h["modules"][0]["graphs"][0]["nodes"][3]["name"] = "fix"
    _refused_alike(forced, edit(save_bytes(_traced_with_node_names("\ufb01x", "fix_2")), fn),
                   "two nodes are named 'fix'")


class _TwoFi(M.Module):
    def __init__(self):
        super().__init__()
        self.fi = M.Linear(3, 3)

    def forward(self, x):
        return self.fi(x)


def test_member_names_that_are_one_identifier_after_nfkc():
    # generated code reads self.\ufb01 as self.fi: a second member of that form is refused at
    # save, and the reader refuses an archive edited to hold one, with the same text
    ok = mt.trace_module(_TwoFi(), X)
    ok.fj = M.Linear(3, 3)
    good = save_bytes(ok)
    np.testing.assert_allclose(load_bytes(good)(X).numpy(), ok(X).numpy(), rtol=1e-6)
    bad = mt.trace_module(_TwoFi(), X)
    bad.__dict__["_modules"]["\ufb01"] = M.Linear(3, 3)    # past setattr's own check
    for table in ("children", "parameters"):
        def fn(h):
            m = next(m for m in h["modules"] if m.get("kind") == "traced")
            if table == "children":
                m["children"] = [[k.replace("fj", "\ufb01"), i] for k, i in m["children"]]
            else:
                m["parameters"]["\ufb01"] = 0
        a, b = _refused_alike(bad, edit(good, fn),
                              "members 'fi' and '\ufb01' are one name to Python")
        _same_rule_text(a, b)


def _nested(n):
    v = 0
    for _ in range(n):
        v = [v]
    return v


def test_value_depth_at_the_bound_and_past_it():
    n = next(n for n in range(90, 110) if not _saves(_nested(n + 1)))
    assert load_bytes(save_bytes(_nested(n))) == _nested(n)

    def fn(h):
        h["root"] = {"list": [h["root"]]}
    _refused_alike(_nested(n + 1), edit(save_bytes(_nested(n)), fn),
                   f"values nest deeper than {limits.MAX_VALUE_DEPTH} levels")


def _saves(obj):
    try:
        save_bytes(obj)
        return True
    except ValueError:
        return False


def test_big_int_digits_at_the_bound_and_past_it():
    big = 10 ** (limits.MAX_INT_DIGITS - 1)          # MAX_INT_DIGITS digits
    assert load_bytes(save_bytes(-big)) == -big
    old = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(limits.MAX_INT_DIGITS + 100)    # a user allowed more
    try:
        with pytest.raises(ValueError, match=f"an int of {limits.MAX_INT_DIGITS + 1} digits, "
                                             f"more than {limits.MAX_INT_DIGITS}"):
            save_bytes(big * 10)
        past = str(big * 10)
    finally:
        sys.set_int_max_str_digits(old)
    bad = edit(save_bytes(big), lambda h: h.update(root={"int": past}))
    with pytest.raises(mt.ArchiveError, match=f"at most {limits.MAX_INT_DIGITS} digits"):
        load_bytes(bad)


def test_namedtuple_fields_and_types_at_the_bound_and_past_it():
    n = limits.MAX_NAMEDTUPLE_FIELDS
    wide = collections.namedtuple("Wide", [f"f{i}" for i in range(n)])(*range(n))
    got = load_bytes(save_bytes(wide))
    assert tuple(got) == tuple(range(n)) and type(got)._fields == wide._fields
    wider = collections.namedtuple("Wider", [f"f{i}" for i in range(n + 1)])(*range(n + 1))
    with pytest.raises(ValueError, match=f"a namedtuple of {n + 1} fields, more than {n}"):
        save_bytes(wider)
    k = limits.MAX_NAMEDTUPLE_TYPES
    types = [collections.namedtuple(f"T{i}", "a") for i in range(k + 1)]
    many = [t(i) for i, t in enumerate(types)]
    buf = io.BytesIO()
    mt.save(M.Sequential(), buf, metadata={"many": many[:k]})
    meta = mt.serialization.load_archive(io.BytesIO(buf.getvalue())).metadata
    assert [t.a for t in meta["many"]] == list(range(k))
    with pytest.raises(ValueError, match=f"more than {k} distinct namedtuple types"):
        mt.save(M.Sequential(), io.BytesIO(), metadata={"many": many})


def test_table_sizes_at_the_bound_and_past_it(monkeypatch):
    monkeypatch.setattr(limits, "MAX_TABLE_ENTRIES", 3)
    ok = [mt.tensor([float(i)]) for i in range(3)]
    assert [t.tolist() for t in load_bytes(save_bytes(ok))] == [[0.0], [1.0], [2.0]]
    more = ok + [mt.tensor([3.0])]
    monkeypatch.setattr(limits, "MAX_TABLE_ENTRIES", 4)
    data = save_bytes(more)
    monkeypatch.setattr(limits, "MAX_TABLE_ENTRIES", 3)
    a, b = _refused_alike(more, data, "header.tensors: 4 entries, more than 3")
    assert a == b


def test_call_arguments_at_the_bound_and_past_it(monkeypatch):
    class Clip(M.Module):
        def forward(self, x):
            return F.clip(x, 1.0, 4.0)
    tm = mt.trace_module(Clip(), X)
    monkeypatch.setattr(limits, "MAX_CALL_ARGS", 3)         # clip(x, lower, upper): three
    np.testing.assert_array_equal(load_bytes(save_bytes(tm))(X).numpy(),
                                  np.clip(X.numpy(), 1.0, 4.0))
    data = save_bytes(tm)
    monkeypatch.setattr(limits, "MAX_CALL_ARGS", 2)
    _refused_alike(tm, data, "3 arguments, more than 2")


def test_module_depth_at_the_bound_and_past_it():
    def nest(n):
        m = M.ReLU()
        for _ in range(n - 1):
            m = M.Sequential(m)
        return m
    n = next(n for n in range(60, 70) if not _saves(nest(n + 1)))
    assert n == limits.MAX_MODULE_DEPTH
    got = load_bytes(save_bytes(nest(n)))
    for _ in range(n - 1):
        got = got[0]
    assert isinstance(got, M.ReLU)
    with pytest.raises(ValueError, match=f"modules nest deeper than {limits.MAX_MODULE_DEPTH}"):
        save_bytes(nest(n + 1))


# ---------------------------------------------------------------- the property

_COLLIDING = [k * _M for k in range(1, 20)]
_KEYS = st.one_of(st.sampled_from(_COLLIDING), st.integers(-3, 3),
                  st.text(max_size=3), st.sampled_from(["\ufb01", "fi", "x" * 1025]))
_LEAVES = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
                    st.text(max_size=5), st.sampled_from([2 ** 70, -(10 ** 4299), b"\x00"]))


def _deep(child):
    return st.tuples(st.integers(95, 105), child).map(lambda p: _wrap(*p))


def _wrap(n, v):
    for _ in range(n):
        v = [v]
    return v


def _colliding(child):
    """A dict of 14 to 19 keys that share one hash (the bound is 16)."""
    return st.tuples(st.integers(14, 19), child).map(
        lambda p: {k * _M: p[1] for k in range(1, p[0] + 1)})


_VALUES = st.recursive(
    _LEAVES,
    lambda child: st.one_of(st.lists(child, max_size=3), st.tuples(child, child),
                            st.dictionaries(_KEYS, child, max_size=20),
                            _deep(child), _colliding(child)),
    max_leaves=40)


@settings(max_examples=120, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(_VALUES)
def test_property_save_succeeds_implies_load_reproduces_values(value):
    try:
        data = save_bytes({"v": value})
    except (ValueError, TypeError):
        return                          # refused before writing: the model is not lost
    assert_same(load_bytes(data), {"v": value})


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1020, 1030), st.sampled_from(["\ufb01x", "fix", "fi_x", "x" * 1030]),
       st.sampled_from(["fix", "fix_1", "\ufb01x", "y" * 1024]))
def test_property_save_succeeds_implies_load_reproduces_modules(child_len, first, second):
    tm = mt.trace_module(_Named("c" * child_len, traced=child_len % 2 == 0), X)
    try:
        two = _traced_with_node_names(first, second)
    except GraphError:                  # the rename refuses a name the graph has (NFKC form)
        assume(False)
    net = M.Sequential(tm, M.ReLU())
    for obj, want in ((net, np.maximum(X.numpy() * 2 + 1, 0)), (two, None)):
        try:
            data = save_bytes(obj)
        except ValueError:
            continue
        got = load_bytes(data)
        out = got(X)
        if want is not None:
            np.testing.assert_array_equal(out.numpy(), want)
        else:
            np.testing.assert_array_equal(out[0].numpy(), X.numpy() + 1)
            np.testing.assert_array_equal(out[1].numpy(), X.numpy() * 3)


def test_the_build_budget_at_the_bound_and_past_it(monkeypatch):
    # three Linears tie one weight and bias: stored once (110 elements), built
    # three times (330), against twice the stored elements plus the slack
    fcs = [M.Linear(10, 10) for _ in range(3)]
    for fc in fcs[1:]:
        fc.weight, fc.bias = fcs[0].weight, fcs[0].bias
    net = M.Sequential(fcs[0], M.ReLU(), fcs[1], M.ReLU(), fcs[2])
    x = mt.tensor(np.ones((1, 10), np.float32))
    monkeypatch.setattr(limits, "BUILD_SLACK_ELEMENTS", 110)             # 2 * 110 + 110 = 330
    data = save_bytes(net)
    got = load_bytes(data)
    np.testing.assert_allclose(got(x).numpy(), net(x).numpy(), rtol=1e-6)
    assert got[0].weight is got[2].weight is got[4].weight
    monkeypatch.setattr(limits, "BUILD_SLACK_ELEMENTS", 109)
    a, b = _refused_alike(net, data, "tensor elements, more than the")
    assert "would allocate 330 tensor elements, more than the 329" in a     # in all
    assert "would allocate 110 tensor elements, more than the 109" in b     # the third
