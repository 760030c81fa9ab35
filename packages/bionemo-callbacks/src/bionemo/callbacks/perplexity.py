"""Perplexity logging from the loss sums the loss reduction already computed: no logits are copied."""

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import lightning.pytorch as pl
import torch
from typing_extensions import override

from bionemo.losses import LOSS_SUM_KEY, ParallelGroups, TokenWeightedSums

__all__ = ["PerplexityLoggingCallback"]


class _Step(Protocol):
    """What the callback reads of NeMo's ``MegatronStep`` (and of the Lightning-path stand-in)."""

    @property
    def trainer(self) -> pl.Trainer: ...

    @property
    def pl_module(self) -> pl.LightningModule: ...


class PerplexityLoggingCallback(pl.Callback):
    """Log ``val_ppl`` (and, if asked, ``train_ppl``): ``exp`` of the token-weighted mean loss.

    Works from each micro-batch's ``[loss_sum, num_tokens]`` pair (``bionemo.losses.LOSS_SUM_KEY``, produced
    by :class:`bionemo.losses.MaskedTokenLossReduction`), never from the logits, so it adds two floats of
    memory per step whatever the vocabulary. Under NeMo's ``MegatronStrategy`` it runs in the
    ``on_megatron_reduce_microbatches_end`` hook, which only the last pipeline stage reaches;
    ``BionemoLightningModule`` fires the same hook under Lightning's own strategies.

    * ``train_ppl``: per step, ``exp`` of the reduced loss (already the global token-weighted mean over
      micro-batches and data/context-parallel ranks), on the last pipeline stage only (no collective).
    * ``val_ppl``: per validation epoch, ``exp(sum of loss sums / sum of token counts)`` over every
      validation micro-batch of every data- and context-parallel rank: one all-reduce over those ranks and
      one over the pipeline stages per epoch, which every stage joins (stages before the last add zeros), so
      every stage logs the same value. Tensor parallel ranks hold identical sums and are not counted twice.

    Args:
        log_train: Log ``train_ppl`` every training step.
        log_val: Log ``val_ppl`` once per validation epoch.
        groups: Process groups to reduce over; ``None`` reads megatron's current ones when needed.
    """

    def __init__(self, log_train: bool = False, log_val: bool = True, groups: ParallelGroups | None = None) -> None:
        super().__init__()
        self.log_train = log_train
        self.log_val = log_val
        self._groups = groups
        self._val_sums = TokenWeightedSums()

    @property
    def groups(self) -> ParallelGroups:
        """The process groups the validation sums are reduced over."""
        return ParallelGroups.current() if self._groups is None else self._groups

    def on_megatron_reduce_microbatches_end(
        self,
        step: _Step,
        microbatch_outputs: Sequence[Any],
        loss_reduction: Any,
        reduced: Any,
    ) -> None:
        """Record one step's loss sums (validation) or log its perplexity (training)."""
        trainer = step.trainer
        if trainer.sanity_checking or not microbatch_outputs:
            return
        if trainer.training:
            if self.log_train:
                value = torch.exp(torch.as_tensor(reduced).detach().float())
                step.pl_module.log("train_ppl", value, prog_bar=True, batch_size=1)
            return
        if not trainer.validating or not self.log_val:
            return
        self._val_sums.add([_loss_pair(out, loss_reduction) for out in microbatch_outputs])

    @override
    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._val_sums.reset()

    @override
    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or not self.log_val:
            return
        groups = self.groups
        mean_loss = self._val_sums.mean(groups.data_context, groups.pipeline, device=pl_module.device)
        self._val_sums.reset()
        if mean_loss is not None:
            pl_module.log("val_ppl", torch.exp(mean_loss), prog_bar=True, batch_size=1)


def _loss_pair(output: Any, loss_reduction: Any) -> torch.Tensor:
    if not isinstance(output, Mapping) or LOSS_SUM_KEY not in output:
        got = sorted(output) if isinstance(output, Mapping) else type(output).__name__
        raise ValueError(
            "PerplexityLoggingCallback needs each micro-batch output of the validation loss reduction to carry "
            f"{LOSS_SUM_KEY!r} = [loss_sum, num_tokens] (as MaskedTokenLossReduction does); "
            f"{type(loss_reduction).__name__} returned {got}"
        )
    return output[LOSS_SUM_KEY].detach().float()
