"""Writes prelu.tm/.pkl/.npz with MegEngine 1.13 (see make_files.py for the
venv): a conv followed by a per-channel PReLU (MegEngine stores its weight
as [1, C, 1, 1]) and a one-slope PReLU (weight [1]), slopes set away from
their init; traced at batch 2; outputs at batch 2 and 5."""
import os

import numpy as np

import megengine as mge
import megengine.module as M
import megengine.traced_module as tm

HERE = os.path.dirname(os.path.abspath(__file__))


class Net(M.Module):
    def __init__(self):
        super().__init__()
        self.conv = M.Conv2d(3, 4, 3, padding=1)
        self.act = M.PReLU(4, init=0.1)
        self.act1 = M.PReLU()

    def forward(self, x):
        return self.act1(self.act(self.conv(x)) - 0.2)


rng = np.random.RandomState(0)
net = Net()
net.act.weight[...] = mge.Tensor(np.array([0.05, 0.2, -0.3, 1.5], "float32").reshape(1, 4, 1, 1))
net.act1.weight[...] = mge.Tensor(np.array([0.7], "float32"))
net.eval()
x2 = rng.uniform(-1, 1, (2, 3, 5, 5)).astype("float32")
x5 = rng.uniform(-1, 1, (5, 3, 5, 5)).astype("float32")
traced = tm.trace_module(net, mge.Tensor(x2))
traced.eval()
mge.save(traced, os.path.join(HERE, "prelu.tm"))
mge.save(net.state_dict(), os.path.join(HERE, "prelu.pkl"))
np.savez(os.path.join(HERE, "prelu.npz"), x2=x2, x5=x5,
         y2=net(mge.Tensor(x2)).numpy(), y5=net(mge.Tensor(x5)).numpy())
