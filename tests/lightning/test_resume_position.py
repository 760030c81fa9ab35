"""A resumed run sees the batches an uninterrupted one would, in any epoch (a short last global batch is dropped)."""

import lightning.pytorch as pl
import pytest
import torch

from bionemo.lightning import MegatronDataModule
from support.tiny_gpt import BigramDataset, make_module


class SampleRecorder(pl.Callback):
    def __init__(self) -> None:
        self.seen: list[list[int]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.seen.append(batch["sample_index"].tolist())


def _fit(max_steps: int, ckpt_path=None, save_to=None) -> list[list[int]]:
    torch.manual_seed(0)
    recorder = SampleRecorder()
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=max_steps,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[recorder],
    )
    data = MegatronDataModule(train=BigramDataset(10, 8, 16, seed=1), micro_batch_size=4, seq_length=8)
    trainer.fit(make_module(), datamodule=data, ckpt_path=ckpt_path)
    if save_to is not None:
        trainer.save_checkpoint(save_to)
    return recorder.seen


@pytest.mark.parametrize("stop", [2, 3, 4, 5, 6])  # 10 samples, batches of 4: 2 steps per epoch (samples 8, 9 dropped)
def test_resume_in_a_later_epoch_continues_at_the_next_sample(tmp_path, stop):
    whole = _fit(9)
    first = _fit(stop, save_to=tmp_path / "mid.ckpt")
    rest = _fit(9, ckpt_path=tmp_path / "mid.ckpt")
    assert first == whole[:stop]
    assert rest == whole[stop:]
