"""The training progress bar: optimizer steps out of ``max_steps``, not batches of an epoch.

Imports Lightning (and needs ``rich`` at run time, as Lightning's RichProgressBar does): import this module
inside commands, not at ``bionemo --help`` time.
"""

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import RichProgressBar
from typing_extensions import override

__all__ = ["StepProgressBar"]

_TRAIN_DESCRIPTION = "Training step"


class StepProgressBar(RichProgressBar):
    """Lightning's RichProgressBar whose training bar counts optimizer steps out of ``trainer.max_steps``.

    Lightning's training bar counts the current epoch's batches under ``Epoch <e>/<max_epochs - 1>``: for a run
    bounded by ``max_steps`` alone (``max_epochs=-1``) that reads ``Epoch 0/-2``, and a resumed run's bar starts
    again from 0. This bar reads ``Training step  <global step>/<max_steps>`` and a resumed run's bar starts at
    the step it resumed from. Without ``max_steps`` it is Lightning's bar; validation bars are Lightning's.
    """

    def _by_step(self) -> bool:
        return self.trainer.max_steps > 0

    @property
    @override
    def total_train_batches(self) -> int | float:
        return self.trainer.max_steps if self._by_step() else super().total_train_batches

    @property
    @override
    def validation_description(self) -> str:
        # as wide as the training bar's description, so that the bars line up
        description = super().validation_description
        return f"{description:{len(_TRAIN_DESCRIPTION)}}" if self._by_step() else description

    @override
    def _get_train_description(self, current_epoch: int) -> str:
        return _TRAIN_DESCRIPTION if self._by_step() else super()._get_train_description(current_epoch)

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_epoch_start(trainer, pl_module)
        if self._by_step():
            self._show_step(trainer.global_step)

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not self._by_step():
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
            return
        step = trainer.global_step
        if step % self.refresh_rate == 0 or step >= trainer.max_steps:
            self._show_step(step)
        self._update_metrics(trainer, pl_module)
        self.refresh()

    def _show_step(self, step: int) -> None:
        if self.progress is not None and self.is_enabled and self.train_progress_bar_id is not None:
            self.progress.update(self.train_progress_bar_id, completed=step)
            self.refresh()
