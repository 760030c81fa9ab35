"""The work-arounds that NeMo 2.7.3's ``MegatronStrategy`` needs for ``BionemoLightningModule``, per trainer.

``BionemoLightningModule.configure_callbacks`` adds :class:`MegatronCompatCallback` to every trainer that has
none. Off MegatronStrategy it does nothing. Under MegatronStrategy it applies the work-arounds of
:mod:`bionemo.lightning.workarounds` that the stage needs, each only on the upstream versions it was verified on
(on others it warns once, :class:`~bionemo.lightning.workarounds.UnverifiedUpstreamWarning`, and leaves it out),
and puts back every original at teardown (also after an exception), so that after the run no megatron-core,
NeMo or Lightning attribute is left patched. NeMo is imported only when a work-around needs it. Each
work-around's module says what it fixes and why:

==================================== ========= ==================================================================
name                                 stages    what it works around
==================================== ========= ==================================================================
``step_without_distillation_shapes`` all       NeMo imports ``nemo.collections.llm`` on every step
``predict_without_sampler_log``      predict   NeMo's data sampler logs in predict (Lightning forbids it)
``limit_batches_to_steps``           fit       an int ``limit_val_batches`` counts micro-batches, not steps
``predict_loop_keep_predictions``    predict   Lightning's ``UnboundLocalError: any_on_epoch`` when not returning
``modelopt_stand_ins``               all       NeMo's checkpoint save / load import ``nemo.collections.llm``
``distributed_optimizer_step``       fit       megatron's distributed optimizer cannot resume torch Adam state
``multi_tensor_foreach``             fit       speed-up: megatron's grad norm fallback waits on the GPU per tensor
``fused_adam``                       fit       speed-up: megatron's torch Adam fallback runs multi-tensor kernels
==================================== ========= ==================================================================

Switches: every work-around, the speed-ups included, is on by default and can be left out by name,
``MegatronCompatCallback(skip=["multi_tensor_foreach"])`` given to the ``Trainer`` (the module then adds no second
one), or with the environment variable ``BIONEMO_SKIP_WORKAROUNDS=multi_tensor_foreach,fused_adam`` for the
callback the module adds. Leaving out a fix brings back the upstream failure it describes.

The ``install_*`` functions are the earlier process-wide entry points: they apply a work-around for the rest of
the process, with no undo.
"""

import os
from collections.abc import Collection
from typing import TYPE_CHECKING

import lightning.pytorch as pl
from typing_extensions import override

from bionemo.lightning.batch_limits import scale_limits_to_steps
from bionemo.lightning.step_runner import is_megatron_strategy
from bionemo.lightning.workarounds import (
    DISTRIBUTED_OPTIMIZER_STEP,
    FUSED_ADAM,
    LIMIT_BATCHES_TO_STEPS,
    MODELOPT_STAND_INS,
    MULTI_TENSOR_FOREACH,
    PREDICT_LOOP_KEEP_PREDICTIONS,
    PREDICT_WITHOUT_SAMPLER_LOG,
    STEP_WITHOUT_DISTILLATION_SHAPES,
    WORKAROUNDS,
    Patches,
    Workaround,
)
from bionemo.lightning.workarounds.fused_adam import fuse_adam
from bionemo.lightning.workarounds.limit_batches_to_steps import scale_fit_limits
from bionemo.lightning.workarounds.modelopt_stand_ins import checkpoint_with_stand_ins, register_stand_ins
from bionemo.lightning.workarounds.multi_tensor_foreach import foreach_l2_norm, foreach_scale
from bionemo.lightning.workarounds.predict_loop_keep_predictions import keep_predictions, stop_keeping_predictions
from bionemo.lightning.workarounds.predict_without_sampler_log import stop_sampler_log
from bionemo.lightning.workarounds.step_without_distillation_shapes import without_distillation_shapes

if TYPE_CHECKING:
    from bionemo.lightning._nemo import MegatronStep

__all__ = [
    "SKIP_ENV",
    "MegatronCompatCallback",
    "foreach_l2_norm",
    "foreach_scale",
    "install_distributed_optimizer_step_fix",
    "install_modelopt_stand_ins",
    "install_multi_tensor_fix",
    "scale_limits_to_steps",
]

SKIP_ENV = "BIONEMO_SKIP_WORKAROUNDS"
"""Comma-separated work-around names the callback leaves out when it is built without ``skip``."""


class MegatronCompatCallback(pl.Callback):
    """Applies the upstream work-arounds a MegatronStrategy run needs, and removes them at teardown.

    Args:
        skip: Names of work-arounds to leave out (see the module docstring); ``None`` reads the comma-separated
            environment variable ``BIONEMO_SKIP_WORKAROUNDS`` (empty or unset: none).

    Raises:
        ValueError: When ``skip`` names an unknown work-around.
    """

    def __init__(self, *, skip: Collection[str] | None = None) -> None:
        super().__init__()
        if isinstance(skip, str):
            raise TypeError(f"skip must be a collection of work-around names, not the string {skip!r}")
        given = _skip_from_env() if skip is None else frozenset(skip)
        valid = sorted(workaround.name for workaround in WORKAROUNDS)
        unknown = sorted(given - set(valid))
        if unknown:
            source = f"${SKIP_ENV}" if skip is None else "skip"
            raise ValueError(f"{source} names unknown work-arounds {unknown}; valid names: {valid}")
        self.skip = given
        self._patches = Patches()
        self._applied: set[str] = set()
        self._keeping_nothing = False

    @property
    def applied(self) -> frozenset[str]:
        """Names of the work-arounds in effect now (until teardown)."""
        return frozenset(self._applied)

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Under MegatronStrategy: install the process-wide work-arounds the stage needs."""
        if not _is_megatron(trainer):
            return
        for workaround in WORKAROUNDS:
            if workaround.install is not None and stage in workaround.stages:
                self._use(workaround)
        if self._use(MODELOPT_STAND_INS):
            checkpoint_with_stand_ins(trainer.strategy)

    def on_megatron_step_start(self, step: "MegatronStep") -> "MegatronStep":
        """NeMo hook: the step, as one whose distillation-shape hook does not import ``nemo.collections.llm``."""
        if self._use(STEP_WITHOUT_DISTILLATION_SHAPES):
            return without_distillation_shapes(step)
        return step

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if _is_megatron(trainer) and self._use(LIMIT_BATCHES_TO_STEPS):
            scale_fit_limits(trainer, self._patches)

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """After a checkpoint's optimizer state is loaded (it brings the saving run's Adam settings)."""
        if _is_megatron(trainer) and self._use(FUSED_ADAM):
            fuse_adam(trainer.optimizers)

    @override
    def on_predict_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._keeping_nothing = False
        if not _is_megatron(trainer):
            return
        if self._use(PREDICT_WITHOUT_SAMPLER_LOG):
            stop_sampler_log(trainer, self._patches)
        if self._use(PREDICT_LOOP_KEEP_PREDICTIONS):
            self._keeping_nothing = keep_predictions(trainer, self._patches)

    @override
    def on_predict_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._keeping_nothing:
            stop_keeping_predictions(trainer)
            self._keeping_nothing = False

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.remove()

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        """Lightning calls no teardown hook after an exception; nothing a checkpoint save needs is removed here."""
        self.remove()

    def remove(self) -> None:
        """Put back every original this callback replaced (the last one first)."""
        self._patches.restore()
        self._applied.clear()
        self._keeping_nothing = False

    def _use(self, workaround: Workaround) -> bool:
        """Apply ``workaround`` unless skipped, already applied, or unverified here; whether it is in effect."""
        if workaround.name in self._applied:
            return True
        if workaround.name in self.skip or not workaround.apply(self._patches):
            return False
        self._applied.add(workaround.name)
        return True


def _is_megatron(trainer: pl.Trainer) -> bool:
    return is_megatron_strategy(trainer.strategy)


def _skip_from_env() -> frozenset[str]:
    return frozenset(name.strip() for name in os.environ.get(SKIP_ENV, "").split(",") if name.strip())


_for_the_process = Patches()  # what the install_* functions replaced; never restored


def _install_for_the_process(workaround: Workaround) -> bool:
    before = len(_for_the_process)
    workaround.apply(_for_the_process)
    return len(_for_the_process) > before


def install_modelopt_stand_ins() -> bool:
    """Register the ModelOpt stand-ins for the rest of the process if NeMo's module cannot be imported.

    Returns:
        ``True`` when the stand-ins were installed, ``False`` when the real module imports (or they already are).
    """
    return register_stand_ins(_for_the_process)


def install_distributed_optimizer_step_fix() -> bool:
    """Apply :mod:`~bionemo.lightning.workarounds.distributed_optimizer_step` for the rest of the process.

    Returns:
        ``True`` when installed now, ``False`` when it already was (or the megatron-core version is unverified).
    """
    return _install_for_the_process(DISTRIBUTED_OPTIMIZER_STEP)


def install_multi_tensor_fix() -> bool:
    """Apply :mod:`~bionemo.lightning.workarounds.multi_tensor_foreach` for the rest of the process.

    Returns:
        ``True`` when something was replaced now, ``False`` when nothing (left) to replace.
    """
    return _install_for_the_process(MULTI_TENSOR_FOREACH)
