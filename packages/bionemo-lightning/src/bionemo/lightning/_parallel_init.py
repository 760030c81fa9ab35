"""Megatron model-parallel state for Lightning's own strategies (CPU, single device, DDP)."""

import os
import tempfile

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

__all__ = ["ensure_model_parallel"]


def ensure_model_parallel(cuda: bool | None = None) -> None:
    """Make megatron-core's parallel state usable with tensor/pipeline/context parallel size 1.

    Megatron layers read their tensor-parallel rank and size from ``parallel_state``; under Lightning's own
    strategies nobody sets it up. Uses the process group Lightning started (DDP) or, in a single process,
    starts a one-rank gloo group. Seeds megatron's CUDA RNG tracker when CUDA is in use (``cuda``; default:
    whenever a GPU is visible).
    """
    if not dist.is_initialized():
        store = os.path.join(tempfile.mkdtemp(prefix="bionemo-pg-"), "store")
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel()
    if torch.cuda.is_available() if cuda is None else cuda:
        model_parallel_cuda_manual_seed(torch.initial_seed() % 2**31)
