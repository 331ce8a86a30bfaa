"""RNN and LSTM load MegEngine's checkpoints: MegEngine 1.13 computes with
one flattened parameter, ``_flatten_weights`` (its ``cells.*`` parameters
are not read by its forward); ``load_state_dict(..., layout="megengine")``
splits it into mgtrace's (torch's) names, and ``state_dict(layout=
"megengine")`` writes it back. Reference: MegEngine 1.13's own outputs
(data/make_megengine_rnn.py wrote data/megengine_rnn.npz)."""
import os

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.module as M
from mgtrace.module import StateDictError

DATA = np.load(os.path.join(os.path.dirname(__file__), "data", "megengine_rnn.npz"))
CASES = {
    "lstm_2layer_bidir": lambda: M.LSTM(5, 3, num_layers=2, bidirectional=True),
    "rnn_2layer_relu_nobias": lambda: M.RNN(5, 3, num_layers=2, bias=False,
                                            nonlinearity="relu"),
    "lstm_batch_first": lambda: M.LSTM(5, 3, batch_first=True),
    "rnn_tanh_bidir": lambda: M.RNN(5, 3, bidirectional=True),
}


def _megengine_state(name):
    """A state dict as MegEngine wrote it: _flatten_weights, and the unused
    cells.* entries (zeros here: MegEngine's forward never reads them)."""
    sd = {"_flatten_weights": DATA[f"{name}/flatten_weights"]}
    for k in DATA[f"{name}/keys"]:
        if k.startswith("cells."):
            sd[str(k)] = np.zeros(1, np.float32)
    return sd


@pytest.mark.parametrize("name", CASES)
def test_megengine_checkpoint_loads_and_gives_megengines_outputs(name):
    m = CASES[name]()
    assert m.load_state_dict(_megengine_state(name), layout="megengine") == ([], [])
    y, h = m(mt.tensor(DATA[f"{name}/x"]))
    h = h[0] if isinstance(h, tuple) else h
    np.testing.assert_allclose(y.numpy(), DATA[f"{name}/y"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(h.numpy(), DATA[f"{name}/h"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", CASES)
def test_state_dict_in_megengines_layout_round_trips(name):
    m = CASES[name]()
    m.load_state_dict(_megengine_state(name), layout="megengine")
    back = m.state_dict(layout="megengine")
    assert sorted(back) == sorted(str(k) for k in DATA[f"{name}/keys"])   # MegEngine's names
    np.testing.assert_array_equal(back["_flatten_weights"].numpy(),
                                  DATA[f"{name}/flatten_weights"])
    again = CASES[name]()
    again.load_state_dict(back, layout="megengine")
    for k, v in m.state_dict().items():
        np.testing.assert_array_equal(again.state_dict()[k].numpy(), v.numpy())


def test_nested_in_a_model_and_mgtraces_own_layout_still_loads():
    class Tagger(M.Module):
        def __init__(self):
            super().__init__()
            self.rnn = M.LSTM(5, 3, num_layers=2, bidirectional=True)
            self.head = M.Linear(6, 2)

    net = Tagger()
    sd = {f"rnn.{k}": v for k, v in _megengine_state("lstm_2layer_bidir").items()}
    sd.update({f"head.{k}": v.numpy() for k, v in net.head.state_dict().items()})
    assert net.load_state_dict(sd, layout="megengine") == ([], [])
    y, _ = net.rnn(mt.tensor(DATA["lstm_2layer_bidir/x"]))
    np.testing.assert_allclose(y.numpy(), DATA["lstm_2layer_bidir/y"], rtol=1e-5, atol=1e-6)
    # the default layout is unchanged: torch's names load, _flatten_weights is unexpected
    own = {k: v.numpy() for k, v in net.state_dict().items()}
    assert net.load_state_dict(own) == ([], [])
    with pytest.raises(StateDictError, match="_flatten_weights"):
        net.load_state_dict(sd)


def test_a_flattened_weight_of_the_wrong_size_is_refused():
    m = M.LSTM(5, 3)
    with pytest.raises(StateDictError, match="_flatten_weights holds 12 values"):
        m.load_state_dict({"_flatten_weights": np.zeros((3, 4), np.float32)}, layout="megengine")
    with pytest.raises(StateDictError, match="no proj_size"):
        M.LSTM(5, 3, proj_size=2).load_state_dict(
            {"_flatten_weights": np.zeros(1, np.float32)}, layout="megengine")
