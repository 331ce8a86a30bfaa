"""Archives across real releases (schema/releases.json), both ways:

(a) each earlier release saves ResNet-18, MobileNetV2, a MiniLM-shaped
    encoder and an edited graph (tests/compat/zoo.py); this release loads
    them and reproduces the stored outputs, and `mgtrace upgrade` rewrites
    them in the current format with the same outputs;
(b) this release saves the same models for the release's format
    (``target_version``) and as it does by default; the earlier release
    loads both and reproduces the stored outputs;
(c) the earlier release loads every golden archive of a format it reads
    (schema/golden/1.1's were written by this code at target 1.1) and
    reproduces their stored outputs.

Each release is built once from this repository's history (git archive +
an in-place build, a few minutes; cached, see releases.py).
"""
import json
import re
import subprocess
import sys

import pytest

from . import releases as R

ZOO = R.REPO / "tests" / "compat" / "zoo.py"
GOLDEN_CHECK = R.REPO / "tests" / "compat" / "golden_check.py"
NAMES = {"resnet18.tmod", "mobilenet_v2.tmod", "minilm_encoder.tmod", "resnet18_edited.tmod"}
# float32 outputs agree to this fraction of their largest magnitude (the
# seeded ResNet-18's reach 2e5; a release that picks another conv algorithm
# sums in another order, which moves the last bits: 2e-6 of the scale seen)
RTOL = 1e-5


def _release_ids():
    return [r["version"] for r in R.releases()]


@pytest.fixture(scope="module", params=R.releases(), ids=_release_ids())
def release(request):
    rel = request.param
    if not R.have_history(rel["commit"]):
        pytest.skip(f"this checkout's git history lacks {rel['version']} ({rel['commit'][:12]})")
    return rel, R.build(rel)


def _ok(p):
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    return p


def _check(where, folder, tmp_path):
    out = json.loads(_ok(R.run(where, [ZOO, "check", folder], cwd=tmp_path)).stdout)
    assert out["mgtrace"].startswith(str(where)), out["mgtrace"]     # the release meant
    assert set(out["archives"]) == NAMES
    for name, r in out["archives"].items():
        assert r["max_abs_error"] <= RTOL * max(1.0, r["max_abs_value"]), (name, r)
    return out["archives"]


def test_old_archives_load_here_and_upgrade(release, tmp_path):
    rel, where = release
    old = tmp_path / "old"
    _ok(R.run(where, [ZOO, "save", old], cwd=tmp_path))
    got = _check(R.REPO, old, tmp_path)
    # written as the oldest format that holds each (a 1.2 writer writes the zoo as 1.1)
    assert all(tuple(r["format_version"]) <= tuple(rel["format"]) for r in got.values()), got
    # what the release called itself (0.2.0 was built as "0.1.0": releases.json)
    assert {r["metadata"]["writer"] for r in got.values()} == {
        rel.get("package_version", rel["version"])}
    new = tmp_path / "upgraded"
    p = R.run(R.REPO, ["-m", "mgtrace", "upgrade", old, "-o", new, "--json"], cwd=tmp_path)
    recs = json.loads(_ok(p).stdout)["records"]
    assert [r["status"] for r in recs] == ["ok"] * len(NAMES), recs
    upgraded = _check(R.REPO, new, tmp_path)
    from mgtrace.serialization.version import is_current
    # the current format: what save writes now, the oldest version from 1.1
    # that holds each archive (none of the zoo's needs 1.2's views)
    assert all(is_current(r["format_version"]) for r in upgraded.values()), upgraded


@pytest.mark.parametrize("target", ["release format", "default"])
def test_archives_saved_here_load_in_the_old_release(release, tmp_path, target):
    rel, where = release
    new = tmp_path / "new"
    args = [ZOO, "save", new] + (["--target", ".".join(map(str, rel["format"]))]
                                 if target == "release format" else [])
    _ok(R.run(R.REPO, args, cwd=tmp_path))
    got = _check(where, new, tmp_path)
    if target == "release format":       # at most the target; 1.0 exactly for 0.1.0
        assert all(tuple(r["format_version"]) <= tuple(rel["format"]) for r in got.values())


def test_golden_archives_load_in_the_old_release(release, tmp_path):
    rel, where = release
    golden = R.REPO / "schema" / "golden"
    folders = [p for p in sorted(golden.iterdir()) if re.fullmatch(r"\d+\.\d+", p.name)
               and tuple(map(int, p.name.split("."))) <= tuple(rel["format"])]
    out = json.loads(_ok(R.run(where, [GOLDEN_CHECK, *folders], cwd=tmp_path)).stdout)
    assert out["mgtrace"].startswith(str(where)), out["mgtrace"]
    assert set(out["archives"]) == {f"{f.name}/{p.name}" for f in folders for p in f.glob("*.tmod")}
    for name, r in out["archives"].items():
        assert r.get("exact", True), (name, r)
        assert r.get("ulps", 0.0) * 2.0 ** -23 <= RTOL, (name, r)
