"""Writes stubs.tm/.npz with MegEngine 1.13 (see make_files.py for the
venv): a float model written MegEngine's way for quantization, a QuantStub
before a conv and a DequantStub after its ReLU, traced at batch 2."""
import os

import numpy as np

import megengine as mge
import megengine.module as M
import megengine.traced_module as tm

HERE = os.path.dirname(os.path.abspath(__file__))


class Net(M.Module):
    def __init__(self):
        super().__init__()
        self.quant = M.QuantStub()
        self.conv = M.ConvRelu2d(3, 4, 3, padding=1)
        self.dequant = M.DequantStub()

    def forward(self, x):
        return self.dequant(self.conv(self.quant(x)))


rng = np.random.RandomState(0)
net = Net()
net.eval()
x2 = rng.uniform(-1, 1, (2, 3, 5, 5)).astype("float32")
traced = tm.trace_module(net, mge.Tensor(x2))
traced.eval()
mge.save(traced, os.path.join(HERE, "stubs.tm"))
np.savez(os.path.join(HERE, "stubs.npz"), x2=x2, y2=net(mge.Tensor(x2)).numpy())
