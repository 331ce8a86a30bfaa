"""MegEngine TracedModules (data/*.tm, written by MegEngine 1.13) load as
mgtrace TracedModules that give MegEngine's outputs at the traced batch and
at another, save as .tmod, and reload in a fresh process."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.megengine as mge
import mgtrace.module as M
from .cases import CASES, assert_matches, path, stored

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRACED_BATCH = {"cnn": 2, "containers": 3, "dict_io": 2, "fused": 2}


@pytest.fixture(scope="module")
def loaded():
    return {name: mge.load(path(name, ".tm")) for name in CASES}


@pytest.mark.parametrize("name", CASES)
def test_tm_gives_megengine_outputs_at_both_batches(loaded, name):
    tm = loaded[name]
    assert isinstance(tm, mt.TracedModule)
    runs = stored(name)
    assert TRACED_BATCH[name] in runs and len(runs) == 2     # traced batch and another
    for batch, (args, kwargs, want) in runs.items():
        assert_matches(tm(*args, **kwargs), want)


@pytest.mark.parametrize("name", CASES)
def test_tm_state_dict_is_megengine_s(loaded, name):
    """Same names as MegEngine's state dict; values equal in mgtrace's layout."""
    sd = mge.load(path(name, ".pkl"))
    own = loaded[name].state_dict(layout="megengine")
    assert sorted(own) == sorted(sd)
    for k, v in sd.items():
        np.testing.assert_array_equal(own[k].numpy(), v.numpy())


def test_tm_keeps_hierarchy_names_and_symbolic_shapes(loaded):
    tm = loaded["cnn"]
    names = dict(tm.named_modules())
    assert isinstance(names["stem"], mt.TracedModule)          # MegEngine's submodule graph
    assert type(names["stem.conv"]).__name__ == "Conv2d"
    assert names["grouped.conv"].groups == 4
    assert "x.shape" in tm.code or "shape" in tm.code          # x.shape[0] stays a read
    assert tm.training is False


def test_fused_modules_stay_fused(loaded):
    """MegEngine's ConvBn2d / ConvBnRelu2d (whose parts the file holds as
    plain module objects), ConvRelu2d and Elemwise become mgtrace's."""
    mods = dict(loaded["fused"].named_modules())
    assert type(mods["cbr"]).__name__ == "ConvBnRelu2d" and mods["cbr"].conv.groups == 3
    assert type(mods["cb"]).__name__ == "ConvBn2d" and mods["cb"].conv.bias is None
    assert type(mods["cr"]).__name__ == "ConvRelu2d"
    assert mods["add"].method == "fuse_add_relu"
    assert abs(mods["cbr"].bn.momentum - 0.1) < 1e-9        # MegEngine's 0.9, PyTorch's way


def test_dict_io_signature_and_keywords(loaded):
    tm = loaded["dict_io"]
    args, kwargs, want = stored("dict_io")[4]
    assert sorted(want) == [".both", ".logits", ".probs"]
    out = tm(*args, **kwargs)
    assert isinstance(out, dict) and sorted(out) == ["both", "logits", "probs"]
    with pytest.raises(TypeError):
        tm(*args)                                   # temperature is keyword-only and needed
    assert "a constant recorded by the trace" in tm.code      # MegEngine's graph Constant


@pytest.mark.parametrize("name", CASES)
def test_tmod_reloads_in_a_fresh_process(loaded, name, tmp_path):
    archive = tmp_path / f"{name}.tmod"
    mt.save(loaded[name], str(archive))
    runs = stored(name)
    script = f"""
import json, sys
sys.path.insert(0, {ROOT!r})
import numpy as np, mgtrace as mt
from tests.megengine.cases import stored, flat_outputs
tm = mt.load({str(archive)!r})
out = {{}}
for b, (args, kwargs, _) in stored({name!r}).items():
    for k, v in flat_outputs(tm(*args, **kwargs)).items():
        out[f"{{b}}{{k}}"] = v.tolist()
print(json.dumps(out))
"""
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout.strip().splitlines()[-1])
    for b, (_, _, want) in runs.items():
        for k, w in want.items():
            g = np.asarray(got[f"{b}{k}"], np.float32)
            assert np.abs(g - w).max() <= 1e-5 * max(np.abs(w).max(), 1e-30), (b, k)


def test_example_inputs_given(loaded):
    args, kwargs, want = stored("cnn")[5]
    tm = mge.load(path("cnn", ".tm"), example_inputs=args)
    assert_matches(tm(*args, **kwargs), want)


def test_eval_before_trace_keeps_submodules_in_eval_mode():
    # MegEngine's trace_module gives the top TracedModule training=True while its
    # BatchNorm and Dropout stay in eval mode; the converter set the top's flag on the
    # whole tree, so BatchNorm used batch statistics and Dropout dropped
    here = os.path.join(os.path.dirname(__file__), "data", "eval_before_trace")
    d = np.load(here + ".npz")
    t = mge.load(here + ".tm")
    assert not t.bn.training and not t.drop.training
    for b in (2, 5):
        np.testing.assert_allclose(t(mt.tensor(d[f"x{b}"])).numpy(), d[f"y{b}"],
                                   rtol=1e-5, atol=1e-6)


def test_leaky_relu_module_called_twice():
    # MegEngine's M.LeakyReLU had no entry in the mapping table (UnsupportedError)
    here = os.path.join(os.path.dirname(__file__), "data", "leaky_twice")
    d = np.load(here + ".npz")
    t = mge.load(here + ".tm")
    assert t.act.negative_slope == pytest.approx(0.1)
    for b in (2, 5):
        np.testing.assert_allclose(t(mt.tensor(d[f"x{b}"])).numpy(), d[f"y{b}"],
                                   rtol=1e-5, atol=1e-6)


def test_prelu_per_channel_and_single_slope():
    # MegEngine's M.PReLU had no entry in the mapping table; its per-channel
    # weight is [1, C, 1, 1] (ours [C]): the .tm, and the state dict through
    # layout="megengine", give MegEngine's own outputs
    here = os.path.join(os.path.dirname(__file__), "data", "prelu")
    d = np.load(here + ".npz")
    t = mge.load(here + ".tm")
    assert t.act.num_parameters == 4 and t.act1.num_parameters == 1
    np.testing.assert_array_equal(t.act.weight.numpy(), np.float32([0.05, 0.2, -0.3, 1.5]))
    for b in (2, 5):
        np.testing.assert_allclose(t(mt.tensor(d[f"x{b}"])).numpy(), d[f"y{b}"],
                                   rtol=1e-5, atol=1e-6)
    fresh = _PReLUNet()
    fresh.load_state_dict(mge.load(here + ".pkl"), layout="megengine")
    np.testing.assert_allclose(fresh(mt.tensor(d["x5"])).numpy(), d["y5"], rtol=1e-5, atol=1e-6)
    back = fresh.state_dict(layout="megengine")
    assert tuple(back["act.weight"].shape) == (1, 4, 1, 1) and tuple(back["act1.weight"].shape) == (1,)


class _PReLUNet(M.Module):
    """make_prelu.py's Net, written against mgtrace."""

    def __init__(self):
        super().__init__()
        self.conv, self.act, self.act1 = M.Conv2d(3, 4, 3, padding=1), M.PReLU(4), M.PReLU()

    def forward(self, x):
        return self.act1(self.act(self.conv(x)) - 0.2)


def test_float_stubs_load_run_and_save(tmp_path):
    # MegEngine's float QuantStub / DequantStub (a model written for its
    # quantization flow) are mgtrace builtins: the .tm loads, gives MegEngine's
    # output, and saves as a .tmod that loads back to the same
    here = os.path.join(os.path.dirname(__file__), "data", "stubs")
    d = np.load(here + ".npz")
    t = mge.load(here + ".tm")
    assert type(t.quant) is M.QuantStub and type(t.dequant) is M.DequantStub
    y = t(mt.tensor(d["x2"])).numpy()
    np.testing.assert_allclose(y, d["y2"], rtol=1e-5, atol=1e-6)
    path = str(tmp_path / "stubs.tmod")
    mt.save(t, path)
    np.testing.assert_array_equal(mt.load(path)(mt.tensor(d["x2"])).numpy(), y)
