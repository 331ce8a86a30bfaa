"""Plans of the pipeline fuzzer's graphs (scripts/fuzz_pipeline.py): for a
fixed seed's cases, every graph (traced, and optimize(tm)) either compiles
to a plan whose outputs equal the graph's bitwise on two calls (the second
at the case's run batch: a guard miss, planned again), or is refused with a
PlanError that names why (state written in forward, training mode,
data-dependent values)."""
import importlib.util
import warnings
from pathlib import Path

import numpy as np
import pytest

import mgtrace as mt
from mgtrace.plan import PlanError
from mgtrace.traced_module import optimize
from mgtrace.traced_module.pytree import tree_flatten

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "fuzz_pipeline.py"
CASES, SEED = 150, 34


@pytest.fixture(scope="module")
def fuzz():
    spec = importlib.util.spec_from_file_location("fuzz_pipeline", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _leaves(out):
    return [t.numpy() for t in tree_flatten(out, lambda v: isinstance(v, mt.Tensor))[0]
            if isinstance(t, mt.Tensor)]


def _same(a, b):
    return len(a) == len(b) and all(
        x.dtype == y.dtype and x.shape == y.shape
        and np.ascontiguousarray(x).tobytes() == np.ascontiguousarray(y).tobytes()
        for x, y in zip(a, b))


def test_fuzzer_graphs_plan_bitwise_or_are_refused_by_name(fuzz):
    compiled, refused, mismatches = 0, [], []
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        for case in range(CASES):
            ns = fuzz.load_source(fuzz.source(fuzz.make_spec(SEED, case)))
            arrays = [fuzz._np_inputs(ns, c) for c in (0, 1)]
            try:
                tm = mt.trace_module(ns["build"](), *fuzz._tensors(arrays[0]))
            except Exception:          # noqa: BLE001  (the tracer's refusals are its tests' business)
                continue
            for label, make in (("traced", lambda: tm), ("optimized", lambda: optimize(tm))):
                try:
                    g = make()
                except Exception:      # noqa: BLE001
                    continue
                # the graph and its plan each from the same state: two copies
                import copy
                g_ref, g_plan = copy.deepcopy(g), copy.deepcopy(g)
                try:
                    plan = mt.compile(g_plan, *fuzz._tensors(arrays[0]))
                except PlanError as e:
                    refused.append(str(e))
                    continue
                compiled += 1
                g_ref(*fuzz._tensors(arrays[0]))        # the plan's compile ran the module once
                for c in (0, 1):
                    want = _leaves(g_ref(*fuzz._tensors(arrays[c])))
                    got = _leaves(plan(*fuzz._tensors(arrays[c])))
                    if not _same(got, want):
                        mismatches.append((case, label, c))
    assert mismatches == []
    assert compiled >= CASES           # most cases plan (both variants), the rest are refused
    for msg in refused:
        assert any(w in msg for w in ("training mode", "writes into", "data-dependent",
                                      "branches on", "memory made outside", "tensor values",
                                      "depends on the input's values")), msg
