"""MegEngine's module rules (issue 13, points 4 and 5): modules and tensors in
plain lists, tuples and dicts (OrderedDict, nested) held as attributes are
submodules, parameters and buffers; every tensor attribute that is not a
Parameter is a buffer; Module(name=...)."""
import copy
from collections import OrderedDict

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.module as M


class Held(M.Module):
    def __init__(self):
        super().__init__()
        self.fc = M.Linear(2, 2)
        self.blocks = [M.Linear(2, 3), M.Linear(3, 2)]
        self.heads = OrderedDict(cls=M.Linear(2, 4), box=[M.Linear(2, 1), M.ReLU()])
        self.pair = (M.Parameter([1.0, 2.0]), mt.tensor([5.0]))
        self.scale = mt.tensor([2.0])            # a plain tensor attribute: a buffer
        self.config = {"depth": 2, "names": ["a", "b"]}   # no modules or tensors: plain

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.heads["cls"](x) * self.scale, self.heads["box"][0](x) + self.pair[1]


def test_state_dict_names_and_order():
    m = Held()
    assert list(m.state_dict()) == [
        "scale", "fc.weight", "fc.bias",
        "blocks.0.weight", "blocks.0.bias", "blocks.1.weight", "blocks.1.bias",
        "heads.cls.weight", "heads.cls.bias", "heads.box.0.weight", "heads.box.0.bias",
        "pair.0", "pair.1"]
    assert [n for n, _ in m.named_modules()] == [
        "", "fc", "blocks.0", "blocks.1", "heads.cls", "heads.box.0", "heads.box.1"]
    assert [n for n, _ in m.named_children()] == [
        "fc", "blocks.0", "blocks.1", "heads.cls", "heads.box.0", "heads.box.1"]
    params = dict(m.named_parameters())
    assert "pair.0" in params and "blocks.1.weight" in params and len(params) == 11
    assert [n for n, _ in m.named_buffers()] == ["scale", "pair.1"]
    assert "config" not in str(list(m.state_dict()))


def test_every_member_takes_part_in_train_to_copy_and_load():
    m = Held()
    m.eval()
    assert not m.blocks[1].training and not m.heads["box"][1].training
    m.to("float16")
    assert m.blocks[0].weight.dtype == np.float16 and m.pair[1].dtype == np.float16
    assert isinstance(m.pair[0], M.Parameter) and isinstance(m.pair, tuple)
    c = copy.deepcopy(m)
    assert c.blocks[0] is not m.blocks[0] and c.pair[1] is not m.pair[1]
    c.pair[1][...] = 7.0
    assert m.pair[1].tolist() == [5.0]
    ones = {k: np.ones(v.shape, v.dtype) for k, v in m.state_dict().items()}
    m.load_state_dict(ones)
    assert m.heads["box"][0].weight.tolist() == [[1.0, 1.0]] and m.pair[0].tolist() == [1.0, 1.0]


def test_members_added_later_are_found():
    m = Held()
    m.blocks.append(M.Linear(2, 2))
    assert "blocks.2.weight" in m.state_dict()
    assert "(blocks.2): Linear(" in repr(m)


def test_forward_works_and_numbers_match_numpy():
    m = Held().eval()
    x = np.random.default_rng(0).standard_normal((3, 2)).astype("float32")
    a, b = m(mt.tensor(x))
    h = x
    for blk in m.blocks:
        h = h @ blk.weight.numpy().T + blk.bias.numpy()
    cls = m.heads["cls"]
    np.testing.assert_allclose(a.numpy(), (h @ cls.weight.numpy().T + cls.bias.numpy()) * 2.0,
                               rtol=1e-5, atol=1e-6)
    assert b.shape == (3, 1)


def test_bad_keys_are_refused_when_assigned():
    m = M.Module()
    with pytest.raises(TypeError, match=r"heads: a dict holding modules or tensors must have "
                                        r"str keys, got tuple"):
        m.heads = {(1, 2): M.ReLU()}
    with pytest.raises(ValueError, match="key 'a.b'"):
        m.heads = {"a.b": M.ReLU()}
    m.lookup = {(1, 2): "fine"}                 # nothing to register: any keys
    assert list(m.state_dict()) == []


def test_tensor_attributes_are_buffers_and_module_lists_still_work():
    m = M.Module()
    m.t = mt.tensor([1.0])
    assert list(m._buffers) == ["t"] and list(m.state_dict()) == ["t"]
    m.t = 3
    assert not m._buffers and m.t == 3
    m.register_buffer("hidden", mt.tensor([0.0]), persistent=False)
    m.hidden = mt.tensor([1.0])                 # stays a non-persistent buffer
    assert m.hidden.tolist() == [1.0] and list(m.state_dict()) == []
    m.layers = M.ModuleList([M.Linear(2, 2)])
    m.more = M.ModuleDict({"x": M.Linear(2, 1)})
    assert list(m.state_dict()) == ["layers.0.weight", "layers.0.bias", "more.x.weight",
                                    "more.x.bias"]


def test_module_name():
    class Block(M.Module):
        def __init__(self, name=None):
            super().__init__(name=name)
            self.fc = M.Linear(2, 2)

        def forward(self, x):
            return self.fc(x)
    assert Block().name is None and Block(name="first").name == "first"
    assert M.Linear(2, 2).name is None
    assert list(Block(name="n").state_dict()) == ["fc.weight", "fc.bias"]
    with pytest.raises(TypeError, match="name must be a str"):
        Block(name=3)
    with pytest.raises(ValueError, match="non-empty"):
        Block(name="  ")
    tm = mt.trace_module(Block(name="first"), mt.tensor(np.ones((1, 2), np.float32)))
    assert tm.name == "first"


def test_user_attributes_named_like_module_methods(tmp_path):
    """Issue 36: a user's ``self.modules = [...]``, ``self.children = M.ReLU()``
    (and other names of Module methods) are the user's members; tracing,
    eval(), optimize, save and load call those methods through the class."""
    import io

    from mgtrace.traced_module import optimize

    class Net(M.Module):
        def __init__(self):
            super().__init__()
            self.modules = [M.Conv2d(3, 4, 3), M.BatchNorm2d(4)]
            self.children = M.ReLU()
            self.parameters = 3
            self.state_dict = "mine"
            self.named_modules = {"k": 1}

        def forward(self, x):
            for m in self.modules:
                x = m(x)
            return self.children(x)

    net = Net().eval()
    assert isinstance(net.children, M.ReLU) and net.parameters == 3
    assert [k for k, _ in M.Module.named_modules(net)] == ["", "children", "modules.0", "modules.1"]
    x = mt.tensor(np.random.default_rng(0).standard_normal((1, 3, 6, 6)).astype(np.float32))
    want = np.maximum(net.modules[1](net.modules[0](x)).numpy(), 0)
    tm = mt.trace_module(net, x)
    opt = optimize(tm, "all")
    for m in (tm, opt):
        buf = io.BytesIO()
        mt.save(m, buf)
        for out in (m, mt.load(io.BytesIO(buf.getvalue()))):
            np.testing.assert_allclose(out(x).numpy(), want, rtol=1e-5, atol=1e-5)
    del net.children
    assert callable(net.children) and "children" not in net._modules
