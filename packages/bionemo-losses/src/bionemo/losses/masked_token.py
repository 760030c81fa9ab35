"""Masked-token cross-entropy for language models, reduced as a global token-weighted mean."""

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch

from bionemo.losses.cross_entropy import token_cross_entropy
from bionemo.losses.parallel import ParallelGroups, all_reduce_sum
from bionemo.losses.reduction import LossReduction

__all__ = ["LOSS_SUM_KEY", "MaskedTokenLossReduction", "masked_token_loss_sums"]

LOSS_SUM_KEY = "loss_sum_and_num_tokens"
"""Key of the ``[loss_sum, num_tokens]`` fp32 tensor in each micro-batch's reduced output."""


def masked_token_loss_sums(
    token_logits: torch.Tensor,
    labels: torch.Tensor,
    loss_mask: torch.Tensor,
    tensor_group: Any = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum of the masked per-token cross-entropy and the number of tokens it covers, on this rank.

    Args:
        token_logits: ``[s, b, v]`` logits (``v`` is this rank's vocab slice under tensor parallelism).
        labels: ``[b, s]`` target ids; negative ids are ignored.
        loss_mask: ``[b, s]`` weights, usually 0/1 (bool or float); ignored tokens count as 0.
        tensor_group: Tensor-parallel group of vocab-parallel logits, or ``None``.

    Returns:
        ``(loss_sum, num_tokens)``: fp32 scalars; ``loss_sum`` carries the gradient.
    """
    if loss_mask.shape != labels.shape:
        raise ValueError(f"loss_mask {tuple(loss_mask.shape)} must have the shape of labels {tuple(labels.shape)}")
    per_token = token_cross_entropy(token_logits, labels, tensor_group)  # [b, s]
    weights = loss_mask.to(torch.float32) * (labels >= 0)
    return (per_token * weights).sum(), weights.sum()


class MaskedTokenLossReduction(LossReduction):
    """Cross-entropy over the masked tokens of a language-model batch.

    ``forward(batch, forward_out)`` reads ``forward_out["token_logits"]`` (or ``forward_out`` itself when it
    is a tensor) as ``[s, b, v]`` logits and ``batch["labels"]`` / ``batch["loss_mask"]`` as ``[b, s]`` and
    returns megatron's three-tuple ``(loss_sum, num_tokens, {LOSS_SUM_KEY: [loss_sum, num_tokens]})``.
    Megatron divides ``loss_sum`` by ``num_tokens`` for the backward pass (or, with
    ``TransformerConfig.calculate_per_token_loss=True``, by the global token count of the step).

    ``reduce`` sums ``[loss_sum, num_tokens]`` over the step's micro-batches, all-reduces that pair over the
    data- and context-parallel ranks, and returns ``loss_sum / num_tokens``: the global token-weighted mean
    loss. A step without any valid token returns 0, never NaN.

    With ``validation_step=True`` the forward loss is detached (no graph is kept), as fits validation and
    test. Inputs are never modified.

    Args:
        validation_step: Build the validation / test flavour.
        groups: Process groups to reduce over; ``None`` reads megatron's current ones (see
            :class:`ParallelGroups`) each time they are needed.
    """

    token_weighted: ClassVar[bool] = True
    """``forward`` returns ``(loss_sum, num_tokens, ...)`` and the objective is their global ratio: under
    MegatronStrategy :class:`bionemo.lightning.BionemoLightningModule` sets the model config's
    ``calculate_per_token_loss`` so that megatron divides by the step's global token count, as Lightning's
    strategies do, instead of averaging per-micro-batch means."""

    def __init__(self, validation_step: bool = False, groups: ParallelGroups | None = None) -> None:
        super().__init__()
        self.validation_step = validation_step
        self._groups = groups

    @property
    def groups(self) -> ParallelGroups:
        """The process groups this reduction communicates over."""
        return ParallelGroups.current() if self._groups is None else self._groups

    def forward(  # type: ignore[override]
        self, batch: Mapping[str, torch.Tensor], forward_out: torch.Tensor | Mapping[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """Loss sum and token count of one micro-batch (see the class docstring for shapes)."""
        logits = forward_out if isinstance(forward_out, torch.Tensor) else forward_out["token_logits"]
        for key in ("labels", "loss_mask"):
            if key not in batch:
                raise KeyError(f"MaskedTokenLossReduction needs batch[{key!r}]; the batch has {sorted(batch)}")
        loss_sum, num_tokens = masked_token_loss_sums(logits, batch["labels"], batch["loss_mask"], self.groups.tensor)
        if self.validation_step:
            loss_sum = loss_sum.detach()
        pair = torch.stack([loss_sum.detach(), num_tokens])
        return loss_sum, num_tokens.to(torch.int), {LOSS_SUM_KEY: pair}

    def reduce(self, losses_reduced_per_micro_batch: Sequence[Mapping[str, torch.Tensor]]) -> torch.Tensor:  # type: ignore[override]
        """Global token-weighted mean loss of the step over micro-batches and data/context-parallel ranks."""
        if not losses_reduced_per_micro_batch:
            return torch.zeros(())
        total = torch.stack([out[LOSS_SUM_KEY] for out in losses_reduced_per_micro_batch]).sum(dim=0)
        all_reduce_sum(total, self.groups.data_context)
        return total[0] / total[1].clamp(min=1.0)
