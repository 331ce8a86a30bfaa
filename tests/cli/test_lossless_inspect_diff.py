"""inspect never drops metadata, diff compares NaN-aware and sees the stored
examples, diff refuses a folder by name, retrace skips archives with no module."""
import json

import numpy as np
import pytest

import mgtrace as mt

from .conftest import cli, example, make_net

NAN, INF = float("nan"), float("inf")


def _key(k):
    """The Python key of a tagged JSON key (README: the command line), for the round trip."""
    (tag, v), = k.items()
    if tag == "tuple":
        return tuple(_key(x) for x in v)
    return None if tag == "none" else v


def _from_json(v):
    """A reference decoder of inspect's JSON: the pair form back to a dict."""
    if isinstance(v, dict) and list(v) == ["dict"]:
        return {_key(k): _from_json(x) for k, x in v["dict"]}
    if isinstance(v, dict):
        return {k: _from_json(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_from_json(x) for x in v]
    return v


META = {1: "int one", "1": "str one", (2, "x"): [1.5, 2], None: True, 2.5: "float"}


def test_inspect_json_keeps_keys_that_print_alike_apart(tmp_path):
    f = tmp_path / "m.tmod"
    mt.save(mt.trace_module(make_net(0), example(0)), f, metadata=META)
    p = cli("inspect", "--json", f)
    assert p.returncode == 0, p.stderr
    meta = json.loads(p.stdout)[0]["metadata"]
    assert meta["dict"][:2] == [[{"int": 1}, "int one"], [{"str": "1"}, "str one"]]
    assert _from_json(meta) == META                     # every entry, every key's type
    p = cli("inspect", f)
    for line in ('1: "int one"', '"1": "str one"', '{"tuple": [{"int": 2}, {"str": "x"}]}: [1.5, 2]'):
        assert line in p.stdout, p.stdout


@pytest.mark.parametrize("meta, shown", [
    ({"dict": [[1, 2]]}, {"dict": [[{"str": "dict"}, [[1, 2]]]]}),    # a tag as the only key
    ({"dict": 1, "b": 2}, {"dict": 1, "b": 2}),                          # not the only key: plain
    ({"epoch": 3, "sizes": (1, 2)}, {"epoch": 3, "sizes": [1, 2]}),
])
def test_inspect_json_plain_objects_cannot_be_read_as_the_pair_form(tmp_path, meta, shown):
    f = tmp_path / "m.tmod"
    mt.save({"w": mt.tensor(np.ones(2, "float32"))}, f, metadata=meta)
    assert json.loads(cli("inspect", "--json", f).stdout)[0]["metadata"] == shown


def test_inspect_shows_tensors_and_long_metadata_whole(tmp_path):
    f = tmp_path / "m.tmod"
    note = "n" * 700
    mt.save({"w": mt.tensor(np.ones(2, "float32"))}, f,
            metadata={"calib": mt.tensor(np.zeros((2, 3), "float64")), "note": note})
    [r] = json.loads(cli("inspect", "--json", f).stdout)
    assert r["metadata"] == {"calib": {"tensor": {"dtype": "float64", "shape": [2, 3]}}, "note": note}
    text = cli("inspect", f).stdout
    assert note in text and '"calib": {"tensor": {"dtype": "float64", "shape": [2, 3]}}' in text


def _state(tmp_path, name, w, **kw):
    f = tmp_path / f"{name}.tmod"
    mt.save({"w": mt.tensor(np.array(w, "float32"))}, f, **kw)
    return f


def _changes(a, b):
    p = cli("diff", "--json", a, b)
    assert p.returncode in (0, 1), p.stderr
    return {c["what"]: c for c in json.loads(p.stdout)["changes"]}


def test_diff_is_nan_aware(tmp_path):
    a = _state(tmp_path, "a", [NAN, 1.0, 2.0, INF], metadata={"loss": NAN})
    same = _state(tmp_path, "same", [NAN, 1.0, 2.0, INF], metadata={"loss": NAN})
    p = cli("diff", a, same)
    assert p.returncode == 0 and p.stdout.strip() == "no differences", p.stdout
    # a shared NaN: the difference is over the finite values (|2 - 2.75|), not nan
    c = _changes(a, _state(tmp_path, "b", [NAN, 1.0, 2.75, INF]))["tensor w"]
    assert c["max_abs_diff"] == 0.75 and "nonfinite_mismatches" not in c
    # NaN or inf at other places: counted; the finite places that differ still measured
    c = _changes(a, _state(tmp_path, "c", [1.0, NAN, 2.5, -INF]))["tensor w"]
    assert c["max_abs_diff"] == 0.5 and c["nonfinite_mismatches"] == 3
    p = cli("diff", a, tmp_path / "c.tmod")
    assert "max abs diff 0.5 over the finite values; NaN or inf at 3 other places" in p.stdout


def _traced(tmp_path, name, x, **kw):
    f = tmp_path / f"{name}.tmod"
    mt.save(mt.trace_module(make_net(0), x), f, example_inputs=(x,), **kw)
    return f


def test_diff_compares_stored_example_values(tmp_path):
    x = example(0)
    y = mt.tensor(x.numpy() + np.float32(0.25))
    a, b = _traced(tmp_path, "a", x), _traced(tmp_path, "b", y)
    assert cli("diff", a, _traced(tmp_path, "a2", x)).returncode == 0
    changes = _changes(a, b)
    assert set(changes) == {"example inputs [0]", "example outputs <root>"}
    assert changes["example inputs [0]"]["max_abs_diff"] == pytest.approx(0.25, abs=1e-6)
    net = make_net(0)
    want = np.max(np.abs(net(y).numpy().astype(np.float64) - net(x).numpy()))
    assert changes["example outputs <root>"]["max_abs_diff"] == pytest.approx(want, abs=1e-6)
    assert cli("diff", a, b).returncode == 1


def test_diff_compares_tensors_inside_metadata(tmp_path):
    a = _state(tmp_path, "a", [1.0], metadata={"calib": mt.tensor(np.array([1.0, 2.0]))})
    b = _state(tmp_path, "b", [1.0], metadata={"calib": mt.tensor(np.array([1.0, 2.5]))})
    c = _changes(a, b)
    assert list(c) == ["metadata calib"] and c["metadata calib"]["max_abs_diff"] == 0.5


def test_diff_of_a_folder_says_what_it_takes(archives):
    for args in ((archives / "good", archives / "good/net0.tmod"),
                 (archives / "good/net0.tmod", archives / "good")):
        p = cli("diff", *args)
        assert p.returncode == 2
        assert "is a folder" in p.stderr and "two archive files" in p.stderr.replace("\n", " ") \
            and "mgtrace inspect" in p.stderr, p.stderr


def test_retrace_skips_archives_without_a_module(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    mt.save({"w": mt.tensor(np.ones((2, 3), "float32")), "b": mt.tensor(np.ones(3, "float32"))},
            src / "state.tmod")
    mt.save(mt.tensor(np.arange(4, dtype="int32")), src / "tensor.tmod")
    p = cli("retrace", src, "-o", out, "--json")
    assert p.returncode == 0, p.stdout + p.stderr
    recs = {r["path"].rsplit("/", 1)[-1]: r for r in json.loads(p.stdout)["records"]}
    assert {r["status"] for r in recs.values()} == {"skipped"}
    assert "a dict of 2 tensors (a state dict), not a module: nothing to retrace" in recs["state.tmod"]["reason"]
    assert "a tensor int32[4]" in recs["tensor.tmod"]["reason"]
    assert not out.exists() or not list(out.rglob("*.tmod"))
    p = cli("retrace", src, "-o", out)
    assert "0 failed" in p.stdout and "2 left as they are" in p.stdout, p.stdout


class _Scale(mt.module.Module):
    def __init__(self, k, const, note="v1"):
        super().__init__()
        self.k, self.const, self.note = k, tuple(const.tolist()), note

    def forward(self, x):
        return x * self.k + mt.tensor(np.array(self.const, "float32"))


def _scaled(tmp_path, name, k, const, note="v1"):
    f = tmp_path / f"{name}.tmod"
    mt.save(mt.trace_module(_Scale(k, const, note), mt.tensor(np.ones(3, "float32"))), f)
    return f


def test_diff_sees_constants_in_the_graph(tmp_path):
    c = np.arange(3, dtype="float32")
    a = _scaled(tmp_path, "a", 2, c)
    assert cli("diff", a, _scaled(tmp_path, "a2", 2, c)).returncode == 0
    # a Python constant argument: x * 2 against x * 3
    [g] = [v for k, v in _changes(a, _scaled(tmp_path, "b", 3, c)).items() if k.startswith("graph")]
    assert "[2]" in g["first_difference"] and "[3]" in g["first_difference"], g
    # a constant tensor: the same graph, other values (|2 - 2.5|)
    changes = _changes(a, _scaled(tmp_path, "c", 2, c + np.array([0, 0, 0.5], "float32")))
    consts = {w: ch for w, ch in changes.items() if w.startswith("graph") and w.endswith("tensor")}
    [ch] = consts.values()
    assert ch["max_abs_diff"] == 0.5
    # a plain attribute of a traced module that the graph does not read
    changes = _changes(a, _scaled(tmp_path, "d", 2, c, note="v2"))
    assert list(changes) == ["module <root> attributes"], changes
    assert '"v1"' in changes["module <root> attributes"]["a"] and '"v2"' in changes["module <root> attributes"]["b"]


@pytest.mark.parametrize("big", [2**53, 2**62, -(2**63)])
def test_diff_compares_int64_exactly(tmp_path, big):
    # float64 rounds 2**53 + 1 to 2**53: the difference must still be seen, and measured exactly
    def mk(name, v):
        mt.save({"w": mt.tensor(np.array(v, "int64"))}, tmp_path / name)
        return tmp_path / name
    a, b = mk("a.tmod", [big, 7]), mk("b.tmod", [big + 1, 7])
    c = _changes(a, b)
    assert list(c) == ["tensor w"] and c["tensor w"]["max_abs_diff"] == 1
    assert cli("diff", a, mk("same.tmod", [big, 7])).returncode == 0
    d = _changes(mk("lo.tmod", [-(2**63)]), mk("hi.tmod", [2**63 - 1]))["tensor w"]
    assert d["max_abs_diff"] == 2**64 - 1              # int64 subtraction would overflow
    mt.save({"w": mt.tensor(np.array([-128, 127], "int8"))}, tmp_path / "i8a.tmod")
    mt.save({"w": mt.tensor(np.array([127, -128], "int8"))}, tmp_path / "i8b.tmod")
    assert _changes(tmp_path / "i8a.tmod", tmp_path / "i8b.tmod")["tensor w"]["max_abs_diff"] == 255


def test_diff_sees_metadata_values_of_other_types(tmp_path):
    pairs = {"k": ("nan", NAN), "i": ("inf", INF), "n": (1, True), "f": (1, 1.0), "t": ((1,), [1])}
    a = _state(tmp_path, "a", [1.0], metadata={k: v for k, (v, _) in pairs.items()} | {"same": NAN})
    b = _state(tmp_path, "b", [1.0], metadata={k: v for k, (_, v) in pairs.items()} | {"same": NAN})
    c = _changes(a, b)
    assert list(c) == ["metadata"]
    assert c["metadata"]["differences"] == [
        "k: {'str': 'nan'} -> {'float': 'nan'}", "i: {'str': 'inf'} -> {'float': 'inf'}",
        "n: {'int': 1} -> {'bool': True}", "f: {'int': 1} -> {'float': 1.0}",
        "t: {'tuple': [{'int': 1}]} -> {'list': [{'int': 1}]}"]
    p = cli("diff", a, b)
    assert p.returncode == 1 and "at n: {'int': 1} -> {'bool': True}" in p.stdout
    # NaN equals NaN of the same type: an archive against its twin has no differences
    twin = {k: v for k, (v, _) in pairs.items()} | {"same": NAN}
    assert cli("diff", a, _state(tmp_path, "a2", [1.0], metadata=twin)).returncode == 0
