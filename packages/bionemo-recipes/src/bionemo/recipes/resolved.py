"""The settings a run actually uses: recipe defaults filled in for this layout, checked, and saved with the run.

Standard library and pydantic only (plus PyYAML to write): bad batch sizes are refused before torch is imported.
"""

from pathlib import Path
from typing import Any

from bionemo.core.batch_sizes import batch_size_problem
from bionemo.recipes.registry import RecipeDefaults
from bionemo.recipes.settings import Precision, RunSettings, SettingsError

__all__ = ["SETTINGS_FILE", "resolved_training_settings", "save_settings", "training_plan"]

SETTINGS_FILE = "settings.yaml"
"""The file in a run's output directory that holds its resolved settings (a valid ``--config``)."""

_PREDICT_ONLY = ("include", "write_interval", "tokens_per_batch", "layer", "output_dtype", "unpadded", "overwrite")
_FINETUNE_ONLY = (
    "val_data",
    "val_fraction",
    "task",
    "label_column",
    "mask_column",
    "head",
    "head_dropout",
    "encoder",
    "lora_rank",
    "lora_alpha",
    "lora_dropout",
    "lora_targets",
    "head_lr",
    "warmup_steps",
    "class_weights",
    "best_metric",
    "patience",
)
_TRAIN_ONLY = (
    "max_steps",
    "val_check_interval",
    "lr",
    "resume",
    "seed",
    "model",
    "global_batch_size",
    "global_batch_tokens",
    *_FINETUNE_ONLY,
)


def resolved_training_settings(settings: RunSettings, defaults: RecipeDefaults, *, gpu: bool) -> RunSettings:
    """``settings`` with the batch sizes, precision and run length decided for this layout.

    - On CPUs (not ``gpu``) the recipe's CPU defaults (``defaults.cpu``) replace its run length and batch sizes
      wherever ``settings`` leaves them unset (:meth:`RecipeDefaults.for_training`).
    - Precision: as given; else the recipe's on GPUs (``gpu``), 32-bit on CPUs.
    - Global batch size: as given, else the recipe's: the same on every layout, so the same settings train the
      same model on one process or many.
    - Micro-batch size: as given; else the recipe's, or the largest size below it that makes whole steps of the
      global batch over the data-parallel ranks (it only changes memory use, not what is computed).
    - With ``global_batch_tokens`` (batches cut by tokens) the global batch size stays unset and the micro-batch
      size is as given, else the recipe's: it bounds the tokens of a micro-batch, which the run's data decides.

    Raises:
        SettingsError: Batch sizes that make no whole global batch on this layout (global not a multiple of
            micro x data-parallel size, or smaller), naming the valid values; ``global_batch_tokens`` with
            ``global_batch_size``.
    """
    defaults = defaults.for_training(gpu=gpu)
    data_parallel = settings.data_parallel_size()
    global_batch = defaults.value(settings, "global_batch_size")
    micro = defaults.value(settings, "micro_batch_size")
    if settings.global_batch_tokens is not None:
        if settings.global_batch_size is not None:
            raise SettingsError(
                "--global-batch-tokens cuts batches by tokens, --global-batch-size by count: give one or the other",
                "--global-batch-tokens",
            )
        return _resolved(settings, defaults, gpu, micro, None)
    if settings.micro_batch_size is None:
        fitting = [m for m in range(micro, 0, -1) if global_batch % (m * data_parallel) == 0]
        micro = fitting[0] if fitting else micro
    problem = batch_size_problem(micro, global_batch, data_parallel)
    if problem is not None:
        given = " and ".join(
            f"--{name.replace('_', '-')} {getattr(settings, name)}"
            for name in ("micro_batch_size", "global_batch_size")
            if getattr(settings, name) is not None
        )
        origin = f"{given} on" if given else f"recipe {settings.recipe}'s batch sizes on"
        layout = f"{data_parallel} data-parallel rank(s) (--devices x --num-nodes / model-parallel size)"
        raise SettingsError(
            f"{origin} {layout}: {problem}",
            "--micro-batch-size" if settings.micro_batch_size is not None else "--global-batch-size",
        )
    return _resolved(settings, defaults, gpu, micro, global_batch)


def _resolved(
    settings: RunSettings, defaults: RecipeDefaults, gpu: bool, micro: int, global_batch: int | None
) -> RunSettings:
    """``settings`` with these batch sizes, the precision and the run length (``defaults`` already for training)."""
    precision = settings.precision or (defaults.precision if gpu else Precision.FP32)
    return settings.model_copy(
        update={
            "micro_batch_size": micro,
            "global_batch_size": global_batch,
            "precision": precision,
            "max_steps": defaults.value(settings, "max_steps"),
            "val_check_interval": defaults.value(settings, "val_check_interval"),
            "lr": defaults.value(settings, "lr"),
        }
    )


def training_plan(given: RunSettings, resolved: RunSettings, defaults: RecipeDefaults, *, gpu: bool) -> str:
    """The line a training run prints before it starts: steps x global batch, and which CPU defaults set them.

    Args:
        given: The settings as the user gave them (options and ``--config``).
        resolved: ``given`` resolved by :func:`resolved_training_settings` with the same ``defaults`` and ``gpu``.
        defaults: The recipe's defaults.
        gpu: Whether the run trains on GPUs.
    """
    if resolved.global_batch_tokens is not None:
        plan = f"{resolved.max_steps} steps x up to {resolved.global_batch_tokens:,} tokens per step"
    else:
        plan = f"{resolved.max_steps} steps x {resolved.global_batch_size} sequences per step"
    if gpu or defaults.cpu is None:
        return plan
    applied = [name for name in defaults.cpu.as_settings() if getattr(given, name) is None]
    if not applied:
        return plan
    values = ", ".join(f"--{name.replace('_', '-')} {getattr(resolved, name)}" for name in applied)
    return f"{plan} (recipe {resolved.recipe}'s defaults for CPUs: {values})"


def save_settings(settings: RunSettings, directory: Path, *, training: bool, finetuning: bool = False) -> Path:
    """Write ``settings`` (those of a training, fine-tuning or prediction run) to ``directory/settings.yaml``.

    Written atomically. The file is a valid ``--config``: rerunning with it (and nothing else) runs the same
    settings, and continues a training run from its checkpoints (``resume: true`` also after ``--no-resume``,
    which says how one invocation started, not what the run is). ``finetuning`` (with ``training``) keeps the
    fine-tuning settings, which other runs leave out.
    """
    import yaml

    from bionemo.core.atomic_files import replaced_atomically

    left_out = (*_PREDICT_ONLY, *(() if finetuning else _FINETUNE_ONLY)) if training else _TRAIN_ONLY
    if training:
        settings = settings.model_copy(update={"resume": True})
    values: dict[str, Any] = settings.model_dump(mode="json", exclude=set(left_out))
    path = directory / SETTINGS_FILE
    with replaced_atomically(path) as temporary:
        temporary.write_text(yaml.safe_dump(values, sort_keys=False), encoding="utf-8")
    return path
