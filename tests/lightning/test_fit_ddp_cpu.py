"""The module trains and predicts under Lightning's DDP strategy on 2 CPU processes (gloo)."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bionemo.callbacks import merge_predictions, prediction_files
from support.reference import reference_logits, reference_mean_loss
from support.tiny_gpt import BigramDataset, make_module

pytestmark = pytest.mark.multiprocess

SCRIPT = Path(__file__).resolve().parents[1] / "support" / "ddp_cpu_run.py"


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("ddp")
    result = subprocess.run(
        [sys.executable, str(SCRIPT), str(out_dir)], capture_output=True, text=True, timeout=600, check=False
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    record = json.loads((out_dir / "result.json").read_text())
    module = make_module()
    module.configure_model()
    module.module.load_state_dict(torch.load(out_dir / "weights.pt", weights_only=True))
    return {"out_dir": out_dir, "record": record, "model": module.module}


def test_two_processes_trained_and_loss_fell(ddp_run):
    record = ddp_run["record"]
    assert record["world_size"] == 2
    losses = record["losses"]
    assert len(losses) == 30
    assert sum(losses[-5:]) / 5 < 0.7 * sum(losses[:5]) / 5


def test_val_ppl_is_exp_of_reference_mean_loss_over_both_ranks(ddp_run):
    expected = math.exp(reference_mean_loss(ddp_run["model"], BigramDataset(16, 16, 32, seed=2)))
    assert ddp_run["record"]["metrics"]["val_ppl"] == pytest.approx(expected, rel=1e-4)


def test_each_rank_wrote_and_merge_restores_input_order(ddp_run):
    out = ddp_run["out_dir"] / "predictions"
    assert [p.name for p in prediction_files(out)] == ["predictions_rank0.safetensors", "predictions_rank1.safetensors"]
    merged = merge_predictions(out)
    assert merged["sample_index"].tolist() == list(range(21))  # the sampler's padding duplicate is dropped
    expected = reference_logits(ddp_run["model"], BigramDataset(21, 16, 32, seed=3, labels=False))
    torch.testing.assert_close(merged["token_logits"], expected, rtol=1e-4, atol=1e-4)
