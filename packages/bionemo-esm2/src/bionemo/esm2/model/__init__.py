"""The ESM-2 network on megatron-core: the model, its contact head, unpadded batches, pipeline stages, forward steps.

:mod:`.esm2` is the model (``ESM2Config``, ``ESM2Model``), :mod:`.contacts` the contact head over its attention
maps, :mod:`.packing` the unpadded (packed) batches, :mod:`.pipeline` the whole-model names of a pipeline stage's
tensors, :mod:`.masked_copies` the pseudo-perplexity's copies per forward pass and :mod:`.steps` the forward steps
of training and prediction. Importing this package imports neither torch nor megatron-core: the names of
:mod:`.esm2` are loaded on first use.
"""

from typing import TYPE_CHECKING

from bionemo.core.lazy_exports import lazy_exports
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


__getattr__ = lazy_exports(__name__, {"esm2": _LAZY})
