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


# ---- the CUDA switch (setup_cuda.py): pure Python, checked without CUDA ----
import os  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402

sys.path.insert(0, str(REPO))
import setup_cuda as sc  # noqa: E402

SETUP_CUDA = (REPO / "setup_cuda.py").read_text()


def test_the_cuda_switches_are_documented_too():
    read = set(re.findall(r"environ(?:\.get\(|\[)\s*[\"'](MGTRACE_\w+)", SETUP_CUDA))
    flags = (REPO / "mgtrace/_flags.py").read_text()
    assert read == {"MGTRACE_CUDA", "MGTRACE_CUDA_ARCHS"}
    assert all(name in flags for name in read)


@pytest.mark.parametrize("raw,want", [(None, "auto"), ("", "auto"), ("auto", "auto"), ("AUTO", "auto"),
                                      ("0", "0"), ("1", "1"), (" 1 ", "1")])
def test_mode(raw, want):
    assert sc.mode({} if raw is None else {"MGTRACE_CUDA": raw}) == want


@pytest.mark.parametrize("raw", ["yes", "2", "true", "on"])
def test_a_bad_mode_is_an_error_in_every_case(raw):
    with pytest.raises(sc.CudaConfigError, match="MGTRACE_CUDA must be auto, 0 or 1"):
        sc.mode({"MGTRACE_CUDA": raw})


@pytest.mark.parametrize("raw,want", [(None, (80, 90)), ("90", (90,)), ("sm_90", (90,)),
                                      ("80,90", (80, 90)), ("90;80", (80, 90)), ("8.6 9.0", (86, 90)),
                                      ("compute_80, sm_80", (80,))])
def test_archs(raw, want):
    assert sc.archs({} if raw is None else {"MGTRACE_CUDA_ARCHS": raw}) == want


@pytest.mark.parametrize("raw", ["sm_9", "hopper", "900", ",", "sm_90a_x"])
def test_bad_archs_name_the_item(raw):
    with pytest.raises(sc.CudaConfigError, match="MGTRACE_CUDA_ARCHS"):
        sc.archs({"MGTRACE_CUDA_ARCHS": raw})


def _toolkit(root, layout="include"):
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "nvcc").write_text("#!/bin/sh\n")
    inc = root / ("include" if layout == "include" else "targets/x86_64-linux/include")
    inc.mkdir(parents=True)
    (inc / "cuda_runtime.h").write_text("")
    return root


def _no_nvcc(*a, **k):
    return None


def test_cuda_home_comes_first(tmp_path):
    home = _toolkit(tmp_path / "cuda")
    tk = sc.find_toolkit({"CUDA_HOME": str(home)}, which=lambda *a, **k: "/elsewhere/nvcc")
    assert tk.home == str(home) and tk.nvcc == str(home / "bin" / "nvcc")
    assert tk.include == str(home / "include") and tk.libdir == str(home / "lib64")


def test_cuda_home_without_headers_says_so(tmp_path):
    home = _toolkit(tmp_path / "cuda")
    os.unlink(home / "include" / "cuda_runtime.h")
    with pytest.raises(sc.CudaNotFound, match="no CUDA runtime headers"):
        sc.find_toolkit({"CUDA_HOME": str(home)})
    with pytest.raises(sc.CudaNotFound, match="has no bin/nvcc"):
        sc.find_toolkit({"CUDA_PATH": str(tmp_path / "nothing")})


def test_nvcc_on_path_and_the_targets_layout(tmp_path):
    home = _toolkit(tmp_path / "cuda-13.0", layout="targets")
    tk = sc.find_toolkit({}, which=lambda *a, **k: str(home / "bin" / "nvcc"))
    assert tk.include.endswith("targets/x86_64-linux/include")
    assert tk.libdir.endswith("targets/x86_64-linux/lib")


def test_a_wrapper_nvcc_is_followed_to_its_toolkit(tmp_path):
    home = _toolkit(tmp_path / "cuda-13.0")
    (tmp_path / "bin").mkdir()
    wrapper = tmp_path / "bin" / "nvcc"      # a script elsewhere that execs the real one
    wrapper.write_text("#!/bin/sh\n")
    dry = f"#$ _NVVM_BRANCH_=nvvm\n#$ TOP={home}/bin/..\n#$ INCLUDES=...\n"
    tk = sc.find_toolkit({}, which=lambda *a, **k: str(wrapper), run=lambda cmd: dry)
    assert tk.home == str(home) and tk.include == str(home / "include")


def test_plan_follows_the_mode(tmp_path):
    home = _toolkit(tmp_path / "cuda")
    found = {"CUDA_HOME": str(home)}
    assert sc.plan({**found, "MGTRACE_CUDA": "0"}) == (None, "CUDA extension not built (MGTRACE_CUDA=0)")
    tk, note = sc.plan({**found, "MGTRACE_CUDA": "auto", "MGTRACE_CUDA_ARCHS": "90"})
    assert tk.home == str(home) and "sm_90" in note
    tk, note = sc.plan({"MGTRACE_CUDA": "auto", "PATH": ""}, which=_no_nvcc)
    assert tk is None and note.startswith("warning: CUDA extension not built: nvcc is not on PATH")
    with pytest.raises(sc.CudaNotFound, match="MGTRACE_CUDA=1 but no usable CUDA toolkit: nvcc is not"):
        sc.plan({"MGTRACE_CUDA": "1"}, which=_no_nvcc)
    with pytest.raises(sc.CudaConfigError):          # even when CUDA is switched off
        sc.plan({"MGTRACE_CUDA": "0", "MGTRACE_CUDA_ARCHS": "hopper"})


def test_nvcc_command_compiles_each_arch_and_ptx_for_the_newest():
    tk = sc.Toolkit("/cuda", "/cuda/bin/nvcc", "/cuda/include", "/cuda/lib64")
    cmd = sc.nvcc_command(tk, (80, 90), "a.cu", "a.o", ["mgtrace/_core"])
    text = " ".join(cmd)
    assert cmd[0] == "/cuda/bin/nvcc" and "-c a.cu -o a.o" in text
    for gen in ("arch=compute_80,code=sm_80", "arch=compute_90,code=sm_90",
                "arch=compute_90,code=compute_90"):
        assert gen in cmd
    assert "-fPIC" in cmd and "-I" in cmd
    assert "-lcudart_static" in sc.link_args(tk) and "-L/cuda/lib64" in sc.link_args(tk)


def test_unset_builds_cuda_only_where_there_is_a_driver():
    found = {"CUDA_HOME": "/nowhere", "PATH": ""}
    tk, note = sc.plan(found, which=_no_nvcc, driver=lambda: False)
    assert tk is None and "no NVIDIA driver" in note and "MGTRACE_CUDA=auto or 1" in note
    # with a driver, unset means auto: the missing toolkit is the warning
    tk, note = sc.plan(found, which=_no_nvcc, driver=lambda: True)
    assert tk is None and note.startswith("warning: CUDA extension not built")
    # explicit auto ignores the driver check
    tk, note = sc.plan({**found, "MGTRACE_CUDA": "auto"}, which=_no_nvcc, driver=lambda: False)
    assert note.startswith("warning: CUDA extension not built")


def test_the_real_toolkit_here_if_there_is_one():
    """On the project's machines nvcc 13 and the runtime headers are present:
    auto finds them (skipped where there is no nvcc at all)."""
    try:
        tk = sc.find_toolkit(os.environ)
    except sc.CudaNotFound as e:
        pytest.skip(f"no CUDA toolkit here: {e}")
    assert os.path.isfile(os.path.join(tk.include, "cuda_runtime.h"))
