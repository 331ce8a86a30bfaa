"""limits.py: what keeps a load linear in the file's size -- dict keys that
share a hash, names too long, graphs and tables too large are refused with
ArchiveError; generated names stay unique without quadratic searching."""
import numpy as np
import pytest

import mgtrace as mt
import mgtrace.module as M
from mgtrace.serialization import limits, values
from mgtrace.traced_module import codegen

from .helpers import edit, load_bytes, save_bytes

_M = (1 << 61) - 1            # CPython's int hash modulus: k * _M all hash to 0


def test_dict_keys_sharing_a_hash_are_refused():
    keys = [k * _M for k in range(1, limits.MAX_SAME_HASH + 2)]
    assert len({hash(k) for k in keys}) == 1
    tagged = {"dict": [[values.encode(k, None), i] for i, k in enumerate(keys)]}
    with pytest.raises(mt.ArchiveError, match="share one hash"):
        values.decode(tagged, None)
    ok = {"dict": [[values.encode(k, None), i] for i, k in enumerate(keys[:-1])]}
    assert list(values.decode(ok, None)) == keys[:-1]
    # honest dicts with a chance collision load: hash(-1) == hash(-2)
    assert values.decode(values.encode({-1: "a", -2: "b"}, None), None) == {-1: "a", -2: "b"}


def test_a_stored_dict_of_colliding_keys_is_an_archive_error():
    keys = [k * _M for k in range(1, 200)]
    data = save_bytes({"d": {k: 0 for k in keys[:2]}})
    def fn(h):
        h["root"]["dict"][0][1] = {"dict": [[values.encode(k, None), 0] for k in keys]}
    with pytest.raises(mt.ArchiveError, match="share one hash"):
        load_bytes(edit(data, fn))


def _traced():
    net = M.Sequential(M.Linear(3, 3), M.ReLU())
    return save_bytes(mt.trace_module(net, mt.tensor(np.ones((1, 3), "float32"))))


def _graph(h):
    return next(m for m in h["modules"] if m["kind"] == "traced")["graphs"][0]


def test_a_node_name_longer_than_the_limit_is_refused():
    def fn(h):
        _graph(h)["nodes"][-1]["name"] = "x" * (limits.MAX_NAME_CHARS + 1)
    with pytest.raises(mt.ArchiveError, match=f"more than {limits.MAX_NAME_CHARS}"):
        load_bytes(edit(_traced(), fn))


def test_a_graph_with_more_exprs_than_the_limit_is_refused(monkeypatch):
    data = _traced()
    monkeypatch.setattr(limits, "MAX_GRAPH_EXPRS", 2)
    with pytest.raises(mt.ArchiveError, match="more than a graph may have"):
        load_bytes(data)
    with pytest.raises(ValueError, match="more than a graph may have"):     # nor written
        _traced()


def test_tables_longer_than_the_limit_are_refused(monkeypatch):
    data = _traced()
    monkeypatch.setattr(limits, "MAX_TABLE_ENTRIES", 1)
    with pytest.raises(mt.ArchiveError, match="header.modules: 3 entries, more than 1"):
        load_bytes(data)
    with pytest.raises(ValueError, match="header.modules: 3 entries, more than 1"):
        _traced()


def test_names_that_sanitise_alike_get_unique_identifiers_in_order():
    namer = codegen._Namer()
    names = [namer.fresh(s) for s in ["a b", "a-b", "a.b", "a_b", "a_1", "a_b_1", "a b"] * 3000]
    assert len(set(names)) == len(names)
    assert names[:6] == ["a_b", "a_b_1", "a_b_2", "a_b_3", "a_1", "a_b_4"]
    assert all(n.isidentifier() for n in names)


def test_graph_node_names_stay_unique_when_many_share_a_base():
    from mgtrace.traced_module.graph import InternalGraph
    g = InternalGraph("g", "G")
    got = []
    for _ in range(20000):
        got.append(g._unique_name("y"))
        g._names[got[-1]] = object()
    assert got[:3] == ["y", "y_1", "y_2"] and got[-1] == "y_19999"
    assert len(set(got)) == len(got)


def test_a_dict_treedef_of_colliding_keys_is_refused():
    data = _traced()

    def fn(h):
        keys = [{"int": str(k * _M)} for k in range(1, 200)]
        _graph(h)["out_def"] = {"type": "dict", "aux": {"tuple": keys},
                                "children": [{"slot": True}] * len(keys)}
    with pytest.raises(mt.ArchiveError, match="share one hash"):
        load_bytes(edit(data, fn))


def test_a_call_with_too_many_keywords_is_refused():
    def fn(h):
        e = next(e for e in _graph(h)["exprs"] if e["kind"] == "call_method")
        e["kwargs"] = {f"k{i}": 0 for i in range(limits.MAX_CALL_ARGS + 1)}
    with pytest.raises(mt.ArchiveError, match=f"more than {limits.MAX_CALL_ARGS}"):
        load_bytes(edit(_traced(), fn))


def test_namedtuple_types_fields_and_names_are_bounded():
    import io
    data = save_bytes({"x": 1})

    def load_bytes(b):                   # metadata is decoded by load_archive
        return mt.serialization.load_archive(io.BytesIO(b))
    many = [{"namedtuple": ["m", f"T{i}", ["a"], [0]]}
            for i in range(limits.MAX_NAMEDTUPLE_TYPES + 1)]
    with pytest.raises(mt.ArchiveError, match="distinct namedtuple types"):
        load_bytes(edit(data, lambda h: h.update(metadata={"list": many})))
    wide = {"namedtuple": ["m", "T", [f"f{i}" for i in range(limits.MAX_NAMEDTUPLE_FIELDS + 1)],
                           [0] * (limits.MAX_NAMEDTUPLE_FIELDS + 1)]}
    with pytest.raises(mt.ArchiveError, match="more than"):
        load_bytes(edit(data, lambda h: h.update(metadata=wide)))
    long = {"namedtuple": ["m" * (limits.MAX_NAME_CHARS + 1), "T", ["a"], [0]]}
    with pytest.raises(mt.ArchiveError, match="more than"):
        load_bytes(edit(data, lambda h: h.update(metadata=long)))
    fine = [{"namedtuple": ["m", f"T{i}", ["a"], [i]]} for i in range(3)]
    meta = load_bytes(edit(data, lambda h: h.update(metadata={"list": fine}))).metadata
    assert [t.a for t in meta] == [0, 1, 2]
