"""A folder of small archives, good and bad, and a way to run the real command.

The folder (built once per session, copied per test that writes):

    good/net0.tmod, good/net1.tmod   traced Net, example inputs and metadata stored
                                     (net1 written as format 1.0: upgrade rewrites it)
    good/sub/net2.tmod               the same, one folder down
    good/seq.tmod                    a plain Sequential of builtin modules (not traced)
    good/newer_minor.tmod            format 1.3, min reader 1.0, a field this reader does not
                                     know: readable; upgrade and retrace leave it as it is
    good/state.tmod                  a dict of tensors (no module)
    noex/noex.tmod                   traced Net without example inputs
    bad/corrupt.tmod                 one byte of a weight flipped (checksum)
    bad/truncated.tmod               cut in the middle of the header
    bad/toonew_major.tmod            format 2.0
    bad/toonew_reader.tmod           format 1.5 that needs a 1.3 reader
    bad/unregistered.tmod            calls tests.cli.swish, registered only while building
    bad/mismatch.tmod                stored outputs off by 1e-3 (relative): fails the default
                                     tolerance, passes --rtol 1e-2
"""
import contextlib
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module as M
from mgtrace.serialization import register_function, registry
from mgtrace.serialization.tensors import checksum
from mgtrace.traced_module import wrap
from serialization.helpers import edit, pack, split     # tests/ is on sys.path

REPO = Path(__file__).resolve().parents[2]

GOOD = ["good/net0.tmod", "good/net1.tmod", "good/newer_minor.tmod", "good/seq.tmod",
        "good/state.tmod", "good/sub/net2.tmod"]
BAD = {  # file -> (error type in the reason, words of the reason)
    "bad/corrupt.tmod": ("ArchiveError", "checksum mismatch"),
    "bad/truncated.tmod": ("ArchiveError", "truncated"),
    "bad/toonew_major.tmod": ("VersionError", "format 2.0"),
    "bad/toonew_reader.tmod": ("VersionError", "reads format 1.3"),
    "bad/unregistered.tmod": ("RegistryError", "tests.cli.swish"),
}


class Net(M.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = M.Linear(4, 8)
        self.act = M.ReLU()
        self.fc2 = M.Linear(8, 3)

    def forward(self, x):
        return F.softmax(self.fc2(self.act(self.fc1(x))) * 2, axis=-1)


def swish(x):
    return x * F.sigmoid(x)


class UsesSwish(M.Module):
    def __init__(self):
        super().__init__()
        self.fc = M.Linear(4, 3)

    def forward(self, x):
        return _swish(self.fc(x))


_swish = wrap(swish)


def make_net(seed):
    rng = np.random.default_rng(seed)
    net = Net()
    net.load_state_dict({k: mt.tensor(rng.standard_normal(v.shape).astype("float32") * 0.5)
                         for k, v in net.state_dict().items()})
    return net


def example(seed, batch=2):
    return mt.tensor(np.random.default_rng(100 + seed).standard_normal((batch, 4)).astype("float32"))


def save_traced(path, seed, examples=True, metadata=None, **kw):
    net, x = make_net(seed), example(seed)
    tm = mt.trace_module(net, x)
    mt.save(tm, path, example_inputs=(x,) if examples else None, metadata=metadata, **kw)
    return net


def newer_minor(h):
    """A format 1.3 header (min reader 1.0) with an optional field 1.1 lacks."""
    h.update(format_version=[1, 3], min_reader_version=[1, 0],
             provenance={"note": "a field from the future"})


def _bytes(path):
    return Path(path).read_bytes()


def _perturb_outputs(data, rel):
    """The archive ``data`` with its stored example outputs scaled by (1 + rel)."""
    header, payload = split(data)
    i = header["examples"]["outputs"]["tensor"]
    e = header["tensors"][i]
    arr = np.frombuffer(payload, np.float32, e["nbytes"] // 4, e["offset"]) * np.float32(1 + rel)
    payload = bytearray(payload)
    payload[e["offset"]:e["offset"] + e["nbytes"]] = arr.astype(np.float32).tobytes()
    e["checksum"] = checksum(arr.astype(np.float32).tobytes())
    return pack(header, bytes(payload), fix_nbytes=False)


def build_tree(root):
    root = Path(root)
    for d in ("good/sub", "noex", "bad"):
        (root / d).mkdir(parents=True, exist_ok=True)
    save_traced(root / "good/net0.tmod", 0, metadata={"name": "net0", "epoch": 3})
    save_traced(root / "good/net1.tmod", 1, metadata={"name": "net1"}, target_version=(1, 0))
    save_traced(root / "good/sub/net2.tmod", 2)
    seq = M.Sequential(M.Linear(4, 5), M.ReLU(), M.Linear(5, 2))
    mt.save(seq, root / "good/seq.tmod", example_inputs=(example(3),))
    mt.save({"w": mt.tensor(np.arange(6, dtype="float32").reshape(2, 3)),
             "b": mt.tensor(np.ones(3, "float32"))}, root / "good/state.tmod")
    good = _bytes(root / "good/net0.tmod")
    (root / "good/newer_minor.tmod").write_bytes(edit(good, newer_minor))
    save_traced(root / "noex/noex.tmod", 4, examples=False)

    header, payload = split(good)
    data = bytearray(good)
    w = header["tensors"][0]
    data[len(good) - len(payload) + w["offset"] + 5] ^= 0xFF          # inside fc1.weight
    (root / "bad/corrupt.tmod").write_bytes(bytes(data))
    (root / "bad/truncated.tmod").write_bytes(good[:len(good) // 3])
    (root / "bad/toonew_major.tmod").write_bytes(
        edit(good, lambda h: h.update(format_version=[2, 0], min_reader_version=[2, 0])))
    (root / "bad/toonew_reader.tmod").write_bytes(
        edit(good, lambda h: h.update(format_version=[1, 5], min_reader_version=[1, 3])))
    (root / "bad/mismatch.tmod").write_bytes(_perturb_outputs(good, 1e-3))

    register_function(swish, name="tests.cli.swish")
    try:
        x = example(5)
        mt.save(mt.trace_module(UsesSwish(), x), root / "bad/unregistered.tmod", example_inputs=(x,))
    finally:        # neither this process nor the command knows it afterwards
        registry._unregister_function("tests.cli.swish")
    return root


@pytest.fixture(scope="session")
def archives(tmp_path_factory):
    """The read-only archive folder (see the module docstring)."""
    return build_tree(tmp_path_factory.mktemp("archives"))


@pytest.fixture
def tree(archives, tmp_path):
    """A private copy of the archive folder, for tests that write."""
    dst = tmp_path / "archives"
    shutil.copytree(archives, dst)
    return dst


def digests(folder):
    """``{relative path: sha256}`` of every file under ``folder``."""
    folder = Path(folder)
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def copies(archives, tmp_path, n):
    """A folder ``tmp_path/many`` of ``n`` copies of good/net0.tmod (a job long
    enough that it is still running when a test stops it)."""
    src = (archives / "good/net0.tmod").read_bytes()
    d = tmp_path / "many"
    d.mkdir()
    for i in range(n):
        (d / f"m{i:03d}.tmod").write_bytes(src)
    return d


def cli(*args, cwd=None, timeout=120, check_no_traceback=True):
    """Run ``python -m mgtrace ARGS`` in a subprocess; the CompletedProcess."""
    env = dict(os.environ, PYTHONPATH=str(REPO), NO_COLOR="1")
    env.pop("MGTRACE_NUM_THREADS", None)
    p = subprocess.run([sys.executable, "-m", "mgtrace", *map(str, args)], cwd=cwd, env=env,
                       capture_output=True, text=True, timeout=timeout)
    if check_no_traceback:
        assert "Traceback" not in p.stderr, p.stderr
    return p


def _default_sigint():
    """preexec_fn: Ctrl-C as a terminal's foreground job gets it. A shell runs a
    background command (``pytest ... &`` in a script) with SIGINT ignored, the
    child inherits that, and mgtrace rightly keeps an inherited SIG_IGN; the
    interrupt tests need the default a user at a terminal has."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_cli(*args, env=None, **kw):
    """Start ``python -m mgtrace ARGS`` (a Popen with text pipes) that a SIGINT
    interrupts as it would a command typed at a terminal."""
    if env is None:
        env = dict(os.environ, PYTHONPATH=str(REPO), NO_COLOR="1")
        env.pop("MGTRACE_NUM_THREADS", None)
    return subprocess.Popen([sys.executable, "-m", "mgtrace", *map(str, args)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=kw.pop("preexec_fn", _default_sigint), **kw)


def records(report):
    """``{path relative to the archive folder: record}`` of a report or --json output."""
    import json
    data = json.loads(Path(report).read_text()) if not isinstance(report, dict) else report
    out = {}
    for r in data["records"]:
        p = r["path"].replace(os.sep, "/")
        out[re.split(r"(?:^|/)archives\d*/", p, maxsplit=1)[-1]] = r
    return out


ns = types.SimpleNamespace


def _children():
    """{pid: command line} of this process's live (not zombie) children, from /proc."""
    me, found = os.getpid(), {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        state, ppid = stat[stat.rindex(")") + 2:].split()[:2]
        if int(ppid) == me and state != "Z":
            found[int(entry)] = cmd
    return found


@pytest.fixture(autouse=True)
def _no_process_left_behind():
    """Every pool worker and command a test started has ended when it ends.

    A worker left alive (as a pool that broke early once left one, which
    its manager thread then waited on for ever, hanging the whole run) fails
    the test that left it, and is killed so later tests do not inherit it.
    Processes that outlive tests by design do not count: multiprocessing's
    resource tracker (started at a session's first shared array, kept to its
    end) and whatever was running before the test."""
    if not sys.platform.startswith("linux"):
        yield
        return
    before = set(_children())
    yield
    deadline = time.monotonic() + 30.0          # stopped workers may still be exiting (a slow CI)
    def left_now():
        return {p: c for p, c in _children().items()
                if p not in before and "multiprocessing.resource_tracker" not in c}
    while (left := left_now()) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in left:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    assert not left, f"processes left running by the test (killed now): {left}"
