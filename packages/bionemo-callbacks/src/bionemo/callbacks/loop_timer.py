"""Seconds spent inside a prediction loop, without start-up (process groups, model build, weights) or clean-up."""

import time

import lightning.pytorch as pl
import torch
from typing_extensions import override

__all__ = ["LoopTimer"]


class LoopTimer(pl.Callback):
    """Times ``trainer.predict``'s loop: from ``on_predict_start`` to ``on_predict_end``.

    At both ends CUDA is synchronized and every rank waits for the others, so the time covers the slowest rank.
    ``seconds`` is ``None`` until a loop has ended.
    """

    def __init__(self) -> None:
        super().__init__()
        self.seconds: float | None = None
        self._start = 0.0

    @override
    def on_predict_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        _synchronize()
        trainer.strategy.barrier("loop_timer_start")
        self._start = time.perf_counter()

    @override
    def on_predict_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        _synchronize()
        trainer.strategy.barrier("loop_timer_end")
        self.seconds = time.perf_counter() - self._start


def _synchronize() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
