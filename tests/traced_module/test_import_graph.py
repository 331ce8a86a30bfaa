"""mgtrace.traced_module has no import cycle at module level, and every
import that stays inside a function (to break a real cycle) says why.

The check reads the source with ``ast`` (nothing is imported): an edge
``a -> b`` is a module-level ``import``/``from ... import`` in ``a`` (in
any statement that runs at import time: class bodies, ``if``/``try``
blocks) that names ``b``, a module of the package. ``from pkg import name``
is an edge to ``pkg.name`` when that is a module, else to ``pkg`` (its
``__init__``). The implicit import of a parent package is not an edge:
Python runs it first, before either module's body.

Run as a script to print the graph's function-level imports:
``python tests/traced_module/test_import_graph.py``.
"""
import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "mgtrace.traced_module"
PKG_DIR = ROOT / "mgtrace" / "traced_module"


def module_files(pkg_dir=PKG_DIR, package=PACKAGE):
    """``{dotted module name: path}`` for every .py file of the package."""
    out = {}
    for path in sorted(pkg_dir.rglob("*.py")):
        parts = list(path.relative_to(pkg_dir).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join([package] + parts)] = path
    return out


def _is_package(name, modules, pkg_dir=PKG_DIR, package=PACKAGE):
    return modules.get(name, Path()).name == "__init__.py"


def _targets(node, current, modules):
    """The package's modules that the import statement ``node`` in module
    ``current`` names."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name in modules]
    base = node.module or ""
    if node.level:                          # a relative import
        here = current if _is_package(current, modules) else current.rpartition(".")[0]
        for _ in range(node.level - 1):
            here = here.rpartition(".")[0]
        base = f"{here}.{base}" if base else here
    if base not in modules:
        return []
    out = []
    for a in node.names:
        sub = f"{base}.{a.name}"
        target = sub if sub in modules else base
        if target not in out:
            out.append(target)
    return out


class _Imports(ast.NodeVisitor):
    """Imports of the package's modules, split into those run at import time
    and those inside a function body (with their line numbers)."""

    def __init__(self, name, modules, lines):
        self.name, self.modules, self.lines = name, modules, lines
        self.depth = 0
        self.module_level, self.in_functions = set(), []

    def _function(self, node):
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def _import(self, node):
        for target in _targets(node, self.name, self.modules):
            if target == self.name:
                continue
            if self.depth:
                self.in_functions.append((self.name, node.lineno, target,
                                          _why(self.lines, node.lineno)))
            else:
                self.module_level.add(target)

    visit_Import = visit_ImportFrom = _import


def _why(lines, lineno):
    """The comment on the import's line or on the lines just above it."""
    line = lines[lineno - 1]
    if "#" in line:
        return line.split("#", 1)[1].strip()
    i, comment = lineno - 2, []
    while i >= 0 and lines[i].strip().startswith("#"):
        comment.insert(0, lines[i].strip().lstrip("#").strip())
        i -= 1
    return " ".join(comment)


def import_graph(pkg_dir=PKG_DIR, package=PACKAGE):
    """``(edges, function_imports)``: ``{module: set of modules it imports at
    module level}`` and ``[(module, line, target, comment), ...]``."""
    modules = module_files(pkg_dir, package)
    edges, inner = {}, []
    for name, path in modules.items():
        text = path.read_text()
        v = _Imports(name, modules, text.splitlines())
        v.visit(ast.parse(text, str(path)))
        edges[name] = v.module_level
        inner += v.in_functions
    return edges, inner


def find_cycle(edges):
    """One cycle of ``edges`` as a list of modules (first == last), or None."""
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for n in sorted(edges.get(m, ())):
            if state.get(n) == "open":
                return stack[stack.index(n):] + [n]
            if n not in state:
                found = visit(n)
                if found:
                    return found
        stack.pop()
        state[m] = "done"
        return None

    for m in sorted(edges):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def test_no_module_level_import_cycle():
    edges, _ = import_graph()
    cycle = find_cycle(edges)
    assert cycle is None, "module-level import cycle: " + " -> ".join(cycle)


# the layers of mgtrace/traced_module/__init__.py's docstring, lowest first
LAYERS = ["errors", "pytree", "node", "signature", "expr", "graph", "codegen", "checker",
          "symbolic", "tracer", "traced_module", "edit", "folder", "passes"]


def test_modules_import_only_the_layers_below_them():
    edges, _ = import_graph()
    layer = {f"{PACKAGE}.{name}": i for i, name in enumerate(LAYERS)}
    layer[PACKAGE] = len(LAYERS)                        # the package's __init__: on top

    def of(module):
        parts = module.split(".")
        return layer[".".join(parts[:3])] if len(parts) > 2 else layer[module]

    missing = [m for m in module_files() if ".".join(m.split(".")[:3]) not in layer]
    assert not missing, (f"{missing} not in LAYERS: add each at its place (above what it "
                         "imports at module level) here and in traced_module/__init__.py's docstring")
    upward = [f"{m} -> {t}" for m, targets in edges.items() for t in targets
              if of(t) > of(m) or (of(t) == of(m) and of(m) != layer[f"{PACKAGE}.passes"])]
    assert not upward, "imports of a layer above (or beside) the importer:\n" + "\n".join(upward)


def test_every_function_level_import_says_why():
    _, inner = import_graph()
    silent = [f"{m}:{line} imports {t}" for m, line, t, why in inner if not why]
    assert not silent, ("function-level imports without a comment saying why (move each to the "
                        "top of its module, or say on the line above which cycle it breaks):\n"
                        + "\n".join(silent))


def test_function_level_imports_break_real_cycles():
    """Each remaining function-level import would close a cycle if it were
    at module level (otherwise it should simply move to the top)."""
    edges, inner = import_graph()
    for m, line, target, _ in inner:
        trial = {k: set(v) for k, v in edges.items()}
        trial[m].add(target)
        assert find_cycle(trial) is not None, \
            f"{m}:{line} imports {target} inside a function, but no cycle needs that: move it up"


@pytest.fixture
def fake_package(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    for f in ("__init__.py", "a.py", "b.py", "sub/__init__.py", "sub/c.py"):
        (pkg / f).write_text("")
    return pkg


def test_the_checker_finds_a_cycle_and_follows_package_imports(fake_package):
    (fake_package / "a.py").write_text("from pkg.sub import c\n")
    (fake_package / "sub" / "c.py").write_text("from .. import b\n")
    (fake_package / "b.py").write_text("import pkg.a\n\ndef f():\n    from pkg import sub  # why\n")
    edges, inner = import_graph(fake_package, "pkg")
    assert edges["pkg.a"] == {"pkg.sub.c"} and edges["pkg.sub.c"] == {"pkg.b"}
    assert find_cycle(edges) == ["pkg.a", "pkg.sub.c", "pkg.b", "pkg.a"]
    assert inner == [("pkg.b", 4, "pkg.sub", "why")]


def test_the_checker_passes_an_acyclic_package(fake_package):
    (fake_package / "a.py").write_text("from pkg import b\nclass K:\n    from pkg.sub import c\n")
    edges, inner = import_graph(fake_package, "pkg")
    assert edges["pkg.a"] == {"pkg.b", "pkg.sub.c"} and find_cycle(edges) is None
    assert inner == []


if __name__ == "__main__":
    edges, inner = import_graph()
    print("module-level cycle:", find_cycle(edges))
    print(f"{len(inner)} function-level imports inside {PACKAGE}:")
    for m, line, target, why in inner:
        print(f"  {m}:{line} -> {target}  # {why}")
    sys.exit(find_cycle(edges) is not None)
