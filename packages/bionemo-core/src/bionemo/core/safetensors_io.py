"""Atomic safetensors writes: a file appears complete under its name or not at all."""

from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import save_file

from bionemo.core.atomic_files import replaced_atomically

__all__ = ["save_safetensors_atomically"]


def save_safetensors_atomically(
    tensors: Mapping[str, torch.Tensor], path: Path, metadata: Mapping[str, str] | None = None
) -> Path:
    """Write ``tensors`` to ``path`` through :func:`replaced_atomically`."""
    with replaced_atomically(path) as tmp:
        save_file({key: value.contiguous() for key, value in tensors.items()}, tmp, metadata=dict(metadata or {}))
    return path
