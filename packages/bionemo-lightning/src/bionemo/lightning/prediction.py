"""The pass-through prediction contract: predict with the model's raw outputs, each sample's position beside them."""

from collections.abc import Mapping
from typing import Any

from bionemo.callbacks import DEFAULT_INDEX_KEY
from bionemo.losses import PassthroughLossReduction

__all__ = ["LightningPassthroughPredictionMixin", "with_sample_index"]


class LightningPassthroughPredictionMixin:
    """Gives a Lightning module a ``predict_loss_reduction`` that hands the forward output through.

    NeMo's ``MegatronStrategy`` runs a loss reduction after every forward step, prediction included; with
    :class:`PassthroughLossReduction` the prediction step returns the model outputs of all micro-batches,
    collated into one batch.
    """

    def predict_loss_reduction(self) -> PassthroughLossReduction:
        """The reduction used by ``trainer.predict``: outputs pass through and are collated."""
        return PassthroughLossReduction()


def with_sample_index(output: Any, batch: Any) -> Any:
    """``output`` with the batch's ``sample_index`` (each sample's input position) when both are dicts."""
    if isinstance(output, Mapping) and isinstance(batch, Mapping) and DEFAULT_INDEX_KEY in batch:
        return {**output, DEFAULT_INDEX_KEY: batch[DEFAULT_INDEX_KEY]}
    return output
