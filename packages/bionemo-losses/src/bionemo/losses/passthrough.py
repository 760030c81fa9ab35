"""A loss reduction for prediction: no loss, the model's outputs handed through and collated."""

from collections.abc import Sequence
from typing import Any, Generic

import torch

from bionemo.collate import batch_collator
from bionemo.core import DataT, get_dtype_device
from bionemo.losses.reduction import LossReduction

__all__ = ["PassthroughLossReduction"]


class PassthroughLossReduction(LossReduction, Generic[DataT]):
    """Hands the forward output through unchanged and collates it over micro-batches.

    NeMo's ``MegatronStrategy`` always runs a loss reduction after the forward step. For prediction that
    reduction is this one: ``forward`` returns a zero loss plus the forward output untouched, and
    ``reduce`` joins the per-micro-batch outputs with :func:`bionemo.collate.batch_collator`, so
    ``trainer.predict`` receives one batch per step. Outputs may be a tensor or a dict / tuple / list of
    tensors (nested).
    """

    def forward(self, batch: Any, forward_out: DataT | None) -> tuple[torch.Tensor, DataT | None]:  # type: ignore[override]
        """Return ``(zeros(1), forward_out)``; ``batch`` is not used.

        The zero loss has the dtype and device of the first tensor in ``forward_out`` (CPU float32 when the
        output is ``None``, i.e. an empty micro-batch).
        """
        if forward_out is None:
            return torch.zeros(1), None
        dtype, device = get_dtype_device(forward_out)
        return torch.zeros(1, dtype=dtype, device=device), forward_out

    def reduce(self, losses_reduced_per_micro_batch: Sequence[DataT | None]) -> DataT | None:  # type: ignore[override]
        """Collate the micro-batch outputs into one batch (see :func:`batch_collator`); ``None`` if all are empty."""
        outputs = [out for out in losses_reduced_per_micro_batch if out is not None]
        return batch_collator(outputs) if outputs else None
