"""Model checkpoints: the one path from a ``--checkpoint`` (a Hugging Face ESM-2 folder or a bionemo file) to a model.

:mod:`.header` checks a checkpoint from its headers alone (standard library only: the CLI refuses bad input before
torch is imported); :mod:`.load` reads and checks its tensors and builds a model of them; :mod:`.weights` reads,
writes and applies bionemo's safetensors files. Every problem is a :class:`CheckpointError` naming the file;
the recipes turn it into a ``--checkpoint`` settings error. Importing this package imports no torch: the names of
:mod:`.load` and :mod:`.weights` are loaded on first use.
"""

import importlib
from typing import TYPE_CHECKING, Any

from bionemo.esm2.checkpoints.header import CheckpointHeader, read_checkpoint_header, refuse_training_checkpoint
from bionemo.esm2.hf.layout import CheckpointError

if TYPE_CHECKING:
    from bionemo.esm2.checkpoints.load import LoadedCheckpoint, check_tensors, load_checkpoint, load_model
    from bionemo.esm2.checkpoints.weights import (
        apply_weights,
        full_state_dict,
        read_metadata,
        read_weights,
        save_weights,
    )

_LAZY = {
    "load": ("LoadedCheckpoint", "check_tensors", "load_checkpoint", "load_model"),
    "weights": ("apply_weights", "full_state_dict", "read_metadata", "read_weights", "save_weights"),
}
_MODULE_OF = {name: module for module, names in _LAZY.items() for name in names}

__all__ = [
    "CheckpointError",
    "CheckpointHeader",
    "LoadedCheckpoint",
    "apply_weights",
    "check_tensors",
    "full_state_dict",
    "load_checkpoint",
    "load_model",
    "read_checkpoint_header",
    "read_metadata",
    "read_weights",
    "refuse_training_checkpoint",
    "save_weights",
]


def __getattr__(name: str) -> Any:
    """The torch-backed names (:mod:`.load`, :mod:`.weights`), imported from their module on first use."""
    if name in _MODULE_OF:
        return getattr(importlib.import_module(f"{__name__}.{_MODULE_OF[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
