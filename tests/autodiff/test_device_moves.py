"""Gradients through Tensor.to(device): a move is recorded (no core op
makes it), and the gradient moves back to the source tensor's device."""
import numpy as np

import mgtrace as mt
from mgtrace.autodiff import GradManager


def test_gradient_flows_back_through_a_move_to_another_device():
    xv = np.arange(6, dtype=np.float32).reshape(2, 3) - 2
    x = mt.tensor(xv)
    gm = GradManager().attach([x])
    with gm:
        y = x.to("cpu:1")
        assert str(y.device) == "cpu:1"
        loss = (y * y).sum() + (x * 3).to("cpu:1").sum()
        gm.backward(loss)
    # d/dx (x^2 + 3x) = 2x + 3, on x's own device
    assert str(x.grad.device) == "cpu:0"
    np.testing.assert_array_equal(x.grad.numpy(), 2 * xv + 3)


def test_a_move_to_the_same_device_is_the_tensor_itself():
    x = mt.tensor(np.ones(3, np.float32))
    gm = GradManager().attach([x])
    with gm:
        y = x.to("cpu:0")
        assert y is x
        gm.backward((y * 5).sum())
    np.testing.assert_array_equal(x.grad.numpy(), np.full(3, 5, np.float32))
