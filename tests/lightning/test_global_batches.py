"""The same global batch trains the same model whatever the micro-batch size and the data-parallel size."""

import lightning.pytorch as pl
import pytest
import torch
import torch.nn.functional as F

from bionemo.core.batch_sizes import batch_size_problem
from bionemo.lightning import MegatronDataModule
from bionemo.lightning.global_batches import BatchLayout, GlobalBatchSampler
from support.tiny_gpt import BigramDataset, make_module


class RaggedLossMask(torch.utils.data.Dataset):
    """BigramDataset with a per-sample number of scored tokens (so micro-batches weigh differently)."""

    def __init__(self, n: int) -> None:
        self.inner = BigramDataset(n, 16, 32, seed=1)

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        item = dict(self.inner[i])
        mask = torch.zeros(16)
        mask[: 1 + (7 * i) % 16] = 1.0
        item["loss_mask"] = mask
        return item


class StepLosses(pl.Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []
        self.samples: list[list[int]] = []
        self._current: list[int] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._current += batch["sample_index"].tolist()

    def on_megatron_reduce_microbatches_end(self, step, microbatch_outputs, reduced):
        """Fired once per optimizer step, with every micro-batch of it."""
        assert len(microbatch_outputs) == step.num_microbatches
        self.losses.append(float(reduced))
        self.samples.append(sorted(self._current))
        self._current = []


def _fit(micro: int, global_batch: int | None, steps: int = 3, accumulate: int = 1):
    torch.manual_seed(0)
    recorder = StepLosses()
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accumulate_grad_batches=accumulate,
        callbacks=[recorder],
    )
    data = MegatronDataModule(
        train=RaggedLossMask(48), micro_batch_size=micro, global_batch_size=global_batch, seq_length=16
    )
    module = make_module(lr=1e-2)
    trainer.fit(module, datamodule=data)
    return recorder, {k: v.detach().clone() for k, v in module.module.state_dict().items() if v is not None}


def _first_step_loss(model_state, samples) -> float:
    """Token-weighted mean loss of the untrained model over the first global batch (plain torch)."""
    torch.manual_seed(0)
    module = make_module()
    module.configure_model()
    model = module.module
    data = RaggedLossMask(48)
    total, count = 0.0, 0.0
    with torch.no_grad():
        for i in samples:
            item = data[i]
            tokens = item["tokens"][None]
            logits = model(tokens, torch.arange(16)[None], None)[0]
            per_token = F.cross_entropy(logits.float(), item["labels"], reduction="none")
            total += float((per_token * item["loss_mask"]).sum())
            count += float(item["loss_mask"].sum())
    return total / count


def test_micro_batch_size_does_not_change_the_run():
    whole, whole_weights = _fit(micro=12, global_batch=12)
    assert whole.samples == [list(range(0, 12)), list(range(12, 24)), list(range(24, 36))]
    assert whole.losses[0] == pytest.approx(_first_step_loss(whole_weights, range(12)), rel=1e-5)
    for micro in (2, 3, 6):
        run, weights = _fit(micro=micro, global_batch=12)
        assert run.samples == whole.samples
        assert run.losses == pytest.approx(whole.losses, rel=2e-5)
        for name, value in weights.items():
            assert (value - whole_weights[name]).abs().mean() < 1e-5, name


def test_trainer_accumulation_that_disagrees_is_refused():
    with pytest.raises(ValueError, match=r"accumulate_grad_batches=3.*set global_batch_size instead"):
        _fit(micro=2, global_batch=8, accumulate=3)


def test_sampler_puts_each_step_on_the_same_samples_on_any_layout():
    def steps(micro: int, ranks: int, start: int = 0) -> list[list[int]]:
        layout = BatchLayout(micro_batch_size=micro, global_batch_size=8, data_parallel_size=ranks)
        per_rank = [list(GlobalBatchSampler(30, layout, rank=r, start_step=start)) for r in range(ranks)]
        per_step = 8 // ranks
        return [
            sorted(i for share in per_rank for i in share[s * per_step : (s + 1) * per_step])
            for s in range(len(per_rank[0]) // per_step)
        ]

    one = steps(8, 1)
    assert one == [list(range(0, 8)), list(range(8, 16)), list(range(16, 24))]  # 30 samples: 3 whole steps
    assert steps(2, 1) == one
    assert steps(2, 2) == one
    assert steps(1, 4) == one
    assert steps(2, 2, start=2) == one[2:]
    assert (
        len(
            GlobalBatchSampler(
                30, BatchLayout(micro_batch_size=2, global_batch_size=8, data_parallel_size=2), rank=1, start_step=2
            )
        )
        == 12
    )  # the whole epoch's count, also when resumed


def test_sampler_shuffles_by_epoch_alike_on_every_rank():
    layout = BatchLayout(micro_batch_size=2, global_batch_size=4, data_parallel_size=2)
    ranks = [GlobalBatchSampler(8, layout, rank=r, shuffle=True, seed=3) for r in range(2)]
    first = [list(s) for s in ranks]
    assert sorted(first[0] + first[1]) == list(range(8))
    for s in ranks:
        s.set_epoch(1)
    second = [list(s) for s in ranks]
    assert sorted(second[0] + second[1]) == list(range(8))
    assert second != first


@pytest.mark.parametrize(
    ("micro", "global_batch", "ranks", "expected"),
    [
        (
            5,
            16,
            1,
            "global batch size 16 is not a multiple of micro-batch size x data-parallel size = 5 x 1 = 5; "
            "valid global batch sizes: 5, 10, 15, ...; or a micro-batch size of 1, 2, 4, 8, 16",
        ),
        (
            16,
            8,
            1,
            "global batch size 8 is not a multiple of micro-batch size x data-parallel size = 16 x 1 = 16; "
            "valid global batch sizes: 16, 32, 48, ...; or a micro-batch size of 1, 2, 4, 8",
        ),
        (
            4,
            4,
            2,
            "global batch size 4 is not a multiple of micro-batch size x data-parallel size = 4 x 2 = 8; "
            "valid global batch sizes: 8, 16, 24, ...; or a micro-batch size of 1, 2",
        ),
    ],
)
def test_inconsistent_batch_sizes_name_the_valid_ones(micro, global_batch, ranks, expected):
    assert batch_size_problem(micro, global_batch, ranks) == expected
    with pytest.raises(ValueError, match="valid global batch sizes"):
        BatchLayout(micro_batch_size=micro, global_batch_size=global_batch, data_parallel_size=ranks)
    assert batch_size_problem(4, 16, 2) is None


def test_validation_interval_counts_optimizer_steps_while_accumulating():
    class ValidationSteps(pl.Callback):
        def __init__(self) -> None:
            self.at: list[int] = []

        def on_validation_end(self, trainer, pl_module):
            self.at.append(trainer.global_step)

    seen = ValidationSteps()
    trainer = pl.Trainer(
        accelerator="cpu",
        max_steps=4,
        val_check_interval=2,
        check_val_every_n_epoch=None,
        limit_val_batches=1,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[seen],
    )
    data = MegatronDataModule(
        train=RaggedLossMask(48), val=RaggedLossMask(8), micro_batch_size=2, global_batch_size=8, seq_length=16
    )
    trainer.fit(make_module(), datamodule=data)
    assert seen.at == [2, 4]


def test_resuming_a_mid_epoch_checkpoint_keeps_the_steps_whole(tmp_path):
    """A checkpoint saved after a step's last micro-batch resumes at the next step's first micro-batch."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    def fit(max_steps: int, ckpt_path=None) -> StepLosses:
        torch.manual_seed(0)
        recorder = StepLosses()
        saver = ModelCheckpoint(dirpath=tmp_path, filename="step{step}", every_n_train_steps=2, save_top_k=-1)
        trainer = pl.Trainer(
            accelerator="cpu", max_steps=max_steps, limit_val_batches=0, logger=False, enable_progress_bar=False,
            enable_model_summary=False, callbacks=[recorder, saver],
        )  # fmt: skip
        data = MegatronDataModule(train=RaggedLossMask(48), micro_batch_size=2, global_batch_size=8, seq_length=16)
        trainer.fit(make_module(lr=1e-2), datamodule=data, ckpt_path=ckpt_path)
        return recorder

    whole = fit(4)
    (mid,) = tmp_path.glob("step*2.ckpt")
    rest = fit(4, ckpt_path=mid)
    assert rest.samples == whole.samples[2:]
    assert rest.losses == pytest.approx(whole.losses[2:], rel=1e-5)
