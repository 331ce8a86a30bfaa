"""inspect, diff and doctor through the real command: what they print, exit codes."""
import json

import numpy as np

import mgtrace as mt
from mgtrace.serialization import FORMAT_VERSION

import mgtrace.module as M
from .conftest import cli, make_net


def _net_numbers():
    """Parameter count and bytes of the archived Net, from the module itself."""
    state = make_net(0).state_dict()
    n = sum(int(np.prod(v.shape)) for v in state.values())
    return n, sum(v.numpy().nbytes for v in state.values())


def test_inspect_json(archives):
    p = cli("inspect", "--json", archives / "good/net0.tmod")
    assert p.returncode == 0, p.stderr
    [r] = json.loads(p.stdout)
    n, nbytes = _net_numbers()
    assert r["format_version"] == "1.1" and r["min_reader_version"] == "1.0"
    assert r["producer"] == f"mgtrace {mt.__version__}"
    assert r["parameters"] == n == 4 * 8 + 8 + 8 * 3 + 3
    assert r["bytes"] == nbytes and r["tensors"] == 4        # examples not counted as weights
    assert r["modules"] == [
        [0, "", "Net"], [1, "fc1", "Linear(in_features=4, out_features=8, bias=True)"],
        [1, "act", "ReLU()"], [1, "fc2", "Linear(in_features=8, out_features=3, bias=True)"]]
    assert r["module_types"] == {"Linear": 2, "Net (traced)": 1, "ReLU": 1}
    assert r["ops"] == {"Tensor.__mul__": 1, "mgtrace.functional.softmax": 1}
    [sig] = r["signature"]
    assert sig["inputs"] == [{"name": "x", "shape": [2, 4], "dtype": "float32"}]
    assert [o["shape"] for o in sig["outputs"]] == [[2, 3]]
    assert r["examples"]["inputs"] == [{"dtype": "float32", "shape": [2, 4]}]
    assert r["examples"]["outputs"] == [{"dtype": "float32", "shape": [2, 3]}]
    assert r["metadata"] == {"name": "net0", "epoch": 3}


def test_inspect_human(archives):
    p = cli("inspect", archives / "good/net0.tmod", archives / "noex/noex.tmod")
    assert p.returncode == 0, p.stderr
    out = p.stdout
    for words in ("format:     1.1", f"written by mgtrace {mt.__version__}",
                  "parameters: 67 in 4 tensors, 268 B", "forward:    (x: float32[2, 4]) -> ",
                  "float32[2, 3]", "fc1: Linear(", "act: ReLU()", "mgtrace.functional.softmax x1",
                  '"epoch": 3', "examples:   none stored"):
        assert words in out, words


def test_inspect_folders_and_bad_files(archives):
    p = cli("inspect", "--json", archives)
    assert p.returncode == 1                            # some could not be read
    rs = {r["path"].rsplit("/", 2)[-2] + "/" + r["path"].rsplit("/", 1)[-1]: r
          for r in json.loads(p.stdout)}
    assert len(rs) == 13
    assert "format 2.0" in rs["bad/toonew_major.tmod"]["error"]
    assert "truncated" in rs["bad/truncated.tmod"]["error"]
    # inspect reads the header only: corrupt tensor data and unknown functions do not matter
    assert rs["bad/corrupt.tmod"]["parameters"] == 67
    assert rs["bad/unregistered.tmod"]["ops"] == {"tests.cli.swish": 1}
    assert rs["good/newer_minor.tmod"]["format_version"] == "1.3"
    assert rs["good/state.tmod"]["parameters"] == 9 and rs["good/state.tmod"]["root"] == "dict of 2"
    p = cli("inspect", archives / "bad/truncated.tmod")
    assert p.returncode == 1 and "cannot read: truncated" in p.stdout


def test_inspect_graph(archives):
    p = cli("inspect", "--graph", archives / "good/net0.tmod")
    assert p.returncode == 0
    assert "def forward(self, x):" in p.stdout and "F.softmax(" in p.stdout
    p = cli("inspect", "--graph", "--json", archives / "bad/unregistered.tmod")
    assert p.returncode == 0                            # the header is fine; the code is not there
    [r] = json.loads(p.stdout)
    assert "tests.cli.swish" in r["code_error"] and "code" not in r


def test_diff(archives, tmp_path):
    a, b = archives / "good/net0.tmod", archives / "good/net1.tmod"
    p = cli("diff", a, a)
    assert p.returncode == 0 and p.stdout.strip() == "no differences"
    p = cli("diff", "--json", a, b)
    assert p.returncode == 1
    res = json.loads(p.stdout)
    changes = {c["what"]: c for c in res["changes"]}
    sa, sb = make_net(0).state_dict(), make_net(1).state_dict()
    for k in sa:
        want = float(np.max(np.abs(sa[k].numpy().astype(np.float64) - sb[k].numpy())))
        assert abs(changes[f"tensor {k}"]["max_abs_diff"] - want) < 1e-12
    assert changes["metadata"]["a"] == {"name": "net0", "epoch": 3}
    assert not any(w.startswith(("module", "graph", "op ")) for w in changes)   # same structure
    p = cli("diff", a, b)
    assert "tensor fc1.weight (float32 [8, 4]): values differ, max abs diff" in p.stdout
    # structure: another model, a function only it calls (unregistered is fine: nothing is loaded)
    p = cli("diff", "--json", a, archives / "bad/unregistered.tmod")
    assert p.returncode == 1
    whats = {c["what"] for c in json.loads(p.stdout)["changes"]}
    assert {"module <root>", "calls of tests.cli.swish", "op tests.cli.swish version",
            "tensor fc.weight", "tensor fc1.weight"} <= whats
    # a newer minor of the same archive: only the version differs
    p = cli("diff", "--json", a, archives / "good/newer_minor.tmod")
    assert [c["what"] for c in json.loads(p.stdout)["changes"]] == ["format_version"]


def test_diff_of_retraced_graph(archives, tmp_path):
    out = tmp_path / "rt"
    assert cli("retrace", archives / "good/seq.tmod", "-o", out).returncode == 0
    p = cli("diff", "--json", archives / "good/seq.tmod", out / "seq.tmod")
    assert p.returncode == 1
    changes = {c["what"]: c for c in json.loads(p.stdout)["changes"]}
    assert changes["root"]["b"].startswith("traced module")
    assert not [w for w in changes if w.startswith("tensor")]      # same weights


def test_diff_unreadable_is_2(archives):
    for bad in ("corrupt", "truncated", "toonew_major"):
        p = cli("diff", archives / "good/net0.tmod", archives / f"bad/{bad}.tmod")
        assert p.returncode == 2 and f"bad/{bad}.tmod" in p.stderr, p.stderr


def test_doctor():
    p = cli("doctor")
    assert p.returncode == 0
    for k in ("mgtrace:", "numpy:", "blas:", "kernel threads:", "cuda:", "writes format:",
              "reads formats:", "dask.distributed:"):
        assert k in p.stdout, k
    info = json.loads(cli("doctor", "--json").stdout)
    assert info["writes format"] == ".".join(map(str, FORMAT_VERSION))
    assert info["cuda"].startswith(("not built (", "built"))


def test_doctor_names_a_forced_openblas_kernel_and_warns_when_it_leaves_avx512_unused(monkeypatch):
    from mgtrace.cli import blas_hint
    haswell = "OpenBLAS 0.3.34 DYNAMIC_ARCH NO_AFFINITY Haswell MAX_THREADS=64"
    skx = haswell.replace("Haswell", "SkylakeX")
    assert blas_hint(haswell, None, {"avx2", "avx512f"}) == ""
    assert blas_hint(haswell, "Haswell", {"avx2"}) == " (kernels chosen by OPENBLAS_CORETYPE=Haswell)"
    warned = blas_hint(haswell, "Haswell", {"avx2", "avx512f"})
    assert "OPENBLAS_CORETYPE=Haswell" in warned and "unset it" in warned
    assert "unset it" not in blas_hint(skx, "SkylakeX", {"avx2", "avx512f"})
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")
    out = json.loads(cli("doctor", "--json").stdout)["blas"]
    assert "Haswell" in out and "OPENBLAS_CORETYPE=Haswell" in out


def test_diff_tells_apart_same_named_modules_at_the_same_depth(tmp_path):
    import mgtrace.module as M

    class Branch(M.Module):
        def __init__(self, k):
            super().__init__()
            self.pool = M.MaxPool2d(k, k)

        def forward(self, x):
            return self.pool(x)

    class Net(M.Module):
        def __init__(self, k1, k2):
            super().__init__()
            self.a, self.b = Branch(k1), Branch(k2)

        def forward(self, x):
            return self.a(x).mean() + self.b(x).mean()
    x = mt.tensor(np.random.default_rng(0).random((1, 1, 8, 8), np.float32))
    mt.save(mt.trace_module(Net(2, 2), x), tmp_path / "d1.tmod")
    mt.save(mt.trace_module(Net(4, 2), x), tmp_path / "d2.tmod")
    p = cli("diff", tmp_path / "d1.tmod", tmp_path / "d2.tmod")
    assert p.returncode == 1
    assert "module a.pool" in p.stdout and "kernel_size=4" in p.stdout
    assert "module b.pool" not in p.stdout


def test_inspect_names_structured_outputs_by_key(tmp_path):
    import mgtrace.module as M

    class N(M.Module):
        def __init__(self):
            super().__init__()
            self.fc = M.Linear(3, 2)

        def forward(self, x):
            return {"logits": self.fc(x), "feat": (x, x * 2)}
    mt.save(mt.trace_module(N(), mt.tensor(np.ones((1, 3), np.float32))), tmp_path / "d.tmod")
    p = cli("inspect", tmp_path / "d.tmod")
    assert p.returncode == 0
    assert "out['logits']: float32[1, 2]" in p.stdout
    assert "out['feat'][1]: float32[1, 3]" in p.stdout


def test_diff_sees_a_container_that_became_a_plain_module(tmp_path):
    import numpy as np
    from serialization.helpers import edit
    seq = M.Sequential(M.Linear(4, 4), M.ReLU())
    x = mt.tensor(np.ones((2, 4), "float32"))
    a = tmp_path / "a.tmod"
    mt.save(mt.trace_module(M.Sequential(seq), x), a)

    def plain(h):
        for m in h["modules"]:
            m.pop("reads_as", None)
    b = tmp_path / "b.tmod"
    b.write_bytes(edit(a.read_bytes(), plain))
    p = cli("diff", "--json", a, b)
    assert p.returncode == 1, p.stdout + p.stderr
    changes = {c["what"]: c for c in json.loads(p.stdout)["changes"]}
    assert changes["module <root>"]["a"] == "traced Sequential (reads as a sequence)"
    assert changes["module <root>"]["b"] == "traced Sequential"
    assert changes["module 0"]["a"].endswith("(reads as a sequence)")


def test_doctor_advises_only_switches_that_are_read():
    # advice such as "rebuild with MGTRACE_X=1 pip install ." must name a
    # switch the build really reads, or following it changes nothing
    import re
    from .conftest import REPO

    def read_by(path):
        text = (REPO / path).read_text()
        return set(re.findall(r"(?:environ(?:\.get\(|\[)|_int\()\s*[\"'](MGTRACE_\w+)", text))
    build, run = read_by("setup.py") | read_by("setup_cuda.py"), read_by("mgtrace/_flags.py")
    assert "MGTRACE_NATIVE" in build and "MGTRACE_NUM_THREADS" in run    # the pattern works
    out = cli("doctor").stdout
    assert set(re.findall(r"(MGTRACE_\w+)=\S* pip install", out)) <= build
    assert set(re.findall(r"MGTRACE_\w+", out)) <= build | run
    assert "pip install ." not in out.split("cuda:", 1)[1].splitlines()[0]


def test_diff_and_inspect_read_format_1_2_views(tmp_path):
    # views of one storage (format 1.2) hold no data of their own: diff reads
    # them through their base, inspect counts the base's bytes once
    class Tied(M.Module):
        def __init__(self):
            super().__init__()
            self.fc = M.Linear(3, 2)
            self.row = self.fc.weight[1]

        def forward(self, x):
            return self.fc(x) * self.row.sum()
    a = Tied()
    x = mt.tensor(np.ones((1, 3), np.float32))
    mt.save(mt.trace_module(a, x), tmp_path / "a.tmod")
    a.fc.weight[1, 2] = 5.0                    # row 1 is the buffer too
    mt.save(mt.trace_module(a, x), tmp_path / "b.tmod")
    p = cli("diff", tmp_path / "a.tmod", tmp_path / "b.tmod")
    assert p.returncode == 1, p.stderr
    assert "tensor row" in p.stdout and "tensor fc.weight" in p.stdout
    [r] = json.loads(cli("inspect", "--json", tmp_path / "a.tmod").stdout)
    assert r["format_version"] == "1.2" and r["bytes"] == (2 * 3 + 2) * 4
