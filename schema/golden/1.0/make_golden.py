"""Write the format-1.0 golden archives (run once, at the release of 1.0).

    python schema/golden/1.0/make_golden.py [--force]

Golden archives are never regenerated: tests/serialization/test_golden.py
checks each file against manifest.json (sha256) and loads it with the
current reader, comparing with ``expected(name)`` -- values built here from
NumPy alone -- or, for models, running the stored example inputs and
comparing with the stored outputs. A new format version adds a new folder.
"""
import hashlib
import json
import math
import pathlib
import struct
import sys
from collections import OrderedDict

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

import ml_dtypes  # noqa: E402
import mgtrace as mt  # noqa: E402
import mgtrace.module as M  # noqa: E402

NAN_WITH_PAYLOAD = struct.unpack("<d", struct.pack("<Q", 0x7FF8_0000_0000_BEEF))[0]


def _tensor_values():
    return (np.arange(24, dtype=np.float32).reshape(2, 3, 4) / 4 - 2)


def _state_values():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    return OrderedDict([
        ("fc.weight", a / 8),
        ("fc.bias", np.array([-0.0, 1.5, np.inf], np.float32)),
        ("half", (a[:2] / 3).astype(np.float16)),
        ("bf16", (a[0] - 1.5).astype(ml_dtypes.bfloat16)),
        ("bytes", np.array([-128, -1, 0, 127], np.int8)),
        ("mask", np.array([[True, False], [False, True]])),
        ("steps", np.array(7, np.int64)),
        ("empty", np.zeros((0, 3), np.float64)),
    ])


def _nested_values():
    return {
        "floats": (1.0, -0.0, NAN_WITH_PAYLOAD, math.inf),
        (1, 2): "tuple key",
        3: [None, True, False, 0, b"\x00bytes"],
        "numpy": [np.float32(1.5), np.int64(-7), np.float16(0.25), np.bool_(True)],
        "big": [2 ** 100, -(2 ** 70), 2 ** 64 - 1],
        "index": (slice(1, None, 2), Ellipsis, slice(None)),
        "types": (np.dtype("int8"), mt.Device("cpu:0")),
        "weights": OrderedDict([("w", np.arange(6, dtype=np.float32).reshape(2, 3))]),
    }


def expected(name):
    """The value ``name`` holds, as NumPy arrays where it holds tensors."""
    return {"tensor.tmod": _tensor_values, "state_dict.tmod": _state_values,
            "nested.tmod": _nested_values}[name]()


def _to_tensors(v):
    if isinstance(v, np.ndarray):
        return mt.tensor(v)
    if isinstance(v, OrderedDict):
        return OrderedDict((k, _to_tensors(x)) for k, x in v.items())
    if isinstance(v, dict):
        return {k: _to_tensors(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return type(v)(_to_tensors(x) for x in v)
    return v


def _model():
    net = M.Sequential(
        M.Conv2d(3, 4, 3, padding=1), M.BatchNorm2d(4), M.ReLU(), M.MaxPool2d(2),
        M.Conv2d(4, 4, 3, groups=2, bias=False), M.AdaptiveAvgPool2d(1), M.Flatten(),
        M.Linear(4, 5), M.GELU(), M.Dropout(0.1), M.Linear(5, 3), M.Softmax(dim=-1))
    rng = np.random.default_rng(2024)
    state = OrderedDict()
    for k, t in net.state_dict().items():
        if t.dtype == np.int64:
            state[k] = np.array(10, np.int64)
        elif k.endswith("running_var"):
            state[k] = rng.uniform(0.5, 1.5, t.shape).astype(np.float32)
        else:
            state[k] = (0.4 * rng.standard_normal(t.shape)).astype(np.float32)
    net.load_state_dict(state)
    x = mt.tensor(np.random.default_rng(7).standard_normal((2, 3, 8, 8)).astype(np.float32))
    return net.eval(), (x,)


def build():
    """name -> (object, save keyword arguments)."""
    model, inputs = _model()
    return {
        "tensor.tmod": (_to_tensors(_tensor_values()), {"metadata": {"what": "a tensor"}}),
        "state_dict.tmod": (_to_tensors(_state_values()), {}),
        "nested.tmod": (_to_tensors(_nested_values()), {}),
        "sequential.tmod": (model, {"example_inputs": inputs,
                                    "metadata": {"what": "builtin-only Sequential"}}),
    }


def main():
    force = "--force" in sys.argv
    manifest = {}
    for name, (obj, kwargs) in build().items():
        path = HERE / name
        if path.exists() and not force:
            sys.exit(f"{path} exists; golden archives are never regenerated")
        mt.save(obj, path, **kwargs)
        manifest[name] = "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
    (HERE / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")


if __name__ == "__main__":
    main()
