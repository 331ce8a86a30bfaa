"""reader.py and source.py: loading from paths, file objects and streams;
hostile archives (calls to os.system & co., arbitrary classes, pickles) are
refused before anything runs, and malformed headers raise ArchiveError."""
import io
import os
import pickle

import msgpack
import pytest

import mgtrace as mt
import mgtrace.module as M
from mgtrace.serialization.layout import MAGIC

from . import test_codecs  # noqa: F401  (registers the toy "test_calls" kind, whose decode calls ops)
from .helpers import edit, load_bytes, pack, save_bytes, split


def test_paths_file_objects_offsets_and_streams(tmp_path):
    obj = {"w": mt.tensor([1.0, 2.0]), "k": (1, "a")}
    data = save_bytes(obj)
    path = tmp_path / "a.tmod"
    path.write_bytes(b"junk" + data)
    for mmap in (False, True):
        with open(path, "rb") as f:
            f.seek(4)                       # an archive inside a bigger file
            assert mt.load(f, mmap=mmap)["k"] == (1, "a")

    class Stream(io.RawIOBase):             # not seekable: read into memory once
        def __init__(self):
            self.buf = io.BytesIO(data)

        def readable(self):
            return True

        def readinto(self, b):
            return self.buf.readinto(b)
    assert mt.load(io.BufferedReader(Stream()))["w"].tolist() == [1.0, 2.0]
    path.write_bytes(data)
    assert mt.load(str(path))["k"] == (1, "a") and mt.load(os.fsencode(path))["k"] == (1, "a")
    with pytest.raises(TypeError, match="path or a binary file object"):
        mt.load(3)
    with pytest.raises(FileNotFoundError):
        mt.load(tmp_path / "missing.tmod")


def test_load_archive_gives_metadata_and_examples():
    net = M.Sequential(M.Linear(3, 2), M.ReLU())
    x = mt.tensor([[1.0, -2.0, 3.0]])
    data = save_bytes(net, metadata={"author": "me", 1: (2, 3)}, example_inputs=x)
    a = mt.serialization.load_archive(io.BytesIO(data))
    assert a.metadata == {"author": "me", 1: (2, 3)}
    assert a.format_version == (1, 1) and a.producer["library"] == "mgtrace"
    assert len(a.example_inputs) == 1 and a.example_inputs[0].tolist() == x.tolist()
    assert a.obj(*a.example_inputs).tolist() == a.example_outputs.tolist() == net(x).tolist()
    assert "Sequential" in repr(a)
    header = mt.serialization.read_header(io.BytesIO(data))
    assert header["examples"]["inputs"] == {"tuple": [{"tensor": 2}]}


def test_archive_errors_are_value_errors():
    with pytest.raises(ValueError):
        load_bytes(b"nope")
    assert issubclass(mt.serialization.RegistryError, mt.ArchiveError)


# ---- hostile archives: nothing named in the file runs

def _hostile_call(target, path):
    """A toy-codec module whose decode would call ``target(command)``."""
    def fn(h):
        h["ops"] = [{"name": target, "version": 1}]
        h["modules"] = [{"kind": "test_calls", "training": False,
                         "calls": [{"op": 0, "args": {"args": f"touch {path}",
                                                      "cmd": f"touch {path}"}}]}]
        h["root"] = {"module": 0}
    return edit(save_bytes(None), fn)


@pytest.mark.parametrize("target", ["os.system", "builtins.eval", "subprocess.run",
                                    "posix.system", "builtins.exec", "importlib.import_module"])
def test_calls_to_unregistered_targets_fail_before_running(target, tmp_path):
    marker = tmp_path / "pwned"
    with pytest.raises(mt.serialization.RegistryError, match=f"'{target}'.*register_function"):
        load_bytes(_hostile_call(target, marker))
    assert not marker.exists()


@pytest.mark.parametrize("type_name", ["collections.OrderedDict", "os.system", "builtins.eval",
                                       "subprocess.Popen", "mgtrace.module.Module", "pickle.loads"])
@pytest.mark.parametrize("kind", ["builtin", "container"])
def test_module_types_naming_arbitrary_classes_are_refused(type_name, kind):
    def fn(h):
        h["modules"][0].update(type=type_name, kind=kind, children=[])
    with pytest.raises(mt.serialization.RegistryError,
                       match=f"'{type_name}', which is not a registered module type"):
        load_bytes(edit(save_bytes(M.ReLU()), fn))


class _Touch:
    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def test_pickles_are_never_loaded(tmp_path):
    marker = tmp_path / "pwned"
    blob = pickle.dumps(_Touch(marker))
    with pytest.raises(mt.ArchiveError, match="pickle, which mgtrace never loads"):
        load_bytes(blob)
    with pytest.raises(mt.ArchiveError, match="unknown value tag 'pickle'.*never loaded"):
        load_bytes(edit(save_bytes(None), lambda h: h.update(root={"pickle": blob})))
    with pytest.raises(mt.ArchiveError, match="unknown module kind 'pickle'"):
        load_bytes(edit(save_bytes(M.ReLU()), lambda h: h["modules"][0].update(kind="pickle",
                                                                               data=blob)))
    with pytest.raises(mt.ArchiveError, match="unknown scalar dtype 'O'"):
        load_bytes(edit(save_bytes(None), lambda h: h.update(root={"scalar": ["O", blob]})))
    assert not marker.exists()


# ---- malformed headers

def _raw_header(raw):
    return MAGIC + len(raw).to_bytes(8, "little") + raw + bytes(-(16 + len(raw)) % 64)


@pytest.mark.parametrize("raw, reason", [
    (msgpack.packb([1, 2, 3]), "header: expected a map, got a list"),
    (msgpack.packb({"format": "x"}) + b"\x00", "not valid msgpack"),
    (b"\xc1", "not valid msgpack"),
    (b"\x91" * 5000 + b"\x00", "not valid msgpack"),          # nesting deeper than msgpack allows
    (b"\xdd\xff\xff\xff\xff", "not valid msgpack"),          # a 4-billion-element array, no data
    (b"\xdf\xff\xff\xff\xff", "not valid msgpack"),
    (msgpack.packb({1: 2}), "not valid msgpack"),            # header keys are strings
    (b"\x81\xa1a\xa2\xff\xfe", "not valid msgpack"),          # invalid UTF-8
    (msgpack.packb({"format": msgpack.ExtType(5, b"x")}), "header.format: expected string"),
    (msgpack.packb({}), "required field 'format' is missing"),
])
def test_malformed_headers(raw, reason):
    with pytest.raises(mt.ArchiveError, match=reason):
        load_bytes(_raw_header(raw))
    with pytest.raises(mt.ArchiveError, match=reason):
        mt.serialization.read_header(io.BytesIO(_raw_header(raw)))


@pytest.mark.parametrize("change, reason", [
    ({"format": "safetensors"}, "'safetensors' is not 'mgtrace.tmod'"),
    ({"byteorder": "big"}, "little-endian data only"),
    ({"ops": {"a": 1}}, "header.ops: expected a list"),
    ({"ops": [{"name": "mgtrace.functional.relu"}]}, r"ops\[0\]: the required field 'version'"),
    ({"ops": [{"name": 5, "version": 1}]}, r"ops\[0\].name: expected string"),
    ({"tensors": [7]}, r"tensors\[0\]: expected a map"),
    ({"modules": [{"training": True}]}, r"modules\[0\]: the required field 'kind'"),
    ({"producer": "me"}, "producer: expected a map"),
    ({"data_nbytes": -1}, "data_nbytes: expected non-negative"),
    ({"root": {"tensor": 5}}, r"index 5 is out of range for header.tensors \(1 entries\)"),
    ({"root": {"module": 0}}, r"index 0 is out of range for header.modules"),
    ({"examples": {"inputs": 1}}, "examples: the required field 'outputs'"),
])
def test_wrong_types_and_values_in_the_header(change, reason):
    with pytest.raises(mt.ArchiveError, match=reason):
        load_bytes(edit(save_bytes(mt.tensor([1.0])), lambda h: h.update(change)))


def test_missing_root_and_data_length_mismatch():
    data = save_bytes(mt.tensor([1.0, 2.0]))
    header, payload = split(data)
    del header["root"]
    with pytest.raises(mt.ArchiveError, match="required field 'root'"):
        load_bytes(pack(header, payload))
    header, payload = split(data)
    with pytest.raises(mt.ArchiveError, match="truncated archive: the header records 8"):
        load_bytes(pack(dict(header, data_nbytes=8), payload[:4], fix_nbytes=False))
