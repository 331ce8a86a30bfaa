"""Release numbers mean something (issue 37, items 1 and 6): the package
version, pyproject.toml and an archive's "written by" agree; the format or
the op table never changes under an already released number; every listed
release stays in tests/compat's matrix and its golden archives in the tree.
Each rule is shown failing on a made-up history too."""
import importlib.util
import io
import re
import subprocess
import sys

import pytest

import mgtrace as mt
from mgtrace.serialization import read_header

from . import releases as R


def _generate():
    spec = importlib.util.spec_from_file_location("schema_generate_r", R.SCHEMA / "generate.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _hashes_now():
    gen = _generate()
    return {name: gen.sha256(text) for name, text in gen.generated().items()}


def test_version_key_orders_pep440_forms():
    order = ["0.1.0", "0.2.0", "0.3.0.dev0", "0.3.0.dev1", "0.3.0a1", "0.3.0b2", "0.3.0rc1",
             "0.3.0", "0.10.0", "1.0.0"]
    assert sorted(order, key=R.version_key) == order
    with pytest.raises(ValueError, match="is not X.Y.Z"):
        R.version_key("0.3")


def test_package_version_pyproject_and_written_by_agree():
    pyproject = (R.ROOT / "pyproject.toml").read_text()
    [declared] = re.findall(r'(?m)^version = "([^"]+)"', pyproject)
    assert declared == mt.__version__
    buf = io.BytesIO()
    mt.save(mt.tensor([1.0]), buf)
    buf.seek(0)
    assert read_header(buf)["producer"] == {"library": "mgtrace", "version": mt.__version__}


def test_release_history_is_ordered():
    assert R.history_problems(R.load_releases()) == []
    versions = [r["version"] for r in R.load_releases()]
    assert versions[:2] == ["0.1.0", "0.2.0"]


def test_a_changed_format_or_op_table_has_a_new_version():
    problems = R.version_problems(R.load_releases(), mt.__version__, mt.FORMAT_VERSION,
                                  _hashes_now(), R.load_hashes())
    assert problems == [], "\n".join(problems)


def test_the_version_rule_fails_when_the_number_stays():
    releases = R.load_releases()
    last = releases[-1]
    hashes = R.load_hashes()
    same = dict(hashes[R.fmt(last["format"])])
    # nothing changed since the release: its own number is fine
    assert R.version_problems(releases, last["version"], last["format"], same, hashes) == []
    # the op table changed, the format did not, the number stayed
    changed = dict(same, **{"ops.json": "sha256:0"})
    [msg] = R.version_problems(releases, last["version"], last["format"], changed, hashes)
    assert msg.startswith(f"schema/ops.json changed since release {last['version']}")
    assert "raise `version` in pyproject.toml and `__version__` in mgtrace/__init__.py" in msg
    # the format changed, the number stayed
    newer = (last["format"][0], last["format"][1] + 1)
    [msg] = R.version_problems(releases, last["version"], newer, changed, hashes)
    assert msg.startswith(f"the format ({R.fmt(last['format'])} -> {R.fmt(newer)}) changed")
    # a number older than the last release
    [msg] = R.version_problems(releases, "0.0.9", last["format"], same, hashes)
    assert "older than the last listed release" in msg
    # and a new development number passes
    assert R.version_problems(releases, "9.0.0.dev0", newer, changed, hashes) == []


def test_the_history_rule_fails_on_a_bad_list():
    rels = [{"version": "0.2.0", "commit": "a" * 40, "format": [1, 1]},
            {"version": "0.1.0", "commit": "b" * 40, "format": [1, 0]},
            {"version": "0.3.0", "commit": "c" * 12, "format": [1, 2]}]
    problems = R.history_problems(rels)
    assert problems == [
        "release 0.3.0: commit 'cccccccccccc' is not a full 40-digit commit hash",
        "releases.json lists 0.1.0 after 0.2.0: list releases oldest first, each with a "
        "higher version",
        "release 0.1.0 has format 1.0, older than 0.2.0's 1.1"]


def test_every_release_stays_in_the_compat_matrix():
    """tests/compat collects both directions for every listed release."""
    p = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p",
                        "no:cacheprovider", "tests/compat/test_releases.py"],
                       cwd=R.ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    ids = set(re.findall(r"\[([^\]]+)\]", p.stdout))
    for r in R.load_releases():
        v = r["version"]
        assert v in ids, f"tests/compat does not test release {v}"
        assert {f"{v}-release format", f"{v}-default"} <= ids, ids


def test_every_release_keeps_its_golden_archives():
    assert R.golden_problems(R.load_releases()) == []


def test_the_golden_rule_fails_when_a_folder_or_file_is_gone(tmp_path):
    (tmp_path / "1.0").mkdir()
    (tmp_path / "1.0" / "make_golden.py").write_text("")
    (tmp_path / "1.0" / "manifest.json").write_text('{"a.tmod": "sha256:0"}')
    rels = [{"version": "0.1.0", "commit": "a" * 40, "format": [1, 0]},
            {"version": "0.2.0", "commit": "b" * 40, "format": [1, 1]}]
    assert R.golden_problems(rels, tmp_path) == [
        "release 0.1.0: schema/golden/1.0/a.tmod is gone; golden archives of a released "
        "format stay in the tree forever",
        "release 0.2.0 (format 1.1): schema/golden/1.1/ with make_golden.py and manifest.json "
        "is gone; golden archives of a released format stay in the tree forever"]
