"""Mutational fuzzer for mgtrace.onnx.load: what a hostile .onnx can do to the importer.

    python scripts/fuzz_onnx.py                     # 3000 cases, seed 0
    python scripts/fuzz_onnx.py -n 500 --seed 7     # a short run
    python scripts/fuzz_onnx.py --case 7:123 -v     # replay one case in this process

Seeds are small valid models built with onnx.helper (conv / gemm / pooling,
shape arithmetic with Shape / Gather / Concat / Reshape, a QDQ conv, an
LSTM, elementwise ops with broadcasting, a bidirectional RNN with
sequence_lens, QLinearConv and MatMulInteger). Each case mutates one seed, by

* ``bytes``: flips, sets, inserts, deletes or truncates serialized bytes;
* ``fields``: one change to the ModelProto (a dim, an attribute's value, an
  op type, a node input or output name, the opset, an element type, an
  initializer's raw data length, a duplicated or dropped node, a cycle, an
  external-data location outside the folder, an If/Loop/Scan node ...)

and loads the result with mgtrace.onnx.load in a worker subprocess (each
case bounded by ``--timeout`` seconds: the worker is killed and restarted).
An outcome is fine when load returns, or raises mgtrace.Error (the file is
refused, naming why). Counted as findings, with the case id to replay:

* any other exception (a KeyError / IndexError / ... leaking from inside);
* a crash (the worker dies: a segfault, an abort);
* a hang (a case past the timeout).

Exit status 0 when there are no findings, else 1.
"""
import argparse
import collections
import os
import random
import select
import subprocess
import sys
import tempfile
import time
import traceback

import numpy as np


# ------------------------------------------------------------------ seeds
def seeds():
    import onnx
    from onnx import TensorProto as T, helper as h, numpy_helper as nh
    rng = np.random.default_rng(0)

    def init(name, a):
        return nh.from_array(np.asarray(a), name)

    def model(nodes, inputs, outputs, inits, opset=17):
        g = h.make_graph(nodes, "g", inputs, outputs, inits)
        return h.make_model(g, opset_imports=[h.make_opsetid("", opset)], ir_version=8)

    f32 = rng.standard_normal
    out = []
    # conv -> relu -> maxpool -> flatten -> gemm
    out.append(("convnet", model(
        [h.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], strides=[1, 1],
                     kernel_shape=[3, 3], name="conv"),
         h.make_node("Relu", ["c"], ["r"], name="relu"),
         h.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
         h.make_node("Flatten", ["p"], ["f"], axis=1, name="flat"),
         h.make_node("Gemm", ["f", "fw", "fb"], ["y"], transB=1, name="fc")],
        [h.make_tensor_value_info("x", T.FLOAT, ["N", 3, 8, 8])],
        [h.make_tensor_value_info("y", T.FLOAT, ["N", 5])],
        [init("w", f32((4, 3, 3, 3)).astype(np.float32)), init("b", np.zeros(4, np.float32)),
         init("fw", f32((5, 64)).astype(np.float32)), init("fb", np.ones(5, np.float32))])))
    # shape arithmetic
    out.append(("shapes", model(
        [h.make_node("Shape", ["x"], ["s"]),
         h.make_node("Gather", ["s", "i0"], ["n"], axis=0),
         h.make_node("Concat", ["n", "m1"], ["ns"], axis=0),
         h.make_node("Reshape", ["x", "ns"], ["r"]),
         h.make_node("ReduceSum", ["r", "ax"], ["y"], keepdims=1),
         h.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1]),
         h.make_node("Softmax", ["t"], ["z"], axis=-1)],
        [h.make_tensor_value_info("x", T.FLOAT, ["N", 4, 6])],
        [h.make_tensor_value_info("y", T.FLOAT, None),
         h.make_tensor_value_info("z", T.FLOAT, None)],
        [init("i0", np.array([0], np.int64)), init("m1", np.array([-1], np.int64)),
         init("ax", np.array([1], np.int64))])))
    # QDQ conv
    out.append(("qdq", model(
        [h.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
         h.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
         h.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], axis=0),
         h.make_node("Conv", ["xd", "wd"], ["c"], kernel_shape=[1, 1]),
         h.make_node("QuantizeLinear", ["c", "ys", "yz"], ["cq"]),
         h.make_node("DequantizeLinear", ["cq", "ys", "yz"], ["y"])],
        [h.make_tensor_value_info("x", T.FLOAT, [1, 2, 3, 3])],
        [h.make_tensor_value_info("y", T.FLOAT, None)],
        [init("xs", np.float32(0.1)), init("xz", np.int8(0)),
         init("wq", rng.integers(-5, 5, (3, 2, 1, 1)).astype(np.int8)),
         init("ws", np.full(3, 0.05, np.float32)), init("wz", np.zeros(3, np.int8)),
         init("ys", np.float32(0.2)), init("yz", np.int8(0))])))
    # LSTM
    H, I = 3, 2
    out.append(("lstm", model(
        [h.make_node("LSTM", ["x", "W", "R", "B"], ["Y", "Yh"], hidden_size=H, name="lstm")],
        [h.make_tensor_value_info("x", T.FLOAT, ["S", 1, I])],
        [h.make_tensor_value_info("Y", T.FLOAT, None),
         h.make_tensor_value_info("Yh", T.FLOAT, None)],
        [init("W", f32((1, 4 * H, I)).astype(np.float32)),
         init("R", f32((1, 4 * H, H)).astype(np.float32)),
         init("B", np.zeros((1, 8 * H), np.float32))])))
    # elementwise with broadcasting, Where, Cast, Expand, Slice, Pad
    out.append(("elementwise", model(
        [h.make_node("Add", ["x", "c"], ["a"]),
         h.make_node("Mul", ["a", "a"], ["m"]),
         h.make_node("Greater", ["m", "c"], ["g"]),
         h.make_node("Where", ["g", "m", "a"], ["w"]),
         h.make_node("Cast", ["w"], ["wc"], to=T.FLOAT16),
         h.make_node("Cast", ["wc"], ["wf"], to=T.FLOAT),
         h.make_node("Slice", ["wf", "st", "en", "axs"], ["sl"]),
         h.make_node("Pad", ["sl", "pads"], ["pd"], mode="constant"),
         h.make_node("Expand", ["pd", "shp"], ["y"])],
        [h.make_tensor_value_info("x", T.FLOAT, [1, 4])],
        [h.make_tensor_value_info("y", T.FLOAT, None)],
        [init("c", np.arange(4, dtype=np.float32)), init("st", np.array([1], np.int64)),
         init("en", np.array([3], np.int64)), init("axs", np.array([1], np.int64)),
         init("pads", np.array([0, 1, 0, 1], np.int64)),
         init("shp", np.array([2, 4], np.int64))])))
    # RNN with sequence_lens and initial_h, bidirectional
    out.append(("rnn_lens", model(
        [h.make_node("RNN", ["x", "W", "R", "B", "lens", "h0"], ["Y", "Yh"], hidden_size=H,
                     direction="bidirectional", name="rnn")],
        [h.make_tensor_value_info("x", T.FLOAT, [4, 2, I]),
         h.make_tensor_value_info("lens", T.INT32, [2])],
        [h.make_tensor_value_info("Y", T.FLOAT, None),
         h.make_tensor_value_info("Yh", T.FLOAT, None)],
        [init("W", f32((2, H, I)).astype(np.float32)),
         init("R", f32((2, H, H)).astype(np.float32)),
         init("B", np.zeros((2, 2 * H), np.float32)),
         init("h0", np.zeros((2, 2, H), np.float32))])))
    # QOperator: QLinearConv, then MatMulInteger
    out.append(("qoperator", model(
        [h.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
         h.make_node("QLinearConv", ["xq", "xs", "xz", "wq", "ws", "wz", "ys", "yz", "bq"],
                     ["cq"], kernel_shape=[1, 1], name="qconv"),
         h.make_node("Flatten", ["cq"], ["fq"], axis=1),
         h.make_node("MatMulInteger", ["fq", "mq", "yz", "mz"], ["acc"], name="mmi"),
         h.make_node("Cast", ["acc"], ["y"], to=T.FLOAT)],
        [h.make_tensor_value_info("x", T.FLOAT, ["N", 2, 2, 2])],
        [h.make_tensor_value_info("y", T.FLOAT, None)],
        [init("xs", np.float32(0.1)), init("xz", np.uint8(128)),
         init("wq", rng.integers(-5, 5, (3, 2, 1, 1)).astype(np.int8)),
         init("ws", np.full(3, 0.05, np.float32)), init("wz", np.zeros(3, np.int8)),
         init("ys", np.float32(0.2)), init("yz", np.uint8(128)),
         init("bq", np.arange(3, dtype=np.int32)),
         init("mq", rng.integers(-5, 5, (12, 4)).astype(np.int8)),
         init("mz", np.int8(0))])))
    return out


# ------------------------------------------------------------------ mutations
BIG = [0, -1, 1, 2, -2 ** 31, 2 ** 31 - 1, 2 ** 31, 2 ** 62, -2 ** 63, 2 ** 63 - 1, 10 ** 6,
       3, 7, 255, 65536]


def _rand_int(r):
    return r.choice(BIG) if r.random() < 0.7 else r.randint(-100, 100)


def mutate_bytes(data, r):
    b = bytearray(data)
    for _ in range(r.randint(1, 4)):
        op = r.randrange(5)
        if not b:
            break
        i = r.randrange(len(b))
        if op == 0:
            b[i] ^= 1 << r.randrange(8)
        elif op == 1:
            b[i] = r.choice([0, 0xff, 0x7f, 0x80, r.randrange(256)])
        elif op == 2:
            b[i:i] = bytes(r.randrange(256) for _ in range(r.randint(1, 8)))
        elif op == 3:
            del b[i:i + r.randint(1, 8)]
        else:
            del b[i:]
    return bytes(b)


def mutate_fields(m, r, folder):
    """One change to ModelProto ``m`` (in place); a short description."""
    import onnx
    from onnx import TensorProto as T, helper as h
    g = m.graph
    kinds = ["dim", "attr", "op_type", "input_name", "output_name", "opset", "elem_type",
             "raw_data", "dup_node", "drop_node", "cycle", "external", "subgraph",
             "drop_init", "dup_init", "domain", "init_dims", "swap_nodes", "graph_io",
             "attr_type"]
    k = r.choice(kinds)
    nodes = list(g.node)
    node = r.choice(nodes) if nodes else None
    if k == "dim":
        vis = list(g.input) + list(g.output)
        vi = r.choice(vis)
        dims = vi.type.tensor_type.shape.dim
        if dims:
            d = r.choice(dims)
            if r.random() < 0.8:
                d.dim_value = _rand_int(r) if r.random() < 0.5 else r.choice([0, 2 ** 40, 2 ** 62])
            else:
                d.dim_param = r.choice(["", "N", "M", "x" * 300])
        else:
            vi.type.tensor_type.shape.dim.add().dim_value = _rand_int(r)
    elif k == "attr" and node is not None and node.attribute:
        a = r.choice(node.attribute)
        if a.type == onnx.AttributeProto.INT:
            a.i = _rand_int(r)
        elif a.type == onnx.AttributeProto.INTS:
            if a.ints and r.random() < 0.7:
                a.ints[r.randrange(len(a.ints))] = _rand_int(r)
            elif r.random() < 0.5:
                del a.ints[:]
            else:
                a.ints.append(_rand_int(r))
        elif a.type == onnx.AttributeProto.FLOAT:
            a.f = r.choice([float("nan"), float("inf"), -1.0, 0.0, 1e30])
        elif a.type == onnx.AttributeProto.STRING:
            a.s = r.choice([b"", b"bogus", b"\xff\xfe", b"reverse", b"bidirectional"])
        else:
            node.attribute.remove(a)
    elif k == "attr_type" and node is not None:
        name = r.choice(["axis", "perm", "kernel_shape", "pads", "strides", "to", "mode",
                         "hidden_size", "direction", "keepdims", "transB", "alpha",
                         "dilations", "group", "layout", "axes", "value", "body"])
        for a in list(node.attribute):
            if a.name == name:
                node.attribute.remove(a)
        val = r.choice([_rand_int(r), [_rand_int(r) for _ in range(r.randint(0, 6))], "x",
                        1.5, b"\x00"])
        try:
            node.attribute.append(h.make_attribute(name, val))
        except Exception:
            pass
    elif k == "op_type" and node is not None:
        node.op_type = r.choice(["Relu", "Conv", "Gemm", "Reshape", "Concat", "Gather",
                                 "LSTM", "RNN", "GRU", "Loop", "If", "Scan", "Split",
                                 "Slice", "Resize", "Einsum", "TopK", "NonZero", "Unsqueeze",
                                 "Squeeze", "ConstantOfShape", "Range", "Tile", "Pad",
                                 "QLinearConv", "MatMulInteger", "Attention", "Bogus", ""])
    elif k == "input_name" and node is not None:
        if node.input and r.random() < 0.6:
            node.input[r.randrange(len(node.input))] = r.choice(
                ["", "x", "nope", node.output[0] if node.output else "y"]
                + [t.name for t in g.initializer[:3]])
        elif node.input and r.random() < 0.5:
            del node.input[r.randrange(len(node.input))]
        else:
            node.input.append(r.choice(["", "x", "nope"]))
    elif k == "output_name" and node is not None and node.output:
        i = r.randrange(len(node.output))
        node.output[i] = r.choice(["", "x", "y"] + [t.name for t in g.initializer[:3]]
                                  + [n.output[0] for n in nodes if n.output])
    elif k == "opset":
        m.opset_import[0].version = r.choice([0, 1, 6, 7, 9, 11, 12, 13, 18, 21, 28, 29, 1000,
                                              -1, 2 ** 62])
        if r.random() < 0.2:
            m.opset_import[0].domain = r.choice(["ai.onnx", "com.microsoft", "bogus"])
    elif k == "elem_type":
        tgt = r.choice(list(g.input) + list(g.output) + list(g.initializer))
        et = r.choice([0, 2, 3, 5, 7, 8, 9, 10, 11, 13, 14, 16, 17, 21, 22, 23, 40, -1])
        if hasattr(tgt, "data_type"):
            tgt.data_type = et
        else:
            tgt.type.tensor_type.elem_type = et
    elif k == "raw_data" and g.initializer:
        t = r.choice(g.initializer)
        if t.HasField("raw_data"):
            raw = t.raw_data
            t.raw_data = raw[:r.randrange(len(raw) + 1)] if r.random() < 0.5 else \
                raw + bytes(r.randint(1, 9))
        else:
            t.raw_data = bytes(r.randint(0, 16))
    elif k == "dup_node" and node is not None:
        g.node.append(node)
    elif k == "drop_node" and node is not None:
        g.node.remove(node)
    elif k == "cycle" and len(nodes) >= 2:
        a, b = r.sample(range(len(nodes)), 2)
        if nodes[max(a, b)].output and nodes[min(a, b)].input:
            nodes_ = g.node
            nodes_[min(a, b)].input[0] = nodes_[max(a, b)].output[0]
        elif node is not None and node.output:
            node.input.append(node.output[0])
    elif k == "external" and g.initializer:
        t = r.choice(g.initializer)
        n = len(t.raw_data) if t.HasField("raw_data") else 64
        t.ClearField("raw_data")
        del t.float_data[:], t.int64_data[:], t.int32_data[:]
        t.data_location = T.EXTERNAL
        loc = r.choice(["../outside.bin", "/etc/passwd", "link.bin", "data.bin", "", "sub/../../x",
                        "nope.bin", "data.bin", "dirlink/data.bin"])
        del t.external_data[:]
        for key, val in [("location", loc), ("offset", r.choice(["0", "-8", "x", "4", "99999"])),
                         ("length", r.choice([str(n), str(n + 4), "-1", "abc", "0"]))]:
            if r.random() < 0.9:
                e = t.external_data.add()
                e.key, e.value = key, val
    elif k == "subgraph" and node is not None:
        sub = h.make_graph([h.make_node("Identity", ["x"], ["o"])], "body", [],
                           [h.make_tensor_value_info("o", T.FLOAT, None)])
        kind = r.choice(["If", "Loop", "Scan"])
        c = r.choice(["cond", "x"])
        new = h.make_node(kind, [c] if kind != "Scan" else ["x"], ["sub_out"],
                          **({"then_branch": sub, "else_branch": sub} if kind == "If" else
                             {"body": sub, **({"num_scan_inputs": 1} if kind == "Scan" else {})}))
        g.node.insert(r.randrange(len(nodes) + 1), new)
    elif k == "drop_init" and g.initializer:
        g.initializer.remove(r.choice(g.initializer))
    elif k == "dup_init" and g.initializer:
        t = g.initializer.add()
        t.CopyFrom(r.choice(g.initializer[:-1]) if len(g.initializer) > 1 else g.initializer[0])
        if r.random() < 0.5:
            t.name = r.choice(["x", g.input[0].name if g.input else "x"])
    elif k == "domain" and node is not None:
        node.domain = r.choice(["com.microsoft", "ai.onnx.ml", "bogus", "ai.onnx"])
    elif k == "init_dims" and g.initializer:
        t = r.choice(g.initializer)
        if t.dims and r.random() < 0.7:
            t.dims[r.randrange(len(t.dims))] = _rand_int(r)
        else:
            t.dims.append(r.choice([0, 1, 2 ** 31, 2 ** 40]))
    elif k == "swap_nodes" and len(nodes) >= 2:
        a, b = r.sample(range(len(nodes)), 2)
        na, nb = onnx.NodeProto(), onnx.NodeProto()
        na.CopyFrom(g.node[a]), nb.CopyFrom(g.node[b])
        g.node[a].CopyFrom(nb), g.node[b].CopyFrom(na)
    elif k == "graph_io":
        op = r.randrange(4)
        if op == 0 and g.output:
            g.output.append(g.output[0])
        elif op == 1 and g.input:
            g.input.append(g.input[0])
        elif op == 2:
            g.output.add().name = r.choice(["", "nope", "x"])
        elif g.input:
            g.input[0].ClearField("type")
    return k


def make_case(seed_list, seed, index, folder):
    """``(kind, bytes)`` of case ``index`` (deterministic in seed and index)."""
    import onnx
    r = random.Random(f"{seed}:{index}")
    name, base = seed_list[r.randrange(len(seed_list))]
    m = onnx.ModelProto()
    m.CopyFrom(base)
    if r.random() < 0.3:
        return f"{name}/bytes", mutate_bytes(m.SerializeToString(), r)
    ks = [mutate_fields(m, r, folder) for _ in range(r.choice([1, 1, 1, 2, 3]))]
    data = m.SerializeToString()
    return f"{name}/fields:{'+'.join(ks)}", data


def _prepare_folder(folder):
    os.makedirs(os.path.join(folder, "m"), exist_ok=True)
    with open(os.path.join(folder, "outside.bin"), "wb") as fh:
        fh.write(bytes(4096))
    with open(os.path.join(folder, "m", "data.bin"), "wb") as fh:
        fh.write(bytes(range(256)) * 4)
    for src, dst in [(os.path.join(folder, "outside.bin"), "link.bin"), (folder, "dirlink")]:
        p = os.path.join(folder, "m", dst)
        if not os.path.lexists(p):
            os.symlink(src, p)


def run_one(seed_list, seed, index, folder, verbose=False):
    """``("ok"|"refused"|"leak", detail)`` for one case, in this process."""
    import warnings
    import mgtrace
    import mgtrace.onnx
    kind, data = make_case(seed_list, seed, index, folder)
    path = os.path.join(folder, "m", "model.onnx")
    with open(path, "wb") as fh:
        fh.write(data)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mgtrace.onnx.load(path)
        return kind, "ok", ""
    except mgtrace.Error as err:
        if verbose:
            print(f"{type(err).__name__}: {err}")
        return kind, "refused", type(err).__name__
    except Exception as err:       # noqa: BLE001 -- what the fuzzer looks for
        tb = traceback.extract_tb(err.__traceback__)[-1]
        if verbose:
            traceback.print_exc()
        where = f"{os.path.basename(tb.filename)}:{tb.lineno}"
        return kind, "leak", f"{type(err).__name__} at {where}: {str(err)[:160]}"


def worker(seed, folder):
    seed_list = seeds()
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    for line in sys.stdin:
        i = int(line)
        kind, outcome, detail = run_one(seed_list, seed, i, folder)
        sys.stdout.write(f"{i}\t{kind}\t{outcome}\t{detail.replace(chr(10), ' ')}\n")
        sys.stdout.flush()


class Worker:
    def __init__(self, seed, folder):
        self.p = subprocess.Popen([sys.executable, __file__, "--worker", "--seed", str(seed),
                                   "--folder", folder], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                  bufsize=1)
        assert self.p.stdout.readline().strip() == "ready"

    def ask(self, i, timeout):
        self.p.stdin.write(f"{i}\n")
        self.p.stdin.flush()
        ready, _, _ = select.select([self.p.stdout], [], [], timeout)
        if not ready:
            return None
        return self.p.stdout.readline()

    def kill(self):
        self.p.kill()
        self.p.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-n", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=20.0)
    ap.add_argument("--case", help="SEED:INDEX: replay one case here, verbosely")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--folder", help=argparse.SUPPRESS)
    ap.add_argument("-v", action="store_true")
    args = ap.parse_args()
    if args.worker:
        return worker(args.seed, args.folder)
    folder = tempfile.mkdtemp(prefix="fuzz_onnx_")
    _prepare_folder(folder)
    if args.case:
        s, i = map(int, args.case.split(":"))
        print(run_one(seeds(), s, i, folder, verbose=True))
        return 0
    counts = collections.Counter()
    findings = collections.defaultdict(list)
    w = Worker(args.seed, folder)
    t0 = time.time()
    for i in range(args.start, args.start + args.n):
        line = w.ask(i, args.timeout)
        if line is None or not line:
            rc = w.p.poll()
            what = "hang" if line is None else f"crash (exit {rc})"
            counts[what.split()[0]] += 1
            findings[what].append(f"{args.seed}:{i}")
            w.kill()
            w = Worker(args.seed, folder)
            continue
        _, kind, outcome, detail = line.rstrip("\n").split("\t", 3)
        counts[outcome] += 1
        if outcome == "leak":
            findings[detail.split(":")[0] + ":" + detail.split(":")[1].split()[0]
                     if ":" in detail else detail].append(f"{args.seed}:{i} {kind} {detail}")
        if args.v and (i - args.start) % 100 == 99:
            print(f"{i - args.start + 1} cases, {dict(counts)}, {time.time() - t0:.0f}s",
                  flush=True)
    w.kill()
    print(f"n={args.n} seed={args.seed}: {dict(counts)} in {time.time() - t0:.0f}s")
    for what, cases in sorted(findings.items()):
        print(f"  {what}: {len(cases)} cases, e.g. {cases[0]}")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
