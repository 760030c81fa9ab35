"""The model of a fine-tuning run: the base's encoder weights, LoRA adapters, the head, and its Lightning module."""

import functools
import re
from typing import Any

from bionemo.esm2.finetune.class_weights import ClassWeights
from bionemo.esm2.finetune.label_scaling import LabelScaling
from bionemo.esm2.finetune.spec import LM_HEAD_PREFIXES, FinetuneSpec
from bionemo.esm2.recipes.model_settings import model_config
from bionemo.recipes.choices import Precision
from bionemo.recipes.registry import RecipeDefaults
from bionemo.recipes.settings import RunSettings

__all__ = ["encoder_tensors", "finetune_module", "is_head_parameter", "prepare_model", "trainable_parameters"]

_HEAD_PARAMETER = re.compile(r"(^|\.)head\.")


def encoder_tensors(tensors: dict[str, Any]) -> dict[str, Any]:
    """A pretrained checkpoint's tensors without the language-model head (a fine-tuned model has its own head)."""
    return {name: value for name, value in tensors.items() if not name.startswith(LM_HEAD_PREFIXES)}


def is_head_parameter(name: str, _param: Any = None) -> bool:
    """Whether a parameter name (under any wrapper's prefix) is the task head's: megatron's ``scale_lr_cond``."""
    return _HEAD_PARAMETER.search(name) is not None


def finetune_module(
    settings: RunSettings,
    defaults: RecipeDefaults,
    spec: FinetuneSpec,
    start_tensors: Any,
    label_scaling: LabelScaling | None = None,
    class_weights: ClassWeights | None = None,
) -> Any:
    """The Lightning module: the fine-tuned model (base weights, adapters), AdamW, warm-up + cosine, head lr.

    ``label_scaling``: a regression run's (:mod:`bionemo.esm2.finetune.label_scaling`), applied to the head's outputs;
    ``class_weights``: a classification run's loss weights (:mod:`bionemo.esm2.finetune.class_weights`).
    """
    from megatron.core.optimizer import OptimizerConfig

    from bionemo.esm2.data.mlm import data_step
    from bionemo.esm2.finetune.model import ESM2FinetuneConfig
    from bionemo.esm2.finetune.steps import finetune_forward_step
    from bionemo.lightning import BionemoLightningModule, MegatronOptimizerModule
    from bionemo.recipes.schedules import WarmupCosine
    from bionemo.recipes.trainers import uses_megatron

    megatron = uses_megatron(settings)
    lr = defaults.value(settings, "lr")
    max_steps = defaults.value(settings, "max_steps")
    warmup = settings.warmup_steps if settings.warmup_steps is not None else max_steps // 10
    optimizer = OptimizerConfig(
        optimizer="adam",
        lr=lr,
        weight_decay=0.01,
        use_distributed_optimizer=megatron,
        bf16=megatron and settings.precision == Precision.BF16,
        clip_grad=1.0,
    )
    head_lr = settings.head_lr or lr
    # NeMo's optimizer module calls it as it calls an LRSchedulerModule (without NeMo's base class)
    schedule: Any = WarmupCosine(max_steps=max_steps, warmup_steps=min(warmup, max_steps))
    config = model_config(
        defaults.model,
        settings,
        config_class=ESM2FinetuneConfig,
        finetune=_spec_json(spec),
        label_scaling="null" if label_scaling is None else label_scaling.to_json(),
        class_weights="null" if class_weights is None else class_weights.to_json(),
    )
    return BionemoLightningModule(
        config,
        forward_step=finetune_forward_step,
        data_step=data_step,
        optimizer=MegatronOptimizerModule(
            config=optimizer,
            lr_scheduler=schedule,
            scale_lr_cond=is_head_parameter if head_lr != lr else None,
            lr_mult=head_lr / lr,
        ),
        model_transform=functools.partial(prepare_model, spec=spec, tensors=encoder_tensors(start_tensors)),
    )


def prepare_model(model: Any, *, spec: FinetuneSpec, tensors: dict[str, Any], with_head: bool = False) -> None:
    """Load weights into a freshly built fine-tuned model and add its LoRA adapters (a ``model_transform``).

    ``tensors``: encoder tensors (fine-tuning starts: the head keeps its initialisation, adapters are added after
    the base weights are in) or, with ``with_head``, a fine-tuned file's every tensor (adapters are added first,
    then everything is loaded).
    """
    import torch

    from bionemo.esm2.checkpoints.weights import apply_weights
    from bionemo.layers import apply_lora

    def adapt() -> None:
        if spec.lora is not None:
            apply_lora(model, spec.lora.lora_config())
            for param in getattr(model, "head", torch.nn.Module()).parameters():
                param.requires_grad_(True)

    if with_head:
        adapt()
        apply_weights(model, tensors)
        return
    head = getattr(model, "head", None)
    own = {} if head is None else {f"head.{k}": v for k, v in head.state_dict().items()}
    apply_weights(model, {**tensors, **own})
    adapt()


def _spec_json(spec: FinetuneSpec) -> str:
    import json

    return json.dumps(spec.to_json())


def trainable_parameters(module: Any) -> tuple[int, int]:
    """(trainable, all) parameter counts of this rank's model."""
    model = module.unwrapped_module()
    params = list(model.parameters())
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)
