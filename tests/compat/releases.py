"""Earlier releases of mgtrace, built from this repository's own history.

:func:`build` extracts a listed release (schema/releases.json) with ``git
archive`` into a cache folder and compiles its extensions in place, once;
:func:`run` runs a script with that release first on the path. The cache is
``$MGTRACE_RELEASES_DIR`` or ``~/.cache/mgtrace/releases``; a lock file keeps
two test processes from building the same release at once.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def releases():
    """The listed releases: ``[{"version", "commit", "format"}]``."""
    return json.loads((REPO / "schema" / "releases.json").read_text())["releases"]


def _cache():
    root = os.environ.get("MGTRACE_RELEASES_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "mgtrace", "releases")
    os.makedirs(root, exist_ok=True)
    return Path(root)


def have_history(commit):
    """Whether this checkout's git history holds ``commit``."""
    try:
        subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{commit}^{{commit}}"],
                       check=True, capture_output=True)
        return True
    except (OSError, subprocess.CalledProcessError):
        return False


def build(release):
    """The folder of ``release``, built (extensions compiled in place).

    Raises:
        RuntimeError: git or the build failed (the message has its output).
    """
    import fcntl
    target = _cache() / f"{release['version']}-{release['commit'][:12]}"
    with open(str(target) + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / ".built").exists():
            return target
        target.mkdir(exist_ok=True)
        archive = subprocess.run(["git", "-C", str(REPO), "archive", release["commit"]],
                                 capture_output=True, check=False)
        if archive.returncode:
            raise RuntimeError(f"git archive {release['commit']}: {archive.stderr.decode()}")
        subprocess.run(["tar", "-x", "-C", str(target)], input=archive.stdout, check=True)
        env = dict(os.environ, MGTRACE_BUILD_JOBS="2")
        p = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace", "-j", "2"],
                           cwd=target, capture_output=True, text=True, env=env)
        if p.returncode:
            raise RuntimeError(f"building mgtrace {release['version']} failed:\n{p.stderr[-3000:]}")
        (target / ".built").write_text(release["commit"])
        return target


def run(where, args, cwd):
    """Run ``python args...`` with the mgtrace at ``where`` first on the path
    (a release folder, or this checkout); returns the CompletedProcess."""
    env = dict(os.environ, PYTHONPATH=str(where))
    return subprocess.run([sys.executable, *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=900)
