"""Archive save/load: mgtrace's .tmod next to torch.save, safetensors and pickle.

    python benchmarks/bench_archive.py            # short: 5 repeats
    python benchmarks/bench_archive.py --full     # 11 repeats
    python benchmarks/bench_archive.py --models resnet18

For a traced ResNet-18 (random weights, traced at 1x3x64x64) and a traced
MiniLM-L6 encoder (the all-MiniLM-L6-v2 sizes, random weights, traced at
2x16 tokens):

* a mmap load without verify is lazy about graphs (read on first use: a
  call, ``.graph``...); the row below it times the load plus reading them;
* time: best and median (p50) of the repeats, the operations of one model
  interleaved round by round (so a slow phase of the machine hits all of
  them), files in a temporary folder (page cache warm); a load is complete
  when every tensor is in memory (copy) or mapped (mmap), with verify on
  (CRC-32 of every tensor) or off; a save is complete when the file is on
  disk: mgtrace's save fsyncs, so every peer's save here is followed by an
  fsync of its file too;
* file: size on disk, and its overhead above the raw tensor bytes;
* peak: resident set above the baseline while the operation runs, measured
  in a fresh process (``/proc/self/clear_refs`` resets VmHWM, then VmHWM
  minus the resident set before), as MiB and as % of the tensor bytes. For
  mmap loads it counts the file pages the load touches (verify reads them
  all; without verify nothing is touched until used).

Next to them, on the same weights (a state dict with the same names, shapes
and values): ``torch.save`` / ``torch.load`` (also ``mmap=True``) when torch
is installed, ``safetensors.numpy`` when safetensors is, and ``pickle``
(protocol 5) of NumPy arrays; rows of a library not installed are left out
(the table says which). "vs torch" is the best time divided by torch's best
for the same kind of operation (save; copying load; mmap load), then the
same for medians. mgtrace's loads build the whole traced module (graphs and
modules), torch's and safetensors' only a dict of tensors. Not a test:
nothing is asserted.
"""
import argparse
import gc
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time

import _checkout

_checkout.use()     # this checkout if it is built in place, else the installed mgtrace


def _has(module):
    try:
        __import__(module)
        return True
    except ImportError:
        return False


# ------------------------------------------------------------------ models

def _traced(model):
    import numpy as np
    import mgtrace as mt
    import mgtrace.models as models
    mt.random.seed(0)
    if model == "resnet18":
        net = models.resnet18()
        x = (mt.tensor(np.random.default_rng(0).standard_normal((1, 3, 64, 64), dtype=np.float32)),)
    else:
        net = models.MiniLM()
        ids = mt.tensor(np.random.default_rng(0).integers(0, 30522, (2, 16)).astype(np.int32))
        x = (ids, mt.tensor(np.ones((2, 16), np.int32)))
    return mt.trace_module(net.eval(), *x)


def _write_files(model, folder):
    """The archive and the baselines' files of ``model``; returns {kind: path}
    and the raw tensor bytes."""
    import mgtrace as mt
    tm = _traced(model)
    state = {k: v.numpy() for k, v in tm.state_dict().items()}
    paths = {"tmod": os.path.join(folder, f"{model}.tmod"),
             "pickle": os.path.join(folder, f"{model}.pkl")}
    mt.save(tm, paths["tmod"])
    with open(paths["pickle"], "wb") as f:
        pickle.dump(state, f, protocol=5)
    if _has("torch"):
        import torch
        paths["torch"] = os.path.join(folder, f"{model}.pt")
        torch.save({k: torch.from_numpy(v.copy()) for k, v in state.items()}, paths["torch"])
    if _has("safetensors"):
        from safetensors.numpy import save_file
        paths["safetensors"] = os.path.join(folder, f"{model}.safetensors")
        save_file({k: v.copy() for k, v in state.items()}, paths["safetensors"])
    return paths, sum(v.nbytes for v in state.values())


# -------------------------------------------------------------- operations
# each: (label, kind of file, "save" | "load" | "mmap", prepare(path) -> state, run(state, path))

def _tmod_load(mmap, verify):
    def run(_, path):
        import mgtrace as mt
        return mt.load(path, mmap=mmap, verify=verify)
    return run


def _tmod_load_graphs(_, path):
    """A lazy load (mmap, no verify) and then its graphs read, as the first
    call or inspection reads them (code generation not included)."""
    import mgtrace as mt
    tm = mt.load(path, mmap=True, verify=False)
    for m in tm.modules():
        getattr(m, "_graphs", None)
    return tm


def _prepare_tmod(path):
    import mgtrace as mt
    return mt.load(path)


def _save_tmod(tm, path):
    import mgtrace as mt
    mt.save(tm, path + ".out")          # atomic: written, fsynced, renamed


def _fsync(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _prepare_state(kind):
    def prepare(path):
        if kind == "torch":
            import torch
            return torch.load(path, weights_only=True)
        if kind == "safetensors":
            from safetensors.numpy import load_file
            return load_file(path)
        with open(path, "rb") as f:
            return pickle.load(f)
    return prepare


def _save_torch(state, path):
    import torch
    torch.save(state, path + ".out")
    _fsync(path + ".out")


def _load_torch(mmap):
    def run(_, path):
        import torch
        return torch.load(path, weights_only=True, mmap=mmap)
    return run


def _save_safetensors(state, path):
    from safetensors.numpy import save_file
    save_file(state, path + ".out")
    _fsync(path + ".out")


def _load_safetensors(_, path):
    from safetensors.numpy import load_file
    return load_file(path)


def _save_pickle(state, path):
    with open(path + ".out", "wb") as f:
        pickle.dump(state, f, protocol=5)
        f.flush()
        os.fsync(f.fileno())


def _load_pickle(_, path):
    with open(path, "rb") as f:
        return pickle.load(f)


def _none(path):
    return None


OPS = [
    ("mgtrace save", "tmod", "save", _prepare_tmod, _save_tmod),
    ("mgtrace load (copy, verify)", "tmod", "load", _none, _tmod_load(False, True)),
    ("mgtrace load (copy, no verify)", "tmod", "load", _none, _tmod_load(False, False)),
    ("mgtrace load (mmap, verify)", "tmod", "mmap", _none, _tmod_load(True, True)),
    ("mgtrace load (mmap, no verify)", "tmod", "mmap", _none, _tmod_load(True, False)),
    ("  + graphs read (first use)", "tmod", "mmap", _none, _tmod_load_graphs),
    ("torch.save + fsync", "torch", "save", _prepare_state("torch"), _save_torch),
    ("torch.load", "torch", "load", _none, _load_torch(False)),
    ("torch.load (mmap)", "torch", "mmap", _none, _load_torch(True)),
    ("safetensors save_file + fsync", "safetensors", "save", _prepare_state("safetensors"),
     _save_safetensors),
    ("safetensors load_file", "safetensors", "load", _none, _load_safetensors),
    ("pickle dump + fsync (numpy)", "pickle", "save", _prepare_state("pickle"), _save_pickle),
    ("pickle load (numpy)", "pickle", "load", _none, _load_pickle),
]


def _times(ops, paths, repeats):
    """``{label: [seconds of each call]}``: the ops run in turn, ``repeats`` rounds."""
    states = {op[0]: op[3](paths[op[1]]) for op in ops}
    times = {op[0]: [] for op in ops}
    for _ in range(repeats):
        for label, kind, _, _, run in ops:
            gc.collect()
            t = time.perf_counter()
            out = run(states[label], paths[kind])
            times[label].append(time.perf_counter() - t)
            del out
    return times


# ------------------------------------------------------------------ memory

def _status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return None


def _measure(index, path):
    """Child process: peak resident bytes above the baseline for one op."""
    op = OPS[index]
    state = op[3](path)
    import mgtrace   # noqa: F401  (the library is part of the baseline, not of the op)
    if op[1] == "torch":
        import torch  # noqa: F401
    gc.collect()
    base = _status("VmRSS")
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")             # reset VmHWM to the current resident set
    except OSError:
        return None
    out = op[4](state, path)
    peak = _status("VmHWM")
    del out
    return peak - base


def _peak(index, path):
    cmd = [sys.executable, os.path.abspath(__file__), "--measure", str(index), path]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=_checkout.CHILD_CWD)
    if res.returncode != 0:
        return None
    return json.loads(res.stdout.strip().splitlines()[-1])["peak"]


# ------------------------------------------------------------------ report

def _rows(model, repeats, folder):
    paths, tensor_bytes = _write_files(model, folder)
    ops = [op for op in OPS if op[1] in paths]
    times = _times(ops, paths, repeats)
    rows = []
    for op in ops:
        label, kind, what = op[:3]
        path = paths[kind]
        ts = sorted(times[label])
        rows.append({"model": model, "op": label, "kind": kind, "what": what,
                     "time": ts[0], "p50": ts[len(ts) // 2], "size": os.path.getsize(path),
                     "peak": _peak(OPS.index(op), path), "tensor_bytes": tensor_bytes})
    torch_rows = {r["what"]: r for r in rows if r["kind"] == "torch"}
    for r in rows:
        ref = torch_rows.get(r["what"])
        r["vs_torch"] = None if ref is None else r["time"] / ref["time"]
        r["vs_torch_p50"] = None if ref is None else r["p50"] / ref["p50"]
    return rows


def _print(rows):
    mib = 1 << 20
    model = None
    head = (f"{'operation':32} {'best ms':>8} {'p50 ms':>8} {'vs torch':>12} {'file MiB':>9} "
            f"{'overhead':>9} {'peak MiB':>9} {'peak %':>7}")
    for r in rows:
        if r["model"] != model:
            model = r["model"]
            print(f"\n{model}: {r['tensor_bytes'] / mib:.1f} MiB of tensors")
            print(head)
            print("-" * len(head))
        overhead = (r["size"] - r["tensor_bytes"]) / r["tensor_bytes"] * 100
        ratio = "" if r["vs_torch"] is None else f"{r['vs_torch']:.2f}/{r['vs_torch_p50']:.2f}x"
        peak = "" if r["peak"] is None else f"{r['peak'] / mib:.1f}"
        pct = "" if r["peak"] is None else f"{r['peak'] / r['tensor_bytes'] * 100:.0f}%"
        print(f"{r['op']:32} {r['time'] * 1e3:8.1f} {r['p50'] * 1e3:8.1f} {ratio:>12} "
              f"{r['size'] / mib:9.1f} {overhead:8.2f}% {peak:>9} {pct:>7}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="11 repeats instead of 5")
    ap.add_argument("--models", default="resnet18,minilm", help="comma-separated: resnet18, minilm")
    ap.add_argument("--json", help="also write the rows to this file")
    ap.add_argument("--measure", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.measure:
        print(json.dumps({"peak": _measure(int(args.measure[0]), args.measure[1])}))
        return
    repeats = 11 if args.full else 5
    missing = [m for m in ("torch", "safetensors") if not _has(m)]
    if missing:
        print(f"(not installed, rows skipped: {', '.join(missing)})")
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for model in args.models.split(","):
            rows += _rows(model.strip(), repeats, folder)
    _print(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
