"""Work-arounds of upstream problems (NeMo 2.7.3, megatron-core 0.15.3, Lightning 2.4.0), one module each.

Each module holds one :class:`Workaround`: what it works around, the versions it was verified on, the digests of
the upstream code it depends on, the stages that need it, and how it is installed. ``MegatronCompatCallback``
(:mod:`bionemo.lightning.megatron_compat`) applies them under MegatronStrategy and restores every original at
teardown. :data:`WORKAROUNDS` lists them in the order they are applied.
"""

from bionemo.lightning.workarounds.distributed_optimizer_step import DISTRIBUTED_OPTIMIZER_STEP
from bionemo.lightning.workarounds.fused_adam import FUSED_ADAM
from bionemo.lightning.workarounds.limit_batches_to_steps import LIMIT_BATCHES_TO_STEPS
from bionemo.lightning.workarounds.modelopt_stand_ins import MODELOPT_STAND_INS
from bionemo.lightning.workarounds.multi_tensor_foreach import MULTI_TENSOR_FOREACH
from bionemo.lightning.workarounds.predict_loop_keep_predictions import PREDICT_LOOP_KEEP_PREDICTIONS
from bionemo.lightning.workarounds.predict_without_sampler_log import PREDICT_WITHOUT_SAMPLER_LOG
from bionemo.lightning.workarounds.step_without_distillation_shapes import STEP_WITHOUT_DISTILLATION_SHAPES
from bionemo.lightning.workarounds.workaround import Patches, Stage, UnverifiedUpstreamWarning, Workaround

WORKAROUNDS: tuple[Workaround, ...] = (
    STEP_WITHOUT_DISTILLATION_SHAPES,
    PREDICT_WITHOUT_SAMPLER_LOG,
    LIMIT_BATCHES_TO_STEPS,
    PREDICT_LOOP_KEEP_PREDICTIONS,
    MODELOPT_STAND_INS,
    DISTRIBUTED_OPTIMIZER_STEP,
    MULTI_TENSOR_FOREACH,
    FUSED_ADAM,
)

__all__ = [
    "DISTRIBUTED_OPTIMIZER_STEP",
    "FUSED_ADAM",
    "LIMIT_BATCHES_TO_STEPS",
    "MODELOPT_STAND_INS",
    "MULTI_TENSOR_FOREACH",
    "PREDICT_LOOP_KEEP_PREDICTIONS",
    "PREDICT_WITHOUT_SAMPLER_LOG",
    "STEP_WITHOUT_DISTILLATION_SHAPES",
    "WORKAROUNDS",
    "Patches",
    "Stage",
    "UnverifiedUpstreamWarning",
    "Workaround",
]
