"""Weights trained with tensor parallelism export whole and load into any layout (2 gloo processes)."""

import pytest
import torch

from bionemo.esm2.checkpoints.weights import apply_weights, read_weights, save_weights, unpadded
from bionemo.lightning import ensure_model_parallel
from support.distributed import run_distributed
from support.parallel_workers import esm2_config, esm2_inputs, esm2_logits, esm2_tp_worker

pytestmark = pytest.mark.multiprocess


def test_tp2_weights_give_the_same_logits_without_tensor_parallelism(tmp_path):
    results = run_distributed(esm2_tp_worker, 2)
    full = results[0]["full"]
    for name, value in results[1]["full"].items():
        assert torch.equal(value, full[name]), name  # both ranks gathered the same full tensors
    save_weights(full, tmp_path / "w.safetensors", {"model": {}})
    ensure_model_parallel()
    model = esm2_config(1).configure_model().eval()
    # TP=2 pads the vocabulary to 48 rows, TP=1 to 40: files hold exactly the 33 tokens' rows
    assert full["embedding.word_embeddings.weight"].shape[0] == 48
    on_disk = read_weights(tmp_path / "w.safetensors")
    assert {k: v.shape for k, v in on_disk.items()} == {
        k: v.shape for k, v in unpadded(model.state_dict(), 33).items() if not k.endswith("_extra_state")
    }
    apply_weights(model, on_disk)
    tokens, valid = esm2_inputs()
    with torch.no_grad():
        logits = esm2_logits(model, tokens, valid)
    torch.testing.assert_close(logits, results[0]["logits"], rtol=1e-5, atol=1e-5)
