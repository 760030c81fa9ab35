"""Tensor-parallel gathers and slices over a given process group, on any device (gloo included).

megatron-core 0.15.3's ``gather_from_tensor_model_parallel_region`` allocates its output on
``torch.cuda.current_device()`` and uses ``all_gather_into_tensor``, which gloo lacks; these use the list form of
``all_gather`` on the tensor's own device. A group of one rank (or ``None``) makes every function a no-op.
"""

from typing import Any

import torch
import torch.distributed as dist

__all__ = ["gather_along", "gather_last_dim", "group_rank", "group_size", "shard_of"]


def group_size(group: Any) -> int:
    """Ranks in ``group`` (1 for ``None``)."""
    return 1 if group is None else group.size()


def group_rank(group: Any) -> int:
    """This process's rank in ``group`` (0 for ``None``)."""
    return 0 if group is None else group.rank()


def gather_along(tensor: torch.Tensor, dim: int, group: Any) -> torch.Tensor:
    """Every rank's ``tensor`` concatenated along ``dim`` in rank order (no autograd); a collective over ``group``."""
    size = group_size(group)
    if size == 1:
        return tensor
    shards = [torch.empty_like(tensor) for _ in range(size)]
    dist.all_gather(shards, tensor.contiguous(), group=group)
    return torch.cat(shards, dim=dim)


def shard_of(tensor: torch.Tensor, dim: int, group: Any) -> torch.Tensor:
    """This rank's contiguous slice of ``tensor`` along ``dim`` (the inverse of :func:`gather_along`)."""
    size = group_size(group)
    if tensor.shape[dim] % size:
        raise ValueError(f"dimension {dim} of shape {tuple(tensor.shape)} does not split over {size} ranks")
    return tensor.chunk(size, dim=dim)[group_rank(group)].contiguous()


class _GatherLastDim(torch.autograd.Function):
    """Forward: concatenate every rank's tensor along the last dimension; backward: keep this rank's slice."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, group: Any) -> torch.Tensor:
        """``[..., n] -> [..., n * ranks]``."""
        ctx.group = group
        return gather_along(tensor, -1, group)

    @staticmethod
    def backward(ctx: Any, *grad_outputs: torch.Tensor) -> tuple[torch.Tensor, None]:
        """This rank's slice of the gradient (each rank holds the whole, replicated gradient)."""
        (grad,) = grad_outputs
        return shard_of(grad, -1, ctx.group), None


def gather_last_dim(tensor: torch.Tensor, group: Any) -> torch.Tensor:
    """Every rank's ``tensor [..., n]`` side by side, ``[..., n * ranks]``, differentiable (megatron's "gather")."""
    if group_size(group) == 1:
        return tensor
    return _GatherLastDim.apply(tensor, group)
