"""setup.py's build plan stays true to the tree: the files it compiles first
exist and are extension sources, and every switch it reads is documented in
mgtrace/_flags.py (the build itself is timed, not tested: see the issue notes)."""
import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SETUP = (REPO / "setup.py").read_text()


def _constant(name):
    """The value of a module-level assignment in setup.py made of f-strings over KERNELS."""
    tree = ast.parse(SETUP)
    kernels = next(n.value.value for n in tree.body if isinstance(n, ast.Assign)
                   and n.targets[0].id == "KERNELS")
    node = next(n.value for n in tree.body if isinstance(n, ast.Assign)
                and isinstance(n.targets[0], ast.Name) and n.targets[0].id == name)
    return [ast.unparse(e).strip("f'\"").replace("{KERNELS}", kernels) for e in node.elts]


def test_the_files_compiled_first_are_extension_sources():
    slow = _constant("SLOW_FIRST")
    assert slow and all((REPO / f).is_file() for f in slow), slow
    sources = set(re.findall(r'f"\{KERNELS\}/(\w+\.c)"', SETUP))
    assert {Path(f).name for f in slow} <= sources


def test_every_build_switch_is_documented():
    read = set(re.findall(r"environ(?:\.get\(|\[)\s*[\"'](MGTRACE_\w+)", SETUP))
    flags = (REPO / "mgtrace/_flags.py").read_text()
    assert read and all(name in flags for name in read), read
