"""BionemoLightningModule under nemo's Trainer + MegatronStrategy + MegatronOptimizerModule on real GPUs.

Each case runs tests/support/megatron_run.py (Lightning starts the ranks) and checks what it recorded:
training lowers the loss, val_ppl is logged and equals exp(val_loss), a checkpoint is saved, a fresh
module reloaded from it predicts exactly what the trained one does, in input order, and a fresh module
and optimizer resume training from it.
"""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "support" / "megatron_run.py"
N_PREDICT = 37
LAYOUTS = {
    "1gpu": pytest.param(1, 1, marks=pytest.mark.gpu, id="1gpu"),
    "dp2": pytest.param(2, 1, marks=pytest.mark.multi_gpu, id="dp2"),
    "tp2": pytest.param(2, 2, marks=pytest.mark.multi_gpu, id="tp2"),
}


def run_layout(out_dir: Path, devices: int, tp: int) -> dict:
    log_dir = Path(os.environ.get("BIONEMO_GPU_LOG_DIR", out_dir))
    log_dir.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        [sys.executable, str(SCRIPT), str(out_dir), "--devices", str(devices), "--tp", str(tp)],
        capture_output=True,
        text=True,
        timeout=480,
        check=False,
    )
    (log_dir / f"megatron_run_d{devices}_tp{tp}.log").write_text(result.stdout + "\n" + result.stderr)
    record_path = out_dir / "result.json"
    assert record_path.exists(), result.stderr[-5000:]
    record = json.loads(record_path.read_text())
    (log_dir / f"result_d{devices}_tp{tp}.json").write_text(json.dumps(record, indent=1))
    for name, value in record.items():
        if isinstance(value, dict) and value.get("ok") is False:
            pytest.fail(f"phase {name} failed: {value['error']}\n{value['traceback']}")
    assert result.returncode == 0, result.stderr[-5000:]
    return record


@pytest.mark.parametrize(("devices", "tp"), list(LAYOUTS.values()))
def test_train_validate_checkpoint_reload_predict(tmp_path, devices, tp):
    record = run_layout(tmp_path, devices, tp)
    fit = record["fit"]
    losses = fit["losses"]
    assert fit["global_step"] == 60
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5, losses
    metrics = fit["metrics"]
    assert "val_ppl" in metrics, metrics
    assert metrics["val_ppl"] == pytest.approx(math.exp(metrics["val_loss"]), rel=1e-3)
    assert "train_ppl" in metrics
    # MegatronDataModule keeps NeMo's data sampler from logging these every step (log_sampler_metrics=False)
    assert not {"consumed_samples", "global_batch_size"} & set(metrics), metrics
    # the fused_adam speed-up: torch's fused AdamW, its step counters on the GPU (also after the resume below)
    assert (fit["adam_fused"], fit["adam_step_devices"]) == ([True], ["cuda"])
    assert record["merge_pred_trained"]["index"] == list(range(N_PREDICT))
    assert record["merge_pred_reloaded"]["index"] == list(range(N_PREDICT))
    trained = torch.load(tmp_path / "pred_trained.pt", weights_only=True)
    reloaded = torch.load(tmp_path / "pred_reloaded.pt", weights_only=True)
    assert trained["token_logits"].shape == (32, N_PREDICT, 64)
    torch.testing.assert_close(reloaded["token_logits"], trained["token_logits"])
    resumed = record["resume"]
    # a fresh module and distributed optimizer continue from the checkpoint: step count, Adam's own step
    # counter and a loss already near the trained one's, not the untrained start
    assert resumed["global_step"] == 70
    assert resumed["adam_steps"] == [70.0]
    assert (resumed["adam_fused"], resumed["adam_step_devices"]) == ([True], ["cuda"])
    assert resumed["losses"][0] < 0.5 * sum(losses[:5]) / 5, (resumed["losses"], losses)
