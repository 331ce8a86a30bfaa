"""Coverage of MegEngine 1.13's functional API (issue 36): every public name
of ``megengine.functional`` a model uses exists in ``mgtrace.functional``.

The lists are MegEngine's own, copied here as data: the ``__all__`` of
megengine/functional/elemwise.py, math.py, tensor.py and nn.py, plus
``einsum`` (functional/__init__.py imports it from einsum.py), as its
sources have them after the 1.13.0 release (the 1.13.0 wheel itself lacks
cross, erf, non_zero and einsum). ``normalize`` is in both math's and nn's
lists, so the union has 153 names.

``NOT_YET`` names the ones mgtrace lacks today, each with the reason; the
test fails when a name outside it is missing, and when a name in it has
arrived (so the list only shrinks). The count is printed (``pytest -s``).
"""
import mgtrace.functional as F

ELEMWISE = """
abs add acos asin atan atan2 asinh acosh atanh ceil clip cos cosh div equal erf exp expm1
floor floor_div greater greater_equal left_shift less less_equal log log1p logical_and
logical_not logical_or logical_xor logaddexp maximum minimum mod mul neg not_equal pow
right_shift round sin sinh sqrt square sub tan tanh
""".split()
MATH = """
argmax argmin argsort cross dot isinf isnan matinv matmul max mean min norm normalize prod
sign sort std sum svd topk var
""".split()
TENSOR = """
arange broadcast_to concat cond_take non_zero copy cumsum diag expand_dims eye flatten full
full_like gather imag linspace meshgrid ones ones_like polar repeat reshape roll scatter split
squeeze stack swapaxes tile transpose complex real where zeros zeros_like
""".split()
NN = """
adaptive_avg_pool2d adaptive_max_pool2d avg_pool2d batch_norm conv1d conv2d conv3d
conv_transpose2d conv_transpose3d deformable_conv2d deformable_psroi_pooling dropout embedding
gelu general_norm group_norm hsigmoid instance_norm hswish indexing_one_hot layer_norm
leaky_relu linear local_conv2d local_response_norm logsigmoid logsumexp logsoftmax max_pool2d
normalize one_hot prelu pad relu relu6 remap sigmoid sliding_window sliding_window_transpose
silu softmax softplus sync_batch_norm warp_affine warp_perspective pixel_shuffle
region_restricted_conv multi_head_attention
""".split()
MEGENGINE_FUNCTIONAL = sorted(set(ELEMWISE + MATH + TENSOR + NN + ["einsum"]))

# name -> why mgtrace lacks it (today)
NOT_YET = {}


def test_the_lists_are_megengine_1_13s():
    assert (len(ELEMWISE), len(MATH), len(TENSOR), len(NN)) == (48, 22, 35, 48)
    assert len(MEGENGINE_FUNCTIONAL) == 153


def test_every_megengine_functional_name_exists():
    have = [n for n in MEGENGINE_FUNCTIONAL if callable(getattr(F, n, None))]
    missing = [n for n in MEGENGINE_FUNCTIONAL if n not in have]
    print(f"\nmgtrace.functional has {len(have)}/{len(MEGENGINE_FUNCTIONAL)} of MegEngine 1.13's "
          f"functional names; missing: {', '.join(missing) or 'none'}")
    assert sorted(set(missing) - set(NOT_YET)) == [], "names lost"
    assert sorted(set(NOT_YET) - set(missing)) == [], "arrived: take them out of NOT_YET"
    assert all(n in F.__all__ for n in have)
