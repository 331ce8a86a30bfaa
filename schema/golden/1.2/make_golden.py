"""Write the format-1.2 golden archives (run once, at the release of 1.2).

    python schema/golden/1.2/make_golden.py [--force]

As for 1.0 (see ../1.0/make_golden.py): never regenerated;
tests/serialization/test_golden.py checks each file against manifest.json
and loads it with the current reader, comparing with ``expected(name)``
(values built here from NumPy alone) or running a model's stored example
inputs. Each 1.2 feature adds its archives here (other issues of the
1.2 release add theirs beside these):

* ``aliased_values.tmod``: tensors that share one storage (format 1.2
  ``view`` entries): a base, a strided slice of it, its transpose, its rows
  reversed (negative strides), a row broadcast (a zero stride) and an
  unrelated tensor; ``ALIASES`` lists which pairs share memory;
* ``aliased_model.tmod``: a traced model whose buffer is a slice of a
  builtin Linear's weight and which reads a transposed view of another
  Linear's weight, with example inputs and the outputs they gave.
"""
import hashlib
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


def build():
    """name -> (object, save keyword arguments)."""
    tm, inputs = _aliased_model()
    return {
        "aliased_values.tmod": (_aliased_values(), {"metadata": {"what": "views of one storage"}}),
        "aliased_model.tmod": (tm, {"example_inputs": inputs,
                                    "metadata": {"what": "a buffer and an attribute that are "
                                                         "views of Linear weights"}}),
    }


def main():
    force = "--force" in sys.argv
    manifest = {}
    for name, (obj, kwargs) in build().items():
        path = HERE / name
        if path.exists() and not force:
            sys.exit(f"{path} exists; golden archives are never regenerated")
        mt.save(obj, path, **kwargs)
        header = mt.serialization.read_header(path)
        if header["format_version"] != [1, 2] or not any("view" in e for e in header["tensors"]):
            sys.exit(f"{name} does not use format 1.2's views")
        manifest[name] = "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
    (HERE / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")


if __name__ == "__main__":
    main()
