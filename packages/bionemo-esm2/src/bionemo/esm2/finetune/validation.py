"""Validation metrics of a fine-tuning run, logged once per validation from the loss reduction's outputs."""

from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
from typing_extensions import override

from bionemo.esm2.finetune.metric_names import BEST_METRIC
from bionemo.esm2.finetune.metrics import TaskMetrics
from bionemo.esm2.finetune.tasks import Task

__all__ = ["ValidationMetrics"]


class ValidationMetrics(pl.Callback):
    """Log the task's metrics (:mod:`bionemo.esm2.finetune.metrics`) at the end of every validation.

    Each validation micro-batch's reduced output (:class:`~bionemo.esm2.finetune.reduction.FinetuneLossReduction`
    with ``validation_step=True``) carries the head's logits, targets and mask; they are added to the metrics in the
    ``on_megatron_reduce_microbatches_end`` hook (fired under MegatronStrategy and, by ``BionemoLightningModule``,
    under Lightning's strategies). At the epoch's end the metrics are gathered over every process (a collective) and
    logged with the same value on every rank; ``shown`` (default: the task's :data:`BEST_METRIC`) is shown in the
    progress bar. Sanity-check validation is not counted.
    """

    def __init__(self, task: Task, num_outputs: int, shown: str | None = None) -> None:
        super().__init__()
        self.task = Task(task)
        self.shown = shown or BEST_METRIC[self.task].key
        self.num_outputs = num_outputs
        self.metrics = TaskMetrics(self.task, num_outputs)
        self._updated = False

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.metrics.to(trainer.strategy.root_device)

    @override
    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.metrics.reset()
        self._updated = False

    def on_megatron_reduce_microbatches_end(
        self, step: Any, microbatch_outputs: Sequence[Any], loss_reduction: Any, reduced: Any
    ) -> None:
        """Add one validation step's micro-batches to the metrics."""
        trainer = step.trainer
        if trainer.sanity_checking or not trainer.validating:
            return
        for out in microbatch_outputs:
            self.metrics.update(out["logits"], out["target"], out["target_mask"] if self.task.per_residue else None)
            self._updated = True

    @override
    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or not self._updated:
            return
        for name, value in self.metrics.compute().items():
            pl_module.log(name, value, prog_bar=name == self.shown, batch_size=1, rank_zero_only=False)
        self.metrics.reset()
