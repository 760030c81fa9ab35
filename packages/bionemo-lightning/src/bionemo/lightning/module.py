"""BionemoLightningModule: one LightningModule for megatron-core models, under MegatronStrategy or Lightning's own."""

import itertools
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic

import lightning.pytorch as pl
import torch
from megatron.core.distributed import DistributedDataParallel
from megatron.core.transformer.module import Float16Module
from typing_extensions import override

from bionemo.core import BionemoTrainableModelConfig, DataStep, ForwardStep, LossT, ModelT, using_device
from bionemo.lightning._init_args import init_call, record_init_calls
from bionemo.lightning.megatron_compat import MegatronCompatCallback
from bionemo.lightning.prediction import LightningPassthroughPredictionMixin
from bionemo.lightning.step_runner import StepRunner, step_runner_for, trainer_callbacks
from bionemo.lightning.validation_loss import TokenWeightedValidationLoss

if TYPE_CHECKING:
    from bionemo.lightning._nemo import MegatronOptimizerModule

__all__ = ["BionemoLightningModule"]

_IO = "_bionemo_nemo_io"


class BionemoLightningModule(
    pl.LightningModule,
    LightningPassthroughPredictionMixin,
    Generic[ModelT, LossT],
):
    """A LightningModule for megatron-core models that follows NeMo 2 conventions.

    **Under NeMo's MegatronStrategy** (GPUs; TP/PP/CP/DP) the strategy runs the micro-batch loop: it calls
    :meth:`data_step`, then ``training_step(batch)`` / ``validation_step(batch)`` / ``predict_step(batch)`` as
    the forward step of the last pipeline stage (:meth:`forward_step` on other stages), then the
    ``*_loss_reduction()`` of the step. Those steps return the model output, and the reduction makes the loss.

    **Under Lightning's own strategies** (CPU, one device, DDP) Lightning hands each step a batch; the
    module applies its ``data_step``, ``forward_step`` and loss reduction itself and returns the loss, and
    fires the same ``on_megatron_reduce_microbatches_end`` callback hook, so callbacks such as
    :class:`bionemo.callbacks.PerplexityLoggingCallback` work under both. The connected optimizer module's
    ``OptimizerConfig`` is honoured with the matching torch optimizer and its ``clip_grad``.

    Every hook that differs between the two hands over to the step runner of the trainer's strategy
    (:mod:`bionemo.lightning.step_runner`); only the MegatronStrategy one imports NeMo. NeMo's record of the
    constructor arguments (``__io__``, for its checkpoint context and ``io.reinit``) is made from the recorded
    call when NeMo asks for it, or at construction when NeMo is already imported (as NeMo's ``IOMixin`` does).

    Args:
        config: Builds the model (``configure_model(**model_construct_args)``) and names the loss reduction
            class. Under MegatronStrategy it must also be a megatron ``TransformerConfig``.
        forward_step: ``forward_step(model, batch) -> output``.
        data_step: ``data_step(dataloader_iter) -> batch``: takes one micro-batch, ready for the model.
        optimizer: A NeMo ``MegatronOptimizerModule``; ``connect``-ed to this module here. ``None``: the module
            only predicts, on Lightning's own strategies (nothing imports NeMo for it); training and
            MegatronStrategy need one.
        model_transform: Applied to the model right after it is built (PEFT/LoRA adapters, freezing, ...);
            its return value replaces the model, ``None`` meaning it changed the model in place.
        **model_construct_args: Passed to ``config.configure_model``.
    """

    def __init__(
        self,
        config: BionemoTrainableModelConfig[ModelT, LossT],
        forward_step: ForwardStep,
        data_step: DataStep,
        optimizer: "MegatronOptimizerModule | None",
        model_transform: Callable[[ModelT], ModelT | None] | None = None,
        **model_construct_args: Any,
    ) -> None:
        super().__init__()
        self.config = config
        self.module_construct_args: dict[str, Any] = model_construct_args
        # Megatron builds the model inside configure_model(); NeMo expects it under `module`.
        self.module: ModelT | None = None
        self.loss_reduction_class: type[LossT] = config.get_loss_reduction_class()
        self._forward_step = forward_step
        self._data_step = data_step
        # Stored privately: NeMo treats a public `model_transform` as one its ModelTransform callback applies.
        self._model_transform = model_transform
        self.optim = optimizer
        self._megatron_configure_optimizers: Callable[..., Any] | None = None
        if optimizer is not None:
            optimizer.connect(self)
            # connect() binds the Megatron optimizer factory as an instance attribute; keep it and dispatch in
            # configure_optimizers() so Lightning's own strategies get a torch optimizer instead.
            self._megatron_configure_optimizers = self.__dict__.pop("configure_optimizers")

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        record_init_calls(cls, _record_nemo_io_if_loaded)

    @property
    def __io__(self) -> Any:
        """NeMo's record of the constructor call (a fiddle ``Config``), made from the recorded arguments.

        What NeMo's ``io.IOMixin`` would capture, with ``**model_construct_args`` stored as named arguments (see
        :func:`bionemo.lightning._nemo.io_capture.io_config`). Building it imports NeMo.
        """
        io = self.__dict__.get(_IO)
        if io is None:
            from bionemo.lightning._nemo.io_capture import io_config

            io = self.__dict__[_IO] = io_config(self, init_call(self))
        return io

    @__io__.setter
    def __io__(self, value: Any) -> None:
        self.__dict__[_IO] = value

    # --- model -----------------------------------------------------------------------------------------

    @override
    def configure_model(self) -> None:
        """Build the model from the config once (later calls do nothing), then apply ``model_transform``.

        Raises:
            ValueError: When ``config.configure_model`` returns ``None``.
        """
        if self.module is not None:
            return
        self._step_runner().prepare_model(self)
        model = self.config.configure_model(**self.module_construct_args)
        if model is None:
            raise ValueError(f"{type(self.config).__name__}.configure_model() returned None; it must return the model")
        if self._model_transform is not None:
            transformed = self._model_transform(model)
            model = model if transformed is None else transformed
        self.module = model

    @override
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Call the underlying model with the given arguments and return its output."""
        self.configure_model()
        assert self.module is not None
        return self.module(*args, **kwargs)

    def data_step(self, dataloader_iter: Iterator[Any]) -> Any:
        """Take one micro-batch from ``dataloader_iter`` and prepare it with the configured ``data_step``.

        An empty micro-batch (a data-parallel rank's share of the last, partial predict batch) is returned
        as ``None`` without calling ``data_step``; it predicts nothing.
        """
        batches = _batches_only(dataloader_iter)
        first = next(batches)
        if _is_empty(first):
            return None
        with using_device(self.compute_device()):  # bionemo.core.compute_device() inside the data step
            return self._data_step(itertools.chain([first], batches))

    def forward_step(self, batch: Any) -> Any:
        """Run the configured ``forward_step(model, batch)`` and return the model output (not a loss)."""
        self.configure_model()
        return self._forward_step(self.module, batch)

    def sharded_state_dict(self, prefix: str = "", metadata: dict | None = None, **kwargs: Any) -> dict[str, Any]:
        """The model's megatron sharded state dict under ``module.``, whatever wraps the model.

        Without this NeMo names the weights after the wrappers: training wraps the model in megatron's DDP,
        which adds a ``module.`` level, prediction does not, so a checkpoint saved while training could not
        be loaded for prediction. Unwrapping keeps one naming for both.
        """
        self.configure_model()
        return self.unwrapped_module().sharded_state_dict(prefix=f"{prefix}module.", metadata=metadata, **kwargs)

    def unwrapped_module(self) -> Any:
        """The configured megatron model itself, without the DDP and ``Float16Module`` wrappers that training adds.

        Raises:
            RuntimeError: Before ``configure_model`` has built the model.
        """
        model: Any = self.module
        while isinstance(model, DistributedDataParallel | Float16Module):
            model = model.module
        if model is None:
            raise RuntimeError("the model is not built yet: call configure_model() (the Trainer does) first")
        return model

    # --- steps -----------------------------------------------------------------------------------------

    @override
    def training_step(self, batch: Any, batch_idx: int | None = None) -> Any:
        """Megatron: the model output for this micro-batch. Lightning: the loss to minimize."""
        return self._step_runner().training_step(self, batch)

    @override
    def validation_step(self, batch: Any, batch_idx: int | None = None) -> Any:
        """Megatron: the model output for this micro-batch. Lightning: the reduced validation loss."""
        return self._step_runner().validation_step(self, batch)

    @override
    def test_step(self, batch: Any, batch_idx: int | None = None) -> Any:
        """Megatron: the model output for this micro-batch. Lightning: the reduced test loss."""
        return self._step_runner().test_step(self, batch)

    @override
    def predict_step(self, batch: Any, batch_idx: int | None = None, dataloader_idx: int | None = None) -> Any:
        """The model output; an empty batch predicts nothing (``None``).

        When the output is a dict and the batch carries ``sample_index`` (each sample's input position), the
        output carries it too, so predictions from several ranks can be put back into input order.
        """
        if _is_empty(batch):
            return None
        return self._step_runner().predict_step(self, batch)

    # --- loss reductions -------------------------------------------------------------------------------

    def training_loss_reduction(self) -> LossT:
        """The config's loss reduction, built for training."""
        return self.loss_reduction_class()

    def validation_loss_reduction(self) -> LossT:
        """The config's loss reduction class built with ``validation_step=True``."""
        return self.loss_reduction_class(validation_step=True)  # type: ignore[call-arg]

    def test_loss_reduction(self) -> LossT:
        """The config's loss reduction class built with ``validation_step=True``."""
        return self.loss_reduction_class(validation_step=True)  # type: ignore[call-arg]

    # --- optimizers and callbacks ----------------------------------------------------------------------

    @override
    def configure_optimizers(self, megatron_parallel: Any = None) -> Any:
        """Megatron: the connected ``MegatronOptimizerModule``'s optimizer. Lightning: the matching torch one.

        Under Megatron the optimizer's Adam state is created at once (:func:`init_adam_state`), so that
        ``fit(ckpt_path=...)`` can load a distributed-optimizer checkpoint into it.
        """
        return self._step_runner().configure_optimizers(self, megatron_parallel)

    @override
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Let the step runner adjust the checkpoint before the trainer restores its loops from it."""
        self._step_runner().on_load_checkpoint(self, checkpoint)

    @override
    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Finish the step (Lightning's strategies): token-weighted gradients over the global batch, its loss logged.

        Under MegatronStrategy nothing happens here: megatron's schedule has done both.
        """
        self._step_runner().before_optimizer_step(self, optimizer)

    @override
    def configure_gradient_clipping(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        """Clip gradients to the optimizer config's ``clip_grad`` unless the Trainer sets its own clipping.

        Under MegatronStrategy megatron's optimizer clips by ``clip_grad`` itself, so nothing happens here.
        """
        self._step_runner().clip_gradients(self, optimizer, gradient_clip_val, gradient_clip_algorithm)

    @override
    def configure_callbacks(self) -> Sequence[pl.Callback]:
        """Add :class:`MegatronCompatCallback` and :class:`TokenWeightedValidationLoss` unless the trainer has them.

        The compatibility callback is inactive off MegatronStrategy; under it, it applies the upstream
        work-arounds the stage needs and removes them at teardown. To leave some out, give the Trainer a
        ``MegatronCompatCallback(skip=[...])`` (or set ``BIONEMO_SKIP_WORKAROUNDS``).
        """
        present = trainer_callbacks(self.trainer) if self._trainer is not None else []
        wanted = (MegatronCompatCallback, TokenWeightedValidationLoss)
        return [kind() for kind in wanted if not any(isinstance(cb, kind) for cb in present)]

    @override
    def log(self, name: str, value: Any, *args: Any, **kwargs: Any) -> None:
        """Lightning's ``log``, except per-step ``val_loss`` while :class:`TokenWeightedValidationLoss` logs it."""
        weighted = name == "val_loss" and self._trainer is not None
        if weighted and any(
            isinstance(cb, TokenWeightedValidationLoss) and cb.active for cb in trainer_callbacks(self.trainer)
        ):
            return
        super().log(name, value, *args, **kwargs)

    def log_token_weighted(self, name: str, value: Any, *args: Any, **kwargs: Any) -> None:
        """Lightning's ``log`` for the epoch's token-weighted ``val_loss`` (see :meth:`log`)."""
        super().log(name, value, *args, **kwargs)

    def compute_device(self) -> torch.device:
        """The trainer's device (``--accelerator cpu`` on a GPU machine is the CPU); without a trainer, the module's."""
        return self.trainer.strategy.root_device if self._trainer is not None else self.device

    # --- internals -------------------------------------------------------------------------------------

    def _step_runner(self) -> StepRunner:
        """The step runner of the trainer's strategy (:func:`~bionemo.lightning.step_runner.step_runner_for`)."""
        return step_runner_for(self._trainer)


def _record_nemo_io_if_loaded(module: BionemoLightningModule) -> None:
    """With NeMo imported, make its record of the constructor call now, before ``__init__`` runs, as IOMixin does."""
    if "nemo.lightning.io.mixin" in sys.modules:
        _ = module.__io__


record_init_calls(BionemoLightningModule, _record_nemo_io_if_loaded)


def _batches_only(dataloader_iter: Iterator[Any]) -> Iterator[Any]:
    """Yield plain batches from Lightning's dataloader-iter fetcher, which yields (batch, idx, dataloader_idx)."""
    from lightning.pytorch.loops.fetchers import _DataFetcherWrapper

    if isinstance(dataloader_iter, _DataFetcherWrapper):
        return (item[0] for item in dataloader_iter)
    return dataloader_iter


def _is_empty(batch: Any) -> bool:
    if batch is None:
        return True
    if isinstance(batch, torch.Tensor):
        return batch.numel() == 0
    if isinstance(batch, Mapping | list | tuple):
        if len(batch) == 0:
            return True
        first = next(iter(batch.values())) if isinstance(batch, Mapping) else batch[0]
        return isinstance(first, torch.Tensor) and first.dim() > 0 and first.shape[0] == 0
    return False
