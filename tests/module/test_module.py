"""Module, Parameter and containers: registration, traversal, state dicts, modes, repr.

Expected key lists are written out by hand (PyTorch's ordering rule: own
parameters, own buffers, then children in registration order) and checked
against torch.nn's state_dict for the same construction where torch is present.
"""
import copy
import doctest
import importlib
from collections import OrderedDict

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.module as M


# ------------------------------------------------------------------ fixtures

class Block(M.Module):
    def __init__(self, c):
        super().__init__()
        self.conv1 = M.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = M.BatchNorm2d(c)
        self.act = M.ReLU()


class Net(M.Module):
    """stem, a Sequential of two Blocks, a head; one persistent and one
    non-persistent buffer of its own."""

    def __init__(self):
        super().__init__()
        self.stem = M.Conv2d(3, 4, 3)
        self.layer1 = M.Sequential(Block(4), Block(4))
        self.head = M.Linear(4, 10)
        self.register_buffer("scale", mt.tensor([1.0, 2.0]))
        self.register_buffer("scratch", mt.tensor([0.0]), persistent=False)


NET_KEYS = [
    ("scale", (2,), "float32"),
    ("stem.weight", (4, 3, 3, 3), "float32"),
    ("stem.bias", (4,), "float32"),
    ("layer1.0.conv1.weight", (4, 4, 3, 3), "float32"),
    ("layer1.0.bn1.weight", (4,), "float32"),
    ("layer1.0.bn1.bias", (4,), "float32"),
    ("layer1.0.bn1.running_mean", (4,), "float32"),
    ("layer1.0.bn1.running_var", (4,), "float32"),
    ("layer1.0.bn1.num_batches_tracked", (), "int64"),
    ("layer1.1.conv1.weight", (4, 4, 3, 3), "float32"),
    ("layer1.1.bn1.weight", (4,), "float32"),
    ("layer1.1.bn1.bias", (4,), "float32"),
    ("layer1.1.bn1.running_mean", (4,), "float32"),
    ("layer1.1.bn1.running_var", (4,), "float32"),
    ("layer1.1.bn1.num_batches_tracked", (), "int64"),
    ("head.weight", (10, 4), "float32"),
    ("head.bias", (10,), "float32"),
]


def _torch_net():
    torch = pytest.importorskip("torch")
    nn = torch.nn

    class TBlock(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(c)
            self.act = nn.ReLU()

    class TNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 4, 3)
            self.layer1 = nn.Sequential(TBlock(4), TBlock(4))
            self.head = nn.Linear(4, 10)
            self.register_buffer("scale", torch.tensor([1.0, 2.0]))
            self.register_buffer("scratch", torch.tensor([0.0]), persistent=False)

    return TNet()


# ------------------------------------------------------------------ Parameter

def test_parameter_is_a_tensor_and_says_so():
    p = M.Parameter([[1.0, 2.0]])
    assert isinstance(p, mt.Tensor)
    assert p.shape == (1, 2) and p.dtype == np.float32
    assert repr(p).startswith("Parameter([[1., 2.]]")
    assert "dtype=float32" in repr(p)
    assert type(p * 2) is mt.Tensor          # results are plain tensors
    src = mt.tensor([1.0, 2.0])
    q = M.Parameter(src)
    q[0] = 5.0
    assert src.tolist() == [1.0, 2.0]        # copies its data
    assert M.Parameter(np.arange(3), dtype="float64").dtype == np.float64


# ------------------------------------------------------------------ registration

def test_attribute_assignment_registers_and_del_removes():
    m = M.Module()
    m.w = M.Parameter([1.0])
    m.sub = M.Linear(2, 2)
    m.register_buffer("buf", mt.tensor([0.0]))
    m.plain = mt.tensor([3.0])               # a tensor attribute is a buffer (MegEngine's rule)
    m.n = 3
    assert list(m._parameters) == ["w"] and list(m._modules) == ["sub"]
    assert list(m.state_dict()) == ["w", "buf", "plain", "sub.weight", "sub.bias"]
    assert m.w.tolist() == [1.0] and isinstance(m.sub, M.Linear) and m.buf.tolist() == [0.0]
    del m.w, m.sub, m.buf, m.plain
    assert list(m.state_dict()) == []
    with pytest.raises(AttributeError, match="has no attribute 'w'"):
        m.w
    with pytest.raises(AttributeError):
        del m.w


def test_reassignment_moves_the_registration():
    m = M.Module()
    m.a = M.Linear(2, 2)
    m.a = M.Parameter([1.0])                 # module -> parameter
    assert "a" in m._parameters and "a" not in m._modules
    m.a = M.ReLU()                           # parameter -> module
    assert "a" in m._modules and "a" not in m._parameters
    m.a = 5                                  # module -> plain attribute
    assert "a" not in m._modules and m.a == 5
    m.register_buffer("b", mt.tensor([1.0]))
    m.b = mt.tensor([2.0])                   # a tensor replaces the buffer
    assert m._buffers["b"].tolist() == [2.0]
    m.b = "text"                             # anything else drops it
    assert "b" not in m._buffers and m.b == "text"


def test_none_keeps_the_slot_and_is_skipped():
    m = M.Linear(3, 2, bias=False)
    assert "bias" in m._parameters and m.bias is None
    assert list(m.state_dict()) == ["weight"]
    assert [n for n, _ in m.named_parameters()] == ["weight"]
    m.bias = M.Parameter(np.zeros(2, np.float32))
    assert list(m.state_dict()) == ["weight", "bias"]
    m.bias = None
    assert list(m.state_dict()) == ["weight"]


def test_registration_errors():
    m = M.Module()
    with pytest.raises(ValueError, match="cannot contain '.'"):
        m.register_buffer("a.b", mt.tensor([0.0]))
    with pytest.raises(ValueError, match="cannot be empty"):
        m.register_parameter("", M.Parameter([0.0]))
    with pytest.raises(TypeError, match="must be a str"):
        m.add_module(3, M.ReLU())
    with pytest.raises(TypeError, match="Tensor or None expected"):
        m.register_buffer("x", np.zeros(2))
    with pytest.raises(TypeError, match="Parameter or None expected"):
        m.register_parameter("x", mt.tensor([0.0]))
    with pytest.raises(TypeError, match="Module or None expected"):
        m.add_module("x", 3)
    m.attr = 1
    with pytest.raises(KeyError, match="already exists"):
        m.register_buffer("attr", mt.tensor([0.0]))
    with pytest.raises(KeyError, match="already exists"):
        m.add_module("forward", M.ReLU())
    m.p = M.Parameter([1.0])
    with pytest.raises(TypeError, match=r"wrap it as mgtrace.module.Parameter"):
        m.p = mt.tensor([2.0])


def test_assignment_before_super_init_is_explained():
    class Bad(M.Module):
        def __init__(self):
            self.fc = M.Linear(1, 1)
            super().__init__()

    with pytest.raises(AttributeError, match=r"must call super\(\).__init__\(\)"):
        Bad()


def test_forward_missing_and_call():
    with pytest.raises(NotImplementedError, match="Module has no forward"):
        M.Module()(1)

    class Twice(M.Module):
        def forward(self, x, k=2):
            return x * k

    assert Twice()(3, k=4) == 12


# ------------------------------------------------------------------ traversal

def _shared_model():
    """root -> a(Block), b -> (inner=a's conv, seq=[relu, a]); a appears three times."""
    root = M.Module()
    root.a = Block(2)
    root.b = M.Module()
    root.b.inner = root.a.conv1
    root.b.seq = M.Sequential(M.ReLU(), root.a)
    return root


def test_named_modules_with_shared_submodule():
    root = _shared_model()
    names = [n for n, _ in root.named_modules()]
    assert names == ["", "a", "a.conv1", "a.bn1", "a.act", "b", "b.seq", "b.seq.0"]
    mods = [m for _, m in root.named_modules()]
    assert len({id(m) for m in mods}) == len(mods)
    assert list(root.modules()) == mods
    assert [n for n, _ in root.named_modules(prefix="model")][:2] == ["model", "model.a"]
    dup = [n for n, _ in root.named_modules(remove_duplicate=False)]
    assert dup == ["", "a", "a.conv1", "a.bn1", "a.act", "b", "b.inner", "b.seq", "b.seq.0",
                   "b.seq.1", "b.seq.1.conv1", "b.seq.1.bn1", "b.seq.1.act"]
    assert [n for n, _ in root.b.named_children()] == ["inner", "seq"]
    assert list(root.children()) == [root.a, root.b]


def test_named_parameters_and_buffers_give_shared_tensors_once():
    root = _shared_model()
    assert [n for n, _ in root.named_parameters()] == ["a.conv1.weight", "a.bn1.weight",
                                                       "a.bn1.bias"]
    assert [n for n, _ in root.named_buffers()] == [
        "a.bn1.running_mean", "a.bn1.running_var", "a.bn1.num_batches_tracked"]
    assert all(isinstance(p, M.Parameter) for p in root.parameters())
    assert len(list(root.parameters(recurse=False))) == 0
    lin = M.Linear(2, 2)
    lin.tied = lin.weight
    assert [n for n, _ in lin.named_parameters()] == ["weight", "bias"]


# ------------------------------------------------------------------ state dict

def test_state_dict_keys_order_shapes():
    sd = Net().state_dict()
    assert [(k, v.shape, v.dtype.name) for k, v in sd.items()] == NET_KEYS
    assert "scratch" not in sd                            # non-persistent
    assert "scratch" in dict(Net().named_buffers())
    assert all(type(v) is mt.Tensor for v in sd.values())


def test_state_dict_matches_torch():
    tnet = _torch_net()
    expect = [(k, tuple(v.shape), str(v.dtype).replace("torch.", ""))
              for k, v in tnet.state_dict().items()]
    assert expect == NET_KEYS


def test_state_dict_shares_memory_and_keep_vars():
    net = Net()
    sd = net.state_dict()
    sd["head.bias"][...] = 7.0
    assert np.all(net.head.bias.numpy() == 7.0)
    kv = net.state_dict(keep_vars=True)
    assert kv["head.weight"] is net.head.weight
    shared = _shared_model().state_dict()
    assert "a.conv1.weight" in shared and "b.inner.weight" in shared and \
        "b.seq.1.bn1.running_var" in shared                # every path, as PyTorch


def test_load_state_dict_round_trip_numpy_and_tensors():
    src, dst = Net(), Net()
    src.layer1[0].bn1.running_mean[...] = 3.0
    src.layer1[1].bn1.num_batches_tracked[...] = 5
    snapshot = {k: v.numpy() for k, v in src.state_dict().items()}
    assert dst.load_state_dict(snapshot) == ([], [])
    for k, v in dst.state_dict().items():
        np.testing.assert_array_equal(v.numpy(), snapshot[k])
    weight = dst.head.weight
    dst.load_state_dict(Net().state_dict())               # Tensor values
    assert dst.head.weight is weight                      # copied in place, same object
    assert dst.layer1[1].bn1.num_batches_tracked.item() == 0


def test_load_state_dict_from_torch():
    torch = pytest.importorskip("torch")
    tnet = _torch_net()
    with torch.no_grad():
        tnet.layer1[0].bn1.running_var.fill_(2.5)
    net = Net()
    net.load_state_dict(tnet.state_dict())
    for k, v in tnet.state_dict().items():
        np.testing.assert_array_equal(net.state_dict()[k].numpy(), v.numpy())


def test_load_state_dict_errors_name_key_expected_actual():
    net = Net()
    good = {k: v.numpy() for k, v in net.state_dict().items()}

    missing = dict(good)
    del missing["head.bias"]
    with pytest.raises(M.StateDictError, match=r"missing keys: head.bias") as e:
        net.load_state_dict(missing)
    assert e.value.missing_keys == ["head.bias"] and isinstance(e.value, ValueError)
    assert "strict=False" in str(e.value)

    unexpected = dict(good, **{"head.extra": np.zeros(1, np.float32)})
    with pytest.raises(M.StateDictError, match=r"unexpected keys: head.extra"):
        net.load_state_dict(unexpected)

    bad_shape = dict(good, **{"head.weight": np.zeros((4, 10), np.float32)})
    for strict in (True, False):
        with pytest.raises(M.StateDictError,
                           match=r"head.weight: shape mismatch, expected \(10, 4\), got \(4, 10\)"):
            net.load_state_dict(bad_shape, strict=strict)

    bad_dtype = dict(good, **{"layer1.0.bn1.num_batches_tracked": np.array(1, np.int32)})
    for strict in (True, False):
        with pytest.raises(M.StateDictError, match=r"layer1.0.bn1.num_batches_tracked: dtype "
                                                   r"mismatch, expected int64, got int32"):
            net.load_state_dict(bad_dtype, strict=strict)

    with pytest.raises(M.StateDictError, match="head.bias: type mismatch"):
        net.load_state_dict(dict(good, **{"head.bias": object()}))


def test_load_state_dict_is_all_or_nothing():
    net = Net()
    before = net.head.bias.numpy()
    bad = {k: np.full(v.shape, 9, v.dtype) for k, v in net.state_dict().items()}
    bad["stem.weight"] = np.zeros(3, np.float32)
    with pytest.raises(M.StateDictError):
        net.load_state_dict(bad)
    np.testing.assert_array_equal(net.head.bias.numpy(), before)


def test_load_state_dict_non_strict_reports_keys():
    net = Net()
    part = {"head.bias": np.ones(10, np.float32), "nope": np.zeros(1)}
    missing, unexpected = net.load_state_dict(part, strict=False)
    assert unexpected == ["nope"]
    assert missing == [k for k, _, _ in NET_KEYS if k != "head.bias"]
    assert np.all(net.head.bias.numpy() == 1.0)


# ------------------------------------------------------------------ modes, apply, to

def test_train_eval_propagate():
    net = Net()
    assert all(m.training for m in net.modules())
    assert net.eval() is net
    assert not any(m.training for m in net.modules())
    net.layer1.train()
    assert net.layer1[1].bn1.training and not net.training and not net.head.training
    net.train()
    assert all(m.training for m in net.modules())
    with pytest.raises(TypeError, match="bool"):
        net.train("yes")


def test_apply_visits_children_first():
    net = Net()
    seen = []
    assert net.apply(lambda m: seen.append(type(m).__name__)) is net
    assert seen == ["Conv2d", "Conv2d", "BatchNorm2d", "ReLU", "Block", "Conv2d", "BatchNorm2d",
                    "ReLU", "Block", "Sequential", "Linear", "Net"]

    def zero_linear(m):
        if isinstance(m, M.Linear):
            M.init.zeros_(m.weight)

    net.apply(zero_linear)
    assert not net.head.weight.numpy().any()


def test_to_device_keeps_parameters():
    net = Net()
    w = net.head.weight
    assert net.to("cpu") is net and net.head.weight is w       # already there
    net.to("cpu:1")
    assert str(net.head.weight.device) == "cpu:1" and isinstance(net.head.weight, M.Parameter)
    assert str(net.layer1[0].bn1.running_mean.device) == "cpu:1"
    np.testing.assert_array_equal(net.head.weight.numpy(), w.numpy())


def test_to_dtype_casts_floating_tensors_only():
    net = Net()
    before = {k: v.numpy().copy() for k, v in net.state_dict().items()}
    assert net.to("float16") is net
    for k, v in net.state_dict().items():
        want = "int64" if k.endswith("num_batches_tracked") else "float16"
        assert v.dtype.name == want, k
        np.testing.assert_array_equal(v.numpy(), before[k].astype(want), err_msg=k)
    assert all(isinstance(p, M.Parameter) for p in net.parameters())
    assert net.scratch.dtype.name == "float16"                # non-persistent buffers too
    net.to(dtype=np.float64)
    assert net.head.weight.dtype == np.float64 and net.layer1[0].bn1.num_batches_tracked.dtype == np.int64


def test_to_dtype_matches_torch():
    torch = pytest.importorskip("torch")
    ours, theirs = Net().to("bfloat16"), _torch_net().to(torch.bfloat16)
    assert [(k, v.dtype.name) for k, v in ours.state_dict().items()] == \
        [(k, str(v.dtype).replace("torch.", "")) for k, v in theirs.state_dict().items()]
    assert [(k, v.dtype.name) for k, v in ours.named_buffers()] == \
        [(k, str(v.dtype).replace("torch.", "")) for k, v in theirs.named_buffers()]


def test_to_device_and_dtype_forms():
    net = Net()
    w = net.head.weight
    assert net.to("cpu", "float32") is net and net.head.weight is w          # nothing to do
    net.to("cpu:1", "float64")
    assert str(net.head.weight.device) == "cpu:1" and net.head.weight.dtype == np.float64
    assert str(net.layer1[1].bn1.num_batches_tracked.device) == "cpu:1"
    np.testing.assert_array_equal(net.head.weight.numpy(), w.numpy().astype(np.float64))
    net.to(device="cpu", dtype="float32")
    assert str(net.head.weight.device) == "cpu:0" and net.head.weight.dtype == np.float32
    ref = mt.tensor(np.zeros(1, np.float16), device="cpu:1")
    net.to(ref)                                                  # a tensor's device and dtype
    assert str(net.stem.bias.device) == "cpu:1" and net.stem.bias.dtype == np.float16


def test_to_keeps_shared_parameters_shared():
    net = Net()
    net.tied = M.Linear(4, 10)
    net.tied.weight = net.head.weight
    net.to("float64")
    assert net.tied.weight is net.head.weight and net.head.weight.dtype == np.float64


@pytest.mark.parametrize("args, kwargs, exc, match", [
    (("int32",), {}, TypeError, r"dtype must be a floating dtype .* got int32"),
    ((), {"dtype": "bool"}, TypeError, r"dtype must be a floating dtype .* got bool"),
    ((3,), {}, TypeError, r"expected a device \(like 'cpu' or 'cuda:0'\) or a floating dtype, got 3"),
    (("tpu",), {}, ValueError, "unknown device 'tpu'"),
    (("cpu", "float32", "x"), {}, TypeError, "at most 2 positional arguments"),
    ((), {"non_blocking": True}, TypeError, "unexpected keyword argument 'non_blocking'"),
    (("cpu",), {"device": "cpu"}, TypeError, "device given both by position and by keyword"),
    (("cpu", "float16"), {"dtype": "float16"}, TypeError, "given both by position and by keyword"),
])
def test_to_errors(args, kwargs, exc, match):
    net = Net()
    with pytest.raises(exc, match=match):
        net.to(*args, **kwargs)
    assert net.head.weight.dtype == np.float32                   # nothing changed


# ------------------------------------------------------------------ forward hooks

class Affine(M.Module):
    """y = a * x + b (keyword b): enough to see what hooks change."""

    def forward(self, x, b=0.0):
        return x * 2.0 + b


def test_forward_pre_hook_replaces_arguments():
    m = Affine()
    x = mt.tensor([1.0, 2.0])
    h1 = m.register_forward_pre_hook(lambda mod, args: (args[0] + 1,))
    assert m(x).tolist() == [4.0, 6.0]
    h2 = m.register_forward_pre_hook(lambda mod, args: args[0] * 10)    # not a tuple: one argument
    assert m(x).tolist() == [40.0, 60.0]                                 # (x + 1) * 10, then forward
    h3 = m.register_forward_pre_hook(lambda mod, args: None, prepend=True)
    h1.remove()
    h1.remove()                                                          # a second remove does nothing
    assert m(x).tolist() == [20.0, 40.0]
    h2.remove(), h3.remove()
    assert m(x).tolist() == [2.0, 4.0]


def test_forward_pre_hook_with_kwargs():
    m = Affine()
    seen = []

    def hook(mod, args, kwargs):
        seen.append((mod, len(args), dict(kwargs)))
        return (args[0] * 0,), {"b": kwargs.get("b", 0.0) + 5.0}

    m.register_forward_pre_hook(hook, with_kwargs=True)
    assert m(mt.tensor([1.0]), b=1.0).tolist() == [6.0]
    assert seen == [(m, 1, {"b": 1.0})]
    m.register_forward_pre_hook(lambda mod, args, kwargs: "bad", with_kwargs=True)
    with pytest.raises(TypeError, match=r"must return None or a tuple \(args, kwargs\), got str"):
        m(mt.tensor([1.0]))


def test_forward_hook_sees_inputs_and_replaces_output():
    m = Affine()
    calls = []
    m.register_forward_pre_hook(lambda mod, args: (args[0] + 1,))
    m.register_forward_hook(lambda mod, args, out: calls.append(("a", args[0].tolist(), out.tolist())))
    m.register_forward_hook(lambda mod, args, out: out - 100)
    m.register_forward_hook(lambda mod, args, kwargs, out: calls.append(("kw", kwargs, out.tolist())),
                            with_kwargs=True)
    m.register_forward_hook(lambda mod, args, out: calls.append(("first", out.tolist())), prepend=True)
    assert m(mt.tensor([1.0]), b=0.5).tolist() == [-95.5]
    assert calls == [("first", [4.5]), ("a", [2.0], [4.5]), ("kw", {"b": 0.5}, [-95.5])]


def test_forward_hook_handle_as_context_manager_and_always_call():
    m = Affine()
    seen = []
    with m.register_forward_hook(lambda mod, args, out: out * 0) as h:
        assert m(mt.tensor([3.0])).tolist() == [0.0]
    assert m(mt.tensor([3.0])).tolist() == [6.0] and isinstance(h, M.module.RemovableHandle)
    m.register_forward_hook(lambda mod, args, out: seen.append(("always", out)), always_call=True)
    m.register_forward_hook(lambda mod, args, out: seen.append(("plain", out)))
    with pytest.raises(TypeError):
        m("not a tensor")
    assert seen == [("always", None)]


def test_hooks_match_torch():
    """The same hooks on torch.nn.Linear and M.Linear with the same weights:
    the same results, the same calls."""
    torch = pytest.importorskip("torch")
    ours, theirs = M.Linear(3, 2), torch.nn.Linear(3, 2)
    ours.load_state_dict(theirs.state_dict())
    logs = {"ours": [], "theirs": []}
    for name, mod in (("ours", ours), ("theirs", theirs)):
        log = logs[name]
        mod.register_forward_pre_hook(lambda m, args, log=log: log.append("pre1") or (args[0] * 2,))
        mod.register_forward_pre_hook(lambda m, args, log=log: log.append("pre0"), prepend=True)
        mod.register_forward_hook(lambda m, args, out, log=log: log.append("post") or out + 1)
        mod.register_forward_hook(lambda m, args, kwargs, out, log=log: log.append(f"kw{len(kwargs)}"),
                                  with_kwargs=True)
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    with torch.no_grad():
        expect = theirs(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(ours(mt.tensor(x)).numpy(), expect, rtol=1e-5, atol=1e-6)
    assert logs["ours"] == logs["theirs"] == ["pre0", "pre1", "post", "kw0"]


def test_hook_registration_errors():
    m = Affine()
    with pytest.raises(TypeError, match="Affine.register_forward_hook: hook must be callable, got int"):
        m.register_forward_hook(3)
    with pytest.raises(TypeError, match="register_forward_pre_hook: prepend must be a bool, got int"):
        m.register_forward_pre_hook(lambda mod, args: None, prepend=1)
    with pytest.raises(TypeError, match="with_kwargs must be a bool"):
        m.register_forward_hook(lambda mod, args, out: None, with_kwargs="yes")


def test_deepcopy_carries_hooks_and_handles_stay_with_the_original():
    m = Affine()
    h = m.register_forward_hook(lambda mod, args, out: out + 1)
    twin = copy.deepcopy(m)
    assert twin(mt.tensor([1.0])).tolist() == [3.0]
    h.remove()
    assert m(mt.tensor([1.0])).tolist() == [2.0] and twin(mt.tensor([1.0])).tolist() == [3.0]


def test_traced_module_records_hooks_once():
    """Tracing runs the hooks: what those of a traced-into module do is in its
    graph, so the TracedModule (which does not copy them) gives the eager
    result, not the hooks applied twice; a builtin leaf keeps its hooks."""
    class Outer(M.Module):
        def __init__(self):
            super().__init__()
            self.inner = Affine()
            self.act = M.ReLU()

        def forward(self, x):
            return self.act(self.inner(x)) + 1

    net = Outer()
    net.inner.register_forward_pre_hook(lambda mod, args: (args[0] - 1,))
    net.inner.register_forward_hook(lambda mod, args, out: out * 3)
    net.act.register_forward_hook(lambda mod, args, out: out + 10)
    x = mt.tensor([0.5, 2.0, -1.0])
    eager = net(x).tolist()
    assert eager == [11.0, 17.0, 11.0]
    tm = mt.trace_module(net, x)
    assert tm(x).tolist() == eager
    inner = str(tm.inner.graph)                 # the pre-hook's x - 1 and the hook's out * 3
    assert "__sub__(1)" in inner and "__mul__(3)" in inner


def test_deepcopy_copies_tensors():
    net = Net()
    net.tied = net.head                                   # shared module stays shared
    twin = copy.deepcopy(net)
    assert twin.tied is twin.head and twin.head is not net.head
    assert isinstance(twin.head.weight, M.Parameter)
    twin.scale[...] = 0.0
    assert net.scale.tolist() == [1.0, 2.0]
    np.testing.assert_array_equal(twin.stem.weight.numpy(), net.stem.weight.numpy())


# ------------------------------------------------------------------ repr

def test_repr_nested():
    m = M.Module()
    m.body = M.Sequential(M.Conv2d(3, 8, 3, stride=2, padding=1, bias=False), M.BatchNorm2d(8),
                          M.ReLU())
    m.pool = M.AdaptiveAvgPool2d(1)
    m.fc = M.Linear(8, 2)
    assert repr(m) == (
        "Module(\n"
        "  (body): Sequential(\n"
        "    (0): Conv2d(3, 8, kernel_size=(3, 3), stride=(2, 2), padding=(1, 1), bias=False)\n"
        "    (1): BatchNorm2d(8, eps=1e-05, momentum=0.1, affine=True, bias=True, "
        "track_running_stats=True)\n"
        "    (2): ReLU()\n"
        "  )\n"
        "  (pool): AdaptiveAvgPool2d(output_size=1)\n"
        "  (fc): Linear(in_features=8, out_features=2, bias=True)\n"
        ")")


def test_repr_matches_torch():
    torch = pytest.importorskip("torch")
    mine, theirs = Net(), _torch_net()
    assert repr(mine).replace("Net(", "X(").replace("Block(", "B(") == \
        repr(theirs).replace("TNet(", "X(").replace("TBlock(", "B(")
    assert repr(torch.nn.Sequential()) == repr(M.Sequential())


# ------------------------------------------------------------------ containers

def test_sequential():
    a, b, c = M.Linear(2, 3), M.ReLU(), M.Linear(3, 1)
    s = M.Sequential(a, b, c)
    assert len(s) == 3 and list(s) == [a, b, c] and s[0] is a and s[-1] is c
    sl = s[1:]
    assert type(sl) is M.Sequential and list(sl) == [b, c] and list(sl._modules) == ["1", "2"]
    with pytest.raises(IndexError, match="out of range"):
        s[3]
    with pytest.raises(TypeError, match="integers or slices"):
        s["0"]
    named = M.Sequential(OrderedDict([("fc", a), ("act", b)]))
    assert named.fc is a and list(named.state_dict()) == ["fc.weight", "fc.bias"]
    s.append(M.Sigmoid())
    assert len(s) == 4 and isinstance(s[3], M.Sigmoid)
    del s[1]
    assert list(s._modules) == ["0", "1", "2"] and s[1] is c
    s.insert(1, b)
    assert list(s) [1] is b and len(s) == 4
    s[0] = M.Identity()
    assert isinstance(s[0], M.Identity)
    with pytest.raises(TypeError, match="argument 1 is int"):
        M.Sequential(a, 3)

    class Add(M.Module):
        def __init__(self, k):
            super().__init__()
            self.k = k

        def forward(self, x):
            return x + self.k

    assert M.Sequential(Add(1), Add(10))(mt.tensor([1])).tolist() == [12]


def test_module_list():
    ml = M.ModuleList([M.ReLU(), M.Tanh()])
    ml.append(M.Sigmoid())
    ml.extend([M.SiLU()])
    ml.insert(0, M.Identity())
    assert [type(m).__name__ for m in ml] == ["Identity", "ReLU", "Tanh", "Sigmoid", "SiLU"]
    assert len(ml) == 5 and isinstance(ml[-1], M.SiLU)
    assert ml.index(ml[2]) == 2
    with pytest.raises(ValueError):
        ml.index(M.ReLU())
    assert type(ml[1:3]) is M.ModuleList and len(ml[1:3]) == 2
    ml += [M.GELU()]
    assert len(ml) == 6
    with pytest.raises(TypeError, match="holds Modules"):
        ml.append(3)
    host = M.Module()
    host.layers = M.ModuleList([M.Linear(1, 2), M.Linear(2, 3)])
    assert list(host.state_dict()) == ["layers.0.weight", "layers.0.bias", "layers.1.weight",
                                       "layers.1.bias"]
    del host.layers[0]
    assert list(host.state_dict()) == ["layers.0.weight", "layers.0.bias"]


def test_module_dict():
    md = M.ModuleDict({"act": M.ReLU(), "fc": M.Linear(2, 2)})
    md["norm"] = M.LayerNorm(2)
    assert list(md.keys()) == ["act", "fc", "norm"] and len(md) == 3
    assert "fc" in md and "nope" not in md and list(md) == ["act", "fc", "norm"]
    assert [type(v).__name__ for v in md.values()] == ["ReLU", "Linear", "LayerNorm"]
    assert [k for k, _ in md.items()] == ["act", "fc", "norm"]
    assert list(md.state_dict()) == ["fc.weight", "fc.bias", "norm.weight", "norm.bias"]
    with pytest.raises(KeyError, match="'nope' is not in this ModuleDict"):
        md["nope"]
    del md["act"]
    assert list(md) == ["fc", "norm"]
    assert isinstance(md.pop("fc"), M.Linear) and list(md) == ["norm"]
    with pytest.raises(TypeError, match="holds Modules"):
        md["x"] = 1
    with pytest.raises(ValueError, match="cannot contain '.'"):
        md["a.b"] = M.ReLU()


# ------------------------------------------------------------------ docstrings

@pytest.mark.parametrize("name", ["mgtrace.module", "mgtrace.module.module",
                                  "mgtrace.module.parameter", "mgtrace.module.container",
                                  "mgtrace.module.init", "mgtrace.module.builtin"])
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name),
                             optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0 and result.attempted > 0
