"""The process groups a reduction or callback communicates over, read from megatron in one place.

Reductions and callbacks take a :class:`ParallelGroups` instead of reaching into megatron's global
``parallel_state`` themselves; :meth:`ParallelGroups.current` is the single adapter that reads it. With no
``torch.distributed`` process group (a single CPU process) every group is ``None`` and nothing is
communicated.
"""

import sys
from dataclasses import dataclass
from typing import cast

import torch
import torch.distributed as dist

__all__ = ["ParallelGroups", "all_reduce_sum"]


@dataclass(frozen=True, slots=True)
class ParallelGroups:
    """Process groups of the calling rank.

    Attributes:
        tensor: The tensor-parallel group (vocab-parallel logits are split over it), or ``None``.
        data_context: The data-parallel group including context-parallel ranks: the ranks whose tokens
            together form the global batch. ``None`` for a single process.
        pipeline: The pipeline-parallel group, or ``None``.
        context: The context-parallel group (the sequence is split over it), or ``None``.
        is_last_stage: Whether this rank is on the last pipeline stage (the one that holds outputs).
    """

    tensor: dist.ProcessGroup | None = None
    data_context: dist.ProcessGroup | None = None
    pipeline: dist.ProcessGroup | None = None
    context: dist.ProcessGroup | None = None
    is_last_stage: bool = True

    @classmethod
    def current(cls) -> "ParallelGroups":
        """Groups of the calling rank: megatron's when initialized, else the world as data parallel."""
        if not (dist.is_available() and dist.is_initialized()):
            return cls()
        if "megatron.core.parallel_state" not in sys.modules:  # before the first import only: it lists /dev
            from bionemo.core.megatron_env import prepare_megatron_import

            prepare_megatron_import()
        from megatron.core import parallel_state

        if not parallel_state.model_parallel_is_initialized():
            return cls(data_context=dist.group.WORLD)
        return cls(
            tensor=cast(dist.ProcessGroup, parallel_state.get_tensor_model_parallel_group()),
            data_context=cast(dist.ProcessGroup, parallel_state.get_data_parallel_group(with_context_parallel=True)),
            pipeline=cast(dist.ProcessGroup, parallel_state.get_pipeline_model_parallel_group()),
            context=cast(dist.ProcessGroup, parallel_state.get_context_parallel_group()),
            is_last_stage=parallel_state.is_pipeline_last_stage(),
        )

    def tensor_parallel_size(self) -> int:
        """Number of tensor-parallel ranks (1 without a group)."""
        return 1 if self.tensor is None else dist.get_world_size(self.tensor)

    def holds_full_output(self) -> bool:
        """Whether this rank should write outputs: last pipeline stage, tensor- and context-parallel rank 0."""
        return self.is_last_stage and all(
            group is None or dist.get_rank(group) == 0 for group in (self.tensor, self.context)
        )

    def data_context_size(self) -> int:
        """Number of data x context parallel ranks (1 without a group)."""
        return 1 if self.data_context is None else dist.get_world_size(self.data_context)


def all_reduce_sum(tensor: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """Sum ``tensor`` over ``group`` in place and return it; a no-op without a group or for one rank."""
    if group is not None and dist.get_world_size(group) > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
    return tensor
