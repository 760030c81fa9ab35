"""`bionemo run train` / `run predict` of the built-in recipe on GPUs: 1 GPU and DP, TP, PP, CP = 2 (MegatronStrategy).

Each layout trains the demo recipe briefly, resumes that run from its checkpoint, then predicts the
bundled sequences with its weights; the five layouts train the same loss curve (the same global batch), their
predictions come out in the same (input) order, and the same weights predict the same values in every layout.
"""

import csv
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from bionemo.esm2.checkpoints.weights import read_metadata
from bionemo.recipes.outputs import read_predictions

LAYOUTS = [
    pytest.param([], id="1gpu", marks=pytest.mark.gpu),
    pytest.param(["--devices", "2"], id="dp2", marks=pytest.mark.multi_gpu),
    pytest.param(
        ["--devices", "2", "--tensor-parallel", "2", "--strategy", "megatron"], id="tp2", marks=pytest.mark.multi_gpu
    ),
    pytest.param(
        ["--devices", "2", "--pipeline-parallel", "2", "--strategy", "megatron"], id="pp2", marks=pytest.mark.multi_gpu
    ),
    pytest.param(
        ["--devices", "2", "--context-parallel", "2", "--strategy", "megatron"], id="cp2", marks=pytest.mark.multi_gpu
    ),
]


def bionemo(args: list[str], log: Path) -> tuple[float, str]:
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "bionemo.cli", *args], capture_output=True, text=True, timeout=540, check=False
    )
    log.write_text(" ".join(args) + "\n" + result.stdout + "\n" + result.stderr)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return time.perf_counter() - start, result.stdout + result.stderr


@pytest.fixture(scope="module")
def logs() -> Path:
    path = Path(os.environ.get("BIONEMO_GPU_LOG_DIR", "/tmp/bionemo-gpu-logs"))
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.mark.parametrize("layout", LAYOUTS)
def test_train_then_predict(tmp_path, logs, layout, request):
    name = request.node.callspec.id
    run = ["run", "train", "--output-dir", str(tmp_path / "run"), *layout]
    train_s, _ = bionemo([*run, "--max-steps", "30", "--val-check-interval", "30"], logs / f"cli_train_{name}.log")
    weights = tmp_path / "run" / "model.safetensors"
    assert read_metadata(weights)["steps"] == 30
    (logs / f"cli_losses_{name}.json").write_text(json.dumps(train_losses(tmp_path / "run")))
    # a rerun continues from the first run's checkpoint to the new --max-steps
    resume_s, output = bionemo(
        [*run, "--max-steps", "40", "--val-check-interval", "10"], logs / f"cli_resume_{name}.log"
    )
    restored = [line for line in output.splitlines() if line.startswith("resuming from ")]
    assert restored, output[-3000:]
    assert f"{tmp_path / 'run' / 'checkpoints'}{os.sep}step" in restored[0], restored
    assert read_metadata(weights)["steps"] == 40
    # pipeline-parallel prediction outputs embeddings and logits only (it refuses the default perplexity)
    outputs = ["--include", "embeddings"] if "--pipeline-parallel" in layout else []
    predict_s, _ = bionemo(
        ["run", "predict", "--output-dir", str(tmp_path / "pred"), *layout, *outputs], logs / f"cli_predict_{name}.log"
    )
    ids, bundled = read_predictions(tmp_path / "pred" / "predictions.safetensors")
    assert bundled["sample_index"].tolist() == list(range(len(ids)))
    torch.save({"ids": ids, **bundled}, logs / f"cli_bundled_{name}.pt")
    (logs / f"cli_timing_{name}.txt").write_text(
        f"train {train_s:.1f} s, resume {resume_s:.1f} s, predict {predict_s:.1f} s\n"
    )


def train_losses(run: Path) -> dict[int, float]:
    """The training loss of each logged step of ``run``'s first fit (its ``logs/metrics.csv``)."""
    with (run / "logs" / "metrics.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if r["reduced_train_loss"]]
    return {int(float(r["step"])): float(r["reduced_train_loss"]) for r in rows}  # NeMo logs the step as a float


def kept_by_layout(logs: Path, pattern: str, load: Callable[[Path], Any]) -> dict[str, Any]:
    """What the layouts' runs kept in ``logs`` (``pattern`` with the layout's name), 1 GPU's and another's at least."""
    paths = {name: logs / pattern.format(name) for name in ("1gpu", "dp2", "tp2", "pp2", "cp2")}
    present = {name: load(path) for name, path in paths.items() if path.exists()}
    assert "1gpu" in present, f"layouts with {pattern}: {sorted(present)}"
    assert len(present) > 1, f"layouts with {pattern}: {sorted(present)}"
    return present


LOSS_REL = 3e-2
"""A layout's training loss against 1 GPU's at the same step: the same global batch, bf16 and other reductions."""


@pytest.mark.multi_gpu
def test_layouts_train_the_same_loss_curve(logs):
    """Runs after the layouts (file order): the same global batch gives 1 GPU's loss curve in every layout that ran.

    The exact (fp32) comparison is the CPU layout matrix (tests/esm2/test_layout_matrix.py); this one runs NCCL,
    megatron's DDP and its TP, PP and CP schedules in bf16.
    """
    present = kept_by_layout(logs, "cli_losses_{}.json", lambda path: json.loads(path.read_text()))
    reference = present["1gpu"]
    steps = sorted(reference, key=int)
    assert len(steps) >= 3, steps  # logged every few steps (log_every_n_steps)
    assert reference[steps[-1]] < reference[steps[0]]  # it trained: agreeing with it means something
    for name, losses in present.items():
        assert losses.keys() == reference.keys(), name
        for step, loss in losses.items():
            assert loss == pytest.approx(reference[step], rel=LOSS_REL), (name, step)
    print("layouts with 1gpu's loss curve:", sorted(present))


@pytest.mark.multi_gpu
def test_layouts_agree(logs):
    """Runs after the layouts (file order): the bundled weights predict alike in every layout that ran.

    A layout that failed fails its own test; predictions kept from an earlier run in ``logs`` count too.
    """
    present = kept_by_layout(logs, "cli_bundled_{}.pt", lambda path: torch.load(path, weights_only=True))
    reference = present["1gpu"]
    for name, other in present.items():
        assert other["ids"] == reference["ids"], name
        if "perplexity" in other:
            torch.testing.assert_close(other["perplexity"], reference["perplexity"], rtol=2e-2, atol=2e-2, msg=name)
        torch.testing.assert_close(other["embeddings"], reference["embeddings"], rtol=2e-2, atol=2e-2, msg=name)
    print("layouts agreeing with 1gpu:", sorted(present))


@pytest.mark.gpu
def test_gpu_recipe_trains_at_its_precision(tmp_path, logs):
    """A GPU recipe trains in bf16-mixed without --precision; settings.yaml and the summary say so."""
    import yaml

    out = tmp_path / "run"
    _, output = bionemo(
        ["run", "train", "--recipe", "esm2-8m", "--max-steps", "2", "--val-check-interval", "2",
         "--global-batch-size", "32", "--micro-batch-size", "16", "--output-dir", str(out)],
        logs / "cli_train_precision.log",
    )  # fmt: skip
    settings = yaml.safe_load((out / "settings.yaml").read_text())
    assert settings["precision"] == "bf16-mixed"
    assert (settings["micro_batch_size"], settings["global_batch_size"]) == (16, 32)
    assert "bf16-mixed" in output  # the summary's precision row


@pytest.mark.parametrize("layout", LAYOUTS)
def test_batches_cut_by_tokens_train_alike_on_every_layout(tmp_path, logs, layout, request):
    """`run train --global-batch-tokens` under megatron: micro-batches of as many sequences as fit 2 x 1026 tokens
    (about 40 of the demo's), 8 per step on one data-parallel rank and 4 each on two; every 2-GPU layout
    (pipeline parallelism: megatron sends each micro-batch's shape between stages) follows 1 GPU's loss curve."""
    name = request.node.callspec.id
    run = tmp_path / "run"
    args = ["run", "train", "--global-batch-tokens", "16384", "--micro-batch-size", "2", "--output-dir", str(run)]
    _, output = bionemo(
        [*args, "--max-steps", "30", "--val-check-interval", "15", *layout], logs / f"tokens_{name}.log"
    )
    assert "micro-batch(es) of about 2,048 tokens" in " ".join(output.replace("│", " ").split())
    assert read_metadata(run / "model.safetensors")["steps"] == 30
    losses = train_losses(run)
    (logs / f"tokens_losses_{name}.json").write_text(json.dumps(losses))
    steps = sorted(losses)
    assert losses[steps[-1]] < losses[steps[0]]
    if name != "1gpu":
        reference = json.loads((logs / "tokens_losses_1gpu.json").read_text())
        assert {int(k) for k in reference} == set(losses)
        for step, loss in reference.items():
            assert losses[int(step)] == pytest.approx(loss, rel=LOSS_REL), step
