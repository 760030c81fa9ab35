"""The step runner for NeMo's ``MegatronStrategy`` (see :mod:`bionemo.lightning.step_runner`).

The strategy runs the micro-batch loop: it calls the module's ``data_step``, then ``training_step(batch)`` /
``validation_step(batch)`` / ``predict_step(batch)`` as the forward step of the last pipeline stage
(``forward_step`` on other stages), then the step's ``*_loss_reduction()``. So every step here returns the model
output, the optimizer is the connected ``MegatronOptimizerModule``'s, and megatron's optimizer clips by
``clip_grad`` itself.
"""

from typing import TYPE_CHECKING, Any

import torch

from bionemo.lightning.optimizer import init_adam_state
from bionemo.lightning.step_runner import with_sample_index

if TYPE_CHECKING:
    from bionemo.lightning.module import BionemoLightningModule

__all__ = ["MEGATRON_STEP_RUNNER", "MegatronStepRunner"]


class MegatronStepRunner:
    """NeMo's ``MegatronStrategy``: steps return model outputs; the strategy reduces the loss and steps."""

    def prepare_model(self, module: "BionemoLightningModule") -> None:
        """Make megatron train the step's global token-weighted mean for token-weighted loss reductions.

        Megatron's default averages per-micro-batch means, weighting the tokens of short micro-batches more;
        ``calculate_per_token_loss`` gives one objective on every path. NeMo reads the optimizer module's
        config even to predict, so the module must have one.
        """
        if module.optim is None:
            raise ValueError(
                "MegatronStrategy needs BionemoLightningModule's optimizer (NeMo reads its config even to predict); "
                "optimizer=None works on Lightning's own strategies only"
            )
        if getattr(module.loss_reduction_class, "token_weighted", False) and hasattr(
            module.config, "calculate_per_token_loss"
        ):
            module.config.calculate_per_token_loss = True  # type: ignore[attr-defined]

    def training_step(self, module: "BionemoLightningModule", batch: Any) -> Any:
        """The model output for this micro-batch."""
        return module.forward_step(batch)

    def validation_step(self, module: "BionemoLightningModule", batch: Any) -> Any:
        """The model output for this micro-batch."""
        return module.forward_step(batch)

    def test_step(self, module: "BionemoLightningModule", batch: Any) -> Any:
        """The model output for this micro-batch."""
        return module.forward_step(batch)

    def predict_step(self, module: "BionemoLightningModule", batch: Any) -> Any:
        """The model output for this micro-batch, with its ``sample_index``; the strategy's reduction collates."""
        return with_sample_index(module.forward_step(batch), batch)

    def configure_optimizers(self, module: "BionemoLightningModule", megatron_parallel: Any = None) -> Any:
        """The connected ``MegatronOptimizerModule``'s optimizer, its Adam state created at once.

        The state is made up front (:func:`~bionemo.lightning.init_adam_state`), so that ``fit(ckpt_path=...)`` can
        load a distributed-optimizer checkpoint into it.
        """
        configure = module._megatron_configure_optimizers
        if configure is None:  # prepare_model refused this already; kept for the type checker
            raise ValueError("MegatronStrategy needs BionemoLightningModule's optimizer")
        optimizers = configure(megatron_parallel=megatron_parallel)
        for optimizer in optimizers if isinstance(optimizers, list | tuple) else [optimizers]:
            init_adam_state(optimizer)
        return optimizers

    def before_optimizer_step(self, module: "BionemoLightningModule", optimizer: torch.optim.Optimizer) -> None:
        """Nothing: megatron's schedule and ``finalize_model_grads`` have made the step's gradients."""

    def clip_gradients(
        self,
        module: "BionemoLightningModule",
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: float | None,
        gradient_clip_algorithm: str | None,
    ) -> None:
        """Nothing: megatron's optimizer clips by the config's ``clip_grad`` itself."""


MEGATRON_STEP_RUNNER = MegatronStepRunner()
"""The runner for MegatronStrategy (it holds no state)."""
