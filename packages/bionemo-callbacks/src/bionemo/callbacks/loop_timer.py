"""Seconds spent inside a prediction loop, and apart from it the set-up before it (model build, weights, device)."""

import time
from typing import Any

import lightning.pytorch as pl
import torch
from typing_extensions import override

__all__ = ["LoopTimer"]


class LoopTimer(pl.Callback):
    """Times ``trainer.predict``'s loop: from ``on_predict_start`` to ``on_predict_end``.

    At both ends CUDA is synchronized and every rank waits for the others, so the time covers the slowest rank.
    ``seconds`` is ``None`` until a loop has ended. ``first_batch_seconds``: from the start to the end of this
    rank's first batch (CUDA synchronized once more there), the part of the loop that pays one-time costs (data
    workers starting, first kernel launches and compilations); ``None`` before it. ``setup_seconds``: from the
    Trainer's ``setup`` hook (its environment, e.g. process groups and the CUDA device, already set up) to the
    loop's start, i.e. the model's build, its weights, the move to the device and the loader; ``setup_at``: the
    ``time.perf_counter()`` of that hook, for a caller timing what came before it.
    """

    def __init__(self) -> None:
        super().__init__()
        self.seconds: float | None = None
        self.first_batch_seconds: float | None = None
        self.setup_seconds: float | None = None
        self.setup_at: float | None = None
        self._start = 0.0

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.setup_at = time.perf_counter()

    @override
    def on_predict_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        _synchronize()
        trainer.strategy.barrier("loop_timer_start")
        self._start = time.perf_counter()
        self.first_batch_seconds = None
        self.setup_seconds = None if self.setup_at is None else self._start - self.setup_at

    @override
    def on_predict_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:  # fmt: skip
        if self.first_batch_seconds is None:
            _synchronize()
            self.first_batch_seconds = time.perf_counter() - self._start

    @override
    def on_predict_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        _synchronize()
        trainer.strategy.barrier("loop_timer_end")
        self.seconds = time.perf_counter() - self._start


def _synchronize() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
