"""MegEngine's state dicts (data/*.pkl, written by MegEngine 1.13) load
strictly into the same models written with mgtrace.module, under
``layout="megengine"``, and give MegEngine's outputs; ``state_dict(layout=
"megengine")`` gives MegEngine's shapes back."""
import numpy as np
import pytest

import mgtrace as mt
import mgtrace.megengine as mge
import mgtrace.module as M
from mgtrace.module.module import StateDictError
from .cases import CASES, MODELS, assert_matches, path, stored


@pytest.mark.parametrize("name", CASES)
def test_state_dict_loads_strictly_and_matches_megengine(name):
    sd = mge.load(path(name, ".pkl"))
    assert all(isinstance(v, mt.Tensor) for v in sd.values())
    net = MODELS[name]()
    assert net.load_state_dict(sd, layout="megengine") == ([], [])
    net.eval()
    for batch, (args, kwargs, want) in stored(name).items():
        assert_matches(net(*args, **kwargs), want)


@pytest.mark.parametrize("name", CASES)
def test_state_dict_layout_megengine_gives_megengine_shapes_back(name):
    sd = mge.load(path(name, ".pkl"))
    net = MODELS[name]()
    net.load_state_dict(sd, layout="megengine")
    back = net.state_dict(layout="megengine")
    assert list(sorted(back)) == sorted(sd)
    for k, v in sd.items():
        assert back[k].shape == v.shape, k
        np.testing.assert_array_equal(back[k].numpy(), v.numpy())


def test_megengine_shapes_in_the_file():
    sd = mge.load(path("cnn", ".pkl"))
    # MegEngine's own layout (module/conv.py): what the issue lists
    assert sd["stem.conv.bias"].shape == (1, 8, 1, 1)
    assert sd["grouped.conv.weight"].shape == (4, 3, 2, 3, 3)
    assert sd["depthwise.weight"].shape == (12, 1, 1, 3, 3)
    assert "bn.num_batches_tracked" not in sd


def test_default_layout_refuses_megengine_shapes():
    sd = mge.load(path("cnn", ".pkl"))
    with pytest.raises(StateDictError) as e:
        MODELS["cnn"]().load_state_dict(sd)
    msg = str(e.value)
    assert "stem.conv.bias: shape mismatch, expected (8,), got (1, 8, 1, 1)" in msg
    assert "grouped.conv.weight: shape mismatch, expected (12, 2, 3, 3)" in msg
    assert "missing keys: " in msg and "num_batches_tracked" in msg


def test_grouped_weight_reshape_is_megengine_order():
    """(groups, O/g, I/g, kh, kw) -> (O, I/g, kh, kw): group-major, as
    MegEngine's sparse="group" conv reads it."""
    conv = M.Conv2d(4, 6, 1, groups=2)
    w = np.arange(6 * 2, dtype=np.float32).reshape(2, 3, 2, 1, 1)
    b = np.array([1, 2, 3, 4, 5, 6], np.float32).reshape(1, 6, 1, 1)
    conv.load_state_dict({"weight": w, "bias": b}, layout="megengine")
    np.testing.assert_array_equal(conv.weight.numpy()[:, :, 0, 0],
                                  np.arange(12, dtype=np.float32).reshape(6, 2))
    np.testing.assert_array_equal(conv.bias.numpy(), [1, 2, 3, 4, 5, 6])
    x = np.ones((1, 4, 1, 1), np.float32)
    # group 0 sees channels 0-1, group 1 channels 2-3; output o sums its row
    np.testing.assert_allclose(conv(mt.tensor(x)).numpy()[0, :, 0, 0],
                               np.arange(12).reshape(6, 2).sum(1) + np.arange(1, 7))


def test_conv_transpose_grouped_layout_and_batchnorm_4d():
    ct = M.ConvTranspose2d(4, 6, 2, groups=2)
    assert ct._megengine_layout() == {"weight": ((2, 2, 3, 2, 2),), "bias": ((1, 6, 1, 1),)}
    bn = M.BatchNorm2d(3)
    four = {k: np.full((1, 3, 1, 1), i, np.float32)
            for i, k in enumerate(["weight", "bias", "running_mean", "running_var"], 1)}
    bn.load_state_dict(four, layout="megengine")      # 4-d, no num_batches_tracked
    np.testing.assert_array_equal(bn.running_var.numpy(), [4, 4, 4])
    assert bn.state_dict(layout="megengine")["weight"].shape == (3,)
    assert "num_batches_tracked" not in bn.state_dict(layout="megengine")
    assert "num_batches_tracked" in bn.state_dict()


def test_layout_still_checks_shapes_and_names():
    conv = M.Conv2d(4, 6, 3)
    # the message names MegEngine's shape beside mgtrace's (the file is in MegEngine's)
    with pytest.raises(StateDictError, match=r"bias: shape mismatch, expected \(1, 6, 1, 1\) "
                                             r"\(this layout\), or \(6,\), got \(1, 5, 1, 1\)"):
        conv.load_state_dict({"weight": np.zeros((6, 4, 3, 3), np.float32),
                              "bias": np.zeros((1, 5, 1, 1), np.float32)}, layout="megengine")
    with pytest.raises(StateDictError, match="missing keys: bias"):
        conv.load_state_dict({"weight": np.zeros((6, 4, 3, 3), np.float32)},
                             layout="megengine")
    with pytest.raises(ValueError, match="layout must be 'mgtrace' or 'megengine'"):
        conv.load_state_dict({}, layout="torch")
    with pytest.raises(ValueError, match="layout must be"):
        conv.state_dict(layout="MegEngine")


@pytest.mark.parametrize("dtype", ["uint32", "uint64"])
def test_array_of_a_dtype_mgtrace_lacks_is_an_unsupported_error(dtype):
    # the reader gives these dtypes out; mgtrace.tensor then raised a bare TypeError
    import pickle
    data = pickle.dumps({"w": np.arange(3, dtype=dtype)}, protocol=4)
    with pytest.raises(mge.UnsupportedError, match=dtype):
        mge.loads(data)


def test_bool_bytes_other_than_0_and_1_read_as_true():
    # a hand-made file's bool byte 5 became a Tensor that compared unequal to True and
    # cast to 5; NumPy reads any nonzero byte as True
    import pickle
    raw = np.frombuffer(b"\x05\x00\x01", np.uint8).view(bool)
    sd = mge.loads(pickle.dumps({"w": raw}, protocol=4))
    assert sd["w"].numpy().view(np.uint8).tolist() == [1, 0, 1]
    assert (sd["w"] == True).numpy().tolist() == [True, False, True]  # noqa: E712


def test_protocol_5_arrays_read_as_numpy_reads_them():
    # megengine.save(..., pickle_protocol=5) pickles arrays through
    # numpy.core.numeric._frombuffer, which the reader refused as a forbidden global
    import pickle
    rng = np.random.RandomState(0)
    sd = {"c": rng.randn(2, 3).astype("float32"),
          "f": np.asfortranarray(rng.randn(3, 4)),
          "b": np.array([True, False, True]), "i": np.arange(5, dtype="int64")}
    data = pickle.dumps(sd, protocol=5)
    assert b"_frombuffer" in data
    got = mge.loads(data)
    want = pickle.loads(data)
    for k in sd:
        np.testing.assert_array_equal(got[k].numpy(), want[k])
        assert got[k].dtype == want[k].dtype
    frombuffer = np.arange(1).__reduce_ex__(5)[0]        # numpy's own _frombuffer

    class Short:
        def __reduce__(self):
            return frombuffer, (bytearray(12), np.dtype("float32"), (4,), "C")
    bad = pickle.dumps({"w": Short()}, protocol=5)
    with pytest.raises(mge.MegEngineFileError, match="needs 16 bytes, the file gives 12"):
        mge.loads(bad)
