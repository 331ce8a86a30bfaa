"""Writes user_qat.tm/.npz with MegEngine 1.13 (see make_files.py for the
venv): a QAT model whose Linear is a user's subclass of MegEngine's QAT
Linear. MegEngine's trace goes into it (it is no builtin) and records its
module's ``_apply_fakequant_with_observer`` calls and the bias's fake
quantization as a raw ``FakeQuant`` op with constant scale and zero point.
``x``/``y``: an input at batch 2 and MegEngine's output."""
import os

import numpy as np

import megengine as mge
import megengine.module as M
import megengine.module.qat as QAT
import megengine.traced_module as tm
from megengine.quantization import ema_fakequant_qconfig, quantize_qat

HERE = os.path.dirname(os.path.abspath(__file__))


class MyQATLinear(QAT.Linear):
    def forward(self, x):
        return super().forward(x) * 2


class Net(M.Module):
    def __init__(self):
        super().__init__()
        self.quant = M.QuantStub()
        self.fc = M.Linear(6, 4)
        self.dequant = M.DequantStub()

    def forward(self, x):
        return self.dequant(self.fc(self.quant(x)))


np.random.seed(0)
mge.random.seed(0)
net = quantize_qat(Net(), qconfig=ema_fakequant_qconfig)
net.fc = MyQATLinear.from_float_module(M.Linear(6, 4))
net.fc.set_qconfig(ema_fakequant_qconfig)
rng = np.random.RandomState(0)
net.train()
for _ in range(3):
    net(mge.Tensor(rng.uniform(-1, 1, (4, 6)).astype("float32")))
net.eval()
x = rng.uniform(-1, 1, (2, 6)).astype("float32")
traced = tm.trace_module(net, mge.Tensor(x))
traced.eval()
mge.save(traced, os.path.join(HERE, "user_qat.tm"))
np.savez(os.path.join(HERE, "user_qat.npz"), x=x, y=net(mge.Tensor(x)).numpy())
