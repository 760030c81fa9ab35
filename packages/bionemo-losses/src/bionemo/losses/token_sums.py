"""A running sum of ``[loss_sum, num_tokens]`` pairs, reduced over ranks into a global token-weighted mean."""

from collections.abc import Iterable

import torch
import torch.distributed as dist

from bionemo.losses.parallel import all_reduce_sum

__all__ = ["TokenWeightedSums"]


class TokenWeightedSums:
    """Sums the ``[loss_sum, num_tokens]`` pairs of many micro-batches (e.g. a validation epoch).

    Each pair is a ``[2]`` tensor such as a reduction's ``LOSS_SUM_KEY`` output; pairs are detached and summed
    in fp32 on the device of the first pair seen. :meth:`reduce` all-reduces the running ``[2]`` sum over the
    given process groups, so the global token-weighted mean is ``sum of loss sums / sum of token counts`` over
    every pair of every rank (never a mean of per-batch means).
    """

    def __init__(self) -> None:
        self._sums: torch.Tensor | None = None

    @property
    def empty(self) -> bool:
        """Whether no pair was added since construction or the last :meth:`reset`."""
        return self._sums is None

    def add(self, pairs: Iterable[torch.Tensor]) -> None:
        """Add ``[2]`` pairs ``[loss_sum, num_tokens]``; any device or floating dtype, no gradient kept.

        Raises:
            ValueError: A pair is not of shape ``[2]``.
        """
        values = [pair.detach().float() for pair in pairs]
        if not values:
            return
        for value in values:
            if value.shape != (2,):
                raise ValueError(f"each pair must be [loss_sum, num_tokens] of shape (2,); got {tuple(value.shape)}")
        device = values[0].device if self._sums is None else self._sums.device
        step = torch.stack([value.to(device) for value in values]).sum(dim=0)
        self._sums = step if self._sums is None else self._sums + step

    def reset(self) -> None:
        """Forget every pair added so far."""
        self._sums = None

    def reduce(self, *groups: dist.ProcessGroup | None, device: torch.device | str | None = None) -> torch.Tensor:
        """``[loss_sum, num_tokens]`` summed over the added pairs and over the ranks of each group in turn.

        Every rank of a group must call this (it is a collective), including ranks that added nothing: they
        contribute zeros. The running sum itself is left unchanged.

        Args:
            groups: Process groups to sum over, one after the other; ``None`` or one-rank groups are skipped.
            device: Where the result (and the communication) lives, e.g. the module's device for NCCL;
                ``None`` keeps the sums' own device (CPU when nothing was added).

        Returns:
            A new fp32 ``[2]`` tensor.
        """
        if self._sums is None:
            sums = torch.zeros(2, device=device)
        else:
            sums = self._sums.to(device if device is not None else self._sums.device, copy=True)
        for group in groups:
            all_reduce_sum(sums, group)
        return sums

    def mean(self, *groups: dist.ProcessGroup | None, device: torch.device | str | None = None) -> torch.Tensor | None:
        """``loss_sum / num_tokens`` of :meth:`reduce` (a 0-d tensor), or ``None`` when no token was counted."""
        loss_sum, num_tokens = self.reduce(*groups, device=device)
        return loss_sum / num_tokens if num_tokens > 0 else None
