"""Context parallelism for bidirectional encoders on torch SDPA (no Transformer Engine).

The sequence dimension is padded to a multiple of the context-parallel size and split into equal contiguous
chunks, chunk ``r`` on context-parallel rank ``r`` (no causal load balancing is needed: every query attends
to every key). Each rank computes the queries, keys and values of its chunk; attention gathers the keys and
values of the whole sequence (:func:`gather_keys`: all-gather forward, reduce-scatter of the gradients
backward). :func:`gather_sequence` reassembles a chunked output (its backward keeps this rank's chunk of the
gradient). The batches' ``labels`` / ``loss_mask`` follow megatron's convention: under context parallelism a
rank's loss covers the positions of its own chunk (:func:`local_chunk`).
"""

from typing import Any, cast

import torch
import torch.distributed as dist
import torch.nn.functional as F

__all__ = ["chunk_length", "context_parallel_group", "gather_keys", "gather_sequence", "local_chunk"]


def context_parallel_group() -> dist.ProcessGroup | None:
    """Megatron's context-parallel group when it has more than one rank, else None."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    from megatron.core import parallel_state

    if not parallel_state.model_parallel_is_initialized() or parallel_state.get_context_parallel_world_size() == 1:
        return None
    return cast(dist.ProcessGroup, parallel_state.get_context_parallel_group())


def chunk_length(length: int, group: dist.ProcessGroup) -> int:
    """Positions per rank of a ``length``-position sequence: ``ceil(length / size)``."""
    return -(-length // dist.get_world_size(group))


def local_chunk(tensor: torch.Tensor, dim: int, group: dist.ProcessGroup, fill: Any = 0) -> torch.Tensor:
    """This rank's chunk of ``tensor`` along ``dim`` (padded with ``fill`` past the sequence's end)."""
    length = tensor.shape[dim]
    per = chunk_length(length, group)
    padded = per * dist.get_world_size(group)
    if padded != length:
        dim = dim % tensor.dim()
        pad = [0, 0] * (tensor.dim() - 1 - dim) + [0, padded - length]
        tensor = F.pad(tensor, pad, value=fill)
    return tensor.narrow(dim, dist.get_rank(group) * per, per)


def _all_gather(tensor: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    size = dist.get_world_size(group)
    out = tensor.new_empty((tensor.shape[0] * size, *tensor.shape[1:]))
    if dist.get_backend(group) == dist.Backend.NCCL:
        dist.all_gather_into_tensor(out, tensor.contiguous(), group=group)
    else:  # gloo: no all_gather_into_tensor
        dist.all_gather(list(out.chunk(size)), tensor.contiguous(), group=group)
    return out


def _reduce_scatter(tensor: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    if dist.get_backend(group) == dist.Backend.NCCL:
        out = tensor.new_empty((tensor.shape[0] // size, *tensor.shape[1:]))
        dist.reduce_scatter_tensor(out, tensor.contiguous(), group=group)
        return out
    summed = tensor.contiguous().clone()  # gloo: no reduce-scatter
    dist.all_reduce(summed, group=group)
    return summed.chunk(size)[rank].contiguous()


class _Gather(torch.autograd.Function):
    """All-gather along dim 0; backward: the sum of every rank's gradient (``reduce``) or this rank's own."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, group: dist.ProcessGroup, reduce: bool) -> torch.Tensor:
        ctx.group, ctx.reduce = group, reduce
        return _all_gather(tensor, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:  # pyright: ignore[reportIncompatibleMethodOverride]
        if ctx.reduce:
            return _reduce_scatter(grad, ctx.group), None, None
        size, rank = dist.get_world_size(ctx.group), dist.get_rank(ctx.group)
        return grad.chunk(size)[rank].contiguous(), None, None


def gather_keys(tensor: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Every rank's chunk of ``tensor`` (``[s_local, ...]``) concatenated along dim 0: keys and values.

    Every rank's queries use them, so the backward sums their gradients and returns this rank's chunk.
    """
    return _Gather.apply(tensor, group, True)  # pyright: ignore[reportReturnType]


def gather_sequence(tensor: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Every rank's chunk of an output (``[s_local, ...]``) concatenated along dim 0: outputs for prediction.

    The backward only keeps this rank's chunk of the gradient; training takes the loss of each rank's own chunk
    instead (megatron's convention).
    """
    return _Gather.apply(tensor, group, False)  # pyright: ignore[reportReturnType]
