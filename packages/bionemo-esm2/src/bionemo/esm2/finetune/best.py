"""Keep the weights of the best validation so far, and put them back when training ends."""

from typing import Any

import lightning.pytorch as pl
import torch
from typing_extensions import override

from bionemo.esm2.finetune.metrics import BestMetric, Mode

__all__ = ["BestWeights"]


class BestWeights(pl.Callback):
    """After each validation, copy this rank's trainable weights to host memory when ``metric`` improved on its best.

    ``restore(module)`` loads the copy back (each rank its own shards: no collective), so the exported model is the
    best validation's, not the last step's. Only parameters that train are kept (the head and adapters, or the whole
    model when the encoder trains too); a metric that is NaN never counts as better.
    """

    def __init__(self, metric: BestMetric) -> None:
        super().__init__()
        self.metric = metric
        self.best: float | None = None
        self.best_step: int | None = None
        self._state: dict[str, torch.Tensor] | None = None

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        value = trainer.callback_metrics.get(self.metric.key)
        if value is None:
            return
        current = float(value)
        if current != current:  # NaN
            return
        if self.best is not None and (current <= self.best if self.metric.mode is Mode.MAX else current >= self.best):
            return
        self.best, self.best_step = current, trainer.global_step
        model = _model(pl_module)
        trainable = {name for name, param in model.named_parameters() if param.requires_grad}
        self._state = {
            name: value.detach().to("cpu", copy=True) for name, value in model.state_dict().items() if name in trainable
        }

    def restore(self, pl_module: pl.LightningModule) -> bool:
        """Load the best weights into ``pl_module``'s model; False when no validation has been seen."""
        if self._state is None:
            return False
        model = _model(pl_module)
        state = model.state_dict()
        with torch.no_grad():
            for name, value in self._state.items():
                state[name].copy_(value)
        return True


def _model(pl_module: Any) -> torch.nn.Module:
    """The megatron model itself (``BionemoLightningModule.unwrapped_module``), or the module."""
    unwrap = getattr(pl_module, "unwrapped_module", None)
    return unwrap() if unwrap is not None else pl_module
