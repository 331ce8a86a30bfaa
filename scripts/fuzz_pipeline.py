"""Differential fuzzer of the whole pipeline: eager against every way a traced module runs.

    python scripts/fuzz_pipeline.py -n 20000 --seed 1 -j 2
    python scripts/fuzz_pipeline.py -n 300 --without tied,inplace --save-regressions DIR
    python scripts/fuzz_pipeline.py --case 1 17          # one case, its module's source and result

Each case is a small random module, written as Python source from a spec
(seeded: case ``i`` of seed ``s`` is always the same module): layers from the
op table and the builtin modules, in the shapes of real models' patterns,
each step of one feature family (FAMILIES: ``tied`` parameters, modules
called ``twice``, ``inplace`` updates of buffers, intermediates and inputs,
``bufwrite`` (a buffer written through a slice), ``paramwrite`` (a
parameter written in forward), ``alias`` (a buffer viewing another),
``view`` and slices,
Python ``container`` s of modules, user ``submodule`` s, ``create`` (tensors
made in forward), ``shape`` arithmetic, ``index`` (integer and mask indexing),
``int`` and ``bool`` values, ``range`` loops over the batch, ``attention``,
``residual`` adds, ``device`` moves (an output on cpu:1); and, for the whole case, ``nan`` inputs (NaN, inf, -0.0),
``f64`` inputs, ``batch`` (called at another batch than traced),
``outputs`` (dict/tuple/list outputs), ``train`` mode, ``odd`` channel
counts). The module runs

* eager, on a deepcopy of the module (the reference, twice: state carried);
* and as every VARIANT of its trace (traced; optimize(tm);
  optimize(tm, "all", flatten=True); save/load by copy and by mmap;
  deepcopy(tm); save(target_version=(1, 0)); the optimized module saved and
  loaded; tm.to_folder(...) imported back), each derived from the fresh
  trace and called twice, the same inputs as eager's two calls.

Every call must equal eager's: the output structure, devices, dtypes and
shapes exactly; NaN and inf positions exactly; integers and bools exactly; floats
within TOL[dtype] of the output's scale (its largest finite magnitude;
float32: 1e-5); and after each call the state (every state_dict tensor both
hold; a tensor eager changed must still be there) and the inputs (which
the module may write into) the same way. An allowed refusal (REFUSALS: a
ValueError that names why, e.g. save(target_version=(1, 0)) of something
format 1.0 cannot hold) is counted, not failed.

A failure is shrunk (steps and case features dropped while the same variant
fails the same way), classified by a signature ``variant/kind/features``
(the features of the shrunk module), printed with its seed, case number and
shrunk source, and with ``--save-regressions DIR`` each distinct
signature's shrunk module is written as a pytest file. Workers are
subprocesses: a crash or a hang (no progress for --hang-s) is caught, named
by its case, and the run goes on. Exit status 0 when nothing failed.
"""
import argparse
import copy
import io
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np

HERE = os.path.abspath(__file__)

# --------------------------------------------------------------- families
# step families (a step belongs to one) and case-wide features
STEP_FAMILIES = ("builtin", "ops", "view", "tied", "twice", "inplace", "bufwrite", "paramwrite",
                 "alias", "container", "submodule", "int", "bool", "range", "attention", "residual",
                 "create", "shape", "index", "device")
CASE_FAMILIES = ("nan", "f64", "batch", "outputs", "train", "odd")
FAMILIES = STEP_FAMILIES + CASE_FAMILIES

# of the output's scale; float64 as float32: the modules' parameters are
# float32, so a float64 output carries their rounding (a folded BatchNorm)
TOL = {"float32": 1e-5, "float64": 1e-5, "float16": 1e-2, "bfloat16": 1e-1}
EVEN, ODD = (4, 8, 16, 32), (3, 5, 7, 13, 17, 33)
MAX_CHANNELS = 66
MAX_STEPS = 7
HANG_S = 120.0


# ------------------------------------------------------------- the source
class _Gen:
    """Builds a module's source step by step, tracking the current value's
    shape: ``img`` (C, H, W) or ``vec`` (F,), the batch left out."""

    def __init__(self, spec):
        self.spec = spec
        self.init, self.fwd, self.classes, self.extras = [], [], [], []
        self.shape = tuple(spec["in"])
        self.n = 0
        self.ids = False        # whether forward takes ``ids`` (int32 [N, 3] token ids) too
        self.rounding = None    # a rounding step in forward (see ROUNDING below)

    @property
    def img(self):
        return len(self.shape) == 3

    def name(self, stem):
        self.n += 1
        return f"{stem}{self.n}"

    def channels(self, r):
        opts = EVEN + (ODD if self.spec["odd"] else ())
        return opts[r % len(opts)]

    def width(self):
        return self.shape[0]

    def same(self, r):
        """A module source mapping the current shape to itself."""
        c = self.width()
        if self.img:
            return f"M.Conv2d({c}, {c}, 3, padding=1, bias={bool(r % 2)})"
        return f"M.Linear({c}, {c}, bias={bool(r % 2)})"


def _pick(r, i, opts):
    return opts[r[i % len(r)] % len(opts)]


def _conv(g, r, bn=False):
    if not g.img:
        return False
    cin, hh, ww = g.shape
    cout = g.channels(r[0])
    k = _pick(r, 1, (1, 3, 3))
    s = _pick(r, 2, (1, 1, 2)) if min(hh, ww) >= 3 else 1
    p = _pick(r, 3, (k // 2, k // 2, 0)) if min(hh, ww) >= k else k // 2
    groups = cin if (cout == cin and r[4] % 3 == 0) else 1
    ho, wo = (hh + 2 * p - k) // s + 1, (ww + 2 * p - k) // s + 1
    if ho < 1 or wo < 1:
        return False
    m = g.name("conv")
    g.init.append(f"self.{m} = M.Conv2d({cin}, {cout}, {k}, stride={s}, padding={p}, "
                  f"groups={groups}, bias={bool(r[5] % 2)})")
    g.fwd.append(f"h = self.{m}(h)")
    g.shape = (cout, ho, wo)
    if bn:
        b = g.name("bn")
        g.init.append(f"self.{b} = M.BatchNorm2d({cout})")
        g.fwd.append(f"h = self.{b}(h)")
        g.fwd.append(_pick(r, 6, ("h = F.relu(h)", "h = F.relu6(h)", "h = F.silu(h)",
                                  "h = F.relu(h)")))
    return True


def _bn(g, r):
    b = g.name("bn")
    g.init.append(f"self.{b} = M.BatchNorm{'2' if g.img else '1'}d({g.width()})")
    g.fwd.append(f"h = self.{b}(h)")
    return True


_ACTS = ("M.ReLU()", "M.ReLU6()", "M.GELU()", "M.GELU('tanh')", "M.SiLU()", "M.Sigmoid()",
         "M.Tanh()", "M.Hardswish()", "M.Hardsigmoid()", "M.Softmax(1)", "M.Identity()",
         "M.Dropout(0.5)")


def _act(g, r):
    a = _pick(r, 0, _ACTS)
    if a.startswith("M.Dropout") and g.spec["train"]:
        a = "M.ReLU()"          # dropout in training is random: no reference to compare to
    m = g.name("act")
    g.init.append(f"self.{m} = {a}")
    g.fwd.append(f"h = self.{m}(h)")
    return True


_UNARY = ("F.relu(h)", "F.relu6(h)", "F.sigmoid(h)", "F.gelu(h)", "F.silu(h)", "F.tanh(h)",
          "F.hardswish(h)", "F.hardsigmoid(h)", "F.softplus(h)", "F.leaky_relu(h, 0.1)",
          "F.exp(F.clip(h, -10.0, 10.0))", "F.abs(h)", "-h", "F.sin(h)", "F.cos(h)",
          "F.square(h)", "F.sqrt(F.abs(h))", "F.log(h)", "F.log1p(F.abs(h))", "F.erf(h)",
          "F.atan(h)", "F.floor(h * 2.0)", "F.ceil(h)", "F.round(h * 4.0) / 4.0",
          "F.trunc(h)", "F.sign(h)", "F.expm1(F.clip(h, -5.0, 5.0))", "F.clip(h, -0.5, 0.5)",
          "F.where(h > 0, h, h * 0.1)", "F.softmax(h, axis=1)", "F.log_softmax(h, axis=-1)",
          "F.cumsum(h, axis=1)", "h ** 2", "F.pow(F.abs(h), 1.5)", "F.maximum(h, 0.25)",
          "F.minimum(h, h * 0.5)", "h % 1.0", "h // 0.5", "F.rsqrt(F.abs(h) + 1.0)",
          "F.atan2(h, h + 1.0)")


def _unary(g, r):
    g.fwd.append(f"h = {_pick(r, 0, _UNARY)}")
    return True


def _binop(g, r):
    c = g.width()
    shape = f"({c}, 1, 1)" if g.img else f"({c},)"
    kind = r[0] % 4
    if kind == 0:           # a scale and a shift, as parameters (FuseAddMul's pattern)
        s, t = g.name("scale"), g.name("shift")
        g.init.append(f"self.{s} = M.Parameter(F.ones({shape}))")
        g.init.append(f"self.{t} = M.Parameter(F.zeros({shape}))")
        g.fwd.append(f"h = h * self.{s} + self.{t}")
    elif kind == 1:         # a read-only buffer
        k = g.name("k")
        g.init.append(f"self.{k} = F.full({shape}, 0.5)")
        g.fwd.append(f"h = {_pick(r, 1, ('h - self.' + k, 'self.' + k + ' / (F.abs(h) + 1.0)'))}")
    elif kind == 2:         # Python constants
        g.fwd.append(f"h = {_pick(r, 1, ('h * 0.5 + 1.0', '2.0 - h', 'h / 3.0', '1.0 + h * h'))}")
    else:                   # with itself
        g.fwd.append(f"h = {_pick(r, 1, ('h * h', 'h + h', 'h - h * 0.25', 'F.maximum(h, -h)'))}")
    return True


def _pool(g, r):
    if not g.img or min(g.shape[1:]) < 2:
        return False
    c, hh, ww = g.shape
    kind = r[0] % 5
    m = g.name("pool")
    if kind == 0:
        g.init.append(f"self.{m} = M.MaxPool2d(2)")
        hh, ww = hh // 2, ww // 2
    elif kind == 1:
        g.init.append(f"self.{m} = M.AvgPool2d(2)")
        hh, ww = hh // 2, ww // 2
    elif kind == 2:
        g.init.append(f"self.{m} = M.MaxPool2d(3, stride=1, padding=1)")
    elif kind == 3:
        g.init.append(f"self.{m} = M.MaxPool2d(2, stride=2, ceil_mode=True)")
        hh, ww = -(-hh // 2), -(-ww // 2)
    else:
        g.init.append(f"self.{m} = M.AdaptiveAvgPool2d(({max(1, hh // 2)}, {max(1, ww // 2)}))")
        hh, ww = max(1, hh // 2), max(1, ww // 2)
    g.fwd.append(f"h = self.{m}(h)")
    g.shape = (c, hh, ww)
    return True


def _norm(g, r):
    """LayerNorm / GroupNorm over groups of 8 values or more, eps 1e-3: a
    norm of a few nearly equal values (ReLU's zeros) scales earlier rounding
    up by 1/sqrt(var + eps), which the output's scale does not show."""
    m = g.name("norm")
    if g.img:
        c = g.width()
        size = g.shape[1] * g.shape[2]
        groups = [d for d in range(1, c + 1) if c % d == 0 and c // d * size >= 8]
        if not groups:
            return False
        if r[0] % 2 or g.shape[2] < 8:
            g.init.append(f"self.{m} = M.GroupNorm({groups[r[1] % len(groups)]}, {c}, eps=1e-3)")
        else:
            g.init.append(f"self.{m} = M.LayerNorm({g.shape[2]}, eps=1e-3)")
    elif g.width() >= 8:
        g.init.append(f"self.{m} = M.LayerNorm({g.width()}, eps=1e-3)")
    else:
        return False
    g.fwd.append(f"h = self.{m}(h)")
    return True


def _linear(g, r):
    if g.img:
        return False
    m, out = g.name("fc"), g.channels(r[0])
    g.init.append(f"self.{m} = M.Linear({g.width()}, {out}, bias={bool(r[1] % 2)})")
    g.fwd.append(f"h = self.{m}(h)")
    g.shape = (out,)
    return True


def _to_vec(g, r):
    """img -> vec by flattening or pooling (a builtin step: a model's head)."""
    if not g.img:
        return False
    c, hh, ww = g.shape
    kind = r[0] % 4
    if kind == 0:
        g.fwd.append("h = h.mean(axis=(2, 3))")
        g.shape = (c,)
    elif kind == 1:
        m = g.name("gap")
        g.init.append(f"self.{m} = M.AdaptiveAvgPool2d(1)")
        g.fwd.append(f"h = F.flatten(self.{m}(h), 1)")
        g.shape = (c,)
    elif kind == 2:
        m = g.name("flat")
        g.init.append(f"self.{m} = M.Flatten()")
        g.fwd.append(f"h = self.{m}(h)")
        g.shape = (c * hh * ww,)
    else:
        g.fwd.append("h = h.reshape(h.shape[0], -1)")
        g.shape = (c * hh * ww,)
    return g.shape[0] <= 4096


def _view(g, r):
    kind = r[0] % 6
    c = g.width()
    if kind == 0 and c >= 2:
        g.fwd.append("h = h[:, 1:]")
        g.shape = (c - 1,) + g.shape[1:]
    elif kind == 1:
        g.fwd.append("h = h[:, ::2]")
        g.shape = (-(-c // 2),) + g.shape[1:]
    elif kind == 2 and g.img:
        g.fwd.append("h = h.transpose(0, 1, 3, 2)")
        g.shape = (c, g.shape[2], g.shape[1])
    elif kind == 3:
        g.fwd.append("h = h.view(-1).reshape(h.shape)")
    elif kind == 4 and g.img:
        g.fwd.append("h = h.view(h.shape[0], -1)")
        g.shape = (c * g.shape[1] * g.shape[2],)
    elif kind == 5 and g.img and g.shape[2] >= 3:
        g.fwd.append("h = h[..., 1:-1]")
        g.shape = g.shape[:2] + (g.shape[2] - 2,)
    else:
        g.fwd.append("h = h.flatten(1).reshape(h.shape)")
    return True


def _tied(g, r):
    a, b = g.name("ta"), g.name("tb")
    g.init.append(f"self.{a} = {g.same(r[0])}")
    g.init.append(f"self.{b} = {g.same(r[1])}")
    if r[2] % 3 == 2:       # one module under two names
        g.init[-1] = f"self.{b} = self.{a}"
    else:
        g.init.append(f"self.{b}.weight = self.{a}.weight")
    if r[2] % 3 == 1:       # a BatchNorm after one: FuseConvBn's pattern on a shared weight
        n = g.name("tbn")
        g.init.append(f"self.{n} = M.BatchNorm{'2' if g.img else '1'}d({g.width()})")
        g.fwd.append(f"h = self.{b}(F.relu(self.{n}(self.{a}(h))))")
    else:
        g.fwd.append(f"h = self.{b}(F.relu(self.{a}(h)))")
    return True


def _twice(g, r):
    m = g.name("tw")
    kind = r[0] % 3
    if kind == 0:
        g.init.append(f"self.{m} = M.Tanh()")
    else:
        g.init.append(f"self.{m} = {g.same(r[1])}")
    if kind == 2:           # each call with its own BatchNorm (folding one must not fold both)
        n1, n2 = g.name("twbn"), g.name("twbn")
        bn = f"M.BatchNorm{'2' if g.img else '1'}d({g.width()})"
        g.init += [f"self.{n1} = {bn}", f"self.{n2} = {bn}"]
        g.fwd.append(f"h = self.{n2}(self.{m}(F.relu(self.{n1}(self.{m}(h)))))")
    else:
        g.fwd.append(f"h = self.{m}(F.tanh(self.{m}(h)))")
    return True


def _inplace(g, r):
    kind = r[0] % 6
    c = g.width()
    vshape, axes = ((c,), "(0, 2, 3)") if g.img else ((c,), "0")
    bshape = f"(1, {c}, 1, 1)" if g.img else f"(1, {c})"
    if kind == 0:           # a running statistic, read back
        b = g.name("acc")
        g.init.append(f"self.{b} = F.zeros({vshape})")
        g.fwd.append(f"self.{b} += h.mean(axis={axes})")
        g.fwd.append(f"h = h + self.{b}.reshape{bshape}")
    elif kind == 1:         # an int counter
        b = g.name("steps")
        g.init.append(f"self.{b} = mt.tensor(0)")
        g.fwd.append(f"self.{b} += 1")
        g.fwd.append(f"h = h * (1.0 + self.{b}.astype('float32') * 0.5)")
    elif kind == 2:
        g.fwd.append(_pick(r, 1, ("h += 1.0", "h *= 0.5", "h -= h * 0.25")))
    elif kind == 3:
        g.fwd.append(_pick(r, 1, ("h[:, :1] = 0.0", "h[:, -1] = 2.0", "h[0] = h[0] * 2.0")))
    elif kind == 4:         # the caller's input, written into
        g.fwd.append(_pick(r, 1, ("x *= 0.5", "x[:, 0] = 1.0", "x += 1.0")))
    else:                   # an input and an intermediate, both written
        g.fwd.append("x[:, :1] = 0.0")
        g.fwd.append("h *= 2.0")
    return True


def _paramwrite(g, r):
    """A parameter written in place in forward (a decaying gain), read after."""
    c = g.width()
    bshape = f"(1, {c}, 1, 1)" if g.img else f"(1, {c})"
    p = g.name("gain")
    g.init.append(f"self.{p} = M.Parameter(F.ones({bshape}))")
    g.fwd.append(_pick(r, 0, (f"self.{p} *= 0.5", f"self.{p}[:] = self.{p} * 0.5")))
    g.fwd.append(f"h = h * self.{p} + self.{p}.sum()")
    return True


def _param_expr(g, r):
    """A layer's parameters read through expressions (FoldConstant's ground)."""
    m = g.name("pe")
    c = g.width()
    if g.img:
        g.init.append(f"self.{m} = M.Conv2d({c}, {c}, 3, padding=1)")
        g.fwd.append(_pick(r, 0, (
            f"h = F.conv2d(h, self.{m}.weight * 0.5, self.{m}.bias, padding=1)",
            f"h = F.conv2d(h, self.{m}.weight.transpose(1, 0, 2, 3), None, padding=1)",
            f"h = F.conv2d(h, F.relu(self.{m}.weight), self.{m}.bias + 1.0, padding=1)")))
    else:
        g.init.append(f"self.{m} = M.Linear({c}, {c})")
        g.fwd.append(_pick(r, 0, (
            f"h = F.linear(h, self.{m}.weight * 0.5, self.{m}.bias)",
            f"h = h @ self.{m}.weight + self.{m}.bias",
            f"h = F.linear(h, self.{m}.weight.T, self.{m}.bias * 2.0)")))
    return True


def _bufwrite(g, r):
    """A buffer overwritten through a slice (``self.b[:] = v``), read back."""
    c = g.width()
    axes = "(0, 2, 3)" if g.img else "0"
    bshape = f"(1, {c}, 1, 1)" if g.img else f"(1, {c})"
    b = g.name("last")
    g.init.append(f"self.{b} = F.zeros(({c},))")
    g.fwd.append(f"self.{b}[:] = h.{_pick(r, 0, ('max', 'mean'))}(axis={axes})")
    g.fwd.append(f"h = h - self.{b}.reshape{bshape}")
    return True


def _alias(g, r):
    """A buffer that is a view of another buffer (its first entries), the
    other written in forward: the view must see the write (after a save and
    load or a deepcopy too)."""
    c = g.width()
    axes = "(0, 2, 3)" if g.img else "0"
    b, v = g.name("stat"), g.name("head")
    g.init.append(f"self.{b} = F.zeros(({c},))")
    g.init.append(f"self.{v} = self.{b}[:{max(1, c // 2)}]")
    g.fwd.append(f"self.{b} += h.mean(axis={axes})")
    g.fwd.append(f"h = h + self.{v}.sum()")
    return True


def _container(g, r):
    m = g.name("blocks")
    mk = g.same(r[1])
    act = _pick(r, 2, ("M.ReLU()", "M.Tanh()", "M.GELU()"))
    kind = r[0] % 5
    if kind == 0:
        g.init.append(f"self.{m} = [{mk}, {act}]")
        g.fwd += [f"for blk in self.{m}:", "    h = blk(h)"]
    elif kind == 1:
        g.init.append(f"self.{m} = {{'lin': {mk}, 'act': {act}}}")
        g.fwd.append(f"h = self.{m}['act'](self.{m}['lin'](h))")
    elif kind == 2:
        g.init.append(f"self.{m} = M.ModuleList([{mk}, {act}])")
        g.fwd += [f"for blk in self.{m}:", "    h = blk(h)"]
    elif kind == 3:
        g.init.append(f"self.{m} = M.Sequential({mk}, {act})")
        g.fwd.append(f"h = self.{m}(h)")
    else:
        g.init.append(f"self.{m} = ([{mk}], {{'a': {act}}})")
        g.fwd.append(f"h = self.{m}[1]['a'](self.{m}[0][0](h))")
    return True


def _submodule(g, r):
    cls, m = g.name("Block"), g.name("sub")
    c = g.width()
    if g.img:
        body = [f"self.conv = M.Conv2d({c}, {c}, 3, padding=1)", f"self.bn = M.BatchNorm2d({c})"]
        fwd = "y = F.relu(self.bn(self.conv(x)))"
    else:
        body = [f"self.fc = M.Linear({c}, {c})", f"self.ln = M.LayerNorm({c}, eps=1e-3)"]
        fwd = "y = F.gelu(self.ln(self.fc(x)))"
    ret = _pick(r, 0, ("return x + y", "return y", "return y * self.alpha"))
    if "alpha" in ret:
        body.append("self.alpha = M.Parameter(F.full((1,), 0.5))")
    g.classes.append([f"class {cls}(M.Module):", "    def __init__(self):",
                      "        super().__init__()"] + ["        " + b for b in body]
                     + ["", "    def forward(self, x):", "        " + fwd, "        " + ret])
    g.init.append(f"self.{m} = {cls}()")
    g.fwd.append(f"h = self.{m}(h)")
    return True


def _int(g, r):
    e = g.name("i")
    g.fwd.append(f"{e} = " + _pick(r, 0, ("F.argmax(h, axis=1)", "(h > 0).sum(axis=1)",
                                          "F.argmin(h.reshape(h.shape[0], -1), axis=1)",
                                          "(h > 0.5).astype('int32') * 3")))
    g.extras.append(e)
    return True


def _bool(g, r):
    g.fwd.append("h = " + _pick(r, 0, ("h * ((h > 0) & (h < 1))",
                                       "h * ((h > 0) + (h < -1))",
                                       "F.where((h > 0) | (h < -1), h, 0.0)",
                                       "h * (h > 0).astype('float32')",
                                       "h * ~(h > 0.5)",
                                       "h + ((h > 0) * (h < 0.5))")))
    return True


def _range(g, r):
    g.fwd.append("h = " + _pick(r, 0, (
        "F.stack([h[i] * float(i + 1) for i in range(h.shape[0])])",
        "F.concat([h[i:i + 1] for i in range(h.shape[0])], axis=0)")))
    return True


def _attention(g, r):
    """Self-attention over the pixels: with ``@`` on 3-D tokens, or as
    FuseAttention's pattern (4-D heads, ``F.matmul(q, k, transpose_b=True)``,
    a scale and maybe a mask)."""
    if not g.img:
        return False
    c, hh, ww = g.shape
    q, k, v = g.name("q"), g.name("k"), g.name("v")
    for m in (q, k, v):
        g.init.append(f"self.{m} = M.Linear({c}, {c})")
    g.fwd.append("t = h.reshape(h.shape[0], h.shape[1], -1).transpose(0, 2, 1)")
    heads = 2 if c % 2 == 0 else 1
    kind = r[0] % 3
    if kind == 0:
        g.fwd += [f"a = F.softmax(self.{q}(t) @ self.{k}(t).transpose(0, 2, 1) * "
                  f"{c ** -0.5!r}, axis=-1)",
                  f"h = (a @ self.{v}(t)).transpose(0, 2, 1).reshape(h.shape)"]
        return True
    split = f".reshape(t.shape[0], t.shape[1], {heads}, {c // heads}).transpose(0, 2, 1, 3)"
    scores = (f"F.matmul(self.{q}(t){split}, self.{k}(t){split}, transpose_b=True) * "
              f"{(c // heads) ** -0.5!r}")
    if kind == 2:
        mk = g.name("mask")
        g.init.append(f"self.{mk} = mt.tensor(np.triu(np.full(({hh * ww}, {hh * ww}), -1e4), 1)"
                      f".astype('float32').reshape(1, 1, {hh * ww}, {hh * ww}))")
        scores += f" + self.{mk}"
    g.fwd += [f"a = F.matmul(F.softmax({scores}, axis=-1), self.{v}(t){split})",
              "h = a.transpose(0, 2, 1, 3).reshape(h.shape[0], -1, h.shape[1])"
              ".transpose(0, 2, 1).reshape(h.shape)"]
    return True


def _mbblock(g, r):
    """MobileNetV2's inverted residual: 1x1 expansion, 3x3 depthwise, 1x1
    projection, each with a BatchNorm (NCHWc's and FusePointwiseDepthwise's
    pattern), the input added back when the shapes allow."""
    if not g.img:
        return False
    cin, hh, ww = g.shape
    hid, cout = cin * _pick(r, 0, (2, 4, 6)), g.channels(r[1])
    s = _pick(r, 2, (1, 1, 2)) if min(hh, ww) >= 3 else 1
    m = g.name("mb")
    g.init.append(f"self.{m} = M.Sequential(M.Conv2d({cin}, {hid}, 1, bias=False), "
                  f"M.BatchNorm2d({hid}), M.ReLU6(), M.Conv2d({hid}, {hid}, 3, stride={s}, "
                  f"padding=1, groups={hid}, bias=False), M.BatchNorm2d({hid}), M.ReLU6(), "
                  f"M.Conv2d({hid}, {cout}, 1, bias=False), M.BatchNorm2d({cout}))")
    res = s == 1 and cout == cin
    g.fwd.append(f"h = h + self.{m}(h)" if res else f"h = self.{m}(h)")
    g.shape = (cout, (hh - 1) // s + 1, (ww - 1) // s + 1)
    return True


def _residual(g, r):
    m = g.name("res")
    g.init.append(f"self.{m} = {g.same(r[0])}")
    g.fwd.append(_pick(r, 1, (f"h = F.relu(h + self.{m}(h))", f"h = h + self.{m}(h)",
                              f"h = F.relu(self.{m}(h) + h)")))
    return True


def _device(g, r):
    """An extra output on another device (cpu:1: ``h.to('cpu:1')``, which a
    trace once recorded as the copy it makes, losing the device), and the
    current value carried there and back."""
    e = g.name("moved")
    g.fwd.append(f"{e} = " + _pick(r, 0, ("h.to('cpu:1') * 2.0", "(h + 1.0).to('cpu:1')",
                                          "h.to('cpu:1').to('cpu:0').to('cpu:1')")))
    g.fwd.append("h = " + _pick(r, 1, ("h", f"{e}.to('cpu:0') + h", f"h.to('cpu:1').to('cpu:0')")))
    g.extras.append(e)
    return True


def _concat(g, r):
    if g.width() * 2 > MAX_CHANNELS:
        return False
    g.fwd.append("h = " + _pick(r, 0, ("F.concat([h, F.relu(h)], axis=1)",
                                       "F.concat([h * 0.5, h], axis=1)")))
    g.shape = (g.width() * 2,) + g.shape[1:]
    return True


def _matmul(g, r):
    if g.img:
        return False
    w, out = g.name("w"), g.channels(r[0])
    g.init.append(f"self.{w} = M.Parameter(F.ones(({g.width()}, {out})))")
    g.fwd.append(f"h = {_pick(r, 1, ('h @ self.' + w, 'F.matmul(h, self.' + w + ')'))}")
    g.shape = (out,)
    return True


def _pad(g, r):
    if not g.img:
        return False
    if r[0] % 2:
        g.fwd.append("h = F.pad(h, ((0, 0), (0, 0), (1, 1), (0, 1)))")
        g.shape = (g.shape[0], g.shape[1] + 2, g.shape[2] + 1)
    else:
        if g.shape[1] * g.shape[2] * 4 > 256:
            return False
        g.fwd.append("h = F.interpolate(h, scale_factor=2, mode='nearest')")
        g.shape = (g.shape[0], g.shape[1] * 2, g.shape[2] * 2)
    return True


_REDUCE = ("h - h.mean(axis=1, keepdims=True)", "h / (h.std(axis=-1, keepdims=True) + 1.0)",
           "h * h.var(axis=1, keepdims=True, ddof=1)", "h - h.max(axis=-1, keepdims=True)",
           "h * F.prod(F.tanh(h), axis=1, keepdims=True)", "F.normalize(h, axis=1)",
           "h + h.sum(axis=0, keepdims=True)", "h * F.norm(h, axis=-1, keepdims=True)",
           "F.broadcast_to(h.min(axis=1, keepdims=True), h.shape) + h")


def _reduce(g, r):
    g.fwd.append(f"h = {_pick(r, 0, _REDUCE)}")
    return True


def _sort(g, r):
    kind = r[0] % 4
    if kind == 0:
        g.fwd.append(f"h = F.sort(h, descending={bool(r[1] % 2)}, axis=1)[0]")
    elif kind == 1:
        k = 1 + r[1] % g.width()
        g.fwd.append(f"h = F.topk(h, {k}, descending=True, axis=1)[0]")
        g.shape = (k,) + g.shape[1:]
    elif kind == 2:
        g.fwd.append("h = F.gather(h, 1, F.sort(h, axis=1)[1])")
    else:
        if g.width() % 2:
            return False
        g.fwd.append("a, b = F.split(h, 2, axis=1)")
        g.fwd.append("h = F.concat([b, a], axis=1)")
    return True


def _conv_x(g, r):
    """Dilated, transposed and grouped convs (builtin, less common)."""
    if not g.img:
        return False
    cin, hh, ww = g.shape
    m = g.name("convx")
    kind = r[0] % 3
    if kind == 0 and min(hh, ww) >= 5:
        g.init.append(f"self.{m} = M.Conv2d({cin}, {cin}, 3, padding=2, dilation=2)")
    elif kind == 1 and hh * ww * 4 <= 400:
        g.init.append(f"self.{m} = M.ConvTranspose2d({cin}, {g.channels(r[1])}, 2, stride=2)")
        g.shape = (g.channels(r[1]), hh * 2, ww * 2)
    elif cin % 2 == 0:
        g.init.append(f"self.{m} = M.Conv2d({cin}, {cin * 2 if cin <= 16 else cin}, 3, "
                      f"padding=1, groups=2)")
        g.shape = (cin * 2 if cin <= 16 else cin, hh, ww)
    else:
        return False
    g.fwd.append(f"h = self.{m}(h)")
    return True


def _embed(g, r):
    """Embedding of a second, integer input (``ids``), added on."""
    m, c = g.name("emb"), g.width()
    g.ids = True
    g.init.append(f"self.{m} = M.Embedding(10, {c})")
    tail = ".reshape(h.shape[0], -1, 1, 1)" if g.img else ""
    g.fwd.append(f"h = h + self.{m}(ids).{_pick(r, 0, ('mean', 'sum', 'max'))}(axis=1){tail}")
    return True


def _create(g, r):
    """Tensors made in forward, some of them by the batch's size."""
    c = g.width()
    rest = ", ".join(str(d) for d in g.shape[1:])
    full = f"(h.shape[0], {c}{', ' + rest if rest else ''})"
    opts = ["h + F.zeros_like(h)", f"h * F.ones({full})", "h - F.full_like(h, 0.5)",
            f"h + F.arange({c}).reshape(1, {c}{', 1' * len(g.shape[1:])})",
            f"h * mt.tensor(np.linspace(0.5, 1.5, {c}).astype('float32')).reshape(1, {c}"
            f"{', 1' * len(g.shape[1:])})",
            f"h + F.full({full}, 2.0) * 0.25"]
    g.fwd.append(f"h = {_pick(r, 0, opts)}")
    return True


def _shape(g, r):
    """Python numbers computed from the shape (the batch's size among them)."""
    opts = ["h / h.shape[0]", "h * (h.shape[1] ** 0.5)",
            "h.sum(axis=0, keepdims=True) / h.shape[0] + h",
            "h * float(h.shape[-1])", "h.reshape(h.shape[0], -1).reshape(h.shape)",
            "h * (h.shape[0] + 1) / (h.shape[0] + 2)"]
    # (a shape compared, ``h.shape[0] > 1``, is fixed in the graph with a
    # TraceWarning, as documented: not generated)
    g.fwd.append(f"h = {_pick(r, 0, opts)}")
    return True


def _index(g, r):
    """Integer-array and mask indexing, data-dependent shapes."""
    c = g.width()
    kind = r[0] % 5
    if kind == 0 and c >= 3:
        g.fwd.append("h = h[:, [2, 0, 1]]")
        g.shape = (3,) + g.shape[1:]
    elif kind == 1:
        b = g.name("perm")
        g.init.append(f"self.{b} = mt.tensor(np.arange({c})[::-1].copy().astype('int32'))")
        g.fwd.append(f"h = h[:, self.{b}]")
    elif kind == 2:
        e = g.name("sel")
        g.fwd.append(f"{e} = h[h > 0.5]")
        g.extras.append(e)
    elif kind == 3:
        g.fwd.append("h = F.where(h > 0, h, F.zeros_like(h)) + h[:, :1] * 0.5")
    else:
        g.fwd.append("h = h * 1.0")
        g.fwd.append("h[h > 1.0] = 1.0")
    return True


def _cast(g, r):
    line = _pick(r, 0, ("h.astype('float16').astype('float32')",
                        "F.floor(h * 8.0).astype('int32').astype('float32') / 8.0",
                        "(h > 0).astype('float32') * h",
                        "h.astype('float64').astype('float32')"))
    g.fwd.append("h = " + line)
    # a rounding step turns float32's last-bit differences (another sum
    # order in a fused kernel) into a whole step of its own
    if "float16" in line:
        g.rounding = g.rounding or ["rel", 2.0 ** -10]      # float16's ulp, relative
    elif "floor" in line:
        g.rounding = ["abs", 0.125]
    return True


# kind -> (family, weight, step)
STEPS = {
    "conv": ("builtin", 6, _conv),
    "convblock": ("builtin", 4, lambda g, r: _conv(g, r, bn=True)),
    "bn": ("builtin", 2, _bn),
    "act": ("builtin", 3, _act),
    "pool": ("builtin", 2, _pool),
    "norm": ("builtin", 2, _norm),
    "linear": ("builtin", 4, _linear),
    "to_vec": ("builtin", 2, _to_vec),
    "conv_x": ("builtin", 2, _conv_x),
    "reduce": ("ops", 2, _reduce),
    "sort": ("ops", 1, _sort),
    "unary": ("ops", 4, _unary),
    "binop": ("ops", 3, _binop),
    "concat": ("ops", 1, _concat),
    "matmul": ("ops", 1, _matmul),
    "pad": ("ops", 1, _pad),
    "view": ("view", 3, _view),
    "tied": ("tied", 2, _tied),
    "twice": ("twice", 2, _twice),
    "inplace": ("inplace", 3, _inplace),
    "bufwrite": ("bufwrite", 1, _bufwrite),
    "paramwrite": ("paramwrite", 1, _paramwrite),
    "alias": ("alias", 1, _alias),
    "container": ("container", 2, _container),
    "submodule": ("submodule", 2, _submodule),
    "int": ("int", 1, _int),
    "bool": ("bool", 1, _bool),
    "range": ("range", 1, _range),
    "attention": ("attention", 1, _attention),
    "residual": ("residual", 2, _residual),
    "mbblock": ("builtin", 2, _mbblock),
    "param_expr": ("ops", 2, _param_expr),
    "embed": ("builtin", 1, _embed),
    "create": ("create", 2, _create),
    "shape": ("shape", 2, _shape),
    "index": ("index", 2, _index),
    "cast": ("ops", 1, _cast),
    "device": ("device", 1, _device),
}


def make_spec(seed, case, without=()):
    """The spec of case ``case`` of ``seed`` (a JSON-able dict), with no step
    or feature of the families in ``without``."""
    rnd = random.Random(seed * 1_000_003 + case)
    kinds = [k for k, (fam, _, _) in STEPS.items() if fam not in without]
    weights = [STEPS[k][1] for k in kinds]
    on = {f: f not in without for f in CASE_FAMILIES}
    odd = on["odd"] and rnd.random() < 0.5
    chans = EVEN + (ODD if odd else ())
    if rnd.random() < 0.65:
        inp = [rnd.choice(chans), rnd.randint(3, 9), rnd.randint(3, 9)]
    else:
        inp = [rnd.choice(chans)]
    train = on["train"] and rnd.random() < 0.15
    batches = (2, 3, 4, 5) if train else (1, 2, 3, 4, 5)   # a training BatchNorm needs 2
    bt = rnd.choice(batches[:3])
    br = rnd.choice(batches) if on["batch"] and rnd.random() < 0.5 else bt
    br2 = rnd.choice(batches) if br != bt and rnd.random() < 0.5 else br   # the second call's
    steps = [[rnd.choice(kinds) if rnd.random() < 0.3 else rnd.choices(kinds, weights)[0],
              [rnd.randrange(1000) for _ in range(7)]]
             for _ in range(rnd.randint(1, MAX_STEPS))]
    return {"seed": seed, "case": case, "in": inp, "batch": [bt, br, br2], "steps": steps,
            "odd": odd, "nan": on["nan"] and rnd.random() < 0.3,
            "f64": on["f64"] and rnd.random() < 0.08,
            "train": train,
            "outputs": rnd.choice(("tuple", "dict", "list", "nested", "alias"))
            if on["outputs"] and rnd.random() < 0.3 else "plain",
            "data_seed": rnd.randrange(2 ** 31)}


def features(spec):
    """The step kinds and case features a spec uses (a signature's last part)."""
    out = {k for k, _ in spec["steps"]}
    for f in ("nan", "f64", "odd", "train"):
        if spec[f]:
            out.add(f)
    if len(set(spec["batch"])) > 1:
        out.add("batch")
    if spec["outputs"] != "plain":
        out.add("outputs")
    return sorted(out)


def families(spec):
    fams = {STEPS[k][0] for k, _ in spec["steps"]}
    return sorted(fams | (set(features(spec)) & set(CASE_FAMILIES)))


def _returns(g, form):
    outs = ["h"] + g.extras
    if form == "plain":
        return "return h" if len(outs) == 1 else f"return ({', '.join(outs)},)"
    if form == "tuple":
        return f"return ({', '.join(outs)}, h * 2.0)"
    if form == "list":
        return f"return [{', '.join(outs)}]"
    if form == "alias":     # one tensor twice, and the (maybe written) input itself
        return f"return ({', '.join(outs)}, h, x)"
    if form == "dict":
        return "return {" + ", ".join(f"'o{i}': {o}" for i, o in enumerate(outs)) + "}"
    return "return {'main': (h, [h + 1.0]), 'aux': {" + \
        ", ".join(f"'e{i}': {o}" for i, o in enumerate(outs)) + "}}"


def source(spec):
    """Python source of the spec's module: ``Net``, ``build()`` (a seeded
    Net in its mode), ``inputs(call)`` (call 0: the traced inputs; 1 and 2:
    the two compared calls), ``TRACE_BATCH`` and ``RUN_BATCH``."""
    g = _Gen(spec)
    for kind, r in spec["steps"]:
        if g.width() > MAX_CHANNELS * 64:
            break
        STEPS[kind][2](g, r)
    dt = "float64" if spec["f64"] else "float32"
    lines = [f"# fuzz_pipeline seed {spec['seed']} case {spec['case']}",
             "import numpy as np", "import mgtrace as mt", "import mgtrace.functional as F",
             "import mgtrace.module as M", "", ""]
    for cls in g.classes:
        lines += cls + ["", ""]
    lines += ["class Net(M.Module):", "    def __init__(self):", "        super().__init__()"]
    lines += ["        " + ln for ln in g.init]
    lines += ["", f"    def forward(self, x{', ids' if g.ids else ''}):", "        h = x"]
    lines += ["        " + ln for ln in g.fwd] + ["        " + _returns(g, spec["outputs"])]
    bt, br, br2 = (spec["batch"] * 2)[:3] if len(spec["batch"]) == 2 else spec["batch"]
    if g.rounding:
        lines += ["", "", f"ROUNDING = {g.rounding!r}     # forward rounds: outputs may differ by a step"]
    lines += ["", "", f"TRACE_BATCH, RUN_BATCH = {bt}, {br}" + (
        f"\nSECOND_BATCH = {br2}     # the second call's" if br2 != br else ""), "", "",
              "def build():",
              f"    rng = np.random.default_rng({spec['data_seed']})",
              "    net = Net()",
              "    seen = set()",
              "    for name, t in list(net.named_parameters()) + list(net.named_buffers()):",
              "        if id(t) in seen or t.dtype.name != 'float32':",
              "            continue",
              "        seen.add(id(t))",
              "        if name.endswith('running_var'):",
              "            v = rng.uniform(0.5, 1.5, t.shape)",
              "        else:",
              "            fan = int(np.prod(t.shape[1:])) if t.ndim > 1 else 4",
              "            v = rng.standard_normal(t.shape) / np.sqrt(fan)",
              "        t[...] = mt.tensor(v.astype('float32'))",
              f"    return net.{'train' if spec['train'] else 'eval'}()",
              "", "",
              "def inputs(call):",
              f"    rng = np.random.default_rng({spec['data_seed']} + call)",
              "    batch = TRACE_BATCH if call == 0 else RUN_BATCH" + (
                  " if call == 1 else SECOND_BATCH" if br2 != br else ""),
              f"    x = rng.standard_normal((batch,) + {tuple(spec['in'])!r}).astype('{dt}')"]
    if spec["nan"]:
        lines += ["    idx = rng.integers(0, 1 << 20, 4)",
                  "    x.flat[idx % x.size] = [np.nan, np.inf, -np.inf, -0.0]"]
    if g.ids:
        lines += ["    ids = rng.integers(0, 10, (batch, 3)).astype('int32')",
                  "    return (mt.tensor(x), mt.tensor(ids))", ""]
    else:
        lines += ["    return (mt.tensor(x),)", ""]
    return "\n".join(lines)


def load_source(src):
    """Exec a case's source; returns its namespace (build, inputs, ...)."""
    ns = {"__name__": "fuzz_case"}
    exec(compile(src, "<fuzz case>", "exec"), ns)       # noqa: S102  our own generated source
    return ns


# -------------------------------------------------------------- variants
def _save_bytes(m, **kw):
    import mgtrace as mt
    buf = io.BytesIO()
    mt.save(m, buf, **kw)
    return buf.getvalue()


def _load_copy(tm):
    import mgtrace as mt
    return mt.load(io.BytesIO(_save_bytes(tm)))


def _load_mmap(tm):
    import mgtrace as mt
    fd, path = tempfile.mkstemp(suffix=".tmod", dir=_tmpdir())
    os.close(fd)
    try:
        mt.save(tm, path)
        return mt.load(path, mmap=True)     # the mapping outlives the unlinked name
    finally:
        os.unlink(path)


def _load_v10(tm):
    import mgtrace as mt
    return mt.load(io.BytesIO(_save_bytes(tm, target_version=(1, 0))))


def _to_folder(tm):
    """tm.to_folder(...) imported back: the package's plain Module."""
    import importlib
    folder = tempfile.mkdtemp(dir=_tmpdir())
    name = f"fuzz_pkg_{os.path.basename(folder)}"
    tm.to_folder(os.path.join(folder, name), "Net")
    sys.path.insert(0, folder)
    try:
        importlib.invalidate_caches()
        return importlib.import_module(name).Net()
    finally:
        sys.path.remove(folder)


def _optimize(tm):
    from mgtrace.traced_module import optimize
    return optimize(tm)


def _optimize_all(tm):
    from mgtrace.traced_module import optimize
    return optimize(tm, "all", flatten=True)


def _optimize_all_load(tm):
    return _load_copy(_optimize_all(tm))


def _optimize_all_v10(tm):
    return _load_v10(_optimize_all(tm))


# name -> how it is made from the fresh trace; the order is the order a
# failure is blamed in (a traced failure explains the others)
VARIANTS = {
    "traced": lambda tm: tm,
    "deepcopy": copy.deepcopy,
    "load_copy": _load_copy,
    "load_mmap": _load_mmap,
    "load_v1_0": _load_v10,
    "optimize": _optimize,
    "optimize_all_flat": _optimize_all,
    "optimize_all_flat_load": _optimize_all_load,
    "optimize_all_flat_v1_0": _optimize_all_v10,     # fused ops are format 1.1: often refused
    "to_folder": _to_folder,
}

# (variant, stage, exception type, words its message must hold): a refusal
# that names why is allowed, and counted
REFUSALS = [
    ("load_v1_0", "derive", ValueError, ("1.0",)),
    ("optimize_all_flat_v1_0", "derive", ValueError, ("1.0",)),
    ("load_mmap", "call", ValueError, ("read-only",)),
    # a traced module holding modules or tensors in list/dict attributes
    ("to_folder", "derive", ValueError, ("to_folder", "does not write")),
]


def _refused(variant, stage, exc):
    return any(v == variant and s == stage and isinstance(exc, t) and
               all(w in str(exc) for w in words) for v, s, t, words in REFUSALS)


def _tmpdir():
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


# ------------------------------------------------------------- comparing
class Mismatch(Exception):
    """One way a variant differs from eager: ``kind`` (stable, short) and
    ``detail`` (for people)."""

    def __init__(self, kind, detail, err=None):
        super().__init__(f"{kind}: {detail}")
        self.kind, self.detail, self.err = kind, detail, err


def _snap(obj):
    """Flatten outputs to ``(treedef string, [NumPy arrays or plain values])``."""
    import mgtrace as mt
    from mgtrace.traced_module.pytree import tree_flatten
    leaves, tree = tree_flatten(obj, lambda t: isinstance(t, mt.Tensor))
    return _tree_str(obj), [t.numpy().copy() if isinstance(t, mt.Tensor) else t for t in leaves]


def _tree_str(obj):
    import mgtrace as mt
    if isinstance(obj, mt.Tensor):
        return f"T@{obj.device}"
    if isinstance(obj, dict):
        return "{" + ",".join(f"{k!r}:{_tree_str(v)}" for k, v in obj.items()) + "}"
    if isinstance(obj, (list, tuple)):
        o, c = ("[", "]") if isinstance(obj, list) else ("(", ")")
        return o + ",".join(_tree_str(v) for v in obj) + c
    return repr(obj)


def compare_array(want, got, where, rounding=None):
    """Raise Mismatch unless ``got`` equals ``want`` under the fuzzer's rule;
    ``rounding`` (``["rel", r]`` or ``["abs", a]``, a module's ROUNDING)
    allows each float element one rounding step more."""
    if not isinstance(got, np.ndarray) or not isinstance(want, np.ndarray):
        if not (type(want) is type(got) and (want == got or want != want and got != got)):
            raise Mismatch("value", f"{where}: {got!r} != {want!r}")
        return
    if got.dtype != want.dtype:
        raise Mismatch("dtype", f"{where}: {got.dtype} != {want.dtype}")
    if got.shape != want.shape:
        raise Mismatch("shape", f"{where}: {got.shape} != {want.shape}")
    if want.dtype.kind not in "fc":
        if not np.array_equal(got, want):
            bad = int(np.sum(got != want))
            raise Mismatch("int", f"{where}: {bad} of {want.size} differ")
        return
    w, g = want.astype(np.float64), got.astype(np.float64)
    if not np.array_equal(np.isnan(w), np.isnan(g)):
        raise Mismatch("nan", f"{where}: NaN at {int(np.isnan(g).sum())} places, "
                              f"eager {int(np.isnan(w).sum())} (at other places)")
    if not np.array_equal(np.where(np.isinf(w), w, 0), np.where(np.isinf(g), g, 0)):
        raise Mismatch("inf", f"{where}: inf places or signs differ")
    fin = np.isfinite(w)
    if not fin.any():
        return
    scale = float(np.max(np.abs(w[fin])))
    tol = TOL.get(want.dtype.name, 1e-5) * scale
    diff = np.abs(w[fin] - g[fin])
    if rounding:
        kind, step = rounding
        diff = np.maximum(diff - (step * np.abs(w[fin]) if kind == "rel" else step), 0.0)
    err = float(np.max(diff))
    if err > tol:
        raise Mismatch("value", f"{where}: max error {err:.3g} > {tol:.3g} (scale {scale:.3g})",
                       err)


def compare(want, got, rounding=None):
    (wt, wl), (gt, gl) = want, got
    if wt != gt:
        raise Mismatch("structure", f"outputs {gt[:120]} != {wt[:120]}")
    for i, (a, b) in enumerate(zip(wl, gl)):
        compare_array(a, b, f"output {i}", rounding)


def _state(m, params):
    """Buffers and parameters by state_dict name, as arrays: every parameter
    when ``params`` is True, else those named in it (a set)."""
    keep = {k for k, _ in m.named_buffers()}
    return {k: v.numpy().copy() for k, v in m.state_dict().items()
            if params is True or k in keep or k in params}


def _changed(want):
    """The state_dict names whose values eager's calls changed."""
    return {k for _, before, after, _ in want for k, w in after.items()
            if k in before and not np.array_equal(before[k], w, equal_nan=w.dtype.kind == "f")}


def compare_state(before, want, got):
    """State after a call: every tensor both hold equal; one eager changed
    in this call must be there."""
    for k, w in want.items():
        if k in got:
            try:
                compare_array(w, got[k], f"state {k!r}")
            except Mismatch as e:
                raise Mismatch("state-" + e.kind, e.detail, e.err) from None
        elif k in before and not np.array_equal(before[k], w, equal_nan=w.dtype.kind == "f"):
            raise Mismatch("state-missing", f"state {k!r} changed in eager, not held")


def compare_inputs(want, got):
    for i, (a, b) in enumerate(zip(want, got)):
        try:
            compare_array(a, b, f"input {i} after the call")
        except Mismatch as e:
            raise Mismatch("input-" + e.kind, e.detail, e.err) from None


# ---------------------------------------------------------------- a case
def _np_inputs(ns, call):
    return [t.numpy().copy() for t in ns["inputs"](call)]


def _tensors(arrays):
    import mgtrace as mt
    return tuple(mt.tensor(a.copy()) for a in arrays)


def _calls(module, ns, inputs_np, params=True):
    """Call ``module`` on each call's inputs; ``[(outputs, state_before,
    state_after, inputs_after)]`` (state: see _state)."""
    out = []
    for arrays in inputs_np:
        before = _state(module, params)
        xs = _tensors(arrays)
        y = _snap(module(*xs))
        out.append((y, before, _state(module, params), [x.numpy().copy() for x in xs]))
    return out


class Invalid(Exception):
    """The generated module fails in eager: no reference (counted, not failed)."""


def _eager_at_trace_inputs(ns, error):
    """Raise Invalid when eager itself fails as the trace did on the trace's
    inputs (the reference calls run at another batch: ``h.view(n, -1)`` of
    a permuted tensor is a view only at batch 1)."""
    try:
        with np.errstate(all="ignore"):
            ns["build"]()(*_tensors(_np_inputs(ns, 0)))
    except Exception as e:                  # noqa: BLE001
        if type(e) is type(error):
            raise Invalid(f"{type(e).__name__} at the trace's inputs: {e}") from None


def reference(ns):
    """Eager's two calls on a fresh module (the reference)."""
    inputs_np = [_np_inputs(ns, 1), _np_inputs(ns, 2)]
    try:
        with np.errstate(all="ignore"):
            return inputs_np, _calls(ns["build"](), ns, inputs_np)
    except Exception as e:                  # noqa: BLE001  a generator dead end
        raise Invalid(f"{type(e).__name__}: {e}") from None


def check(ns, variants=None, ref=None):
    """Run the case in namespace ``ns`` through ``variants`` (default all).

    Returns ``(failures, refusals)``: failures ``[(variant, kind, detail)]``
    in VARIANTS order, refusals ``[(variant, stage)]``. Raises Invalid when
    eager itself fails."""
    import mgtrace as mt
    inputs_np, want = ref or reference(ns)
    names = list(VARIANTS) if variants is None else [v for v in VARIANTS if v in variants]
    failures, refusals = [], []
    from mgtrace.traced_module import TraceWarning
    try:
        with warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("always", TraceWarning)
            tm = mt.trace_module(ns["build"](), *_tensors(_np_inputs(ns, 0)))
    except Exception as e:                  # noqa: BLE001
        _eager_at_trace_inputs(ns, e)
        return [("traced", f"trace-error:{type(e).__name__}", str(e)[:300])], refusals
    # a documented specialisation (a shape compared, int()) warns: failures then say so
    note = next((f" [{WARNED}: {w.message}]" for w in warned
                 if issubclass(w.category, TraceWarning)), "")
    # the trace said it fixed a shape-derived number (issue 29 item 11: never
    # silent): a call at another batch may then differ, as the warning says
    specialised = any(issubclass(w.category, TraceWarning) and "shape-derived number" in
                      str(w.message) for w in warned)
    sens = []
    made = {}
    for v in names:                         # every variant from the fresh trace, before any call
        try:
            made[v] = VARIANTS[v](tm)
        except Exception as e:              # noqa: BLE001
            if _refused(v, "derive", e):
                refusals.append((v, "derive"))
            else:
                failures.append((v, f"derive-error:{type(e).__name__}", str(e)[:300]))
    for v, m in made.items():
        try:
            # optimizing rewrites parameters (a BatchNorm folded into a conv's
            # weight): of its modules the buffers are compared, and the
            # parameters the forward writes (which no pass may fold)
            _check_calls(m, ns, inputs_np, want,
                         params=_changed(want) if v.startswith("optimize") else True)
        except Mismatch as e:
            if e.err is not None and _ill_conditioned(e.err, ns, inputs_np, want, sens):
                refusals.append((v, "ill-conditioned"))
            elif specialised:
                refusals.append((v, "warned"))
            else:
                failures.append((v, e.kind, e.detail[:300] + note[:200]))
        except Exception as e:              # noqa: BLE001
            if _refused(v, "call", e):
                refusals.append((v, "call"))
            elif specialised:
                refusals.append((v, "warned"))
            else:
                failures.append((v, f"error:{type(e).__name__}", str(e)[:300] + note[:200]))
    return failures, refusals


WARNED = "trace warned"
ILL_FACTOR = 10


def _ill_conditioned(err, ns, inputs_np, want, memo):
    """Whether an error is within what rounding explains: eager itself moves
    by at least ``err / ILL_FACTOR`` when every float parameter, buffer and
    input is nudged by 2 ulp (a folded BatchNorm rounds the weights so; a
    norm of nearly equal values, ``h % 1.0`` of large values or a difference
    of nearly equal ones scale that up past the output's scale)."""
    if not memo:
        memo.append(_sensitivity(ns, inputs_np, want))
    return err <= ILL_FACTOR * memo[0]


def _nudge(a, rng):
    if a.dtype.kind != "f":
        return a
    return (a * (1 + np.ldexp(2.0, -23) * rng.choice((-1.0, 1.0), a.shape))).astype(a.dtype)


def _sensitivity(ns, inputs_np, want):
    """The largest change of eager's float outputs (both calls) under _nudge."""
    import mgtrace as mt
    rng = np.random.default_rng(0)
    try:
        net = ns["build"]()
        for _, t in list(net.named_parameters()) + list(net.named_buffers()):
            if t.dtype.name == "float32":
                t[...] = mt.tensor(_nudge(t.numpy(), rng))
        got = _calls(net, ns, [[_nudge(a, rng) for a in arrays] for arrays in inputs_np])
    except Exception:                       # noqa: BLE001  no estimate: nothing excused
        return 0.0
    worst = 0.0
    for (wy, *_), (gy, *_) in zip(want, got):
        for a, b in zip(wy[1], gy[1]):
            if isinstance(a, np.ndarray) and a.dtype.kind == "f" and a.shape == b.shape:
                fin = np.isfinite(a) & np.isfinite(b)
                if fin.any():
                    worst = max(worst, float(np.max(np.abs(a[fin].astype(np.float64) - b[fin]))))
    return worst


def _check_calls(m, ns, inputs_np, want, params):
    got = _calls(m, ns, inputs_np, params)
    for call, ((wy, wb, ws, wi), (gy, _, gs, gi)) in enumerate(zip(want, got), 1):
        try:
            compare(wy, gy, ns.get("ROUNDING"))
            compare_state(wb, ws, gs)
            compare_inputs(wi, gi)
        except Mismatch as e:
            raise Mismatch(e.kind + ("@2" if call == 2 else ""), e.detail, e.err) from None


def run_namespace(ns, variants=None):
    """``check``, warnings silenced (tracing warns of what it specialises:
    the fuzzer judges by values)."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return check(ns, variants)


def run_spec(spec, variants=None):
    """``check`` of a spec's module (see run_namespace)."""
    return run_namespace(load_source(source(spec)), variants)


# -------------------------------------------------------------- shrinking
def _kind_root(kind):
    """A kind without its call number (``value@2`` and ``value`` shrink alike)."""
    return kind.split("@")[0]


def fails_like(spec, variant, kind):
    """Whether ``spec`` still fails ``variant`` with ``kind`` (in-process)."""
    try:
        failures, _ = run_spec(spec, [variant])
    except Invalid:
        return False
    return any(v == variant and _kind_root(k) == _kind_root(kind) for v, k, _ in failures)


def _candidates(spec):
    """Smaller specs, the biggest cuts first."""
    steps = spec["steps"]
    n = len(steps)
    for size in sorted({n // 2, 2, 1} - {0}, reverse=True):
        for i in range(0, n, size):
            if n - size >= 1 and i + size <= n:
                yield dict(spec, steps=steps[:i] + steps[i + size:])
    for key, plain in (("nan", False), ("f64", False), ("train", False), ("outputs", "plain"),
                       ("odd", False)):
        if spec[key] != plain:
            yield dict(spec, **{key: plain})
    if len(set(spec["batch"])) > 1:
        yield dict(spec, batch=[spec["batch"][0]] * len(spec["batch"]))
        if len(spec["batch"]) == 3 and spec["batch"][2] != spec["batch"][1]:
            yield dict(spec, batch=spec["batch"][:2] + spec["batch"][1:2])
    if len(spec["in"]) == 3 and max(spec["in"][1:]) > 3:
        yield dict(spec, **{"in": [spec["in"][0], max(3, spec["in"][1] - 2),
                                   max(3, spec["in"][2] - 2)]})
    if spec["batch"][0] > 1 and len(set(spec["batch"])) == 1 and not spec["train"]:
        yield dict(spec, batch=[1] * len(spec["batch"]))


def shrink(spec, still_fails, budget=80):
    """The smallest spec found (a greedy pass over _candidates, repeated)
    for which ``still_fails(spec)`` holds; at most ``budget`` tries."""
    tries = 0
    changed = True
    while changed and tries < budget:
        changed = False
        for cand in _candidates(spec):
            if tries >= budget:
                break
            tries += 1
            if still_fails(cand):
                spec, changed = cand, True
                break
    return _prune(spec, still_fails)


def _prune(spec, still_fails):
    """Drop the steps that added nothing to the source (they did not fit the
    shape they met), so the shrunk spec reads as its source does."""
    src = source(spec)
    for i in reversed(range(len(spec["steps"]))):
        cand = dict(spec, steps=spec["steps"][:i] + spec["steps"][i + 1:])
        if len(spec["steps"]) > 1 and _body(source(cand)) == _body(src):
            spec = cand
    return spec


def _body(src):
    return re.sub(r"([a-z]+)\d+", r"\1", src.split("TRACE_BATCH")[0])


def signature(spec, variant, kind):
    """``variant/kind/features``: what failed, how, and with what (of the
    shrunk spec), stable across runs and seeds."""
    return f"{variant}/{kind}/{'+'.join(features(spec))}"


# ---------------------------------------------------------------- workers
SHRINK_PER_KEY = 3      # failures shrunk per (variant, kind, families) in a worker


def _first(failures):
    order = list(VARIANTS)
    return min(failures, key=lambda f: order.index(f[0]))


def _one_case(seed, i, without, seen):
    """Run case ``i``; a record for the log (JSON-able)."""
    spec = make_spec(seed, i, without)
    t0 = time.perf_counter()
    rec = {"done": i}
    try:
        failures, refusals = run_spec(spec)
    except Invalid as e:
        rec.update(invalid=str(e)[:200], seconds=time.perf_counter() - t0)
        return rec
    rec.update(seconds=time.perf_counter() - t0, refusals=refusals)
    if failures:
        variant, kind, detail = _first(failures)
        key = f"{variant}/{_kind_root(kind)}/{'+'.join(families(spec))}"
        n, sig, small = seen.get(key, (0, None, None))
        shrunk = n < SHRINK_PER_KEY
        if shrunk:
            small = shrink(spec, lambda c: fails_like(c, variant, kind))
            # the shrunk module's own failure: its detail, and whether its trace warned
            again = [f for f in run_spec(small, [variant])[0] if f[0] == variant]
            detail = again[0][2] if again else detail
            sig = signature(small, variant, _kind_root(kind))
            sig += "+warned" if WARNED in detail else ""
        seen[key] = (n + 1, sig, small)
        rec["fail"] = {"case": i, "seed": seed, "variant": variant, "kind": kind,
                       "detail": detail, "signature": sig, "shrunk": shrunk, "spec": small,
                       "case_spec": spec, "also": sorted({v for v, _, _ in failures} - {variant})}
    return rec


def worker(seed, start, count, out, without, deadline):
    """Run cases ``start .. start + count`` (until ``deadline``, a time.time()),
    writing to ``out`` a line before each case (``{"at": i}``: a worker that
    dies leaves its case named) and its record after it."""
    import mgtrace as mt
    mt.set_num_threads(1)               # one core a worker: the rate is per core
    seen = {}
    with open(out, "a") as log:
        for i in range(start, start + count):
            if deadline and time.time() > deadline:
                break
            log.write(json.dumps({"at": i}) + "\n")
            log.flush()
            log.write(json.dumps(_one_case(seed, i, without, seen)) + "\n")
            log.flush()


def _probe(spec, variants=None, timeout=HANG_S):
    """Run a spec in a subprocess: ``"crash"``, ``"hang"`` or ``"ok"``."""
    cmd = [sys.executable, HERE, "--probe", json.dumps(spec)] + (
        ["--variants", ",".join(variants)] if variants else [])
    try:
        p = subprocess.run(cmd, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "hang"
    return "ok" if p.returncode in (0, 1) else "crash"


def _died(seed, case, without, what, shrink_crashes):
    """The record of a case whose worker crashed or hung, shrunk in
    subprocesses (the variant found by probing each alone)."""
    spec = make_spec(seed, case, without)
    small, variant = spec, "?"
    if shrink_crashes:
        small = shrink(spec, lambda c: _probe(c, timeout=30) == what, budget=30)
        variant = next((v for v in VARIANTS if _probe(small, [v], timeout=30) == what), "eager")
    return {"case": case, "seed": seed, "variant": variant, "kind": what,
            "detail": f"the worker process {'died' if what == 'crash' else 'stopped answering'}",
            "signature": signature(small, variant, what), "shrunk": shrink_crashes,
            "spec": small, "case_spec": spec, "also": []}


class _Worker:
    def __init__(self, args, start, count, log):
        self.start, self.count, self.log = start, count, log
        self.p = subprocess.Popen([sys.executable, HERE, "--worker", json.dumps(
            {"seed": args.seed, "start": start, "count": count, "out": log,
             "without": sorted(args.without), "deadline": args.deadline})])
        self.last_change = time.time()
        self.size = 0

    def lines(self):
        if not os.path.exists(self.log):
            return []
        with open(self.log) as f:
            return [json.loads(ln) for ln in f if ln.endswith("\n")]

    def stalled(self):
        size = os.path.getsize(self.log) if os.path.exists(self.log) else 0
        if size != self.size:
            self.size, self.last_change = size, time.time()
        return time.time() - self.last_change > HANG_S


CHUNK = 250             # cases a worker process runs before a fresh one takes over


def run(n, jobs=1, seed=1, without=(), time_limit=None, quiet=False, shrink_crashes=True):
    """Run ``n`` cases of ``seed`` in ``jobs`` worker processes (each a fresh
    process every CHUNK cases), at most ``time_limit`` seconds. Returns the
    summary (see summarize)."""
    args = argparse.Namespace(seed=seed, without=set(without),
                              deadline=time.time() + time_limit if time_limit else None)
    tmp = tempfile.mkdtemp(prefix="mgtrace-fuzz-pipeline-")
    todo = [(s, min(CHUNK, n - s)) for s in range(0, n, CHUNK)]
    records, running, t0, k, shown = [], [], time.perf_counter(), 0, time.perf_counter()
    while todo or running:
        while todo and len(running) < max(1, jobs):
            k += 1
            start, count = todo.pop(0)
            running.append(_Worker(args, start, count, os.path.join(tmp, f"w{k}.jsonl")))
        time.sleep(0.05)
        for w in list(running):
            hung = w.p.poll() is None and w.stalled()
            if hung:
                w.p.kill()
                w.p.wait()
            if w.p.poll() is None:
                continue
            running.remove(w)
            lines = w.lines()
            if os.path.exists(w.log):
                os.unlink(w.log)
            records += [ln for ln in lines if "done" in ln]
            done = {ln["done"] for ln in lines if "done" in ln}
            at = [ln["at"] for ln in lines if "at" in ln and ln["at"] not in done]
            if (w.p.returncode != 0 or hung) and at:
                what = "hang" if hung else "crash"
                records.append({"done": at[0], "seconds": 0.0,
                                "fail": _died(seed, at[0], args.without, what, shrink_crashes)})
                rest = w.start + w.count - at[0] - 1
                if rest > 0:
                    todo.insert(0, (at[0] + 1, rest))
            elif w.p.returncode != 0:
                raise RuntimeError(f"a fuzz worker failed before its first case (exit "
                                   f"{w.p.returncode}); see its error above")
        if not quiet and time.perf_counter() - shown > 30:
            shown = time.perf_counter()
            print(f"  {len(records)} cases, {sum('fail' in r for r in records)} failing, "
                  f"{shown - t0:.0f} s", file=sys.stderr)
    os.rmdir(tmp)
    return summarize(records, seed, sorted(args.without), time.perf_counter() - t0, jobs)


def summarize(records, seed, without, seconds, jobs):
    """Counts, ``failures`` (a record per failing case, by case number) and
    ``by_signature`` (count, first cases, an example: shrunk when one was),
    the most frequent first; ``modules_per_core_second`` counts checking
    time alone (no shrinking, no process start)."""
    fails = sorted((r["fail"] for r in records if "fail" in r), key=lambda f: f["case"])
    by_sig = {}
    for f in fails:
        s = by_sig.setdefault(f["signature"], {"count": 0, "cases": [], "example": f})
        s["count"] += 1
        if len(s["cases"]) < 10:
            s["cases"].append(f["case"])
        if f["shrunk"] and not s["example"]["shrunk"]:
            s["example"] = f
    refusals = {}
    for r in records:
        for v, stage in r.get("refusals", ()):
            refusals[f"{v}@{stage}"] = refusals.get(f"{v}@{stage}", 0) + 1
    invalid = {}
    for r in records:
        if "invalid" in r:
            why = r["invalid"][:90]
            invalid[why] = invalid.get(why, 0) + 1
    busy = sum(r.get("seconds", 0.0) for r in records)
    return {"seed": seed, "without": without, "cases": len(records),
            "checked": sum(1 for r in records if "invalid" not in r),
            "invalid": sum(1 for r in records if "invalid" in r),
            "failing": len(fails), "refusals": refusals, "invalid_why": invalid,
            "seconds": round(seconds, 1), "jobs": jobs,
            "modules_per_core_second": round(len(records) / busy, 1) if busy else None,
            "by_signature": dict(sorted(by_sig.items(), key=lambda kv: -kv[1]["count"])),
            "failures": fails}


# ------------------------------------------------------------ regressions
def _slug(sig):
    return re.sub(r"[^a-z0-9]+", "_", sig.lower()).strip("_")[:90]


def regression_source(fail):
    """A pytest file for a failure: the shrunk module, and a test that its
    variant equals eager. It is marked xfail(strict=True) as an open bug:
    once fixed, the XPASS fails, and the mark is removed."""
    spec, sig = fail["spec"], fail["signature"]
    body = source(spec).split("import mgtrace.module as M\n", 1)[1]
    detail = fail["detail"].replace('"""', "'''")
    return f'''"""Fuzz regression {sig}: {fail["variant"]} differs from eager ({fail["kind"]}).

Found by scripts/fuzz_pipeline.py --seed {fail["seed"]}, case {fail["case"]} (shrunk):
{detail}
"""
from pathlib import Path
import importlib.util

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module as M
{body}

VARIANT = {fail["variant"]!r}


def _fuzz():
    here = Path(__file__).resolve()
    root = next(p for p in here.parents if (p / "scripts" / "fuzz_pipeline.py").exists())
    spec = importlib.util.spec_from_file_location("fuzz_pipeline", root / "scripts" / "fuzz_pipeline.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.xfail(strict=True, reason="open: {sig}")
def test_{_slug(sig)}():
    failures, _ = _fuzz().run_namespace(globals(), [VARIANT])
    assert failures == []
'''


def save_regressions(summary, folder):
    """One pytest file per signature (its shrunk example); returns the paths.
    Crashes and hangs are left out: they would take the test run down."""
    os.makedirs(folder, exist_ok=True)
    init = os.path.join(folder, "__init__.py")
    if not os.path.exists(init):
        open(init, "w").close()
    paths = []
    for sig, s in summary["by_signature"].items():
        if s["example"]["kind"] in ("crash", "hang"):
            continue
        path = os.path.join(folder, f"test_{_slug(sig)}.py")
        with open(path, "w") as f:
            f.write(regression_source(s["example"]))
        paths.append(path)
    return paths


# ---------------------------------------------------------------- report
def forward_source(spec):
    """The shrunk module's classes and Net, compactly (for the report)."""
    body = source(spec).split("import mgtrace.module as M\n", 1)[1].split("\n\nTRACE_BATCH")[0]
    extra = [f"{k}={spec[k]}" for k in ("nan", "f64", "train") if spec[k]]
    if len(set(spec["batch"])) > 1:
        extra.append(f"traced at batch {spec['batch'][0]}, called at "
                     + " then ".join(str(b) for b in spec["batch"][1:]))
    head = f"# input {tuple(spec['in'])}" + ("; " + ", ".join(extra) if extra else "")
    return head + "\n" + "\n".join(ln for ln in body.strip("\n").splitlines() if ln.strip())


def print_summary(summary, out=sys.stdout):
    s = summary
    print(f"seed {s['seed']}: {s['cases']} cases ({s['checked']} checked, {s['invalid']} invalid), "
          f"{s['failing']} failing, {len(s['by_signature'])} signatures; {s['seconds']} s with "
          f"{s['jobs']} job(s), {s['modules_per_core_second']} modules/s a core"
          + (f"; without {','.join(s['without'])}" if s["without"] else ""), file=out)
    print(f"allowed (refusals that name why; ill-conditioned: within what 2-ulp nudges of "
          f"eager explain): {json.dumps(s['refusals'])}", file=out)
    if s.get("invalid_why"):
        print(f"invalid (eager itself fails: no reference): {json.dumps(s['invalid_why'])}",
              file=out)
    for sig, b in s["by_signature"].items():
        ex = b["example"]
        print(f"\n== {sig}: {b['count']} case(s), e.g. {b['cases'][:5]}"
              f"{'' if ex['shrunk'] else ' (not shrunk)'}", file=out)
        print(f"   {ex['variant']} {ex['kind']}: {ex['detail']}"
              + (f"; also {', '.join(ex['also'])}" if ex["also"] else ""), file=out)
        print(f"   reproduce: python {os.path.relpath(HERE)} --case {ex['seed']} {ex['case']}"
              + (f" --without {','.join(s['without'])}" if s["without"] else ""), file=out)
        print("   " + forward_source(ex["spec"]).replace("\n", "\n   "), file=out)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        a = json.loads(argv[1])
        worker(a["seed"], a["start"], a["count"], a["out"], set(a["without"]), a["deadline"])
        return 0
    if argv[:1] == ["--probe"]:
        variants = argv[3].split(",") if argv[2:3] == ["--variants"] else None
        try:
            failures, _ = run_spec(json.loads(argv[1]), variants)
        except Invalid:
            return 0
        return 1 if failures else 0
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("-n", type=int, default=1000, help="cases (default 1000)")
    p.add_argument("-j", "--jobs", type=int, default=1, help="worker processes (default 1)")
    p.add_argument("--seed", type=int, default=1, help="RNG seed (cases are reproducible)")
    p.add_argument("--without", default="", help="feature families left out, comma-separated: "
                   + ",".join(FAMILIES))
    p.add_argument("--time-limit", type=float, default=None,
                   help="seconds; no case starts after them")
    p.add_argument("--save-regressions", metavar="DIR", help="a pytest file per signature")
    p.add_argument("--json", metavar="FILE", help="write the whole summary as JSON")
    p.add_argument("--case", nargs=2, type=int, metavar=("SEED", "N"),
                   help="print one case's source and its result")
    p.add_argument("--no-shrink-crashes", action="store_true",
                   help="report crashes and hangs unshrunk (shrinking them takes subprocesses)")
    args = p.parse_args(argv)
    without = {w for w in args.without.split(",") if w}
    unknown = without - set(FAMILIES)
    if unknown:
        p.error(f"unknown families {sorted(unknown)}; the families are {', '.join(FAMILIES)}")
    if args.case:
        spec = make_spec(args.case[0], args.case[1], without)
        print(source(spec))
        failures, refusals = run_spec(spec)
        print(json.dumps({"failures": failures, "refusals": refusals}, indent=1))
        return 1 if failures else 0
    summary = run(args.n, args.jobs, args.seed, without, args.time_limit,
                  shrink_crashes=not args.no_shrink_crashes)
    print_summary(summary)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    if args.save_regressions:
        for path in save_regressions(summary, args.save_regressions):
            print(f"wrote {path}")
    return 1 if summary["failing"] else 0


if __name__ == "__main__":
    sys.exit(main())
