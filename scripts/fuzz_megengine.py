"""Mutational fuzzer for mgtrace.megengine: what a bad MegEngine pickle can
do to the restricted reader and the converter.

    python scripts/fuzz_megengine.py                  # 20,000 mutations, 2 worker processes
    python scripts/fuzz_megengine.py -n 2000 -j 1     # a short run

Seeds are the MegEngine 1.13 files of tests/megengine/data (traced modules
and state dicts). Each case mutates one seed, by

* ``bytes``: flips, sets, inserts, deletes or truncates raw bytes;
* ``opcode``: replaces one opcode byte with another pickle opcode;
* ``string``: replaces one string with another of the same file, a global
  name the reader refuses (``os``, ``system``, ``eval``, ``__import__``...)
  or a MegEngine name with no mgtrace counterpart;
* ``int``: replaces one small int (memo indices, shapes, axes, counts);
* ``float``: replaces one float (a quantized dtype's scale, an observer's
  eps) by NaN, an infinity, 0, a negative or a huge one;
* ``splice``: inserts a run of bytes of another seed,

then loads the result with ``mgtrace.megengine.loads`` and, when that gives
a TracedModule, calls it on the example inputs the conversion traced with.
It counts, and lists with a reproducer (seed and case number):

* exceptions other than mgtrace's (``mgtrace.Error``) (must be 0);
* crashes (a worker process dying: must be 0);
* cases slower than 5 s (listed; a loaded 2-core machine makes them noisy).

Workers are subprocesses, so a crash is caught and the run goes on. Exit
status 0 when every must-be-0 count is 0, else 1.
"""
import argparse
import glob
import json
import os
import pickletools
import random
import struct
import subprocess
import sys
import tempfile
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
DATA = os.path.join(REPO, "tests", "megengine", "data")
if REPO not in sys.path:            # this checkout's mgtrace, installed or not
    sys.path.insert(0, REPO)
KINDS = ("bytes", "opcode", "string", "int", "float", "splice")
SLOW_S = 5.0
HOSTILE_NAMES = ["os", "system", "posix", "builtins", "eval", "exec", "__import__", "getattr",
                 "subprocess", "Popen", "__reduce__", "__setstate__", "__class__", "__globals__",
                 "numpy", "load", "pickle", "loads", "Tensor.__class__", "O", "V8", "f4", "<",
                 "megengine.module.rnn", "LSTM", "megengine.functional.nn", "deformable_conv2d",
                 "__call__", "__setitem__", "numpy.core.multiarray", "_reconstruct", "scalar",
                 # the quantization records: dtype metadata, observers, QAT and quantized modules
                 "mgb_dtype", "name", "scale", "zero_point", "QuantizedS8", "QuantizedS16",
                 "Quantized8Asymm", "QuantizedS32", "qint8", "quint8", "qint16",
                 "PassiveObserver", "megengine.quantization.observer", "QuantMode",
                 "QuantDtypeMeta", "QParams", "output_dtype", "qadd", "add", "momentum",
                 "megengine.module.quantized.conv", "megengine.module.qat.linear"]
_OPCODES = [op.code.encode("latin-1") for op in pickletools.opcodes]


def seeds():
    """``[(name, bytes)]`` of the test files, sorted by name."""
    out = []
    files = glob.glob(os.path.join(DATA, "*.tm")) + glob.glob(os.path.join(DATA, "*.pkl"))
    for p in sorted(files):
        with open(p, "rb") as f:
            out.append((os.path.basename(p), f.read()))
    return out


def _ops(data):
    try:
        return list(pickletools.genops(data))
    except Exception:
        return []


def mutate(data, kind, rnd, others):
    b = bytearray(data)
    if kind == "bytes" or not b:
        for _ in range(rnd.randint(1, 4)):
            i = rnd.randrange(max(len(b), 1))
            what = rnd.randrange(5)
            if what == 0 and b:
                b[i % len(b)] ^= 1 << rnd.randrange(8)
            elif what == 1 and b:
                b[i % len(b)] = rnd.choice([0, 1, 0x7F, 0x80, 0xFF, rnd.randrange(256)])
            elif what == 2:
                b[i:i] = bytes(rnd.randrange(256) for _ in range(rnd.randint(1, 8)))
            elif what == 3:
                del b[i:i + rnd.randint(1, 16)]
            else:
                del b[rnd.randrange(max(len(b), 1)):]
        return bytes(b)
    ops = _ops(data)
    if kind == "opcode" and ops:
        _, _, pos = rnd.choice(ops)
        b[pos] = rnd.choice(_OPCODES)[0]
        return bytes(b)
    if kind == "string":
        strs = [(a, p) for op, a, p in ops if op.name == "SHORT_BINUNICODE"]
        if strs:
            _, pos = rnd.choice(strs)
            pool = HOSTILE_NAMES + [a for a, _ in strs]
            new = rnd.choice(pool).encode()[:255]
            old_len = b[pos + 1]
            b[pos + 1:pos + 2 + old_len] = bytes([len(new)]) + new
            return bytes(b)
    if kind == "int":
        ints = [(op, p) for op, a, p in ops if op.name in ("BININT1", "BININT2", "BINPUT",
                                                           "BINGET", "BININT")]
        if ints:
            op, pos = rnd.choice(ints)
            width = {"BININT1": 1, "BINPUT": 1, "BINGET": 1, "BININT2": 2, "BININT": 4}[op.name]
            value = rnd.choice([0, 1, 2, 7, 255, rnd.randrange(1 << (8 * width))])
            b[pos + 1:pos + 1 + width] = value.to_bytes(width, "little")
            return bytes(b)
    if kind == "float":
        floats = [p for op, a, p in ops if op.name == "BINFLOAT"]
        if floats:
            pos = rnd.choice(floats)
            value = rnd.choice([float("nan"), float("inf"), -float("inf"), 0.0, -1.0, 1e300,
                                5e-324, rnd.uniform(-2, 2)])
            b[pos + 1:pos + 9] = struct.pack(">d", value)
            return bytes(b)
    # splice (and the fallback of the kinds above)
    src = rnd.choice(others)
    i, j = rnd.randrange(len(src) + 1), rnd.randrange(len(b) + 1)
    b[j:j] = src[i:i + rnd.randint(1, 64)]
    return bytes(b)


def _case(data):
    """'ok', 'refused' or an unexpected exception's text."""
    import mgtrace
    from mgtrace.megengine.convert import convert
    try:
        obj, args, kwargs = convert(data, "fuzz")
        if args is not None:
            obj(*args, **kwargs)
        return "ok"
    except mgtrace.Error:
        return "refused"
    except Exception as e:  # what the run must not see
        return f"{type(e).__name__}: {str(e)[:300]}"


def worker(seed, start, count, progress):
    warnings.simplefilter("ignore")
    import mgtrace.megengine.convert   # noqa: F401  (imported before the first case is timed)
    all_seeds = seeds()
    stats = {"cases": 0, "ok": 0, "refused": 0, "unexpected": 0, "slow": 0}
    notes = []
    for i in range(start, start + count):
        rnd = random.Random(seed * 1_000_003 + i)
        name, data = all_seeds[rnd.randrange(len(all_seeds))]
        kind = rnd.choice(KINDS)
        mutated = mutate(data, kind, rnd, [d for _, d in all_seeds])
        with open(progress, "w") as f:
            f.write(str(i))
        t0 = time.perf_counter()
        res = _case(mutated)
        dt = time.perf_counter() - t0
        stats["cases"] += 1
        if res in ("ok", "refused"):
            stats[res] += 1
        else:
            stats["unexpected"] += 1
            notes.append({"case": i, "seed": seed, "file": name, "kind": kind, "error": res})
        if dt > SLOW_S:
            stats["slow"] += 1
            notes.append({"case": i, "seed": seed, "file": name, "kind": kind,
                          "slow_s": round(dt, 2)})
    return stats, notes


def run(n, jobs, seed, quiet=False):
    chunk = 250
    todo = [(b, min(b + chunk, n)) for b in range(0, n, chunk)]
    total = {"cases": 0, "ok": 0, "refused": 0, "unexpected": 0, "slow": 0}
    notes, crashes, running = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        def start(begin, end):
            prog = os.path.join(tmp, f"p{begin}")
            out = os.path.join(tmp, f"o{begin}.json")
            p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker",
                                  str(seed), str(begin), str(end - begin), prog, out])
            running.append((p, begin, end, prog, out))

        while todo or running:
            while todo and len(running) < jobs:
                start(*todo.pop(0))
            p, begin, end, prog, out = running.pop(0)
            p.wait()
            if p.returncode == 0 and os.path.exists(out):
                with open(out) as f:
                    stats, got = json.load(f)
                for k in total:
                    total[k] += stats[k]
                notes += got
            else:
                last = int(open(prog).read()) if os.path.exists(prog) else begin
                crashes.append({"case": last, "seed": seed, "returncode": p.returncode})
                total["cases"] += last - begin + 1
                if last + 1 < end:
                    todo.insert(0, (last + 1, end))     # go on after the crashing case
            if not quiet:
                print(f"  {total['cases']} cases, {total['unexpected']} unexpected, "
                      f"{len(crashes)} crashes", file=sys.stderr, flush=True)
    total["crashes"] = len(crashes)
    return total, notes, crashes


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-n", type=int, default=20_000, help="mutations (default 20,000)")
    ap.add_argument("-j", type=int, default=2, help="worker processes (default 2)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
    ap.add_argument("-q", action="store_true", help="no progress lines")
    a = ap.parse_args(argv)
    if a.worker:
        seed, begin, count, prog, out = a.worker
        stats, notes = worker(int(seed), int(begin), int(count), prog)
        with open(out, "w") as f:
            json.dump([stats, notes], f)
        return 0
    t0 = time.time()
    total, notes, crashes = run(a.n, a.j, a.seed, a.q)
    print(json.dumps({"total": total, "seconds": round(time.time() - t0, 1)}, indent=1))
    for x in notes + crashes:
        print(json.dumps(x))
    return 0 if total["unexpected"] == 0 and total["crashes"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
