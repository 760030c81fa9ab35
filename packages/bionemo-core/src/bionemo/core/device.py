"""The device that data steps move batches to: the trainer's, not whatever GPU the machine happens to have."""

import contextlib
import contextvars
from collections.abc import Iterator

import torch

__all__ = ["compute_device", "using_device"]

_DEVICE: contextvars.ContextVar[torch.device | None] = contextvars.ContextVar("bionemo_compute_device", default=None)


def compute_device() -> torch.device:
    """The device set by :func:`using_device` (``BionemoLightningModule`` sets the trainer's around each data step).

    Unset (a data step called directly): the current CUDA device when there is one, else the CPU.
    """
    device = _DEVICE.get()
    if device is not None:
        return device
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


@contextlib.contextmanager
def using_device(device: torch.device) -> Iterator[torch.device]:
    """Make :func:`compute_device` return ``device`` inside the ``with`` block."""
    token = _DEVICE.set(torch.device(device))
    try:
        yield torch.device(device)
    finally:
        _DEVICE.reset(token)
