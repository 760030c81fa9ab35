"""``bionemo run finetune``: train a task head (and the encoder, its LoRA adapters, or neither) on labelled CSVs.

Every check that needs no tensor runs first (options, the base checkpoint's headers, both CSV files, the layout,
the output folder), so bad input is refused in about a second with nothing written. Then the base weights are
read, the model is trained with AdamW under a warm-up + cosine schedule on every layout ``run train`` supports,
the task's validation metrics are logged at every check, and the weights of the best validation are exported as a
self-describing ``model.safetensors`` (:mod:`bionemo.esm2.finetune.spec`).
"""

import math
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from bionemo.esm2.finetune.options import DEFAULT_LR, FinetuneOptions, finetune_options
from bionemo.esm2.finetune.spec import FinetuneSpec
from bionemo.esm2.finetune.tasks import (
    LabelledData,
    LabelledRecord,
    LabelVocabulary,
    OptionError,
    read_labelled_csv,
    split,
)
from bionemo.esm2.recipes.inputs import checked_checkpoint, checked_checkpoint_header
from bionemo.esm2.tokenizer import encoded_length
from bionemo.recipes.choices import Precision
from bionemo.recipes.registry import RecipeDefaults, SummaryRows
from bionemo.recipes.settings import RunSettings, SettingsError

__all__ = [
    "FINETUNE_EPOCHS",
    "FINETUNE_TOKENS",
    "LORA_RECOMPUTE_SHARE",
    "finetune",
    "finetune_defaults",
    "lora_recompute",
    "read_labelled_data",
    "token_budget",
]

FINETUNE_EPOCHS = 10
"""Passes over the training set when ``--max-steps`` is not given."""


def read_labelled_data(settings: RunSettings, options: FinetuneOptions, max_residues: int) -> LabelledData:
    """Read ``--data`` and ``--val-data`` (or split ``--data``) and build the label vocabulary from training.

    Raises:
        SettingsError: Any problem of either file (``--data`` / ``--val-data``), one class only, a validation label
            the training set lacks.
    """
    from bionemo.esm2.data.readers import InputError

    if settings.data is None:
        raise SettingsError(
            "fine-tuning needs labelled data: give --data train.csv (a 'sequence' column, optionally 'id', and the "
            "label column(s))",
            "--data",
        )

    def read(path: Path, option: str) -> list[LabelledRecord]:
        try:
            return read_labelled_csv(
                path, options.task, options.label_columns, options.mask_column, max_residues, settings.truncate
            )
        except OptionError as error:
            raise SettingsError(str(error), error.option) from None
        except InputError as error:
            raise SettingsError(str(error), option) from None

    records = read(settings.data, "--data")
    if settings.val_data is None:
        try:
            train, val = split(records, settings.val_fraction, settings.seed, task=options.task)
        except InputError as error:
            raise SettingsError(str(error), "--data") from None
    else:
        train, val = records, read(settings.val_data, "--val-data")
    try:
        vocabulary = LabelVocabulary.from_records(options.task, options.label_columns, train, settings.data)
        vocabulary.check_unseen(val, settings.val_data or settings.data)
    except InputError as error:
        raise SettingsError(str(error), "--val-data" if settings.val_data is not None else "--data") from None
    return LabelledData(train=train, val=val, vocabulary=vocabulary, split_from_train=settings.val_data is None)


def finetune_defaults(
    recipe: RecipeDefaults,
    model: dict[str, Any],
    options: FinetuneOptions,
    train: list[LabelledRecord],
    *,
    tokens: int | None = None,
    data_parallel: int = 1,
) -> RecipeDefaults:
    """Fine-tuning's run defaults: :data:`FINETUNE_EPOCHS` passes, a validation per pass, bf16, and the batches.

    Batches of 16 sequences, or with ``tokens`` (:func:`token_budget`) global batches cut by tokens: items are then
    micro-batches, one per data-parallel rank per step (``micro_batch_size`` 1, ``global_batch_size``
    ``data_parallel``), and a pass is the training tokens over ``tokens`` steps. The learning rate depends on what
    trains (:data:`~bionemo.esm2.finetune.options.DEFAULT_LR`); the model settings are the base checkpoint's.
    """
    if tokens is None:
        micro, global_batch = 16, 16
        per_pass = max(1, math.ceil(len(train) / global_batch))
    else:
        micro, global_batch = 1, data_parallel
        per_pass = max(1, math.ceil(sum(encoded_length(r.sequence) for r in train) / tokens))
    return replace(
        recipe,
        micro_batch_size=micro,
        global_batch_size=global_batch,
        max_steps=FINETUNE_EPOCHS * per_pass,
        val_check_interval=per_pass,
        lr=DEFAULT_LR[options.encoder],
        precision=Precision.BF16,
        model=model,
        cpu=None,
    )


def finetune(settings: RunSettings, *, defaults: RecipeDefaults, recipe: str) -> SummaryRows:
    """Fine-tune the ``--checkpoint`` base on ``--data``; export ``model.safetensors``; the summary rows.

    ``defaults`` are the recipe's; fine-tuning replaces their run length, batches and learning rate
    (:func:`finetune_defaults`) and takes the model's shape from the base checkpoint.
    """
    from bionemo.recipes.resolved import resolved_training_settings, save_settings, training_plan
    from bionemo.recipes.trainers import accelerator, check_hardware, check_output_dir, is_launching_rank, uses_megatron

    try:
        options = finetune_options(settings)
    except OptionError as error:
        raise SettingsError(str(error), error.option) from None
    if settings.checkpoint is None:
        raise SettingsError(
            "fine-tuning starts from a pretrained model: give --checkpoint (a Hugging Face ESM-2 folder or a bionemo "
            "model.safetensors)",
            "--checkpoint",
        )
    header = checked_checkpoint_header(settings.checkpoint)
    if getattr(header, "finetune", None) is not None:
        raise SettingsError(
            f"{settings.checkpoint} is a fine-tuned model; fine-tuning starts from a pretrained ESM-2 (the base it "
            "was fine-tuned from, or any Hugging Face ESM-2 folder)",
            "--checkpoint",
        )
    if settings.pipeline_parallel > 1 or settings.context_parallel > 1:
        raise SettingsError(
            "fine-tuning runs with data and tensor parallelism (--devices, --tensor-parallel); pipeline and context "
            "parallelism are for pretraining long sequences: leave --pipeline-parallel and --context-parallel at 1",
            "--pipeline-parallel" if settings.pipeline_parallel > 1 else "--context-parallel",
        )
    model = {**header.model, **_model_overrides(settings, header.model)}
    data = read_labelled_data(settings, options, model["seq_length"] - 2)
    spec = FinetuneSpec(
        task=options.task, head=options.head, labels=data.vocabulary, encoder=options.encoder, lora=options.lora
    )
    out = settings.output_dir or Path("bionemo_runs") / "finetune"
    check_hardware(settings)
    gpu = accelerator(settings) == "gpu"
    tokens = token_budget(settings, gpu=gpu, data=data)
    run_defaults = finetune_defaults(
        defaults, model, options, data.train, tokens=tokens, data_parallel=settings.data_parallel_size()
    )
    given = settings
    settings = resolved_training_settings(settings, run_defaults, gpu=gpu)
    if tokens is not None:
        settings = settings.model_copy(update={"global_batch_tokens": tokens})
    _check_lora_layout(spec, settings)
    if spec.lora is not None and uses_megatron(settings):
        run_defaults = replace(run_defaults, model=lora_recompute(run_defaults.model))
    check_output_dir(out, create=False)
    start = checked_checkpoint(header.path)  # the tensors: NaN/Inf
    check_output_dir(out)
    if is_launching_rank():
        by_count = {} if tokens is None else {"micro_batch_size": None, "global_batch_size": None}
        save_settings(settings.model_copy(update={"output_dir": out, **by_count}), out, training=True, finetuning=True)
        plan = (
            training_plan(given, settings, run_defaults, gpu=gpu)
            if tokens is None
            else f"{settings.max_steps} steps x up to {tokens:,} tokens per step"
        )
        print(f"Fine-tuning ({spec.task}, {spec.head.kind} head, encoder {spec.encoder}): {plan}", flush=True)
    from bionemo.esm2.finetune.fit import fit

    return fit(settings, run_defaults, recipe, spec, data, out, start)


FINETUNE_TOKENS = 16_384
"""Tokens per global batch of a fine-tuning run on GPUs when no batch size is given."""


def token_budget(settings: RunSettings, *, gpu: bool, data: LabelledData) -> int | None:
    """Tokens per global batch, or None for batches by count.

    ``--global-batch-tokens`` as given; on GPUs without any batch size :data:`FINETUNE_TOKENS` (a handful of
    ~300-residue proteins per step leaves a GPU waiting for the host); on CPUs, or with ``--micro-batch-size`` /
    ``--global-batch-size``, batches by count.

    Raises:
        SettingsError: ``--global-batch-tokens`` with a batch size by count, a budget that cannot give every
            data-parallel rank two of the longest sequences, or fewer sequences than data-parallel ranks.
    """
    by_count = [f"--{n.replace('_', '-')}" for n in ("micro_batch_size", "global_batch_size") if getattr(settings, n)]
    tokens = settings.global_batch_tokens
    if tokens is not None and by_count:
        raise SettingsError(
            f"--global-batch-tokens cuts batches by tokens, {' and '.join(by_count)} by count: give one or the other",
            "--global-batch-tokens",
        )
    if tokens is None and (by_count or not gpu):
        return None
    tokens = tokens or FINETUNE_TOKENS
    ranks = settings.data_parallel_size()
    longest = max(encoded_length(r.sequence) for r in (*data.train, *data.val))
    if tokens < 2 * ranks * longest:
        raise SettingsError(
            f"--global-batch-tokens {tokens} cannot give each of {ranks} data-parallel rank(s) two of the longest "
            f"sequences ({longest} tokens with <cls> and <eos>): give at least {2 * ranks * longest}, or batch by "
            "count with --global-batch-size",
            "--global-batch-tokens",
        )
    for name, records in (("training", data.train), ("validation", data.val)):
        if len(records) < ranks:
            raise SettingsError(
                f"{len(records)} {name} sequences cannot fill a batch on each of {ranks} data-parallel ranks",
                "--devices",
            )
    return tokens


LORA_RECOMPUTE_SHARE = 1 / 4
"""Share of the layers whose activations a LoRA run on GPUs recomputes in the backward pass instead of keeping."""


def lora_recompute(model: Mapping[str, Any]) -> Mapping[str, Any]:
    """``model`` with megatron's activation recomputation of the first :data:`LORA_RECOMPUTE_SHARE` of the layers.

    LoRA is chosen to fit in less memory: with the base frozen its optimizer state is tiny and the activations are
    most of the peak. Recomputing whole layers (megatron's ``recompute_granularity="full"``, ``"block"`` method) for
    that share of them brings a LoRA run's peak memory down to the target share of full fine-tuning's, for one more
    forward pass of those layers (docs/benchmarks.md#fine-tuning). ``model:`` settings of a ``--config`` that set
    any recomputation win.
    """
    if any(key.startswith("recompute_") for key in model):
        return model
    layers = max(1, round(int(model["num_layers"]) * LORA_RECOMPUTE_SHARE))
    return {**model, "recompute_granularity": "full", "recompute_method": "block", "recompute_num_layers": layers}


def _model_overrides(settings: RunSettings, base: dict[str, Any]) -> dict[str, Any]:
    """The ``model:`` settings of a ``--config`` file, e.g. megatron's activation recomputation.

    They may repeat the base checkpoint's shape, not change it.

    Raises:
        SettingsError: An unknown key (:func:`bionemo.esm2.recipes.model_settings.checked_model_settings`), or a
            shape setting that differs from the base checkpoint's.
    """
    from bionemo.esm2.recipes.model_settings import SHAPE_KEYS, checked_model_settings

    given = checked_model_settings(dict(settings.model or {}))
    changed = [k for k in (*SHAPE_KEYS, "seq_length", "vocab_size") if k in given and given[k] != base.get(k)]
    if changed:
        raise SettingsError(
            "model settings "
            + ", ".join(f"{k}={given[k]!r}" for k in changed)
            + " differ from the base checkpoint's "
            + ", ".join(f"{k}={base.get(k)!r}" for k in changed)
            + "; fine-tuning keeps the base's shape",
            "--config",
        )
    return given


def _check_lora_layout(spec: FinetuneSpec, settings: RunSettings) -> None:
    """LoRA's rank splits over tensor-parallel ranks on column-parallel layers (qkv, fc1)."""
    if spec.lora is None or settings.tensor_parallel == 1:
        return
    if {"qkv", "fc1"} & set(spec.lora.targets) and spec.lora.rank % settings.tensor_parallel:
        raise SettingsError(
            f"--lora-rank {spec.lora.rank} must be a multiple of --tensor-parallel {settings.tensor_parallel} for the "
            "column-parallel targets (qkv, fc1)",
            "--lora-rank",
        )
