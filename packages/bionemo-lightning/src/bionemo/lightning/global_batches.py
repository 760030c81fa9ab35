"""Global batches: the samples of an optimizer step, the same on every data-parallel layout.

A training run is a stream of global batches: optimizer step ``s`` consumes samples ``s * G .. (s + 1) * G - 1``
of the epoch's order (``G`` the global batch size). Each global batch is cut into micro-batches of
``micro_batch_size x data_parallel_size`` consecutive samples, and data-parallel rank ``r`` takes the ``r``-th
``micro_batch_size`` of each, as megatron's pretraining sampler does. So one process accumulating ``G / m``
micro-batches, ``D`` processes accumulating ``G / (m D)`` each, or another micro-batch size all train on the same
samples per step; the resume position is a step count, which fixes the next global sample on any layout.
"""

import dataclasses
from collections.abc import Iterator

import torch
from torch.utils.data import DistributedSampler
from typing_extensions import override

from bionemo.core.batch_sizes import batch_size_problem

__all__ = ["BatchLayout", "GlobalBatchSampler"]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class BatchLayout:
    """How one optimizer step's global batch is spread over micro-batches and data-parallel ranks."""

    micro_batch_size: int
    """Samples per micro-batch on one data-parallel rank."""
    global_batch_size: int
    """Samples per optimizer step over all data-parallel ranks."""
    data_parallel_size: int = 1
    """Model replicas that each take a share of every global batch."""

    def __post_init__(self) -> None:
        for name in ("micro_batch_size", "global_batch_size", "data_parallel_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"BatchLayout.{name} must be at least 1, got {getattr(self, name)}")
        problem = batch_size_problem(self.micro_batch_size, self.global_batch_size, self.data_parallel_size)
        if problem is not None:
            raise ValueError(problem)

    @property
    def accumulation(self) -> int:
        """Micro-batches each rank runs per optimizer step (gradient accumulation)."""
        return self.global_batch_size // (self.micro_batch_size * self.data_parallel_size)

    def micro_batch_positions(self, step: int, micro_batch: int, rank: int) -> range:
        """Positions in the epoch's order of ``rank``'s ``micro_batch``-th micro-batch of optimizer ``step``."""
        start = (
            step * self.global_batch_size
            + micro_batch * self.micro_batch_size * self.data_parallel_size
            + rank * self.micro_batch_size
        )
        return range(start, start + self.micro_batch_size)


class GlobalBatchSampler(DistributedSampler):
    """One data-parallel rank's sample indices, micro-batch after micro-batch, step after step (see the module).

    Serve it with a DataLoader of ``batch_size=layout.micro_batch_size``: every ``micro_batch_size`` indices are
    one micro-batch. Each epoch holds ``size // global_batch_size`` whole steps (a short last global batch is
    dropped, as megatron does, so every layout takes the same steps). With ``shuffle`` the epoch's order is a
    permutation drawn from ``(seed, epoch)`` (:meth:`set_epoch`, which Lightning calls), the same on every rank.

    ``start_step``: the first pass starts at that step of its epoch (a resumed run); ``__len__`` stays the whole
    epoch's count, which is what Lightning's loop counts a resumed epoch against.

    A ``DistributedSampler`` so that Lightning leaves it in place instead of wrapping it for DDP.

    Raises:
        ValueError: ``size`` smaller than one global batch, or ``rank`` outside the data-parallel size.
    """

    def __init__(
        self,
        size: int,
        layout: BatchLayout,
        *,
        rank: int = 0,
        start_step: int = 0,
        shuffle: bool = False,
        seed: int = 0,
    ) -> None:
        if not 0 <= rank < layout.data_parallel_size:
            raise ValueError(f"rank={rank} must be in [0, {layout.data_parallel_size})")
        if size < layout.global_batch_size:
            raise ValueError(
                f"the training set holds {size} samples, fewer than one global batch of {layout.global_batch_size}; "
                "give a smaller global batch size or more data"
            )
        # DistributedSampler's own fields, so that code reading them (Lightning's) sees this layout
        super().__init__(
            range(size),  # type: ignore[arg-type]  # only its length is read
            num_replicas=layout.data_parallel_size,
            rank=rank,
            shuffle=shuffle,
            seed=seed,
            drop_last=True,
        )
        self.size = size
        self.layout = layout
        self.start_step = start_step
        self.steps_per_epoch = size // layout.global_batch_size

    @override
    def __len__(self) -> int:
        return self.steps_per_epoch * self.layout.accumulation * self.layout.micro_batch_size

    @override
    def __iter__(self) -> Iterator[int]:
        start, self.start_step = min(self.start_step, self.steps_per_epoch), 0
        order: list[int] | range = range(self.size)
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.size, generator=generator).tolist()
        for step in range(start, self.steps_per_epoch):
            for micro_batch in range(self.layout.accumulation):
                for position in self.layout.micro_batch_positions(step, micro_batch, self.rank):
                    yield order[position]
