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
    models fire, and logs the epoch's value once, with one all-reduce over the data/context-parallel ranks and
    one over the pipeline stages.

    Whether it does so (:attr:`active`) is decided at each validation epoch's start from the module's
    validation loss reduction alone: it must declare ``token_weighted = True`` (as ``MaskedTokenLossReduction``
    does). So every rank and every pipeline stage decides alike, although only the last stage sees micro-batch
    outputs: each stage takes part in the same all-reduces (earlier stages add zeros) and logs the same
    ``val_loss``. While active, the module drops the per-step ``val_loss`` (its own and MegatronStrategy's) on
    every stage; reductions that do not declare it keep those.
    """

    def __init__(self) -> None:
        super().__init__()
        self._sums = TokenWeightedSums()
        self.active = False
        """Whether this validation epoch's ``val_loss`` is this callback's (read by the module): the same on
        every rank and pipeline stage."""

    def on_megatron_reduce_microbatches_end(
        self, step: Any, microbatch_outputs: Sequence[Any], loss_reduction: Any, reduced: Any
    ) -> None:
        """Add one validation step's pairs (only the last pipeline stage has any).

        Raises:
            ValueError: While active, a micro-batch output lacks its ``[loss_sum, num_tokens]`` pair.
        """
        trainer = step.trainer
        if not self.active or not trainer.validating or trainer.sanity_checking or not microbatch_outputs:
            return
        for out in microbatch_outputs:
            if not isinstance(out, Mapping) or LOSS_SUM_KEY not in out:
                got = sorted(out) if isinstance(out, Mapping) else type(out).__name__
                raise ValueError(
                    f"{type(loss_reduction).__name__} declares token_weighted, so TokenWeightedValidationLoss needs "
                    f"each micro-batch output to carry {LOSS_SUM_KEY!r} = [loss_sum, num_tokens]; got {got}"
                )
        self._sums.add(out[LOSS_SUM_KEY] for out in microbatch_outputs)

    @override
    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._sums.reset()
        self.active = not trainer.sanity_checking and _declares_token_weighted(pl_module)

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


def _declares_token_weighted(pl_module: pl.LightningModule) -> bool:
    """Whether ``pl_module.validation_loss_reduction()`` declares ``token_weighted`` (``False`` without one)."""
    make = getattr(pl_module, "validation_loss_reduction", None)
    return callable(make) and bool(getattr(make(), "token_weighted", False))
