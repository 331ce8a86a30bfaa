"""The kernel tree (issue 30): kernels/contract/ is the device-neutral
interface, kernels/cpu/ and kernels/cuda/ the two backends built on it.
The contract includes only itself, the CUDA sources include only the
contract and their own folder, and setup.py gives nvcc the contract alone
(so a CPU header in a .cu file does not compile) and lists every kernel
source that is in the tree."""
import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
KERNELS = REPO / "mgtrace" / "_core" / "kernels"
CONTRACT, CPU, CUDA = KERNELS / "contract", KERNELS / "cpu", KERNELS / "cuda"
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def _includes(path):
    return INCLUDE.findall(path.read_text())


def _files(folder, *patterns):
    return sorted(p for pat in patterns for p in folder.glob(pat))


def test_the_three_folders_are_all_the_kernels():
    assert not _files(KERNELS, "*.c", "*.h", "*.cu"), "kernel sources outside contract/, cpu/, cuda/"
    assert _files(CONTRACT, "*.h") and _files(CPU, "*.c") and _files(CUDA, "*.cu")
    assert not (REPO / "mgtrace" / "_core" / "cuda").exists()


@pytest.mark.parametrize("header", _files(CONTRACT, "*.h"), ids=lambda p: p.name)
def test_the_contract_includes_only_the_contract(header):
    for name in _includes(header):
        assert "/" not in name and (CONTRACT / name).is_file(), f"{header.name} includes {name!r}"


@pytest.mark.parametrize("source", _files(CUDA, "*.cu", "*.h"), ids=lambda p: p.name)
def test_cuda_includes_only_the_contract_and_its_own_folder(source):
    for name in _includes(source):
        assert "/" not in name, f"{source.name} includes {name!r} by path"
        assert (CUDA / name).is_file() or (CONTRACT / name).is_file(), \
            f"{source.name} includes {name!r}, which is neither CUDA's nor the contract's"


def test_no_header_name_is_in_two_folders():
    # kernels include by name over -I contract -I cpu: a name in both would
    # pick one by include order
    names = [p.name for p in _files(CONTRACT, "*.h") + _files(CPU, "*.h") + _files(CUDA, "*.h")]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)


def test_nvcc_gets_the_contract_alone_and_setup_compiles_every_cpu_source():
    setup = (REPO / "setup.py").read_text()
    tree = ast.parse(setup)
    consts = {n.targets[0].id: n.value.value for n in tree.body if isinstance(n, ast.Assign)
              and isinstance(n.targets[0], ast.Name) and isinstance(n.value, ast.Constant)}
    assert consts["CONTRACT"] == "mgtrace/_core/kernels/contract"
    assert consts["KERNELS"] == "mgtrace/_core/kernels/cpu"
    assert consts["CUDA_DIR"] == "mgtrace/_core/kernels/cuda"
    nvcc = re.findall(r'"include_dirs":\s*\[([^\]]*)\]', setup)
    assert nvcc == ["CONTRACT"], nvcc
    listed = set(re.findall(r'f"\{KERNELS\}/(\w+\.c)"', setup))
    # a .c file #included by another one (a translation unit built from
    # parts) is not listed; one that includes itself (dtype variants) is
    parts = {n for p in _files(CPU, "*.c") for n in _includes(p) if n.endswith(".c") and n != p.name}
    assert listed == {p.name for p in _files(CPU, "*.c")} - parts
