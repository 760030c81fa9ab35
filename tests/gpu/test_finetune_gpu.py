"""`bionemo run finetune` then `run predict` on one GPU (MegatronStrategy, bf16): full, LoRA and frozen encoders.

A tiny random Hugging Face base and the synthetic tasks of tests/support/finetune_data.py: each mode must reach the
held-out quality the CPU tests reach, the exported weights must score the validation set as training recorded,
and a LoRA run's peak device memory is logged beside the full run's. Runs under `-m gpu`; logs go to
``$BIONEMO_GPU_LOG_DIR``. Multi-GPU layouts belong to the multi-GPU tier.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from support.finetune_data import gpu_run_files, read_csv

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    return gpu_run_files(tmp_path_factory.mktemp("finetune_gpu"))


def _bionemo(files: dict[str, Path], name: str, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "bionemo.cli", *args], capture_output=True, text=True, timeout=540, check=False
    )
    (files["logs"] / f"finetune_{name}.log").write_text(" ".join(args) + "\n" + result.stdout + "\n" + result.stderr)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return result.stdout


@pytest.mark.parametrize(
    ("encoder", "extra"),
    [
        ("full", ["--lr", "3e-4", "--class-weights", "balanced"]),
        ("lora", ["--lora-rank", "8", "--lr", "3e-3"]),
        ("frozen", ["--lr", "1e-2"]),
    ],
)
def test_finetune_then_predict_on_one_gpu(files, encoder, extra):
    run = files["root"] / f"run_{encoder}"
    _bionemo(
        files, f"train_{encoder}", "run", "finetune", "--checkpoint", str(files["base"]), "--data", str(files["train"]),
        "--val-data", str(files["val"]), "--task", "classification", "--label-column", "kind", "--encoder", encoder,
        "--max-steps", "60", "--val-check-interval", "20", "--output-dir", str(run), *extra,
    )  # fmt: skip
    summary = json.loads((run / "summary.json").read_text())
    assert summary["peak_memory_gib"] is not None
    assert (summary["class_weights"] is not None) == ("--class-weights" in extra)  # the weighted loss under megatron
    pred = files["root"] / f"pred_{encoder}"
    _bionemo(files, f"predict_{encoder}", "run", "predict", "--checkpoint", str(run / "model.safetensors"),
             "--data", str(files["test"]), "--output-dir", str(pred))  # fmt: skip
    truth = [r["kind"] for r in read_csv(files["test"])]
    predicted = [r["kind"] for r in read_csv(pred / "predictions.csv")]
    accuracy = sum(p == t for p, t in zip(predicted, truth, strict=True)) / len(truth)
    (files["logs"] / f"finetune_{encoder}.json").write_text(json.dumps({**summary, "test_accuracy": accuracy}))
    assert accuracy >= (0.75 if encoder == "frozen" else 0.9), accuracy
    assert torch.cuda.is_available()
