"""Models shared by the tests and the golden archives' script
(schema/golden/1.2/make_golden.py), defined once so that the goldens are
made of the very calls the tests check. Importable as ``_models`` (pytest
puts tests/ on the path; make_golden.py puts it there itself)."""
import numpy as np

import mgtrace as mt
import mgtrace.functional as F

W6 = np.random.default_rng(0).standard_normal((1, 4 * 36 + 24)).astype(np.float32)


def _ones(*shape):
    return mt.tensor(np.ones(shape, np.float32))


#: the functions issue 36 added, each called once: name -> (the shapes of its
#: inputs after the batch axis, the call on them)
ISSUE36_FUNCTIONS = {
    "sinh": ([(3,)], lambda x: F.sinh(x)),
    "cosh": ([(3,)], lambda x: F.cosh(x)),
    "asinh": ([(3,)], lambda x: F.asinh(x)),
    "acosh": ([(3,)], lambda x: F.acosh(F.abs(x) + 1)),
    "atanh": ([(3,)], lambda x: F.atanh(F.tanh(x))),
    "logaddexp": ([(3,), (3,)], lambda x, y: F.logaddexp(x, y)),
    "left_shift": ([(3,)], lambda x: F.left_shift(x.astype("int32"), 2)),
    "right_shift": ([(3,)], lambda x: F.right_shift((x * 100).astype("int32"), 1)),
    "cross": ([(3,), (3,)], lambda x, y: F.cross(x, y)),
    "diag": ([(4,)], lambda x: F.diag(x[0], 1) + F.diag(x[:, :1].reshape(-1))[0, 0]),
    "meshgrid": ([(3,)], lambda x: F.meshgrid(x[0], x[:, 0])),
    "roll": ([(5,)], lambda x: F.roll(x, (1, -2), (0, 1))),
    "swapaxes": ([(2, 3)], lambda x: F.swapaxes(x, 0, 2)),
    "cond_take": ([(3,)], lambda x: F.cond_take(x > 0, x)),
    "non_zero": ([(3,)], lambda x: F.non_zero(x > 0)),
    "hswish": ([(3,)], lambda x: F.hswish(x)),
    "hsigmoid": ([(3,)], lambda x: F.hsigmoid(x)),
    "prelu": ([(3,)], lambda x: F.prelu(x, 0.3)),
    "logsigmoid": ([(3,)], lambda x: F.logsigmoid(x)),
    "logsumexp": ([(3, 2)], lambda x: F.logsumexp(x, (1, 2))),
    "logsoftmax": ([(3, 2)], lambda x: F.logsoftmax(x, (0, 2))),
    "indexing_one_hot": ([(4, 3)], lambda x: F.indexing_one_hot(
        x, F.argmax(x, 1).astype("int32"), 1)),
    "pixel_shuffle": ([(8, 2, 3)], lambda x: F.pixel_shuffle(x, 2)),
    "instance_norm": ([(3, 4, 5)], lambda x: F.instance_norm(x, False)),
    "general_norm": ([(3, 4, 5)], lambda x: F.general_norm(x, (1, 3), False)),
    "local_response_norm": ([(5, 2, 2)], lambda x: F.local_response_norm(x, 3, 1.0, 0.1, 0.75)),
    "sync_batch_norm": ([(3, 2, 2)], lambda x: F.sync_batch_norm(
        x, mt.tensor(np.zeros(3, np.float32)), _ones(3), eps_mode="max")),
    "einsum": ([(3, 4), (4, 2)], lambda x, y: F.einsum("bij,bjk->bik", x, y)),
    "conv3d": ([(2, 4, 4, 3)], lambda x: F.conv3d(x, _ones(3, 2, 2, 2, 2), padding=1)),
    "conv_transpose3d": ([(2, 3, 2, 2)], lambda x: F.conv_transpose3d(
        x, _ones(2, 3, 2, 2, 2), stride=2)),
    "local_conv2d": ([(2, 4, 4)], lambda x: F.local_conv2d(x, _ones(3, 3, 2, 2, 2, 5))),
    "sliding_window": ([(2, 5, 4)], lambda x: F.sliding_window(x, 2, 1, 2)),
    "sliding_window_transpose": ([(2, 2, 2, 2, 2)], lambda x: F.sliding_window_transpose(
        x, 4, 2, 0, 2)),
    "warp_affine": ([(5, 6, 2)], lambda x: F.warp_affine(x, mt.tensor(np.array(
        [[[1.0, 0.1, 0.5], [0.0, 0.9, -0.2]]], np.float32)).broadcast_to(
        (x.shape[0], 2, 3)), (3, 4))),
    "remap": ([(2, 4, 5), (3, 3, 2)], lambda x, m: F.remap(x, m * 3)),
    "deformable_conv2d": ([(2, 4, 4), (8, 3, 3), (4, 3, 3)], lambda x, o, m: F.deformable_conv2d(
        x, _ones(3, 2, 2, 2), o, m)),
    "region_restricted_conv": ([(2, 4, 4)], lambda x: F.region_restricted_conv(
        x, _ones(2, 1, 2, 2), (x[:, 0] > 0).astype("int32"),
        (x[:, 0, 1:, 1:] > 0).astype("int32"), groups=2)),
    "svd": ([(4, 3)], lambda x: F.svd(x)[1]),
    "deformable_psroi_pooling": ([(2, 5, 6)], lambda x: F.deformable_psroi_pooling(
        x, mt.tensor([[0.0, 1.0, 0.0, 4.0, 3.0]]), mt.tensor(np.full((1, 2, 2, 2), 0.5, np.float32)),
        False, 2, 2, 2, 2, 1.0)),
    "multi_head_attention": ([(4, 6)], lambda x: F.multi_head_attention(
        x, x, x, 6, 2, 0.0, 0.0, mt.tensor(W6), qbias=True, kbias=True, vbias=True, obias=True,
        is_causal=True, training=False)[0]),
}
