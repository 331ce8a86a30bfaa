"""The same batch on a Dask cluster (loopback only) gives the same report as the local pool."""
import json

import pytest

from mgtrace import batch

from .conftest import cli, digests, records

distributed = pytest.importorskip("distributed")


def _comparable(recs, out):
    """status, reason and output (relative to its output folder) of each file."""
    return {f: (r.status, r.reason, (r.details.get("output") or "").replace(str(out), "OUT"))
            for f, r in recs.items()}


def _by_file(recs, root):
    return {r.path.replace(str(root) + "/", ""): r for r in recs}


def test_dask_local_cluster_matches_process_pool(archives, tmp_path):
    before = digests(archives)
    pool_out, dask_out = tmp_path / "pool", tmp_path / "dask"
    pool = batch.retrace([archives], out=pool_out, jobs=2, progress=False)
    with distributed.LocalCluster(processes=False, dashboard_address=None, n_workers=1,
                                  threads_per_worker=2) as cluster:
        seen = []
        got = batch.retrace([archives], out=dask_out, dask=cluster.scheduler_address,
                            progress=False, report=tmp_path / "r.json",
                            callback=lambda rec, done, total: seen.append((done, total)))
    assert _comparable(_by_file(got, archives), dask_out) == \
        _comparable(_by_file(pool, archives), pool_out)
    assert {r.status for r in got} == {"ok", "failed", "skipped"}     # skipped: the newer format
    assert seen[-1] == (13, 13) and len(seen) == 13          # progress through the callback
    assert digests(dask_out) == digests(pool_out)            # the same bytes
    assert digests(archives) == before
    assert len(records(tmp_path / "r.json")) == 13


def test_cli_dask_local_matches_j2(archives, tmp_path):
    a = cli("verify", archives, "-j", "2", "--json")
    b = cli("verify", archives, "--dask", "local", "--json")
    assert a.returncode == b.returncode == 1, b.stderr
    strip = lambda p: {f: (r["status"], r["reason"], r["details"].get("examples"))  # noqa: E731
                       for f, r in records(json.loads(p.stdout)).items()}
    assert strip(a) == strip(b)


def test_ctrl_c_under_dask_local_is_one_clean_line(archives, tmp_path):
    # a terminal's Ctrl-C goes to the whole process group, Dask's worker processes included
    import os
    import signal
    import time
    from .conftest import copies, start_cli
    many = copies(archives, tmp_path, 300)
    out = tmp_path / "out"
    proc = start_cli("retrace", many, "-o", out, "--dask", "local", "-j", "2",
                     start_new_session=True)
    while not (out.is_dir() and sum(n.endswith(".tmod") for n in os.listdir(out)) >= 3):
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert stderr.strip().splitlines() == [
        "mgtrace: interrupted; finished files are kept (and in the report, if any), no partial "
        "outputs are left"], stderr
    assert all(ln.startswith("ok ") for ln in stdout.splitlines()), stdout
