"""Lightning checkpoint IO that writes checkpoints atomically and never unpickles arbitrary objects when resuming."""

import os
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.plugins.io import TorchCheckpointIO
from typing_extensions import override

from bionemo.core.atomic_files import replaced_atomically

__all__ = ["SafeCheckpointIO"]


class SafeCheckpointIO(TorchCheckpointIO):
    """Saves atomically beside the target; loads with ``torch.load(weights_only=True)`` (tensors, plain containers)."""

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], path: _PATH, storage_options: Any | None = None) -> None:
        """Write a temporary file beside ``path``, then rename it over ``path``.

        A save cut short (a second Ctrl-C, SIGKILL after SIGTERM) leaves the previous checkpoint, never a partial
        one. Lightning's own save stages the file under TMPDIR and moves it, a copy when TMPDIR is another
        filesystem. Remote paths (``scheme://``) are saved by Lightning.
        """
        if storage_options is not None or "://" in str(path):
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        with replaced_atomically(Path(path)) as tmp, tmp.open("wb") as file:
            torch.save(checkpoint, file)
            file.flush()
            os.fsync(file.fileno())

    @override
    def load_checkpoint(
        self, path: _PATH, map_location: Any = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        try:
            return torch.load(path, map_location=map_location or "cpu", weights_only=True)
        except FileNotFoundError:
            raise
        except Exception as error:
            raise ValueError(f"checkpoint {path} is corrupted or not a plain-tensor checkpoint: {error}") from None
