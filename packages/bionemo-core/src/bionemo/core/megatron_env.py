"""Make ``import megatron.core`` quick everywhere, and possible on machines with the CUDA compiler but no GPU.

megatron-core 0.15.3 JIT-compiles a CUDA extension while it is imported
(``megatron/core/inference/unified_memory.py``), a long wait on every import on a GPU machine, where the build
fails each time (docs/benchmarks.md#prediction-start-up). :mod:`bionemo.core.skip_unified_memory_build` skips that
build (its module says how to switch it off). Where it is not applied (another megatron-core version, or switched
off) and the machine has ``nvcc`` but no GPU, the build raises ``IndexError`` (no device to read an arch from),
which megatron does not catch: an explicit arch list and a missing ``CUDA_HOME`` make it fail cleanly instead.

It also hides the notes megatron-core and NeMo print while they are imported (:mod:`bionemo.core.import_notes`).
"""

import os

from bionemo.core.cuda_devices import cuda_available
from bionemo.core.import_notes import quiet_import_notes
from bionemo.core.skip_unified_memory_build import skip_unified_memory_build

__all__ = ["prepare_megatron_import"]

_MISSING_CUDA_HOME = "/nonexistent/bionemo-no-gpu-cuda-home"


def prepare_megatron_import() -> bool:
    """Arm the unified-memory build skip; without it, on a GPU-less machine, set two environment variables.

    Call before the first ``import megatron.core``; imports neither torch nor megatron. Values the user already
    set are kept. Where the environment shows no GPU at all this imports nothing (see
    ``bionemo.core.cuda_devices``); elsewhere torch decides. Also hides the notes megatron-core and NeMo print
    while they are imported (:func:`bionemo.core.import_notes.quiet_import_notes`).

    Returns:
        ``True`` when the environment variables were set (build skip not armed, no CUDA device visible).
    """
    quiet_import_notes()
    if skip_unified_memory_build() or cuda_available():
        return False
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    os.environ.setdefault("CUDA_HOME", _MISSING_CUDA_HOME)
    return True
