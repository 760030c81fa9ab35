"""Every ```python block of README.md runs as written: each in a fresh namespace, in an empty working directory.

The blocks run in this process (the libraries they import are then shared with the other tests), on the CPU. A
README edit that breaks an example fails here; the blocks check their own results with ``assert``.
"""

import re
from pathlib import Path

import pytest

README = Path(__file__).parents[1] / "README.md"
BLOCK = re.compile(r"^```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def python_blocks() -> dict[str, str]:
    """The README's Python blocks by the line their code starts on (``README.md:256``)."""
    text = README.read_text(encoding="utf-8")
    return {f"README.md:{text.count(chr(10), 0, m.start(1)) + 1}": m.group(1) for m in BLOCK.finditer(text)}


BLOCKS = python_blocks()


def test_the_readme_holds_python_examples():
    assert len(BLOCKS) >= 3  # batch_collator, the Lightning layer, a recipe's predict from Python
    assert all("import" in code for code in BLOCKS.values())


@pytest.mark.parametrize("where", list(BLOCKS))
def test_readme_python_block_runs(where, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the blocks write their files (predictions, FASTA) into the working directory
    exec(compile(BLOCKS[where], where, "exec"), {"__name__": "__readme__"})  # noqa: S102
