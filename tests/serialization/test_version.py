"""version.py: FORMAT_VERSION is written, newer majors and min_reader_version
above ours are refused naming both versions, a newer minor with optional
fields this reader does not know still loads."""
import pytest

import mgtrace as mt
from mgtrace.serialization import version

from .helpers import edit, load_bytes, save_bytes, split


def test_format_version_is_exported_and_written():
    assert mt.FORMAT_VERSION == (1, 2) == mt.serialization.FORMAT_VERSION
    header, _ = split(save_bytes(mt.tensor([1.0])))
    assert header["format"] == "mgtrace.tmod"
    # the 1.1 header checksum is optional for a reader: a 1.0 reader loads the file;
    # nothing of 1.2 is used, so the archive is a 1.1 one
    assert header["format_version"] == [1, 1] and header["min_reader_version"] == [1, 0]
    assert list(header)[-1] == "header_checksum"
    assert header["producer"] == {"library": "mgtrace", "version": mt.__version__}


def test_target_version_1_0_writes_a_1_0_archive_without_the_seal():
    header, _ = split(save_bytes(mt.tensor([1.0]), target_version=(1, 0)))
    assert header["format_version"] == [1, 0] and header["min_reader_version"] == [1, 0]
    assert "header_checksum" not in header
    assert load_bytes(save_bytes(mt.tensor([1.0]), target_version=(1, 0))).tolist() == [1.0]


@pytest.mark.parametrize("target", [(0, 9), (1, 3), (2, 0), "1.0", (1,), 3])
def test_unwritable_target_versions_are_refused(target):
    with pytest.raises(ValueError, match="target_version"):
        save_bytes(mt.tensor([1.0]), target_version=target)


def _versions(fv, mv, **extra):
    def fn(h):
        h.update(format_version=fv, min_reader_version=mv, **extra)
    return edit(save_bytes({"w": mt.tensor([1.0, 2.0]), "n": 3}), fn)


def test_newer_minor_with_unknown_optional_fields_loads():
    def more(h):
        h.update(format_version=[1, 7], min_reader_version=[1, 0], compression=None,
                 signatures={"a": 1})
        h["tensors"][0]["layout"] = "strided"
        h["modules"] = []
    out = load_bytes(edit(save_bytes({"w": mt.tensor([1.0, 2.0]), "n": 3}), more))
    assert out["n"] == 3 and out["w"].tolist() == [1.0, 2.0]


OURS = version.fmt(version.FORMAT_VERSION)
BY = f"mgtrace {mt.__version__}"


@pytest.mark.parametrize("fv, mv, message", [
    ([2, 0], [2, 0], f"this archive is format 2.0 \\(written by {BY}\\), a newer major version; "
                     f"this reader \\({BY}\\) reads formats 1.0 to {OURS}: load it with an "
                     f"mgtrace that reads format 2.0, or have it saved there with "
                     f"target_version=\\({OURS.replace('.', ', ')}\\) for this reader$"),
    # a newer major is refused whatever min_reader_version says, and the message
    # never claims the reader lacks a version it has
    ([2, 0], [1, 0], f"this archive is format 2.0 \\(written by {BY}\\), a newer major version"),
    ([1, 7], [1, 3], f"needs an mgtrace that reads format 1.3 \\(it was written as format 1.7 "
                     f"by {BY}\\); this reader \\({BY}\\) reads formats 1.0 to {OURS}: load it "
                     "with an mgtrace that reads format 1.3"),
    ([0, 9], [0, 9], f"format 0.9 \\(written by {BY}\\) is older than {OURS} and there is no "
                     "upgrader from major version 0"),
])
def test_versions_this_reader_cannot_read_are_refused_naming_both(fv, mv, message):
    with pytest.raises(mt.serialization.VersionError, match=message) as e:
        load_bytes(_versions(fv, mv))
    text = str(e.value)
    # what the archive needs is never what this reader has
    assert f"reads format {OURS}" not in text.split(";")[0]


def test_version_message_names_the_writer():
    data = edit(save_bytes({"n": 1}), lambda h: h.update(
        format_version=[2, 1], min_reader_version=[2, 0],
        producer={"library": "mgtrace", "version": "9.4.1"}))
    with pytest.raises(mt.serialization.VersionError, match=r"written by mgtrace 9\.4\.1\)"):
        load_bytes(data)


@pytest.mark.parametrize("fv, mv, message", [
    ([1, 0], [1, 2], "min_reader_version 1.2 is above format_version 1.0"),
    ([1], [1, 0], "format_version: expected \\[major, minor\\]"),
    ("1.0", [1, 0], "format_version: expected"),
    ([1, 0], [1, -1], "min_reader_version: expected"),
])
def test_malformed_versions_are_archive_errors(fv, mv, message):
    with pytest.raises(mt.ArchiveError, match=message):
        load_bytes(_versions(fv, mv))


def test_check_readable_directly():
    version.check_readable((1, 0), (1, 0))
    version.check_readable((1, 9), (1, 1))
    version.check_readable((1, 9), (1, 2))
    with pytest.raises(mt.serialization.VersionError):
        version.check_readable((1, 3), (1, 3))


def _relu_net():
    import numpy as np
    import mgtrace.functional as F
    import mgtrace.module as M

    class Net(M.Module):
        def __init__(self):
            super().__init__()
            self.fc = M.Linear(3, 2)

        def forward(self, x):
            return F.relu(self.fc(x))
    return mt.trace_module(Net(), mt.tensor(np.ones((1, 3), "float32")))


def test_the_1_0_op_table_is_the_released_one():
    old = version.released_names((1, 0))
    assert old["functions"]["mgtrace.functional.conv2d"] == 1
    assert old["module_types"]["mgtrace.module.Linear"] == 1
    assert version.released_names(mt.FORMAT_VERSION) is None


@pytest.mark.parametrize("table, name, words", [
    ("functions", "mgtrace.functional.relu", "function 'mgtrace.functional.relu' is new since"),
    ("module_types", "mgtrace.module.Linear", "module type 'mgtrace.module.Linear' is new since"),
])
def test_target_1_0_refuses_what_that_release_did_not_have(monkeypatch, table, name, words):
    real = version._released((1, 0))
    fake = {k: dict(v) for k, v in real.items()}
    del fake[table][name]
    from mgtrace.serialization import context
    monkeypatch.setattr(context, "released_names", lambda v: None if v == mt.FORMAT_VERSION
                        else fake if v == (1, 0) else version._released(v))
    tm = _relu_net()
    with pytest.raises(ValueError, match=words):
        save_bytes(tm, target_version=(1, 0))
    header, _ = split(save_bytes(tm))            # the current format has it
    assert header["format_version"] == [1, 1]


def test_target_1_0_refuses_a_function_newer_than_that_release(monkeypatch):
    fake = {k: dict(v) for k, v in version._released((1, 0)).items()}
    fake["functions"]["mgtrace.functional.relu"] = 0
    from mgtrace.serialization import context
    monkeypatch.setattr(context, "released_names", lambda v: None if v == mt.FORMAT_VERSION else fake)
    with pytest.raises(ValueError, match="at version 1, format 1.0 knew version 0"):
        save_bytes(_relu_net(), target_version=(1, 0))


def test_an_archive_is_current_from_1_1_up_to_the_format_written():
    # save writes 1.1 unless a newer feature is used: a 1.1 archive needs no upgrade
    assert version.is_current(split(save_bytes(mt.tensor([1.0])))[0]["format_version"])
    assert version.is_current(mt.FORMAT_VERSION)
    assert not version.is_current((1, 0)) and not version.is_current((1, 9))
