"""The pass-through prediction contract: predict with the model's raw outputs."""

from bionemo.losses import PassthroughLossReduction

__all__ = ["LightningPassthroughPredictionMixin"]


class LightningPassthroughPredictionMixin:
    """Gives a Lightning module a ``predict_loss_reduction`` that hands the forward output through.

    NeMo's ``MegatronStrategy`` runs a loss reduction after every forward step, prediction included; with
    :class:`PassthroughLossReduction` the prediction step returns the model outputs of all micro-batches,
    collated into one batch.
    """

    def predict_loss_reduction(self) -> PassthroughLossReduction:
        """The reduction used by ``trainer.predict``: outputs pass through and are collated."""
        return PassthroughLossReduction()
