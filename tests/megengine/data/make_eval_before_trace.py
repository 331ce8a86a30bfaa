"""Writes eval_before_trace.tm/.npz with MegEngine 1.13 (see make_files.py for
the venv): a model put in eval mode and then traced, the common way. MegEngine's
trace_module gives the top TracedModule training=True while its BatchNorm and
Dropout stay in eval mode; the file is saved as trace_module returned it."""
import os

import numpy as np

import megengine as mge
import megengine.module as M
import megengine.traced_module as tm

HERE = os.path.dirname(os.path.abspath(__file__))


class Net(M.Module):
    def __init__(self):
        super().__init__()
        self.fc = M.Linear(3, 4)
        self.bn = M.BatchNorm1d(4)
        self.drop = M.Dropout(0.5)

    def forward(self, x):
        return self.drop(self.bn(self.fc(x)))


rng = np.random.RandomState(0)
net = Net()
shape = net.bn.running_mean.shape
net.bn.running_mean._reset(mge.Tensor(rng.uniform(-1, 1, shape).astype("float32")))
net.bn.running_var._reset(mge.Tensor(rng.uniform(0.5, 1.5, shape).astype("float32")))
net.eval()
x2 = rng.uniform(-1, 1, (2, 3)).astype("float32")
x5 = rng.uniform(-1, 1, (5, 3)).astype("float32")
traced = tm.trace_module(net, mge.Tensor(x2))
assert traced.training and not traced.bn.training
mge.save(traced, os.path.join(HERE, "eval_before_trace.tm"))
np.savez(os.path.join(HERE, "eval_before_trace.npz"), x2=x2, x5=x5,
         y2=net(mge.Tensor(x2)).numpy(), y5=net(mge.Tensor(x5)).numpy())
