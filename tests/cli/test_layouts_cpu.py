"""The same global batch trains the same demo model on one process, two DDP processes and another micro-batch size.

Real `bionemo run train` runs on CPU; the two-process runs also resume (mid-epoch: the run is one pass).
"""

import csv
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from support.cli_runs import bionemo

pytestmark = pytest.mark.multiprocess

COMMON = ("run", "train", "--accelerator", "cpu", "--global-batch-size", "16", "--val-check-interval", "2")


def _losses(run: Path) -> dict[int, float]:
    with (run / "logs" / "metrics.csv").open() as f:
        return {
            int(row["step"]): float(row["reduced_train_loss"]) for row in csv.DictReader(f) if row["reduced_train_loss"]
        }


def _weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(run / "model.safetensors")


def _assert_same_weights(found: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert found.keys() == expected.keys()
    for name, value in expected.items():
        assert (found[name] - value).abs().mean() < 1e-5, name


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("layouts")
    out = {name: root / name for name in ("one", "micro8", "ddp", "ddp_resumed")}
    bionemo(*COMMON, "--micro-batch-size", "4", "--max-steps", "6", "--output-dir", str(out["one"]), cwd=root)
    bionemo(*COMMON, "--micro-batch-size", "8", "--max-steps", "4", "--output-dir", str(out["micro8"]), cwd=root)
    ddp = ("--devices", "2", "--micro-batch-size", "4")
    bionemo(*COMMON, *ddp, "--max-steps", "4", "--output-dir", str(out["ddp"]), cwd=root)
    shutil.copytree(out["ddp"], out["ddp_resumed"])
    result = bionemo(*COMMON, *ddp, "--max-steps", "6", "--output-dir", str(out["ddp_resumed"]), cwd=root)
    assert "resuming from" in result.stderr
    return out


def test_one_process_accumulating_is_the_reference(runs):
    losses = _losses(runs["one"])
    assert sorted(losses) == list(range(6))


@pytest.mark.parametrize("layout", ["micro8", "ddp"])
def test_same_losses_and_weights_on_other_layouts(runs, layout):
    reference = _losses(runs["one"])
    found = _losses(runs[layout])
    assert sorted(found) == list(range(4))
    for step, loss in found.items():
        assert loss == pytest.approx(reference[step], rel=2e-4), step


def test_ddp_resumed_mid_run_ends_as_the_uninterrupted_run(runs):
    reference = _losses(runs["one"])
    found = _losses(runs["ddp_resumed"])
    assert sorted(found) == list(range(6))
    for step, loss in found.items():
        assert loss == pytest.approx(reference[step], rel=2e-4), step
    _assert_same_weights(_weights(runs["ddp_resumed"]), _weights(runs["one"]))


def test_settings_file_reruns_the_same_settings(runs):
    import yaml

    settings = yaml.safe_load((runs["ddp"] / "settings.yaml").read_text())
    assert {k: settings[k] for k in ("devices", "micro_batch_size", "global_batch_size", "precision", "max_steps")} == {
        "devices": 2,
        "micro_batch_size": 4,
        "global_batch_size": 16,
        "precision": "32",
        "max_steps": 4,
    }
