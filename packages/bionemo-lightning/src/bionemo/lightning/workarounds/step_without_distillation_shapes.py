"""Megatron steps that do not import ``nemo.collections.llm`` to learn there is no distillation to shape for.

NeMo 2.7.3's ``MegatronStep.adjust_tensor_shapes_fn`` imports ``nemo.collections.llm.modelopt.distill.utils``
(the whole LLM collection: HF ``datasets``, ModelOpt) on every step, and fails with ``nemo_toolkit[core]``. For
PP=1 or forward-only steps the function it calls returns ``None`` without looking at anything else; so does
:class:`StepWithoutDistillationShapes`, without the import (and for PP>1 when that package cannot be imported,
since then no distillation can be configured). No upstream code is patched: NeMo's ``on_megatron_step_start``
callback hook may return a replacement step, and :func:`without_distillation_shapes` makes it. The step class
lives in the NeMo adapter (:mod:`bionemo.lightning._nemo.megatron_step`) and is imported on first use.
"""

from typing import TYPE_CHECKING, Any

from bionemo.lightning.workarounds.workaround import Workaround

if TYPE_CHECKING:
    from bionemo.lightning._nemo.megatron_step import StepWithoutDistillationShapes

__all__ = ["STEP_WITHOUT_DISTILLATION_SHAPES", "StepWithoutDistillationShapes", "without_distillation_shapes"]


def without_distillation_shapes(step: Any) -> Any:
    """``step`` (a NeMo ``MegatronStep``) as a :class:`StepWithoutDistillationShapes` with the same field values."""
    from bionemo.lightning._nemo.megatron_step import without_distillation_shapes as replace

    return replace(step)


def __getattr__(name: str) -> Any:
    """``StepWithoutDistillationShapes``, imported from the NeMo adapter when first asked for."""
    if name == "StepWithoutDistillationShapes":
        from bionemo.lightning._nemo.megatron_step import StepWithoutDistillationShapes

        return StepWithoutDistillationShapes
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


STEP_WITHOUT_DISTILLATION_SHAPES = Workaround(
    name="step_without_distillation_shapes",
    upstream="NeMo's MegatronStep.adjust_tensor_shapes_fn imports nemo.collections.llm on every step",
    verified={"nemo-toolkit": "2.7.3"},
    sources={
        "nemo.lightning.megatron_parallel:MegatronStep.adjust_tensor_shapes_fn": "626c395f533bc265",
    },
)
