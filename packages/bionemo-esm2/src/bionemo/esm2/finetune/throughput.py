"""Training speed of a fine-tuning run: wall time of its steps after a warm-up, validation excluded."""

import time
from typing import Any

import lightning.pytorch as pl
import torch
from typing_extensions import override

__all__ = ["StepTimer"]


class StepTimer(pl.Callback):
    """Times the optimizer steps after the first ``skip`` (compilation, allocator warm-up), validations left out.

    The device is synchronised only where a span starts or ends (the first timed step, each validation's start and
    end, the end of training), so the steps between run as they would untimed. :attr:`steps` and :attr:`seconds`
    cover optimizer steps ``first_step .. last_step``; :attr:`peak_memory_bytes` is the device's peak allocation
    over the run (CUDA only).
    """

    def __init__(self, skip: int = 3) -> None:
        super().__init__()
        self.skip = skip
        self.first_step: int | None = None
        self.last_step: int | None = None
        self.seconds = 0.0
        self.peak_memory_bytes: int | None = None
        self._since: float | None = None

    def _now(self, trainer: pl.Trainer) -> float:
        if trainer.strategy.root_device.type == "cuda":
            torch.cuda.synchronize(trainer.strategy.root_device)
        return time.perf_counter()

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.strategy.root_device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(trainer.strategy.root_device)

    @override
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        step = trainer.global_step
        if self.first_step is None and step >= self.skip:
            self.first_step, self._since = step, self._now(trainer)
        if self.first_step is not None:
            self.last_step = step

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._since is not None and not trainer.sanity_checking:
            self.seconds += self._now(trainer) - self._since
            self._since = None

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.first_step is not None and self._since is None and not trainer.sanity_checking:
            self._since = self._now(trainer)

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._since is not None:
            self.seconds += self._now(trainer) - self._since
            self._since = None
        if trainer.strategy.root_device.type == "cuda":
            self.peak_memory_bytes = torch.cuda.max_memory_allocated(trainer.strategy.root_device)

    @property
    def steps(self) -> int:
        """Optimizer steps timed."""
        if self.first_step is None or self.last_step is None:
            return 0
        return self.last_step - self.first_step
