"""Writes megengine_rnn.npz with MegEngine 1.13 itself (run it with a Python
that has megengine==1.13, e.g. /work/venvs/mge310/bin/python):

    python tests/module/data/make_megengine_rnn.py

For each case: MegEngine's RNN/LSTM with random ``_flatten_weights`` (the
one parameter its forward reads), an input, MegEngine's output and final
hidden state, and the names of its state dict. tests/module/test_rnn_megengine_layout.py
loads the weights into mgtrace's modules (layout="megengine") and compares.
"""
import os

import numpy as np
import megengine as mge
import megengine.module as M

CASES = {
    "lstm_2layer_bidir": (M.LSTM, dict(num_layers=2, bidirectional=True)),
    "rnn_2layer_relu_nobias": (M.RNN, dict(num_layers=2, bias=False, nonlinearity="relu")),
    "lstm_batch_first": (M.LSTM, dict(num_layers=1, batch_first=True)),
    "rnn_tanh_bidir": (M.RNN, dict(num_layers=1, bidirectional=True)),
}


def main():
    rng = np.random.default_rng(38)
    out = {}
    for name, (cls, kw) in CASES.items():
        m = cls(5, 3, **kw)
        fw = (0.5 * rng.standard_normal(m._flatten_weights.shape)).astype(np.float32)
        m._flatten_weights._reset(mge.tensor(fw))
        x = rng.standard_normal((4, 2, 5)).astype(np.float32)
        y, h = m(mge.tensor(x))
        h = h[0] if isinstance(h, tuple) else h
        out[f"{name}/flatten_weights"] = fw
        out[f"{name}/x"] = x
        out[f"{name}/y"] = y.numpy()
        out[f"{name}/h"] = h.numpy()
        out[f"{name}/keys"] = np.array(sorted(m.state_dict()))
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "megengine_rnn.npz")
    np.savez(path, **out)


if __name__ == "__main__":
    main()
