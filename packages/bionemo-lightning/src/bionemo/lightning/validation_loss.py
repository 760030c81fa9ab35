"""``val_loss`` as the global token-weighted mean over the validation epoch, on every strategy."""

from collections.abc import Mapping, Sequence
from typing import Any

import lightning.pytorch as pl
import torch
from typing_extensions import override

from bionemo.losses import LOSS_SUM_KEY, ParallelGroups, all_reduce_sum

__all__ = ["TokenWeightedValidationLoss"]


class TokenWeightedValidationLoss(pl.Callback):
    """Log ``val_loss = sum of loss sums / sum of token counts`` over every validation micro-batch and rank.

    The training objective and ``val_ppl`` weight every token alike; a mean of per-batch means would weight
    the tokens of a short last batch more (and NeMo's MegatronStrategy logs exactly that). This callback
    collects each micro-batch's ``[loss_sum, num_tokens]`` (``LOSS_SUM_KEY``, from reductions such as
    ``MaskedTokenLossReduction``) in the ``on_megatron_reduce_microbatches_end`` hook that both execution
    models fire, and logs the epoch's value once, with one all-reduce. While it has pairs, the module drops
    the per-step ``val_loss`` (its own and MegatronStrategy's); reductions without pairs keep those.
    """

    def __init__(self) -> None:
        super().__init__()
        self._sums: torch.Tensor | None = None
        self.active = False
        """Whether this epoch's micro-batches carry ``[loss_sum, num_tokens]`` pairs (read by the module)."""

    def on_megatron_reduce_microbatches_end(
        self, step: Any, microbatch_outputs: Sequence[Any], loss_reduction: Any, reduced: Any
    ) -> None:
        """Add one validation step's pairs."""
        trainer = step.trainer
        if not trainer.validating or trainer.sanity_checking or not microbatch_outputs:
            return
        if not all(isinstance(out, Mapping) and LOSS_SUM_KEY in out for out in microbatch_outputs):
            return
        self.active = True
        sums = torch.stack([out[LOSS_SUM_KEY].detach().float() for out in microbatch_outputs]).sum(dim=0)
        self._sums = sums if self._sums is None else self._sums + sums.to(self._sums.device)

    @override
    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._sums = None

    @override
    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or not self.active:
            return
        groups = ParallelGroups.current()
        device = pl_module.device
        sums = self._sums.to(device) if self._sums is not None else torch.zeros(2, device=device)
        self._sums = None
        all_reduce_sum(sums, groups.data_context)
        if groups.pipeline is not None and torch.distributed.get_world_size(groups.pipeline) > 1:
            all_reduce_sum(sums, groups.pipeline)  # only the last stage holds losses: every stage logs the value
        if sums[1] > 0:
            log = getattr(pl_module, "log_token_weighted", pl_module.log)
            log("val_loss", sums[0] / sums[1], prog_bar=True, batch_size=1)
