"""builtin_modules.py: builtin modules and containers round-trip by type,
config and tensors (no pickle) and compute the same; modules no codec takes
are refused with "trace it first"; constructors never get absurd configs."""
import re

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
    # format 1.2 (issue 36)
    "LeakyReLU": (0.2,), "PReLU": (3, 0.1), "PixelShuffle": (2,), "AdaptiveMaxPool2d": ((2, 1),),
    "Conv3d": (2, 4, 3), "ConvTranspose3d": (4, 2, 3), "RNNCell": (3, 4), "LSTMCell": (3, 4),
    "RNN": (3, 4, 2), "LSTM": (3, 4, 1, True, True, 0.0, True, 2), "Pad": (((1, 1), (0, 2)),),
    "InstanceNorm": (3,), "GeneralNorm": ((2, 3), (0, 1)), "LocalResponseNorm": (3,),
    "SyncBatchNorm": (3,), "LocalConv2d": (2, 4, 5, 5, 3), "SlidingWindow": (3,),
    "SlidingWindowTranspose": (4, 2), "MultiHeadAttention": (4, 2),
    "DeformableConv2d": (2, 4, 3), "RegionRestrictedConv": (2, 2, 3, 2),
    "DeformablePSROIPooling": (True, 2, 2, 2, 2, 1.0),
    # format 1.2 (issue 32)
    "LinearBn1d": (4, 3), "LinearBnRelu1d": (4, 3), "BatchMatMulActivation": (2, 4, 3),
    "Concat": (),
    "ConvTransposeRelu2d": (3, 4, 3), "ConvTransposeBn2d": (3, 4, 3),
    "ConvTransposeBnRelu2d": (4, 6, 3, 2, 1, 1, 2),
    "QuantStub": (), "DequantStub": (),
}


def test_every_builtin_type_has_an_example():
    # (mgtrace.module.qat's and .quantized's: tests/quantization)
    own = {n.rsplit(".", 1)[1] for n in M.builtin_types()
           if n.startswith("mgtrace.module.") and not n.startswith(("mgtrace.module.qat.", "mgtrace.module.quantized."))}
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


HUGE = 2 ** 62 + 1
# (module, config change, message): absurd sizes in a builtin's config are
# refused at load by the constructor's own checks (one bound, MAX_GEOMETRY,
# shared with mgtrace.functional), never left to crash the first call.
ABSURD_CONFIGS = [   # header values are tagged: {"tuple": [...]}, {"int": "<digits>"} past 2**64
    ("M.Conv2d(3, 8, 3)", {"stride": {"tuple": [HUGE, HUGE]}}, r"Conv2d: stride must be at most 2147483647"),
    ("M.Conv1d(3, 8, 3)", {"stride": {"tuple": [HUGE]}}, r"Conv1d: stride must be at most 2147483647"),
    ("M.Conv2d(3, 8, 3)", {"in_channels": -3}, r"Conv2d: in_channels must be >= 1, got -3"),
    ("M.Conv2d(3, 8, 3)", {"kernel_size": {"tuple": [10 ** 12, 10 ** 12]}},
     r"(kernel_size must be at most|would allocate)"),
    ("M.Conv2d(3, 8, 3)", {"dilation": {"tuple": [1, {"int": str(2 ** 70)}]}}, r"Conv2d: dilation must be at most"),
    ("M.ConvTranspose2d(3, 8, 3, stride=2)", {"output_padding": {"tuple": [HUGE, 0]}},
     r"ConvTranspose2d: output_padding must be at most"),
    ("M.MaxPool2d(2)", {"kernel_size": 2 ** 63 - 1}, r"MaxPool2d: kernel_size must be at most"),
    ("M.AvgPool2d(2)", {"padding": -1}, r"AvgPool2d: padding must be >= 0"),
    ("M.AdaptiveAvgPool2d(2)", {"output_size": 2 ** 40}, r"AdaptiveAvgPool2d: output_size must be at most"),
    ("M.Linear(2, 3)", {"in_features": -2}, r"Linear: in_features must be >= 0"),
    ("M.Embedding(4, 2)", {"embedding_dim": HUGE}, r"(embedding_dim must be at most|would allocate)"),
]


@pytest.mark.parametrize("make, change, match", ABSURD_CONFIGS, ids=[f"{m}-{c}" for m, c, _ in ABSURD_CONFIGS])
def test_absurd_sizes_in_configs_are_archive_errors_at_load(make, change, match):
    data = edit(save_bytes(eval(make, {"M": M})), lambda h: h["modules"][0]["config"].update(change))  # noqa: S307
    with pytest.raises(mt.ArchiveError, match=match):
        load_bytes(data)


def test_absurd_sizes_never_crash_a_load_or_a_call(run_isolated, tmp_path):
    """The archives above, loaded in a fresh process (a crash would kill it,
    not pytest), and a traced model whose graph calls F.conv1d with a stride
    of 2**62 + 1 (once SIGSEGV): it loads, and calling it raises ValueError."""
    paths = []
    for i, (make, change, _) in enumerate(ABSURD_CONFIGS):
        data = edit(save_bytes(eval(make, {"M": M})), lambda h: h["modules"][0]["config"].update(change))  # noqa: S307
        (tmp_path / f"{i}.tmod").write_bytes(data)
        paths.append(str(tmp_path / f"{i}.tmod"))

    class Net(M.Module):
        def __init__(self):
            super().__init__()
            self.w = M.Parameter(np.ones((2, 3, 3), np.float32))

        def forward(self, x):
            return mt.functional.conv1d(x, self.w, stride=1)

    x = mt.tensor(np.ones((1, 3, 8), np.float32))
    data = save_bytes(mt.trace_module(Net(), x))

    def stride(h):
        (call,) = [e for e in h["modules"][0]["graphs"][0]["exprs"] if e["kind"] == "call_function"]
        call["args"]["stride"] = HUGE
    (tmp_path / "net.tmod").write_bytes(edit(data, stride))
    rc, got, err = run_isolated(f"""
for i, p in enumerate({paths!r}):
    case(f"config {{i}}", lambda: mt.load(p))
net = mt.load({str(tmp_path / "net.tmod")!r})
case("call", lambda: net(mt.tensor(np.ones((1, 3, 8), np.float32))))
""")
    assert rc == 0, err[-2000:]
    for i, (_, _, match) in enumerate(ABSURD_CONFIGS):
        kind, msg = got[f"config {i}"]
        assert kind == "ArchiveError" and re.search(match, msg), (i, kind, msg)
    assert got["call"][0] == "ValueError" and "conv1d: stride must be at most 2147483647 (2**31 - 1)" in got["call"][1]


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
