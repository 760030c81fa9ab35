"""The fine-tuning run itself: data, trainer, fit, the best validation's weights exported, the summary rows."""

import json
import sys
from pathlib import Path
from typing import Any

from bionemo.esm2.finetune.class_weights import ClassWeights
from bionemo.esm2.finetune.label_scaling import LabelScaling
from bionemo.esm2.finetune.metric_names import BEST_METRIC, METRIC_NAMES, BestMetric
from bionemo.esm2.finetune.module import finetune_module, trainable_parameters
from bionemo.esm2.finetune.spec import FINETUNE_KEY, EncoderMode, FinetuneSpec
from bionemo.esm2.finetune.tasks import LabelledData
from bionemo.esm2.recipes._measured import finite, shown
from bionemo.recipes.registry import RecipeDefaults, SummaryRows
from bionemo.recipes.settings import RunSettings

__all__ = ["fit"]


def fit(
    settings: RunSettings,
    defaults: RecipeDefaults,
    recipe: str,
    spec: FinetuneSpec,
    data: LabelledData,
    out: Path,
    start: Any,
    resume_from: str | None,
    class_weights: ClassWeights | None = None,
    best_metric: BestMetric | None = None,
) -> SummaryRows:
    """Train (from ``resume_from``, the run's own newest checkpoint, if any); export; the summary rows (rank 0).

    ``class_weights``: the loss weights per class of a ``--class-weights`` run; ``best_metric``: the validation
    metric that picks the exported weights and stops early (default: the task's).
    """
    import lightning.pytorch as pl

    from bionemo.esm2.checkpoints.weights import full_state_dict
    from bionemo.esm2.finetune.best import BestWeights
    from bionemo.esm2.finetune.dropout_steps import KeyedDropoutSteps
    from bionemo.esm2.finetune.module import encoder_tensors
    from bionemo.recipes.step_timer import StepTimer
    from bionemo.recipes.trainers import is_launching_rank

    pl.seed_everything(settings.seed, workers=True, verbose=False)
    max_steps = defaults.value(settings, "max_steps")
    frozen = spec.encoder is EncoderMode.FROZEN
    scaling = LabelScaling.from_records(spec.task, data.train)  # regression: the head learns standardized labels
    if frozen:  # the head alone, on cached encoder outputs: Lightning's own strategies
        from bionemo.esm2.finetune.frozen_run import frozen_datamodule, frozen_module, lightning_settings

        settings = lightning_settings(settings)
        module = frozen_module(settings, defaults, spec, scaling, class_weights)
        datamodule = frozen_datamodule(settings, defaults, spec, data, start, max_steps)
    else:
        module = finetune_module(settings, defaults, spec, start.tensors, scaling, class_weights)
        datamodule = _datamodule(settings, defaults, spec, data, max_steps)
    checkpoints = out / "checkpoints"
    metric = best_metric or BEST_METRIC[spec.task]
    best = BestWeights(metric, checkpoints)
    timer = StepTimer(pause_every=min(defaults.value(settings, "val_check_interval"), max_steps))
    watchers = [best, timer, KeyedDropoutSteps(settings.seed)]
    trainer = _trainer(settings, spec, metric, out, checkpoints, max_steps, defaults, resume_from, watchers)
    if resume_from is not None and is_launching_rank():
        print(f"resuming from {resume_from}", file=sys.stderr, flush=True)  # the library's own line is quieted
    trainer.fit(module, datamodule=datamodule, ckpt_path=resume_from)
    best.restore(module)
    if frozen:
        head = module.unwrapped_module().state_dict()  # head.* names, as a fine-tuned file holds them
        tensors = {**encoder_tensors(start.tensors), **{k: v.detach().cpu() for k, v in head.items()}}
    else:
        from bionemo.esm2.hf.layout import CONTACT_HEAD

        # gathers tensor-parallel shards: every rank takes part. The base's contact head, which no fine-tuning step
        # uses, goes on unchanged, as transformers keeps it in a fine-tuned EsmForSequenceClassification
        tensors = {name: start.tensors[name] for name in CONTACT_HEAD if name in start.tensors}
        tensors.update(full_state_dict(module.unwrapped_module()))
    if scaling is not None:  # the exported head predicts in the labels' units itself
        tensors = scaling.fold(tensors, spec.head.kind)
    trainable, total = trainable_parameters(module)
    if trainer.global_rank != 0:
        return []
    if frozen:
        total += sum(v.numel() for v in encoder_tensors(start.tensors).values())
    parts = defaults.value(settings, "global_batch_size")  # items per step; with batches cut by tokens, micro-batches
    rows = _export(settings, recipe, spec, data, trainer, tensors, out, start, best, (trainable, total), parts)
    seconds = getattr(datamodule, "encode_seconds", None)
    if seconds is not None:
        at = next(i for i, (name, _) in enumerate(rows) if name == "encoder") + 1
        rows.insert(at, ("encoder outputs cached", f"{len(data.train) + len(data.val)} sequences in {seconds:.1f} s"))
    speed = _speed(timer, datamodule, parts)
    summary = {
        "task": str(spec.task),
        "head": str(spec.head.kind),
        "encoder": str(spec.encoder),
        "steps": trainer.global_step,
        "sequences_train": len(data.train),
        "sequences_val": len(data.val),
        "trainable_parameters": trainable,
        "parameters": total,
        "best": {"metric": best.metric.key, "value": finite(best.best), "step": best.best_step},
        "final_metrics": _final_metrics(trainer, spec),
        "encode_seconds": seconds,
        "class_weights": None if class_weights is None else class_weights.by_name(spec.labels),
        **speed,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1, allow_nan=False))
    if class_weights is not None:
        at = next(i for i, (name, _) in enumerate(rows) if name == "task") + 1
        rows.insert(at, ("class weights (loss)", f"balanced: {class_weights.label(spec.labels)}"))
    at = next(i for i, (name, _) in enumerate(rows) if name == "weights")
    rows[at:at] = _speed_rows(speed)
    rows.append(("summary", out / "summary.json"))
    return rows


def _speed(timer: Any, datamodule: Any, global_batch: int) -> dict[str, Any]:
    """Training tokens per second (residues + 2 per sequence) over the timed steps, and the peak device memory.

    ``global_batch``: the training dataset's items per step.
    """
    dataset = datamodule.datasets["train"]
    tokens = None
    if timer.steps and timer.seconds > 0 and dataset is not None:
        items = [k for first, end in timer.spans for k in range(first * global_batch, end * global_batch)]
        tokens = sum(dataset.item_tokens(k) for k in items)
    return {
        "timed_steps": timer.steps,
        "timed_seconds": timer.seconds if timer.steps else None,
        "train_tokens_per_second": tokens / timer.seconds if tokens else None,
        "peak_memory_gib": None if timer.peak_memory_bytes is None else timer.peak_memory_bytes / 2**30,
    }


def _speed_rows(speed: dict[str, Any]) -> list[tuple[str, str]]:
    rows = []
    if speed["train_tokens_per_second"]:
        rows.append(
            (
                "training speed",
                f"{speed['train_tokens_per_second']:,.0f} tokens/s "
                f"({speed['timed_steps']} steps in {speed['timed_seconds']:.1f} s; the first 3, validation and "
                "checkpoint saves left out)",
            )
        )
    if speed["peak_memory_gib"] is not None:
        rows.append(("peak device memory", f"{speed['peak_memory_gib']:.1f} GiB"))
    return rows


def _final_metrics(trainer: Any, spec: FinetuneSpec) -> dict[str, float | None]:
    """The last validation's metrics."""
    import torch

    logged = trainer.callback_metrics
    values = {}
    for name in METRIC_NAMES[spec.task]:
        value = logged.get(f"val_{name}")
        values[f"val_{name}"] = finite(float(value)) if isinstance(value, torch.Tensor) else None
    return values


def _datamodule(
    settings: RunSettings, defaults: RecipeDefaults, spec: FinetuneSpec, data: LabelledData, max_steps: int
) -> Any:
    """Training items for the whole run (a new order each pass) and the validation set, collated with padding."""
    import functools

    from bionemo.esm2.finetune.data import LabelledDataset, collate_flat, collate_labelled, token_batched
    from bionemo.esm2.tokenizer import ProteinTokenizer
    from bionemo.lightning import MegatronDataModule

    samples_per_step = defaults.value(settings, "global_batch_size")
    collate = functools.partial(collate_labelled, pad_id=ProteinTokenizer().pad_id)
    if settings.global_batch_tokens is None:
        length = max_steps * samples_per_step
        train: Any = LabelledDataset(
            data.train, spec.labels, seed=settings.seed, length=length, group_size=samples_per_step
        )
        val: Any = LabelledDataset(data.val, spec.labels)
    else:
        train = token_batched(LabelledDataset(data.train, spec.labels), settings, max_steps, samples_per_step)
        val = token_batched(LabelledDataset(data.val, spec.labels), settings, None, samples_per_step)
        collate = functools.partial(collate_flat, collate)
    return MegatronDataModule(
        micro_batch_size=defaults.value(settings, "micro_batch_size"),
        global_batch_size=samples_per_step,
        seq_length=defaults.model["seq_length"],
        collate_fn=collate,
        train=train,
        val=val,
    )


def _trainer(
    settings: RunSettings,
    spec: FinetuneSpec,
    metric: BestMetric,
    out: Path,
    checkpoints: Path,
    max_steps: int,
    defaults: RecipeDefaults,
    resume_from: str | None,
    watchers: list[Any],
) -> Any:
    """The trainer: validation metrics, ``watchers``, early stopping, and what every training run has."""
    from lightning.pytorch.callbacks import EarlyStopping

    from bionemo.esm2.finetune.validation import ValidationMetrics
    from bionemo.recipes.training_run import training_trainer

    # the metrics first: BestWeights and EarlyStopping read their values
    callbacks = [ValidationMetrics(spec.task, spec.num_outputs, shown=metric.key), *watchers]
    if settings.patience is not None:
        callbacks.append(
            EarlyStopping(monitor=metric.key, mode=str(metric.mode), patience=settings.patience, check_finite=False)
        )
    return training_trainer(
        settings,
        out=out,
        checkpoints=checkpoints,
        max_steps=max_steps,
        interval=min(defaults.value(settings, "val_check_interval"), max_steps),
        resume_from=resume_from,
        callbacks=callbacks,
    )


def _export(
    settings: RunSettings,
    recipe: str,
    spec: FinetuneSpec,
    data: LabelledData,
    trainer: Any,
    tensors: dict[str, Any],
    out: Path,
    start: Any,
    best: Any,
    parameters: tuple[int, int],
    parts: int,
) -> SummaryRows:
    """Write the self-describing ``model.safetensors`` and the curves; the summary rows."""
    import torch

    from bionemo.esm2.checkpoints.weights import save_weights
    from bionemo.esm2.recipes.token_steps import split_label
    from bionemo.esm2.recipes.train import batch_label, precision_label
    from bionemo.esm2.tokenizer import ProteinTokenizer
    from bionemo.recipes.plots import plot_curves

    vocab_size = ProteinTokenizer().vocab_size
    logged = {
        k: float(v) for k, v in trainer.callback_metrics.items() if isinstance(v, torch.Tensor) and v.numel() == 1
    }
    metric = best.metric
    final = {f"val_{name}": finite(logged.get(f"val_{name}")) for name in METRIC_NAMES[spec.task]}
    weights = out / "model.safetensors"
    model = dict(start.model)
    save_weights(
        tensors,
        weights,
        {
            "recipe": recipe,
            "model": {**model, "vocab_size": vocab_size},
            "vocab_size": vocab_size,
            FINETUNE_KEY: spec.to_json(),
            "steps": trainer.global_step,
            "best": {"metric": metric.key, "value": finite(best.best), "step": best.best_step},
            "final_metrics": final,
            "seed": settings.seed,
            "started_from": str(start.path),
        },
    )
    plot = plot_curves(
        out / "logs" / "metrics.csv",
        out / "training_curves.png",
        val_key=metric.key,
        loss_label="task loss",
        val_label=metric.key.removeprefix("val_"),
        val_title=f"Validation {metric.key.removeprefix('val_')}",
    )
    trainable, total = parameters
    encoder = {
        EncoderMode.FULL: "full (every weight trains)",
        EncoderMode.FROZEN: "frozen (head only)",
        EncoderMode.LORA: f"LoRA rank {spec.lora.rank if spec.lora else '?'} on "
        f"{', '.join(spec.lora.targets) if spec.lora else '?'}",
    }[spec.encoder]
    best_row = "no validation ran" if best.best is None else f"{shown(best.best, 4)} at step {best.best_step}"
    return [
        ("recipe", recipe),
        (f"started from ({start.source})", start.path),
        ("task", f"{spec.task} ({', '.join(spec.labels.columns)}; {spec.num_outputs} outputs)"),
        ("head", f"{spec.head.kind}" + (" (exports to Hugging Face)" if spec.head.exportable_to_hf else "")),
        ("encoder", encoder),
        ("trainable parameters", f"{trainable:,} of {total:,}"),
        ("steps", str(trainer.global_step)),
        ("precision", precision_label(settings)),
        (
            "batch",
            split_label(settings.global_batch_tokens, parts, settings.data_parallel_size())
            if settings.global_batch_tokens
            else batch_label(settings),
        ),
        (
            "sequences (train / val)",
            f"{len(data.train)} / {len(data.val)}" + (" (split from --data)" if data.split_from_train else ""),
        ),
        ("final train loss", shown(logged.get("reduced_train_loss"), 4)),
        (f"best {metric.key} (exported)", best_row),
        *((name, shown(value, 4)) for name, value in final.items()),
        ("weights", weights),
        ("checkpoints (resume)", out / "checkpoints"),
        ("logs (CSV, TensorBoard)", out / "logs"),
        ("loss / metric curve", plot or "not written (no metrics)"),
        ("settings (rerun with --config)", out / "settings.yaml"),
    ]
