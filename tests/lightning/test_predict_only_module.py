"""A module built without an optimizer predicts on Lightning's strategies and says why it cannot train."""

import lightning.pytorch as pl
import pytest
import torch

from bionemo.lightning import BionemoLightningModule, MegatronDataModule
from support.reference import reference_logits
from support.tiny_gpt import BigramDataset, TinyGPTConfig, data_step, forward_step


def trainer(**options):
    return pl.Trainer(
        accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False, **options
    )


def test_predicts_in_input_order_and_refuses_to_train():
    torch.manual_seed(0)
    module = BionemoLightningModule(TinyGPTConfig(), forward_step=forward_step, data_step=data_step, optimizer=None)
    predict = BigramDataset(10, 16, 32, seed=3, labels=False)
    data = MegatronDataModule(
        train=BigramDataset(64, 16, 32, seed=1), predict=predict, micro_batch_size=4, seq_length=16
    )
    predictions = trainer().predict(module, datamodule=data)
    assert predictions is not None
    assert torch.cat([p["sample_index"] for p in predictions]).tolist() == list(range(10))
    logits = torch.cat([p["token_logits"] for p in predictions], dim=1)
    torch.testing.assert_close(logits, reference_logits(module.module, predict))
    with pytest.raises(ValueError, match=r"optimizer=None\) can only predict"):
        trainer(max_steps=1).fit(module, datamodule=data)
