"""`bionemo run finetune` on two DDP processes trains as one process does, full encoder and LoRA, step for step.

The same global batch of 16 as 2 ranks x micro-batch 4 (2 micro-batches each), as 4 micro-batches of 4 on one
process, and as one micro-batch of 16; and batches cut by tokens (``--global-batch-tokens``) on 2 ranks, on one
process, and on one process in micro-batches capped by ``--micro-batch-size`` (accumulated, as ``run train``
does): the logged training losses, the validation metrics (18 sequences: ranks hold 9 each, none counted twice)
and the exported weights agree, to rounding. The head drops out 30% of its inputs (``--head-dropout 0.3``): its
masks are keyed by (seed, step, sample, element), so every layout draws the same ones. ``--head-lr`` differs from
``--lr``, so the head's own parameter groups (``lr_mult``) are on the path too.
"""

import csv
import functools
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from support.cli_runs import CPU_ONLY, two_at_a_time
from support.finetune_data import write_csv
from support.hf_esm import random_hf_esm

pytestmark = pytest.mark.multiprocess

TOKENS = "2100"
"""``--global-batch-tokens`` of the runs cut by tokens: about 65 of the 256 17-47-token sequences per step; with
``--micro-batch-size 1`` (micro-batches of up to 1 x 1,026 tokens) one process accumulates 3 micro-batches a step."""
LAYOUTS = {
    "one": ("--devices", "1", "--global-batch-size", "16", "--micro-batch-size", "4"),
    "micro16": ("--devices", "1", "--global-batch-size", "16", "--micro-batch-size", "16"),
    "ddp": ("--devices", "2", "--global-batch-size", "16", "--micro-batch-size", "4"),
    "tokens_one": ("--devices", "1", "--global-batch-tokens", TOKENS),
    "tokens_ddp": ("--devices", "2", "--global-batch-tokens", TOKENS),
    "tokens_capped": ("--devices", "1", "--global-batch-tokens", TOKENS, "--micro-batch-size", "1"),
}
ENCODERS = ("full", "lora")
COMPARED = [
    ("full", "micro16", "one"),
    ("full", "ddp", "one"),
    ("lora", "ddp", "one"),
    ("full", "tokens_ddp", "tokens_one"),
    ("full", "tokens_capped", "tokens_one"),
]
"""(encoder, layout, the layout it is compared with). Micro-batch 16 and batches cut by tokens for the full encoder
only: they exercise no code path LoRA changes, and each run costs CI time."""


def _run(root: Path, encoder: str, layout: str) -> Path:
    out = root / f"{encoder}_{layout}"
    args = [
        "run", "finetune", "--checkpoint", str(root / "base"), "--data", str(root / "train.csv"),
        "--val-data", str(root / "val.csv"), "--output-dir", str(out), "--accelerator", "cpu",
        "--task", "classification", "--label-column", "kind", "--encoder", encoder, "--max-steps", "8",
        "--val-check-interval", "4", "--lr", "1e-3", "--head-lr", "3e-3",
        "--seed", "3", "--head-dropout", "0.3", *LAYOUTS[layout],
    ]  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-m", "bionemo.cli", *args],
        cwd=root,
        env=CPU_ONLY,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    if layout == "tokens_capped":
        assert "3 micro-batch(es) of about 700 tokens x 1 data-parallel rank(s)" in " ".join(
            result.stdout.replace("│", " ").split()
        )
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[tuple[str, str], Path]:
    root = tmp_path_factory.mktemp("finetune_ddp")
    random_hf_esm(root / "base", hidden=32, heads=2, layers=2)
    write_csv(root / "train.csv", 256, seed=1)
    write_csv(root / "val.csv", 18, seed=2)
    pairs = {(encoder, "one") for encoder in ENCODERS} | {(e, layout) for e, *layouts in COMPARED for layout in layouts}
    order = sorted(pairs)
    return dict(zip(order, two_at_a_time(*(functools.partial(_run, root, *pair) for pair in order)), strict=True))


def _rows(run: Path) -> list[dict[str, str]]:
    with (run / "logs" / "metrics.csv").open() as f:
        return list(csv.DictReader(f))


def _losses(run: Path) -> dict[int, float]:
    return {int(r["step"]): float(r["reduced_train_loss"]) for r in _rows(run) if r["reduced_train_loss"]}


def _validations(run: Path) -> dict[int, dict[str, float]]:
    return {
        int(r["step"]): {k: float(v) for k, v in r.items() if k.startswith("val_") and v}
        for r in _rows(run)
        if r["val_loss"]
    }


@pytest.mark.parametrize("encoder", ENCODERS)
def test_one_process_logs_every_step_and_both_validations(runs, encoder):
    run = runs[encoder, "one"]
    assert sorted(_losses(run)) == list(range(8))
    validations = _validations(run)
    assert sorted(validations) == [3, 7]
    assert {"val_loss", "val_mcc", "val_accuracy"} <= set(validations[7])


@pytest.mark.parametrize(("encoder", "layout", "compared_with"), COMPARED)
def test_same_losses_metrics_and_weights_on_another_layout(runs, encoder, layout, compared_with):
    reference, found = runs[encoder, compared_with], runs[encoder, layout]
    expected_losses, losses = _losses(reference), _losses(found)
    assert sorted(losses) == sorted(expected_losses)
    for step, loss in losses.items():
        assert loss == pytest.approx(expected_losses[step], rel=1e-4), step
    expected_metrics, metrics = _validations(reference), _validations(found)
    assert sorted(metrics) == sorted(expected_metrics)
    for step, values in metrics.items():
        assert values.keys() == expected_metrics[step].keys(), step
        for name, value in values.items():
            assert value == pytest.approx(expected_metrics[step][name], rel=1e-4, abs=1e-6), (step, name)
    expected_weights, weights = load_file(reference / "model.safetensors"), load_file(found / "model.safetensors")
    assert weights.keys() == expected_weights.keys()
    for name, value in expected_weights.items():
        assert (weights[name] - value).abs().mean() < 1e-5, name


def test_the_runs_train_the_head_and_lora_leaves_the_base_as_it_was(runs):
    """The comparison above is not between untrained copies: the head moved, and LoRA's factors did."""
    full, lora = (
        load_file(runs["full", "one"] / "model.safetensors"),
        load_file(runs["lora", "one"] / "model.safetensors"),
    )
    heads = [k for k in full if k.startswith("head.")]
    assert heads
    assert any(not torch.equal(full[k], lora[k]) for k in heads)
    assert any(full[k].abs().sum() > 0 for k in heads)
    factors = [k for k in lora if "lora_B" in k]
    assert factors
    assert all(lora[k].abs().sum() > 0 for k in factors)
    shared = [k for k in lora if not k.startswith("head.") and "lora_" not in k]
    assert shared
    assert any(not torch.equal(full[k], lora[k]) for k in shared)
