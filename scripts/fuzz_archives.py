"""Mutational fuzzer for .tmod archives: what a bad archive can do to a reader.

    python scripts/fuzz_archives.py                  # 100,000 mutations, 2 worker processes
    python scripts/fuzz_archives.py -n 2000 -j 1     # a short run

Seeds are small real archives (a traced conv net and a traced net with
functions, methods and module calls, each with example inputs; a builtin
Sequential; a state dict; nested values). Each case mutates one seed, by

* ``bytes``: flips, sets, inserts, deletes or truncates raw bytes anywhere;
* ``header-bytes``: the same, inside the header only;
* ``header-values``: decodes the header, changes one value (an int, a
  string, a list item, a map key) and packs it again, the seal left stale;
* ``resealed``: like header-values, then seals the header again, so the
  decoder behind the seal is exercised (such a file is a well-formed
  archive of something else: its outputs may differ, and are not counted),

and loads the result four ways (copy or mmap, verify on or off). It counts,
and lists with a reproducer (seed and case number):

* exceptions other than ArchiveError while loading (must be 0), reading
  the graphs of a lazy load (mmap, verify off) included;
* crashes (a worker process dying: must be 0), while loading or calling;
* loads slower than 1 s (must be 0);
* models that loaded with verify=True whose outputs on the stored example
  inputs differ from the unmutated archive's (must be 0 outside resealed).

Workers are subprocesses, so a crash is caught and the run goes on. Exit
status 0 when every must-be-0 count is 0, else 1.
"""
import argparse
import io
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import warnings

import msgpack
import numpy as np

KINDS = ("bytes", "header-bytes", "header-values", "resealed")
SLOW_S = 1.0
WAYS = [(False, True), (True, True), (False, False), (True, False)]    # (mmap, verify)


# ------------------------------------------------------------------ seeds
def seeds(target=None):
    """``[(name, archive bytes)]``, deterministic; ``target`` is save's
    target_version (``(1, 0)``: archives without the 1.1 header seal)."""
    import mgtrace as mt
    import mgtrace.functional as F
    import mgtrace.module as M
    global _TARGET
    _TARGET = target
    rng = np.random.default_rng(0)

    class Conv(M.Module):
        def __init__(self):
            super().__init__()
            self.conv = M.Conv2d(3, 4, 3, padding=1)
            self.bn = M.BatchNorm2d(4)
            self.fc = M.Linear(4 * 4 * 4, 5)

        def forward(self, x):
            y = F.relu(self.bn(self.conv(x)))
            return self.fc(y.reshape(y.shape[0], -1))

    class Mixed(M.Module):
        def __init__(self):
            super().__init__()
            self.blocks = M.Sequential(M.Linear(6, 6), M.GELU(), M.LayerNorm(6))
            self.emb = M.Embedding(10, 6)

        def forward(self, x, idx):
            h = self.blocks(x) + self.emb(idx).mean(axis=1)
            h = F.concat([h, h * 2], axis=-1).transpose(1, 0)
            return {"out": F.softmax(h.T, axis=-1), "n": h.sum(axis=0, keepdims=True)}

    def randomize(net):
        net.load_state_dict({k: mt.tensor(rng.standard_normal(v.shape).astype("float32") * 0.5)
                             if v.dtype.name == "float32" else v
                             for k, v in net.state_dict().items()})
        return net.eval()

    x = mt.tensor(rng.standard_normal((2, 3, 4, 4)).astype("float32"))
    xm = mt.tensor(rng.standard_normal((3, 6)).astype("float32"))
    idx = mt.tensor(rng.integers(0, 10, (3, 2)).astype("int32"))
    seq = randomize(M.Sequential(M.Linear(4, 8), M.ReLU(), M.Linear(8, 2)))
    xs = mt.tensor(rng.standard_normal((2, 4)).astype("float32"))
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out.append(("conv", _save(mt.trace_module(randomize(Conv()), x), (x,))))
        out.append(("mixed", _save(mt.trace_module(randomize(Mixed()), xm, idx), (xm, idx))))
    out.append(("sequential", _save(seq, (xs,))))
    out.append(("state_dict", _save(seq.state_dict())))
    out.append(("values", _save({"w": xs, (1, 2): [None, True, -0.0, 2 ** 70, b"xy"],
                                 "s": slice(1, None), "d": mt.as_dtype("float16")})))
    if target is None or tuple(target) >= (1, 2):       # format 1.2 views of one storage
        base = mt.tensor(rng.standard_normal((4, 6)).astype("float32"))
        out.append(("views", _save({"b": base, "s": base[1:3, ::2], "t": base.T,
                                    "r": base[::-1], "row": base[2].broadcast_to((3, 6))})))
    return out


def _save(obj, inputs=None):
    import mgtrace as mt
    buf = io.BytesIO()
    mt.save(obj, buf, example_inputs=inputs, metadata={"fuzz": True}, target_version=_TARGET)
    return buf.getvalue()


_TARGET = None


# --------------------------------------------------------------- mutating
def _header_span(data):
    hlen = int.from_bytes(data[8:16], "little")
    return 16, 16 + hlen


def _mutate_bytes(data, rnd, lo, hi):
    data = bytearray(data)
    for _ in range(rnd.randint(1, 3)):
        if hi <= lo or lo >= len(data):
            break
        pos = rnd.randrange(lo, min(hi, len(data)))
        op = rnd.choice(("flip", "flip", "set", "insert", "delete", "truncate"))
        if op == "flip":
            data[pos] ^= 1 << rnd.randrange(8)
        elif op == "set":
            data[pos] = rnd.choice((0x00, 0xFF, 0x7F, 0x80, 0xC0, 0xC1, 0xCF, 0xD3, 0xDC,
                                    0xDD, 0xDE, 0xDF, rnd.randrange(256)))
        elif op == "insert":
            data[pos:pos] = bytes(rnd.randrange(256) for _ in range(rnd.randint(1, 8)))
        elif op == "delete":
            del data[pos:pos + rnd.randint(1, 16)]
        else:
            del data[pos:]
    return bytes(data)


def _leaves(obj, path=()):
    """Every (path, value) inside a decoded header, containers included."""
    yield path, obj
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _leaves(v, path + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _leaves(v, path + (i,))


def _new_value(v, rnd):
    if isinstance(v, bool):
        return not v
    if isinstance(v, int):
        return rnd.choice((v + 1, v - 1, 0, -1, 2 ** 31, 2 ** 62 + 1, -(2 ** 63), v * 1000,
                           rnd.randrange(-1000, 1000)))
    if isinstance(v, float):
        return rnd.choice((v * 2, -v, float("nan"), float("inf"), 0.0))
    if isinstance(v, str):
        return rnd.choice((v + "x", v[:-1], "", v.upper(), "__class__", "os.system", v * 50,
                           "float64", "int8", "tensor", "node", "module"))
    if isinstance(v, list):
        if v and rnd.random() < 0.5:
            w = list(v)
            del w[rnd.randrange(len(w))]
            return w
        return v + [v[rnd.randrange(len(v))]] if v else [0]
    if isinstance(v, dict):
        if v:
            w = dict(v)
            w.pop(rnd.choice(list(w)))
            return w
        return {"x": 1}
    return rnd.choice((None, 0, "x", [], {}))


def _set(obj, path, value):
    for k in path[:-1]:
        obj = obj[k]
    obj[path[-1]] = value


def _mutate_header(data, rnd, reseal):
    from mgtrace.serialization import header as H
    from mgtrace.serialization.layout import PREFIX, data_start, pack_prefix
    a, b = _header_span(data)
    header = msgpack.unpackb(data[a:b], raw=False)
    payload = data[data_start(b - a):]
    leaves = [p for p, _ in _leaves(header) if p and p[0] != H.SEAL]
    for _ in range(rnd.randint(1, 2)):
        path = rnd.choice(leaves)
        try:
            v = header
            for k in path:
                v = v[k]
            _set(header, path, _new_value(v, rnd))
        except (KeyError, IndexError, TypeError):
            pass
    seal = header.pop(H.SEAL, None)
    if reseal:
        raw = H.pack(header, sealed=seal is not None)
    else:
        if seal is not None:
            header[H.SEAL] = seal       # stale: the bytes it sealed are gone
        raw = msgpack.packb(header, use_bin_type=True)
    pad = data_start(len(raw)) - PREFIX.size - len(raw)
    return pack_prefix(len(raw)) + raw + bytes(pad) + payload


def mutate(data, kind, rnd):
    if kind == "bytes":
        return _mutate_bytes(data, rnd, 0, len(data))
    if kind == "header-bytes":
        return _mutate_bytes(data, rnd, *_header_span(data))
    for _ in range(20):         # a new value msgpack cannot hold (an int past 64 bits): again
        try:
            return _mutate_header(data, rnd, reseal=kind == "resealed")
        except (OverflowError, ValueError, TypeError):
            pass
    return _mutate_bytes(data, rnd, *_header_span(data))


# ----------------------------------------------------------------- running
def _outputs(obj, arc):
    """The flattened outputs of ``obj`` on the archive's stored inputs (or
    the tensors of a non-module), as NumPy arrays."""
    import mgtrace as mt
    from mgtrace.module import Module
    from mgtrace.traced_module.pytree import tree_flatten
    if isinstance(obj, Module) and arc is not None and arc.example_inputs is not None:
        obj = obj(*arc.example_inputs, **arc.example_kwargs)
    leaves, _ = tree_flatten(obj, lambda t: isinstance(t, mt.Tensor))
    return [t.numpy() if isinstance(t, mt.Tensor) else t for t in leaves]


def _same(a, b):
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if isinstance(x, np.ndarray) and isinstance(y, np.ndarray):
            if x.shape != y.shape or x.dtype != y.dtype or \
                    not np.array_equal(x, y, equal_nan=x.dtype.kind in "fc"):
                return False
        elif isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            return False
        else:
            try:
                if not (x == y or (x != x and y != y)):
                    return False
            except Exception:
                return False
    return True


def _case(i, seed, cases, path, want, stats, notes):
    import mgtrace as mt
    from mgtrace.serialization import load_archive
    rnd = random.Random(seed * 1_000_003 + i)
    name, data, arc0 = cases[rnd.randrange(len(cases))]
    kind = KINDS[rnd.randrange(len(KINDS))]
    bad = mutate(data, kind, rnd)
    with open(path, "wb") as f:
        f.write(bad)
    stats["cases"] += 1
    stats["by_kind"][kind] = stats["by_kind"].get(kind, 0) + 1
    for mmap, verify in WAYS:
        stats["loads"] += 1
        t0 = time.perf_counter()
        try:
            arc = load_archive(path, mmap=mmap, verify=verify)
            _read_graphs(arc.obj)
        except mt.ArchiveError:
            stats["archive_errors"] += 1
            continue
        except Exception as e:           # noqa: BLE001  what the fuzzer looks for
            stats["other_errors"] += 1
            notes.append({"what": "non-ArchiveError at load", "case": i, "seed": seed,
                          "kind": kind, "archive": name, "mmap": mmap, "verify": verify,
                          "error": f"{type(e).__name__}: {e}"[:300]})
            continue
        finally:
            dt = time.perf_counter() - t0
            stats["slowest_s"] = max(stats["slowest_s"], dt)
            if dt > SLOW_S and len(bad) < 4 << 20:
                stats["slow_loads"] += 1
                notes.append({"what": "slow load", "case": i, "seed": seed, "kind": kind,
                              "archive": name, "seconds": round(dt, 3)})
        stats["loaded"] += 1
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                got = _outputs(arc.obj, arc0)
        except Exception as e:           # noqa: BLE001
            stats["call_errors"] += 1
            if verify and kind != "resealed":      # a resealed file is another valid archive
                notes.append({"what": "a verified load that fails when called", "case": i,
                              "seed": seed, "kind": kind, "archive": name,
                              "error": f"{type(e).__name__}: {e}"[:300]})
            continue
        if verify and not _same(got, want[name]):
            key = "resealed_different" if kind == "resealed" else "verified_different"
            stats[key] += 1
            if key == "verified_different":
                notes.append({"what": "verified load gives different outputs", "case": i,
                              "seed": seed, "kind": kind, "archive": name, "mmap": mmap})


def _read_graphs(obj):
    """Read the graphs of a lazy load (mmap, verify off: read on first use),
    so that what reading them raises counts as part of the load."""
    if hasattr(obj, "modules"):
        for m in obj.modules():
            getattr(m, "_graphs", None)


def _new_stats():
    return {"cases": 0, "loads": 0, "archive_errors": 0, "other_errors": 0, "loaded": 0,
            "call_errors": 0, "slow_loads": 0, "slowest_s": 0.0, "verified_different": 0,
            "resealed_different": 0, "by_kind": {}}


def worker(seed, start, count, out, target=None):
    """Run cases ``start .. start + count``, writing to ``out`` a line before
    each case (``{"at": i}``: a worker that dies leaves its last case named)
    and one after it with what it counted (``{"done": i, "stats", "notes"}``)."""
    from mgtrace.serialization import load_archive
    cases, want = [], {}
    for name, data in seeds(target):
        with tempfile.NamedTemporaryFile(suffix=".tmod", delete=False) as f:
            f.write(data)
        arc = load_archive(f.name)
        os.unlink(f.name)
        cases.append((name, data, arc))
        want[name] = _outputs(arc.obj, arc)
    fd, path = tempfile.mkstemp(suffix=".tmod")
    os.close(fd)
    with open(out, "a") as log:
        try:
            for i in range(start, start + count):
                log.write(json.dumps({"at": i}) + "\n")
                log.flush()
                stats, notes = _new_stats(), []
                _case(i, seed, cases, path, want, stats, notes)
                log.write(json.dumps({"done": i, "stats": stats, "notes": notes}) + "\n")
        finally:
            os.unlink(path)


def _merge(total, stats):
    for k, v in stats.items():
        if k == "by_kind":
            for kk, vv in v.items():
                total["by_kind"][kk] = total["by_kind"].get(kk, 0) + vv
        elif k == "slowest_s":
            total[k] = max(total.get(k, 0.0), v)
        else:
            total[k] = total.get(k, 0) + v


def run(n, jobs, seed, quiet=False, unsealed=False):
    """Run ``n`` cases in ``jobs`` worker processes; returns (stats, notes,
    crashes). ``unsealed``: seeds written as format 1.0 (no header seal)."""
    here = os.path.abspath(__file__)
    per = -(-n // jobs)
    todo = [(s, min(per, n - s)) for s in range(0, n, per)]
    total = _new_stats()
    notes, crashes = [], []
    tmp = tempfile.mkdtemp(prefix="mgtrace-fuzz-")
    t0 = time.perf_counter()
    while todo:
        procs = []
        for k, (start, count) in enumerate(todo):
            log = os.path.join(tmp, f"w{start}.jsonl")
            p = subprocess.Popen([sys.executable, here, "--worker", str(seed), str(start),
                                  str(count), log] + (["1.0"] if unsealed else []))
            procs.append((p, start, count, log))
        todo = []
        for p, start, count, log in procs:
            p.wait()
            if not os.path.exists(log):
                raise RuntimeError(f"a fuzz worker failed before its first case (exit "
                                   f"{p.returncode}); see its error above")
            lines = [json.loads(ln) for ln in open(log) if ln.strip()]
            os.unlink(log)
            last = max((ln["at"] for ln in lines if "at" in ln), default=start - 1)
            for ln in lines:
                if "stats" in ln:
                    _merge(total, ln["stats"])
                    if len(notes) < 200:
                        notes += ln["notes"]
            if p.returncode != 0:        # died in case `last`: note it, go on after it
                crashes.append({"case": last, "seed": seed, "returncode": p.returncode,
                                "reproduce": f"python {here} --worker {seed} {last} 1 /dev/stdout"
                                             + (" 1.0" if unsealed else "")})
                if last + 1 < start + count:
                    todo.append((last + 1, start + count - last - 1))
        if not quiet:
            print(f"  {total.get('cases', 0)} cases, {len(crashes)} crashes, "
                  f"{time.perf_counter() - t0:.0f} s", file=sys.stderr)
    os.rmdir(tmp)
    total["crashes"] = len(crashes)
    total["seconds"] = round(time.perf_counter() - t0, 1)
    return total, notes, crashes


def failures(stats):
    """The must-be-zero counts that are not zero."""
    keys = ("other_errors", "crashes", "slow_loads", "verified_different")
    return {k: stats.get(k, 0) for k in keys if stats.get(k, 0)}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--worker":
        worker(int(argv[1]), int(argv[2]), int(argv[3]), argv[4],
               (1, 0) if argv[5:] == ["1.0"] else None)
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("-n", type=int, default=100_000, help="mutations (default 100000)")
    p.add_argument("-j", type=int, default=2, help="worker processes (default 2)")
    p.add_argument("--seed", type=int, default=1, help="RNG seed (cases are reproducible)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--unsealed", action="store_true",
                   help="fuzz format 1.0 seeds (no header seal), to see what the seal catches")
    args = p.parse_args(argv)
    stats, notes, crashes = run(args.n, max(1, args.j), args.seed, unsealed=args.unsealed)
    result = {"stats": stats, "failures": failures(stats), "notes": notes[:50],
              "crashes": crashes[:50]}
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(json.dumps(stats, indent=1))
        for n in notes[:20] + crashes[:20]:
            print(n)
        print("FAILED: " + json.dumps(result["failures"]) if result["failures"] else "all clear")
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
