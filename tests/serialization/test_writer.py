"""writer.py: what save accepts and refuses, and that the same object always
gives the same bytes."""
import io
import warnings
from collections import OrderedDict

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.module as M

from .helpers import assert_same, load_bytes, save_bytes, split


def model(seed):
    rng = np.random.default_rng(seed)
    net = M.Sequential(M.Conv2d(3, 4, 3), M.BatchNorm2d(4), M.ReLU(), M.Flatten(), M.Linear(4, 2))
    net.load_state_dict({k: rng.standard_normal(v.shape).astype(v.dtype)
                         for k, v in net.state_dict().items()})
    return net


def test_same_object_same_bytes(tmp_path):
    obj = {"net": model(0), "sd": model(1).state_dict(), "x": (1.5, -0.0, b"b", {3: None})}
    a, b = save_bytes(obj, metadata={"k": [1, 2]}), save_bytes(obj, metadata={"k": [1, 2]})
    assert a == b
    mt.save(obj, tmp_path / "a.tmod", metadata={"k": [1, 2]})
    assert (tmp_path / "a.tmod").read_bytes() == a


def test_equal_objects_built_separately_give_the_same_bytes():
    assert save_bytes(model(3)) == save_bytes(model(3))
    assert save_bytes(model(3)) != save_bytes(model(4))


def test_nested_containers_round_trip(rng):
    sd = OrderedDict([("a", mt.tensor(rng.standard_normal(3).astype(np.float32))),
                      ("b", mt.tensor(np.arange(4, dtype=np.int8)))])
    obj = [sd, (sd["a"], {"lr": 0.1, "betas": (0.9, 0.999)}), {("x", 1): [None, True, "s"]}]
    assert_same(load_bytes(save_bytes(obj)), obj)


def test_state_dict_of_a_model_round_trips():
    sd = model(5).state_dict()
    out = load_bytes(save_bytes(sd))
    assert type(out) is OrderedDict and list(out) == list(sd)
    assert_same(out, OrderedDict((k, v) for k, v in sd.items()))
    model(6).load_state_dict(out)


def test_examples_are_inputs_and_outputs_of_a_module():
    net = model(7).eval()
    x = mt.tensor(np.ones((1, 3, 3, 3), np.float32))
    header, _ = split(save_bytes(net, example_inputs=(x,)))
    assert set(header["examples"]) == {"inputs", "outputs"}
    with pytest.raises(TypeError, match="example_inputs needs a Module"):
        save_bytes(mt.tensor([1.0]), example_inputs=(x,))


def test_bad_arguments():
    with pytest.raises(TypeError, match="metadata must be a dict"):
        save_bytes(1, metadata=[1])
    with pytest.raises(TypeError, match="path or a binary file object"):
        mt.save(1, 42)
    with pytest.raises(TypeError, match=r"cannot save: obj\[0\]: cannot store a builtins.set"):
        save_bytes([{1}])


def test_writes_to_a_file_object_at_its_position():
    buf = io.BytesIO(b"head")
    buf.seek(4)
    mt.save([1, 2], buf)
    buf.seek(4)
    assert mt.load(buf) == [1, 2]


class _Holder(M.Module):
    """A leaf whose config() holds whatever it was given."""

    def __init__(self, f=None):
        super().__init__()
        self.f = f

    def config(self):
        return {"f": self.f}

    def forward(self, x):
        return x * 2


mt.serialization.register_module(_Holder, name="tests.writer.Holder")


class _Outer(M.Module):
    def __init__(self, leaf):
        super().__init__()
        self.body = M.Sequential(M.ReLU(), leaf)

    def forward(self, x):
        return self.body(x)


def test_unstorable_values_are_named_by_module_path_and_key():
    x = mt.tensor(np.ones((2, 3), "float32"))
    tm = mt.trace_module(_Outer(_Holder(lambda v: v)), x)
    with pytest.raises(TypeError) as e:
        save_bytes(tm)
    assert isinstance(e.value, TypeError) and isinstance(e.value, mt.errors.Error)
    assert str(e.value).startswith("cannot save: body.1 (tests.writer.Holder) config()['f']: "
                                   "cannot store a builtins.function in an archive"), e.value
    with pytest.raises(TypeError, match=r"^cannot save: tests.writer.Holder config\(\)\['f'\]\[1\]: "
                                        r"cannot store a builtins.set"):
        save_bytes(_Holder([1, {2}]))
    with pytest.raises(TypeError, match=r"^cannot save: metadata\['f'\]: cannot store a builtins.builtin_function"):
        save_bytes(tm.body[0], metadata={"ok": 1, "f": print})
    with pytest.raises(TypeError, match=r"^cannot save: example_inputs\[0\]\['k'\]: cannot store"):
        save_bytes(M.Identity(), example_inputs=({"k": {3}},))
    # a module inside a stored value: its path, not the value's
    with pytest.raises(TypeError, match=r"^cannot save: tests.writer.Holder config\(\)\['f'\]: "):
        save_bytes({"net": [_Holder(open)]})


def test_an_attribute_that_cannot_be_stored_is_warned_about_not_dropped_silently():
    class WithAttrs(M.Module):
        def __init__(self):
            super().__init__()
            self.fn = lambda v: v
            self.table = {"a": 1}
            self.fc = M.Linear(3, 2)

        def forward(self, x):
            return self.fc(x)

    x = mt.tensor(np.ones((1, 3), "float32"))
    tm = mt.trace_module(WithAttrs(), x)
    with pytest.warns(UserWarning, match=r"WithAttrs: attribute 'fn' is not saved: cannot store a "
                                         r"builtins.function .*The loaded module will not have it") as w:
        buf = io.BytesIO()
        mt.save(tm, buf)
    assert len(w) == 1 and w[0].filename == __file__        # points at the save call
    loaded = load_bytes(buf.getvalue())
    assert loaded.table == {"a": 1} and not hasattr(loaded, "fn")
    tm(x)                                   # a call leaves a cache: not an attribute to warn about
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        del tm.fn
        save_bytes(tm)


def test_example_inputs_as_a_list_are_the_positional_arguments():
    class Two(M.Module):
        def forward(self, a, b):
            return a * 2 + b

    class OneList(M.Module):
        def forward(self, xs):
            return xs[0] - xs[1]

    a, b = mt.tensor([1.0, 2.0]), mt.tensor([10.0, 20.0])
    tm = mt.trace_module(Two(), a, b)
    arc = mt.serialization.load_archive(io.BytesIO(save_bytes(tm, example_inputs=[a, b])))
    assert type(arc.example_inputs) is tuple and len(arc.example_inputs) == 2
    assert arc.example_outputs.tolist() == [12.0, 24.0]
    # one list argument: wrapped in the tuple of arguments
    tm = mt.trace_module(OneList(), [a, b])
    arc = mt.serialization.load_archive(io.BytesIO(save_bytes(tm, example_inputs=([a, b],))))
    assert type(arc.example_inputs[0]) is list and arc.example_outputs.tolist() == [-9.0, -18.0]


def test_a_numpy_array_in_example_inputs_names_mgtrace_tensor():
    net = M.Sequential(M.ReLU())
    with pytest.raises(TypeError, match=r"mgtrace\.tensor\(array\)") as e:
        save_bytes(net, example_inputs=(np.ones(3, np.float32),))
    assert not type(e.value).__name__.startswith("_")     # the traceback shows no private class
    assert "example_inputs[0]" in str(e.value)


def test_a_module_traced_with_keywords_points_to_example_kwargs():
    class Scale(M.Module):
        def forward(self, x, scale=1.0, *, shift=0.0):
            return x * scale + shift

    x = mt.tensor(np.ones(3, np.float32))
    tm = mt.trace_module(Scale(), x, scale=3.0, shift=0.5)
    with pytest.raises(TypeError, match=r"example_kwargs=\{'scale': 3\.0, 'shift': 0\.5\}"):
        save_bytes(tm, example_inputs=(x,))
    archive = mt.serialization.load_archive(io.BytesIO(save_bytes(
        tm, example_inputs=(x,), example_kwargs={"scale": 3.0, "shift": 0.5})))
    np.testing.assert_array_equal(archive.example_outputs.numpy(), np.full(3, 3.5, np.float32))
