"""Installing bionemo-collate alone pulls in core and torch, never lightning, nemo or megatron."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = ("lightning", "pytorch-lightning", "nemo-toolkit", "megatron-core", "typer")


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("uv") is None, reason="needs uv on PATH")
def test_collate_installs_without_the_heavy_stack(tmp_path):
    venv = tmp_path / "venv"
    python = venv / "bin" / "python"
    subprocess.run(["uv", "venv", "-q", "-p", "3.11", str(venv)], check=True)
    subprocess.run(
        ["uv", "pip", "install", "-q", "-p", str(python), str(ROOT / "packages" / "bionemo-collate")],
        check=True,
    )
    listing = subprocess.run(
        ["uv", "pip", "list", "-p", str(python), "--format", "freeze"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.lower()
    installed = {line.split("==")[0].split(" @ ")[0].strip() for line in listing.splitlines() if line}
    assert {"bionemo-collate", "bionemo-core", "torch"} <= installed
    assert not installed & set(FORBIDDEN), f"collate pulled in {sorted(installed & set(FORBIDDEN))}"
    code = (
        "import sys, torch\n"
        "from bionemo.collate import batch_collator\n"
        "out = batch_collator([{'a': torch.ones(1, 2)}, {'a': torch.zeros(1, 3)}])\n"
        "assert out['a'].tolist() == [[1, 1, 0], [0, 0, 0]], out\n"
        "assert not any(m.split('.')[0] in ('lightning', 'nemo', 'megatron') for m in sys.modules)\n"
        "print('ok')\n"
    )
    result = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "ok"
