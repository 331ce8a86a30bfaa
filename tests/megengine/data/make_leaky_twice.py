"""Writes leaky_twice.tm/.npz with MegEngine 1.13 (see make_files.py for the
venv): LeakyReLU(0.1) and a Linear each called twice, and a symbolic reshape,
traced at batch 2; outputs at batch 2 and 5."""
import os

import numpy as np

import megengine as mge
import megengine.module as M
import megengine.traced_module as tm

HERE = os.path.dirname(os.path.abspath(__file__))


class Net(M.Module):
    def __init__(self):
        super().__init__()
        self.fc = M.Linear(4, 4)
        self.act = M.LeakyReLU(0.1)

    def forward(self, x):
        y = self.act(self.fc(self.act(self.fc(x))))
        return y + x.reshape(x.shape[0], -1).mean(axis=1, keepdims=True)


rng = np.random.RandomState(0)
net = Net()
net.eval()
x2 = rng.uniform(-1, 1, (2, 4)).astype("float32")
x5 = rng.uniform(-1, 1, (5, 4)).astype("float32")
traced = tm.trace_module(net, mge.Tensor(x2))
traced.eval()
mge.save(traced, os.path.join(HERE, "leaky_twice.tm"))
np.savez(os.path.join(HERE, "leaky_twice.npz"), x2=x2, x5=x5,
         y2=net(mge.Tensor(x2)).numpy(), y5=net(mge.Tensor(x5)).numpy())
