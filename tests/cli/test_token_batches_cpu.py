"""`bionemo run train --global-batch-tokens` on CPU: the same steps on one process and on two DDP processes, and a
resumed run ends as the uninterrupted one.

3,000 tokens per step of the demo data (up to 63 tokens a sequence) in micro-batches of up to 1,026 tokens
(--micro-batch-size 1 x seq_length 1026): one process accumulates 3 micro-batches per step, two processes 2 each.
"""

import csv
import subprocess
from pathlib import Path

import pytest
from safetensors.torch import load_file

from support.cli_runs import bionemo, two_at_a_time

pytestmark = pytest.mark.multiprocess

COMMON = ("run", "train", "--accelerator", "cpu", "--global-batch-tokens", "3000", "--micro-batch-size", "1")


def _losses(run: Path) -> dict[int, float]:
    with (run / "logs" / "metrics.csv").open() as f:
        return {
            int(row["step"]): float(row["reduced_train_loss"]) for row in csv.DictReader(f) if row["reduced_train_loss"]
        }


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("token_batches")
    out = {name: root / name for name in ("one", "ddp", "resumed")}
    steps = ("--max-steps", "6", "--val-check-interval", "3")

    def stopped_then_resumed() -> subprocess.CompletedProcess:
        bionemo(*COMMON, "--max-steps", "3", "--val-check-interval", "3", "--output-dir", str(out["resumed"]), cwd=root)
        return bionemo(*COMMON, *steps, "--output-dir", str(out["resumed"]), cwd=root)

    one, _, resumed = two_at_a_time(
        lambda: bionemo(*COMMON, *steps, "--output-dir", str(out["one"]), cwd=root),
        lambda: bionemo(*COMMON, *steps, "--devices", "2", "--output-dir", str(out["ddp"]), cwd=root),
        stopped_then_resumed,
    )
    assert "3 micro-batch(es) of about 1,000 tokens x 1 data-parallel rank(s)" in " ".join(
        one.stdout.replace("│", " ").split()
    )
    assert "resuming from" in resumed.stderr
    return out


@pytest.mark.parametrize("layout", ["ddp", "resumed"])
def test_the_same_losses_and_weights(runs, layout):
    reference = _losses(runs["one"])
    assert sorted(reference) == list(range(6))
    found = _losses(runs[layout])
    if layout == "resumed":  # the second run logs its own steps after the first run's
        assert {3, 4, 5} <= found.keys()
        found = {step: found[step] for step in (3, 4, 5)}
    else:
        assert sorted(found) == list(range(6))
    for step, loss in found.items():
        assert loss == pytest.approx(reference[step], rel=2e-4), step
    weights, expected = load_file(runs[layout] / "model.safetensors"), load_file(runs["one"] / "model.safetensors")
    assert weights.keys() == expected.keys()
    for name, value in expected.items():  # Adam magnifies summation-order differences of near-zero gradients
        assert (weights[name] - value).abs().mean() < 1e-6, name


def test_steps_train_and_the_settings_file_keeps_the_budget(runs):
    import yaml

    losses = _losses(runs["one"])
    assert losses[5] < losses[0]
    settings = yaml.safe_load((runs["ddp"] / "settings.yaml").read_text())
    assert {k: settings[k] for k in ("devices", "micro_batch_size", "global_batch_size", "global_batch_tokens")} == {
        "devices": 2,
        "micro_batch_size": 1,
        "global_batch_size": None,
        "global_batch_tokens": 3000,
    }
