"""Under MegatronStrategy, BionemoLightningModule trains the step's global token-weighted mean loss.

tests/support/token_weighted_step.py runs one optimizer step on one GPU: two micro-batches (micro-batch size 1,
global batch 2) whose loss masks cover 3 and 60 tokens, fp32, dropout 0. Its gradients, as megatron hands them
to the optimizer, must be those of (sum of the masked token cross-entropies of both micro-batches) / 63, computed
here in plain PyTorch on the same weights and micro-batches, and clearly not those of the mean of the two
micro-batch means (megatron's default without ``calculate_per_token_loss``), which weights each of the 3 tokens
ten times more than the token mean does.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from support.token_weighted_step import MASKED_TOKENS, Objective, reference_gradients, tiny_config

SCRIPT = Path(__file__).resolve().parents[1] / "support" / "token_weighted_step.py"


def run_step(out_dir: Path) -> dict:
    """Run the support script's one megatron step; what it recorded (see its module docstring)."""
    log_dir = Path(os.environ.get("BIONEMO_GPU_LOG_DIR", out_dir))
    log_dir.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        [sys.executable, str(SCRIPT), str(out_dir)], capture_output=True, text=True, timeout=300, check=False
    )
    (log_dir / "token_weighted_step.log").write_text(result.stdout + "\n" + result.stderr)
    record_path = out_dir / "step.pt"
    assert record_path.exists(), result.stderr[-5000:]
    record = torch.load(record_path, weights_only=True)
    assert "error" not in record, record["error"]
    assert result.returncode == 0, result.stderr[-5000:]
    return record


def relative_distance(grads: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> float:
    """``|grads - reference| / |reference|`` over all parameters flattened together."""
    diff = torch.cat([(grads[name] - reference[name]).flatten() for name in reference])
    return float(diff.norm() / torch.cat([g.flatten() for g in reference.values()]).norm())


@pytest.mark.gpu
def test_megatron_step_takes_the_gradient_of_the_global_token_weighted_mean(tmp_path):
    from bionemo.lightning import ensure_model_parallel

    record = run_step(tmp_path)
    assert record["global_step"] == 1
    assert record["per_token_loss"] is True
    assert record["num_microbatches"] == 2
    micro_batches = record["micro_batches"]
    assert sorted(int(batch["loss_mask"].sum()) for batch in micro_batches) == sorted(MASKED_TOKENS)
    assert sorted(int(pair[1]) for pair in record["loss_sums"]) == sorted(MASKED_TOKENS)
    assert record["params_without_main_grad"] == []

    # the same weights in a fresh model on the CPU
    ensure_model_parallel()
    model = tiny_config().configure_model().float()
    params = dict(model.named_parameters())
    assert sorted(params) == sorted(record["weights"]) == sorted(record["grads"])
    with torch.no_grad():
        for name, param in params.items():
            param.copy_(record["weights"][name])
    model.train()
    batches = [{k: batch[k] for k in ("tokens", "labels", "loss_mask")} for batch in micro_batches]
    token_mean, loss = reference_gradients(model, batches, Objective.TOKEN_MEAN)
    mean_of_means, _ = reference_gradients(model, batches, Objective.MEAN_OF_MEANS)

    # the step's reduced loss is the token-weighted mean too
    assert record["reduced_loss"] == pytest.approx(loss, rel=1e-4)
    grads = record["grads"]
    distances = {
        "megatron_to_token_mean": relative_distance(grads, token_mean),
        "megatron_to_mean_of_means": relative_distance(grads, mean_of_means),
        "mean_of_means_to_token_mean": relative_distance(mean_of_means, token_mean),
    }
    # the data tell the objectives apart ...
    assert distances["mean_of_means_to_token_mean"] > 0.1, distances
    # ... and megatron's gradients are the token-weighted mean's, parameter by parameter
    assert distances["megatron_to_token_mean"] < 1e-4, distances
    assert distances["megatron_to_mean_of_means"] > 0.1, distances
    total = torch.cat([g.flatten() for g in token_mean.values()]).norm()
    for name, reference in token_mean.items():
        error = (grads[name] - reference).norm()
        assert error <= 1e-3 * reference.norm() + 1e-6 * total, (name, float(error), float(reference.norm()))
