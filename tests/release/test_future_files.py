"""Archives from the future (issue 37, item 5), made by hand from one this
release writes: a newer major; a newer minor with unknown optional fields
(loaded, as the format says an older reader ignores them, and kept on a
re-save at the archive's version: unknown.py) and one that needs a newer
reader; and, from a newer writer, an unknown function version,
value tag and dtype. Each refusal names the archive's format, its writer,
the formats this reader reads and what to do; the messages are asserted
whole."""
import io
import warnings

import numpy as np
import pytest

import mgtrace as mt
import mgtrace.functional as F
import mgtrace.module as M
from mgtrace.serialization import load_archive, read_header

from serialization.helpers import edit  # tests/serialization (tests/ is on the path)

NEWER = "9.1.0"            # a writer newer than this reader
MAJOR, MINOR = mt.FORMAT_VERSION


def _reader():
    return (f"this reader (mgtrace {mt.__version__}) reads formats 1.0 to {MAJOR}.{MINOR}")


def _advice(writer=NEWER):
    return (f"load it with mgtrace >= {writer}, or have it saved there with "
            f"target_version=({MAJOR}, {MINOR}) for this reader")


class Net(M.Module):
    def __init__(self):
        super().__init__()
        self.fc = M.Linear(4, 3)

    def forward(self, x):
        return F.relu(self.fc(x)) * 2.0


@pytest.fixture(scope="module")
def archive():
    """(bytes, example input, output) of a traced model with an example."""
    mt.random.seed(7)
    net = Net().eval()
    x = mt.tensor(np.random.default_rng(7).standard_normal((2, 4)).astype(np.float32))
    tm = mt.trace_module(net, x)
    buf = io.BytesIO()
    mt.save(tm, buf, example_inputs=(x,), metadata={"what": "future"})
    return buf.getvalue(), x, net(x).numpy()


def _future(data, fv, mv, writer=NEWER, change=None):
    def fn(h):
        h["format_version"], h["min_reader_version"] = list(fv), list(mv)
        h["producer"] = {"library": "mgtrace", "version": writer}
        if change:
            change(h)
    return edit(data, fn)


def test_a_newer_major_is_refused_naming_both_and_what_to_do(archive):
    data = _future(archive[0], (MAJOR + 1, 0), (MAJOR + 1, 0))
    with pytest.raises(mt.serialization.VersionError) as e:
        mt.load(io.BytesIO(data))
    assert str(e.value) == (f"this archive is format {MAJOR + 1}.0 (written by mgtrace {NEWER}), "
                            f"a newer major version; {_reader()}: {_advice()}")
    with pytest.raises(mt.serialization.VersionError):     # the header alone is refused too
        read_header(io.BytesIO(data))


def test_a_newer_minor_that_needs_a_newer_reader_is_refused(archive):
    data = _future(archive[0], (MAJOR, MINOR + 1), (MAJOR, MINOR + 1),
                   change=lambda h: h.update(quantization={"scheme": "future"}))
    with pytest.raises(mt.serialization.VersionError) as e:
        mt.load(io.BytesIO(data))
    assert str(e.value) == (f"this archive needs an mgtrace that reads format {MAJOR}."
                            f"{MINOR + 1} (it was written as format {MAJOR}.{MINOR + 1} by "
                            f"mgtrace {NEWER}); {_reader()}: {_advice()}")


def test_a_foreign_writer_gets_advice_by_format(archive):
    data = _future(archive[0], (MAJOR, MINOR + 1), (MAJOR, MINOR + 1), writer="custom-build")
    with pytest.raises(mt.serialization.VersionError) as e:
        mt.load(io.BytesIO(data))
    assert str(e.value).endswith(f"{_reader()}: load it with an mgtrace that reads format "
                                 f"{MAJOR}.{MINOR + 1}, or have it saved there with "
                                 f"target_version=({MAJOR}, {MINOR}) for this reader")


def _add_unknown(h):
    h["future_header_field"] = {"list": [1, 2]}
    h["modules"][0]["future_module_field"] = "of the traced Net"
    h["modules"][1]["future_module_field"] = {"of": "its Linear"}
    h["tensors"][0]["future_tensor_field"] = 3


UNKNOWN = {"header": {"future_header_field": {"list": [1, 2]}},
           "modules": {0: {"future_module_field": "of the traced Net"},
                       1: {"future_module_field": {"of": "its Linear"}}},
           "tensors": {0: {"future_tensor_field": 3}}}


@pytest.mark.parametrize("mmap", [False, True])
def test_a_newer_minor_with_unknown_optional_fields_loads_and_keeps_them(archive, mmap):
    """A newer minor may add optional fields an older reader ignores
    (version.py): in the header, in a module entry, in a tensor entry. The
    load runs without them and keeps them (Archive.unknown_fields); saved
    at the archive's own version (a transcription, the newer minor's) they
    come back unchanged, and so does every byte."""
    data, x, y = archive
    fut = _future(data, (MAJOR, MINOR + 1), (1, 1), change=_add_unknown)
    arc = load_archive(io.BytesIO(fut), mmap=mmap)
    assert arc.format_version == (MAJOR, MINOR + 1)
    assert arc.unknown_fields == UNKNOWN
    np.testing.assert_array_equal(arc.obj(x).numpy(), y)
    np.testing.assert_array_equal(arc.example_outputs.numpy(), y)
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mt.save(arc, buf, target_version=arc.format_version)
    assert buf.getvalue() == fut
    again = load_archive(io.BytesIO(buf.getvalue()))
    assert again.unknown_fields == UNKNOWN and again.producer["version"] == NEWER
    np.testing.assert_array_equal(again.obj(x).numpy(), y)
    # a newer minor without unknown fields is transcribed the same way
    plain = _future(data, (MAJOR, MINOR + 1), (1, 1))
    arc = load_archive(io.BytesIO(plain), mmap=mmap)
    assert arc.unknown_fields == {"header": {}, "modules": {}, "tensors": {}}
    buf = io.BytesIO()
    mt.save(arc, buf, target_version=arc.format_version)
    assert buf.getvalue() == plain


def test_unknown_fields_are_dropped_with_a_warning_at_another_version(archive):
    """Saved for this writer's own format (or an older one) the archive
    cannot claim the newer minor's fields: they are left out, and a warning
    names each and says how to keep them."""
    data, x, y = archive
    fut = _future(data, (MAJOR, MINOR + 1), (1, 1), change=_add_unknown)
    arc = load_archive(io.BytesIO(fut))
    for target in (None, (1, 1)):
        buf = io.BytesIO()
        with pytest.warns(UserWarning) as w:
            mt.save(arc, buf, target_version=target)
        [msg] = [str(r.message) for r in w]
        assert w[0].filename == __file__            # the caller's line
        shown = ".".join(map(str, target or mt.FORMAT_VERSION))
        assert msg == (
            f"this archive (format {MAJOR}.{MINOR + 1}) holds fields this mgtrace does not know "
            "(header.future_header_field, header.modules[0].future_module_field, "
            "header.modules[1].future_module_field, header.tensors[0].future_tensor_field); "
            f"saved for format {shown} they are left out: save it with "
            "target_version=archive.format_version to keep them")
        buf.seek(0)
        h = read_header(buf)
        assert "future_header_field" not in h
        assert all("future_module_field" not in m for m in h["modules"])
        assert "future_tensor_field" not in h["tensors"][0]
        assert h["producer"] == {"library": "mgtrace", "version": mt.__version__}
        assert tuple(h["format_version"]) <= (target or mt.FORMAT_VERSION)
        buf.seek(0)
        np.testing.assert_array_equal(mt.load(buf)(x).numpy(), y)
    with pytest.raises(ValueError, match=r"target_version \(1, 4\): this mgtrace writes "
                                         r"formats 1.0 to 1.2"):
        mt.save(arc, io.BytesIO(), target_version=(1, 4))


def test_fields_go_back_only_with_the_objects_they_came_with(archive):
    """A module replaced between load and save takes its fields with it:
    the Linear's, and its weight's, are gone; the header's and the traced
    module's stay."""
    data, x, y = archive
    fut = _future(data, (MAJOR, MINOR + 1), (1, 1), change=_add_unknown)
    arc = load_archive(io.BytesIO(fut))
    fc = M.Linear(4, 3)
    fc.load_state_dict({k: v.copy() for k, v in arc.obj.fc.state_dict().items()})
    arc.obj.fc = fc
    buf = io.BytesIO()
    mt.save(arc, buf, target_version=arc.format_version)
    again = load_archive(io.BytesIO(buf.getvalue()))
    assert again.unknown_fields == {"header": UNKNOWN["header"],
                                    "modules": {0: UNKNOWN["modules"][0]}, "tensors": {}}
    np.testing.assert_array_equal(again.obj(x).numpy(), y)


def test_an_archive_of_this_format_with_unknown_fields_keeps_them_too(archive):
    """The same rule for an archive of this very format (another build of
    the format in development, say): fields it does not know are carried
    at its version."""
    data, x, y = archive
    fv = read_header(io.BytesIO(data))["format_version"]
    fut = _future(data, fv, (1, 1), writer=mt.__version__, change=_add_unknown)
    arc = load_archive(io.BytesIO(fut))
    assert arc.unknown_fields == UNKNOWN
    buf = io.BytesIO()
    mt.save(arc, buf, target_version=arc.format_version)
    assert buf.getvalue() == fut


def test_golden_archives_have_no_unknown_fields():
    """Every field this writer writes is declared (the goldens of every
    format: nothing of theirs is taken for a newer minor's field)."""
    import importlib.util
    import pathlib
    import sys
    golden = pathlib.Path(__file__).resolve().parents[2] / "schema" / "golden"
    for path in sorted(golden.glob("*/*.tmod")):
        name = f"golden_{path.parent.name.replace('.', '_')}"
        if name not in sys.modules:
            spec = importlib.util.spec_from_file_location(name, path.parent / "make_golden.py")
            sys.modules[name] = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(sys.modules[name])
        assert load_archive(path).unknown_fields == {"header": {}, "modules": {}, "tensors": {}}, path


def _op_version(h, version):
    [op] = [o for o in h["ops"] if o["name"] == "mgtrace.functional.relu"]
    op["version"] = version


def test_an_unknown_function_version_from_a_newer_writer_is_refused(archive):
    data = _future(archive[0], (MAJOR, MINOR), (1, 1), change=lambda h: _op_version(h, 2))
    with pytest.raises(mt.serialization.VersionError) as e:
        mt.load(io.BytesIO(data))
    assert str(e.value) == (
        "function 'mgtrace.functional.relu' is version 2 in this archive, but this program has "
        "version 1: the archive was written by a newer release; upgrade mgtrace (or the package "
        "that defines 'mgtrace.functional.relu')"
        f" (this archive is format {MAJOR}.{MINOR}, written by mgtrace {NEWER}; {_reader()}: "
        f"{_advice()})")


def _tag(h):
    h["metadata"] = {"dict": [["what", {"float8": "0x3c"}]]}


def test_an_unknown_value_tag_from_a_newer_writer_is_refused(archive):
    data = _future(archive[0], (MAJOR, MINOR + 1), (1, 1), change=_tag)
    with pytest.raises(mt.ArchiveError) as e:
        load_archive(io.BytesIO(data))
    msg = str(e.value)
    assert msg.startswith("header.metadata")
    assert "unknown value tag 'float8'" in msg
    assert msg.endswith(f" (this archive is format {MAJOR}.{MINOR + 1}, written by mgtrace "
                        f"{NEWER}; {_reader()}: {_advice()})")


def _dtype(h):
    h["tensors"][0]["dtype"] = "float8_e4m3fn"


def test_an_unknown_dtype_from_a_newer_writer_is_refused(archive):
    data = _future(archive[0], (MAJOR, MINOR + 1), (1, 1), change=_dtype)
    for read in (mt.load, read_header):
        with pytest.raises(mt.ArchiveError) as e:
            read(io.BytesIO(data))
        msg = str(e.value)
        assert "'float8_e4m3fn'" in msg
        assert msg.endswith(f" (this archive is format {MAJOR}.{MINOR + 1}, written by mgtrace "
                            f"{NEWER}; {_reader()}: {_advice()})")


@pytest.mark.parametrize("change", [_tag, _dtype, lambda h: _op_version(h, 2)],
                         ids=["tag", "dtype", "op version"])
def test_unknowns_from_this_release_are_not_blamed_on_a_newer_one(archive, change):
    """The same file from a writer no newer than this reader: damaged or
    made by hand, so no advice to upgrade."""
    data = _future(archive[0], (1, 1), (1, 1), writer=mt.__version__, change=change)
    with pytest.raises(mt.ArchiveError) as e:
        load_archive(io.BytesIO(data))
    assert "this reader" not in str(e.value) and "load it with" not in str(e.value)
