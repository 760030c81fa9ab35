"""The module fits a real megatron-core GPT under Lightning on one CPU process."""

import math

import lightning.pytorch as pl
import pytest
import torch

from bionemo.callbacks import PerplexityLoggingCallback, PredictionWriter, merge_predictions
from bionemo.lightning import MegatronDataModule
from support.reference import reference_logits, reference_mean_loss
from support.tiny_gpt import BigramDataset, LossRecorder, make_module


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    torch.manual_seed(0)
    module = make_module()
    val = BigramDataset(16, 16, 32, seed=2)
    predict = BigramDataset(21, 16, 32, seed=3, labels=False)
    datamodule = MegatronDataModule(
        train=BigramDataset(512, 16, 32, seed=1), val=val, predict=predict, micro_batch_size=8, seq_length=16
    )
    recorder = LossRecorder()
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=40,
        val_check_interval=20,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        callbacks=[recorder, PerplexityLoggingCallback(log_train=True)],
    )
    trainer.fit(module, datamodule=datamodule)
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    out_dir = tmp_path_factory.mktemp("predictions")
    predictions = trainer.predict(module, datamodule=datamodule)
    writer_trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        callbacks=[PredictionWriter(out_dir, "batch")],
    )
    writer_trainer.predict(module, datamodule=datamodule, return_predictions=False)
    return {
        "module": module,
        "metrics": metrics,
        "losses": recorder.losses,
        "val": val,
        "predict": predict,
        "predictions": predictions,
        "out_dir": out_dir,
    }


def test_loss_falls(trained):
    losses = trained["losses"]
    assert len(losses) == 40
    assert losses[0] > math.log(32) - 0.3  # starts near uniform over the vocabulary
    assert sum(losses[-5:]) / 5 < 0.6 * sum(losses[:5]) / 5


def test_val_ppl_is_exp_of_reference_mean_loss(trained):
    metrics = trained["metrics"]
    expected = math.exp(reference_mean_loss(trained["module"].module, trained["val"]))
    assert float(metrics["val_ppl"]) == pytest.approx(expected, rel=1e-4)
    assert float(metrics["val_loss"]) == pytest.approx(math.log(expected), rel=1e-4)
    assert "train_ppl" in metrics


def test_predict_returns_outputs_in_input_order(trained):
    predictions = trained["predictions"]
    index = torch.cat([p["sample_index"] for p in predictions])
    assert index.tolist() == list(range(21))
    logits = torch.cat([p["token_logits"] for p in predictions], dim=1)
    torch.testing.assert_close(logits, reference_logits(trained["module"].module, trained["predict"]))


def test_writer_files_merge_back_to_input_order(trained):
    files = sorted(p.name for p in trained["out_dir"].iterdir())
    assert files == [f"predictions_rank0_batch{i}.safetensors" for i in range(3)]
    merged = merge_predictions(trained["out_dir"])
    assert merged["sample_index"].tolist() == list(range(21))
    torch.testing.assert_close(merged["token_logits"], reference_logits(trained["module"].module, trained["predict"]))


@pytest.mark.parametrize("pin_memory", [False, True])
def test_loader_options_reach_the_dataloaders(pin_memory):
    datamodule = MegatronDataModule(
        val=BigramDataset(8, 16, 32, seed=0),
        micro_batch_size=4,
        seq_length=16,
        num_workers=0,
        pin_memory=pin_memory,
    )
    loader = datamodule.val_dataloader()
    assert (loader.pin_memory, loader.num_workers, loader.batch_size) == (pin_memory, 0, 4)
