"""What batch commands print when stdout is not a terminal (a log file, a pipe,
CI), and how they fail when an output cannot be written while the job runs."""
import json
import os
import resource
import signal
import subprocess
import sys
import time

import pytest

from .conftest import copies, GOOD, REPO, cli, records, start_cli

N_FILES = 400           # enough that the job is still running when the signal comes


@pytest.fixture
def many(archives, tmp_path):
    return copies(archives, tmp_path, N_FILES)


def _env():
    env = dict(os.environ, PYTHONPATH=str(REPO), NO_COLOR="1", PYTHONDONTWRITEBYTECODE="1")
    env.pop("MGTRACE_NUM_THREADS", None)
    return env


def _start(*args):
    return start_cli(*args, env=_env())


def _limit_file_size(nbytes):
    """preexec_fn: files this process writes may not grow past ``nbytes``
    (writes beyond fail with EFBIG, as on a full disk; Python ignores SIGXFSZ)."""
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))


@pytest.mark.parametrize("jobs", [1, 2])
def test_lines_stream_as_files_finish_and_stay_after_ctrl_c(many, tmp_path, jobs):
    rep = tmp_path / "r.json"
    proc = _start("verify", many, "-j", jobs, "--report", rep)
    first = proc.stdout.readline()      # arrives while the job runs, not at its end
    proc.send_signal(signal.SIGINT)
    rest, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, (first, stderr)      # it was still running
    lines = [first] + rest.splitlines(True)
    assert all(ln.startswith("ok ") and "examples match" in ln for ln in lines), lines
    assert len(lines) < N_FILES
    assert "interrupted" in stderr and "Traceback" not in stderr, stderr
    # every printed file is one the report lists as done
    done = {os.path.basename(p) for p, r in records(rep).items() if r["status"] == "ok"}
    printed = {os.path.basename(ln.split()[2]) for ln in lines}
    assert printed <= done, printed - done


def test_json_after_ctrl_c_prints_what_finished(many, tmp_path):
    out = tmp_path / "out"
    proc = _start("retrace", many, "-o", out, "--json")
    while not (out.is_dir() and sum(n.endswith(".tmod") for n in os.listdir(out)) >= 3):
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.01)
    # in one process, a third output means the first two files were reported
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    data = json.loads(stdout)
    assert data["finished"] is False and data["command"] == "retrace"
    assert 2 <= data["summary"]["total"] == len(data["records"]) < N_FILES
    assert {r["status"] for r in data["records"]} == {"ok"}
    assert {os.path.basename(r["details"]["output"]) for r in data["records"]} <= set(os.listdir(out))


def test_report_that_cannot_be_written_is_exit_1_naming_it(archives, tmp_path):
    rep = tmp_path / "r.json"
    p = subprocess.run([sys.executable, "-m", "mgtrace", "verify", str(archives / "good"),
                        "--report", "r.json"], cwd=tmp_path, env=_env(), capture_output=True,
                       text=True, timeout=120, preexec_fn=_limit_file_size(200))
    assert p.returncode == 1, (p.stdout, p.stderr)
    assert "Traceback" not in p.stderr, p.stderr
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mgtrace: error: cannot write the report r.json"), err
    assert f"({rep})" in err[0] and "File too large" in err[0] and "[Errno" not in err[0], err
    assert p.stdout.startswith("ok "), p.stdout          # what finished was printed
    assert not rep.exists() and not [n for n in os.listdir(tmp_path) if n.startswith(".")]


def test_stdout_on_a_full_disk_is_exit_1_naming_it(archives):
    with open("/dev/full", "w") as full:
        p = subprocess.run([sys.executable, "-m", "mgtrace", "inspect", "--json",
                            str(archives / "good")], env=_env(), stdout=full,
                           stderr=subprocess.PIPE, text=True, timeout=120)
    assert p.returncode == 1, p.stderr
    assert p.stderr == "mgtrace: error: cannot write the output (/dev/full): " \
                       "No space left on device\n", p.stderr


def test_unwritable_output_folder_fails_once_up_front(archives, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    p = cli("upgrade", archives / "good", "-o", blocker / "out")
    assert p.returncode == 2, p.stderr
    assert p.stdout == ""                               # no file was tried
    assert p.stderr == f"mgtrace: error: -o {blocker / 'out'}: cannot write files there: " \
                       "Not a directory\n", p.stderr


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_output_folder_fails_once_up_front(archives, tmp_path):
    out = tmp_path / "ro"
    out.mkdir()
    out.chmod(0o555)
    try:
        p = cli("retrace", archives / "good", "-o", out)
    finally:
        out.chmod(0o755)
    assert p.returncode == 2 and p.stdout == "", (p.stdout, p.stderr)
    assert p.stderr.count("\n") == 1 and "cannot write files there: Permission denied" in p.stderr


def test_a_failed_write_names_the_output_not_the_temporary_file(archives, tmp_path):
    out = tmp_path / "out"
    p = subprocess.run([sys.executable, "-m", "mgtrace", "upgrade", str(archives / "good/net0.tmod"),
                        "-o", str(out), "--json"], env=_env(), capture_output=True, text=True,
                       timeout=120, preexec_fn=_limit_file_size(1024))
    assert p.returncode == 1, p.stderr
    reason = json.loads(p.stdout)["records"][0]["reason"]
    assert f"cannot write {out / 'net0.tmod'}: File too large" in reason, reason
    assert ".tmp" not in reason and ".mgtrace-" not in reason, reason
    assert os.listdir(out) == []                        # nothing half-written is left


def test_table_lines_are_in_finishing_order_with_a_summary(archives):
    p = cli("verify", archives / "good")
    lines = p.stdout.splitlines()
    assert p.returncode == 0 and len(lines) == len(GOOD) + 1, p.stdout
    assert lines[-1].startswith(f"{len(GOOD)} files: {len(GOOD)} ok, 0 failed")
