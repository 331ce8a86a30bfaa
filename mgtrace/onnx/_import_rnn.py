"""ONNX ``RNN`` and ``LSTM`` nodes imported as mgtrace's builtin
:class:`~mgtrace.module.RNN` / :class:`~mgtrace.module.LSTM` modules (one
layer a node, both directions), so the imported TracedModule holds a
recurrent module a user recognises, with torch's parameter names.

Gate order: ONNX stacks an LSTM's gate rows as (input, output, forget,
cell), mgtrace (as torch) as (input, forget, cell, output); an RNN has one
gate. ONNX's bias ``B`` is ``[Wb, Rb]`` per direction: ``bias_ih`` and
``bias_hh``. Initial states ``initial_h`` / ``initial_c`` become ``hx``;
``layout=1`` (opset 14) is ``batch_first``. ONNX's outputs are rebuilt
from the module's: ``Y [T, D, N, H]`` from ``output [T, N, D * H]``,
``Y_h`` / ``Y_c`` are ``h_n`` / ``c_n``.

With ``sequence_lens`` (per-sample lengths, which mgtrace's modules do not
take) each direction is a forward module of its own (a Sequential of one
or two), run over the whole sequence: the forward one's steps before a
sample's length are that sample's, the reverse one reads each sample's
span reversed in place; Y is zero past the lengths and Y_h is read at each
sample's last step (see :func:`_run_by_length`).

Not importable (an OnnxImportError naming the node): weights computed at
run time, ``Y_c`` together with ``sequence_lens``, peepholes, ``clip``,
``input_forget``, and activations other than the defaults (RNN: Tanh or
Relu). ``direction="reverse"`` alone runs as the reverse half of the
lengths form, every sample the whole sequence.
"""
import numpy as np

OPS = ("RNN", "LSTM")

__all__ = ["OPS", "make_module", "run", "weight_inputs"]

_LSTM_ROWS = (0, 2, 3, 1)       # ONNX (i, o, f, c) blocks in torch's order (i, f, c, o)


def _err(node, msg):
    from mgtrace.onnx._ops import _err as err
    return err(node, msg)


def weight_inputs(node):
    """Names of the node's W, R and B inputs (moved into the module)."""
    return [n for n in list(node.input)[1:4] if n]


def make_module(node, arrays, attrs):
    """The RNN / LSTM module for ONNX ``node`` (weights from ``arrays``,
    the model's initializers by name; ``attrs``: the node's attributes)."""
    import mgtrace.module as M
    lstm = node.op_type == "LSTM"
    ins = list(node.input) + [""] * (8 - len(node.input))
    for i, what in ((1, "W"), (2, "R")):
        if ins[i] not in arrays:
            raise _err(node, f"its {what} is computed at run time; only initializer weights "
                             f"import as an mgtrace {node.op_type} module")
    if ins[3] and ins[3] not in arrays:
        raise _err(node, "its bias B is computed at run time")
    direction = attrs.get("direction", b"forward")
    direction = direction.decode() if isinstance(direction, bytes) else str(direction)
    by_length = bool(ins[4]) or direction == "reverse"
    if ins[4] and lstm and len(node.output) > 2 and node.output[2]:
        raise _err(node, "Y_c with sequence_lens has no mgtrace form (the LSTM module gives "
                         "the cell state after the last step of the whole sequence only)")
    if lstm and ins[7]:
        raise _err(node, "LSTM peepholes (input P) have no mgtrace form")
    if attrs.get("clip") is not None:
        raise _err(node, "a cell clip has no mgtrace form")
    if attrs.get("input_forget", 0):
        raise _err(node, "input_forget=1 (coupled gates) has no mgtrace form")
    if direction not in ("forward", "bidirectional", "reverse"):
        raise _err(node, f"direction={direction!r} is not an ONNX direction")
    d = 2 if direction == "bidirectional" else 1
    acts = [a.decode() if isinstance(a, bytes) else str(a)
            for a in attrs.get("activations", [])]
    nonlinearity = "tanh"
    if lstm:
        if acts and [a.lower() for a in acts] != ["sigmoid", "tanh", "tanh"] * d:
            raise _err(node, f"LSTM activations {acts} have no mgtrace form (Sigmoid, Tanh, "
                             f"Tanh import)")
    elif acts:
        if len(set(a.lower() for a in acts)) != 1 or acts[0].lower() not in ("tanh", "relu"):
            raise _err(node, f"RNN activations {acts} have no mgtrace form (Tanh or Relu, the "
                             f"same in both directions)")
        nonlinearity = acts[0].lower()
    w, r = arrays[ins[1]], arrays[ins[2]]
    gates = 4 if lstm else 1
    if w.ndim != 3 or r.ndim != 3 or w.shape[0] != d or r.shape[0] != d:
        raise _err(node, f"W {w.shape} and R {r.shape} are not [{d}, gates * H, ...]")
    hidden = int(attrs.get("hidden_size", r.shape[2]))
    if w.shape[1] != gates * hidden or r.shape[1:] != (gates * hidden, hidden):
        raise _err(node, f"W {w.shape} and R {r.shape} do not fit hidden_size {hidden}")
    bias = arrays.get(ins[3]) if ins[3] else None
    if bias is not None and bias.shape != (d, 2 * gates * hidden):
        raise _err(node, f"B {bias.shape} is not [{d}, {2 * gates * hidden}]")
    if w.dtype.kind != "f":
        raise _err(node, f"{w.dtype} weights have no mgtrace {node.op_type} form")
    layout = int(attrs.get("layout", 0))

    def module(dirs):
        kw = dict(num_layers=1, bias=True, batch_first=layout == 1 and not by_length,
                  bidirectional=dirs == 2)
        return M.LSTM(w.shape[2], hidden, **kw) if lstm else \
            M.RNN(w.shape[2], hidden, nonlinearity=nonlinearity, **kw)

    def rows(a):
        if not lstm:
            return a
        return np.concatenate([a[k * hidden:(k + 1) * hidden] for k in _LSTM_ROWS], 0)
    def fill(m, ks):
        for k, sfx in zip(ks, m._suffixes(0)):
            b = bias[k] if bias is not None else np.zeros(2 * gates * hidden, np.float32)
            for name, value in (("weight_ih", w[k]), ("weight_hh", r[k]),
                                ("bias_ih", b[:gates * hidden]),
                                ("bias_hh", b[gates * hidden:])):
                setattr(m, name + sfx, M.Parameter(np.ascontiguousarray(rows(value),
                                                                        np.float32)))
        return m.eval()
    if by_length:       # one forward module a direction (the reverse one on reversed spans)
        return M.Sequential(*[fill(module(1), [k]) for k in range(d)]).eval()
    return fill(module(d), range(d))


def run(m, node, ins):
    """ONNX ``node``'s outputs (Y, Y_h[, Y_c]) from module ``m`` on its
    inputs ``ins`` (X, W, R, B, sequence_lens, initial_h[, initial_c])."""
    import mgtrace as mt
    lstm = node.op_type == "LSTM"
    ins = [mt.tensor(v) if isinstance(v, np.ndarray) else v for v in ins]
    ins = list(ins) + [None] * (8 - len(ins))
    from mgtrace.module import Sequential
    if isinstance(m, Sequential):           # sequence_lens, or direction="reverse" alone
        return _run_by_length(m, node, ins, lstm)
    x = ins[0]
    if x.dtype != np.float32:
        x = x.astype("float32")
    h0, c0 = ins[5], ins[6] if lstm else None
    if m.batch_first:           # layout 1: states [N, D, H]
        h0 = None if h0 is None else h0.transpose(1, 0, 2)
        c0 = None if c0 is None else c0.transpose(1, 0, 2)
    hx = None
    if lstm and (h0 is not None or c0 is not None):
        import mgtrace.functional as F
        hx = (h0 if h0 is not None else F.zeros_like(c0),
              c0 if c0 is not None else F.zeros_like(h0))
    elif not lstm:
        hx = h0
    y, state = m(x, hx) if hx is not None else m(x)
    finals = list(state) if lstm else [state]
    d, hid = m.num_directions, m.hidden_size
    if m.batch_first:           # Y [N, T, D, H], Y_h [N, D, H]
        y = y.reshape(y.shape[0], y.shape[1], d, hid)
        finals = [f.transpose(1, 0, 2) for f in finals]
    else:                       # Y [T, D, N, H]
        y = y.reshape(y.shape[0], y.shape[1], d, hid).transpose(0, 2, 1, 3)
    return [y] + finals


def _run_by_length(mods, node, ins, lstm):
    """RNN / LSTM with ``sequence_lens`` [N]: each direction's module runs the
    whole sequence; the forward one's steps before a sample's length are
    that sample's (later steps read padding, and ONNX's Y is 0 there),
    the reverse one runs each sample's span reversed in place (x[len - 1 -
    t] for t < len), and Y_h is read at step len - 1. Lengths are at least
    1 (ONNX Runtime's rule too)."""
    import mgtrace.functional as F
    attrs = _attrs(node)
    layout = int(attrs.get("layout", 0))
    direction = attrs.get("direction", b"forward")
    direction = direction.decode() if isinstance(direction, bytes) else str(direction)
    kinds = ["reverse"] if direction == "reverse" else ["forward", "reverse"][:len(mods)]
    x, lens, h0, c0 = ins[0], ins[4], ins[5], ins[6] if lstm else None
    whole = lens is None        # direction="reverse" alone: every sample is the whole sequence
    if x.dtype != np.float32:
        x = x.astype("float32")
    if layout == 1:             # time first below
        x = x.transpose(1, 0, 2)
        h0 = None if h0 is None else h0.transpose(1, 0, 2)
        c0 = None if c0 is None else c0.transpose(1, 0, 2)
    t_len, n = x.shape[0], x.shape[1]
    steps = F.arange(0, t_len, dtype="int32").reshape(t_len, 1)
    if whole:
        lens = F.broadcast_to(steps[-1:] + 1, (1, n))
    lens = lens.astype("int32").reshape(1, n)
    keep = steps < lens                                            # [T, N]
    rev = F.where(keep, lens - 1 - steps, steps)                   # a span's mirror step
    last = (lens - 1).reshape(1, n, 1)
    ys, hs, cs = [], [], []
    for k, (m, kind) in enumerate(zip(mods, kinds)):
        hid = m.hidden_size
        xk = x if kind == "forward" else F.gather(x, 0, F.broadcast_to(
            rev.reshape(t_len, n, 1), x.shape))
        hx = None
        if h0 is not None or c0 is not None:
            hk = None if h0 is None else h0[k:k + 1]
            ck = None if c0 is None else c0[k:k + 1]
            hx = (hk if hk is not None else F.zeros_like(ck),
                  ck if ck is not None else F.zeros_like(hk)) if lstm else hk
        y, state = m(xk, hx) if hx is not None else m(xk)          # [T, N, H]
        if whole and lstm:
            cs.append(state[1])                                    # after the whole span
        idx = F.broadcast_to(last, (1, n, hid))
        hs.append(F.gather(y, 0, idx))                             # [1, N, H]
        if kind == "reverse":
            y = F.gather(y, 0, F.broadcast_to(rev.reshape(t_len, n, 1), y.shape))
        ys.append(y * keep.astype("float32").reshape(t_len, n, 1))
    y = F.stack(ys, 1)                                             # [T, D, N, H]
    finals = [F.concat(hs, 0)] + ([F.concat(cs, 0)] if cs else [])   # [D, N, H]
    if layout == 1:
        return [y.transpose(2, 0, 1, 3)] + [f.transpose(1, 0, 2) for f in finals]
    return [y] + finals


def _attrs(node):
    from mgtrace.onnx._ops import _attrs as attrs
    return attrs(node)
