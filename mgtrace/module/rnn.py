"""Recurrent builtin modules: RNNCell, LSTMCell, RNN, LSTM (MegEngine's
names and constructor arguments; torch.nn's parameter names and layouts, so
PyTorch checkpoints load by key and the results equal torch.nn's).

The input's contribution to every step is one GEMM over the whole
sequence up front; each time step is then one fused core op
(``lstm_cell`` / ``rnn_cell``, kernels/cpu/rnn_cell.c): ``h @ weight_hh^T``
for all the gates in one GEMM, and the gate nonlinearities and state update
in one pass. A device without those kernels runs the same formula in core
ops (mgtrace._core.fallbacks).

MegEngine keeps RNN/LSTM weights in one flattened ``_flatten_weights``
parameter (its cuDNN layout); these keep torch.nn's ``weight_ih_l0``,
``weight_hh_l0``, ``bias_ih_l0``, ``bias_hh_l0`` (``_reverse`` for the
second direction, ``weight_hr_l0`` for LSTM projections) instead.
"""
import math

import numpy as np

import mgtrace.functional as F
from mgtrace._core import Tensor, args as A, nn as _nn, tensor as mt_tensor
from mgtrace.module import init
from mgtrace.module.builtin import _builtin, _empty_param
from mgtrace.module.module import Module, StateDictError

__all__ = ["RNNCell", "LSTMCell", "RNN", "LSTM"]

_NONLINEARITIES = ("tanh", "relu")


def _uniform_all(m, hidden_size):
    """torch.nn's and MegEngine's recurrent initialisation: every parameter
    U(-1/sqrt(hidden_size), 1/sqrt(hidden_size))."""
    bound = 1.0 / math.sqrt(hidden_size)
    for p in m.parameters():
        init.uniform_(p, -bound, bound)


def _nonlinearity(fn, v):
    if v not in _NONLINEARITIES:
        raise ValueError(f"{fn}: nonlinearity must be 'tanh' or 'relu', got {v!r}")
    return v


def _rows(*ts):
    """1-d states and gate shares (an unbatched cell) as one-row matrices."""
    return [t if t is None or t.ndim == 2 else t.reshape(1, -1) for t in ts]


def _rnn_step(x_part, h, w_hh, b_hh, nonlinearity):
    """act(x_part + h @ w_hh^T + b_hh): one fused step (the core's rnn_cell)."""
    xp, hh = _rows(x_part, h)
    y = _nn.rnn_cell(xp, hh, w_hh, b_hh, nonlinearity)
    return y if h.ndim == 2 else y.reshape(-1)


def _lstm_step(x_part, h, c, w_hh, b_hh, w_hr, hidden_size):
    """One fused step (the core's lstm_cell: the gates' GEMM, then one pass
    for torch.nn's i, f, g, o), then the projection h' @ w_hr^T if any."""
    xp, hh, cc = _rows(x_part, h, c)
    h2, c2 = _nn.lstm_cell(xp, hh, cc, w_hh, b_hh)
    if c.ndim == 1:
        h2, c2 = h2.reshape(-1), c2.reshape(-1)
    if w_hr is not None:
        h2 = F.matmul(h2, w_hr, transpose_b=True)
    return h2, c2


def _input_part(x, w_ih, b_ih):
    y = F.matmul(x, w_ih, transpose_b=True)
    return y if b_ih is None else F.add(y, b_ih)


class _CellBase(Module):
    _chunks = 1

    def __init__(self, input_size, hidden_size, bias):
        super().__init__()
        fn = type(self).__name__
        self.input_size = A.to_size(fn, "input_size", input_size, 1)
        self.hidden_size = A.to_size(fn, "hidden_size", hidden_size, 1)
        self.bias = A.to_bool(fn, "bias", bias)
        gates = self._chunks * self.hidden_size
        self.weight_ih = _empty_param((gates, self.input_size))
        self.weight_hh = _empty_param((gates, self.hidden_size))
        if self.bias:
            self.bias_ih = _empty_param((gates,))
            self.bias_hh = _empty_param((gates,))
        else:
            self.register_parameter("bias_ih", None)
            self.register_parameter("bias_hh", None)
        self.reset_parameters()

    def reset_parameters(self):
        _uniform_all(self, self.hidden_size)

    def _input(self, x):
        fn = type(self).__name__
        if x.ndim not in (1, 2) or x.shape[-1] != self.input_size:
            raise ValueError(f"{fn}: input must be [N, {self.input_size}] or "
                             f"[{self.input_size}], got shape {x.shape}")
        return x

    def _state(self, hx, x, name="hx"):
        fn = type(self).__name__
        want = x.shape[:-1] + (self.hidden_size,)
        if hx is None:
            return F.zeros(want, dtype=x.dtype, device=x.device)
        if hx.shape != want:
            raise ValueError(f"{fn}: {name} must have shape {want} for input of shape "
                             f"{x.shape}, got {hx.shape}")
        return hx

    def extra_repr(self):
        s = f"{self.input_size}, {self.hidden_size}"
        if not self.bias:
            s += ", bias=False"
        return s


@_builtin
class RNNCell(_CellBase):
    """One step of an Elman RNN (MegEngine's and torch.nn's RNNCell):
    ``h' = act(x @ weight_ih^T + bias_ih + h @ weight_hh^T + bias_hh)``.

    Args:
        input_size, hidden_size: sizes of x's and h's last axis.
        bias: learn bias_ih and bias_hh.
        nonlinearity: "tanh" or "relu".

    forward(input [N, input_size] or [input_size], hx [N, hidden_size] or
    None (zeros)) -> h' of hx's shape. Parameters ``weight_ih`` [H, I],
    ``weight_hh`` [H, H], ``bias_ih``, ``bias_hh`` [H], all
    U(-1/sqrt(H), 1/sqrt(H)).

    Raises:
        ValueError: an unknown nonlinearity; inputs of the wrong shape.
    """

    def __init__(self, input_size, hidden_size, bias=True, nonlinearity="tanh"):
        nonlinearity = _nonlinearity("RNNCell", nonlinearity)
        super().__init__(input_size, hidden_size, bias)
        self.nonlinearity = nonlinearity

    def config(self):
        return {"input_size": self.input_size, "hidden_size": self.hidden_size,
                "bias": self.bias, "nonlinearity": self.nonlinearity}

    def extra_repr(self):
        s = super().extra_repr()
        return s if self.nonlinearity == "tanh" else s + f", nonlinearity={self.nonlinearity}"

    def forward(self, input, hx=None):
        x = self._input(input)
        h = self._state(hx, x)
        return _rnn_step(_input_part(x, self.weight_ih, self.bias_ih), h, self.weight_hh,
                         self.bias_hh, self.nonlinearity)


@_builtin
class LSTMCell(_CellBase):
    """One step of an LSTM (MegEngine's and torch.nn's LSTMCell), the four
    gates (input, forget, cell, output; torch.nn's order) from one matmul
    each for x and h::

        i, f, g, o = split(x @ W_ih^T + b_ih + h @ W_hh^T + b_hh, 4)
        c' = sigmoid(f) * c + sigmoid(i) * tanh(g);  h' = sigmoid(o) * tanh(c')

    forward(input [N, I] or [I], hx (h, c) or None (zeros)) -> (h', c').
    Parameters ``weight_ih`` [4H, I], ``weight_hh`` [4H, H], ``bias_ih``,
    ``bias_hh`` [4H].

    Raises:
        ValueError: inputs or states of the wrong shape.
    """
    _chunks = 4

    def __init__(self, input_size, hidden_size, bias=True):
        super().__init__(input_size, hidden_size, bias)

    def config(self):
        return {"input_size": self.input_size, "hidden_size": self.hidden_size,
                "bias": self.bias}

    def forward(self, input, hx=None):
        x = self._input(input)
        if hx is None:
            h = c = self._state(None, x)
        else:
            if not isinstance(hx, (tuple, list)) or len(hx) != 2:
                raise ValueError("LSTMCell: hx must be a pair (h, c) or None")
            h, c = self._state(hx[0], x, "h"), self._state(hx[1], x, "c")
        return _lstm_step(_input_part(x, self.weight_ih, self.bias_ih), h, c, self.weight_hh,
                          self.bias_hh, None, self.hidden_size)


class _RNNBase(Module):
    _chunks = 1

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False,
                 dropout=0.0, bidirectional=False, proj_size=0):
        super().__init__()
        fn = type(self).__name__
        self.input_size = A.to_size(fn, "input_size", input_size, 1)
        self.hidden_size = A.to_size(fn, "hidden_size", hidden_size, 1)
        self.num_layers = A.to_size(fn, "num_layers", num_layers, 1)
        self.bias = A.to_bool(fn, "bias", bias)
        self.batch_first = A.to_bool(fn, "batch_first", batch_first)
        self.dropout = A.to_float(fn, "dropout", dropout)
        if not 0.0 <= self.dropout <= 1.0:
            raise ValueError(f"{fn}: dropout must be in [0, 1], got {self.dropout}")
        self.bidirectional = A.to_bool(fn, "bidirectional", bidirectional)
        self.proj_size = A.to_size(fn, "proj_size", proj_size, 0)
        if self.proj_size >= self.hidden_size:
            raise ValueError(f"{fn}: proj_size ({self.proj_size}) must be smaller than "
                             f"hidden_size ({self.hidden_size})")
        self.num_directions = 2 if self.bidirectional else 1
        gates = self._chunks * self.hidden_size
        out = self.proj_size or self.hidden_size
        for layer in range(self.num_layers):
            for sfx in self._suffixes(layer):
                width = self.input_size if layer == 0 else out * self.num_directions
                setattr(self, f"weight_ih{sfx}", _empty_param((gates, width)))
                setattr(self, f"weight_hh{sfx}", _empty_param((gates, out)))
                if self.bias:
                    setattr(self, f"bias_ih{sfx}", _empty_param((gates,)))
                    setattr(self, f"bias_hh{sfx}", _empty_param((gates,)))
                if self.proj_size:
                    setattr(self, f"weight_hr{sfx}", _empty_param((self.proj_size,
                                                                    self.hidden_size)))
        self.reset_parameters()

    def _suffixes(self, layer):
        return [f"_l{layer}"] + ([f"_l{layer}_reverse"] if self.bidirectional else [])

    def reset_parameters(self):
        _uniform_all(self, self.hidden_size)

    def _params(self, sfx):
        get = self._parameters.get
        return (get(f"weight_ih{sfx}"), get(f"weight_hh{sfx}"), get(f"bias_ih{sfx}"),
                get(f"bias_hh{sfx}"), get(f"weight_hr{sfx}"))

    def config(self):
        return {"input_size": self.input_size, "hidden_size": self.hidden_size,
                "num_layers": self.num_layers, "bias": self.bias,
                "batch_first": self.batch_first, "dropout": self.dropout,
                "bidirectional": self.bidirectional}

    def extra_repr(self):
        s = f"{self.input_size}, {self.hidden_size}"
        if self.proj_size:
            s += f", proj_size={self.proj_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if not self.bias:
            s += ", bias=False"
        if self.batch_first:
            s += ", batch_first=True"
        if self.dropout:
            s += f", dropout={self.dropout}"
        if self.bidirectional:
            s += ", bidirectional=True"
        return s

    def _sequence(self, input):
        fn = type(self).__name__
        if input.ndim != 3 or input.shape[2] != self.input_size:
            layout = "[N, T, I]" if self.batch_first else "[T, N, I]"
            raise ValueError(f"{fn}: input must be {layout} with I = {self.input_size}, got "
                             f"shape {input.shape}")
        return F.transpose(input, (1, 0, 2)) if self.batch_first else input

    def _initial(self, hx, x, size, name):
        fn = type(self).__name__
        want = (self.num_layers * self.num_directions, x.shape[1], size)
        if hx is None:
            return F.zeros(want, dtype=x.dtype, device=x.device)
        if hx.shape != want:
            raise ValueError(f"{fn}: {name} must have shape {want}, got {hx.shape}")
        return hx

    def _run(self, x, states, step):
        """Every layer and direction over the sequence x [T, N, *]; ``states``
        maps a (layer, direction) index to its initial state; ``step(x_part,
        state, params) -> (output, state)``. Returns (outputs [T, N, *],
        final states in index order)."""
        t = x.shape[0]
        finals = []
        for layer in range(self.num_layers):
            outs = []
            for d, sfx in enumerate(self._suffixes(layer)):
                w_ih, w_hh, b_ih, b_hh, w_hr = p = self._params(sfx)
                xp = _input_part(x, w_ih, b_ih)         # the input's share of every step: one GEMM
                state = states(layer * self.num_directions + d)
                ys = [None] * t
                for i in (range(t - 1, -1, -1) if d else range(t)):
                    y, state = step(xp[i], state, p)
                    ys[i] = y
                outs.append(F.stack(ys, 0) if t else F.zeros(
                    (0, x.shape[1], (self.proj_size or self.hidden_size)), dtype=x.dtype,
                    device=x.device))
                finals.append(state)
            x = outs[0] if len(outs) == 1 else F.concat(outs, axis=2)
            if self.dropout and self.training and layer < self.num_layers - 1:
                x = F.dropout(x, self.dropout, True)
        return x, finals

    def _output(self, y):
        return F.transpose(y, (1, 0, 2)) if self.batch_first else y

    # MegEngine's layout (state_dict / load_state_dict with layout="megengine").
    # MegEngine 1.13's RNN and LSTM compute with one parameter, _flatten_weights
    # [gates * hidden, sum of (input width + hidden) + 2 * layers * directions
    # with bias], whose memory holds, for each layer and direction in order,
    # weight_ih [G, width], weight_hh [G, hidden], then bias_ih [G], bias_hh
    # [G] (megdnn reads it so: checked against MegEngine 1.13's outputs). Its
    # cells.<layer>.<direction>.* parameters are not read by its forward.

    def _megengine_cells(self):
        """[(suffix, layer, direction, width)] in _flatten_weights' order."""
        out = self.proj_size or self.hidden_size
        return [(sfx, layer, d, self.input_size if layer == 0 else out * self.num_directions)
                for layer in range(self.num_layers) for d, sfx in enumerate(self._suffixes(layer))]

    def _from_megengine_state(self, state, prefix):
        """``state`` with MegEngine's ``_flatten_weights`` (and its unused
        ``cells.*``) under ``prefix`` turned into this module's keys; a state
        without ``_flatten_weights`` is returned as it is.

        Raises:
            StateDictError (a ValueError): _flatten_weights of another size,
                or a proj_size module (MegEngine has none)."""
        key = prefix + "_flatten_weights"
        if key not in state:
            return state
        fn = type(self).__name__
        if self.proj_size:
            raise StateDictError(f"{fn}: MegEngine's layout has no proj_size; {key} cannot load")
        raw = np.asarray(state[key].numpy() if isinstance(state[key], Tensor) else state[key])
        g, h = self._chunks * self.hidden_size, self.hidden_size
        sizes = [g * w + g * h + (2 * g if self.bias else 0) for _, _, _, w in self._megengine_cells()]
        if raw.size != sum(sizes):
            raise StateDictError(f"{fn}: {key} holds {raw.size} values, this module's weights "
                                 f"{sum(sizes)} (shape {tuple(raw.shape)})")
        out = {k: v for k, v in state.items()
               if k != key and not k.startswith(prefix + "cells.")}
        raw, off = raw.reshape(-1), 0
        for sfx, _, _, w in self._megengine_cells():
            parts = [("weight_ih", (g, w)), ("weight_hh", (g, h))]
            parts += [("bias_ih", (g,)), ("bias_hh", (g,))] if self.bias else []
            for name, shape in parts:
                n = int(np.prod(shape))
                out[f"{prefix}{name}{sfx}"] = raw[off:off + n].reshape(shape).copy()
                off += n
        return out

    def _to_megengine_state(self, state, prefix):
        """``state`` (this module's keys under ``prefix``) in MegEngine's
        names: ``_flatten_weights`` and ``cells.<layer>.<direction>.*`` (the
        same values: MegEngine's strict load wants them); new arrays."""
        if self.proj_size:
            raise ValueError(f"{type(self).__name__}: MegEngine's layout has no proj_size")
        g = self._chunks * self.hidden_size
        out, raw = dict(state), []
        for sfx, layer, d, _ in self._megengine_cells():
            names = ["weight_ih", "weight_hh"] + (["bias_ih", "bias_hh"] if self.bias else [])
            for name in names:
                v = out.pop(f"{prefix}{name}{sfx}").numpy()
                raw.append(v.reshape(-1))
                out[f"{prefix}cells.{layer}.{d}.{name}"] = mt_tensor(v)
            if not self.bias:           # MegEngine's cells keep biases even with bias=False
                for name in ("bias_ih", "bias_hh"):
                    out[f"{prefix}cells.{layer}.{d}.{name}"] = mt_tensor(np.zeros(g, np.float32))
        flat = np.concatenate(raw)
        out[prefix + "_flatten_weights"] = mt_tensor(flat.reshape(g, flat.size // g))
        return out


@_builtin
class RNN(_RNNBase):
    """A multi-layer Elman RNN over a sequence (MegEngine's RNN; torch.nn.RNN's
    parameters and results).

    Args:
        input_size, hidden_size: I and H.
        num_layers: stacked layers (each reads the previous one's outputs).
        bias: learn bias_ih and bias_hh.
        batch_first: input and output [N, T, *] instead of [T, N, *].
        dropout: dropout on the outputs of every layer but the last, in
            training.
        bidirectional: a second direction over the reversed sequence,
            outputs concatenated.
        nonlinearity: "tanh" or "relu" (keyword, as MegEngine's).

    forward(input [T, N, I], hx [layers * directions, N, H] or None (zeros))
    -> (output [T, N, directions * H], h_n [layers * directions, N, H]).
    Parameters per layer k (``_reverse`` for the second direction):
    ``weight_ih_lk`` [H, I or directions * H], ``weight_hh_lk`` [H, H],
    ``bias_ih_lk``, ``bias_hh_lk`` [H].

    Raises:
        ValueError: bad sizes, dropout outside [0, 1], an unknown
            nonlinearity; inputs or states of the wrong shape.
    """

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False,
                 dropout=0.0, bidirectional=False, *, nonlinearity="tanh"):
        nonlinearity = _nonlinearity("RNN", nonlinearity)
        super().__init__(input_size, hidden_size, num_layers, bias, batch_first, dropout,
                         bidirectional)
        self.nonlinearity = nonlinearity

    def config(self):
        return {**super().config(), "nonlinearity": self.nonlinearity}

    def extra_repr(self):
        s = super().extra_repr()
        return s if self.nonlinearity == "tanh" else s + f", nonlinearity={self.nonlinearity}"

    def forward(self, input, hx=None):
        x = self._sequence(input)
        h0 = self._initial(hx, x, self.hidden_size, "hx")

        def step(xp, h, p):
            h = _rnn_step(xp, h, p[1], p[3], self.nonlinearity)
            return h, h

        y, finals = self._run(x, lambda i: h0[i], step)
        return self._output(y), F.stack(finals, 0)


@_builtin
class LSTM(_RNNBase):
    """A multi-layer LSTM over a sequence (MegEngine's LSTM; torch.nn.LSTM's
    parameters and results), each step as :class:`LSTMCell`.

    Args: as :class:`RNN` (no nonlinearity), and ``proj_size``: project h to
    this size with ``weight_hr_lk`` [proj_size, H] (0: none, as torch.nn).

    forward(input [T, N, I], hx (h_0 [layers * directions, N, P], c_0
    [layers * directions, N, H]) or None) -> (output [T, N, directions * P],
    (h_n, c_n)), P = proj_size or H. Parameters as RNN's with 4H gate rows
    (input, forget, cell, output).

    Raises:
        ValueError: as RNN; proj_size not below hidden_size.
    """
    _chunks = 4

    def config(self):
        return {**super().config(), "proj_size": self.proj_size}

    def forward(self, input, hx=None):
        x = self._sequence(input)
        if hx is not None and (not isinstance(hx, (tuple, list)) or len(hx) != 2):
            raise ValueError("LSTM: hx must be a pair (h_0, c_0) or None")
        h0 = self._initial(None if hx is None else hx[0], x, self.proj_size or self.hidden_size,
                           "h_0")
        c0 = self._initial(None if hx is None else hx[1], x, self.hidden_size, "c_0")

        def step(xp, state, p):
            h, c = _lstm_step(xp, state[0], state[1], p[1], p[3], p[4], self.hidden_size)
            return h, (h, c)

        y, finals = self._run(x, lambda i: (h0[i], c0[i]), step)
        return self._output(y), (F.stack([f[0] for f in finals], 0),
                                 F.stack([f[1] for f in finals], 0))
