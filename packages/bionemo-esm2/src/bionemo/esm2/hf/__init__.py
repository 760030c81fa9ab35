"""Hugging Face ESM-2 folders: their layout and their files.

:mod:`.layout` reads ``config.json`` and knows the tensors' names and shapes (standard library only: checkpoints
are checked before torch is imported); :mod:`.files` reads, converts and writes the tensors (torch, safetensors).
Importing this package imports no torch: the names of :mod:`.files` are loaded on first use.
"""

from typing import TYPE_CHECKING

from bionemo.core.lazy_exports import lazy_exports
from bionemo.esm2.hf.layout import (
    ESM_VOCAB,
    HF_WEIGHT_FILES,
    CheckpointError,
    bionemo_shapes,
    hf_config,
    hf_rotary_base,
    is_hf_folder,
    padded_vocab_size,
    read_hf_config,
)

if TYPE_CHECKING:
    from bionemo.esm2.hf.files import (
        bionemo_to_hf,
        check_bionemo_tensors,
        hf_to_bionemo,
        load_hf_checkpoint,
        read_hf_tensors,
        write_folder,
        write_hf_folder,
    )

_LAZY = (
    "bionemo_to_hf",
    "check_bionemo_tensors",
    "hf_to_bionemo",
    "load_hf_checkpoint",
    "read_hf_tensors",
    "write_folder",
    "write_hf_folder",
)

__all__ = [
    "ESM_VOCAB",
    "HF_WEIGHT_FILES",
    "CheckpointError",
    "bionemo_shapes",
    "bionemo_to_hf",
    "check_bionemo_tensors",
    "hf_config",
    "hf_rotary_base",
    "hf_to_bionemo",
    "is_hf_folder",
    "load_hf_checkpoint",
    "padded_vocab_size",
    "read_hf_config",
    "read_hf_tensors",
    "write_folder",
    "write_hf_folder",
]


__getattr__ = lazy_exports(__name__, {"files": _LAZY})
