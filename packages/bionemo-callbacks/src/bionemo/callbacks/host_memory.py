"""Give freed host memory back to the operating system while predicting (glibc's ``malloc_trim``)."""

import ctypes
import ctypes.util
import functools
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
from typing_extensions import override

__all__ = ["HostMemoryTrim"]


class HostMemoryTrim(pl.Callback):
    """After every ``every_n_batches`` predict batches, return freed heap memory to the OS.

    glibc keeps memory freed by PyTorch's CPU tensors in its heap. With batches of varying shape (length-sorted
    prediction) the heap fragments and the resident set grows with the number of batches, not the batch size.
    Trimming every few batches takes back part of that growth at no measurable cost; trimming after every batch
    takes back more but costs time (docs/benchmarks.md#prediction-host-memory). Does nothing where the C library
    has no ``malloc_trim`` (not glibc).
    """

    def __init__(self, every_n_batches: int = 1) -> None:
        super().__init__()
        self.every_n_batches = max(1, every_n_batches)

    @override
    def on_predict_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        trim = _malloc_trim()
        if trim is not None and (batch_idx + 1) % self.every_n_batches == 0:
            trim(0)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None
