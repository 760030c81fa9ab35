"""The ESM-2 network on megatron-core: the model, its contact head, unpadded batches, pipeline stages, forward steps.

:mod:`.esm2` is the model (``ESM2Config``, ``ESM2Model``), :mod:`.contacts` the contact head over its attention
maps, :mod:`.packing` the unpadded (packed) batches, :mod:`.pipeline` the whole-model names of a pipeline stage's
tensors, :mod:`.masked_copies` the pseudo-perplexity's copies per forward pass and :mod:`.steps` the forward steps
of training and prediction. Importing this package imports neither torch nor megatron-core: the names of
:mod:`.esm2` are loaded on first use.
"""

import importlib
from typing import TYPE_CHECKING, Any

from bionemo.esm2.hf.layout import padded_vocab_size

if TYPE_CHECKING:
    from bionemo.esm2.model.esm2 import (
        MASK_RATIO_TRAIN,
        AttentionMaps,
        ESM2Config,
        ESM2Model,
        attention_probabilities,
        vocab_logits,
    )

_LAZY = ("MASK_RATIO_TRAIN", "AttentionMaps", "ESM2Config", "ESM2Model", "attention_probabilities", "vocab_logits")

__all__ = [
    "MASK_RATIO_TRAIN",
    "AttentionMaps",
    "ESM2Config",
    "ESM2Model",
    "attention_probabilities",
    "padded_vocab_size",
    "vocab_logits",
]


def __getattr__(name: str) -> Any:
    """The megatron-core names (:mod:`.esm2`), imported on first use."""
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.esm2"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
