"""The same global batch trains the same demo model on one process, two DDP processes and another micro-batch size.

Real `bionemo run train` runs on CPU; a two-process run killed with SIGKILL (every process of it) after its first
checkpoint and rerun ends as the uninterrupted run (mid-epoch: the run is one pass).
"""

import csv
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from support.cli_runs import BIONEMO, CPU_ONLY, bionemo, two_at_a_time

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
    out = {name: root / name for name in ("one", "micro8", "ddp", "ddp_killed")}
    ddp = ("--devices", "2", "--micro-batch-size", "4")
    killed = [*COMMON, *ddp, "--max-steps", "6", "--output-dir", str(out["ddp_killed"])]

    def killed_then_rerun() -> subprocess.CompletedProcess:
        _kill_after_first_checkpoint(killed, out["ddp_killed"], cwd=root)
        return bionemo(*killed, cwd=root)

    def train(name: str, *args: str) -> subprocess.CompletedProcess:
        return bionemo(*COMMON, *args, "--output-dir", str(out[name]), cwd=root)

    *_, rerun = two_at_a_time(
        lambda: train("one", "--micro-batch-size", "4", "--max-steps", "6"),
        lambda: train("micro8", "--micro-batch-size", "8", "--max-steps", "4"),
        lambda: train("ddp", *ddp, "--max-steps", "4"),
        killed_then_rerun,
    )
    assert "resuming from" in rerun.stderr
    return out


def _kill_after_first_checkpoint(args: list[str], run: Path, cwd: Path) -> None:
    """Start ``bionemo *args`` and SIGKILL all its processes (both ranks) once a checkpoint is written."""
    process = subprocess.Popen(
        [*BIONEMO, *args], cwd=cwd, env=CPU_ONLY, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    deadline = time.time() + 300
    while not (run / "checkpoints" / "last.ckpt").exists():
        assert process.poll() is None, "training ended before it could be killed"
        assert time.time() < deadline, "no checkpoint appeared"
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    assert not (run / "model.safetensors").exists()


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


def test_ddp_killed_and_rerun_ends_as_the_uninterrupted_run(runs):
    reference = _losses(runs["one"])
    found = _losses(runs["ddp_killed"])
    assert sorted(found) == list(range(6))
    for step, loss in found.items():
        assert loss == pytest.approx(reference[step], rel=2e-4), step
    _assert_same_weights(_weights(runs["ddp_killed"]), _weights(runs["one"]))


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
