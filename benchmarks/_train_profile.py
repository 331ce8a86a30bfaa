"""Per-op CPU time of one training step, mgtrace beside PyTorch, at one
thread (``bench_train.py --profile``).

Each library runs in its own process at one thread; every op is timed
with ``time.process_time`` (CPU seconds, so another process on the
machine does not inflate it). Ops are grouped into categories both
libraries share (conv2d, batch_norm, relu, linear/matmul, ...), per phase:

- forward: mgtrace, each public ``mgtrace.functional`` call at the
  outermost level (so ``F.batch_norm``'s chain of core ops is one entry,
  its Python included) and each core op outside one; PyTorch, each aten
  op under a TorchDispatchMode (kernel only);
- backward: mgtrace, each node's gradient rule (labelled as its forward
  was), the engine's gradient sums and reduce-to-shape; PyTorch, each
  aten op the autograd engine runs (an ``add`` there is a gradient sum);
- optimizer: the SGD step and the clearing of gradients, as one entry.

Whatever no entry covers (Python between ops, the autograd engines'
bookkeeping) is the phase's ``(unattributed)`` row: the phase's CPU time
less its entries.
"""
import json
import time

import numpy as np

_CT = time.process_time

# category of an op or function name (mgtrace's names and aten's, lower case)
_EXACT = {
    "conv2d": "conv2d", "convolution": "conv2d", "_convolution": "conv2d",
    "mkldnn_convolution": "conv2d", "convolution_backward": "conv2d",
    "_slow_conv2d_forward": "conv2d", "_slow_conv2d_backward": "conv2d",
    "conv_transpose2d": "conv2d",
    "batch_norm": "batch_norm", "native_batch_norm": "batch_norm",
    "_native_batch_norm_legit": "batch_norm", "_native_batch_norm_legit_functional": "batch_norm",
    "native_batch_norm_backward": "batch_norm", "_batch_norm_with_update": "batch_norm",
    "batch_norm_backward": "batch_norm",
    "relu": "relu", "relu_": "relu", "threshold_backward": "relu",
    "max_pool2d": "max_pool2d", "max_pool2d_with_indices": "max_pool2d",
    "max_pool2d_with_indices_backward": "max_pool2d",
    "adaptive_avg_pool2d": "avg_pool", "_adaptive_avg_pool2d": "avg_pool",
    "_adaptive_avg_pool2d_backward": "avg_pool", "avg_pool2d": "avg_pool",
    "linear": "linear/matmul", "matmul": "linear/matmul", "addmm": "linear/matmul",
    "mm": "linear/matmul", "bmm": "linear/matmul", "baddbmm": "linear/matmul",
    "attention": "attention", "_scaled_dot_product_flash_attention_for_cpu": "attention",
    "_scaled_dot_product_flash_attention_for_cpu_backward": "attention",
    "softmax": "softmax", "_softmax": "softmax", "_softmax_backward_data": "softmax",
    "cross_entropy": "cross_entropy", "log_softmax": "cross_entropy",
    "_log_softmax": "cross_entropy", "_log_softmax_backward_data": "cross_entropy",
    "nll_loss_forward": "cross_entropy", "nll_loss_backward": "cross_entropy",
    "nll_loss": "cross_entropy", "nll_loss2d_forward": "cross_entropy",
    "layer_norm": "layer_norm", "native_layer_norm": "layer_norm",
    "native_layer_norm_backward": "layer_norm",
    "gelu": "gelu", "gelu_backward": "gelu",
    "embedding": "embedding", "index_select": "embedding",
    "embedding_dense_backward": "embedding", "embedding_backward": "embedding",
    "index_add": "embedding", "index_put_": "embedding",
    "mean": "reduce", "sum": "reduce", "var": "reduce",
    "dropout": "dropout", "native_dropout": "dropout",
}
_ELEMENTWISE = {"add", "add_", "sub", "mul", "mul_", "truediv", "div", "div_", "neg", "rsqrt",
                "exp", "sqrt", "pow", "maximum", "minimum", "where", "clip", "astype", "fill_",
                "zero_", "ones_like", "zeros_like", "full_like", "masked_fill", "_to_copy",
                "ge", "gt", "le", "lt", "eq", "ne", "tanh", "square"}
_LAYOUT = {"reshape", "view", "_unsafe_view", "transpose", "permute", "t", "expand", "clone",
           "copy_", "contiguous", "as_strided", "squeeze", "unsqueeze", "expand_dims",
           "flatten", "getitem", "setitem", "concat", "cat", "split", "stack", "select",
           "slice", "detach", "alias", "empty", "empty_like", "new_empty_strided",
           "broadcast_to", "_reshape_alias", "split_with_sizes", "unbind", "arange", "copy", "select_backward",
           "empty_strided", "new_zeros", "lift_fresh", "zeros", "ones", "full", "scalar_tensor",
           "to_nchwc", "from_nchwc"}


def category(name):
    name = name.lower()
    if name in _EXACT:
        return _EXACT[name]
    if name in _ELEMENTWISE:
        return "elementwise"
    if name in _LAYOUT:
        return "layout/copy"
    return name


class Profile:
    """CPU seconds per (phase, category), summed over the profiled steps."""

    def __init__(self):
        self.t = {}
        self.phase = None
        self.phase_total = {}

    def add(self, cat, dt):
        key = (self.phase, cat)
        self.t[key] = self.t.get(key, 0.0) + dt

    def run_phase(self, phase, fn):
        self.phase = phase
        t0 = _CT()
        r = fn()
        self.phase_total[phase] = self.phase_total.get(phase, 0.0) + _CT() - t0
        self.phase = None
        return r

    def result(self, steps):
        out = {}
        for (phase, cat), v in self.t.items():
            out.setdefault(phase, {})[cat] = v / steps
        for phase, tot in self.phase_total.items():
            d = out.setdefault(phase, {})
            d["(unattributed)"] = tot / steps - sum(d.values())
            d["(phase total)"] = tot / steps
        return out


# ------------------------------------------------------------------ mgtrace
def profile_mgtrace(build, steps, warmup=2):
    """``build()`` -> (loss_fn, params); ``warmup`` untimed steps, then
    ``steps`` profiled ones; returns Profile.result()."""
    import mgtrace as mt
    from mgtrace.autodiff import GradManager, _tape
    from mgtrace.optimizer import SGD
    mt.set_num_threads(1)
    loss_fn, params = build()
    gm = GradManager().attach(params)
    opt = SGD(params, lr=1e-3, momentum=0.9)
    prof = Profile()
    labels = {}                 # id(node) -> the category of the forward call that made it
    fn_stack = []
    rec = _tape.RECORDER
    orig_apply, orig_function = rec.on_apply, rec.on_function
    orig_rule, orig_acc, orig_fit = _tape._run_rule, _tape._accumulate, _tape._fit

    def label(res, cat):
        for o in res if isinstance(res, (tuple, list)) else (res,):
            e = getattr(o, "__dict__", {}).get("_ad")
            if e is not None and id(e[0]) not in labels:
                labels[id(e[0])] = cat

    def on_apply(op, *inputs):
        if fn_stack:
            res = orig_apply(op, *inputs)
            label(res, fn_stack[0])
            return res
        t0 = _CT()
        res = orig_apply(op, *inputs)
        prof.add(category(op.name), _CT() - t0)
        label(res, category(op.name))
        return res

    def on_function(wrapper, fn, args, kwargs):
        if fn_stack:
            return orig_function(wrapper, fn, args, kwargs)
        cat = category(fn.__name__)
        fn_stack.append(cat)
        t0 = _CT()
        try:
            res = orig_function(wrapper, fn, args, kwargs)
        finally:
            fn_stack.pop()
        prof.add(cat, _CT() - t0)
        label(res, cat)
        return res

    inner = [0.0]               # CPU s of the split-out pieces inside the running rule

    def run_rule(node, gouts):
        inner[0] = 0.0
        t0 = _CT()
        r = orig_rule(node, gouts)
        prof.add(labels.get(id(node), category(node.name)), _CT() - t0 - inner[0])
        return r

    def split_out(fn, cat):
        """fn timed as its own category (conv2d's weight gradient apart from its input's)."""
        def timed(*a, **k):
            t0 = _CT()
            r = fn(*a, **k)
            dt = _CT() - t0
            inner[0] += dt
            prof.add(cat, dt)
            return r
        return timed

    def accumulate(a, b):
        if a is None:
            return b
        t0 = _CT()
        r = orig_acc(a, b)
        prof.add("grad accumulate", _CT() - t0)
        return r

    def fit(g, meta):
        t0 = _CT()
        r = orig_fit(g, meta)
        prof.add("reduce-to-shape", _CT() - t0)
        return r

    def step(p):
        if p is None:
            with gm:
                gm.backward(loss_fn())
            opt.step().clear_grad()
            return
        with gm:
            loss = p.run_phase("forward", loss_fn)
            p.run_phase("backward", lambda: gm.backward(loss))

        def upd():
            t0 = _CT()
            opt.step().clear_grad()
            p.add("sgd update", _CT() - t0)
        p.run_phase("optimizer", upd)

    from mgtrace.autodiff import rules
    orig_dw = rules._conv_weight_grad
    for _ in range(warmup):
        step(None)
    rules._conv_weight_grad = split_out(orig_dw, "conv2d (dw)")
    rec.on_apply, rec.on_function = on_apply, on_function
    _tape._run_rule, _tape._accumulate, _tape._fit = run_rule, accumulate, fit
    try:
        for _ in range(steps):
            labels.clear()
            step(prof)
    finally:
        rec.on_apply, rec.on_function = orig_apply, orig_function
        _tape._run_rule, _tape._accumulate, _tape._fit = orig_rule, orig_acc, orig_fit
        rules._conv_weight_grad = orig_dw
    return prof.result(steps)


# ------------------------------------------------------------------ torch
def profile_torch(build, steps, warmup=2):
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    torch.set_num_threads(1)
    loss_fn, params = build()
    opt = torch.optim.SGD(params, lr=1e-3, momentum=0.9)
    prof = Profile()

    class Timer(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            t0 = _CT()
            r = func(*args, **(kwargs or {}))
            dt = _CT() - t0
            name = func.__name__.split(".")[0]
            if prof.phase == "backward" and name in ("add", "add_"):
                prof.add("grad accumulate", dt)
            elif prof.phase != "optimizer":
                prof.add(category(name), dt)
            return r

    def step(p):
        if p is None:
            loss_fn().backward()
            opt.step()
            opt.zero_grad()
            return
        with Timer():
            loss = p.run_phase("forward", loss_fn)
            p.run_phase("backward", loss.backward)

            def upd():
                t0 = _CT()
                opt.step()
                opt.zero_grad()
                p.add("sgd update", _CT() - t0)
            p.run_phase("optimizer", upd)

    for _ in range(warmup):
        step(None)
    for _ in range(steps):
        step(prof)
    return prof.result(steps)


def table(mg, th, out=print):
    """The side-by-side table: per phase, categories by mgtrace's excess over torch."""
    out(f"{'phase':<10}{'category':<20}{'mgtrace s':>11}{'torch s':>10}{'ratio':>8}{'excess s':>10}")
    for phase in ("forward", "backward", "optimizer"):
        a, b = mg.get(phase, {}), (th or {}).get(phase, {})
        cats = sorted(set(a) | set(b), key=lambda k: (k == "(phase total)",
                                                     -(a.get(k, 0.0) - b.get(k, 0.0))))
        for k in cats:
            x, y = a.get(k, 0.0), b.get(k)
            ys = f"{y:>10.4f}" if y is not None else f"{'-':>10}"
            ratio = f"{x / y:>8.2f}" if y else f"{'':>8}"
            ex = f"{x - (y or 0.0):>+10.4f}"
            out(f"{phase:<10}{k:<20}{x:>11.4f}{ys}{ratio}{ex}")
        out("")
