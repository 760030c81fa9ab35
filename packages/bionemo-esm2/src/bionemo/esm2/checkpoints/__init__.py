"""Model checkpoints: the one path from a ``--checkpoint`` (a Hugging Face ESM-2 folder or a bionemo file) to a model.

:mod:`.header` checks a checkpoint from its headers alone (standard library only: the CLI refuses bad input before
torch is imported); :mod:`.load` reads and checks its tensors and builds a model of them; :mod:`.weights` reads,
writes and applies bionemo's safetensors files. Every problem is a :class:`CheckpointError` naming the file;
the recipes turn it into a ``--checkpoint`` settings error. Importing this package imports no torch: the names of
:mod:`.load` and :mod:`.weights` are loaded on first use.
"""

from typing import TYPE_CHECKING

from bionemo.core.lazy_exports import lazy_exports
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


__getattr__ = lazy_exports(__name__, _LAZY)
