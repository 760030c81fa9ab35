"""How many CUDA GPUs this process can use, without importing torch where the machine plainly has none.

``torch.cuda.device_count()`` is the authority, but importing torch takes seconds, and the CLI asks before it
checks its input. On Linux a process reaches an NVIDIA GPU only through the driver's device files
(``/dev/nvidia0``, ... or WSL's ``/dev/dxg``); when there are none and the driver lists no GPU
(``/proc/driver/nvidia/gpus``), or when ``CUDA_VISIBLE_DEVICES`` hides every device, the answer is 0 without
torch. Whenever a GPU might be there, torch answers, so machines with GPUs see exactly what torch sees.
"""

import os
import re
import sys
from pathlib import Path

__all__ = ["cuda_available", "cuda_device_count", "no_cuda_by_environment"]

_DEVICE_FILE = re.compile(r"nvidia\d+$")


def _hidden_by_cuda_visible_devices() -> bool:
    """``CUDA_VISIBLE_DEVICES`` is empty or starts with a negative index (CUDA then shows no device)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return False
    first = visible.split(",")[0].strip()
    return visible == "" or (first.startswith("-") and first[1:].isdigit())


def _driver_devices(dev: Path, proc: Path) -> bool:
    """Whether the NVIDIA driver shows a GPU: a ``/dev/nvidia<N>`` or ``/dev/dxg`` file, or a GPU in ``/proc``."""
    try:
        if any(_DEVICE_FILE.match(entry) for entry in os.listdir(dev)) or (dev / "dxg").exists():
            return True
    except OSError:
        return True  # cannot tell: ask torch
    gpus = proc / "driver" / "nvidia" / "gpus"
    try:
        return gpus.is_dir() and any(gpus.iterdir())
    except OSError:
        return True


def no_cuda_by_environment(*, dev: Path = Path("/dev"), proc: Path = Path("/proc")) -> bool:
    """True when this process certainly has no CUDA GPU, decided from the environment alone (no torch).

    False means "maybe": ask torch. Only Linux is judged; elsewhere the answer is always False.
    """
    if _hidden_by_cuda_visible_devices():
        return True
    if not sys.platform.startswith("linux"):
        return False
    return not _driver_devices(dev, proc)


def cuda_device_count() -> int:
    """``torch.cuda.device_count()``, or 0 without importing torch when :func:`no_cuda_by_environment`."""
    if no_cuda_by_environment():
        return 0
    import torch

    return torch.cuda.device_count()


def cuda_available() -> bool:
    """``torch.cuda.is_available()``, or False without importing torch when :func:`no_cuda_by_environment`."""
    if no_cuda_by_environment():
        return False
    import torch

    return torch.cuda.is_available()
