"""The fine-tuning forward step (a ``ForwardStep``): the head's logits of a labelled batch."""

from typing import Any

import torch

from bionemo.esm2.model.steps import runs_unpadded
from bionemo.losses import ParallelGroups

__all__ = ["finetune_forward_step", "runs_unpadded"]


def finetune_forward_step(model: Any, batch: dict[str, Any]) -> dict[str, torch.Tensor] | torch.Tensor:
    """``{"logits": ...}`` of an :class:`~bionemo.esm2.finetune.model.ESM2FinetuneModel` on a collated batch.

    ``batch`` is :func:`bionemo.esm2.finetune.data.collate_labelled`'s after :func:`bionemo.esm2.data.mlm.data_step`
    (``padding`` is the attention mask, or None when no row is padded). Where :func:`runs_unpadded`, the model
    runs on the batch's real tokens concatenated (:func:`bionemo.esm2.model.packing.unpad`): the same logits without
    the padding's work. The batch's ``sample_index`` keys the head's dropout masks (the same on every layout).
    On a pipeline stage before the last: the stage's output tensor, which megatron's schedule
    sends on.
    """
    tokens = batch["tokens"]
    keys = {"sample_index": batch["sample_index"]} if "sample_index" in batch else {}
    if runs_unpadded(model, tokens):
        from bionemo.esm2.model.packing import unpad

        ids, sequences, index = unpad(tokens, batch["host_lengths"])
        output = model(ids, None, residue_mask=batch["residue_mask"], unpadded=sequences, index=index, **keys)
    else:
        output = model(tokens, batch.get("padding"), residue_mask=batch["residue_mask"], **keys)
    return {"logits": output} if ParallelGroups.current().is_last_stage else output
