"""Quantized BatchMatMulActivation (MegEngine's
``module/quantized/batch_matmul_activation.py``).

There is no int8 batched-matmul kernel: the integer accumulator
``W_q @ (x_q - x_zp)`` is computed exactly in int64 (NumPy's integer
matmul), the int32 bias added and the result requantized by the int8
kernels' rule (:mod:`mgtrace.module.quantized.exact`): bitwise an integer
implementation's.

Departure from MegEngine 1.13: its quantized version adds the bias per
output feature (axis 1) while its float and QAT versions add it along the
last axis; mgtrace keeps the float module's rule (the last axis), so that
:func:`~mgtrace.quantization.quantize` does not change what the model
computes.
"""
import numpy as np

from mgtrace._core import tensor as _tensor
from mgtrace.module.quantized.exact import bias_int32, requantize
from mgtrace.module.quantized.modules import _Weighted, _act, _act_qparams, _input
from mgtrace.quantization.utils import QuantizationError

__all__ = ["BatchMatMulActivation"]


class BatchMatMulActivation(_Weighted):
    """Int8 ``act(matmul(weight, x) + bias)``: QuantizedTensor (qint8 or
    quint8, per tensor) [batch, in_features, K] -> QuantizedTensor [batch,
    out_features, K] of ``act_qparams`` (float32 when it is None); ``bias``
    is added along the last axis (so K is out_features, or 1), as the float
    module adds it.

    Buffers: ``weight`` int8 [batch, out_features, in_features],
    ``weight_scale`` float32 scalar (per tensor), ``bias`` float32
    [out_features] or None. ``nonlinear_mode`` "identity" or "relu" (fused
    into the saturation).

    Raises QuantizationError for another nonlinear_mode, an input of
    another shape (or, with a bias, K other than out_features or 1), or
    (``from_qat_module``) per-channel weight qparams.
    """

    def __init__(self, batch, in_features, out_features, bias=True, nonlinear_mode="identity",
                 act_qparams=None):
        super().__init__()
        mode = str(nonlinear_mode).lower()
        if mode not in ("identity", "relu"):
            raise QuantizationError(f"BatchMatMulActivation: nonlinear_mode must be 'identity' "
                                    f"or 'relu', got {nonlinear_mode!r}")
        self.batch, self.in_features = int(batch), int(in_features)
        self.out_features, self.nonlinear_mode = int(out_features), mode
        self.weight = _tensor(np.zeros((self.batch, self.out_features, self.in_features),
                                       np.int8))
        self.weight_scale = _tensor(np.ones((), np.float32))
        self.bias = _tensor(np.zeros(self.out_features, np.float32)) if bias else None
        self.act_qparams = _act(act_qparams)
        self.__dict__["_packed"] = None

    @property
    def relu(self):
        return self.nonlinear_mode == "relu"

    def config(self):
        return {"batch": self.batch, "in_features": self.in_features,
                "out_features": self.out_features, "bias": self.bias is not None,
                "nonlinear_mode": self.nonlinear_mode,
                "act_qparams": self._weight_config()["act_qparams"]}

    def forward(self, x):
        data, s, zp, _ = _input(x, type(self).__name__)
        if data.ndim != 3 or data.shape[:2] != (self.batch, self.in_features):
            raise QuantizationError(f"BatchMatMulActivation takes [{self.batch}, "
                                    f"{self.in_features}, K], got {tuple(data.shape)}")
        if self.bias is not None and data.shape[2] not in (self.out_features, 1):
            # NumPy's broadcast error otherwise (the bias runs along K)
            raise QuantizationError(f"BatchMatMulActivation adds its [{self.out_features}] bias "
                                    f"along the last axis (as the float module), so K must be "
                                    f"{self.out_features} or 1, got {tuple(data.shape)}")
        w = np.asarray(self.weight.numpy()).astype(np.int64)
        acc = np.matmul(w, data.astype(np.int64) - zp)
        ws = np.asarray(self.weight_scale.numpy(), np.float32)
        if self.bias is not None:
            acc = acc + bias_int32(self.bias.numpy(), s, ws)
        o_s, o_zp, o_dt = self.out_args
        holder, alloc = self._new_output()
        requantize(acc, s, ws, o_s, o_zp, o_dt, self.relu, alloc)
        return holder[0]

    @classmethod
    def from_qat_module(cls, qat):
        q = qat.get_weight_qparams()
        if q is not None and np.ndim(q.scale.numpy()):
            raise QuantizationError("quantized BatchMatMulActivation takes a per-tensor weight "
                                    "scale (a per-tensor weight observer)")
        m = cls(qat.batch, qat.in_features, qat.out_features, qat.bias is not None,
                qat.nonlinear_mode)
        m._setup(qat.weight, q, qat.bias, _act_qparams(qat, False))
        return m
