"""Write the format-1.2 golden archives (1.2 is in development: re-run freely).

    python schema/golden/1.2/make_golden.py

Format 1.2 is the minor every open change shares (storage views now;
quantized dtypes, new functions and module types as they land). Until a
release with format 1.2 is listed in schema/releases.json, this script
rewrites every archive here and manifest.json, so the compendium follows
the code: after adding a function, a builtin module type, a value tag or a
field to 1.2, add a case below (CASES) and run it. Once 0.3.0 (format 1.2)
is released it refuses to run (``--force`` overrides, for the release
commit itself) and the files are frozen like 1.0's and 1.1's:
tests/serialization/test_golden.py checks each file against manifest.json,
loads it, compares with ``expected(name)`` (values built here from NumPy
alone) or runs a model's stored example inputs, and saves it again at 1.2,
which must give the committed bytes.

It refuses to write a compendium that misses a function, module type or
value tag the 1.1 compendium cannot hold (new in 1.2, or at a newer
version), naming what is missing.

* ``aliased_values.tmod``: tensors that share one storage (format 1.2
  ``view`` entries): a base, a strided slice of it, its transpose, its rows
  reversed (negative strides), a row broadcast (a zero stride) and an
  unrelated tensor; ``ALIASES`` lists which pairs share memory;
* ``aliased_model.tmod``: a traced model whose buffer is a slice of a
  builtin Linear's weight and which reads a transposed view of another
  Linear's weight, with example inputs and the outputs they gave.
"""
import hashlib
import importlib.util
import json
import pathlib
import sys
import warnings

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

import mgtrace as mt  # noqa: E402
import mgtrace.functional as F  # noqa: E402
import mgtrace.module as M  # noqa: E402
import mgtrace.traced_module as tmod  # noqa: E402

# (key, key) of aliased_values.tmod whose tensors share one storage after a load
ALIASES = [("base", "slice"), ("base", "transposed"), ("base", "reversed"), ("base", "row")]


def _base():
    return np.arange(24, dtype=np.float32).reshape(4, 6) / 8 - 1


def _values():
    b = _base()
    return {"base": b, "slice": b[1:3, ::2], "transposed": b.T, "reversed": b[::-1],
            "row": np.broadcast_to(b[2], (3, 6)), "other": np.array([0.5, -0.25], np.float32)}


def expected(name):
    """The value ``name`` holds, as NumPy arrays where it holds tensors."""
    return {"aliased_values.tmod": _values}[name]()


def _aliased_values():
    base = mt.tensor(_base())
    return {"base": base, "slice": base[1:3, ::2], "transposed": base.T,
            "reversed": base[::-1], "row": base[2].broadcast_to((3, 6)),
            "other": mt.tensor(np.array([0.5, -0.25], np.float32))}


class Aliased(M.Module):
    """A buffer that is row 0 of ``fc``'s weight, and ``proj``'s weight
    read through a transposed view held as a tensor attribute."""

    def __init__(self):
        super().__init__()
        self.fc = M.Linear(4, 3)
        self.proj = M.Linear(3, 4, bias=False)
        self.first_row = self.fc.weight[0]           # a buffer: a view of the parameter
        self.proj_t = self.proj.weight.T              # another view, [3, 4]

    def forward(self, x):
        h = F.relu(self.fc(x)) + (x * self.first_row).sum(axis=1, keepdims=True)
        return self.proj(h) + F.matmul(h, self.proj_t)


def _aliased_model():
    mt.random.seed(120)
    net = Aliased()
    rng = np.random.default_rng(121)
    net.fc.weight[...] = mt.tensor((0.5 * rng.standard_normal((3, 4))).astype(np.float32))
    net.fc.bias[...] = mt.tensor((0.1 * rng.standard_normal(3)).astype(np.float32))
    net.proj.weight[...] = mt.tensor((0.5 * rng.standard_normal((4, 3))).astype(np.float32))
    net.eval()
    x = mt.tensor(rng.standard_normal((2, 4)).astype(np.float32))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tmod.TraceWarning)
        tm = mt.trace_module(net, x)
    return tm, (mt.tensor(rng.standard_normal((5, 4)).astype(np.float32)),)


CASES = {    # name -> (make() -> (object, save keyword arguments)); add 1.2's cases here
    "aliased_values.tmod": lambda: (_aliased_values(),
                                    {"metadata": {"what": "views of one storage"}}),
    "aliased_model.tmod": lambda: _with_examples(
        _aliased_model(), "a buffer and an attribute that are views of Linear weights"),
}


def _with_examples(made, what):
    tm, inputs = made
    return tm, {"example_inputs": inputs, "metadata": {"what": what}}


def build():
    """name -> (object, save keyword arguments)."""
    return {name: make() for name, make in CASES.items()}


def released():
    """Whether a listed release writes format 1.2 (then these files are frozen)."""
    releases = json.loads((HERE.parents[1] / "releases.json").read_text())["releases"]
    return any(r["format"] == [1, 2] for r in releases)


def _coverage():
    """schema/golden/coverage.py (by path: PyPI's coverage has that name)."""
    name = "golden_coverage"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, HERE.parent / "coverage.py")
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


def check(folder=HERE):
    """What the 1.2 compendium must hold and does not, as messages: every
    function and builtin module type 1.1's readers do not know at its
    current version, and every value tag since 1.2; every archive format 1.2."""
    coverage = _coverage()
    from mgtrace.serialization import values
    from mgtrace.serialization.version import released_names
    uses = coverage.folder_uses(folder)
    got = coverage.totals(uses.values())
    ops = json.loads((HERE.parents[1] / "ops.json").read_text())
    old = released_names((1, 1))
    out = []
    for name, u in uses.items():
        if u["versions"][0] != (1, 2):
            out.append(f"{name} is format {'.'.join(map(str, u['versions'][0]))}, not 1.2: a 1.2 "
                       "case must use something of 1.2")
    for k in ("functions", "module_types"):
        new = {(n, e["version"]) for n, e in ops[k].items() if old[k].get(n, 0) < e["version"]}
        missing = sorted(new - got[k])
        if missing:
            out.append(f"the 1.2 golden archives miss {k} {missing}: add a case that uses each "
                       "to CASES in schema/golden/1.2/make_golden.py and run it")
    tags = {t for t, tag in values.TAGS.items() if tuple(tag.since) >= (1, 2)}
    if tags - got["tags"]:
        out.append(f"the 1.2 golden archives miss value tags {sorted(tags - got['tags'])}: add "
                   "a case to CASES in schema/golden/1.2/make_golden.py and run it")
    return out


def main():
    if released() and "--force" not in sys.argv:
        sys.exit("format 1.2 is released (schema/releases.json): its golden archives are frozen")
    manifest = {}
    for old in HERE.glob("*.tmod"):
        old.unlink()
    for name, (obj, kwargs) in build().items():
        path = HERE / name
        mt.save(obj, path, **kwargs)
        manifest[name] = "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
    (HERE / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    problems = check()
    if problems:
        sys.exit("\n".join(problems))


if __name__ == "__main__":
    main()
