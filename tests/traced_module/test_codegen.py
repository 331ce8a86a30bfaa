"""Generated code, print_readable, state_dict and deepcopy of TracedModules.

The generated source must compile and run whatever the submodules are
called (Python keywords, quotes, backslashes, spaces, names of builtins and
of the code's own globals), keep the state_dict of the traced module, and a
deep copy must be independent of the original.
"""
import collections
import copy
import io
import warnings

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module as M
from mgtrace.traced_module import TracedModule, TraceWarning, codegen

ODD_NAMES = ["class", "def", "it's", 'q"uote', "back\\slash", "with space", "F", "self",
             "print", "operator", "x", "_getattr_path", "OpDef", "0", "None", "lambda", "fc_out",
             "new\nline"]


def _rand(*shape, seed=0):
    return mt.tensor(np.random.default_rng(seed).standard_normal(shape).astype("float32"))


class Inner(M.Module):
    def __init__(self):
        super().__init__()
        self.fc = M.Linear(3, 3)

    def forward(self, x):
        return F.relu(self.fc(x))


class OddNames(M.Module):
    def __init__(self):
        super().__init__()
        for i, name in enumerate(ODD_NAMES):
            self.add_module(name, Inner() if i % 2 else M.Linear(3, 3))

    def forward(self, x):
        for name in ODD_NAMES:
            x = self._modules[name](x) + 1.0
        return x


def test_module_check_name_refuses_only_these():
    m = M.Module()
    for bad in ("a.b", ""):
        with pytest.raises(ValueError):
            m.add_module(bad, M.ReLU())
    with pytest.raises(KeyError):            # an existing attribute of Module
        m.add_module("apply", M.ReLU())


def test_code_runs_with_odd_submodule_names():
    net = OddNames()
    tm = mt.trace_module(net, _rand(2, 3))
    src = tm.code
    compile(src, "<test>", "exec")
    assert "getattr(self, 'class')" in src
    assert "getattr(self, \"it's\")" in src
    assert "getattr(self, 'back\\\\slash')" in src
    x = _rand(4, 3, seed=1)
    want = net(x).numpy()
    np.testing.assert_array_equal(tm(x).numpy(), want)
    flat = tm.flatten()
    compile(flat.code, "<test>", "exec")
    assert "getattr(self, 'def').fc" in flat.code       # Inner's Linear, by its full path
    np.testing.assert_array_equal(flat(x).numpy(), want)


def test_input_names_that_collide_with_globals():
    class Args(M.Module):
        def forward(self, F, apply, operator, print):        # noqa: A002
            return F * apply + operator - print
    vals = [_rand(2, seed=s) for s in range(4)]
    tm = mt.trace_module(Args(), *vals)
    head = tm.code.splitlines()[0]
    assert head == "def forward(self, F_1, apply_1, operator_1, print_1):"
    vals = [_rand(2, seed=s) for s in range(4, 8)]
    a, b, c, d = (v.numpy() for v in vals)
    np.testing.assert_allclose(tm(*vals).numpy(), a * b + c - d, rtol=1e-6)
    by_name = tm(F=vals[0], apply=vals[1], operator=vals[2], print=vals[3])
    np.testing.assert_allclose(by_name.numpy(), a * b + c - d, rtol=1e-6)


Pair = collections.namedtuple("Pair", "lo hi")


class Calls(M.Module):
    """Keyword arguments that are not identifiers, namedtuples in and out."""

    def __init__(self):
        super().__init__()
        self.take = Takes()

    def forward(self, x):
        p = self.take(Pair(x, x * 2), **{"odd key": x + 1})
        return Pair(p, -x), {"n": (p, None)}


class Takes(M.Module):
    def forward(self, pair, **kw):
        return pair.lo + pair.hi * kw["odd key"]


def test_namedtuples_and_odd_keywords_in_code():
    net = Calls()
    tm = mt.trace_module(net, _rand(3))
    x = _rand(3, seed=1)
    got, want = tm(x), net(x)
    assert type(got[0]) is Pair and list(got[1]) == ["n"] and got[1]["n"][1] is None
    np.testing.assert_array_equal(got[0].lo.numpy(), want[0].lo.numpy())
    np.testing.assert_array_equal(got[0].hi.numpy(), want[0].hi.numpy())
    np.testing.assert_array_equal(got[1]["n"][0].numpy(), want[1]["n"][0].numpy())
    assert "**{'odd key': " in tm.code
    np.testing.assert_array_equal(tm.flatten()(x)[0].lo.numpy(), want[0].lo.numpy())


def test_print_readable_lists_every_traced_graph():
    net = OddNames()
    tm = mt.trace_module(net, _rand(2, 3))
    buf = io.StringIO()
    text = tm.print_readable(file=buf)
    assert buf.getvalue() == text + "\n"
    headers = [ln for ln in text.splitlines() if ln.startswith("# ")]
    assert headers[0] == "# OddNames (OddNames)"
    assert "# OddNames.def (Inner)" in headers
    assert "# 'OddNames.new\\nline' (Inner)" in headers      # not printable: shown as repr
    assert len(headers) == 1 + sum(isinstance(m, Inner) for m in net.modules())
    assert text.count("def forward(self") == len(headers)


def test_code_frees_intermediates_but_keeps_outputs():
    class Chain(M.Module):
        def forward(self, x):
            a = x + 1
            b = a * 2
            return b - 3, a
    tm = mt.trace_module(Chain(), _rand(2))
    lines = [ln.strip() for ln in tm.code.splitlines()]
    dels = [ln for ln in lines if ln.startswith("del ")]
    assert dels == ["del mul"]                  # a and the result are returned; b is not
    x = _rand(2, seed=1)
    got = tm(x)
    np.testing.assert_allclose(got[0].numpy(), (x.numpy() + 1) * 2 - 3, rtol=1e-6)
    np.testing.assert_allclose(got[1].numpy(), x.numpy() + 1, rtol=1e-6)


def test_generated_source_is_in_linecache():
    import inspect
    tm = mt.trace_module(Inner(), _rand(1, 3))
    tm(_rand(1, 3))
    fn = tm._function(tm.graph)
    assert inspect.getsource(fn) == tm.code
    assert fn.__code__.co_filename.startswith("mgtrace-generated:Inner#")


def test_loading_models_does_not_grow_linecache_and_tracebacks_show_the_line(tmp_path):
    import gc
    import linecache
    import traceback

    def generated():                    # collected functions' entries go at the next compile
        codegen._prune_linecache()
        return sum(k.startswith("mgtrace-generated:") for k in linecache.cache)
    mt.save(mt.trace_module(Inner(), _rand(1, 3)), tmp_path / "m.tmod")
    for _ in range(3):                  # warm: imports and caches of the first loads
        mt.load(tmp_path / "m.tmod")(_rand(1, 3))
    gc.collect()
    before = generated()
    for _ in range(50):
        mt.load(tmp_path / "m.tmod")(_rand(1, 3))
    gc.collect()
    assert generated() == before
    tm = mt.load(tmp_path / "m.tmod")
    try:
        tm(_rand(1, 4))                 # a width the Linear inside cannot take
    except Exception:
        text = traceback.format_exc()
    else:
        raise AssertionError("a wrong width ran")
    frame = [ln for ln in text.splitlines() if "mgtrace-generated:Inner#" in ln]
    assert frame, text
    shown = text.splitlines()[text.splitlines().index(frame[-1]) + 1].strip()
    assert shown and shown in tm.code, text
    del tm
    gc.collect()
    assert generated() == before


def test_end_points_outside_the_graph_are_refused():
    tm = mt.trace_module(Inner(), _rand(1, 3))
    other = mt.trace_module(Inner(), _rand(1, 3))
    node = other.graph.outputs[0]
    with pytest.raises(ValueError, match="not computed by this graph"):
        codegen.generate(tm.graph, end=[node])


# ------------------------------------------------------- state and copies
class Stateful(M.Module):
    def __init__(self):
        super().__init__()
        self.inner = Inner()
        self.bn = M.BatchNorm1d(3)
        self.register_buffer("shift", mt.tensor(np.array([1.0, 2.0, 3.0], "float32")))
        self.note = {"author": "me", "tags": ["a"]}

    def forward(self, x):
        const = mt.tensor(np.array([0.5, 0.5, 0.5], "float32"))
        return self.bn(self.inner(x)) + self.shift + const


def _traced_stateful():
    net = Stateful().eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceWarning)
        return net, mt.trace_module(net, _rand(4, 3))


def test_state_dict_keys_and_values_are_the_originals():
    net, tm = _traced_stateful()
    want, got = net.state_dict(), tm.state_dict()
    assert list(got) == list(want)
    for k in want:
        np.testing.assert_array_equal(got[k].numpy(), want[k].numpy())
    # and load_state_dict goes both ways
    tm.load_state_dict({k: v * 0 + 1 for k, v in want.items()})
    assert float(net.inner.fc.weight.numpy().sum()) == 9.0      # builtins are shared with net


def test_deepcopy_is_independent_and_keeps_attributes():
    net, tm = _traced_stateful()
    x = _rand(5, 3, seed=2)
    before = tm(x).numpy()
    cp = copy.deepcopy(tm)
    assert isinstance(cp, TracedModule) and isinstance(cp.inner, TracedModule)
    assert cp.note == {"author": "me", "tags": ["a"]} and cp.note is not tm.note
    assert cp.inner.fc is not tm.inner.fc and cp.bn is not tm.bn
    assert cp.graph is not tm.graph and cp.graph.owner is cp
    assert cp.inner.graph.owner is cp.inner
    np.testing.assert_array_equal(cp(x).numpy(), before)
    # mutate everything mutable in the copy: parameter, buffer, constant
    cp.inner.fc.weight[:] = 0.0
    cp.shift[:] = 100.0
    const = next(e for e in cp.graph.exprs(False) if e.kind == "constant")
    const.value[:] = -7.0
    np.testing.assert_array_equal(tm(x).numpy(), before)
    np.testing.assert_array_equal(net(x).numpy(), before)
    changed = cp(x).numpy()
    assert not np.allclose(changed, before)
    bn = net.bn
    expect = ((np.maximum(cp.inner.fc.bias.numpy(), 0) - bn.running_mean.numpy())
              / np.sqrt(bn.running_var.numpy() + bn.eps) * bn.weight.numpy() + bn.bias.numpy()
              + 100.0 - 7.0)
    np.testing.assert_allclose(changed, np.broadcast_to(expect, (5, 3)), rtol=1e-5, atol=1e-5)
    # a copy of a copy still runs, flattens and keeps attributes
    cp2 = copy.deepcopy(cp)
    np.testing.assert_array_equal(cp2(x).numpy(), changed)
    np.testing.assert_array_equal(cp2.flatten()(x).numpy(), changed)
    assert cp2.flatten().note == cp.note


class NegativeConstants(M.Module):
    """Operators with negative constants on either side: the generated
    code must keep Python's precedence (``(-2.0) ** x`` is not ``-2.0 ** x``)."""

    def forward(self, x):
        n = x.shape[0]
        return ((-2.0) ** x, x ** -1.0, -3.0 - x, x - -3.0, (-2.0) * x, -x, abs(x), -(-x),
                F.zeros((-(-n), 2 * -(-n))))


def test_negative_constants_keep_their_precedence():
    net = NegativeConstants()
    tm = mt.trace_module(net, mt.tensor(np.array([1.0, 2.0], "float32")))
    assert "(-2.0) ** x" in tm.code
    x = mt.tensor(np.array([1.0, 2.0, 3.0], "float32"))
    a = x.numpy()
    want = [(-2.0) ** a, a ** -1.0, -3.0 - a, a + 3.0, -2.0 * a, -a, abs(a), a]
    got = tm(x)
    for g, w, e in zip(got, want, net(x)):
        np.testing.assert_allclose(g.numpy(), w, rtol=1e-6)
        np.testing.assert_array_equal(g.numpy(), e.numpy())
    assert got[-1].shape == (3, 6)


def _free_names(src):
    """Names the code reads that it neither assigns nor takes as parameters."""
    import ast
    import builtins
    tree = ast.parse(src)
    bound = {a.arg for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) for a in f.args.args}
    bound |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
    read = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return read - bound - set(dir(builtins))


def test_generated_code_explains_every_name_it_reads():
    from mgtrace.traced_module import wrap

    @wrap
    def swish(x):
        return x * F.sigmoid(x)

    class Consts(M.Module):
        def forward(self, x):
            c = mt.tensor(np.array([1.0, 2.0], "float32"))
            y = swish(x) + c
            return F.maximum(y, float("-inf")), F.clip(y, upper=float("nan")), y * np.float32(2.5), \
                Pair(y, float("inf") * y)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")             # the recorded constant warns
        tm = mt.trace_module(Consts(), _rand(2))
    src = tm.code
    assert "float('-inf')" in src and "float('nan')" in src and "float('inf') * " in src
    header = dict(ln[2:].split(" = ", 1) for ln in src.splitlines() if ln.startswith("# "))
    assert header["_swish"].endswith("test_generated_code_explains_every_name_it_reads.<locals>.swish")
    assert header["_const"] == "Tensor float32[2] (a constant recorded by the trace)"
    assert "np.float32(2.5)" in header.values()
    assert _free_names(src) <= {"F", "apply", "OpDef", "operator", "member"} | set(header)
    x = _rand(2, seed=3)
    got, want = tm(x), Consts()(x)                  # the code gives the eager results
    y = x.numpy() / (1 + np.exp(-x.numpy())) + [1.0, 2.0]
    np.testing.assert_allclose(got[0].numpy(), y, rtol=1e-6)
    for g, w in zip(got[:3] + tuple(got[3]), want[:3] + tuple(want[3])):
        np.testing.assert_array_equal(g.numpy(), w.numpy())
    assert type(got[3]) is Pair


class _TwoAlike(M.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = Inner(), Inner()

    def forward(self, x):
        return self.b(self.a(x)) * 2


def test_graphs_of_one_structure_share_one_compile(monkeypatch):
    """Two submodules traced alike (MiniLM's six layers) get their code from
    one compile; each function keeps its own file name, globals (its own
    weights) and source in linecache, and the outputs are right."""
    import builtins
    import inspect
    compiled = []

    def counting(source, *args, **kwargs):
        compiled.append(source)
        return builtins.compile(source, *args, **kwargs)
    monkeypatch.setattr(codegen, "compile", counting, raising=False)
    codegen._code_cache.clear()
    x = _rand(2, 3)
    tm = mt.trace_module(_TwoAlike(), x)
    compiled.clear()
    got = tm(x).numpy()
    net = tm
    want = np.maximum(x.numpy() @ net.a.fc.weight.numpy().T + net.a.fc.bias.numpy(), 0)
    want = np.maximum(want @ net.b.fc.weight.numpy().T + net.b.fc.bias.numpy(), 0) * 2
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert tm.a.code == tm.b.code
    assert len(compiled) == len(set(compiled))       # each distinct source compiled once
    fa, fb = tm.a._function(tm.a.graph), tm.b._function(tm.b.graph)
    assert fa.__code__.co_code == fb.__code__.co_code
    assert fa.__code__.co_filename != fb.__code__.co_filename
    assert fa.__globals__ is not fb.__globals__
    assert inspect.getsource(fa) == inspect.getsource(fb) == tm.a.code


def test_collecting_generated_code_leaves_linecache_alone_until_the_next_compile():
    """A collection can run inside linecache.checkcache's loop over its keys
    (it lists them, then reads each): a finalizer removing a key there made
    checkcache raise KeyError (seen in doctest, which calls it through pdb).
    So the entry goes at the next compile, not at collection."""
    import gc
    import linecache
    tm = mt.trace_module(Inner(), _rand(1, 3))
    tm(_rand(1, 3))
    name = tm._function(tm.graph).__code__.co_filename
    del tm
    gc.collect()
    assert name in linecache.cache          # collected, but nothing removed under a reader
    linecache.checkcache()
    other = mt.trace_module(Inner(), _rand(1, 3))
    other(_rand(1, 3))                      # the next compile takes it out
    assert name not in linecache.cache
    assert other._function(other.graph).__code__.co_filename in linecache.cache


def test_a_quantized_dtype_argument_prints_with_its_scale_and_zero_point():
    """repr() of a quantized dtype is its storage dtype (dtype('uint8')):
    the graph and the generated code's comments hid which quantization an
    expr applies. The values still run: quantize(1.0) at scale 0.1 and zero
    point 3 is 13, (2.0) 23."""
    from mgtrace.quantization import qdtype

    class Quant(M.Module):
        def forward(self, x):
            return F.quantize(x, qdtype.quint8(0.1, 3))

    tm = mt.trace_module(Quant(), mt.tensor(np.float32([1.0, 2.0])))
    assert "F.quantize(%1:x, quint8(scale=0.1, zero_point=3))" in str(tm.graph)
    assert "= quint8(scale=0.1, zero_point=3)\n" in tm.code
    assert tm(mt.tensor(np.float32([1.0, 2.0]))).numpy().tolist() == [13, 23]
