"""builtin_modules.py: builtin modules and containers round-trip by type,
config and tensors (no pickle) and compute the same; modules no codec takes
are refused with "trace it first"; constructors never get absurd configs."""
import numpy as np
import pytest

import mgtrace as mt
import mgtrace.module as M

from .helpers import assert_same, edit, load_bytes, save_bytes, split

# constructor arguments for each of mgtrace's builtin types (all must be listed)
EXAMPLES = {
    "Linear": (4, 3), "Conv1d": (2, 4, 3), "Conv2d": (3, 4, 3), "ConvTranspose2d": (4, 2, 3),
    "BatchNorm1d": (3,), "BatchNorm2d": (3,), "LayerNorm": ((2, 3),), "GroupNorm": (2, 4),
    "Embedding": (10, 3), "ReLU": (), "ReLU6": (), "GELU": ("tanh",), "SiLU": (), "Sigmoid": (),
    "Tanh": (), "Softmax": (-1,), "Hardswish": (), "Hardsigmoid": (), "MaxPool2d": (2,),
    "AvgPool2d": (3, 2, 1), "AdaptiveAvgPool2d": ((2, 1),), "Flatten": (0, 1), "Dropout": (0.25,),
    "Identity": (), "Elemwise": ("fuse_mul_add3",), "ConvRelu2d": (3, 4, 3), "ConvBn2d": (3, 4, 3),
    "ConvBnRelu2d": (3, 4, 1),
}


def test_every_builtin_type_has_an_example():
    own = {n.rsplit(".", 1)[1] for n in M.builtin_types() if n.startswith("mgtrace.module.")}
    assert own == set(EXAMPLES)


@pytest.mark.parametrize("name", EXAMPLES)
def test_each_builtin_round_trips_type_config_and_tensors(name):
    m = getattr(M, name)(*EXAMPLES[name])
    header, _ = split(save_bytes(m))
    entry = header["modules"][0]
    assert entry["kind"] == "builtin" and entry["type"] == f"mgtrace.module.{name}"
    out = load_bytes(save_bytes(m))
    assert type(out) is type(m) and out.config() == m.config()
    assert_same(dict(out.state_dict()), dict(m.state_dict()))


def small_cnn():
    return M.Sequential(
        M.Conv2d(3, 8, 3, padding=1), M.BatchNorm2d(8), M.ReLU(), M.MaxPool2d(2),
        M.Conv2d(8, 8, 3, groups=4), M.AdaptiveAvgPool2d(1), M.Flatten(),
        M.Linear(8, 4), M.GELU(), M.Dropout(0.5), M.Softmax(-1)).eval()


@pytest.mark.parametrize("mmap", [False, True])
def test_sequential_computes_the_same_after_a_round_trip(mmap, rng, tmp_path):
    net = small_cnn()
    x = mt.tensor(rng.standard_normal((2, 3, 8, 8)).astype(np.float32))
    mt.save(net, tmp_path / "n.tmod")
    out = mt.load(tmp_path / "n.tmod", mmap=mmap)
    assert type(out) is M.Sequential and [type(c) for c in out] == [type(c) for c in net]
    assert not out.training and not out[9].training
    assert out(x).numpy().tobytes() == net(x).numpy().tobytes()
    # mmap: parameters and buffers are read-only views of the file; else writable copies
    assert type(out[0].weight) is M.Parameter
    assert out[0].weight.readonly == mmap and out[1].running_var.readonly == mmap


def test_module_lists_dicts_shared_children_and_training_flags():
    shared = M.Linear(2, 2)
    net = M.ModuleDict({"blocks": M.ModuleList([shared, M.ReLU(), shared]),
                        "head": M.Sequential(M.Linear(2, 1))})
    net["head"].eval()
    out = load_bytes(save_bytes(net))
    assert type(out) is M.ModuleDict and list(out.keys()) == ["blocks", "head"]
    assert type(out["blocks"]) is M.ModuleList and out["blocks"][0] is out["blocks"][2]
    assert out.training and not out["head"].training and not out["head"][0].training
    assert list(out.state_dict()) == list(net.state_dict())
    header, _ = split(save_bytes(net))
    assert len(header["modules"]) == 6 and len(header["tensors"]) == 4


def test_modules_inside_values():
    obj = {"model": M.Linear(3, 2), "epoch": 7, "opt": {"lr": 0.1}}
    out = load_bytes(save_bytes(obj))
    assert type(out["model"]) is M.Linear and out["epoch"] == 7 and out["opt"] == {"lr": 0.1}


def test_tensors_in_another_dtype_keep_it():
    fc = M.Linear(3, 2)
    fc.weight = M.Parameter(fc.weight.astype("float16"))
    out = load_bytes(save_bytes(fc))
    assert out.weight.dtype == np.float16 and type(out.weight) is M.Parameter
    assert out.weight.numpy().tobytes() == fc.weight.numpy().tobytes()


class Net(M.Module):
    def __init__(self):
        super().__init__()
        self.fc = M.Linear(2, 2)

    def forward(self, x):
        return self.fc(x)


class MySequential(M.Sequential):
    pass


@pytest.mark.parametrize("make, where", [
    (Net, "Net"), (lambda: M.Sequential(M.ReLU(), Net()), r"Sequential\.1"),
    (lambda: MySequential(M.ReLU()), "MySequential"), (lambda: {"a": [Net()]}, "Net")])
def test_user_modules_must_be_traced_first(make, where):
    with pytest.raises(TypeError, match=f"cannot save {where}.*mgtrace.trace_module"):
        save_bytes(make())


def test_containers_with_their_own_tensors_are_refused():
    s = M.Sequential(M.ReLU())
    s.register_buffer("scale", mt.tensor([2.0]))
    with pytest.raises(TypeError, match="tensors of its own.*trace"):
        save_bytes(s)


def test_absurd_configs_are_refused_before_the_constructor_runs():
    def huge(h):
        h["modules"][0]["config"].update(in_features=10 ** 7, out_features=10 ** 7)
        h["modules"][0]["tensors"] = {}
    with pytest.raises(mt.ArchiveError, match=r"mgtrace.module.Linear\(\*\*config\) would allocate"):
        load_bytes(edit(save_bytes(M.Linear(2, 2)), huge))


def test_constructor_and_state_errors_become_archive_errors():
    data = save_bytes(M.Linear(2, 3))
    bad = edit(data, lambda h: h["modules"][0]["config"].update(in_features="two"))
    with pytest.raises(mt.ArchiveError, match=r"modules\[0\]: TypeError: Linear: in_features"):
        load_bytes(bad)
    bad = edit(data, lambda h: h["modules"][0]["tensors"].pop("bias"))
    with pytest.raises(mt.ArchiveError, match="missing keys: bias"):
        load_bytes(bad)
    bad = edit(data, lambda h: h["modules"][0]["config"].update(out_features=4))
    with pytest.raises(mt.ArchiveError, match="shape mismatch"):
        load_bytes(bad)
    bad = edit(data, lambda h: h["modules"][0]["tensors"].update(bias=9))
    with pytest.raises(mt.ArchiveError, match=r"index 9 is out of range for header.modules\[0\].tensors\['bias'\]"):
        load_bytes(bad)


def test_kind_and_type_must_agree():
    seq = save_bytes(M.Sequential(M.ReLU()))
    with pytest.raises(mt.ArchiveError, match="not a container type"):
        load_bytes(edit(seq, lambda h: h["modules"][0].update(type="mgtrace.module.ReLU")))
    with pytest.raises(mt.ArchiveError, match="not a builtin module type"):
        load_bytes(edit(seq, lambda h: h["modules"][1].update(type="mgtrace.module.Sequential")))


def test_module_cycles_and_deep_nesting_are_refused():
    seq = save_bytes(M.Sequential(M.ReLU()))
    with pytest.raises(mt.ArchiveError, match="contains itself"):
        load_bytes(edit(seq, lambda h: h["modules"][0].update(children=[["0", 0]])))

    def deep(h):
        n = 200
        h["modules"] = [{"kind": "container", "training": True, "type": "mgtrace.module.Sequential",
                         "children": [["0", i + 1]]} for i in range(n)] + [h["modules"][1]]
    with pytest.raises(mt.ArchiveError, match="nest deeper than 64"):
        load_bytes(edit(seq, deep))
