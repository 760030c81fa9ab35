"""Training speed: the wall time of a run's optimizer steps after a warm-up; validation and saves left out."""

import time
from typing import Any

import lightning.pytorch as pl
import torch
from typing_extensions import override

__all__ = ["StepTimer"]


class StepTimer(pl.Callback):
    """Times the optimizer steps after the first ``skip``, leaving out validation and checkpoint saves.

    The first ``skip`` steps hold one-time costs (compilation, allocator warm-up).
    The clock stops at the end of every ``pause_every``-th step (before the checkpoint callbacks, which Lightning
    runs last, save) and at each validation's start, and starts again at the next training batch. The device is
    synchronised only where a span starts or ends, so the steps between run as they would untimed. :attr:`spans`
    and :attr:`seconds` cover the timed steps; :attr:`peak_memory_bytes` is the device's peak allocation over the run
    (CUDA only).
    """

    def __init__(self, skip: int = 3, pause_every: int | None = None) -> None:
        super().__init__()
        self.skip = skip
        self.pause_every = pause_every
        self.spans: list[tuple[int, int]] = []
        """Timed runs of optimizer steps, ``(first, end)``: steps ``first .. end - 1``."""
        self.seconds = 0.0
        self.peak_memory_bytes: int | None = None
        self._since: float | None = None
        self._since_step = 0

    def _now(self, trainer: pl.Trainer) -> float:
        if trainer.strategy.root_device.type == "cuda":
            torch.cuda.synchronize(trainer.strategy.root_device)
        return time.perf_counter()

    def _stop(self, trainer: pl.Trainer) -> None:
        if self._since is not None:
            self.seconds += self._now(trainer) - self._since
            if trainer.global_step > self._since_step:
                self.spans.append((self._since_step, trainer.global_step))
            self._since = None

    def _start(self, trainer: pl.Trainer) -> None:
        self._since, self._since_step = self._now(trainer), trainer.global_step

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.strategy.root_device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(trainer.strategy.root_device)

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._since is None and trainer.global_step >= self.skip:
            self._start(trainer)

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.pause_every and trainer.global_step % self.pause_every == 0:
            self._stop(trainer)

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._stop(trainer)

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._stop(trainer)
        if trainer.strategy.root_device.type == "cuda":
            self.peak_memory_bytes = torch.cuda.max_memory_allocated(trainer.strategy.root_device)

    @property
    def steps(self) -> int:
        """Optimizer steps timed."""
        return sum(end - first for first, end in self.spans)
