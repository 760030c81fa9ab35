"""The step runner for NeMo's ``MegatronStrategy`` (see :mod:`bionemo.lightning.step_runner`).

The strategy runs the micro-batch loop: it calls the module's ``data_step``, then ``training_step(batch)`` /
``validation_step(batch)`` / ``predict_step(batch)`` as the forward step of the last pipeline stage
(``forward_step`` on other stages), then the step's ``*_loss_reduction()``. So every step here returns the model
output, the optimizer is the connected ``MegatronOptimizerModule``'s, and megatron's optimizer clips by
``clip_grad`` itself.
"""

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import lightning.pytorch as pl
import torch
from megatron.core import num_microbatches_calculator
from torch.utils.data import DataLoader, Sampler

from bionemo.lightning.global_batches import BatchLayout
from bionemo.lightning.optimizer import init_adam_state
from bionemo.lightning.prediction import with_sample_index

if TYPE_CHECKING:
    from bionemo.lightning.data import MegatronDataModule
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

    def data_parallel_size(self, trainer: pl.Trainer) -> int:
        """Processes over tensor x pipeline x context parallel ranks."""
        strategy: Any = trainer.strategy
        model_parallel = (
            strategy.tensor_model_parallel_size * strategy.pipeline_model_parallel_size * strategy.context_parallel_size
        )
        return max(1, trainer.world_size // model_parallel)

    def setup_data(self, data: "MegatronDataModule", trainer: pl.Trainer, stage: str, layout: BatchLayout) -> None:
        """Give NeMo's data sampler the step's global batch: ``layout``'s, one micro-batch per rank to predict.

        In prediction a step of several micro-batches would come up short at the end and its samples would be
        lost, so prediction runs one micro-batch per data-parallel rank per step.
        """
        global_batch_size = (
            layout.micro_batch_size * layout.data_parallel_size if stage == "predict" else layout.global_batch_size
        )
        data.data_sampler.global_batch_size = global_batch_size
        # megatron keeps one process-wide micro-batch calculator, and NeMo refuses to re-initialize it with a
        # different global batch size (e.g. predicting in the process that trained): reset it first.
        if (
            num_microbatches_calculator._GLOBAL_NUM_MICROBATCHES_CALCULATOR is not None
            and num_microbatches_calculator.get_current_global_batch_size() != global_batch_size
        ):
            num_microbatches_calculator.unset_num_microbatches_calculator()

    def train_sampler(
        self, trainer: pl.Trainer, size: int, layout: BatchLayout, *, shuffle: bool, seed: int
    ) -> Sampler[int] | None:
        """None: NeMo's data sampler shards the data and counts consumed samples itself (megatron's order)."""
        return None

    def dataloader(self, mode: str) -> Callable[..., DataLoader]:
        """NeMo's ``WrappedDataLoader`` in ``mode``, which NeMo's data sampler reads (``drop_last``, predict index)."""
        from bionemo.lightning._nemo import WrappedDataLoader

        return functools.partial(WrappedDataLoader, mode=mode)

    def on_load_checkpoint(self, module: "BionemoLightningModule", checkpoint: dict[str, Any]) -> None:
        """Nothing: NeMo's data sampler resumes from the consumed samples (one Lightning batch is one step)."""

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
