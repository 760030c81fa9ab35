"""The optimizer step and seed that key the head's dropout masks, set before every training batch."""

from typing import Any

import lightning.pytorch as pl
from typing_extensions import override

from bionemo.layers.keyed_dropout import KeyedDropout

__all__ = ["KeyedDropoutSteps"]


class KeyedDropoutSteps(pl.Callback):
    """Before each training batch, tell every :class:`~bionemo.layers.KeyedDropout` the step and the run's seed.

    The masks then depend on (seed, optimizer step, sample, element) only: every micro-batch of one step, on any
    rank, draws a sample's mask as one process would (:mod:`bionemo.layers.keyed_dropout`). The dropout modules
    are found once, at train start (the model is built by then), not on every batch.
    """

    def __init__(self, seed: int) -> None:
        """Key the masks by ``seed`` (the run's ``--seed``)."""
        super().__init__()
        self.seed = seed
        self._dropouts: list[KeyedDropout] = []

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._dropouts = [module for module in pl_module.modules() if isinstance(module, KeyedDropout)]
        for dropout in self._dropouts:
            dropout.seed = self.seed

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        for dropout in self._dropouts:
            dropout.step = trainer.global_step
