"""What NeMo 2.7.3's ``MegatronStrategy`` needs handled so that ``BionemoLightningModule`` just works.

``BionemoLightningModule.configure_callbacks`` adds :class:`MegatronCompatCallback` to every trainer; it
does nothing unless the trainer's strategy is a ``MegatronStrategy``. Each fix names the measured problem
(see STACK.md, "Measured on 2 x H200"):

1. ``MegatronStep.adjust_tensor_shapes_fn`` imports ``nemo.collections.llm`` (HF datasets, modelopt) on every
   step. For PP=1 or forward-only steps the original returns ``None`` without looking at anything else; we
   return ``None`` there without the import (and also for PP>1 when that package cannot be imported, since
   then no distillation can be configured).
2. ``MegatronDataSampler.on_megatron_step_end`` logs in predict, which Lightning forbids: its
   ``output_log`` is switched off for prediction.
3. An int ``limit_val_batches`` / ``num_sanity_val_steps`` counts micro-batches under MegatronStrategy;
   below the micro-batches per step validation silently never ran. At ``fit`` start they are scaled to
   steps, unless the datamodule does this itself in NeMo's ``reconfigure_limit_batches`` hook (as
   :class:`bionemo.lightning.data.MegatronDataModule` does, for every stage).
4. Forked DataLoader workers died on CUDA garbage left from fit: garbage is collected before predict.
5. Lightning 2.4's predict loop, when fed the dataloader iterator (as MegatronStrategy does), raises
   ``UnboundLocalError: any_on_epoch`` unless ``return_predictions=True``. With ``return_predictions=False``
   the loop is told to keep predictions, and each kept batch is dropped again before the next one, so
   memory stays at one batch and ``trainer.predict`` still returns ``None``.
6. ``MegatronStrategy.save_checkpoint`` / ``load_checkpoint`` import
   ``nemo.collections.llm.modelopt.model_utils``; with ``nemo_toolkit[core]`` that import fails. When it
   does, stand-ins that save and restore no ModelOpt state are registered (a model built by a bionemo
   config has none).
7. Resuming ``fit`` with megatron-core 0.15.3's distributed optimizer over torch Adam (no Apex or
   TransformerEngine) failed twice: building the sharded state dict asserts one ``step`` per parameter
   state, which a fresh optimizer has not made yet (``BionemoLightningModule.configure_optimizers`` makes it
   up front, see :func:`bionemo.lightning.init_adam_state`); and every parameter-state loader hands
   ``_set_main_param_and_optimizer_states`` the moments without ``step`` (the step is restored from the
   param groups) while that method copies every key of the live state, so ``KeyError: 'step'``. The method
   is wrapped to leave ``step`` alone, and to give each parameter its own ``step`` tensor: the one restored
   from the param groups is a single tensor shared by all of them, which torch Adam would advance once per
   parameter per step (:func:`install_distributed_optimizer_step_fix`).
8. Without Apex or TransformerEngine, megatron-core's gradient-norm fallback (``local_multi_tensor_l2_norm``)
   launches one norm kernel per gradient and turns each result into a Python float, which waits for the GPU
   once per parameter tensor on every step (53 waits per step for a 4-layer GPT); its scale fallback (grad
   clipping, main-to-model param copies) launches two kernels per tensor. Both are swapped for torch's
   ``_foreach`` kernels, which compute the same values with one wait-free launch per tensor group
   (:func:`install_multi_tensor_fix`; a no-op when the Apex or TransformerEngine kernels are in use).
9. NeMo logs six to eight scalars per training step through ``LightningModule.log`` (global step, loss,
   learning rate, consumed samples, ...). Lightning 2.4 moves the stored metric (a torchmetrics ``Metric``)
   to the value's device on every call by walking all of its attributes: a ``self.log`` of a scalar took
   172 us on the 2-core CPU machine, 34 us when the walk is skipped for a metric already on that device,
   which is what the wrapper does (:func:`install_fast_metric_to`); the first call, or one with a value on
   another device, still moves.
"""

import dataclasses
import functools
import gc
import sys
import types
from typing import Any

import lightning.pytorch as pl
import torch
from megatron.core import parallel_state
from typing_extensions import override

from bionemo.lightning._nemo import MegatronStep, MegatronStrategy

__all__ = [
    "MegatronCompatCallback",
    "install_distributed_optimizer_step_fix",
    "install_fast_metric_to",
    "install_modelopt_stand_ins",
    "install_multi_tensor_fix",
]


class _StepWithoutDistillationShapes(MegatronStep):
    """A ``MegatronStep`` whose ``adjust_tensor_shapes_fn`` skips the ``nemo.collections.llm`` import when unused."""

    @property
    def adjust_tensor_shapes_fn(self) -> Any:  # type: ignore[override]
        """``None`` unless pipeline-parallel training might use distillation shapes (see module docstring)."""
        if self.forward_only or parallel_state.get_pipeline_model_parallel_world_size() == 1:
            return None
        try:
            return super().adjust_tensor_shapes_fn
        except ImportError:
            return None


class MegatronCompatCallback(pl.Callback):
    """Handles MegatronStrategy's rough edges for ``BionemoLightningModule`` (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self._drop_predictions = False

    def on_megatron_step_start(self, step: MegatronStep) -> MegatronStep:
        """Swap in a step whose distillation-shape hook does not import ``nemo.collections.llm``."""
        if isinstance(step, _StepWithoutDistillationShapes):
            return step
        values = {field.name: getattr(step, field.name) for field in dataclasses.fields(step)}
        return _StepWithoutDistillationShapes(**values)

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if _is_megatron(trainer):
            install_modelopt_stand_ins()
            install_distributed_optimizer_step_fix()
            install_multi_tensor_fix()
            install_fast_metric_to()

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if _is_megatron(trainer):
            _scale_limits_to_steps(trainer, ("limit_val_batches", "num_sanity_val_steps"))

    @override
    def on_predict_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._drop_predictions = False
        if not _is_megatron(trainer):
            return
        sampler = getattr(trainer.strategy, "data_sampler", None)
        if sampler is not None and hasattr(sampler, "output_log"):
            sampler.output_log = False
        if not trainer.predict_loop.return_predictions:
            trainer.predict_loop.return_predictions = True
            self._drop_predictions = True
        gc.collect()

    @override
    def on_predict_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        if self._drop_predictions:
            _clear_kept_predictions(trainer)

    @override
    def on_predict_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._drop_predictions:
            _clear_kept_predictions(trainer)
            trainer.predict_loop.return_predictions = False
            self._drop_predictions = False


def _clear_kept_predictions(trainer: pl.Trainer) -> None:
    for kept in trainer.predict_loop._predictions:  # one list per dataloader
        kept.clear()


def _is_megatron(trainer: pl.Trainer) -> bool:
    return isinstance(trainer.strategy, MegatronStrategy)


def _scale_limits_to_steps(trainer: pl.Trainer, names: tuple[str, ...]) -> None:
    """Scale the trainer's int limits unless a NeMo-style datamodule does it in ``reconfigure_limit_batches``."""
    datamodule = getattr(trainer, "datamodule", None)
    if datamodule is not None and hasattr(datamodule, "reconfigure_limit_batches"):
        return
    sampler = getattr(trainer.strategy, "data_sampler", None)
    scale_limits_to_steps(trainer, names, getattr(sampler, "num_microbatches", None) or 1)


def scale_limits_to_steps(trainer: pl.Trainer, names: tuple[str, ...], micro_batches: int) -> None:
    """Multiply the trainer's positive int limits ``names`` by ``micro_batches``, each once per trainer."""
    done: set[str] = trainer.__dict__.setdefault("_bionemo_scaled_limits", set())
    for name in names:
        value = getattr(trainer, name)
        if name in done or isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            continue
        setattr(trainer, name, value * micro_batches)
        done.add(name)


def install_modelopt_stand_ins() -> bool:
    """Register no-op ``save_modelopt_state`` / ``restore_modelopt_state`` if NeMo's cannot be imported.

    Returns:
        ``True`` when the stand-ins were installed, ``False`` when the real module imports (or they already are).
    """
    name = "nemo.collections.llm.modelopt.model_utils"
    if name in sys.modules:
        return False
    try:
        __import__(name)
        return False
    except ImportError:
        pass
    for parent in ("nemo.collections.llm", "nemo.collections.llm.modelopt"):
        if parent not in sys.modules or not hasattr(sys.modules[parent], "__path__"):
            package = types.ModuleType(parent, "bionemo stand-in: the real package cannot be imported")
            package.__path__ = []
            sys.modules[parent] = package
    module = types.ModuleType(name, "bionemo stand-in: models built by bionemo configs carry no ModelOpt state")
    module.save_modelopt_state = lambda *args, **kwargs: None  # type: ignore[attr-defined]
    module.restore_modelopt_state = lambda *args, **kwargs: None  # type: ignore[attr-defined]
    sys.modules[name] = module
    return True


def install_distributed_optimizer_step_fix() -> bool:
    """Make megatron's distributed optimizer load torch Adam state that holds a ``step`` (fix 7 above).

    Returns:
        ``True`` when the wrapper was installed now, ``False`` when it already was.
    """
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    original = DistributedOptimizer._set_main_param_and_optimizer_states
    if getattr(original, "_bionemo_keeps_step", False):
        return False

    @functools.wraps(original)
    def set_states(self: Any, model_param: Any, tensors: dict[str, Any]) -> None:
        if "step" not in tensors and not self.config.use_precision_aware_optimizer_no_fp8_or_ds_fp8:
            group_index, group_order = self.model_param_group_index_map[model_param]
            state = self.optimizer.state[self.optimizer.param_groups[group_index]["params"][group_order]]
            if "step" in state:
                # load_state_dict restored it from the param groups as ONE tensor shared by every parameter,
                # which Adam would advance once per parameter per step: each parameter gets its own copy
                state["step"] = state["step"].clone()
                tensors = {**tensors, "step": state["step"]}
        original(self, model_param, tensors)

    set_states._bionemo_keeps_step = True  # type: ignore[attr-defined]
    DistributedOptimizer._set_main_param_and_optimizer_states = set_states  # type: ignore[method-assign]
    return True


_foreach = types.SimpleNamespace(
    # torch's multi-tensor kernels (what torch.optim uses); pyright flags them as private to torch
    norm=torch._foreach_norm,  # pyright: ignore[reportPrivateImportUsage]
    mul=torch._foreach_mul,  # pyright: ignore[reportPrivateImportUsage]
    mul_=torch._foreach_mul_,  # pyright: ignore[reportPrivateImportUsage]
    copy_=torch._foreach_copy_,  # pyright: ignore[reportPrivateImportUsage]
)


def foreach_l2_norm(
    chunk_size: int, noop_flag: torch.Tensor, tensor_lists: list[list[torch.Tensor]], per_tensor: bool, *args: Any
) -> tuple[torch.Tensor, None]:
    """The L2 norm of all tensors in ``tensor_lists`` as a one-element fp32 tensor, without waiting on the GPU.

    Same arguments and result as megatron's ``local_multi_tensor_l2_norm`` (``chunk_size`` and ``noop_flag``
    are unused, as there; no per-tensor norms).
    """
    tensors = [tensor for tensor_list in tensor_lists for tensor in tensor_list]
    if not tensors:
        return torch.zeros(1, dtype=torch.float32, device=noop_flag.device), None
    norms = _foreach.norm(tensors, 2, dtype=torch.float32)
    return torch.linalg.vector_norm(torch.stack(norms)).reshape(1), None


def foreach_scale(
    chunk_size: int, noop_flag: torch.Tensor, tensor_lists: list[list[torch.Tensor]], scale: float
) -> None:
    """``dst = src * scale`` for each pair of ``tensor_lists = [srcs, dsts]``, like ``local_multi_tensor_scale``."""
    sources, targets = tensor_lists
    if not targets:
        return
    if all(source is target for source, target in zip(sources, targets, strict=True)):
        _foreach.mul_(targets, scale)
    elif scale == 1.0:
        _foreach.copy_(targets, sources)
    else:
        _foreach.copy_(targets, _foreach.mul(sources, scale))


def install_multi_tensor_fix() -> bool:
    """Replace megatron-core's per-tensor gradient norm and scale fallbacks with ``_foreach`` kernels (fix 8).

    Only the fallbacks are replaced: where megatron found Apex's or TransformerEngine's fused kernels, those stay.

    Returns:
        ``True`` when something was replaced now, ``False`` when nothing (left) to replace.
    """
    from megatron.core import optimizer as optimizer_package
    from megatron.core import utils
    from megatron.core.optimizer import clip_grads

    replaced = False
    if clip_grads.l2_norm_impl is utils.local_multi_tensor_l2_norm:
        clip_grads.l2_norm_impl = foreach_l2_norm
        replaced = True
    modules: tuple[Any, ...] = (clip_grads, optimizer_package.optimizer)
    for module in modules:
        if module.multi_tensor_scale_impl is utils.local_multi_tensor_scale:
            module.multi_tensor_scale_impl = foreach_scale
            replaced = True
    return replaced


def install_fast_metric_to() -> bool:
    """Skip Lightning's per-``log`` move of a logged metric that is already on the value's device (fix 9).

    Returns:
        ``True`` when the wrapper was installed now, ``False`` when it already was.
    """
    from lightning.pytorch.trainer.connectors.logger_connector.result import _ResultMetric

    original = _ResultMetric.to
    if getattr(original, "_bionemo_fast", False):
        return False

    @functools.wraps(original)
    def to(self: Any, *args: Any, **kwargs: Any) -> Any:
        device = args[0] if len(args) == 1 and not kwargs else None
        state = self.__dict__
        value, count = state.get("value"), state.get("cumulated_batch_size")
        if (
            isinstance(device, str | torch.device)
            and isinstance(value, torch.Tensor)
            and value.device == torch.device(device)
            and (not isinstance(count, torch.Tensor) or count.device == value.device)
        ):
            return self
        return original(self, *args, **kwargs)

    to._bionemo_fast = True  # type: ignore[attr-defined]
    _ResultMetric.to = to  # type: ignore[method-assign]
    return True
