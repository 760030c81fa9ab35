"""Keep the weights of the best validation so far, and put them back when training ends (also after a resume)."""

from pathlib import Path
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

    With ``directory`` (the run's checkpoint folder) the best survives a resume: the best value and step go into
    every training checkpoint (the callback's state), and each rank writes its copy beside it
    (``best-weights-rank{R}.safetensors``, rewritten only when a better validation came since), tagged with the
    step. A run resumed from that checkpoint reads the copy of the same step back; without one (another step: the
    run resumed from an older checkpoint) the best restarts from the resumed run's validations.
    """

    def __init__(self, metric: BestMetric, directory: Path | None = None) -> None:
        super().__init__()
        self.metric = metric
        self.directory = directory
        self.best: float | None = None
        self.best_step: int | None = None
        self._state: dict[str, torch.Tensor] | None = None
        self._written_step: int | None = None
        self._resumed = False

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "best_step": self.best_step}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.best, self.best_step = state_dict.get("best"), state_dict.get("best_step")
        self._resumed = True

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self._resumed or self.best_step is None or self.directory is None:
            return
        self._resumed = False
        path = self._path(trainer)
        if path.is_file():
            from safetensors import safe_open

            with safe_open(str(path), framework="pt") as f:
                if (f.metadata() or {}).get("step") == str(self.best_step):
                    self._state = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118
                    self._written_step = self.best_step
        if self._state is None:
            self.best = self.best_step = None

    @override
    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        if self.directory is None or self._state is None or self._written_step == self.best_step:
            return
        from bionemo.core.safetensors_io import save_safetensors_atomically

        self.directory.mkdir(parents=True, exist_ok=True)
        save_safetensors_atomically(self._state, self._path(trainer), {"step": str(self.best_step)})
        self._written_step = self.best_step

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

    def _path(self, trainer: pl.Trainer) -> Path:
        assert self.directory is not None
        return self.directory / f"best-weights-rank{trainer.global_rank}.safetensors"


def _model(pl_module: Any) -> torch.nn.Module:
    """The megatron model itself (``BionemoLightningModule.unwrapped_module``), or the module."""
    unwrap = getattr(pl_module, "unwrapped_module", None)
    return unwrap() if unwrap is not None else pl_module
