"""Megatron steps that do not import ``nemo.collections.llm`` to learn there is no distillation to shape for.

NeMo 2.7.3's ``MegatronStep.adjust_tensor_shapes_fn`` imports ``nemo.collections.llm.modelopt.distill.utils``
(the whole LLM collection: HF ``datasets``, ModelOpt) on every step, and fails with ``nemo_toolkit[core]``. For
PP=1 or forward-only steps the function it calls returns ``None`` without looking at anything else; so does
:class:`StepWithoutDistillationShapes`, without the import (and for PP>1 when that package cannot be imported,
since then no distillation can be configured). No upstream code is patched: NeMo's ``on_megatron_step_start``
callback hook may return a replacement step, and :func:`without_distillation_shapes` makes it.
"""

import dataclasses
from typing import Any

from megatron.core import parallel_state

from bionemo.lightning._nemo import MegatronStep
from bionemo.lightning.workarounds.workaround import Workaround

__all__ = ["STEP_WITHOUT_DISTILLATION_SHAPES", "StepWithoutDistillationShapes", "without_distillation_shapes"]


class StepWithoutDistillationShapes(MegatronStep):
    """A ``MegatronStep`` whose ``adjust_tensor_shapes_fn`` skips the ``nemo.collections.llm`` import when unused."""

    @property
    def adjust_tensor_shapes_fn(self) -> Any:  # type: ignore[override]
        """``None`` unless pipeline-parallel training might use distillation shapes (see the module docstring)."""
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


STEP_WITHOUT_DISTILLATION_SHAPES = Workaround(
    name="step_without_distillation_shapes",
    upstream="NeMo's MegatronStep.adjust_tensor_shapes_fn imports nemo.collections.llm on every step",
    verified={"nemo-toolkit": "2.7.3"},
    sources={
        "nemo.lightning.megatron_parallel:MegatronStep.adjust_tensor_shapes_fn": "626c395f533bc265",
    },
)
