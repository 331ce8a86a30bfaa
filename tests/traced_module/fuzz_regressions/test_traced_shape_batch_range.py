"""Fuzz regression traced/shape/batch+range: traced differs from eager (shape).

Shrunk from python scripts/fuzz_pipeline.py -n 20000 --seed 1 (495 of its failing cases, e.g. 37);
issue 29 item 11: range(h.shape[0]) is fixed at the traced batch (Python reads
an int subclass there without asking it), which the trace now says with a
TraceWarning at the user's line. What this module gave, silently:
output 0: (3, 8) != (5, 8)
"""
from pathlib import Path
import importlib.util

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module as M


class Net(M.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        h = x
        h = F.stack([h[i] * float(i + 1) for i in range(h.shape[0])])
        return h


TRACE_BATCH, RUN_BATCH = 3, 5


def build():
    rng = np.random.default_rng(2)
    net = Net()
    seen = set()
    for name, t in list(net.named_parameters()) + list(net.named_buffers()):
        if id(t) in seen or t.dtype.name != 'float32':
            continue
        seen.add(id(t))
        if name.endswith('running_var'):
            v = rng.uniform(0.5, 1.5, t.shape)
        else:
            fan = int(np.prod(t.shape[1:])) if t.ndim > 1 else 4
            v = rng.standard_normal(t.shape) / np.sqrt(fan)
        t[...] = mt.tensor(v.astype('float32'))
    return net.eval()


def inputs(call):
    rng = np.random.default_rng(2 + call)
    batch = TRACE_BATCH if call == 0 else RUN_BATCH
    x = rng.standard_normal((batch,) + (8,)).astype('float32')
    return (mt.tensor(x),)


VARIANT = 'traced'


def _fuzz():
    here = Path(__file__).resolve()
    root = next(p for p in here.parents if (p / "scripts" / "fuzz_pipeline.py").exists())
    spec = importlib.util.spec_from_file_location("fuzz_pipeline", root / "scripts" / "fuzz_pipeline.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_traced_shape_batch_range():
    with pytest.warns(mt.TraceWarning, match=r"range\(\) of a shape-derived number \(3\)") as w:
        mt.trace_module(build(), *inputs(0))
    assert all(Path(x.filename).resolve() == Path(__file__).resolve() for x in w
               if issubclass(x.category, mt.TraceWarning))      # at the user's line
