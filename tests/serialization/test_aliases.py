"""aliases.py (format 1.2): tensors that share memory share it again after
save/load (copied and mmapped) and after copy.deepcopy, each with the
offset and strides it had, so a write through one is seen by the others as
in eager code; an older target refuses naming both tensors; a hostile view
entry is an ArchiveError; an archive without shared memory is unchanged."""
import copy
import hashlib
import json
import pathlib

import msgpack
import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module as M

from .helpers import edit, load_bytes, save_bytes, split
from .test_golden import _script

GOLDEN = pathlib.Path(__file__).resolve().parents[2] / "schema" / "golden"


def _offset(view, base):
    """Elements from base's first element to view's (the NumPy reference)."""
    return (view.data_ptr - base.data_ptr) // base.itemsize


def _views(base):
    return {"base": base, "slice": base[1:3, ::2], "t": base.T, "rev": base[::-1],
            "row": base[2].broadcast_to((3, 6)), "col": base[:, 4]}


def _base():
    return mt.tensor(np.arange(24, dtype=np.float32).reshape(4, 6))


def _assert_views_of_one_storage(got, want):
    """got[k] has want[k]'s values, shape, strides and offset into one storage."""
    b, wb = got["base"], want["base"]
    for k, w in want.items():
        g = got[k]
        assert g._storage_id() == b._storage_id(), k
        assert g.shape == w.shape and g.strides == w.strides, k
        assert _offset(g, b) == _offset(w, wb), k
        np.testing.assert_array_equal(g.numpy(), w.numpy(), err_msg=k)


@pytest.mark.parametrize("mmap", [False, True])
def test_views_of_one_storage_come_back_as_views_of_one_storage(tmp_path, mmap):
    want = _views(_base())
    path = tmp_path / "v.tmod"
    mt.save(want, path)
    got = mt.load(path, mmap=mmap)
    _assert_views_of_one_storage(got, want)
    # hand-computed: row 1, every other column; the last column reversed by rows
    assert got["slice"].numpy().tolist() == [[6, 8, 10], [12, 14, 16]]
    assert got["rev"][:, 5].numpy().tolist() == [23, 17, 11, 5]
    assert got["row"].readonly              # a broadcast view, as in eager
    assert got["base"].readonly is mmap


def test_a_write_through_one_loaded_view_is_seen_by_the_others():
    got = load_bytes(save_bytes(_views(_base())))
    got["slice"][0, 1] = -5.0               # base[1, 2]
    got["t"][5, 3] = 99.0                   # base[3, 5]
    assert got["base"].numpy()[1, 2] == -5.0 and got["rev"].numpy()[0, 5] == 99.0
    assert got["col"].numpy().tolist() == [4, 10, 16, 22]        # not written: unchanged
    got["base"][2, 4] = 7.0
    assert got["col"].numpy()[2] == 7.0 and got["row"].numpy()[1, 4] == 7.0


def test_mmap_views_point_into_the_mapping_and_stay_read_only(tmp_path):
    path = tmp_path / "v.tmod"
    mt.save(_views(_base()), path)
    got = mt.load(path, mmap=True)
    with pytest.raises(ValueError, match="read-only"):
        got["slice"][0, 0] = 1.0


class _Net(M.Module):
    """A buffer that is a row of a builtin Linear's weight; the same Linear
    under two names (tied); a tensor attribute holding the weight's transpose."""

    def __init__(self):
        super().__init__()
        self.fc = M.Linear(4, 3)
        self.tied = self.fc
        self.first_row = self.fc.weight[0]
        self.weight_t = self.fc.weight.T

    def forward(self, x):
        return self.tied(x) + F.matmul(x * self.first_row, self.weight_t)


def _net():
    net = _Net().eval()
    net.fc.weight[...] = mt.tensor(np.arange(12, dtype=np.float32).reshape(3, 4) / 10)
    return net


def _check_net(m, eager):
    w = m.fc.weight
    assert isinstance(w, M.Parameter) and m.tied is m.fc
    assert m.first_row._storage_id() == w._storage_id() and _offset(m.first_row, w) == 0
    assert m.weight_t._storage_id() == w._storage_id() and m.weight_t.strides == (1, 4)
    x = mt.tensor(np.ones((2, 4), np.float32))
    np.testing.assert_allclose(m(x).numpy(), eager(x).numpy(), rtol=1e-6)


@pytest.mark.parametrize("mmap", [False, True])
def test_a_traced_model_keeps_its_views_of_a_parameter(tmp_path, mmap):
    net = _net()
    tm = mt.trace_module(net, mt.tensor(np.ones((2, 4), np.float32)))
    path = tmp_path / "m.tmod"
    mt.save(tm, path)
    assert mt.serialization.read_header(path)["min_reader_version"] == [1, 2]
    got = mt.load(path, mmap=mmap)
    _check_net(got, net)
    if not mmap:        # eager semantics: the buffer follows the parameter
        got.fc.weight[0, 0] = 5.0
        assert got.first_row.numpy()[0] == 5.0 and got.weight_t.numpy()[0, 0] == 5.0


def test_deepcopy_keeps_views_of_one_storage():
    net = _net()
    c = copy.deepcopy(net)
    _check_net(c, net)
    assert c.fc.weight._storage_id() != net.fc.weight._storage_id()       # a copy
    c.fc.weight[0, 1] = -1.0
    assert c.first_row.numpy()[1] == -1.0 and net.first_row.numpy()[1] == 0.1
    tm = mt.trace_module(net, mt.tensor(np.ones((2, 4), np.float32)))
    _check_net(copy.deepcopy(tm), tm)


def test_deepcopy_of_an_mmap_load_is_writable_and_keeps_views(tmp_path):
    tm = mt.trace_module(_net(), mt.tensor(np.ones((2, 4), np.float32)))
    mt.save(tm, tmp_path / "m.tmod")
    c = copy.deepcopy(mt.load(tmp_path / "m.tmod", mmap=True))
    c.fc.weight[0, 0] = 3.0
    assert c.first_row.numpy()[0] == 3.0


def test_an_older_target_refuses_naming_both_tensors():
    tm = mt.trace_module(_net(), mt.tensor(np.ones((2, 4), np.float32)))
    with pytest.raises(ValueError, match=r"tensors fc\.weight and first_row share .* needs archive "
                                         r"format 1\.2, but the target version is 1\.1"):
        save_bytes(tm, target_version=(1, 1))
    with pytest.raises(ValueError, match=r"tensors obj\['base'\] and obj\['slice'\] share"):
        save_bytes(_views(_base()), target_version=(1, 0))
    # stored apart on purpose: fine for any target
    base = _base()
    assert split(save_bytes({"a": base, "b": base[1].copy()},
                            target_version=(1, 1)))[0]["format_version"] == [1, 1]


def test_without_shared_memory_nothing_changes():
    base = _base()
    header, _ = split(save_bytes({"a": base, "b": base[1].copy(), "same": base}))
    assert header["format_version"] == [1, 1] and header["min_reader_version"] == [1, 0]
    assert all("view" not in e for e in header["tensors"]) and len(header["tensors"]) == 2


def _golden_1_0():
    folder = GOLDEN / "1.0"       # its script imported once (it registers a function)
    return _script(folder), json.loads((folder / "manifest.json").read_text())


@pytest.mark.parametrize("name", ["tensor.tmod", "state_dict.tmod", "nested.tmod"])
def test_archives_without_views_are_written_byte_for_byte_as_the_golden_ones(name):
    script, manifest = _golden_1_0()
    obj, kwargs = script.build()[name]
    data = save_bytes(obj, target_version=(1, 0), **kwargs)
    golden = (GOLDEN / "1.0" / name).read_bytes()
    assert "sha256:" + hashlib.sha256(golden).hexdigest() == manifest[name]
    # the same bytes but for "written by" (0.1.0 there, this version here)
    (header, payload), (want, want_payload) = split(data), split(golden)
    assert header.pop("producer") == {"library": "mgtrace", "version": mt.__version__}
    want.pop("producer")
    assert msgpack.packb(header) == msgpack.packb(want) and payload == want_payload


@pytest.mark.parametrize("mmap", [False, True])
def test_golden_1_2_views_share_their_storage(mmap):
    script = _script(GOLDEN / "1.2")
    got = mt.load(GOLDEN / "1.2" / "aliased_values.tmod", mmap=mmap)
    for a, b in script.ALIASES:
        assert got[a]._storage_id() == got[b]._storage_id(), (a, b)
    assert got["other"]._storage_id() != got["base"]._storage_id()
    assert got["reversed"].strides == (-6, 1) and got["transposed"].strides == (1, 6)
    model = mt.load(GOLDEN / "1.2" / "aliased_model.tmod", mmap=mmap)
    assert model.first_row._storage_id() == model.fc.weight._storage_id()
    assert model.proj_t._storage_id() == model.proj.weight._storage_id()


# ---------------------------------------------------------------- hostile entries

def _with_view(change):
    def fn(h):
        change(next(e for e in h["tensors"] if "view" in e and e["shape"] == [2, 3]), h)
    return edit(save_bytes(_views(_base())), fn)


@pytest.mark.parametrize("change, message", [
    (lambda e, h: e["view"].update(base=len(h["tensors"])), "out of range"),
    (lambda e, h: e["view"].update(base=0), "is a view or of another dtype"),
    (lambda e, h: e.update(dtype="int32"), "is a view or of another dtype"),
    (lambda e, h: e["view"].update(strides=[6]), "1 strides for 2 dimensions"),
    (lambda e, h: e["view"].update(offset=20), "runs outside it"),
    (lambda e, h: e["view"].update(strides=[-6, 2], offset=0), "runs outside it"),
    (lambda e, h: e["view"].update(strides=[1 << 63, 1]), "expected list of at most 16 integers"),
    (lambda e, h: e.update(nbytes=24), "a view holds no data"),
    (lambda e, h: e["view"].pop("strides"), "required field 'strides' is missing"),
])
def test_a_bad_view_entry_is_an_archive_error(change, message):
    with pytest.raises(mt.ArchiveError, match=message):
        load_bytes(_with_view(change))


def test_strided_view_refuses_elements_outside_the_storage():
    from mgtrace._core.tensor import storage_spans, strided_view
    t = mt.tensor(np.arange(10, dtype=np.float32))
    assert strided_view(t[2:], (2, 2), (-2, 1), 4).numpy().tolist() == [[6, 7], [4, 5]]
    with pytest.raises(ValueError, match="runs outside it"):
        strided_view(t[2:], (2, 2), (6, 1), 2)          # element 4 + 6 + 1 = 11 of 10
    with pytest.raises(ValueError, match="runs outside it"):
        strided_view(t, (3,), (-1,), 1)                 # element -1
    [(span, members)] = storage_spans([t[3:5], mt.tensor([1.0]), t[::4]])
    assert span.numpy().tolist() == list(range(9)) and members == [(0, 3), (2, 0)]  # 0..8
