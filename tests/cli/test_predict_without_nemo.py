"""`bionemo run predict` on one device (Lightning's own strategy) never imports NeMo: a shorter start-up."""

import os
import subprocess
import sys

PROBE = """
import sys
from typer.main import get_command
from bionemo.cli.app import app
get_command(app).main(["run", "predict", "--accelerator", "cpu", "--output-dir", sys.argv[1]], standalone_mode=False)
print("NEMO_MODULES", sorted(m for m in sys.modules if m == "nemo" or m.startswith("nemo.")))
"""


def test_single_device_prediction_imports_no_nemo(tmp_path):
    cpu_only = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run(
        [sys.executable, "-c", PROBE, str(tmp_path / "out")], capture_output=True, text=True, env=cpu_only, timeout=600
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert (tmp_path / "out" / "predictions.safetensors").is_file()
    assert "NEMO_MODULES []" in result.stdout, result.stdout[-2000:]
