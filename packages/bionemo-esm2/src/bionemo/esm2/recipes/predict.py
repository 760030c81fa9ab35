"""``bionemo run predict`` for the ESM-2 recipes, with a Hugging Face folder or a bionemo file as ``--checkpoint``."""

import json
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bionemo.esm2.recipes._measured import finite, shown
from bionemo.esm2.recipes.inputs import checked_checkpoint, checked_checkpoint_header
from bionemo.esm2.recipes.model_settings import model_config
from bionemo.esm2.tokenizer import encoded_length
from bionemo.recipes.registry import RecipeDefaults, SummaryRows
from bionemo.recipes.settings import Include, Precision, RunSettings, SettingsError

__all__ = ["predict"]

PREDICT_WORKERS = 4
"""DataLoader worker processes that tokenize and collate batches on GPU machines: enough that a batch is ready
when the GPU has embedded the previous one (docs/benchmarks.md#prediction-loop)."""


def predict(settings: RunSettings, *, defaults: RecipeDefaults, recipe: str) -> SummaryRows:
    """Predict ``--data`` (default: the bundled demo sequences) with ``--checkpoint`` (default: bundled weights).

    Writes ``predictions.safetensors`` (rows in input order, sequence ids in the metadata): ``embeddings``
    ``[n, hidden]`` (mean over residues of the last layer after the final LayerNorm, from the unmasked
    sequence), with ``--include logits`` the raw ``logits [n, s, 33]`` of the unmasked sequence (``<cls>`` at
    position 0, zeros beyond ``<eos>``) and with ``--include perplexity`` the masked-token ``perplexity [n]``
    (15% of residues masked, the mask drawn from the sequence itself).
    """
    from bionemo.esm2.data.readers import InputError, read_sequences
    from bionemo.esm2.recipes.inputs import BUNDLED_CHECKPOINT, BUNDLED_SEQUENCES
    from bionemo.esm2.recipes.model_settings import check_same_shape
    from bionemo.esm2.recipes.prediction_shards import PREDICTIONS, check_previous_outputs, fingerprint
    from bionemo.recipes.trainers import accelerator, check_hardware, check_output_dir

    started = time.perf_counter()
    # every check that needs no tensor comes first and imports nothing heavy: bad input is refused at once
    check_hardware(settings, training=False)
    header = checked_checkpoint_header(settings.checkpoint or BUNDLED_CHECKPOINT)
    for key, given in (settings.model or {}).items():  # `recipes show` output as --config: the same model is fine
        if header.model.get(key) != given:
            raise SettingsError(
                f"model setting {key}={given!r} differs from the checkpoint's {header.model.get(key)!r}; "
                "prediction reads the model from --checkpoint: remove `model` from the --config file",
                "--config",
            )
    if "recipe" in settings.model_fields_set:
        check_same_shape(header.model, defaults.model, recipe, header.path)
    if settings.precision is None and accelerator(settings) == "gpu":
        settings = settings.model_copy(update={"precision": Precision.BF16})  # GPUs predict in bf16 by default
    spec = getattr(header, "finetune", None)
    if spec is not None:  # a fine-tuned model: its head's outputs, and of the encoder's only what --include asks
        from bionemo.esm2.finetune.predict import finetuned_includes

        settings = settings.model_copy(update={"include": finetuned_includes(settings, spec)})
    data = settings.data or BUNDLED_SEQUENCES
    try:
        records = read_sequences(data, header.model["seq_length"] - 2, settings.truncate)
    except InputError as error:
        raise SettingsError(str(error), "--data") from None
    layers = absolute_layers(settings.layer, header.model["num_layers"])
    _check_pipeline_outputs(settings, layers, header.model["num_layers"])
    _check_contacts(settings, header)
    _check_budget(settings.tokens_per_batch, records)
    settings = settings.model_copy(update={"unpadded": _unpadded(settings)})
    out = settings.output_dir or Path("bionemo_predictions")
    check_output_dir(out, create=False)
    stamp = fingerprint(header.path, records, {**_outputs(settings, layers), "finetuned": spec is not None})
    replaced = check_previous_outputs(out, stamp, overwrite=settings.overwrite)
    checkpoint = checked_checkpoint(header.path)  # the tensors: NaN/Inf and what only reading them shows
    _check_contacts(settings, checkpoint)  # a pytorch_model.bin shows its contact head only now
    check_output_dir(out)
    if replaced:
        (out / PREDICTIONS).unlink(missing_ok=True)  # a stale file must not outlive --overwrite's interrupted run
    inputs = time.perf_counter() - started
    return _predict(settings, defaults, recipe, checkpoint, records, out, layers, stamp, inputs_seconds=inputs)


def _outputs(settings: RunSettings, layers: list[int]) -> dict[str, Any]:
    """The settings that decide what each prediction holds (part of the run's fingerprint)."""
    return {
        "include": sorted(i.value for i in settings.include),
        "layers": layers,
        "output_dtype": settings.output_dtype.value,
        "precision": settings.precision.value if settings.precision else "32",
    }


def _check_pipeline_outputs(settings: RunSettings, layers: list[int], num_layers: int) -> None:
    """What pipeline-parallel prediction cannot do yet, refused before anything starts.

    Each micro-batch runs one forward pass through the stages: the perplexities (a masked copy, or one copy per
    residue) and intermediate layers (held by earlier stages) need more; and several model replicas could leave
    one of them an empty share of the last batch, which the stages cannot pass on.
    """
    if settings.pipeline_parallel == 1:
        return
    given = f"--pipeline-parallel {settings.pipeline_parallel}"
    several = (Include.PERPLEXITY, Include.PSEUDO_PERPLEXITY, Include.CONTACTS)
    unsupported = [i.value for i in settings.include if i in several]
    if unsupported:
        raise SettingsError(
            f"{given} predicts embeddings, residue embeddings, cls and logits, not {', '.join(unsupported)} "
            "(perplexities need more than one forward pass per batch, contacts the attention maps of every layer); "
            "give --include without them (the default includes perplexity), or predict with --pipeline-parallel 1",
            "--include",
        )
    inner = [layer for layer in layers if layer != num_layers]
    if inner:
        raise SettingsError(f"{given} outputs the last layer only, not --layer {inner[0]}", "--layer")
    if settings.data_parallel_size() > 1:
        raise SettingsError(
            f"{given} predicts with one model replica: give --devices x --num-nodes = tensor x pipeline x context "
            f"parallel = {settings.model_parallel_size()}",
            "--devices",
        )


def _check_contacts(settings: RunSettings, checkpoint: Any) -> None:
    """``--include contacts`` needs a checkpoint with a contact head and every head's attention maps on one rank.

    ``checkpoint``: a checkpoint header or the loaded checkpoint; a ``contact_head`` of None (not known from the
    headers) passes until the tensors are read.
    """
    if Include.CONTACTS not in settings.include:
        return
    if checkpoint.contact_head is False:
        raise SettingsError(
            f"--include contacts: checkpoint {checkpoint.path} has no contact head (contact_head.regression "
            "weight and bias); give a --checkpoint that has one (a Hugging Face ESM-2 folder, or a file that "
            "`bionemo convert from-hf` made of one), or --include without contacts",
            "--include",
        )
    split = (("--tensor-parallel", settings.tensor_parallel), ("--context-parallel", settings.context_parallel))
    for option, size in split:
        if size > 1:
            raise SettingsError(
                f"--include contacts needs every attention head of every position on one device; {option} {size} "
                f"splits them: predict contacts with {option} 1",
                option,
            )


def _check_budget(tokens_per_batch: int | None, records: list) -> None:
    """Every sequence fits into a batch of ``--tokens-per-batch`` tokens."""
    if not tokens_per_batch or not records:
        return
    longest = max(records, key=lambda r: len(r.sequence))
    needed = encoded_length(longest.sequence)
    if needed > tokens_per_batch:
        raise SettingsError(
            f"--tokens-per-batch {tokens_per_batch} is less than sequence {longest.id}'s {needed} "
            f"tokens (residues + <cls> + <eos>); give at least {needed}",
            "--tokens-per-batch",
        )


def _unpadded(settings: RunSettings) -> bool:
    """Whether to predict on unpadded batches: ``--unpadded`` (checked), ``--padded``, or where it can run.

    It can run on CUDA GPUs in bf16 / fp16 with a torch that has variable-length attention, one model replica
    per GPU (data parallelism only); it does about half the kernel work of padded batches
    (docs/benchmarks.md#prediction-loop). torch is imported only on that path.

    Raises:
        SettingsError: ``--unpadded`` where it cannot run.
    """
    from bionemo.recipes.trainers import accelerator

    precision = settings.precision or Precision.FP32
    half = precision != Precision.FP32
    if settings.unpadded and Include.CONTACTS in settings.include:
        raise SettingsError(
            "--unpadded: contacts come from attention maps of padded batches (the variable-length kernel returns "
            "none); leave --unpadded out (or give --padded) to predict contacts",
            "--unpadded",
        )
    if (
        settings.unpadded is False
        or Include.CONTACTS in settings.include
        or (settings.unpadded is None and settings.model_parallel_size() > 1)
    ):
        return False
    no_split = settings.pipeline_parallel == 1 and settings.context_parallel == 1  # whole sequences on each rank
    can_run = half and no_split and accelerator(settings) == "gpu" and _varlen_attention_available(precision)
    if can_run or settings.unpadded is None:
        return can_run
    raise SettingsError(
        f"--unpadded needs CUDA GPUs with --precision bf16 or 16 (given: {precision.value}), torch >= 2.9 "
        f"(variable-length attention), --pipeline-parallel 1 and --context-parallel 1 (given: "
        f"{settings.pipeline_parallel} and {settings.context_parallel}); "
        "leave it out (or give --padded) to predict on padded batches",
        "--unpadded",
    )


def _varlen_attention_available(precision: Precision) -> bool:
    from bionemo.core.cuda_devices import cuda_available

    if not cuda_available():
        return False
    from bionemo.layers import varlen_attention_available

    return varlen_attention_available(precision.torch_dtype())


def absolute_layers(layers: list[int], num_layers: int) -> list[int]:
    """``--layer`` values as absolute layer numbers (0..num_layers; -1 = num_layers), in the order given.

    Raises:
        SettingsError: A layer outside ``-(num_layers + 1)..num_layers``.
    """
    resolved = []
    for layer in layers:
        if not -(num_layers + 1) <= layer <= num_layers:
            raise SettingsError(
                f"--layer {layer}: this model has layers 0 (the embedding output) to {num_layers} (after the final "
                f"LayerNorm); negatives count from the end (-1 = {num_layers}, -{num_layers + 1} = 0)",
                "--layer",
            )
        resolved.append(layer if layer >= 0 else num_layers + 1 + layer)
    return list(dict.fromkeys(resolved))


def _predict(
    settings: RunSettings,
    defaults: RecipeDefaults,
    recipe: str,
    checkpoint: Any,
    records: list,
    out: Path,
    layers: list[int],
    stamp: str,
    inputs_seconds: float,
) -> SummaryRows:
    from bionemo.callbacks import prediction_files
    from bionemo.esm2.recipes.prediction_shards import FINGERPRINT_KEY, PREDICTIONS, finished_samples, remaining
    from bionemo.recipes.outputs import assemble_predictions
    from bionemo.recipes.trainers import is_launching_rank

    shards = out / "shards"
    todo = remaining(len(records), finished_samples(shards, stamp, owner=is_launching_rank()))
    timing = _run_prediction(settings, defaults, checkpoint, records, todo, shards, layers) if todo else {}
    if not is_launching_rank() or timing.get("rank", 0) != 0:
        return []
    writing = time.perf_counter()
    metadata = {"recipe": json.dumps(recipe), "checkpoint": json.dumps(str(checkpoint.path)), FINGERPRINT_KEY: stamp}
    residue_keys = ["residue_embeddings"]
    spec = getattr(checkpoint, "finetune", None)
    if spec is not None:
        from bionemo.esm2.finetune.predict import LABELS_KEY, output_key

        metadata[LABELS_KEY] = json.dumps(list(spec.labels.outputs))
        if spec.task.per_residue:
            residue_keys.append(output_key(spec.task))
    path = assemble_predictions(
        out / PREDICTIONS,
        prediction_files(shards),
        [len(r.sequence) for r in records],
        [r.id for r in records],
        metadata,
        is_residue_key=lambda key: key.startswith(tuple(residue_keys)),
    )
    shutil.rmtree(shards, ignore_errors=True)
    table = None
    if spec is not None:
        from bionemo.esm2.finetune.predict import PREDICTIONS_CSV, write_predictions_csv

        table = write_predictions_csv(out / PREDICTIONS_CSV, path, spec)
    phases = {"inputs": inputs_seconds, **timing.get("phases", {}), "write": time.perf_counter() - writing}
    timing = {**timing, "phases": phases}
    rows = _summarize(settings, checkpoint, records, out, path, timing, resumed=len(records) - len(todo))
    return rows if table is None else [*rows, ("predictions (CSV)", table)]


def _run_prediction(
    settings: RunSettings,
    defaults: RecipeDefaults,
    checkpoint: Any,
    records: list,
    todo: Sequence[int],
    shards: Path,
    layers: list[int],
) -> dict[str, Any]:
    """Predict the records at positions ``todo`` into ``shards``; this rank's number and the loop's timing."""
    import functools

    from lightning.pytorch.callbacks import RichProgressBar

    from bionemo.callbacks import HostMemoryTrim, LoopTimer, PredictionWriter
    from bionemo.esm2.data.mlm import data_step
    from bionemo.lightning import BionemoLightningModule, default_megatron_optimizer
    from bionemo.recipes.trainers import accelerator, build_trainer, uses_megatron

    budget = _tokens_per_batch(settings, checkpoint.model, records)
    plan = _plan(settings, defaults, records, todo, budget)
    pseudo_tokens = None
    callbacks: list[Any] = []
    if Include.PSEUDO_PERPLEXITY in settings.include:
        pseudo_tokens, timer = _pseudo_perplexity_plan(settings, records, plan, gpu=accelerator(settings) == "gpu")
        callbacks.append(timer)
    # No compiled RoPE here: for the varying shapes of length-sorted batches it cost more than it saved
    # (docs/benchmarks.md#prediction-throughput-against-transformers).
    spec = getattr(checkpoint, "finetune", None)
    if spec is None:
        config = model_config(checkpoint.model, settings, training=False)
        step = _step(
            settings,
            layers,
            checkpoint.model["num_layers"],
            unpadded=bool(settings.unpadded),
            pseudo_tokens=pseudo_tokens,
            checkpoint=checkpoint,
        )
        transform = functools.partial(_load_weights, tensors=checkpoint.tensors, dtype=config.params_dtype)
    else:
        config, step, transform = _finetuned(settings, checkpoint, spec)
    module = BionemoLightningModule(
        config,
        forward_step=step,
        data_step=data_step,
        # NeMo (its optimizer module) only where MegatronStrategy runs the prediction: not imported otherwise
        optimizer=default_megatron_optimizer() if uses_megatron(settings, training=False) else None,
        model_transform=transform,
    )
    data = _prediction_data(settings, records, plan, checkpoint.model["seq_length"])
    clock = LoopTimer()
    writer = PredictionWriter(shards, settings.write_interval.value, keep_existing=True)
    callbacks = [writer, clock, *callbacks, HostMemoryTrim(every_n_batches=8), RichProgressBar(leave=True)]
    trainer = build_trainer(settings, training=False, callbacks=callbacks)
    before = time.perf_counter()
    trainer.predict(module, datamodule=data, return_predictions=False)
    trainer.strategy.barrier()  # every rank's shards are on disk before rank 0 merges them

    def tokens(positions: Sequence[int]) -> int:
        return sum(encoded_length(records[i].sequence) for i in positions)

    return {
        "rank": trainer.global_rank,
        "tokens_per_batch": budget,
        "tokens": tokens(todo),
        "predict_seconds": clock.seconds,
        "first_batch_seconds": clock.first_batch_seconds,
        # each model replica's first batch (batches are dealt round-robin to data-parallel ranks)
        "first_batches_tokens": sum(tokens(batch) for batch in plan[: settings.data_parallel_size()]),
        "phases": {
            "trainer_environment": None if clock.setup_at is None else clock.setup_at - before,
            "model_setup": clock.setup_seconds,
        },
    }


def _finetuned(settings: RunSettings, checkpoint: Any, spec: Any) -> tuple[Any, Any, Any]:
    """The config, predict step and weight loading of a fine-tuned model (:mod:`bionemo.esm2.finetune.predict`)."""
    import functools

    import torch

    from bionemo.esm2.finetune.model import ESM2FinetuneConfig
    from bionemo.esm2.finetune.predict import finetuned_transform, make_finetuned_predict_step

    config = model_config(
        checkpoint.model,
        settings,
        training=False,
        config_class=ESM2FinetuneConfig,
        finetune=json.dumps(spec.to_json()),
    )
    include = set(settings.include)
    step = make_finetuned_predict_step(
        spec,
        embeddings=Include.EMBEDDINGS in include,
        residues=Include.RESIDUE_EMBEDDINGS in include,
        cls=Include.CLS in include,
        output_dtype=getattr(torch, settings.output_dtype.value),
        unpadded=bool(settings.unpadded),
    )
    transform = functools.partial(finetuned_transform, spec=spec, tensors=checkpoint.tensors, dtype=config.params_dtype)
    return config, step, transform


def _prediction_data(settings: RunSettings, records: list, plan: list[list[int]], seq_length: int) -> Any:
    """The data module serving ``plan``'s batches of ``records`` (collated by workers on GPU machines)."""
    from bionemo.esm2.data.mlm import PredictionBatches, PredictionDataset, first_item
    from bionemo.esm2.tokenizer import ProteinTokenizer
    from bionemo.lightning import MegatronDataModule
    from bionemo.recipes.trainers import accelerator

    tokenizer = ProteinTokenizer()
    gpu = accelerator(settings) == "gpu"
    samples = PredictionDataset(records, tokenizer, masked=Include.PERPLEXITY in settings.include)
    return MegatronDataModule(
        micro_batch_size=1,  # one item = one whole batch (PredictionBatches)
        seq_length=seq_length,
        collate_fn=first_item,
        num_workers=PREDICT_WORKERS if gpu else 0,
        pin_memory=gpu,
        predict=PredictionBatches(samples, plan, tokenizer.pad_id),
    )


def _load_weights(model: Any, tensors: dict[str, Any], dtype: Any) -> Any:
    """The checkpoint's weights, then every parameter in ``dtype`` (megatron's local layer norms are built fp32)."""
    from bionemo.esm2.checkpoints.weights import apply_weights

    apply_weights(model, tensors)
    return model.to(dtype)


def _tokens_per_batch(settings: RunSettings, model: dict[str, Any], records: list) -> int | None:
    """The batches' token budget: ``--tokens-per-batch``, or the default for the model and the device.

    The default (:func:`bionemo.esm2.recipes.batch_budget.default_tokens_per_batch`) applies when neither
    ``--tokens-per-batch`` nor ``--micro-batch-size`` is given; None when only ``--micro-batch-size`` is.
    """
    if settings.tokens_per_batch is not None or settings.micro_batch_size is not None:
        return settings.tokens_per_batch
    from bionemo.esm2.recipes.batch_budget import default_tokens_per_batch
    from bionemo.recipes.trainers import accelerator

    device_memory = None
    if accelerator(settings) == "gpu":
        import torch

        device_memory = min(torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count()))
    output_bytes = {"float32": 4}.get(settings.output_dtype.value, 2)
    longest = max((encoded_length(r.sequence) for r in records), default=2)
    includes = [i.value for i in settings.include]
    return default_tokens_per_batch(
        model, includes, device_memory=device_memory, longest=longest, output_bytes=output_bytes
    )


def _plan(
    settings: RunSettings, defaults: RecipeDefaults, records: list, todo: Sequence[int], tokens_per_batch: int | None
) -> list[list[int]]:
    """Length-sorted batches of the positions ``todo``: by ``tokens_per_batch`` and/or the micro-batch size.

    With a token budget the micro-batch size caps a batch only where ``--micro-batch-size`` gives one; without a
    budget the recipe's micro-batch size is the batch. Every data-parallel rank gets a batch (a few inputs on
    several devices: :func:`bionemo.esm2.data.mlm.spread_over_ranks`).
    """
    from bionemo.esm2.data.mlm import length_sorted_batches, spread_over_ranks

    lengths = [encoded_length(records[i].sequence) for i in todo]
    batch_size = settings.micro_batch_size if tokens_per_batch else defaults.value(settings, "micro_batch_size")
    batches = length_sorted_batches(lengths, tokens_per_batch=tokens_per_batch, batch_size=batch_size)
    spread = spread_over_ranks(batches, settings.data_parallel_size())
    return [[todo[k] for k in batch] for batch in spread]


def _pseudo_perplexity_plan(settings: RunSettings, records: list, plan: list[list[int]], *, gpu: bool) -> Any:
    """The pseudo-perplexity's tokens per forward pass and its timer; prints its cost (the launching rank)."""
    from bionemo.esm2.recipes.pseudo_perplexity import (
        PseudoPerplexityTimer,
        cost_line,
        pseudo_perplexity_cost,
        tokens_per_forward,
    )
    from bionemo.recipes.trainers import is_launching_rank

    budget = tokens_per_forward(settings.tokens_per_batch, gpu)
    lengths = [[encoded_length(records[i].sequence) for i in batch] for batch in plan]
    if is_launching_rank():
        print(cost_line(pseudo_perplexity_cost(lengths, budget, unpadded=bool(settings.unpadded))), file=sys.stderr)
    # rank 0 (the one that prints) predicts batches 0, dp, 2 dp, ...; a batch costs its copies and its sequences
    costs = [sum((length - 1) * length for length in batch) for batch in lengths[:: settings.data_parallel_size()]]
    return budget, PseudoPerplexityTimer(costs)


def _step(
    settings: RunSettings,
    layers: list[int],
    num_layers: int,
    unpadded: bool = False,
    pseudo_tokens: int | None = None,
    checkpoint: Any = None,
):
    """The predict step of ``--include``; ``checkpoint`` (loaded) gives the contact head for contacts."""
    import torch

    from bionemo.esm2.model.contacts import ContactHead
    from bionemo.esm2.model.steps import make_predict_step

    include = set(settings.include)
    contact_head = None
    if Include.CONTACTS in include:
        contact_head = ContactHead.from_tensors(checkpoint.tensors, checkpoint.model)
    return make_predict_step(
        embeddings=Include.EMBEDDINGS in include,
        logits=Include.LOGITS in include,
        perplexity=Include.PERPLEXITY in include,
        residues=Include.RESIDUE_EMBEDDINGS in include,
        cls=Include.CLS in include,
        pseudo_perplexity=Include.PSEUDO_PERPLEXITY in include,
        layers=layers,
        num_layers=num_layers,
        output_dtype=getattr(torch, settings.output_dtype.value),
        unpadded=unpadded,
        pseudo_perplexity_tokens=pseudo_tokens,
        contact_head=contact_head,
    )


def _summarize(
    settings: RunSettings,
    checkpoint: Any,
    records: list,
    out: Path,
    path: Path,
    timing: dict[str, Any],
    resumed: int,
) -> SummaryRows:
    """Write ``summary.json`` and return the summary rows printed at the end."""
    from safetensors import safe_open

    from bionemo.esm2.data.readers import lowercase_note

    with safe_open(str(path), framework="pt") as f:
        keys = sorted(f.keys())  # noqa: SIM118 - safe_open is not a mapping
        means = {
            key: finite(float(f.get_tensor(key).mean())) for key in ("perplexity", "pseudo_perplexity") if key in keys
        }
    metadata = checkpoint.metadata
    truncated = sum(r.truncated_from is not None for r in records)
    summary = {
        "sequences": len(records),
        "truncated_sequences": truncated,
        "lowercase_sequences": sum(r.lowercase for r in records),
        "resumed_sequences": resumed,
        "mean_perplexity": means.get("perplexity"),
        "mean_pseudo_perplexity": means.get("pseudo_perplexity"),
        "uniform_baseline_perplexity": 20.0,
        "checkpoint_validation_perplexity": finite(metadata.get("val_ppl")),
        "untrained_validation_perplexity": finite(metadata.get("untrained_val_ppl")),
        "predictions": str(path),
        "includes": sorted(i.value for i in settings.include),
        "precision": (settings.precision or Precision.FP32).value,
        "tokens_per_batch": timing.get("tokens_per_batch"),
        **_speed(timing),
        "phase_seconds": timing.get("phases", {}),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1, allow_nan=False))
    rows = [
        ("sequences", str(len(records)) + (f" ({truncated} cut by --truncate)" if truncated else "")),
        ("precision", _precision_label(settings)),
    ]
    if budget := timing.get("tokens_per_batch"):
        chosen = settings.tokens_per_batch is None and settings.micro_batch_size is None
        how = " (the default for this model and device; --tokens-per-batch or --micro-batch-size set others)"
        rows.append(("batches", f"length-sorted, up to {budget:,} tokens each" + (how if chosen else "")))
    if note := lowercase_note(records):
        rows.append(("input", note))
    if resumed:
        rows.append(("resumed", f"{resumed} sequences were already predicted by an interrupted run"))
    if "perplexity" in means:
        rows += [("mean masked-token perplexity", shown(means["perplexity"], 3)),
                 ("uniform guess over 20 amino acids", "20.000")]  # fmt: skip
    if "pseudo_perplexity" in means:
        rows.append(("mean pseudo-perplexity (each residue masked once)", shown(means["pseudo_perplexity"], 3)))
    if getattr(checkpoint, "finetune", None) is not None:
        rows.append(("validation at fine-tuning", _best(metadata.get("best"))))
    elif checkpoint.source == "bionemo":
        rows.append(("validation perplexity at training: trained / untrained", _pair(metadata)))
    return [
        *rows,
        *_speed_rows(summary),
        *(("note", note) for note in checkpoint.notes),
        ("contents", ", ".join(["sequence ids", *keys])),
        (f"checkpoint ({checkpoint.source})", checkpoint.path),
        ("predictions (safetensors)", path),
        ("summary", out / "summary.json"),
    ]


def _precision_label(settings: RunSettings) -> str:
    """The type prediction computed in (its parameters and activations; no autocast) and the type it wrote."""
    precision = settings.precision or Precision.FP32
    computed = str(precision.torch_dtype()).removeprefix("torch.")
    return f"{precision.value}: computed in {computed}; embeddings and logits written as {settings.output_dtype.value}"


def _speed(timing: dict[str, Any]) -> dict[str, Any]:
    """The loop's tokens and seconds, its tokens/s, and its tokens/s after each rank's first batch (one-time costs).

    Rates are ``None`` where they were not measured (nothing predicted, or no batch after the first).
    """
    tokens, seconds, first = timing.get("tokens", 0), timing.get("predict_seconds"), timing.get("first_batch_seconds")
    later_tokens = tokens - timing.get("first_batches_tokens", 0)
    later = None
    if seconds is not None and first is not None and seconds > first and later_tokens > 0:
        later = later_tokens / (seconds - first)
    return {
        "tokens": tokens,
        "predict_seconds": seconds,
        "tokens_per_second": tokens / seconds if seconds else None,
        "first_batch_seconds": first,
        "tokens_per_second_after_first_batch": later,
    }


def _speed_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    if not summary["predict_seconds"]:
        return []
    tokens, seconds = summary["tokens"], summary["predict_seconds"]
    rows = [("speed", f"{summary['tokens_per_second']:,.0f} tokens/s ({tokens:,} tokens in {seconds:.1f} s)")]
    if steady := summary["tokens_per_second_after_first_batch"]:
        first = summary["first_batch_seconds"]
        rows.append(("speed after the first batch", f"{steady:,.0f} tokens/s (the first took {first:.1f} s)"))
    return rows


def _best(best: Any) -> str:
    """A fine-tuned model's best validation (``{"metric", "value", "step"}`` in its metadata): its weights'."""
    if not isinstance(best, dict) or finite(best.get("value")) is None:
        return "not recorded"
    return f"best {best.get('metric')} {shown(best['value'], 4)} at step {best.get('step')}"


def _pair(metadata: dict[str, Any]) -> str:
    trained, untrained = metadata.get("val_ppl"), metadata.get("untrained_val_ppl")
    return " / ".join(shown(value, 3, missing="not recorded") for value in (trained, untrained))
