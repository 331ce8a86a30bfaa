"""verify / upgrade / retrace through the real command, over good and bad archives:
exit codes, report records, originals untouched, --in-place, resuming, tolerances."""
import json
import os
from pathlib import Path

import numpy as np
import pytest

import mgtrace as mt
from mgtrace.serialization import read_header
from mgtrace.traced_module import TracedModule

from .conftest import BAD, GOOD, cli, digests, records

ALL = GOOD + list(BAD) + ["bad/mismatch.tmod", "noex/noex.tmod"]


def _check_bad(recs):
    for f, (etype, words) in BAD.items():
        assert recs[f]["status"] == "failed", f
        assert recs[f]["reason"].startswith(etype + ":"), recs[f]["reason"]
        assert words in recs[f]["reason"], recs[f]["reason"]


def test_verify_reports_every_file(archives, tmp_path):
    before = digests(archives)
    rep = tmp_path / "r.json"
    p = cli("verify", archives, "--report", rep)
    assert p.returncode == 1, p.stderr
    recs = records(rep)
    assert sorted(recs) == sorted(ALL)                 # one record per file
    for f in GOOD + ["noex/noex.tmod"]:
        assert recs[f]["status"] == "ok" and recs[f]["reason"] == "", recs[f]
    _check_bad(recs)
    assert "output 0 differs" in recs["bad/mismatch.tmod"]["reason"]
    assert recs["good/net0.tmod"]["details"]["examples"] == "checked"
    assert recs["good/net0.tmod"]["details"]["max_abs_error"] == 0.0
    assert recs["noex/noex.tmod"]["details"]["examples"] == "none stored"
    for r in recs.values():
        assert isinstance(r["seconds"], float) and r["seconds"] >= 0
    data = json.loads(rep.read_text())
    assert data["command"] == "verify" and data["finished"] is True
    assert data["summary"] == {"ok": 7, "failed": 6, "total": 13}
    # the table names each failed file and its reason, and ends with the counts
    assert "FAILED" in p.stdout and "bad/truncated.tmod" in p.stdout
    assert [ln for ln in p.stdout.splitlines() if ln.startswith("13 files: 7 ok, 6 failed")]
    assert digests(archives) == before


def test_verify_all_good_exits_0(archives):
    p = cli("verify", archives / "good", "-q")
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.splitlines()[0].startswith("6 files: 6 ok, 0 failed")   # -q: no ok rows


def test_verify_json_matches_report(archives, tmp_path):
    rep = tmp_path / "r.json"
    p = cli("verify", archives / "bad", "--json", "-j", "2", "--report", rep)
    assert p.returncode == 1
    out = json.loads(p.stdout)
    assert out["summary"] == {"ok": 0, "failed": 6, "skipped": 0, "total": 6}
    assert {k: v["status"] for k, v in records(out).items()} == \
        {k: v["status"] for k, v in records(rep).items()}


def test_verify_tolerance_flags(archives):
    f = archives / "bad/mismatch.tmod"        # stored outputs off by 1e-3 relative
    assert cli("verify", f).returncode == 1
    assert cli("verify", f, "--rtol", "1e-2").returncode == 0
    assert cli("verify", f, "--atol", "1").returncode == 0
    assert cli("verify", f, "--rtol", "1e-4").returncode == 1
    p = cli("verify", f, "--rtol", "-1")
    assert p.returncode == 2 and "--rtol" in p.stderr


def test_upgrade_to_folder_keeps_originals(tree, tmp_path):
    before = digests(tree)
    out, rep = tmp_path / "new", tmp_path / "r.json"
    p = cli("upgrade", tree, "-o", out, "-j", "2", "--report", rep)
    assert p.returncode == 1, p.stderr
    assert digests(tree) == before                       # originals untouched
    recs = records(rep)
    _check_bad(recs)
    assert "does not reproduce the stored outputs" in recs["bad/mismatch.tmod"]["reason"]
    ok = sorted(set(GOOD) - {"good/newer_minor.tmod"}) + ["noex/noex.tmod"]
    assert sorted(f for f, r in recs.items() if r["status"] == "ok") == sorted(ok)
    written = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert written == sorted(ok)                         # layout kept; nothing for failures
    assert recs["good/net1.tmod"]["details"]["from"] == "1.0"
    assert read_header(out / "good/net1.tmod")["format_version"] == [1, 1]
    _check_newer_left_alone(recs, p.stdout)
    # the new archives load and give the outputs of the old ones
    for f in ("good/net0.tmod", "good/sub/net2.tmod", "good/seq.tmod"):
        a, b = mt.serialization.load_archive(tree / f), mt.serialization.load_archive(out / f)
        assert (b.obj(*b.example_inputs).numpy() == a.example_outputs.numpy()).all()
        assert b.metadata == a.metadata
    assert cli("verify", out, "-q").returncode == 0


def _check_newer_left_alone(recs, stdout):
    r = recs["good/newer_minor.tmod"]
    assert r["status"] == "skipped", r
    assert r["reason"].startswith("newer than this mgtrace, left as it is: format 1.3"), r
    assert "left as they are" in stdout and "newer than this mgtrace" in stdout


def test_upgrade_in_place_replaces_only_verified(tree, tmp_path):
    before = digests(tree)
    p = cli("upgrade", tree, "--in-place", "--report", tmp_path / "r.json")
    assert p.returncode == 1
    after = digests(tree)
    changed = sorted(f for f in before if before[f] != after[f])
    assert changed == ["good/net1.tmod"]                 # the one in an older format
    assert read_header(tree / "good/net1.tmod")["format_version"] == [1, 1]
    h = read_header(tree / "good/newer_minor.tmod")      # never rewritten: nothing dropped
    assert h["format_version"] == [1, 3] and h["provenance"] == {"note": "a field from the future"}
    _check_newer_left_alone(records(tmp_path / "r.json"), p.stdout)
    assert records(tmp_path / "r.json")["good/net0.tmod"]["details"]["note"] == "already current"
    assert not [f for f in os.listdir(tree / "good") if f.startswith(".")]


def test_retrace_to_folder(tree, tmp_path):
    before = digests(tree)
    out, rep = tmp_path / "new", tmp_path / "r.json"
    p = cli("retrace", tree, "-o", out, "--report", rep, "-j", "2")
    assert p.returncode == 1
    assert digests(tree) == before
    recs = records(rep)
    _check_bad(recs)
    assert "no example inputs stored" in recs["noex/noex.tmod"]["reason"]
    assert "--inputs" in recs["noex/noex.tmod"]["reason"]
    assert "not a module" in recs["good/state.tmod"]["reason"]
    assert "no longer gives the stored outputs" in recs["bad/mismatch.tmod"]["reason"]
    ok = sorted(f for f, r in recs.items() if r["status"] == "ok")
    assert ok == sorted(set(GOOD) - {"good/state.tmod", "good/newer_minor.tmod"})
    _check_newer_left_alone(recs, p.stdout)
    for f in ok:
        new = mt.serialization.load_archive(out / f)
        assert isinstance(new.obj, TracedModule)
        old = mt.serialization.load_archive(tree / f)
        assert (new.obj(*old.example_inputs).numpy() == old.example_outputs.numpy()).all()
        assert recs[f]["details"]["output"] == str(out / f)


def test_retrace_in_place_replaces_only_verified(tree):
    before = digests(tree)
    p = cli("retrace", tree, "--in-place")
    assert p.returncode == 1
    after = digests(tree)
    changed = sorted(f for f in before if before[f] != after[f])
    # seq (a plain Sequential) becomes a traced module; the traced ones are rewritten as well
    assert set(changed) <= set(GOOD) - {"good/state.tmod"} and "good/seq.tmod" in changed
    for f in list(BAD) + ["bad/mismatch.tmod", "noex/noex.tmod", "good/state.tmod",
                          "good/newer_minor.tmod"]:
        assert before[f] == after[f], f
    assert cli("verify", tree / "good", "-q").returncode == 0


def test_retrace_inputs_script(tree, tmp_path):
    script = tmp_path / "make_inputs.py"
    script.write_text("import numpy as np, mgtrace as mt\n"
                      "def inputs(path, module):\n"
                      "    assert path.endswith('.tmod') and hasattr(module, 'forward')\n"
                      "    return (mt.tensor(np.ones((3, 4), 'float32')),)\n")
    out = tmp_path / "new"
    p = cli("retrace", tree / "noex", tree / "good/net0.tmod", "-o", out, "--json",
            "--inputs", f"{script}:inputs")
    assert p.returncode == 0, p.stdout + p.stderr
    recs = {Path(r["path"]).name: r for r in json.loads(p.stdout)["records"]}
    assert recs["noex.tmod"]["details"]["inputs"] == f"{script}:inputs"
    assert recs["net0.tmod"]["details"]["inputs"] == "stored"    # stored examples win
    new = mt.serialization.load_archive(out / "noex.tmod")
    assert new.example_inputs[0].shape == (3, 4)                 # and are kept as examples
    assert cli("verify", out / "noex.tmod").returncode == 0


@pytest.mark.parametrize("spec, words", [("make_inputs.py", "FILE.py:FUNCTION"),
                                         ("missing.py:f", "no such file"),
                                         ("make_inputs.py:nope", "no function 'nope'"),
                                         ("no_such_module_xyz:f", "importing it failed")])
def test_retrace_bad_inputs_spec_is_usage_error(archives, tmp_path, spec, words):
    (tmp_path / "make_inputs.py").write_text("def inputs(path, module):\n    return None\n")
    p = cli("retrace", archives / "noex", "-o", tmp_path / "new", "--inputs", spec, cwd=tmp_path)
    assert p.returncode == 2 and words in p.stderr, p.stderr
    assert not (tmp_path / "new").exists()


def test_resume_skips_ok_files(tree, tmp_path):
    out, rep = tmp_path / "new", tmp_path / "r.json"
    job = ("retrace", tree / "good", tree / "noex/noex.tmod", "-o", out, "--report", rep)
    first = cli(*job)
    assert first.returncode == 1
    r1 = records(rep)
    assert (out / "net0.tmod").exists() and (out / "sub/net2.tmod").exists()
    stamp = (out / "net0.tmod").stat().st_mtime_ns
    os.remove(out / "net1.tmod")                      # an ok file whose output has gone: redone
    second = cli(*job, "--json")
    assert second.returncode == 1
    shown = records(json.loads(second.stdout))
    assert shown["good/net0.tmod"]["status"] == "skipped"
    assert shown["good/net1.tmod"]["status"] == "ok"
    assert shown["noex/noex.tmod"]["status"] == "failed"      # failures are retried
    assert (out / "net0.tmod").stat().st_mtime_ns == stamp
    r2 = records(rep)
    assert r2["good/net0.tmod"] == r1["good/net0.tmod"]       # the report keeps the ok record
    assert r2["good/net1.tmod"]["status"] == "ok" and (out / "net1.tmod").exists()
    assert sorted(r2) == sorted(r1)
    # the same report with another output folder or command is refused
    p = cli("retrace", tree / "good", "-o", tmp_path / "other", "--report", rep)
    assert p.returncode == 2 and "--no-resume" in p.stderr
    p = cli("upgrade", tree / "good", "-o", out, "--report", rep)
    assert p.returncode == 2
    # --no-resume redoes everything
    third = cli(*job, "--no-resume", "--json")
    assert not [r for r in json.loads(third.stdout)["records"]
                if r["reason"].startswith("ok in an earlier run")]


def test_resume_redoes_changed_inputs_outputs_and_options(tree, tmp_path):
    import shutil
    out, rep = tmp_path / "new", tmp_path / "r.json"
    job = ("upgrade", tree / "good", "-o", out, "--report", rep)
    assert cli(*job).returncode == 0
    first = records(rep)
    assert first["good/net0.tmod"]["fingerprints"]["input"]["sha256"]
    # replace an input by another model (new inode and mtime), and change an output
    shutil.copyfile(tree / "good/sub/net2.tmod", tree / "good/net0.tmod.new")
    os.replace(tree / "good/net0.tmod.new", tree / "good/net0.tmod")
    with open(out / "seq.tmod", "r+b") as f:      # same size, same inode: only the hash tells
        f.seek(-1, 2)
        last = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([last[0] ^ 1]))
    shown = records(json.loads(cli(*job, "--json").stdout))
    assert shown["good/net0.tmod"]["status"] == "ok"            # a replaced input is redone
    assert shown["good/seq.tmod"]["status"] == "ok"             # so is a changed output
    assert shown["good/net1.tmod"]["status"] == "skipped"
    new, want = mt.serialization.load_archive(out / "net0.tmod"), \
        mt.serialization.load_archive(tree / "good/sub/net2.tmod")
    assert (new.obj(*want.example_inputs).numpy() == want.example_outputs.numpy()).all()
    assert cli("verify", out / "seq.tmod").returncode == 0
    # a touched input with the same bytes is still the same input
    os.utime(tree / "good/net1.tmod", ns=(1, 1))
    assert records(json.loads(cli(*job, "--json").stdout))["good/net1.tmod"]["status"] == "skipped"
    # options that shape the output redo every file
    shown = records(json.loads(cli(*job, "--rtol", "1e-3", "--json").stdout))
    assert not [r for r in shown.values() if r["reason"].startswith("ok in an earlier run")]
    assert shown["good/net1.tmod"]["status"] == "ok"


@pytest.mark.parametrize("args, words", [
    (["verify", "no/such/dir"], "no such file or folder"),
    (["verify", "{a}", "-j", "0"], "-j/--jobs"),
    (["verify", "{a}", "-j", "two"], "-j/--jobs"),
    (["verify", "{a}", "--frobnicate"], "unrecognized arguments: --frobnicate"),
    (["upgrade", "{a}"], "-o/--out --in-place is required"),
    (["upgrade", "{a}", "-o", "{t}", "--in-place"], "not allowed with"),
    (["upgrade", "{a}/good", "-o", "{a}/good"], "would overwrite the original"),
    (["verify", "{a}", "--report", "{a}/good/net0.tmod"], "not an mgtrace batch report"),
    (["verify", "{a}", "--no-resume"], "--no-resume only makes sense with --report"),
    (["verify", "{a}", "--dask", "tcp://127.0.0.1:9", "-j", "2"], "drop -j"),
    ([], "required: COMMAND"),
    (["inspect"], "required: PATH"),
    (["inspect", "no/such.tmod"], "no such file or folder"),
    (["diff", "{a}/good/net0.tmod"], "required: B"),
    (["diff", "{a}/good/net0.tmod", "no/such.tmod"], "no such file"),
])
def test_usage_errors_exit_2(archives, tmp_path, args, words):
    p = cli(*[a.format(a=archives, t=tmp_path / "out") for a in args])
    assert p.returncode == 2 and words in p.stderr, p.stderr
    assert not (tmp_path / "out").exists()


def test_two_inputs_one_output_is_refused(archives, tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x/net0.tmod").write_bytes((archives / "good/net0.tmod").read_bytes())
    p = cli("upgrade", archives / "good/net0.tmod", tmp_path / "x/net0.tmod", "-o", tmp_path / "out")
    assert p.returncode == 2 and "would both be written to" in p.stderr, p.stderr
    assert not (tmp_path / "out").exists()
    # folders keep the layout below them: good/ and x/ both have a net0.tmod at the top
    p = cli("upgrade", archives / "good", tmp_path / "x", "-o", tmp_path / "out", "-q")
    assert p.returncode == 2 and "would both be written to" in p.stderr, p.stderr
    assert not (tmp_path / "out").exists()


def test_help_and_version():
    p = cli("--help")
    assert p.returncode == 0
    for c in ("inspect", "verify", "diff", "upgrade", "retrace", "doctor", "exit status"):
        assert c in p.stdout
    for c in ("inspect", "verify", "diff", "upgrade", "retrace", "doctor"):
        assert cli(c, "--help").returncode == 0
    p = cli("--version")
    assert p.returncode == 0 and p.stdout.strip() == f"mgtrace {mt.__version__}"


def test_console_script_is_declared():
    tomllib = pytest.importorskip("tomllib")
    meta = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    assert meta["project"]["scripts"]["mgtrace"] == "mgtrace.cli:main_exit"
    assert "distributed" in meta["project"]["optional-dependencies"]
    from mgtrace.cli import main_exit   # noqa: F401  (what the `mgtrace` script runs)


REGISTER = """\
import mgtrace.functional as F
from mgtrace.serialization import register_function

def swish(x):
    return x * F.sigmoid(x)

register_function(swish, name="tests.cli.swish")
"""


def test_import_registers_user_functions(archives, tmp_path):
    f = archives / "bad/unregistered.tmod"
    p = cli("verify", f)
    assert p.returncode == 1 and "--import" in p.stdout          # the table says what to do
    script = tmp_path / "register_ops.py"
    script.write_text(REGISTER)
    for jobs in ("1", "2"):
        p = cli("verify", f, archives / "good/net0.tmod", "--import", script, "-j", jobs)
        assert p.returncode == 0, p.stdout + p.stderr
    p = cli("retrace", f, "-o", tmp_path / "new", "--import", script, "-j", "2", "--json")
    assert p.returncode == 0, p.stdout + p.stderr
    assert cli("verify", tmp_path / "new/unregistered.tmod", "--import", script).returncode == 0
    p = cli("inspect", "--graph", f, "--import", script)
    assert p.returncode == 0 and "def forward(self, x):" in p.stdout
    p = cli("verify", f, "--import", tmp_path / "missing.py")
    assert p.returncode == 2 and "no such file" in p.stderr
    p = cli("verify", f, "--import", "no_such_module_xyz")
    assert p.returncode == 2 and "importing it failed" in p.stderr


def test_in_place_through_a_symlink_keeps_the_link(tree, tmp_path):
    real = tree / "good/net1.tmod"              # a format 1.0 archive: upgrade rewrites it
    link = tmp_path / "linked.tmod"
    os.symlink(real, link)
    os.chmod(real, 0o640)
    for cmd in ("upgrade", "retrace"):
        p = cli(cmd, link, "--in-place")
        assert p.returncode == 0, p.stdout + p.stderr
        assert os.path.islink(link) and os.readlink(link) == str(real)
        assert os.stat(real).st_mode & 0o777 == 0o640
    assert read_header(real)["format_version"] == [1, 1]
    assert cli("verify", real).returncode == 0
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]


def test_verify_reports_leftover_temp_files(archives, tmp_path):
    import shutil
    shutil.copytree(archives / "good", tmp_path / "good")
    left = tmp_path / "good/.net0.tmod.0123456789ab.tmp"
    left.write_bytes(b"x" * 1000)                # what a killed save leaves
    p = cli("verify", tmp_path / "good")
    assert p.returncode == 0, p.stdout + p.stderr
    [line] = [ln for ln in p.stdout.splitlines() if ln.startswith("leftover")]
    assert str(left) in line and "1000 bytes" in line
    out = json.loads(cli("verify", tmp_path / "good", "--json").stdout)
    assert out["leftovers"] == [{"path": str(left), "bytes": 1000}]
    mt.save(mt.load(tmp_path / "good/net0.tmod"), tmp_path / "good/net0.tmod")
    assert not left.exists()                     # the next save of net0.tmod removed it


def test_an_output_folder_reaching_the_inputs_through_links_is_refused(tree, tmp_path):
    (tmp_path / "out").mkdir()
    os.symlink(tree / "good/net1.tmod", tmp_path / "out/net1.tmod")
    before = digests(tree)
    p = cli("upgrade", tree / "good/net1.tmod", "-o", tmp_path / "out")
    assert p.returncode == 2 and "would overwrite the original" in p.stderr, p.stderr
    os.symlink(tree / "good", tmp_path / "goodlink")
    p = cli("upgrade", tree / "good", "-o", tmp_path / "goodlink")
    assert p.returncode == 2 and "would overwrite the original" in p.stderr, p.stderr
    assert digests(tree) == before


def test_resume_sees_same_size_copies_script_changes_and_other_folders(tree, tmp_path):
    import shutil
    out, rep = tmp_path / "new", tmp_path / "r.json"
    script = tmp_path / "gen.py"
    script.write_text("import numpy as np, mgtrace as mt\n"
                      "def make(path, module):\n"
                      "    return (mt.tensor(np.ones((2, 4), 'float32')),)\n")
    job = ("retrace", tree / "noex", tree / "good/net0.tmod", "-o", out, "--report", rep,
           "--inputs", f"{script}:make")
    assert cli(*job).returncode == 0
    # the same bytes, size, mtime and inode are kept by cp -p over the file: only content differs
    net0 = tree / "good/net0.tmod"
    st = os.stat(net0)
    other = (tree / "good/net1.tmod").read_bytes()
    if len(other) == st.st_size:
        with open(net0, "r+b") as f:
            f.write(other)
        os.utime(net0, ns=(st.st_atime_ns, st.st_mtime_ns))
        shown = records(json.loads(cli(*job, "--json").stdout))
        assert shown["good/net0.tmod"]["status"] == "ok"
    # a changed --inputs script redoes what it made
    # a different length too: a same-size rewrite in the same second reuses a stale .pyc
    script.write_text(script.read_text().replace("(2, 4)", "(12, 4)"))
    shown = records(json.loads(cli(*job, "--json").stdout))
    assert shown["noex/noex.tmod"]["status"] == "ok"
    assert mt.serialization.load_archive(out / "noex.tmod").example_inputs[0].shape == (12, 4)
    # the same job run from another folder, relative paths: nothing to redo
    rel = cli("retrace", os.path.relpath(tree / "noex", tmp_path), "-o", "new", "--report",
              "r.json", "--inputs", f"{script}:make", "--json", cwd=tmp_path)
    assert {r["status"] for r in json.loads(rel.stdout)["records"]} == {"skipped"}, rel.stdout


def test_outputs_compare_relative_to_their_scale():
    """An output matches when max |got - want| <= atol + rtol * max |want|:
    a near-zero element of an output whose values reach 2e5 may move by
    the 2e-6 of the scale that another summation order gives (NumPy's
    elementwise allclose would fail it), a 1e-4 relative error may not,
    and NaN and infinities must sit where the stored ones do."""
    from mgtrace.cli.tasks import compare_outputs
    want = np.array([2e5, -3.0, 0.0, 1e-3], np.float32)
    near = want + np.array([0.25, 0.3, -0.2, 0.1], np.float32)       # <= 0.4 = 2e-6 * 2e5
    assert compare_outputs(mt.tensor(near), mt.tensor(want))[0]
    assert not np.allclose(near, want, rtol=1e-5, atol=1e-6)
    ok, err, reason = compare_outputs(mt.tensor(want * np.float32(1 + 1e-4)), mt.tensor(want))
    assert not ok and err == pytest.approx(20.0, rel=1e-3) and "max |output|" in reason
    nan = np.array([np.nan, np.inf, 1.0], np.float32)
    assert compare_outputs((mt.tensor(nan),), (mt.tensor(nan),))[0]
    assert not compare_outputs(mt.tensor(np.array([np.nan, -np.inf, 1.0], np.float32)), mt.tensor(nan))[0]
    assert not compare_outputs(mt.tensor(np.array([0.0, np.inf, 1.0], np.float32)), mt.tensor(nan))[0]
    assert compare_outputs(mt.tensor(np.zeros(0, np.float32)), mt.tensor(np.zeros(0, np.float32)))[0]
    # integers compare exactly (an index off by one, 2**53 + 1 as float64 is not 2**53)
    ints = np.array([2**53 + 1, 200000, 3], np.int64)
    assert compare_outputs(mt.tensor(ints), mt.tensor(ints))[0]
    for off in (np.array([2**53, 200000, 3]), np.array([2**53 + 1, 200000, 4])):
        assert not compare_outputs(mt.tensor(off.astype(np.int64)), mt.tensor(ints), rtol=1, atol=1)[0]
    # an infinite rtol passes an all-zero output (inf * 0 is no NaN here)
    zeros = mt.tensor(np.zeros(3, np.float32))
    assert compare_outputs(zeros, zeros, rtol=float("inf"))[0]


@pytest.mark.parametrize("command", ["upgrade", "retrace"])
@pytest.mark.parametrize("how", ["rewritten", "replaced", "removed"])
def test_in_place_leaves_a_file_another_process_rewrote_meanwhile(tree, monkeypatch, command, how):
    # the job read net1, wrote and checked the new archive, then renamed it over net1: a
    # model another process saved there meanwhile was replaced by the old one, upgraded
    from mgtrace.cli import tasks
    path = tree / "good/net1.tmod"                       # format 1.0: both commands rewrite it
    theirs = (tree / "good/net0.tmod").read_bytes()
    real = tasks._check_written

    def meanwhile(*args, **kwargs):
        if how == "rewritten":                           # written over in place
            path.write_bytes(theirs)
        elif how == "replaced":                          # saved by mt.save: a rename
            (tree / "good/other").write_bytes(theirs)
            os.replace(tree / "good/other", path)
        else:
            path.unlink()
        return real(*args, **kwargs)
    monkeypatch.setattr(tasks, "_check_written", meanwhile)
    task = tasks.upgrade_file if command == "upgrade" else tasks.retrace_file
    res = task(str(path), in_place=True)
    assert res["status"] == "failed" and "rewritten by another process" in res["reason"], res
    if how == "removed":
        assert not path.exists()
    else:
        assert path.read_bytes() == theirs
    assert [f for f in os.listdir(tree / "good") if f.startswith(".")] == []   # no temporary
