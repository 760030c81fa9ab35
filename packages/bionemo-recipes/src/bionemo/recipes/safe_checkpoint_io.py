"""Lightning checkpoint IO that never unpickles arbitrary objects when resuming."""

from typing import Any

import torch
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.plugins.io import TorchCheckpointIO
from typing_extensions import override

__all__ = ["SafeCheckpointIO"]


class SafeCheckpointIO(TorchCheckpointIO):
    """Saves like Lightning, loads with ``torch.load(weights_only=True)`` (tensors and plain containers only)."""

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
