"""``bionemo run train`` for the ESM-2 recipes: from scratch, or from ``--checkpoint`` weights (HF or bionemo)."""

import functools
import json
import random
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from bionemo.esm2.recipes._measured import finite, shown
from bionemo.esm2.recipes.inputs import checked_checkpoint, checked_checkpoint_header, datamodule
from bionemo.esm2.recipes.model_settings import check_same_shape, checked_model_settings, model_config
from bionemo.esm2.recipes.token_steps import TokenSteps, token_steps, training_tokens
from bionemo.esm2.tokenizer import encoded_length
from bionemo.recipes.registry import RecipeDefaults, SummaryRows
from bionemo.recipes.settings import Precision, RunSettings, SettingsError

__all__ = ["batch_label", "precision_label", "split_records", "train", "training_data"]

TRAIN_WORKERS = 2
"""DataLoader worker processes that tokenize and mask training samples on GPU machines. In the main process the
first micro-batch of every step is prepared while the GPU waits (a step ends in a wait for the GPU), a larger share
of a step the smaller the model; with workers the GPU does not wait for it
(docs/benchmarks.md#training-throughput-as-a-share-of-peak)."""


def train(settings: RunSettings, *, defaults: RecipeDefaults, recipe: str) -> SummaryRows:
    """Train on ``--data`` (default: freshly generated demo families) and export ``model.safetensors``.

    Batches by count, or cut by tokens (:func:`~bionemo.esm2.recipes.token_steps.training_tokens`: asked for, or on
    GPUs without ``--global-batch-size``).

    With ``--checkpoint`` training starts from those weights (continued pretraining / fine-tuning); the
    checkpoint's shape must be the recipe's. ``defaults`` are the recipe's (``recipe`` its name).
    """
    from bionemo.esm2.data.demo import demo_families, write_fasta
    from bionemo.esm2.data.readers import InputError, read_sequences
    from bionemo.recipes.resolved import resolved_training_settings, save_settings, training_plan
    from bionemo.recipes.run_record import (
        check_resumable,
        refuse_prediction_folder,
        run_identity,
        split_digests,
        start_run_record,
    )
    from bionemo.recipes.trainers import accelerator, check_hardware, check_output_dir, is_launching_rank, uses_megatron

    # every check that needs no tensor comes first and imports nothing heavy: bad input is refused at once
    model = checked_model_settings({**defaults.model, **(settings.model or {})})
    header = None
    if settings.checkpoint is not None:
        header = checked_checkpoint_header(settings.checkpoint)
        if getattr(header, "finetune", None) is not None:
            raise SettingsError(
                f"{settings.checkpoint} is a fine-tuned model (no language-model head); run train continues "
                "pretraining from pretrained ESM-2 weights: give the base it was fine-tuned from, or fine-tune further "
                "with `bionemo run finetune`",
                "--checkpoint",
            )
        check_same_shape(header.model, model, recipe, settings.checkpoint)
        # the checkpoint's own settings (token dropout, epsilon, length) win over the recipe's
        model = {**model, **{k: v for k, v in header.model.items() if k != "vocab_size"}}
    defaults = replace(defaults, model=model)
    out = settings.output_dir or Path("bionemo_runs") / recipe
    check_hardware(settings)
    given, gpu = settings, accelerator(settings) == "gpu"
    settings = settings.model_copy(update={"global_batch_tokens": training_tokens(settings, defaults, gpu=gpu)})
    settings = resolved_training_settings(settings, defaults, gpu=gpu)  # on CPUs with the recipe's CPU defaults
    max_residues = model["seq_length"] - 2
    data = settings.data
    records: list = []
    if data is not None:
        try:
            records = read_sequences(data, max_residues, settings.truncate)
        except InputError as error:
            raise SettingsError(str(error), "--data") from None
        if len(records) < 2:
            raise SettingsError(f"{data} holds {len(records)} sequence; training needs at least 2", "--data")
    if data is None:
        # every rank generates the same records (no rank reads a file another may be writing); the file is
        # for the user to look at, written once per node and atomically
        records = demo_families(seed=settings.seed)[0]
    train_records, val = split_records(records, settings.seed)
    steps = token_steps(
        settings, model["seq_length"], {"training": _lengths(train_records), "validation": _lengths(val)}
    )
    check_output_dir(out, create=False)
    refuse_prediction_folder(out)
    data_identity = split_digests(((r.id, r.sequence) for r in train_records), ((r.id, r.sequence) for r in val))
    identity = run_identity(settings, {"model": model, "data": data_identity})
    resume_from = check_resumable(settings, out / "checkpoints", identity, megatron=uses_megatron(settings))
    start = None if header is None else checked_checkpoint(header.path)  # the tensors: NaN/Inf
    check_output_dir(out)
    if is_launching_rank():
        start_run_record(settings, out / "checkpoints", identity)
        save_settings(settings.model_copy(update={"output_dir": out}), out, training=True)
        print(f"Training {training_plan(given, settings, defaults, gpu=gpu)}", flush=True)
        if data is None:
            (out / "data").mkdir(parents=True, exist_ok=True)
            write_fasta(records, out / "data" / "demo_train.fasta")
    return _fit(settings, defaults, recipe, (train_records, val), out, start, steps, resume_from)


def split_records(records: list, seed: int) -> tuple[list, list]:
    """``(training, validation)``: a tenth of ``records`` (at least one) drawn from ``seed`` for validation."""
    shuffled = list(records)
    random.Random(seed).shuffle(shuffled)
    n_val = max(1, len(shuffled) // 10)
    return shuffled[n_val:], shuffled[:n_val]


def _lengths(records: list) -> list[int]:
    return [encoded_length(record.sequence) for record in records]


def _fit(
    settings: RunSettings,
    defaults: RecipeDefaults,
    recipe: str,
    split: tuple[list, list],
    out: Path,
    start: Any,
    steps: TokenSteps | None,
    resume_from: str | None,
) -> SummaryRows:
    """Train (from ``resume_from``, the run's own newest checkpoint, if any); export; the summary rows."""
    import lightning.pytorch as pl

    from bionemo.callbacks import PerplexityLoggingCallback
    from bionemo.esm2.checkpoints.weights import full_state_dict
    from bionemo.esm2.data.readers import lowercase_note
    from bionemo.recipes.step_timer import StepTimer
    from bionemo.recipes.trainers import is_launching_rank, uses_megatron
    from bionemo.recipes.training_run import training_trainer

    pl.seed_everything(settings.seed, workers=True, verbose=False)
    train_records, val = split
    megatron = uses_megatron(settings)
    module = _module(settings, defaults, megatron, start)
    max_steps = defaults.value(settings, "max_steps")
    data = training_data(settings, defaults, train_records, val, max_steps, steps)
    interval = min(defaults.value(settings, "val_check_interval"), max_steps)
    timer = StepTimer(pause_every=interval)
    trainer = training_trainer(
        settings,
        out=out,
        checkpoints=out / "checkpoints",
        max_steps=max_steps,
        interval=interval,
        resume_from=resume_from,
        callbacks=[PerplexityLoggingCallback(log_train=True, log_val=True), timer],
    )
    baseline_file = out / "untrained_baseline.json"
    if resume_from is None and not megatron:
        # the starting model's validation perplexity: the baseline the trained model is compared with
        (untrained,) = trainer.validate(module, datamodule=data, verbose=False)
        if trainer.global_rank == 0:
            baseline_file.write_text(json.dumps({"val_ppl": finite(untrained.get("val_ppl"))}, allow_nan=False))
    if resume_from is not None and is_launching_rank():
        print(f"resuming from {resume_from}", file=sys.stderr, flush=True)  # the library's own line is quieted
    trainer.fit(module, datamodule=data, ckpt_path=resume_from)
    tensors = full_state_dict(module.unwrapped_module())  # gathers tensor-parallel shards: every rank takes part
    if trainer.global_rank != 0:
        return []
    sizes = f"{len(train_records)} / {len(val)}"
    batch = batch_label(settings) if steps is None else steps.label()
    rows = _export(settings, defaults, recipe, trainer, tensors, out, start, baseline_file, sizes, batch)
    _add_speed(rows, settings, defaults, trainer, timer, data, steps, out, split)
    if note := lowercase_note([*train_records, *val]):
        at = next(i for i, (name, _) in enumerate(rows) if name == "sequences (train / val)") + 1
        rows.insert(at, ("input", note))
    return rows


def _module(settings: RunSettings, defaults: RecipeDefaults, megatron: bool, start: Any) -> Any:
    """The Lightning module: the recipe's model (from ``start``'s weights if given) and Adam."""
    import functools

    from megatron.core.optimizer import OptimizerConfig

    from bionemo.esm2.checkpoints.weights import apply_weights
    from bionemo.esm2.data.mlm import training_data_step
    from bionemo.esm2.model.steps import forward_step
    from bionemo.lightning import BionemoLightningModule, MegatronOptimizerModule

    optimizer = OptimizerConfig(
        optimizer="adam",
        lr=defaults.value(settings, "lr"),
        weight_decay=0.01,
        use_distributed_optimizer=megatron,
        bf16=megatron and settings.precision == Precision.BF16,
        clip_grad=1.0,
    )
    return BionemoLightningModule(
        model_config(defaults.model, settings),
        forward_step=forward_step,
        data_step=training_data_step,
        optimizer=MegatronOptimizerModule(config=optimizer),
        model_transform=None if start is None else functools.partial(apply_weights, tensors=start.tensors),
    )


def training_data(
    settings: RunSettings, defaults: RecipeDefaults, train: list, val: list, max_steps: int, steps: TokenSteps | None
) -> Any:
    """Masked training and validation sets; one pass over the training view is the whole run.

    Batches by count, or with ``steps`` cut by tokens: items are then micro-batches
    (:class:`~bionemo.esm2.data.mlm.MaskedTokenBatches`), ``steps.parts`` of them per step. Either way a sequence
    gets fresh masks every time it comes round again. On GPUs, :data:`TRAIN_WORKERS` processes tokenize and mask
    the samples into page-locked memory.
    """
    from bionemo.esm2.data.mlm import MaskedProteinDataset, MaskedTokenBatches, collate_proteins
    from bionemo.esm2.data.token_batches import TokenBatches, collate_flat
    from bionemo.esm2.tokenizer import ProteinTokenizer
    from bionemo.lightning import MegatronDataModule
    from bionemo.recipes.trainers import accelerator

    tokenizer = ProteinTokenizer()
    gpu = accelerator(settings) == "gpu"
    loader = {"num_workers": TRAIN_WORKERS if gpu else 0, "pin_memory": gpu}
    if steps is None:
        samples_per_step = defaults.value(settings, "global_batch_size")  # the same on every layout
        return datamodule(
            settings,
            defaults,
            loader=loader,
            train=MaskedProteinDataset(train, tokenizer, seed=settings.seed, length=max_steps * samples_per_step),
            val=MaskedProteinDataset(val, tokenizer, seed=settings.seed + 1),
        )

    def batches(records: list, seed: int, training: bool) -> MaskedTokenBatches:
        cut = TokenBatches(
            _lengths(records), steps.budget, parts=steps.parts, seed=seed, steps=max_steps if training else None
        )
        return MaskedTokenBatches(records, tokenizer, cut, seed=seed)

    return MegatronDataModule(
        micro_batch_size=1,
        global_batch_size=steps.parts,
        seq_length=defaults.model["seq_length"],
        collate_fn=functools.partial(collate_flat, functools.partial(collate_proteins, pad_id=tokenizer.pad_id)),
        train=batches(train, settings.seed, True),
        val=batches(val, settings.seed + 1, False),
        **loader,
    )


def _add_speed(
    rows: SummaryRows,
    settings: RunSettings,
    defaults: RecipeDefaults,
    trainer: Any,
    timer: Any,
    data: Any,
    steps: TokenSteps | None,
    out: Path,
    split: tuple[list, list],
) -> None:
    """Put the run's speed in ``rows`` (before the files) and write ``summary.json`` (rank 0, after the export)."""
    import torch

    from bionemo.esm2.checkpoints.weights import read_metadata
    from bionemo.esm2.recipes.train_speed import speed_rows, training_speed
    from bionemo.esm2.tokenizer import ProteinTokenizer

    precision = (settings.precision or Precision.FP32).value
    device = trainer.strategy.root_device
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    items_per_step = defaults.value(settings, "global_batch_size") if steps is None else steps.parts
    speed = training_speed(
        timer,
        data.datasets["train"],
        items_per_step,
        defaults.model,
        ProteinTokenizer().vocab_size,
        devices=trainer.world_size,
        device_name=device_name,
        precision=precision,
    )
    earlier = _earlier_summary(out)
    if not speed["timed_steps"]:  # a rerun of a finished run trains nothing: keep what the run measured
        speed = {key: earlier.get(key, value) for key, value in speed.items()}
    at = next(i for i, (name, _) in enumerate(rows) if name == "weights")
    rows[at:at] = speed_rows(speed, device_name)
    exported = read_metadata(out / "model.safetensors")  # what the export recorded (val_ppl kept on a rerun)
    summary = {
        "recipe": exported.get("recipe"),
        "steps": trainer.global_step,
        "sequences_train": len(split[0]),
        "sequences_val": len(split[1]),
        "precision": precision,
        "final_train_loss": finite(_logged(trainer, "reduced_train_loss")) or earlier.get("final_train_loss"),
        "val_ppl": exported.get("val_ppl"),
        "untrained_val_ppl": exported.get("untrained_val_ppl"),
        "device": device_name or device.type,
        **speed,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1, allow_nan=False))
    rows.append(("summary", out / "summary.json"))


def _earlier_summary(out: Path) -> dict[str, Any]:
    try:
        earlier = json.loads((out / "summary.json").read_text())
    except (OSError, ValueError):
        return {}
    return earlier if isinstance(earlier, dict) else {}


def _logged(trainer: Any, key: str) -> float | None:
    value = trainer.callback_metrics.get(key)
    return None if value is None else float(value)


def _export(
    settings: RunSettings,
    defaults: RecipeDefaults,
    recipe: str,
    trainer: Any,
    tensors: dict[str, Any],
    out: Path,
    start: Any,
    baseline_file: Path,
    sizes: str,
    batch: str,
) -> SummaryRows:
    """Write ``model.safetensors`` (with what the run measured) and the curve; the summary rows (rank 0)."""
    import torch

    from bionemo.esm2.checkpoints.weights import save_weights
    from bionemo.esm2.tokenizer import ProteinTokenizer
    from bionemo.recipes.plots import plot_curves

    vocab_size = ProteinTokenizer().vocab_size
    metrics = {
        k: float(v) for k, v in trainer.callback_metrics.items() if isinstance(v, torch.Tensor) and v.numel() == 1
    }
    untrained_ppl = finite(json.loads(baseline_file.read_text())["val_ppl"]) if baseline_file.exists() else None
    weights = out / "model.safetensors"
    # rerunning a finished run measures nothing new: keep what the earlier export recorded
    val_ppl = finite(metrics.get("val_ppl")) or finite(_earlier(weights).get("val_ppl"))
    save_weights(
        tensors,
        weights,
        {
            "recipe": recipe,
            "model": {**defaults.model, "vocab_size": vocab_size},
            "vocab_size": vocab_size,
            "steps": trainer.global_step,
            "val_ppl": val_ppl,
            "untrained_val_ppl": untrained_ppl,
            "seed": settings.seed,
            "started_from": None if start is None else str(start.path),
        },
    )
    plot = plot_curves(out / "logs" / "metrics.csv", out / "training_curves.png")
    starting = "starting" if start is not None else "untrained"
    return [
        ("recipe", recipe),
        ("started from", "random initialisation") if start is None else (f"started from ({start.source})", start.path),
        ("steps", str(trainer.global_step)),
        ("precision", precision_label(settings)),
        ("batch", batch),
        ("sequences (train / val)", sizes),
        ("final train loss", shown(metrics.get("reduced_train_loss"), 4)),
        ("validation perplexity", shown(val_ppl, 3)),
        (f"{starting} model's validation perplexity", shown(untrained_ppl, 3)),
        ("weights", weights),
        ("checkpoints (resume)", out / "checkpoints"),
        ("logs (CSV, TensorBoard)", out / "logs"),
        ("loss / perplexity curve", plot or "not written (no metrics)"),
        ("settings (rerun with --config)", out / "settings.yaml"),
    ]


def precision_label(settings: RunSettings) -> str:
    """The precision training ran at, as the summary shows it."""
    precision = settings.precision or Precision.FP32
    return {"32": "32 (fp32)", "16-mixed": "16-mixed (fp16)"}.get(precision.value, precision.value)


def batch_label(settings: RunSettings) -> str:
    """Global batch = micro-batch x micro-batches per step x data-parallel ranks, as the summary shows it."""
    micro, global_batch = settings.micro_batch_size or 0, settings.global_batch_size or 0
    data_parallel = settings.data_parallel_size()
    accumulation = global_batch // max(1, micro * data_parallel)
    return f"{global_batch} per step: micro-batch {micro} x {accumulation} x {data_parallel} data-parallel rank(s)"


def _earlier(weights: Path) -> dict[str, Any]:
    """The metadata of an earlier export in the same output directory, or {}."""
    from bionemo.esm2.checkpoints.weights import read_metadata
    from bionemo.esm2.hf.layout import CheckpointError

    try:
        return read_metadata(weights) if weights.is_file() else {}
    except CheckpointError:
        return {}
