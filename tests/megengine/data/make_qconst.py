"""Writes qconst.tm/.npz with MegEngine 1.13 (see make_files.py for the
venv): quantized dtypes as graph constants, the way a hand-written
quantization step traces: ``astype`` to qint8 and quint8 dtypes (a dtype
argument of the call) and back to float32, and a qint8 tensor made in
forward (a Constant of the graph), traced at batch 2."""
import os

import numpy as np

import megengine as mge
import megengine.module as M
import megengine.traced_module as tm
from megengine.core.tensor.dtype import qint8, quint8

HERE = os.path.dirname(os.path.abspath(__file__))


class Net(M.Module):
    def forward(self, x):
        a = x.astype(qint8(0.05)).astype("float32")
        b = x.astype(quint8(0.02, 128)).astype("float32")
        c = mge.tensor(np.array([3, -7, 12, 0], dtype=qint8(0.25))).astype("float32")
        return a * 2 + b + c


rng = np.random.RandomState(0)
net = Net()
net.eval()
# inputs away from the rounding ties of either scale (MegEngine rounds half away from
# zero, mgtrace half to even)
x2 = (rng.randint(-60, 60, (2, 4)) * 0.05 + 0.013).astype("float32")
x5 = (rng.randint(-60, 60, (5, 4)) * 0.05 + 0.013).astype("float32")
traced = tm.trace_module(net, mge.Tensor(x2))
traced.eval()
mge.save(traced, os.path.join(HERE, "qconst.tm"))
np.savez(os.path.join(HERE, "qconst.npz"), x2=x2, x5=x5,
         y2=net(mge.Tensor(x2)).numpy(), y5=net(mge.Tensor(x5)).numpy())
