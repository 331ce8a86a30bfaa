"""The models the cross-release test saves and checks, runnable by any
release of mgtrace (it uses only the 0.1.0 API):

    python zoo.py save OUT_DIR [--target 1.1]   # save every model with example inputs
    python zoo.py check DIR                      # load each archive in DIR, run its stored
                                                 # inputs, print {name: max abs error} as JSON

Models: ResNet-18 and MobileNetV2 (mgtrace.models, seeded random weights,
traced at a small input), a MiniLM-shaped encoder (mgtrace.models.MiniLM at
hidden 32, 2 layers), and the ResNet-18 graph edited (a scaled ReLU inserted
after the classifier, replace_node, compile). Everything is traced in eval
mode. Which release runs it is whichever ``mgtrace`` is first on sys.path.
"""
import json
import os
import sys
import warnings

import numpy as np


def _seeded(net, seed):
    import mgtrace as mt
    rng = np.random.default_rng(seed)
    state = {}
    for k, v in net.state_dict().items():
        if v.dtype.name == "float32":
            scale = 1.0 if k.endswith(("running_var", ".weight")) and v.ndim == 1 else 0.1
            base = np.abs(rng.standard_normal(v.shape)) + 0.5 if k.endswith("running_var") \
                else rng.standard_normal(v.shape) * scale
            state[k] = mt.tensor(base.astype("float32"))
        else:
            state[k] = v
    net.load_state_dict(state)
    net.eval()
    return net


def models():
    """``{file name: (module, example inputs)}``, deterministic."""
    import mgtrace as mt
    import mgtrace.functional as F
    import mgtrace.module as M
    from mgtrace.models import MiniLM, mobilenet_v2, resnet18
    rng = np.random.default_rng(0)
    img = mt.tensor(rng.standard_normal((2, 3, 32, 32)).astype("float32"))
    ids = mt.tensor(rng.integers(0, 100, (2, 8)).astype("int32"))
    mask = mt.tensor(np.array([[1] * 8, [1] * 5 + [0] * 3], "int32"))
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out["resnet18.tmod"] = (mt.trace_module(_seeded(resnet18(num_classes=10), 1), img), (img,))
        out["mobilenet_v2.tmod"] = (mt.trace_module(_seeded(mobilenet_v2(num_classes=10), 2),
                                                    img), (img,))
        enc = MiniLM(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=16)
        out["minilm_encoder.tmod"] = (mt.trace_module(_seeded(enc, 3), ids, mask), (ids, mask))
        tm = mt.trace_module(_seeded(resnet18(num_classes=10), 4), img)
        g = tm.graph
        fc = g.get_module_by_type(M.Linear).as_unique()
        call = fc.users[0]
        y = call.outputs[0]
        with g.insert_exprs(call):
            scaled = F.relu(y) * 0.5 - 1.0
        g.replace_node({y: scaled})
        g.compile()
        out["resnet18_edited.tmod"] = (tm, (img,))
    return out


def save(out_dir, target=None):
    import mgtrace as mt
    os.makedirs(out_dir, exist_ok=True)
    for name, (tm, inputs) in models().items():
        kw = {} if target is None else {"target_version": target}
        mt.save(tm, os.path.join(out_dir, name), example_inputs=inputs,
                metadata={"zoo": name, "writer": mt.__version__}, **kw)


def check(in_dir):
    from mgtrace.serialization import load_archive
    from mgtrace.traced_module.pytree import tree_flatten
    import mgtrace as mt
    errors = {}
    for name in sorted(os.listdir(in_dir)):
        if not name.endswith(".tmod"):
            continue
        arc = load_archive(os.path.join(in_dir, name))
        got = arc.obj(*arc.example_inputs)
        want = arc.example_outputs
        leaves = lambda v: tree_flatten(v, lambda t: isinstance(t, mt.Tensor))[0]  # noqa: E731
        g, w = leaves(got), leaves(want)
        assert len(g) == len(w), name
        errors[name] = {
            "max_abs_error": max(float(np.max(np.abs(a.numpy().astype(np.float64)
                                                     - b.numpy().astype(np.float64))))
                                 for a, b in zip(g, w)),
            "max_abs_value": max(float(np.max(np.abs(b.numpy().astype(np.float64)))) for b in w),
            "format_version": list(arc.format_version), "metadata": arc.metadata}
    print(json.dumps({"mgtrace": mt.__file__, "archives": errors}))


if __name__ == "__main__":
    if sys.argv[1] == "save":
        target = None
        if sys.argv[3:4] == ["--target"]:          # --target 1.1: (1, 1)
            target = tuple(int(v) for v in sys.argv[4].split("."))
        save(sys.argv[2], target)
    else:
        check(sys.argv[2])
