"""A NeMo ``MegatronStep`` that does not import ``nemo.collections.llm`` for distillation shapes it never uses.

See :mod:`bionemo.lightning.workarounds.step_without_distillation_shapes`, which uses it.
"""

import dataclasses
from typing import Any

from megatron.core import parallel_state
from nemo.lightning.megatron_parallel import MegatronStep

__all__ = ["StepWithoutDistillationShapes", "without_distillation_shapes"]


class StepWithoutDistillationShapes(MegatronStep):
    """A ``MegatronStep`` whose ``adjust_tensor_shapes_fn`` skips the ``nemo.collections.llm`` import when unused."""

    @property
    def adjust_tensor_shapes_fn(self) -> Any:  # type: ignore[override]
        """``None`` unless pipeline-parallel training might use distillation shapes (see the work-around)."""
        if self.forward_only or parallel_state.get_pipeline_model_parallel_world_size() == 1:
            return None
        try:
            return super().adjust_tensor_shapes_fn
        except ImportError:
            return None


def without_distillation_shapes(step: MegatronStep) -> MegatronStep:
    """``step`` as a :class:`StepWithoutDistillationShapes` with the same field values."""
    if isinstance(step, StepWithoutDistillationShapes):
        return step
    values = {field.name: getattr(step, field.name) for field in dataclasses.fields(step)}
    return StepWithoutDistillationShapes(**values)
