"""Atomic safetensors writes: a file appears complete under its name or not at all."""

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import save_file

__all__ = ["save_safetensors_atomically"]


def save_safetensors_atomically(
    tensors: Mapping[str, torch.Tensor], path: Path, metadata: Mapping[str, str] | None = None
) -> Path:
    """Write ``tensors`` to a temporary file beside ``path``, then rename it to ``path``.

    The file gets the usual permissions (``0o666`` minus the umask). On any error the temporary file is
    removed and ``path`` is left as it was.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        save_file({key: value.contiguous() for key, value in tensors.items()}, tmp, metadata=dict(metadata or {}))
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
