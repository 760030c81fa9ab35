"""The loss-reduction contract of megatron's schedules and NeMo's ``MegatronParallel``, in plain torch.

NeMo 2.7.3's ``nemo.lightning.megatron_parallel.MegatronLossReduction`` is this contract: an ``nn.Module``
that the forward step hands its batch with ``setup(batch)``; megatron's schedule then calls it with the
forward output (a pre-forward hook puts the batch first, so ``forward(batch, forward_out)`` runs) and, at the
end of the step, ``reduce(outputs of every micro-batch)``. NeMo checks no type, so subclasses of
:class:`LossReduction` serve NeMo's MegatronStrategy as they are, without importing NeMo (tested in
``tests/losses/test_reduction_contract.py`` against NeMo's own class).
"""

import abc
from collections.abc import Sequence
from typing import Any, Generic

import torch

from bionemo.core import DataT, ReductionT

__all__ = ["LossReduction"]


class LossReduction(torch.nn.Module, Generic[DataT, ReductionT]):
    """A loss reduction: ``forward(batch, forward_out) -> (loss, ...)`` per micro-batch, ``reduce`` per step."""

    def __init__(self) -> None:
        super().__init__()
        self.batch: Any = None
        self.register_forward_pre_hook(self._pre_forward_hook)

    def setup(self, batch: Any) -> None:
        """Keep the micro-batch the next call reduces (NeMo's forward step calls this)."""
        self.batch = batch

    def _pre_forward_hook(self, module: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        return (self.batch, *args)

    def forward(self, batch: DataT, forward_out: Any) -> tuple[Any, ...]:
        """``(loss, reduced)`` or megatron's ``(loss_sum, num_tokens, reduced)`` for one micro-batch."""
        raise NotImplementedError(f"{type(self).__name__} must implement forward(batch, forward_out)")

    @abc.abstractmethod
    def reduce(self, losses_reduced_per_micro_batch: Sequence[ReductionT]) -> Any:
        """The step's value from every micro-batch's ``reduced``."""
