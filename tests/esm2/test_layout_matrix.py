"""The layout matrix: the same global batch trains the same tiny ESM-2 on 1 process, DP 2, TP 2, PP 2 and CP 2.

Every layout runs in real gloo processes (see :mod:`support.layout_matrix` for what stands in for megatron's
CUDA-only schedule and DDP) and is compared with one process: the per-step training loss, the validation loss,
the exported whole weights and the predicted logits.
"""

import lightning.pytorch as pl
import pytest
import torch

from bionemo.esm2.checkpoints.weights import unpadded
from support.distributed import run_distributed
from support.layout_matrix import STEPS, initial_weights, train_worker

pytestmark = pytest.mark.multiprocess

LAYOUTS = {"dp2": {}, "tp2": {"tp": 2}, "pp2": {"pp": 2}, "cp2": {"cp": 2}}


@pytest.fixture(scope="module")
def start() -> dict[str, torch.Tensor]:
    return unpadded(initial_weights(), 33)


@pytest.fixture(scope="module")
def one_process(start):
    (result,) = run_distributed(train_worker, 1, {}, start)
    return result


def test_one_process_learns(one_process):
    losses = one_process["losses"]
    assert len(losses) == STEPS
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_layout_trains_as_one_process(layout, start, one_process):
    results = run_distributed(train_worker, 2, LAYOUTS[layout], start)
    assert_trains_as_one_process(results, one_process)


@pytest.mark.parametrize("layout", ["dp2", "tp2"])
def test_layout_trains_unpadded_as_one_process_padded(layout, start, one_process):
    """Where GPUs run padded batches on their real tokens (one pipeline stage, no CP), the same training.

    One process unpadded against padded: tests/esm2/test_unpadded_training.py.
    """
    results = run_distributed(train_worker, 2, {**LAYOUTS[layout], "unpadded": True}, start)
    assert one_process["unpadded"] == 0
    assert all(result["unpadded"] > 0 for result in results)  # the path under test ran on every rank
    assert_trains_as_one_process(results, one_process)


def assert_trains_as_one_process(results: list[dict], one_process: dict) -> None:
    expected_weights = unpadded(one_process["weights"], 33)
    for rank, result in enumerate(results):
        assert result["losses"] == pytest.approx(one_process["losses"], rel=2e-4), rank
        assert result["val_loss"] == pytest.approx(one_process["val_loss"], rel=2e-4), rank
        weights = unpadded(result["weights"], 33)
        assert weights.keys() == expected_weights.keys(), rank
        for name, value in expected_weights.items():
            assert (weights[name] - value).abs().mean() < 1e-5, (rank, name)
        if result["last_stage"]:
            torch.testing.assert_close(result["logits"], one_process["logits"], rtol=1e-4, atol=1e-4)
    assert any(result["last_stage"] for result in results)


class StepLoss(pl.Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_megatron_reduce_microbatches_end(self, step, reduced):
        self.losses.append(float(reduced))


def test_one_process_is_what_the_lightning_module_trains(start, one_process):
    """The stand-in loop's one process against BionemoLightningModule under a Lightning Trainer (CPU)."""
    import functools

    from megatron.core.optimizer import OptimizerConfig

    from bionemo.esm2.checkpoints.weights import apply_weights, full_state_dict
    from bionemo.esm2.data import MaskedProteinDataset, collate_proteins, training_data_step
    from bionemo.esm2.model.steps import forward_step
    from bionemo.esm2.tokenizer import ProteinTokenizer
    from bionemo.lightning import BionemoLightningModule, MegatronDataModule, MegatronOptimizerModule
    from support.layout_matrix import GLOBAL, LR, MICRO, SEQUENCES, config, records

    optimizer = MegatronOptimizerModule(
        config=OptimizerConfig(optimizer="adam", lr=LR, weight_decay=0.01, clip_grad=0.0)
    )
    module = BionemoLightningModule(
        config(),
        forward_step=forward_step,
        data_step=training_data_step,
        optimizer=optimizer,
        model_transform=functools.partial(apply_weights, tensors=start),
    )
    tokenizer = ProteinTokenizer()
    data = MegatronDataModule(
        train=MaskedProteinDataset(records(SEQUENCES, 1), tokenizer, seed=0, length=STEPS * GLOBAL),
        micro_batch_size=MICRO,
        global_batch_size=GLOBAL,
        seq_length=40,
        collate_fn=functools.partial(collate_proteins, pad_id=tokenizer.pad_id),
    )
    recorder = StepLoss()
    trainer = pl.Trainer(
        accelerator="cpu", max_steps=STEPS, limit_val_batches=0, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[recorder],
    )  # fmt: skip
    trainer.fit(module, datamodule=data)
    assert recorder.losses == pytest.approx(one_process["losses"], rel=2e-5)
    trained = unpadded(full_state_dict(module.unwrapped_module()), 33)
    for name, value in unpadded(one_process["weights"], 33).items():
        assert (trained[name] - value).abs().mean() < 1e-6, name
