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


def _writer(path, tmp_path):
    """A child process stopped in the middle of saving to ``path``."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(path)], stdout=subprocess.PIPE,
                             cwd=root, env={**os.environ, "PYTHONPATH": root})
    assert child.stdout.readline().strip() == b"writing"
    return child


def _temps(folder):
    return sorted(n for n in os.listdir(folder) if n.endswith(".tmp"))


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_the_next_save_removes_dead_writers_temp_files_never_a_live_ones(tmp_path):
    from mgtrace.serialization.atomic import leftovers
    path = tmp_path / "a.tmod"
    _old_archive(path)
    live = _writer(path, tmp_path)              # a writer still at work on the target
    try:
        [live_tmp] = _temps(tmp_path)
        dead = _writer(path, tmp_path)          # a second one, killed mid-write
        dead.send_signal(signal.SIGKILL)
        dead.wait(timeout=30)
        dead.stdout.close()
        [left] = [n for n in _temps(tmp_path) if n != live_tmp]
        assert [os.path.basename(p) for p, _ in leftovers(tmp_path)] == [left]  # not the live one
        mt.save([1], tmp_path / "b.tmod")                 # another target: touches neither
        assert _temps(tmp_path) == sorted([live_tmp, left])
        mt.save({"new": mt.tensor([2.0])}, path)          # removes the dead writer's file only
        assert _temps(tmp_path) == [live_tmp]
        assert mt.load(path)["new"].tolist() == [2.0] and leftovers(tmp_path) == []
    finally:
        live.send_signal(signal.SIGKILL)
        live.wait(timeout=30)
        live.stdout.close()


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="needs symbolic links")
def test_a_save_through_a_symlink_replaces_the_target_and_keeps_the_link(tmp_path):
    (tmp_path / "real").mkdir()
    target = tmp_path / "real/model.tmod"
    _old_archive(target)
    os.chmod(target, 0o640)
    link = tmp_path / "model.tmod"
    os.symlink(os.path.join("real", "model.tmod"), link)
    chain = tmp_path / "latest.tmod"              # a link to a link
    os.symlink("model.tmod", chain)
    mt.save({"new": mt.tensor([3.0])}, chain)
    assert os.path.islink(link) and os.path.islink(chain)
    assert os.readlink(chain) == "model.tmod"
    assert mt.load(target)["new"].tolist() == [3.0]
    assert os.stat(target).st_mode & 0o777 == 0o640
    assert sorted(os.listdir(tmp_path)) == ["latest.tmod", "model.tmod", "real"]
    assert os.listdir(tmp_path / "real") == ["model.tmod"]
    # a dangling link: the file it names is created
    os.symlink("fresh.tmod", tmp_path / "dangling.tmod")
    mt.save([5], tmp_path / "dangling.tmod")
    assert os.path.islink(tmp_path / "dangling.tmod") and mt.load(tmp_path / "fresh.tmod") == [5]


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="needs symbolic links")
def test_a_symlink_loop_is_refused_and_left_alone(tmp_path):
    os.symlink("b.tmod", tmp_path / "a.tmod")
    os.symlink("a.tmod", tmp_path / "b.tmod")
    with pytest.raises(OSError, match="loop"):
        mt.save([1], tmp_path / "a.tmod")
    assert os.path.islink(tmp_path / "a.tmod") and os.path.islink(tmp_path / "b.tmod")
    assert sorted(os.listdir(tmp_path)) == ["a.tmod", "b.tmod"]


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to chown")
def test_a_rewrite_keeps_the_owner(tmp_path):
    path = tmp_path / "a.tmod"
    _old_archive(path)
    os.chown(path, 65534, 65534)
    os.chmod(path, 0o640)
    mt.save([2], path)
    st = os.stat(path)
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (65534, 65534, 0o640)
