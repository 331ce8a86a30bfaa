"""Archives from the future (issue 37, item 5), made by hand from one this
release writes: a newer major; a newer minor with unknown optional fields
(loaded: the format says an older reader ignores them) and one that needs
a newer reader; and, from a newer writer, an unknown function version,
value tag and dtype. Each refusal names the archive's format, its writer,
the formats this reader reads and what to do; the messages are asserted
whole."""
import io

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


def test_a_newer_minor_with_unknown_optional_fields_loads(archive):
    """A newer minor may add optional fields an older reader ignores
    (version.py): in the header, in a module entry, in a tensor entry. They
    are not kept: a save by this release writes its own format, without
    them (the format gives an unknown field no rule for being kept)."""
    data, x, y = archive

    def add(h):
        h["future_header_field"] = {"list": [1, 2]}
        h["modules"][0]["future_module_field"] = "kept nowhere"
        h["tensors"][0]["future_tensor_field"] = 3
    fut = _future(data, (MAJOR, MINOR + 1), (1, 1), change=add)
    arc = load_archive(io.BytesIO(fut))
    assert arc.format_version == (MAJOR, MINOR + 1)
    np.testing.assert_array_equal(arc.obj(x).numpy(), y)
    np.testing.assert_array_equal(arc.example_outputs.numpy(), y)
    buf = io.BytesIO()
    mt.save(arc, buf)                     # a new archive by this writer: its own format
    buf.seek(0)
    h = read_header(buf)
    assert "future_header_field" not in h and "future_module_field" not in h["modules"][0]
    assert h["producer"] == {"library": "mgtrace", "version": mt.__version__}
    assert tuple(h["format_version"]) <= mt.FORMAT_VERSION
    buf.seek(0)
    np.testing.assert_array_equal(mt.load(buf)(x).numpy(), y)
    with pytest.raises(ValueError, match=r"target_version \(1, 3\): this mgtrace writes "
                                         r"formats 1.0 to 1.2"):
        mt.save(arc, io.BytesIO(), target_version=arc.format_version)


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
