"""Collation of batched model outputs across micro-batches and data-parallel ranks."""

from bionemo.collate.batch_collator import batch_collator
from bionemo.collate.padding import DEFAULT_BATCH_DIMS, DEFAULT_PAD_VALUES, DEFAULT_SEQ_DIMS, concat_padded

__all__ = [
    "DEFAULT_BATCH_DIMS",
    "DEFAULT_PAD_VALUES",
    "DEFAULT_SEQ_DIMS",
    "batch_collator",
    "concat_padded",
]
