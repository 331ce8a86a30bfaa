"""atomic.py: a save never leaves a half-written or clobbered archive, whether
it fails, raises mid-write, or the process is killed mid-write."""
import io
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

import mgtrace as mt
from mgtrace.serialization import tensors as T


def _old_archive(path):
    mt.save({"old": mt.tensor([1.0])}, path)
    return path.read_bytes()


def test_an_unstorable_object_writes_nothing(tmp_path):
    with pytest.raises(TypeError):
        mt.save({"bad": {1, 2}}, tmp_path / "a.tmod")
    assert os.listdir(tmp_path) == []


def test_failure_mid_write_leaves_the_original_and_no_temp_file(tmp_path, monkeypatch):
    path = tmp_path / "a.tmod"
    old = _old_archive(path)
    calls = []

    def flaky(t):
        calls.append(t)
        if len(calls) > 2:              # second pass, while writing the data
            raise OSError("disk full")
        return np.zeros(1000, np.float32)
    monkeypatch.setattr(T, "host_array", flaky)
    with pytest.raises(OSError, match="disk full"):
        mt.save([mt.tensor([0.0]), mt.tensor([0.0])], path)
    assert path.read_bytes() == old and os.listdir(tmp_path) == ["a.tmod"]


def test_a_tensor_changed_during_the_save_is_detected(tmp_path, monkeypatch):
    # a file object is written in two passes (checksums first): a change between
    # them is an error, never an archive whose checksums do not match its data
    values = iter([np.zeros(4, np.float32), np.ones(4, np.float32)])
    monkeypatch.setattr(T, "host_array", lambda t: next(values))
    with pytest.raises(RuntimeError, match="changed while it was being saved"):
        mt.save(mt.tensor([0.0] * 4), io.BytesIO())


def test_a_path_save_reads_each_tensor_once(tmp_path, monkeypatch):
    # a path is written in one pass: each checksum is that of the bytes written
    path = tmp_path / "a.tmod"
    _old_archive(path)
    values = iter([np.zeros(4, np.float32), np.ones(4, np.float32)])
    monkeypatch.setattr(T, "host_array", lambda t: next(values))
    mt.save(mt.tensor([0.0] * 4), path)
    monkeypatch.undo()
    assert mt.load(path).tolist() == [1.0] * 4 and os.listdir(tmp_path) == ["a.tmod"]


def test_saving_over_a_folder_fails_cleanly(tmp_path):
    (tmp_path / "d").mkdir()
    with pytest.raises(OSError):
        mt.save([1], tmp_path / "d")
    assert os.listdir(tmp_path) == ["d"] and os.listdir(tmp_path / "d") == []


def test_permissions_of_an_existing_archive_are_kept(tmp_path):
    path = tmp_path / "a.tmod"
    _old_archive(path)
    os.chmod(path, 0o640)
    mt.save([2], path)
    assert os.stat(path).st_mode & 0o777 == 0o640 and mt.load(path) == [2]


CHILD = """
import sys, time
import numpy as np
import mgtrace as mt
from mgtrace.serialization import writer
real = writer._write_one_pass          # what a save to a path uses
def slow(out, header, tensors):
    out.write(b"partial")
    out.flush()
    print("writing", flush=True)
    time.sleep(60)
    real(out, header, tensors)
writer._write_one_pass = slow
mt.save({"new": mt.tensor(np.ones(1000, np.float32))}, sys.argv[1])
"""


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_a_process_killed_mid_write_leaves_the_previous_archive(tmp_path):
    path = tmp_path / "a.tmod"
    old = _old_archive(path)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(path)], stdout=subprocess.PIPE,
                             cwd=root, env={**os.environ, "PYTHONPATH": root})
    try:
        assert child.stdout.readline().strip() == b"writing"
        temps = [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
        assert len(temps) == 1 and temps[0].startswith(".a.tmod.")
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        child.stdout.close()
    assert path.read_bytes() == old
    assert mt.load(path)["old"].tolist() == [1.0]
