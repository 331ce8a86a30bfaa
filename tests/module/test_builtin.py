"""Builtin modules: config() rebuilds, the builtin registry, forward results
(against torch.nn with the same weights, or NumPy), initialisation statistics,
and repr against torch.nn's."""
import math

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.module as M
import mgtrace.random as R

# One or more constructions of every builtin: (class name, args, kwargs).
CONSTRUCTIONS = [
    ("Linear", (5, 3), {}),
    ("Linear", (5, 3), {"bias": False}),
    ("Conv1d", (4, 6, 3), {"stride": 2, "padding": 1}),
    ("Conv1d", (4, 4, 3), {"groups": 2, "dilation": 2, "bias": False}),
    ("Conv1d", (4, 6, 3), {"padding": 2, "padding_mode": "reflect"}),
    ("Conv1d", (4, 4, 3), {"padding": 3, "groups": 2, "padding_mode": "circular"}),
    ("Conv2d", (3, 6, 3), {"stride": 2, "padding": 1}),
    ("Conv2d", (4, 4, 3), {"groups": 4, "padding": (1, 0)}),
    ("Conv2d", (2, 4, (3, 1)), {"dilation": (2, 1), "bias": False}),
    # padding modes (the input of these is the last Conv2d one: 2 channels, 9 x 5)
    ("Conv2d", (2, 4, 3), {"padding": 1, "padding_mode": "reflect"}),
    ("Conv2d", (2, 3, 3), {"padding": (2, 1), "stride": 2, "padding_mode": "circular"}),
    ("Conv2d", (2, 4, (3, 2)), {"padding": (1, 3), "dilation": (2, 1), "padding_mode": "replicate",
                                "bias": False}),
    ("Conv2d", (2, 2, 3), {"padding": 1, "padding_mode": "zeros"}),
    ("ConvTranspose2d", (4, 3, 3), {"stride": 2, "padding": 1, "output_padding": 1}),
    ("ConvTranspose2d", (4, 6, 2), {"stride": 2, "groups": 2, "bias": False}),
    ("BatchNorm1d", (4,), {}),
    ("BatchNorm2d", (3,), {"momentum": 0.3, "eps": 1e-3}),
    ("BatchNorm2d", (3,), {"momentum": None}),
    ("BatchNorm2d", (3,), {"affine": False}),
    ("BatchNorm2d", (3,), {"bias": False}),
    ("BatchNorm2d", (3,), {"track_running_stats": False}),
    ("LayerNorm", ((4, 5),), {}),
    ("LayerNorm", (5,), {"elementwise_affine": False}),
    ("LayerNorm", (5,), {"bias": False}),
    ("GroupNorm", (2, 6), {}),
    ("GroupNorm", (3, 6), {"affine": False, "eps": 1e-3}),
    ("GroupNorm", (3, 6), {"bias": False}),
    ("Embedding", (10, 4), {}),
    ("Embedding", (10, 4), {"padding_idx": 0}),
    ("ReLU", (), {}),
    ("ReLU6", (), {}),
    ("GELU", (), {}),
    ("GELU", (), {"approximate": "tanh"}),
    ("SiLU", (), {}),
    ("Sigmoid", (), {}),
    ("Tanh", (), {}),
    ("Hardswish", (), {}),
    ("Hardsigmoid", (), {}),
    ("Softmax", (), {"dim": 1}),
    ("Softmax", (), {}),
    ("MaxPool2d", (3,), {"stride": 2, "padding": 1}),
    ("MaxPool2d", (2,), {"ceil_mode": True}),
    ("MaxPool2d", (3,), {"stride": 2, "padding": 1, "return_indices": True}),
    ("MaxPool2d", (2,), {"dilation": 2, "return_indices": True, "ceil_mode": True}),
    ("AvgPool2d", (3,), {"stride": 2, "padding": 1}),
    ("AvgPool2d", (3,), {"stride": 2, "padding": 1, "count_include_pad": False}),
    ("AdaptiveAvgPool2d", ((2, 3),), {}),
    ("AdaptiveAvgPool2d", (1,), {}),
    ("Dropout", (), {"p": 0.25}),
    ("Identity", (), {}),
    ("Flatten", (), {}),
    ("Flatten", (), {"start_dim": 0, "end_dim": 2}),
    # MegEngine's fused float modules (no torch.nn counterpart)
    ("Elemwise", ("fuse_add_relu",), {}),
    ("ConvRelu2d", (3, 4, 3), {"padding": 1}),
    ("ConvBn2d", (3, 4, 3), {"stride": 2, "bias": False, "eps": 1e-3}),
    ("ConvBnRelu2d", (3, 4, 3), {"momentum": 0.3, "affine": False}),
    # MegEngine's further modules (issue 36; format 1.2)
    ("LeakyReLU", (), {"negative_slope": 0.2}),
    ("PReLU", (), {}),
    ("PReLU", (3,), {"init": 0.1}),
    ("PixelShuffle", (2,), {}),
    ("AdaptiveMaxPool2d", ((2, 3),), {}),
    ("Conv3d", (3, 4, 3), {"stride": (1, 2, 1), "padding": 1}),
    ("Conv3d", (4, 4, (2, 3, 1)), {"groups": 2, "dilation": (2, 1, 1), "bias": False}),
    ("ConvTranspose3d", (3, 2, 3), {"stride": 2, "padding": 1, "output_padding": 1}),
    ("RNNCell", (5, 3), {}),
    ("RNNCell", (5, 3), {"bias": False, "nonlinearity": "relu"}),
    ("LSTMCell", (5, 3), {}),
    ("RNN", (5, 3), {"num_layers": 2}),
    ("LSTM", (5, 4), {"bidirectional": True, "batch_first": True, "proj_size": 2}),
    ("Pad", (((0, 0), (0, 0), (1, 2), (2, 1)),), {"mode": "reflect"}),
    ("InstanceNorm", (3,), {}),
    ("InstanceNorm", (3,), {"affine": False, "eps": 1e-3}),
    ("GeneralNorm", ((3, 5),), {"normalized_axis": (1, 3)}),
    ("LocalResponseNorm", (3,), {"alpha": 0.1}),
    ("SyncBatchNorm", (3,), {"eps_mode": "max"}),
    ("LocalConv2d", (3, 4, 4, 5, 3), {"padding": 1, "groups": 1}),
    ("SlidingWindow", (2,), {"stride": 2}),
    ("SlidingWindowTranspose", ((4, 5), 2), {"stride": 2}),
    ("MultiHeadAttention", (6, 2), {}),
    ("DeformableConv2d", (4, 6, 3), {"padding": 1, "groups": 2}),
    ("RegionRestrictedConv", (4, 4, 3), {"groups": 4, "padding": 1}),
    ("DeformablePSROIPooling", (False, 3, 3, 3, 2, 0.5), {"trans_std": 0.2}),
    # format 1.2 (issue 32: the fused modules quantization maps)
    ("LinearBn1d", (5, 3), {"momentum": 0.2}),
    ("LinearBnRelu1d", (5, 3), {"bias": False}),
    ("BatchMatMulActivation", (2, 5, 3), {"nonlinear_mode": "relu"}),
    ("Concat", (), {}),
    # format 1.2 (issue 32: the fused transposed convolutions)
    ("ConvTransposeRelu2d", (4, 6, 3), {"stride": 2, "output_padding": 1}),
    ("ConvTransposeBn2d", (4, 6, 3), {"groups": 2, "momentum": 0.2}),
    ("ConvTransposeBnRelu2d", (4, 6, 3), {"padding": 1, "bias": False}),
    # format 1.2 (issue 32: the float stubs, identities)
    ("QuantStub", (), {}),
    ("DequantStub", (), {}),
]
NOT_IN_TORCH = ("Elemwise", "ConvRelu2d", "ConvBn2d", "ConvBnRelu2d", "Pad", "InstanceNorm",
                "GeneralNorm", "LocalResponseNorm", "SyncBatchNorm", "LocalConv2d",
                "SlidingWindow", "SlidingWindowTranspose", "MultiHeadAttention",
                "DeformableConv2d", "RegionRestrictedConv", "DeformablePSROIPooling",
                "LinearBn1d", "LinearBnRelu1d", "BatchMatMulActivation", "Concat",
                "ConvTransposeRelu2d", "ConvTransposeBn2d", "ConvTransposeBnRelu2d",
                "QuantStub", "DequantStub")

BUILTIN_NAMES = ["Linear", "Conv1d", "Conv2d", "ConvTranspose2d", "BatchNorm1d", "BatchNorm2d",
                 "LayerNorm", "GroupNorm", "Embedding", "ReLU", "ReLU6", "GELU", "SiLU",
                 "Sigmoid", "Tanh", "Softmax", "MaxPool2d", "AvgPool2d", "AdaptiveAvgPool2d",
                 "Dropout", "Identity", "Flatten", "Hardswish", "Hardsigmoid",
                 "Elemwise", "ConvRelu2d", "ConvBn2d", "ConvBnRelu2d",
                 "LeakyReLU", "PReLU", "PixelShuffle", "AdaptiveMaxPool2d", "Conv3d",
                 "ConvTranspose3d", "RNNCell", "LSTMCell", "RNN", "LSTM", "Pad", "InstanceNorm",
                 "GeneralNorm", "LocalResponseNorm", "SyncBatchNorm", "LocalConv2d",
                 "SlidingWindow", "SlidingWindowTranspose", "MultiHeadAttention",
                 "DeformableConv2d", "RegionRestrictedConv", "DeformablePSROIPooling",
                 "LinearBn1d", "LinearBnRelu1d", "BatchMatMulActivation", "Concat",
                 "ConvTransposeRelu2d", "ConvTransposeBn2d", "ConvTransposeBnRelu2d",
                 "QuantStub", "DequantStub"]


def _ids(c):
    return c[0] + "".join(f"-{k}" for k in c[2])


def _build(c):
    name, args, kwargs = c
    return getattr(M, name)(*args, **kwargs)


def _plain(v):
    if v is None or isinstance(v, (bool, int, float, str)):
        return True
    return isinstance(v, tuple) and all(_plain(x) for x in v)


# ------------------------------------------------------------------ config

def test_constructions_cover_every_builtin():
    assert {c[0] for c in CONSTRUCTIONS} == set(BUILTIN_NAMES)
    # (mgtrace.module.qat's and .quantized's: tests/quantization)
    own = {n for n in M.builtin_types()
           if n.startswith("mgtrace.module.") and not n.startswith(("mgtrace.module.qat.", "mgtrace.module.quantized."))}
    assert own == {f"mgtrace.module.{n}" for n in BUILTIN_NAMES}


@pytest.mark.parametrize("c", CONSTRUCTIONS, ids=_ids)
def test_config_rebuilds_an_equivalent_module(c):
    m = _build(c)
    cfg = m.config()
    assert isinstance(cfg, dict) and all(_plain(v) for v in cfg.values()), cfg
    twin = type(m)(**cfg)
    assert twin.config() == cfg
    assert repr(twin) == repr(m)
    shapes = [(k, v.shape, v.dtype) for k, v in m.state_dict().items()]
    assert [(k, v.shape, v.dtype) for k, v in twin.state_dict().items()] == shapes
    assert [k for k, _ in twin.named_buffers()] == [k for k, _ in m.named_buffers()]
    assert twin.load_state_dict(m.state_dict()) == ([], [])


@pytest.mark.parametrize("c", CONSTRUCTIONS, ids=_ids)
def test_builtin_identity(c):
    m = _build(c)
    cls = type(m)
    assert cls.builtin_name == f"mgtrace.module.{c[0]}" and cls.builtin_version == 1
    assert M.is_builtin(m) and M.is_builtin(cls)
    assert M.builtin_type(cls.builtin_name) is cls


@pytest.mark.parametrize("c", [c for c in CONSTRUCTIONS if c[0] not in NOT_IN_TORCH], ids=_ids)
def test_state_dict_matches_torch(c):
    torch = pytest.importorskip("torch")
    name, args, kwargs = c
    ours = _build(c).state_dict()
    theirs = getattr(torch.nn, name)(*args, **kwargs).state_dict()
    assert [(k, v.shape, v.dtype.name) for k, v in ours.items()] == \
        [(k, tuple(v.shape), str(v.dtype).replace("torch.", "")) for k, v in theirs.items()]


REPR_SAME_AS_TORCH = [c for c in CONSTRUCTIONS
                      if c[0] not in ("Dropout", "Identity", "Softmax") + NOT_IN_TORCH]


@pytest.mark.parametrize("c", REPR_SAME_AS_TORCH, ids=_ids)
def test_repr_matches_torch(c):
    torch = pytest.importorskip("torch")
    name, args, kwargs = c
    assert repr(_build(c)) == repr(getattr(torch.nn, name)(*args, **kwargs))


def test_repr_of_the_others():
    assert repr(M.Dropout(0.25)) == "Dropout(p=0.25)"
    assert repr(M.Softmax(dim=-1)) == "Softmax(dim=-1)"
    assert repr(M.Identity(3, foo=1)) == "Identity()"
    assert repr(M.BatchNorm1d(4, momentum=None)) == \
        "BatchNorm1d(4, eps=1e-05, momentum=None, affine=True, bias=True, track_running_stats=True)"


def test_constructor_argument_errors():
    with pytest.raises(ValueError, match="divisible by groups"):
        M.Conv2d(3, 4, 3, groups=2)
    with pytest.raises(ValueError, match=r"Conv2d: kernel_size must be an int or a pair of ints, got \(3, 3, 3\)"):
        M.Conv2d(3, 4, (3, 3, 3))
    with pytest.raises(TypeError, match="in_features must be an int, got float"):
        M.Linear(2.0, 3)
    with pytest.raises(ValueError, match="num_channels .6. must be divisible by num_groups .4."):
        M.GroupNorm(4, 6)
    with pytest.raises(ValueError, match=r"p must be in \[0, 1\)"):
        M.Dropout(1.5)
    with pytest.raises(ValueError, match="approximate"):
        M.GELU("fast")
    with pytest.raises(ValueError, match="output_padding"):
        M.ConvTranspose2d(2, 2, 3, stride=1, output_padding=1)
    with pytest.raises(ValueError, match="padding_idx 10 is out of range"):
        M.Embedding(10, 2, padding_idx=10)
    assert M.Embedding(10, 2, padding_idx=-1).padding_idx == 9
    with pytest.raises(ValueError, match="Conv2d: padding_mode must be one of 'zeros', 'reflect', "
                                         "'replicate', 'circular', got 'zero'"):
        M.Conv2d(2, 2, 3, padding_mode="zero")
    with pytest.raises(ValueError, match="Conv1d: padding_mode must be one of"):
        M.Conv1d(2, 2, 3, padding_mode=None)
    with pytest.raises(ValueError, match="ConvTranspose2d: padding_mode must be one of 'zeros', got 'reflect'"):
        M.ConvTranspose2d(2, 2, 3, padding_mode="reflect")
    with pytest.raises(TypeError, match="MaxPool2d: return_indices must be a bool, got int"):
        M.MaxPool2d(2, return_indices=1)


HUGE = 2 ** 62 + 1
# (constructor call, message): every size argument of every builtin is an int
# in range, checked when the module is built (one bound, MAX_GEOMETRY = 2**31
# - 1, shared with mgtrace.functional and the core), so a module that builds
# also runs, and an archive config with these values fails at load.
BAD_SIZES = [
    ("M.Conv2d(3, 8, 3, stride=HUGE)", r"Conv2d: stride must be at most 2147483647 \(2\*\*31 - 1\), got 4611686018427387905"),
    ("M.Conv1d(3, 8, 3, stride=(HUGE,))", r"Conv1d: stride must be at most 2147483647 .*got 4611686018427387905"),
    ("M.Conv2d(-3, 8, 3)", r"Conv2d: in_channels must be >= 1, got -3"),
    ("M.Conv2d(3, 8, 10 ** 12)", r"Conv2d: kernel_size must be at most 2147483647 .*got 1000000000000"),
    ("M.Conv2d(3, 8, 3, padding=(0, 2 ** 63))", r"Conv2d: padding must be at most"),
    ("M.Conv2d(3, 8, 3, dilation=0)", r"Conv2d: dilation must be >= 1, got 0"),
    ("M.Conv2d(2 ** 40, 2 ** 40, 3, groups=2 ** 40)", r"Conv2d: in_channels must be at most"),
    ("M.ConvTranspose2d(3, 8, 3, stride=2, output_padding=HUGE)", r"ConvTranspose2d: output_padding must be at most"),
    ("M.Linear(-1, 4)", r"Linear: in_features must be >= 0, got -1"),
    ("M.Linear(4, 2 ** 31)", r"Linear: out_features must be at most 2147483647 .*got 2147483648"),
    ("M.Embedding(2 ** 63, 4)", r"Embedding: num_embeddings must be at most"),
    ("M.BatchNorm2d(HUGE)", r"BatchNorm2d: num_features must be at most"),
    ("M.LayerNorm((2 ** 31 - 1, 2 ** 31 - 1, 2))", r"LayerNorm: normalized_shape gives a result of shape"),
    ("M.GroupNorm(2 ** 40, 2 ** 40)", r"GroupNorm: num_groups must be at most"),
    ("M.MaxPool2d(2 ** 63)", r"MaxPool2d: kernel_size must be at most"),
    ("M.AvgPool2d(3, stride=(1, HUGE))", r"AvgPool2d: stride must be at most"),
    ("M.AdaptiveAvgPool2d((1, -1))", r"AdaptiveAvgPool2d: output_size must be >= 1"),
]


@pytest.mark.parametrize("call, match", BAD_SIZES, ids=[c for c, _ in BAD_SIZES])
def test_constructors_check_every_size(call, match):
    with pytest.raises(ValueError, match=match):
        eval(call, {"M": M, "HUGE": HUGE})                 # noqa: S307  (our own table)


def test_sizes_at_the_bound_build_and_run():
    x = mt.tensor(np.ones((1, 2, 5, 5), np.float32))
    conv = M.Conv2d(2, 3, 3, stride=2 ** 31 - 1, padding=(0, 2), dilation=(1, 2))
    assert conv(x).shape == (1, 3, 1, 1)
    assert M.MaxPool2d(2, stride=2 ** 31 - 1)(x).shape == (1, 2, 1, 1)
    assert M.Linear(0, 2)(mt.tensor(np.ones((3, 0), np.float32))).tolist() == [[0.0, 0.0]] * 3


def test_padding_modes_against_numpy():
    """Conv2d with a padding mode is np.pad's padding (reflect, edge, wrap)
    followed by an unpadded conv2d; zeros is conv2d's own padding."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 2, 6, 5)).astype(np.float32)
    for mode, np_mode in (("reflect", "reflect"), ("replicate", "edge"), ("circular", "wrap"),
                          ("zeros", "constant")):
        conv = M.Conv2d(2, 3, 3, padding=(2, 1), stride=(1, 2), padding_mode=mode)
        padded = np.pad(x, ((0, 0), (0, 0), (2, 2), (1, 1)), mode=np_mode)
        plain = M.Conv2d(2, 3, 3, stride=(1, 2))
        plain.load_state_dict(conv.state_dict())
        np.testing.assert_allclose(conv(mt.tensor(x)).numpy(), plain(mt.tensor(padded)).numpy(),
                                   rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match=r"pad: reflect padding \(3, 3\) on axis 3 must be smaller"):
        M.Conv2d(2, 3, 3, padding=3, padding_mode="reflect")(mt.tensor(x[:, :, :, :3]))
    with pytest.raises(ValueError, match=r"conv2d: x must be 4-d"):
        M.Conv2d(2, 3, 3, padding=1, padding_mode="circular")(mt.tensor(x[0]))


# ------------------------------------------------------------------ registry

def test_register_needs_an_explicit_name_inside_functions():
    class Local(M.Module):
        pass

    with pytest.raises(ValueError, match=r"inside a function; give it a stable name"):
        M.register_as_builtin(Local)


class Swish(M.Module):
    """A user module with recorded constructor arguments."""

    def __init__(self, beta=1.0, shape=(2,)):
        super().__init__()
        self.beta = beta
        self.register_buffer("offset", mt.tensor(np.zeros(shape, np.float32)))

    def forward(self, x):
        return x * self.beta + self.offset


class Configured(M.Module):
    """A user module with its own config()."""

    def __init__(self, n):
        super().__init__()
        self.fc = M.Linear(n, n)

    def config(self):
        return {"n": self.fc.in_features}


def test_register_user_modules():
    assert M.register_as_builtin(Swish) is Swish
    assert Swish.builtin_name == f"{__name__}.Swish" and Swish.builtin_version == 1
    assert M.builtin_type(Swish.builtin_name) is Swish and M.is_builtin(Swish(0.5))
    s = Swish(0.5, shape=(3,))
    assert s.config() == {"beta": 0.5, "shape": (3,)}
    assert Swish(**s.config()).offset.shape == (3,)
    assert M.register_as_builtin(Swish) is Swish          # again, same name: no-op

    deco = M.register_as_builtin(name="tests.Configured", version=3)
    assert deco(Configured) is Configured
    assert M.builtin_type("tests.Configured") is Configured and Configured.builtin_version == 3
    assert Configured(**Configured(4).config()).fc.weight.shape == (4, 4)

    class Sub(Configured):
        pass

    assert not M.is_builtin(Sub(2))                       # subclasses are not leaves


def test_redefining_a_registered_class_replaces_it():
    def define():
        @M.register_as_builtin(name="tests.Redefined")
        class Redefined(M.Module):
            def __init__(self, n=1):
                super().__init__()
        return Redefined

    first, second = define(), define()                    # e.g. a notebook cell run twice
    assert M.builtin_type("tests.Redefined") is second
    assert not M.is_builtin(first) and M.is_builtin(second)


def test_registration_errors():
    with pytest.raises(TypeError, match="subclass of mgtrace.module.Module"):
        M.register_as_builtin(int)
    with pytest.raises(TypeError, match="subclass of mgtrace.module.Module"):
        M.register_as_builtin(M.Linear(1, 1))

    class A(M.Module):
        pass

    with pytest.raises(ValueError, match=r"already taken by mgtrace.module.builtin.Linear"):
        M.register_as_builtin(A, name="mgtrace.module.Linear")
    with pytest.raises(ValueError, match="dotted Python identifiers"):
        M.register_as_builtin(A, name="not a name")
    with pytest.raises(TypeError, match="positive int"):
        M.register_as_builtin(A, name="tests.A", version=0)
    M.register_as_builtin(A, name="tests.A")
    with pytest.raises(ValueError, match="already registered as builtin 'tests.A'"):
        M.register_as_builtin(A, name="tests.A2")
    with pytest.raises(ValueError, match="version 1, not 2"):
        M.register_as_builtin(A, name="tests.A", version=2)

    class Star(M.Module):
        def __init__(self, *sizes):
            super().__init__()

    with pytest.raises(TypeError, match=r"takes \*sizes.*define config\(\)"):
        M.register_as_builtin(Star, name="tests.Star")

    @M.register_as_builtin(name="tests.TakesModule")
    class TakesModule(M.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

    with pytest.raises(TypeError, match=r"TakesModule\(inner=...\) got Linear; .* plain values"):
        TakesModule(M.Linear(1, 1))


def test_builtin_type_unknown_name():
    with pytest.raises(KeyError) as e:
        M.builtin_type("mgtrace.module.Conv")
    msg = str(e.value)
    assert "no builtin module type is registered as 'mgtrace.module.Conv'" in msg
    assert "Did you mean" in msg and "'mgtrace.module.Conv1d'" in msg
    assert "register_as_builtin" in msg
    assert not M.is_builtin(M.Sequential()) and not M.is_builtin(M.Module())


# ------------------------------------------------------------------ forward vs torch

FORWARD_INPUTS = {
    "Linear": [(2, 5), (4, 2, 5)],
    "Conv1d": [(2, 4, 9)],
    "Conv2d": [(2, 3, 9, 9), (2, 4, 7, 6), (2, 2, 9, 5)],
    "ConvTranspose2d": [(2, 4, 5, 5)],
    "BatchNorm1d": [(8, 4), (8, 4, 5)],
    "BatchNorm2d": [(4, 3, 5, 5)],
    "LayerNorm": [(2, 3, 4, 5)],
    "GroupNorm": [(2, 6, 4, 4)],
    "Embedding": [(2, 3)],
    "PixelShuffle": [(2, 8, 3, 4)],
    "Conv3d": [(2, 3, 5, 6, 4), (2, 4, 6, 5, 3)],
    "ConvTranspose3d": [(2, 3, 3, 4, 2)],
    "RNNCell": [(4, 5)],
    "LSTMCell": [(4, 5)],
    "Softmax": [(2, 3, 4)],
    "MaxPool2d": [(2, 3, 7, 7)],
    "AvgPool2d": [(2, 3, 7, 7)],
    "AdaptiveAvgPool2d": [(2, 3, 7, 5)],
    "Flatten": [(2, 3, 4, 5)],
}
DEFAULT_INPUT = [(2, 3, 4, 5)]


def _forward_cases():
    for c in CONSTRUCTIONS:
        if c[0] in ("Dropout", "RNN", "LSTM") + NOT_IN_TORCH:   # RNN, LSTM: test_megengine_layers.py
            continue
        shapes = FORWARD_INPUTS.get(c[0], DEFAULT_INPUT)
        if c[0] in ("Linear", "Conv2d", "Conv3d") and len(shapes) > 1:
            # each construction of these takes its own input
            idx = [x for x in CONSTRUCTIONS if x[0] == c[0]].index(c)
            shapes = [shapes[min(idx, len(shapes) - 1)]]
        for shape in shapes:
            yield pytest.param(c, shape, id=f"{_ids(c)}-{'x'.join(map(str, shape))}")


def _twins(c, torch):
    """(ours, theirs) with the same, non-trivial parameters and buffers."""
    name, args, kwargs = c
    theirs = getattr(torch.nn, name)(*args, **kwargs)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for k, v in theirs.state_dict().items():
            if v.dtype.is_floating_point:
                if k.endswith("running_var"):
                    v.copy_(torch.rand(v.shape, generator=gen) + 0.5)
                else:
                    v.copy_(torch.randn(v.shape, generator=gen))
    ours = _build(c)
    ours.load_state_dict(theirs.state_dict())
    return ours, theirs


@pytest.mark.filterwarnings("ignore:Implicit dimension choice for softmax")
@pytest.mark.parametrize("c, shape", list(_forward_cases()))
def test_forward_matches_torch(c, shape):
    torch = pytest.importorskip("torch")
    ours, theirs = _twins(c, torch)
    rng = np.random.default_rng(1)
    if c[0] == "Embedding":
        x = rng.integers(0, c[1][0], size=shape).astype(np.int64)
    else:
        x = rng.standard_normal(shape).astype(np.float32) * 2
    steps = 3 if c[0].startswith("BatchNorm") else 1      # running statistics evolve
    for mode in ("train", "eval"):
        getattr(ours, mode)()
        getattr(theirs, mode)()
        for _ in range(steps):
            with torch.no_grad():
                expect = theirs(torch.from_numpy(x))
            got = ours(mt.tensor(x))
            if isinstance(expect, tuple):             # MaxPool2d(return_indices=True)
                assert isinstance(got, tuple) and len(got) == len(expect)
                expect = tuple(e.numpy() for e in expect)
            else:
                got, expect = (got,), (expect.numpy(),)
            for g, e in zip(got, expect):
                assert g.shape == e.shape and g.dtype == e.dtype
                np.testing.assert_allclose(g.numpy(), e, rtol=1e-4, atol=2e-5)
    for k, v in theirs.state_dict().items():             # running stats, num_batches_tracked
        np.testing.assert_allclose(ours.state_dict()[k].numpy(), v.numpy(), rtol=1e-5,
                                   atol=1e-6, err_msg=k)


def test_batch_norm_momentum_is_pytorchs():
    bn = M.BatchNorm1d(2, momentum=0.25)
    x = np.array([[1.0, 10.0], [3.0, 20.0], [5.0, 30.0]], np.float32)
    bn(mt.tensor(x))
    mean, var = x.mean(0), x.var(0, ddof=1)
    np.testing.assert_allclose(bn.running_mean.numpy(), 0.25 * mean, rtol=1e-6)
    np.testing.assert_allclose(bn.running_var.numpy(), 0.75 + 0.25 * var, rtol=1e-6)
    assert bn.num_batches_tracked.item() == 1 and bn.num_batches_tracked.dtype == np.int64
    bn.eval()
    y = bn(mt.tensor(x)).numpy()
    expect = (x - bn.running_mean.numpy()) / np.sqrt(bn.running_var.numpy() + 1e-5)
    np.testing.assert_allclose(y, expect, rtol=1e-5, atol=1e-6)
    assert bn.num_batches_tracked.item() == 1             # eval leaves the buffers alone
    with pytest.raises(ValueError, match="expected 2D or 3D input, got 4D"):
        bn(mt.tensor(np.zeros((1, 2, 1, 1), np.float32)))


def test_dropout_train_and_eval():
    d = M.Dropout(0.25)
    x = mt.tensor(np.ones((200, 100), np.float32))
    R.seed(0)
    y = d(x).numpy()
    kept = y != 0
    assert abs(kept.mean() - 0.75) < 0.02
    np.testing.assert_allclose(y[kept], 1 / 0.75, rtol=1e-6)
    R.seed(0)
    np.testing.assert_array_equal(d(x).numpy(), y)       # reproducible
    d.eval()
    np.testing.assert_array_equal(d(x).numpy(), x.numpy())


def test_simple_forwards_against_numpy():
    x = np.linspace(-8, 8, 33, dtype=np.float32)
    t = mt.tensor(x)
    np.testing.assert_allclose(M.ReLU()(t).numpy(), np.maximum(x, 0))
    np.testing.assert_allclose(M.ReLU6()(t).numpy(), np.clip(x, 0, 6))
    np.testing.assert_allclose(M.Hardsigmoid()(t).numpy(), np.clip(x + 3, 0, 6) / 6, atol=1e-7)
    np.testing.assert_allclose(M.Hardswish()(t).numpy(), x * np.clip(x + 3, 0, 6) / 6,
                               rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(M.Sigmoid()(t).numpy(), 1 / (1 + np.exp(-x)), rtol=1e-6)
    np.testing.assert_allclose(M.Tanh()(t).numpy(), np.tanh(x), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(M.SiLU()(t).numpy(), x / (1 + np.exp(-x)), rtol=1e-5, atol=1e-6)
    assert M.Identity()(t) is t
    lin = M.Linear(33, 2)
    np.testing.assert_allclose(lin(t).numpy(),
                               x @ lin.weight.numpy().T + lin.bias.numpy(), rtol=1e-5, atol=1e-6)
    sm = M.Softmax(dim=0)(t).numpy()
    np.testing.assert_allclose(sm, np.exp(x) / np.exp(x).sum(), rtol=1e-5, atol=1e-8)
    assert M.Flatten()(mt.tensor(np.zeros((2, 3, 4), np.float32))).shape == (2, 12)


# ------------------------------------------------------------------ initialisation

def _uniform_ok(values, bound):
    v = values.ravel()
    assert np.all(np.abs(v) <= bound * (1 + 1e-6))
    assert np.abs(v).max() > 0.98 * bound                   # reaches the bound
    assert abs(v.mean()) < 0.05 * bound
    assert abs(v.std() - bound / math.sqrt(3)) < 0.03 * bound


def test_linear_and_conv_init_bounds():
    R.seed(1)
    lin = M.Linear(400, 300)
    _uniform_ok(lin.weight.numpy(), 1 / math.sqrt(400))
    b = lin.bias.numpy()
    assert np.all(np.abs(b) <= 1 / math.sqrt(400)) and abs(b).max() > 0.9 / math.sqrt(400)
    conv = M.Conv2d(8, 64, 3, groups=2)                     # fan_in = 8/2 * 9
    _uniform_ok(conv.weight.numpy(), 1 / math.sqrt(36))
    assert np.all(np.abs(conv.bias.numpy()) <= 1 / 6)
    tconv = M.ConvTranspose2d(64, 16, 3, groups=2)          # weight [64, 8, 3, 3]: fan_in 72
    assert tconv.weight.shape == (64, 8, 3, 3)
    _uniform_ok(tconv.weight.numpy(), 1 / math.sqrt(72))
    c1 = M.Conv1d(10, 200, 5)
    _uniform_ok(c1.weight.numpy(), 1 / math.sqrt(50))


def test_init_fans_match_torch():
    torch = pytest.importorskip("torch")
    for shape in [(3, 4), (8, 4, 3, 3), (4, 2, 5), (16, 8, 1, 1)]:
        assert M.init.calculate_fan_in_and_fan_out(mt.tensor(np.zeros(shape, np.float32))) == \
            torch.nn.init._calculate_fan_in_and_fan_out(torch.zeros(shape))
    for nl, p in [("relu", None), ("tanh", None), ("leaky_relu", 0.2), ("linear", None),
                  ("selu", None), ("conv2d", None)]:
        assert M.init.calculate_gain(nl, p) == pytest.approx(torch.nn.init.calculate_gain(nl, p))
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        M.init.calculate_fan_in_and_fan_out(mt.tensor([1.0]))
    with pytest.raises(ValueError, match="unsupported nonlinearity"):
        M.init.calculate_gain("swoosh")


def test_other_initialisers():
    R.seed(2)
    t = mt.tensor(np.zeros((300, 200), np.float32))
    M.init.xavier_uniform_(t)
    _uniform_ok(t.numpy(), math.sqrt(6 / 500))
    M.init.kaiming_normal_(t, nonlinearity="relu")
    assert abs(t.numpy().std() - math.sqrt(2 / 200)) < 0.02 * math.sqrt(2 / 200)
    M.init.xavier_normal_(t, gain=2.0)
    assert abs(t.numpy().std() - 2 * math.sqrt(2 / 500)) < 0.02 * 2 * math.sqrt(2 / 500)
    M.init.trunc_normal_(t, std=1.0, a=-1.0, b=1.5)
    assert t.numpy().min() >= -1.0 and t.numpy().max() <= 1.5
    M.init.constant_(t, 0.5)
    assert np.all(t.numpy() == 0.5)
    d = mt.tensor(np.zeros(10, np.float64))
    M.init.uniform_(d, -1, 1)
    assert d.dtype == np.float64 and np.all(np.abs(d.numpy()) < 1)


def test_embedding_and_norm_init():
    R.seed(3)
    e = M.Embedding(1000, 64, padding_idx=3)
    w = e.weight.numpy()
    assert not w[3].any()
    assert abs(w.mean()) < 0.01 and abs(w.std() - 1) < 0.01
    for m in (M.BatchNorm2d(5), M.LayerNorm((2, 5)), M.GroupNorm(1, 5)):
        assert np.all(m.weight.numpy() == 1) and not m.bias.numpy().any()
    bn = M.BatchNorm1d(5)
    assert not bn.running_mean.numpy().any() and np.all(bn.running_var.numpy() == 1)
    assert bn.num_batches_tracked.shape == () and bn.num_batches_tracked.item() == 0


def test_init_is_reproducible_with_mgtrace_random_seed():
    R.seed(42)
    a = M.Conv2d(3, 4, 3).state_dict()
    R.seed(42)
    b = M.Conv2d(3, 4, 3).state_dict()
    c = M.Conv2d(3, 4, 3).state_dict()
    for k in a:
        np.testing.assert_array_equal(a[k].numpy(), b[k].numpy())
    assert not np.array_equal(a["weight"].numpy(), c["weight"].numpy())
