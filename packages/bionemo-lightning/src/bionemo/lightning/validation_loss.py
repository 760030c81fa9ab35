"""``val_loss`` as the global token-weighted mean over the validation epoch, on every strategy."""

from collections.abc import Mapping, Sequence
from typing import Any

import lightning.pytorch as pl
from typing_extensions import override

from bionemo.losses import LOSS_SUM_KEY, ParallelGroups, TokenWeightedSums

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
        self._sums = TokenWeightedSums()
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
        self._sums.add(out[LOSS_SUM_KEY] for out in microbatch_outputs)

    @override
    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._sums.reset()

    @override
    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or not self.active:
            return
        groups = ParallelGroups.current()
        # only the last pipeline stage holds losses: summing over the pipeline too lets every stage log the value
        val_loss = self._sums.mean(groups.data_context, groups.pipeline, device=pl_module.device)
        self._sums.reset()
        if val_loss is not None:
            log = getattr(pl_module, "log_token_weighted", pl_module.log)
            log("val_loss", val_loss, prog_bar=True, batch_size=1)
