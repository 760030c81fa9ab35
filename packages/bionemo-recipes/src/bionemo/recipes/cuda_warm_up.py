"""CUDA's one-time start-up work in a background thread while a one-GPU command reads its inputs and imports.

A process's first CUDA work pays costs that no later batch pays again: the device's context, cuBLAS's handle and
workspace, and (CUDA's lazy loading) each kernel's module on its first launch. On an H100 they made a prediction's
first batch about 0.8 s longer than the next ones (docs/benchmarks.md#prediction-kernels), on the command's
critical path. :func:`start_cuda_warm_up` runs that work on a daemon thread as soon as a command knows it runs on
one GPU; the main thread meanwhile reads the checkpoint and the sequences and imports Lightning and megatron-core
(torch's operators release the GIL while they run). The warm-up computes nothing anyone reads: small tensors
through the operators an ESM-2 forward starts with, in the run's dtype.

:func:`finish_cuda_warm_up` waits for the thread; a command calls it before it starts DataLoader worker processes
(forked while another thread runs CUDA work they would inherit held locks). An error in the warm-up is dropped: the
command's own first CUDA call meets it again and reports it.

Only on one device of one node without a launcher's rank variables: under torchrun / SLURM each process picks its
own GPU later, and a warm-up on device 0 would put a context of every process there.
Switch: ``BIONEMO_CUDA_WARM_UP=0``.
"""

import contextlib
import os
import threading
from typing import Any

__all__ = ["SWITCH", "finish_cuda_warm_up", "first_cuda_work", "start_cuda_warm_up"]

SWITCH = "BIONEMO_CUDA_WARM_UP"
_thread: threading.Thread | None = None


def start_cuda_warm_up(dtype: Any, *, devices: int, num_nodes: int) -> bool:
    """Start the warm-up thread for a run on GPU 0 in ``dtype`` (a ``torch.dtype``); imports only torch.

    Returns:
        ``True`` when a warm-up thread runs (or ran) in this process, ``False`` when it does not apply (switched
        off, more than one device or node, a launcher's rank variables set, no CUDA).
    """
    global _thread
    if _thread is not None:
        return True
    if os.environ.get(SWITCH) == "0" or devices != 1 or num_nodes != 1 or _launched():
        return False
    import torch

    if not torch.cuda.is_available():
        return False
    _thread = threading.Thread(target=_warm_up, args=(dtype,), name="bionemo-cuda-warm-up", daemon=True)
    _thread.start()
    return True


def finish_cuda_warm_up() -> None:
    """Wait until the warm-up thread (if one was started) has finished."""
    if _thread is not None:
        _thread.join()


def _launched() -> bool:
    """A launcher's rank variables: torchrun's ``LOCAL_RANK``, or more than one process (``WORLD_SIZE``, SLURM's)."""
    if "LOCAL_RANK" in os.environ:
        return True
    return any(os.environ.get(name, "1") not in ("", "1") for name in ("WORLD_SIZE", "SLURM_NTASKS"))


def _warm_up(dtype: Any) -> None:
    """:func:`first_cuda_work`, any error dropped (the command's own first CUDA call reports it)."""
    with contextlib.suppress(Exception):
        first_cuda_work(dtype)


def first_cuda_work(dtype: Any) -> None:
    """Context, cuBLAS(Lt) handle and the first kernels of an ESM-2 forward on the current GPU, in ``dtype``."""
    import torch
    import torch.nn.functional as F

    with torch.inference_mode():
        x = torch.ones(64, 64, device="cuda", dtype=dtype)
        F.linear(x, x, x[0])  # cuBLASLt with the bias epilogue
        if dtype in (torch.bfloat16, torch.float16):
            torch._addmm_activation(x[0], x, x, use_gelu=True)  # pyright: ignore[reportPrivateImportUsage]
        F.gelu(F.layer_norm(x, (64,), x[0], x[0]))
        x.masked_fill(x > 1, 0).pow(2).softmax(-1)
        lengths = torch.arange(1, 5, device="cuda")
        torch.repeat_interleave(lengths, lengths).cumsum(0)
        torch.cuda.synchronize()
