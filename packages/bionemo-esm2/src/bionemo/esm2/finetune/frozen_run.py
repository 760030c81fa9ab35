"""The pieces of an ``--encoder frozen`` run: its settings, the head-only module, the caching data module."""

import functools
from typing import Any

from bionemo.esm2.finetune.class_weights import ClassWeights
from bionemo.esm2.finetune.label_scaling import LabelScaling
from bionemo.esm2.finetune.spec import FinetuneSpec
from bionemo.esm2.recipes.model_settings import model_config
from bionemo.recipes.choices import Precision, StrategyChoice
from bionemo.recipes.registry import RecipeDefaults
from bionemo.recipes.settings import RunSettings

__all__ = ["frozen_datamodule", "frozen_module", "lightning_settings"]


def lightning_settings(settings: RunSettings) -> RunSettings:
    """``settings`` on Lightning's own strategies: the head is small, DDP over the devices is all it needs."""
    return settings.model_copy(update={"strategy": StrategyChoice.DDP})


def frozen_module(
    settings: RunSettings,
    defaults: RecipeDefaults,
    spec: FinetuneSpec,
    label_scaling: LabelScaling | None = None,
    class_weights: ClassWeights | None = None,
) -> Any:
    """The head-only Lightning module: AdamW, warm-up + cosine (Lightning's strategies honour the same config)."""
    from megatron.core.optimizer import OptimizerConfig

    from bionemo.esm2.data.mlm import data_step
    from bionemo.esm2.finetune.frozen import CachedHeadConfig, cached_forward_step
    from bionemo.lightning import BionemoLightningModule, MegatronOptimizerModule
    from bionemo.recipes.schedules import WarmupCosine

    max_steps = defaults.value(settings, "max_steps")
    warmup = settings.warmup_steps if settings.warmup_steps is not None else max_steps // 10
    lr = settings.head_lr or defaults.value(settings, "lr")
    optimizer = OptimizerConfig(optimizer="adam", lr=lr, weight_decay=0.01, clip_grad=1.0)
    # NeMo's optimizer module calls it as it calls an LRSchedulerModule (without NeMo's base class)
    schedule: Any = WarmupCosine(max_steps=max_steps, warmup_steps=min(warmup, max_steps))
    return BionemoLightningModule(
        CachedHeadConfig(
            spec=spec,
            hidden_size=int(defaults.model["hidden_size"]),
            label_scaling=label_scaling,
            class_weights=class_weights,
        ),
        forward_step=cached_forward_step,
        data_step=data_step,
        optimizer=MegatronOptimizerModule(config=optimizer, lr_scheduler=schedule),
    )


def frozen_datamodule(
    settings: RunSettings, defaults: RecipeDefaults, spec: FinetuneSpec, data: Any, start: Any, max_steps: int
) -> Any:
    """The data module that encodes every sequence once with the base encoder, then serves cached features."""
    from bionemo.esm2.finetune.frozen import CachedFeaturesDataModule

    samples_per_step = defaults.value(settings, "global_batch_size")
    batched = None
    if settings.global_batch_tokens is not None:
        from bionemo.esm2.finetune.data import token_batched

        batched = {
            "train": functools.partial(token_batched, settings=settings, steps=max_steps, parts=samples_per_step),
            "validation": functools.partial(token_batched, settings=settings, steps=None, parts=samples_per_step),
        }
    return CachedFeaturesDataModule(
        encoder_factory=functools.partial(_encoder, settings=settings, model=dict(defaults.model), start=start),
        spec=spec,
        train_records=data.train,
        val_records=data.val,
        length=max_steps * samples_per_step,
        token_batched=batched,
        seed=settings.seed,
        micro_batch_size=defaults.value(settings, "micro_batch_size"),
        global_batch_size=samples_per_step,
        seq_length=defaults.model["seq_length"],
    )


def _encoder(device: Any, *, settings: RunSettings, model: dict[str, Any], start: Any) -> Any:
    """The base encoder (no LM head) with its weights, on ``device``, in the run's precision (bf16 on GPUs)."""
    from bionemo.esm2.checkpoints.weights import apply_weights
    from bionemo.esm2.finetune.module import encoder_tensors
    from bionemo.esm2.model.esm2 import ESM2Model
    from bionemo.lightning import ensure_model_parallel

    ensure_model_parallel(cuda=device.type == "cuda")
    precision = settings.precision if device.type == "cuda" else Precision.FP32
    config = model_config(model, settings.model_copy(update={"precision": precision}), training=False)
    encoder = ESM2Model(config, lm_head=False)
    apply_weights(encoder, encoder_tensors(start.tensors))
    return encoder.to(device=device, dtype=config.params_dtype)
