"""The public surface, snapshotted (as torch.fx's compatibility tests do):
every name in the ``__all__`` of mgtrace and its public packages, with the
signature of each function, class constructor and public method. A change
fails this test until ``tests/public_api.txt`` is rewritten on purpose:

    python tests/test_public_api.py --write
"""
import inspect
import sys
from pathlib import Path

EXPECT = Path(__file__).resolve().parent / "public_api.txt"
PACKAGES = ("mgtrace", "mgtrace.functional", "mgtrace.module", "mgtrace.random",
            "mgtrace.traced_module", "mgtrace.serialization", "mgtrace.batch", "mgtrace.cuda",
            "mgtrace.onnx", "mgtrace.quantization", "mgtrace.module.qat", "mgtrace.megengine",
            "mgtrace.autodiff", "mgtrace.optimizer")


def _sig(obj):
    try:
        return str(inspect.signature(obj))
    except (TypeError, ValueError):
        return "(...)"


def _describe(qual, obj):
    if inspect.ismodule(obj):
        return [f"{qual}: module"]
    if inspect.isclass(obj):
        lines = [f"{qual}: class{_sig(obj)}"]
        for name, member in sorted(vars(obj).items()):
            if name.startswith("_") or not callable(member) and not isinstance(member, property):
                continue
            if isinstance(member, property):
                lines.append(f"{qual}.{name}: property")
            elif isinstance(member, (staticmethod, classmethod)):
                lines.append(f"{qual}.{name}: {type(member).__name__}{_sig(member.__func__)}")
            else:
                lines.append(f"{qual}.{name}{_sig(member)}")
        return lines
    if callable(obj):
        return [f"{qual}{_sig(obj)}"]
    return [f"{qual}: {type(obj).__name__}"]


def surface():
    """The snapshot's lines, sorted."""
    import importlib
    lines = []
    for pkg in PACKAGES:
        mod = importlib.import_module(pkg)
        names = getattr(mod, "__all__", None)
        if names is None:
            lines.append(f"{pkg}: NO __all__")
            continue
        for name in names:
            lines += _describe(f"{pkg}.{name}", getattr(mod, name))
    return sorted(set(lines))


def test_public_api_matches_the_snapshot():
    want = EXPECT.read_text().splitlines()
    got = surface()
    added, removed = sorted(set(got) - set(want)), sorted(set(want) - set(got))
    assert not added and not removed, (
        "the public API changed; if that is meant, run `python tests/test_public_api.py --write` "
        "and commit tests/public_api.txt\n+ " + "\n+ ".join(added) + "\n- " + "\n- ".join(removed))


def test_every_public_package_declares_all():
    assert not [ln for ln in surface() if ln.endswith("NO __all__")]


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    sys.path.insert(0, str(EXPECT.parents[1]))
    EXPECT.write_text("\n".join(surface()) + "\n")
