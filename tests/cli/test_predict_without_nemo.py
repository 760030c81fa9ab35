"""`bionemo run predict` on one device (Lightning's own strategy) never imports NeMo, and in the `bionemo` command
(its import skips armed) not TorchDynamo either: a shorter start-up."""

import os
import subprocess
import sys

PROBE = """
import sys
from typer.main import get_command
from bionemo.cli.app import app, skip_unused_imports
if sys.argv[2] == "command":
    skip_unused_imports()  # what the `bionemo` entry point arms first
get_command(app).main(["run", "predict", "--accelerator", "cpu", "--output-dir", sys.argv[1]], standalone_mode=False)
print("NEMO_MODULES", sorted(m for m in sys.modules if m == "nemo" or m.startswith("nemo.")))
print("DYNAMO_MODULES", sorted(m for m in sys.modules if m.startswith(("torch._dynamo", "torch.nn.attention.varlen"))))
"""


def predict(out, mode: str) -> str:
    cpu_only = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run(
        [sys.executable, "-c", PROBE, str(out), mode], capture_output=True, text=True, env=cpu_only, timeout=600
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert (out / "predictions.safetensors").is_file()
    return result.stdout


def test_single_device_prediction_imports_no_nemo(tmp_path):
    stdout = predict(tmp_path / "out", "library")
    assert "NEMO_MODULES []" in stdout, stdout[-2000:]


def test_the_bionemo_command_predicts_without_importing_torchdynamo(tmp_path):
    stdout = predict(tmp_path / "out", "command")
    assert "DYNAMO_MODULES []" in stdout, stdout[-2000:]
