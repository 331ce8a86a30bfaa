"""scripts/freeze_format.py (issue 37): freezing the format in development and
listing its release is refused while the golden compendium misses a case
(or the number is not new, or the format already released), and a freeze of
a copy of the tree leaves the release rules of test_releases.py holding."""
import importlib.util
import json
import shutil

import pytest

import mgtrace as mt

from . import releases as R

FV = mt.FORMAT_VERSION
DEV = ".".join(map(str, FV))


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("freeze_format", R.ROOT / "scripts" /
                                                  "freeze_format.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def covered(script):
    return script._load("golden_coverage", R.SCHEMA / "golden" / "coverage.py").all_uses()


def _unchanged(script):
    return {f: (R.ROOT / f).read_bytes() if (R.ROOT / f).is_file() else
            sorted(p.name for p in (R.ROOT / f).iterdir()) for f in script.FILES}


def test_the_compendium_of_the_format_in_development_is_complete(script, covered):
    """What CI checks: nothing but the release itself (and a clean tree)
    stands between this code and a freeze."""
    assert script.problems(R.ROOT, "9.9.9", FV, covered=covered, check_tree=False) == []


def test_a_freeze_is_refused_while_a_golden_case_is_missing(script, covered):
    """The development format's archive of new functions gone from the
    tables: each function it alone covers is named, and nothing is written."""
    folder = DEV
    assert "new_functions.tmod" in covered[folder]
    without = {f: {n: u for n, u in a.items() if not (f == folder and n == "new_functions.tmod")}
               for f, a in covered.items()}
    before = _unchanged(script)
    found = script.problems(R.ROOT, "9.9.9", FV, covered=without, check_tree=False)
    how = "the golden maker of the format in development lacks it: add a case and run the maker"
    assert f"function mgtrace.functional.sinh version 1 has no golden case: {how}" in found
    assert f"function mgtrace.functional.einsum version 1 has no golden case: {how}" in found
    assert f"tensor method 'detach' has no golden case: {how}" in found
    # (the complex constants of F.complex's case are the 1.2 value tag's only golden)
    assert f"value tag 'complex' has no golden case: {how}" in found
    assert all(m.startswith(("function mgtrace.functional.", "tensor method", "value tag 'complex'"))
               for m in found), found
    assert _unchanged(script) == before


def test_a_freeze_is_refused_for_an_old_or_unfinished_number(script, capsys):
    before = _unchanged(script)
    assert script.main(["0.1.5", "--check"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"format {DEV} cannot be frozen as 0.1.5:\n")
    assert "- release 0.1.5 is not above the last listed release 0.2.0\n" in err
    assert script.main(["0.3.0.dev1"]) == 1
    assert "- release '0.3.0.dev1' is not X.Y.Z (a release number has no dev or pre-release " \
           "part)\n" in capsys.readouterr().err
    assert script.main(["0.3.0", "--commit", "abc"]) == 1
    assert "- commit 'abc' is not a full 40-digit commit hash\n" in capsys.readouterr().err
    assert _unchanged(script) == before


def test_a_released_format_is_not_frozen_again(script):
    rels = R.load_releases() + [{"version": "0.3.0", "commit": "a" * 40, "format": list(FV)}]
    assert script.release_problems(rels, "0.4.0", FV) == [
        f"format {DEV} is already released (as 0.3.0, schema/releases.json): raise "
        "FORMAT_VERSION for a new format first"]


def test_a_freeze_of_a_copy_of_the_tree(script, tmp_path):
    """The files a freeze writes, in a copy: the format's op table frozen,
    the release listed with what its commit calls itself, the package
    version raised to it, the changelog and README rows; then the history
    and version rules of test_releases.py hold and the format counts as
    released."""
    for f in script.FILES + ("schema/ops.json",):
        src, dst = R.ROOT / f, tmp_path / f
        dst.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if src.is_dir() else shutil.copyfile)(src, dst)
    commit = "0123456789abcdef" * 2 + "01234567"
    notes = script.freeze(tmp_path, "0.3.0", commit, FV, mt.__version__)
    assert notes == []
    frozen = tmp_path / "mgtrace" / "serialization" / "released_ops" / f"{DEV}.json"
    assert json.loads(frozen.read_text()) == json.loads((R.SCHEMA / "ops.json").read_text())
    rels = json.loads((tmp_path / "schema" / "releases.json").read_text())["releases"]
    assert rels[:-1] == R.load_releases()
    assert rels[-1] == {"version": "0.3.0", "commit": commit, "format": list(FV),
                        "package_version": mt.__version__}
    assert 'version = "0.3.0"' in (tmp_path / "pyproject.toml").read_text()
    assert '__version__ = "0.3.0"' in (tmp_path / "mgtrace" / "__init__.py").read_text()
    log = (tmp_path / "schema" / "CHANGELOG.md").read_text()
    assert f"## {DEV}\n\nReleased as mgtrace 0.3.0 (commit 0123456).\n" in log
    assert f"| 0.3.0 | 0123456 | {DEV} |" in log
    assert f"| 0.3.0 (commit 0123456) | {DEV} | 1.0 to {DEV} |" in (tmp_path / "README.md").read_text()
    assert R.history_problems(rels) == []
    hashes = R.load_hashes()
    assert R.version_problems(rels, "0.3.0", FV, hashes[DEV], hashes) == []
    assert script.release_problems(rels, "0.3.1", FV)[0].startswith(
        f"format {DEV} is already released (as 0.3.0")
