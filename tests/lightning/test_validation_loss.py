"""val_loss is the token-weighted mean over the whole validation epoch, like val_ppl and the training loss."""

import math

import pytest
import torch

from bionemo.callbacks import PerplexityLoggingCallback
from bionemo.lightning import MegatronDataModule
from support.reference import reference_mean_loss
from support.tiny_gpt import BigramDataset, make_module
from support.trainers import cpu_trainer


class UnevenTokens(BigramDataset):
    """Sample ``i`` counts only its first ``2 + 3 * (i % 5)`` tokens: batches of very different token counts."""

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        item = super().__getitem__(i)
        item["loss_mask"][2 + 3 * (i % 5) :] = 0
        return item


def test_val_loss_weights_every_token_alike_with_a_short_last_batch():
    torch.manual_seed(0)
    module = make_module()
    val = UnevenTokens(20, 16, 32, seed=2)  # micro-batches of 8, 8 and 4 samples
    datamodule = MegatronDataModule(val=val, micro_batch_size=8, seq_length=16)
    trainer = cpu_trainer([PerplexityLoggingCallback()])
    (metrics,) = trainer.validate(module, datamodule=datamodule)
    expected = reference_mean_loss(module.module, val)
    assert metrics["val_loss"] == pytest.approx(expected, rel=1e-5)
    assert metrics["val_ppl"] == pytest.approx(math.exp(metrics["val_loss"]), rel=1e-5)
