"""Make ``import megatron.core`` work on machines that have the CUDA compiler but no GPU.

megatron-core 0.15.3 JIT-compiles a CUDA extension while it is imported
(``megatron/core/inference/unified_memory.py``) and only catches ``RuntimeError``/``ImportError``/``OSError``.
On a machine with ``nvcc`` but no GPU the build raises ``IndexError`` (no device to read an arch from), so
the import fails. Giving the build an explicit arch list and a missing ``CUDA_HOME`` makes it skip
cleanly. Nothing changes on a machine with a GPU.
"""

import os

from bionemo.core.cuda_devices import cuda_available

__all__ = ["prepare_megatron_import"]

_MISSING_CUDA_HOME = "/nonexistent/bionemo-no-gpu-cuda-home"


def prepare_megatron_import() -> bool:
    """Set the two environment variables that let megatron-core import on a GPU-less machine.

    Call before the first ``import megatron.core``. Values the user already set are kept. Where the environment
    shows no GPU at all this imports nothing (see ``bionemo.core.cuda_devices``); elsewhere torch decides.

    Returns:
        ``True`` when the variables were needed (no CUDA device visible), ``False`` otherwise.
    """
    if cuda_available():
        return False
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    os.environ.setdefault("CUDA_HOME", _MISSING_CUDA_HOME)
    return True
