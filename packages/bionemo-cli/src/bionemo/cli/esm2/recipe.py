"""The built-in recipes ``esm2-demo`` (CPU-sized, the default) and ``esm2-gpu`` (a few times larger)."""

import functools
import json
import random
import shutil
from importlib.resources import files
from pathlib import Path
from typing import Any

from bionemo.cli.recipe import Recipe
from bionemo.cli.settings import Include, Precision, RunSettings, SettingsError

__all__ = ["BUNDLED_CHECKPOINT", "BUNDLED_SEQUENCES", "demo", "gpu"]

_RESOURCES = files("bionemo.cli.esm2") / "resources"
BUNDLED_CHECKPOINT = Path(str(_RESOURCES / "esm2_demo.safetensors"))
"""Weights trained by the README's ``bionemo run train`` command (see resources/README)."""
BUNDLED_SEQUENCES = Path(str(_RESOURCES / "demo_sequences.fasta"))
"""Held-out members of the synthetic demo families, predicted by ``bionemo run predict`` by default."""

DEMO_MODEL = {"num_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "ffn_hidden_size": 256, "seq_length": 130}
GPU_MODEL = {
    "num_layers": 12,
    "hidden_size": 1024,
    "num_attention_heads": 16,
    "ffn_hidden_size": 4096,
    "seq_length": 1026,
    "position_embedding": "rope",
    "compile_rope": True,
    "bias_activation_fusion": True,
    "bias_dropout_fusion": True,
}
"""About 150M parameters. Chosen for the GPU's sake: ESM-2 35M's shape (12 x 480, 20 heads of 24) keeps an
H200 at 12% of its bf16 peak, this one at 30% unfused; megatron's compiled bias+GeLU and bias+dropout+add
and the compiled RoPE (``bionemo.lightning.install_compiled_rope``; unfused RoPE was 22% of the GPU's time)
take it to 36.5% (``tools/bench_recipe_throughput.py``, 2026-11-30)."""


def _recipe(name: str, description: str, model: dict[str, Any], **run: Any) -> Recipe:
    defaults = {"model": model, **run}
    return Recipe(
        name=name,
        description=description,
        defaults=defaults,
        train=functools.partial(train, defaults=defaults, recipe=name),
        predict=functools.partial(predict, defaults=defaults, recipe=name),
    )


def demo() -> Recipe:
    """The CPU demo: a 4-layer, 64-wide protein encoder trained on synthetic families in under a minute."""
    return _recipe(
        "esm2-demo",
        "ESM-2-style protein MLM, 4 layers x 64 (CPU demo; bundled trained weights)",
        DEMO_MODEL,
        micro_batch_size=16,
        global_batch_size=16,
        max_steps=1000,
        val_check_interval=250,
        lr=2e-3,
        precision=Precision.FP32.value,
    )


def gpu() -> Recipe:
    """12 layers, 1024 wide, 1024 residues (about 150M parameters); bf16 with fused SDPA attention on GPUs."""
    return _recipe(
        "esm2-gpu",
        "ESM-2-style protein MLM, 12 layers x 1024, 1024 residues, ~150M parameters (GPU; bf16, fused attention)",
        GPU_MODEL,
        micro_batch_size=32,
        global_batch_size=256,
        max_steps=20000,
        val_check_interval=1000,
        lr=4e-4,
        precision=Precision.BF16.value,
    )


def _value(settings: RunSettings, defaults: dict[str, Any], name: str) -> Any:
    value = getattr(settings, name)
    return defaults.get(name) if value is None else value


def _model_config(model: dict[str, Any], settings: RunSettings, vocab_size: int):
    import torch

    from bionemo.cli.esm2.model import ESM2Config

    precision = settings.precision.value if settings.precision else None
    return ESM2Config(
        vocab_size=vocab_size,
        tensor_model_parallel_size=settings.tensor_parallel,
        pipeline_model_parallel_size=settings.pipeline_parallel,
        context_parallel_size=settings.context_parallel,
        use_cpu_initialization=not torch.cuda.is_available(),
        bf16=precision == "bf16-mixed",
        params_dtype=torch.bfloat16 if precision == "bf16-mixed" else torch.float32,
        **model,
    )


def _datamodule(
    settings: RunSettings,
    defaults: dict[str, Any],
    predicting: bool = False,
    *,
    loader: dict[str, Any] | None = None,
    **datasets: Any,
):
    """The recipe's MegatronDataModule; ``loader`` passes DataLoader options (``num_workers``, ``pin_memory``)."""
    from bionemo.cli.esm2.data import collate_proteins
    from bionemo.cli.esm2.tokenizer import ProteinTokenizer
    from bionemo.lightning import MegatronDataModule

    micro = _value(settings, defaults, "micro_batch_size")
    global_batch = settings.global_batch_size or (
        micro * settings.data_parallel_size()
        if predicting
        else max(defaults["global_batch_size"], micro * settings.data_parallel_size())
    )
    return MegatronDataModule(
        micro_batch_size=micro,
        global_batch_size=global_batch,
        seq_length=defaults["model"]["seq_length"],
        collate_fn=functools.partial(collate_proteins, pad_id=ProteinTokenizer().pad_id),
        **(loader or {}),
        **datasets,
    )


def train(settings: RunSettings, *, defaults: dict[str, Any], recipe: str) -> list[tuple[str, str]]:
    """Train on ``--data`` (default: freshly generated demo families) and export ``model.safetensors``."""
    defaults = {**defaults, "model": _checked_model({**defaults["model"], **(settings.model or {})})}
    from bionemo.cli.esm2.demo_data import demo_families, write_fasta
    from bionemo.cli.esm2.readers import InputError, read_sequences
    from bionemo.cli.trainers import check_hardware, check_output_dir, is_launching_rank

    out = settings.output_dir or Path("bionemo_runs") / recipe
    check_hardware(settings)
    _check_model_runs_here(
        defaults["model"],
        settings,
        "on CPU use --recipe esm2-demo, or set position_embedding: learned_absolute under model: in --config",
        "--recipe",
    )
    check_output_dir(out)
    max_residues = defaults["model"]["seq_length"] - 2
    if settings.data is None:
        data = out / "data" / "demo_train.fasta"
        if is_launching_rank():
            data.parent.mkdir(parents=True, exist_ok=True)
            write_fasta(demo_families(seed=settings.seed)[0], data)
    else:
        data = settings.data
    try:
        records = read_sequences(data, max_residues, settings.truncate)
    except InputError as error:
        raise SettingsError(str(error), "--data") from None
    if len(records) < 2:
        raise SettingsError(f"{data} holds {len(records)} sequence; training needs at least 2", "--data")
    return _fit(settings, defaults, recipe, records, out)


def _fit(
    settings: RunSettings, defaults: dict[str, Any], recipe: str, records: list, out: Path
) -> list[tuple[str, str]]:
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.callbacks import RichProgressBar
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
    from megatron.core.optimizer import OptimizerConfig

    from bionemo.callbacks import PerplexityLoggingCallback
    from bionemo.cli.checkpoints import checkpoint_callback, resume_checkpoint
    from bionemo.cli.esm2.data import MaskedProteinDataset, data_step
    from bionemo.cli.esm2.model import forward_step
    from bionemo.cli.esm2.tokenizer import ProteinTokenizer
    from bionemo.cli.esm2.weights import full_state_dict, save_weights
    from bionemo.cli.plots import plot_curves
    from bionemo.cli.trainers import build_trainer, uses_megatron
    from bionemo.lightning import BionemoLightningModule
    from bionemo.lightning._nemo import MegatronOptimizerModule

    pl.seed_everything(settings.seed, workers=True, verbose=False)
    tokenizer = ProteinTokenizer()
    shuffled = list(records)
    random.Random(settings.seed).shuffle(shuffled)
    n_val = max(1, len(shuffled) // 10)
    val, train_records = shuffled[:n_val], shuffled[n_val:]
    megatron = uses_megatron(settings)
    lr = _value(settings, defaults, "lr")
    module = BionemoLightningModule(
        _model_config(defaults["model"], settings, tokenizer.vocab_size),
        forward_step=forward_step,
        data_step=data_step,
        optimizer=MegatronOptimizerModule(
            config=OptimizerConfig(
                optimizer="adam",
                lr=lr,
                weight_decay=0.01,
                use_distributed_optimizer=megatron,
                bf16=settings.precision == Precision.BF16,
                clip_grad=1.0,
            )
        ),
    )
    max_steps = _value(settings, defaults, "max_steps")
    samples_per_step = _value(settings, defaults, "micro_batch_size") * settings.data_parallel_size()
    if megatron:
        samples_per_step = max(samples_per_step, settings.global_batch_size or defaults["global_batch_size"])
    datamodule = _datamodule(
        settings,
        defaults,
        # one pass over this view is the whole run: fresh masks every time a sequence comes round again
        train=MaskedProteinDataset(train_records, tokenizer, seed=settings.seed, length=max_steps * samples_per_step),
        val=MaskedProteinDataset(val, tokenizer, seed=settings.seed + 1),
    )
    interval = min(_value(settings, defaults, "val_check_interval"), max_steps)
    checkpoints = out / "checkpoints"
    callbacks = [
        PerplexityLoggingCallback(log_train=True, log_val=True),
        checkpoint_callback(settings, checkpoints, every_n_train_steps=interval),
        RichProgressBar(leave=True),
    ]
    loggers = [CSVLogger(out, name="logs", version=""), TensorBoardLogger(out, name="logs", version="")]
    trainer = build_trainer(
        settings,
        training=True,
        callbacks=callbacks,
        logger=loggers,
        max_steps=max_steps,
        val_check_interval=interval,
        default_root_dir=out,
    )
    resume_from = resume_checkpoint(settings, checkpoints) if settings.resume else None
    baseline_file = out / "untrained_baseline.json"
    if resume_from is None and not megatron:
        # the untrained model's validation perplexity: the baseline the trained model is compared with
        (untrained,) = trainer.validate(module, datamodule=datamodule, verbose=False)
        if trainer.global_rank == 0:
            baseline_file.write_text(json.dumps({"val_ppl": untrained.get("val_ppl")}))
    trainer.fit(module, datamodule=datamodule, ckpt_path=resume_from)
    tensors = full_state_dict(module.unwrapped_module())  # gathers tensor-parallel shards: every rank takes part
    if trainer.global_rank != 0:
        return []
    metrics = {
        k: float(v) for k, v in trainer.callback_metrics.items() if isinstance(v, torch.Tensor) and v.numel() == 1
    }
    untrained_ppl = json.loads(baseline_file.read_text())["val_ppl"] if baseline_file.exists() else None
    weights = out / "model.safetensors"
    save_weights(
        tensors,
        weights,
        {
            "recipe": recipe,
            "model": defaults["model"],
            "vocab_size": tokenizer.vocab_size,
            "steps": trainer.global_step,
            "val_ppl": metrics.get("val_ppl"),
            "untrained_val_ppl": untrained_ppl,
            "seed": settings.seed,
        },
    )
    plot = plot_curves(out / "logs" / "metrics.csv", out / "training_curves.png")
    return [
        ("recipe", recipe),
        ("steps", str(trainer.global_step)),
        ("sequences (train / val)", f"{len(train_records)} / {len(val)}"),
        ("final train loss", f"{metrics.get('reduced_train_loss', float('nan')):.4f}"),
        ("validation perplexity", f"{metrics.get('val_ppl', float('nan')):.3f}"),
        ("untrained model's validation perplexity", f"{untrained_ppl:.3f}" if untrained_ppl else "not measured"),
        ("weights", str(weights)),
        ("checkpoints (resume)", str(checkpoints)),
        ("logs (CSV, TensorBoard)", str(out / "logs")),
        ("loss / perplexity curve", str(plot) if plot else "not written (no metrics)"),
    ]


def predict(settings: RunSettings, *, defaults: dict[str, Any], recipe: str) -> list[tuple[str, str]]:
    """Predict ``--data`` (default: the bundled demo sequences) with ``--checkpoint`` (default: bundled weights)."""
    import torch

    from bionemo.callbacks import PredictionWriter, merge_predictions
    from bionemo.cli.esm2.data import MaskedProteinDataset, data_step
    from bionemo.cli.esm2.model import make_predict_step
    from bionemo.cli.esm2.readers import InputError, read_sequences
    from bionemo.cli.esm2.tokenizer import ProteinTokenizer
    from bionemo.cli.esm2.weights import apply_weights, read_metadata, read_weights
    from bionemo.cli.outputs import write_predictions
    from bionemo.cli.trainers import build_trainer, check_hardware, check_output_dir, is_launching_rank
    from bionemo.lightning import BionemoLightningModule, default_megatron_optimizer

    if settings.model:
        raise SettingsError(
            "model settings apply to training; prediction reads the model from --checkpoint", "--config"
        )
    checkpoint = settings.checkpoint or BUNDLED_CHECKPOINT
    metadata = read_metadata(checkpoint)
    if "model" not in metadata:
        raise SettingsError(
            f"checkpoint {checkpoint} has no model config in its metadata; was it written by bionemo?", "--checkpoint"
        )
    model = dict(metadata["model"])
    out = settings.output_dir or Path("bionemo_predictions")
    check_hardware(settings)
    _check_model_runs_here(model, settings, f"predict with checkpoint {checkpoint} on a GPU", "--checkpoint")
    check_output_dir(out)
    data = settings.data or BUNDLED_SEQUENCES
    try:
        records = read_sequences(data, model["seq_length"] - 2, settings.truncate)
    except InputError as error:
        raise SettingsError(str(error), "--data") from None
    try:
        tensors = read_weights(checkpoint)
    except Exception as error:
        raise SettingsError(f"checkpoint {checkpoint} cannot be read: {error}", "--checkpoint") from None
    shards = out / "shards"
    if is_launching_rank() and shards.exists():
        shutil.rmtree(shards)  # a rerun replaces an interrupted one's partial shards
    tokenizer = ProteinTokenizer()
    include = set(settings.include)
    module = BionemoLightningModule(
        _model_config(model, settings, metadata.get("vocab_size", tokenizer.vocab_size)),
        forward_step=make_predict_step(Include.EMBEDDINGS in include, Include.LOGITS in include, tokenizer.eos_id),
        data_step=data_step,
        optimizer=default_megatron_optimizer(),
        model_transform=functools.partial(apply_weights, tensors=tensors),
    )
    datamodule = _datamodule(
        settings,
        {**defaults, "model": model},
        predicting=True,
        predict=MaskedProteinDataset(records, tokenizer, seed=12345),
    )
    from lightning.pytorch.callbacks import RichProgressBar

    writer = PredictionWriter(shards, settings.write_interval.value, overwrite=True)
    trainer = build_trainer(settings, training=False, callbacks=[writer, RichProgressBar(leave=True)])
    trainer.predict(module, datamodule=datamodule, return_predictions=False)
    trainer.strategy.barrier()  # every rank's shards are on disk before rank 0 merges them
    if trainer.global_rank != 0:
        return []
    merged = merge_predictions(shards)
    perplexity = torch.exp(merged.pop("loss_sum") / merged.pop("num_masked").clamp(min=1))
    if Include.PERPLEXITY in include:
        merged["perplexity"] = perplexity
    path = write_predictions(
        out / "predictions.safetensors",
        merged,
        [r.id for r in records],
        {"recipe": recipe, "checkpoint": str(checkpoint)},
    )
    shutil.rmtree(shards, ignore_errors=True)
    summary = {
        "sequences": len(records),
        "mean_perplexity": float(perplexity.mean()),
        "uniform_baseline_perplexity": 20.0,
        "checkpoint_validation_perplexity": metadata.get("val_ppl"),
        "untrained_validation_perplexity": metadata.get("untrained_val_ppl"),
        "predictions": str(path),
        "includes": sorted(i.value for i in include),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return [
        ("sequences", str(len(records))),
        ("mean masked-token perplexity", f"{summary['mean_perplexity']:.3f}"),
        ("uniform guess over 20 amino acids", "20.000"),
        ("validation perplexity at training: trained / untrained", _pair(metadata)),
        ("checkpoint", str(checkpoint)),
        ("predictions (safetensors)", str(path)),
        ("contents", ", ".join(["sequence ids", "sample_index", *sorted(k for k in merged if k != "sample_index")])),
        ("summary", str(out / "summary.json")),
    ]


def _pair(metadata: dict[str, Any]) -> str:
    trained, untrained = metadata.get("val_ppl"), metadata.get("untrained_val_ppl")
    return " / ".join(f"{value:.3f}" if value else "not recorded" for value in (trained, untrained))


def _check_model_runs_here(model: dict[str, Any], settings: RunSettings, hint: str, option: str) -> None:
    """Refuse a model the chosen accelerator cannot run, before any output or process group exists.

    ``hint`` says what would work instead; ``option`` is the command-line option the error names.

    Raises:
        SettingsError: Rotary position embeddings (megatron-core's run on CUDA only) on CPU.
    """
    from bionemo.cli.trainers import accelerator

    if model.get("position_embedding") == "rope" and accelerator(settings) == "cpu":
        raise SettingsError(
            "this model uses rotary position embeddings (position_embedding: rope), which megatron-core runs on "
            f"CUDA GPUs only, and this run is on CPU; {hint}",
            option,
        )


def _checked_model(model: dict[str, Any]) -> dict[str, Any]:
    """``model`` if every key is an ``ESM2Config`` field, else a SettingsError listing the valid ones."""
    import dataclasses

    from bionemo.cli.esm2.model import ESM2Config

    valid = {field.name for field in dataclasses.fields(ESM2Config)}
    unknown = sorted(set(model) - valid)
    if unknown:
        raise SettingsError(
            f"unknown model settings {unknown}; valid ones include num_layers, hidden_size, num_attention_heads, "
            "ffn_hidden_size, seq_length, position_embedding (any megatron TransformerConfig field)",
            "--config",
        )
    return model
