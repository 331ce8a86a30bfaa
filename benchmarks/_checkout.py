"""Which mgtrace the benchmarks run, in their own process and in the child
processes they start.

This checkout when it is built in place (``pip install -e .``, or
``python setup.py build_ext --inplace``: its compiled core sits beside the
sources); else the installed mgtrace (``pip install .``). Never the
checkout's uncompiled sources: a child process run in the repository folder,
or with the folder on PYTHONPATH, would import those and fail.

    import _checkout                  # before importing mgtrace
    _checkout.use()                   # this process and its children
    subprocess.run(cmd, cwd=_checkout.CHILD_CWD)
"""
import importlib.machinery
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CHILD_CWD = HERE        # holds no mgtrace package: children import what child_env says


def is_built(root=ROOT):
    """Whether ``root``'s mgtrace has its compiled core next to the sources."""
    core = os.path.join(root, "mgtrace", "_core")
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    try:
        return any(f.startswith("tensor.") and f.endswith(suffixes) for f in os.listdir(core))
    except OSError:
        return False


def _without_root(paths):
    root = os.path.realpath(ROOT)
    return [p for p in paths if os.path.realpath(p or os.curdir) != root]


def use():
    """Make this process, and the processes it starts (they inherit its
    environment), import the mgtrace :func:`child_env` names."""
    sys.path[:] = _without_root(sys.path)
    if is_built():
        sys.path.insert(0, ROOT)
    env = child_env()
    if "PYTHONPATH" in env:
        os.environ["PYTHONPATH"] = env["PYTHONPATH"]
    else:
        os.environ.pop("PYTHONPATH", None)


def child_env(env=None):
    """``env`` (default os.environ) with PYTHONPATH starting at this checkout
    when it is built, and without it otherwise."""
    env = dict(os.environ if env is None else env)
    paths = _without_root([p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    if is_built():
        paths.insert(0, ROOT)
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    else:
        env.pop("PYTHONPATH", None)
    return env


def which():
    """A line for the benchmark's header: the mgtrace in use, and from where.

    Raises:
        SystemExit: no built mgtrace can be imported (says what to run).
    """
    use()
    try:
        import mgtrace
    except ImportError as e:
        raise SystemExit(f"cannot import a built mgtrace ({e}): build this checkout with "
                         "`pip install -e .`, or install it with `pip install .`") from None
    where = os.path.dirname(os.path.dirname(os.path.abspath(mgtrace.__file__)))
    how = "this checkout, built in place" if os.path.realpath(where) == os.path.realpath(ROOT) \
        else f"installed at {where}"
    return f"mgtrace {mgtrace.__version__} ({how})"
