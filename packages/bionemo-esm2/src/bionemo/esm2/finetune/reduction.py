"""The fine-tuning loss reduction: the task's loss as a global item-weighted mean over micro-batches and ranks."""

import functools
from collections.abc import Callable, Mapping
from typing import Any

import torch

from bionemo.esm2.finetune.class_weights import ClassWeights
from bionemo.esm2.finetune.label_scaling import LabelScaling
from bionemo.esm2.finetune.objectives import loss_sum
from bionemo.esm2.finetune.tasks import Task
from bionemo.losses import LOSS_SUM_KEY, MaskedTokenLossReduction, ParallelGroups

__all__ = ["OUTPUT_KEYS", "FinetuneLossReduction", "task_reduction"]

OUTPUT_KEYS = ("logits", "target", "target_mask")
"""What a validation micro-batch's reduced output carries besides the loss pair (detached), for the metrics."""


class FinetuneLossReduction(MaskedTokenLossReduction):
    """:func:`bionemo.esm2.finetune.objectives.loss_sum` of the task, with the ``(loss_sum, count)`` contract.

    ``forward(batch, forward_out)`` reads the head's logits (``forward_out["logits"]`` or the tensor itself),
    ``batch["target"]`` and ``batch["target_mask"]`` (:mod:`bionemo.esm2.finetune.data`) and returns
    ``(loss_sum, num_items, {LOSS_SUM_KEY: [loss_sum, num_items]})``: items are sequences for sequence tasks and
    scored residues for token tasks, so ``reduce`` (inherited) gives the global item-weighted mean over
    micro-batches and data-parallel ranks, and megatron divides the gradient by the global count
    (``token_weighted``) as Lightning's strategies do. Validation outputs also carry :data:`OUTPUT_KEYS`.
    """

    def __init__(
        self,
        validation_step: bool = False,
        groups: ParallelGroups | None = None,
        *,
        task: Task,
        label_scaling: LabelScaling | None = None,
        class_weights: ClassWeights | None = None,
    ) -> None:
        super().__init__(validation_step=validation_step, groups=groups)
        self.task = Task(task)
        self.label_scaling = label_scaling
        self.class_weights = class_weights

    def forward(  # type: ignore[override]
        self, batch: Mapping[str, torch.Tensor], forward_out: torch.Tensor | Mapping[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        """Loss sum and item count of one micro-batch."""
        logits = forward_out if isinstance(forward_out, torch.Tensor) else forward_out["logits"]
        for key in ("target", "target_mask"):
            if key not in batch:
                raise KeyError(f"FinetuneLossReduction needs batch[{key!r}]; the batch has {sorted(batch)}")
        scale = None if self.label_scaling is None else self.label_scaling.on(logits.device)[0]
        weights = None if self.class_weights is None else self.class_weights.on(logits.device)
        total, count = loss_sum(self.task, logits, batch["target"], batch["target_mask"], scale, weights)
        reduced: dict[str, Any] = {LOSS_SUM_KEY: torch.stack([total.detach(), count.float()])}
        if self.validation_step:
            total = total.detach()
            reduced.update(logits=logits.detach(), target=batch["target"], target_mask=batch["target_mask"])
        return total, count.to(torch.int), reduced


def task_reduction(
    task: Task, label_scaling: LabelScaling | None = None, class_weights: ClassWeights | None = None
) -> Callable[..., FinetuneLossReduction]:
    """:class:`FinetuneLossReduction` bound to a run's task, label scaling and class weights, called as the class is.

    What ``get_loss_reduction_class`` returns. The factory carries the class's ``token_weighted``: NeMo's
    ``MegatronStrategy`` reads it there, before any reduction exists, to set megatron's ``calculate_per_token_loss``
    (without it megatron back-propagates the mean of per-micro-batch means, not the item-weighted mean the reduction
    reports).
    """
    bound = functools.partial(
        FinetuneLossReduction, task=Task(task), label_scaling=label_scaling, class_weights=class_weights
    )
    bound.token_weighted = FinetuneLossReduction.token_weighted  # type: ignore[attr-defined]
    return bound
