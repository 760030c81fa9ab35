"""The fine-tuning forward step (a ``ForwardStep``): the head's logits of a labelled batch."""

from typing import Any

import torch

from bionemo.losses import ParallelGroups

__all__ = ["finetune_forward_step"]


def finetune_forward_step(model: Any, batch: dict[str, Any]) -> dict[str, torch.Tensor] | torch.Tensor:
    """``{"logits": ...}`` of an :class:`~bionemo.esm2.finetune.model.ESM2FinetuneModel` on a collated batch.

    ``batch`` is :func:`bionemo.esm2.finetune.data.collate_labelled`'s after :func:`bionemo.esm2.data.data_step`
    (``padding`` is the attention mask, or None when no row is padded). On a pipeline stage before the last: the
    stage's output tensor, which megatron's schedule sends on.
    """
    output = model(batch["tokens"], batch.get("padding"), residue_mask=batch["residue_mask"])
    return {"logits": output} if ParallelGroups.current().is_last_stage else output
