"""Load golden archives with whichever mgtrace is first on the path (an
earlier release, or this checkout) and run their stored example inputs.

    python golden_check.py FOLDER...       # prints JSON: {"mgtrace": path, "archives": {...}}

Each archive's entry: ``format_version``, and for a model the largest
``|output - stored output|`` over its float outputs in units of float32's
eps times that output's largest magnitude (``ulps``), ``exact`` (integer and
bool outputs equal). The 1.0 maker is imported first: it registers the user
function the every_expr archives call. Only what every release has is used.
"""
import importlib.util
import json
import pathlib
import sys

import numpy as np

import mgtrace as mt


def _leaves(v):
    if isinstance(v, mt.Tensor):
        yield v
    elif isinstance(v, dict):
        for x in v.values():
            yield from _leaves(x)
    elif isinstance(v, (list, tuple)):
        for x in v:
            yield from _leaves(x)


def check(path):
    arc = mt.serialization.load_archive(path)
    out = {"format_version": list(arc.format_version)}
    if arc.example_inputs is None:
        return out
    got = arc.obj(*arc.example_inputs, **(arc.example_kwargs or {}))
    ulps, exact = 0.0, True
    for g, w in zip(_leaves(got), _leaves(arc.example_outputs)):
        g, w = g.numpy(), w.numpy()
        if g.shape != w.shape:
            exact = False
        elif w.dtype.kind in "biu":
            exact = exact and bool((g == w).all())
        else:
            g, w = g.astype(np.float64), w.astype(np.float64)
            same = (g == w) | (np.isnan(g) & np.isnan(w))
            if not same.all():
                scale = float(np.max(np.abs(w[np.isfinite(w)]), initial=0.0)) or 1e-300
                eps = 2.0 ** -7 if w.dtype.itemsize == 2 else 2.0 ** -23
                ulps = max(ulps, float(np.max(np.abs(g - w)[~same])) / (eps * scale))
    out.update(ulps=ulps, exact=exact)
    return out


def main(folders):
    golden = pathlib.Path(folders[0]).resolve().parent
    spec = importlib.util.spec_from_file_location("golden_1_0", golden / "1.0" / "make_golden.py")
    sys.modules["golden_1_0"] = mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    result = {}
    for folder in folders:
        for path in sorted(pathlib.Path(folder).glob("*.tmod")):
            result[f"{path.parent.name}/{path.name}"] = check(path)
    print(json.dumps({"mgtrace": mt.__file__, "archives": result}))


if __name__ == "__main__":
    main(sys.argv[1:])
