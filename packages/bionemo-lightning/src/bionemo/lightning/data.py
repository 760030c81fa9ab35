"""A datamodule that serves map-style datasets under MegatronStrategy and Lightning's own strategies alike."""

import functools
import gc
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, Dataset, default_collate
from typing_extensions import override

from bionemo.lightning.batch_limits import scale_limits_to_steps
from bionemo.lightning.global_batches import BatchLayout
from bionemo.lightning.step_runner import step_runner_for

__all__ = ["MegatronDataModule"]


class MegatronDataModule(pl.LightningDataModule):
    """Train / validation / test / predict datasets with megatron's micro-batch and global-batch sizes.

    Under ``MegatronStrategy`` its ``data_sampler`` (a NeMo ``MegatronDataSampler``, built when the strategy
    first asks for it) sets the micro-batches per step and shards the data over data-parallel ranks;
    dataloaders are NeMo ``WrappedDataLoader``s whose mode decides ``drop_last`` (train/validation) and keeps
    every predict sample. Int ``limit_*_batches`` and ``num_sanity_val_steps`` are counted in steps, as with
    plain Lightning (NeMo counts micro-batches). Under Lightning's own strategies the same loaders are ordinary
    DataLoaders of ``micro_batch_size``, and NeMo is not imported; training takes the same global batches
    (:mod:`bionemo.lightning.global_batches`): each rank's share of every step's samples through a
    :class:`GlobalBatchSampler`, with the Trainer's ``accumulate_grad_batches`` set to the micro-batches per step.
    On every strategy a short last global batch of an epoch is dropped, and a resumed run continues at the next
    step's samples.

    Predict batches keep input order within each rank; to merge ranks back into input order, give every
    sample its position (e.g. ``sample_index``) and use :class:`bionemo.callbacks.PredictionWriter`.

    Args:
        train: Training dataset, or ``None``.
        val: Validation dataset, or ``None``.
        test: Test dataset, or ``None``.
        predict: Prediction dataset, or ``None``.
        micro_batch_size: Samples per micro-batch (per data-parallel rank).
        global_batch_size: Samples per optimizer step over all data-parallel ranks, on every strategy; a
            multiple of ``micro_batch_size`` times the data-parallel size. ``None`` means ``micro_batch_size``
            times the data-parallel size (one micro-batch per rank per step).
        seq_length: Sequence length megatron's pipeline schedule uses for its buffers.
        num_workers: DataLoader worker processes (forked; with CUDA initialized, garbage is collected first).
        pin_memory: Collate into page-locked host memory, so that copies to the GPU are asynchronous.
        collate_fn: Batch collate function (default: torch's ``default_collate``).
        shuffle_train: Shuffle the training data (megatron's random sampler under MegatronStrategy; a permutation
            per epoch drawn from ``seed`` and the epoch under Lightning's strategies).
        seed: Seed of the training order when ``shuffle_train`` (Lightning's strategies).
        log_sampler_metrics: Let NeMo's data sampler log ``consumed_samples`` and ``global_batch_size`` after
            every training step under MegatronStrategy, as NeMo does by default. Off here: each is a tensor
            copied to the GPU and a Lightning metric update on every step's critical path, and both follow from
            the step count (``consumed_samples = global_step * global_batch_size``).
    """

    def __init__(
        self,
        *,
        train: Dataset | None = None,
        val: Dataset | None = None,
        test: Dataset | None = None,
        predict: Dataset | None = None,
        micro_batch_size: int,
        global_batch_size: int | None = None,
        seq_length: int,
        num_workers: int = 0,
        pin_memory: bool = False,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        shuffle_train: bool = False,
        log_sampler_metrics: bool = False,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be at least 1, got {micro_batch_size}")
        if global_batch_size is not None and global_batch_size % micro_batch_size:
            raise ValueError(
                f"global_batch_size={global_batch_size} must be a multiple of micro_batch_size={micro_batch_size}"
            )
        self.datasets = {"train": train, "validation": val, "test": test, "predict": predict}
        self.micro_batch_size = micro_batch_size
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.collate_fn = collate_fn
        self.shuffle_train = shuffle_train
        self.log_sampler_metrics = log_sampler_metrics
        self.seq_length = seq_length
        self.seed = seed
        self.requested_global_batch_size = global_batch_size
        """The ``global_batch_size`` given (``None``: one micro-batch per data-parallel rank per step)."""
        self._data_sampler: Any = None

    def batch_layout(self, data_parallel_size: int) -> BatchLayout:
        """The training steps' :class:`BatchLayout` over ``data_parallel_size`` ranks.

        Raises:
            ValueError: A global batch size that is not a multiple of micro-batch size x data-parallel size.
        """
        global_batch = self.requested_global_batch_size or self.micro_batch_size * data_parallel_size
        return BatchLayout(
            micro_batch_size=self.micro_batch_size,
            global_batch_size=global_batch,
            data_parallel_size=data_parallel_size,
        )

    @property
    def global_batch_size(self) -> int:
        """Samples per training step over all data-parallel ranks (of the attached trainer's layout)."""
        return self.batch_layout(self._data_parallel_size()).global_batch_size

    def _data_parallel_size(self) -> int:
        """Model replicas of the attached trainer (1 without one)."""
        return 1 if self.trainer is None else step_runner_for(self.trainer).data_parallel_size(self.trainer)

    @property
    def data_sampler(self) -> Any:
        """The NeMo ``MegatronDataSampler`` that MegatronStrategy reads in its set-up, built on first use.

        NeMo's ``setup_data_sampler`` takes it from here, or sets the strategy's own here instead.
        """
        if self._data_sampler is None:
            from bionemo.lightning._nemo import MegatronDataSampler

            self._data_sampler = MegatronDataSampler(
                seq_len=self.seq_length,
                micro_batch_size=self.micro_batch_size,
                global_batch_size=self.global_batch_size,
                dataloader_type="cyclic" if self.shuffle_train else "single",
                output_log=self.log_sampler_metrics,
            )
        return self._data_sampler

    @data_sampler.setter
    def data_sampler(self, sampler: Any) -> None:
        self._data_sampler = sampler

    @override
    def setup(self, stage: str) -> None:
        """Check the batch sizes against the trainer's layout; set the micro-batches per step.

        Under MegatronStrategy a step consumes ``global / (micro x data-parallel)`` micro-batches; in
        prediction the last step would come up short and its samples would be lost, so prediction runs one
        micro-batch per data-parallel rank per step. Under Lightning's own strategies training accumulates that
        many micro-batches per step (the Trainer's ``accumulate_grad_batches``).

        Raises:
            ValueError: Batch sizes that make no whole global batch on this layout, or a Trainer's own
                ``accumulate_grad_batches`` that disagrees with them.
        """
        trainer = self.trainer
        if trainer is not None:
            step_runner_for(trainer).setup_data(self, trainer, stage, self.batch_layout(self._data_parallel_size()))

    def _loader(self, mode: str) -> DataLoader:
        dataset = self.datasets[mode]
        if dataset is None:
            raise ValueError(f"MegatronDataModule has no {mode} dataset; pass {mode.replace('validation', 'val')}=")
        if self.num_workers > 0 and torch.cuda.is_initialized():
            # forked workers inherit uncollected garbage; a CUDA tensor among it, freed in a worker, kills the
            # worker with a CUDA initialization error (predicting in the process that trained, say)
            gc.collect()
        runner = step_runner_for(self.trainer)
        sampler = None
        if mode == "train" and self.trainer is not None:
            layout = self.batch_layout(self._data_parallel_size())
            size = len(dataset)  # type: ignore[arg-type]
            sampler = runner.train_sampler(self.trainer, size, layout, shuffle=self.shuffle_train, seed=self.seed)
        loader = runner.dataloader(mode)
        return loader(
            dataset=dataset,
            batch_size=self.micro_batch_size,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            collate_fn=functools.partial(_collate_or_none, self.collate_fn or default_collate),
            shuffle=self.shuffle_train and mode == "train" and sampler is None,
            sampler=sampler,
            persistent_workers=False,
        )

    @override
    def train_dataloader(self) -> Any:
        return self._loader("train")

    @override
    def val_dataloader(self) -> Any:
        return self._loader("validation")

    @override
    def test_dataloader(self) -> Any:
        return self._loader("test")

    @override
    def predict_dataloader(self) -> Any:
        return self._loader("predict")

    def reconfigure_limit_batches(self) -> None:
        """NeMo hook (called by MegatronStrategy's set-up): count int batch limits in steps, not micro-batches."""
        if self.trainer is not None:
            from megatron.core.num_microbatches_calculator import get_num_microbatches

            scale_limits_to_steps(
                self.trainer,
                ("limit_val_batches", "limit_test_batches", "num_sanity_val_steps"),
                get_num_microbatches(),
            )


def _collate_or_none(collate: Callable[[list[Any]], Any], samples: list[Any]) -> Any:
    """Collate ``samples``; ``None`` for none (a rank's empty share of the last, partial predict batch)."""
    return collate(samples) if samples else None
