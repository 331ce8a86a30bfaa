"""scripts/fuzz_archives.py at a size CI affords (the full run is 100,000
mutations; see its docstring): no exception but ArchiveError at load, no
crash, no slow load, no verified load that computes something else."""
import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "fuzz_archives.py"


def _fuzz():
    spec = importlib.util.spec_from_file_location("fuzz_archives", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_short_fuzz_run_finds_nothing():
    fuzz = _fuzz()
    stats, notes, crashes = fuzz.run(400, 1, seed=7, quiet=True)
    assert stats["cases"] == 400 and stats["loads"] == 1600
    assert set(stats["by_kind"]) == set(fuzz.KINDS)
    assert stats["loaded"] > 0 and stats["archive_errors"] > 0      # it reached both sides
    assert fuzz.failures(stats) == {}, (notes, crashes)
    assert crashes == []


def test_mutations_are_reproducible():
    import random
    fuzz = _fuzz()
    [(_, data)] = fuzz.seeds()[2:3]
    a = fuzz.mutate(data, "header-values", random.Random(5))
    b = fuzz.mutate(data, "header-values", random.Random(5))
    assert a == b and a != data
