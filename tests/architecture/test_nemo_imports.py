"""NeMo stays behind one adapter: ``bionemo.lightning._nemo`` imports it, and importing the package does not."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIGHTNING = ROOT / "packages" / "bionemo-lightning" / "src" / "bionemo"
ADAPTER = LIGHTNING / "lightning" / "_nemo"


def _nemo_imports(path: Path) -> list[int]:
    """Line numbers of every ``import nemo...`` / ``from nemo... import`` in ``path``, at any depth."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        if any(name == "nemo" or name.startswith("nemo.") for name in names):
            lines.append(node.lineno)
    return lines


def test_only_the_adapter_imports_nemo():
    outside = {
        str(path.relative_to(ROOT)): lines
        for path in LIGHTNING.rglob("*.py")
        if ADAPTER not in path.parents and (lines := _nemo_imports(path))
    }
    assert outside == {}, f"import nemo only in {ADAPTER.relative_to(ROOT)}/"
    assert any(_nemo_imports(path) for path in ADAPTER.rglob("*.py"))


_PROBE = """
import sys

def nemo():
    return sorted(m for m in sys.modules if m == "nemo" or m.startswith("nemo."))

import bionemo.lightning
from bionemo.lightning import BionemoLightningModule, MegatronCompatCallback, MegatronDataModule
from bionemo.lightning import default_megatron_optimizer, step_runner, workarounds
import bionemo.llm.lightning
assert nemo() == [], nemo()[:10]
from bionemo.lightning import MegatronOptimizerModule
assert MegatronOptimizerModule.__module__.startswith("nemo."), MegatronOptimizerModule.__module__
assert "nemo.lightning" in nemo()
print("ok")
"""


def test_importing_bionemo_lightning_imports_no_nemo():
    """``import bionemo.lightning`` (and the old ``bionemo.llm.lightning``) loads no ``nemo`` module.

    ``MegatronOptimizerModule`` is NeMo's class, served on first access.
    """
    result = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, check=False, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "ok"
